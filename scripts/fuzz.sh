#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time: scripts/fuzz.sh [SECONDS]  (default 60 each).
# Builds them with clang in build-fuzz/ (KVSTORE_FUZZ=ON: -fsanitize=fuzzer,address,undefined),
# runs each over a scratch copy of its seed corpus (fuzz/corpus/<target>/; nothing is written
# into the repository), and fails if any target crashes, leaks, times out or runs out of memory,
# printing the reproducer and how to replay it. JOBS targets fuzz at once, one core each. Needs
# clang and libclang-rt-14-dev (scripts/setup-deps.sh). Environment: JOBS (default nproc),
# FUZZ_TARGETS (default: all), FUZZ_BUILD_DIR (default build-fuzz).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh

seconds=${1:-60}
dir=${FUZZ_BUILD_DIR:-build-fuzz}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }

targets=(${FUZZ_TARGETS:-})
if ((${#targets[@]} == 0)); then
  for d in fuzz/corpus/*/; do
    t=$(basename "$d")
    [[ -f fuzz/fuzz_$t.cpp ]] && targets+=("$t")
  done
fi

echo "== fuzz: build (${targets[*]}) in $dir/ =="
configure "$dir" -DCMAKE_CXX_COMPILER=clang++ -DKVSTORE_FUZZ=ON \
  -DKVSTORE_BUILD_EXAMPLES=OFF -DKVSTORE_BUILD_BENCHMARKS=OFF -DKVSTORE_INSTALL=OFF
cmake --build "$dir" -j"$JOBS" --target "${targets[@]/#/fuzz_}"

work=$(mktemp -d "${TMPDIR:-/tmp}/kvstore-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# fuzz_one T: fuzzes target T for the given seconds over a scratch copy of its corpus; leaves
# its log, exit status and any reproducer under $work/T. Quiet: several run at once.
fuzz_one() {
  local t=$1 rc=0
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  cp fuzz/corpus/"$t"/* "$work/$t/corpus/"
  "$dir/fuzz/fuzz_$t" "$work/$t/corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" >"$work/$t/log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t/rc"
}

# Each target is one process on one core: JOBS of them at a time, so the fuzzing stage takes
# (targets / JOBS) x SECONDS, not targets x SECONDS. Results are read in order afterwards.
echo "== fuzz: ${#targets[@]} targets, ${seconds} s each, ${JOBS} at a time =="
running=0
for t in "${targets[@]}"; do
  if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  log=$work/$t/log
  rc=$(cat "$work/$t/rc" 2>/dev/null || echo "?")
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' <<<"${done_line:-$(grep -E '^#[0-9]+' "$log" | tail -1)}" | tail -1 || true)
  line=$(printf '%-18s %s executions, %s/s, %s' "fuzz_$t:" "${execs:-?}" "${rate:-?}" "${cov:-cov: ?}")
  if [[ $rc != 0 ]] || compgen -G "$work/$t/artifacts/*" >/dev/null; then
    failed+=("fuzz_$t")
    summary+=("$line  FAILED (exit $rc)")
    echo "---- fuzz_$t failed (exit $rc); the end of its log:" >&2
    tail -n 60 "$log" >&2
    for a in "$work/$t/artifacts"/*; do
      [[ -f $a ]] || continue
      keep=$dir/fuzz-artifacts/$t
      mkdir -p "$keep"
      cp "$a" "$keep/"
      echo "---- reproducer $keep/$(basename "$a") ($(stat -c %s "$a") bytes), base64:" >&2
      base64 "$a" | head -c 20000 >&2
      echo >&2
      echo "replay: $dir/fuzz/fuzz_$t $keep/$(basename "$a")" >&2
      echo "keep it: cp $keep/$(basename "$a") fuzz/corpus/$t/crash-<what>  (then fix the bug)" >&2
    done
  else
    summary+=("$line")
  fi
done

echo
echo "== fuzz summary (${seconds} s each) =="
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "FUZZ FAILED: ${failed[*]}"
  exit 1
fi
