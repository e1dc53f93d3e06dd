#!/usr/bin/env bash
# Runs every test: builds everything in build/ and runs ctest, then runs SANITIZER_TESTS again
# under ThreadSanitizer (build-tsan/) and Address+UndefinedBehavior sanitizers (build-asan/),
# then a --quick smoke run of each benchmark. Exits non-zero if anything failed.
# Environment: JOBS (default: nproc); KVSTORE_DROP_OBJECTS=1 (set by .ci/run) deletes build/'s
# object files once it is built and each sanitizer tree's once its tests ran. Built with line
# tables only (scripts/lib.sh), build/ is 1.3 GB, 0.8 of it object files; a run with
# KVSTORE_DROP_OBJECTS=1 leaves about 1 GB in all (it was 2 with full debug information).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Tests (ctest names = target names = tests/<kind>/<name>.cpp) also run under both sanitizers.
# Add yours here; names whose source does not exist yet are skipped.
SANITIZER_TESTS=(test_engine test_call_plan test_frame_plans test_key_map test_ranks test_coverage test_spin_mutex test_send_queue test_request_table test_handshake test_local_stress test_dist_sync test_shard test_compression test_shard_batch test_batch test_apply_pool test_fusion test_shard_parked test_pipeline test_block_pool test_connection_reads test_frame_writer test_dist_faults)

source scripts/lib.sh
bash scripts/setup-deps.sh

failed=()
summaries=()

# stage NAME: the time since the previous stage goes to the summary's last line, so a run that
# grows past CI's bound (45 minutes on two cores) shows where.
stage_name=setup stage_start=0  # from the script's start: setup-deps.sh included
stage_times=()
stage() {
  stage_times+=("$stage_name $((SECONDS - stage_start)) s")
  stage_name=$1 stage_start=$SECONDS
}

# A full run writes under 3 GB (build/ alone 1.3): say so up front rather than fail mid-link.
free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
echo "== disk: $((free_kb / 1024 / 1024)) GiB free here =="
if ((free_kb < 3 * 1024 * 1024)); then
  echo "warning: under 3 GiB free; a full run may fail with 'No space left on device'" >&2
fi

# drop_objects DIR: with KVSTORE_DROP_OBJECTS=1, delete DIR's object files (ccache, when present,
# keeps them; the linked programs stay). Two thirds of a build tree is object files.
drop_objects() {
  [[ ${KVSTORE_DROP_OBJECTS:-0} == 1 ]] || return 0
  find "$1" -name '*.o' -delete
}

# run_ctest NAME DIR [CTEST_ARGS...]: ctest (prefixed by the WRAP command, if any) with its output
# shown and its summary line kept.
WRAP=()
run_ctest() {
  local name=$1 dir=$2; shift 2
  local log=$dir/ctest.log rc=0
  ${WRAP[@]+"${WRAP[@]}"} ctest --test-dir "$dir" --output-on-failure -j"$JOBS" "$@" 2>&1 | tee "$log" || rc=$?
  local line
  line=$(grep -E 'tests passed|No tests were found' "$log" | tail -1 || true)
  summaries+=("$(printf '%-22s %s' "$name:" "${line:-no summary (ctest exit $rc)}")")
  ((rc == 0)) || failed+=("$name")
}

# The tree is clang-formatted and its include graph follows docs/DESIGN.md: cheap, so first.
stage checks
echo "== checks: clang-format, layers =="
if git rev-parse --git-dir >/dev/null 2>&1; then
  if git ls-files -z '*.hpp' '*.cpp' '*.cu' | xargs -0 clang-format --dry-run -Werror; then
    summaries+=("$(printf '%-22s %s' "clang-format:" "every C++ file matches .clang-format")")
  else
    summaries+=("$(printf '%-22s %s' "clang-format:" "FAILED (run clang-format -i on the files above)")")
    failed+=("clang-format")
  fi
fi
if python3 scripts/check_layers.py; then
  summaries+=("$(printf '%-22s %s' "layers:" "include graph follows docs/DESIGN.md")")
else
  failed+=("layers")
fi

stage build
echo "== build (build/, RelWithDebInfo) =="
configure build
cmake --build build -j"$JOBS"
# The target list read whole first: grep -q stopping early broke the pipe, and under pipefail
# the docs were then skipped.
targets_help=$(cmake --build build --target help)
if grep -q '^docs:' <<<"$targets_help"; then
  echo "== docs: the API reference from the headers (build/docs/html) =="
  cmake --build build --target docs || failed+=("docs")
fi

stage tests
echo "== tests =="
drop_objects build
run_ctest tests build

# Sanitizer runs: only SANITIZER_TESTS that exist, and only their targets are built.
targets=()
for t in "${SANITIZER_TESTS[@]}"; do
  [[ -n $(find tests -name "$t.cpp" -print -quit) ]] && targets+=("$t")
done
if ((${#targets[@]})); then
  regex="^($(IFS='|'; echo "${targets[*]}"))\$"
  # scripts/tsan.supp: what TSan cannot see synchronized in the uninstrumented libstdc++.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=1:strict_init_order=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
  for san in thread address,undefined; do
    dir=build-tsan name="tsan" opt=-O1
    [[ $san == thread ]] || { dir=build-asan name="asan+ubsan" opt=-O0; }
    stage "$name"
    echo "== $name: ${targets[*]} ($dir/) =="
    # TSan at -O1, as its manual advises (-O2: twice the compile time, the same findings). ASan
    # and UBSan at -O0: half -O1's compile time (g++ of test_batch.cpp, the two side by side:
    # 149 s -> 81 s), nothing optimized away from their checks, and the tests still run in under
    # a minute (10 s -> 41 s).
    configure "$dir" -DKVSTORE_SANITIZE="$san" -DKVSTORE_BUILD_EXAMPLES=OFF -DKVSTORE_BUILD_BENCHMARKS=OFF \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt -g1 -DNDEBUG"
    cmake --build "$dir" -j"$JOBS" --target "${targets[@]}"
    # TSan's shadow memory layout clashes with high-entropy ASLR on some kernels (mmap_rnd_bits
    # above 28): run its tests without ASLR when the kernel lets us.
    WRAP=()
    if [[ $san == thread ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
      WRAP=(setarch "$(uname -m)" -R)
    fi
    run_ctest "$name" "$dir" -R "$regex" --no-tests=error
    WRAP=()
    drop_objects "$dir"
  done
fi

# Benchmarks are measured by scripts/bench.sh; here each one only has to run in --quick mode.
stage benchmarks
bench_ok=0 bench_bad=0
while read -r b; do
  [[ -n $b ]] || continue
  echo "== benchmark smoke: $b --quick =="
  if timeout 300 "$b" --quick; then bench_ok=$((bench_ok + 1)); else bench_bad=$((bench_bad + 1)); failed+=("$(basename "$b") --quick"); fi
done < <(executables build/benchmarks)

# Fuzzing: every libFuzzer target for a bounded time (KVSTORE_FUZZ_SECONDS each, default 30;
# 0 skips), over a scratch copy of its corpus. The corpus itself is replayed by ctest above.
fuzz_secs=${KVSTORE_FUZZ_SECONDS:-30}
if ((fuzz_secs > 0)); then
  stage fuzz
  echo "== fuzz: ${fuzz_secs} s per target (scripts/fuzz.sh) =="
  mkdir -p build-fuzz
  if bash scripts/fuzz.sh "$fuzz_secs" 2>&1 | tee build-fuzz/fuzz.log; then
    summaries+=("$(printf '%-22s %s' "fuzz:" "$(grep -c '^fuzz_.*executions' build-fuzz/fuzz.log || true) targets, ${fuzz_secs} s each, no crash")")
  else
    summaries+=("$(printf '%-22s %s' "fuzz:" "FAILED (see build-fuzz/fuzz.log)")")
    failed+=("fuzz")
  fi
fi

stage end
echo
echo "== summary =="
printf '%-22s %s\n' "benchmarks --quick:" "$bench_ok ran, $bench_bad failed"
printf '%s\n' "${summaries[@]}"
printf '%-22s %s\n' "time per stage:" "$(IFS=,; echo "${stage_times[*]}" | sed 's/,/, /g') (total $((SECONDS / 60)) min)"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
