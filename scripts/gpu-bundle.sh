#!/usr/bin/env bash
# For a GPU machine that has no compiler or Boost of its own: builds the CUDA tests and
# benchmarks here (nvcc needs no GPU), then bundles them into DIR (default .gpu/, which git
# should ignore) with the shared libraries they load beyond the C and C++ runtimes, and a run.sh
# that runs them there:
#   bash scripts/gpu-bundle.sh [DIR]       # here
#   bash DIR/run.sh [OUT]                  # there; results in OUT (default $OUT, else DIR/out)
# run.sh runs the three CUDA test programs, compute-sanitizer memcheck of the dist one,
# device_bench_cuda, shard_bench (a server's shard with 1, 2, 4, ... threads) and kv_bench
# (RUN_KV_BENCH=0 skips it), each under a timeout, and writes a log of the steps and a file per
# kind of step (at most 8 files). Debug info is stripped: the
# bundle is about 20 MB.
# AB_BASE=REV also bundles kv_bench built at commit REV: run.sh then runs the two kv_bench
# programs alternately (AB_ROUNDS times, default 3; arguments AB_ARGS, default the in-flight
# and backprop cases at 1 x 1 and 2 x 2) and writes their ranges (scripts/ab_summary.py) to
# ab.txt, in place of kv_bench's two files; the full kv_bench run is skipped then.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh

dir=${1:-.gpu}
programs=(tests/device/test_device_cuda tests/device/test_data_parallel_device_cuda
  tests/device/test_dist_device_cuda benchmarks/cuda/device_bench_cuda benchmarks/kv_bench
  benchmarks/shard_bench)

command -v nvcc >/dev/null || {
  echo "gpu-bundle: no nvcc here: the CUDA programs cannot be built" >&2
  exit 1
}
[[ -f build/build.ninja ]] || configure build
cmake --build build -j"$JOBS" --target "${programs[@]##*/}"

base_bench=
[[ -z ${AB_BASE:-} ]] || base_bench=$(build_kv_bench_at "$AB_BASE")

rm -rf "$dir"
mkdir -p "$dir/lib"
for p in "${programs[@]}"; do
  cp "build/$p" "$dir/"
  strip --strip-debug "$dir/${p##*/}"
done
if [[ -n $base_bench ]]; then
  cp "$base_bench" "$dir/kv_bench_base"
  strip --strip-debug "$dir/kv_bench_base"
  cp scripts/ab_summary.py "$dir/"
  echo "$AB_BASE" >"$dir/ab_base"
fi
# Libraries the programs load, less the C runtime, the C++ runtime and the GPU driver (the
# target machine's own are newer or must be its own).
for p in "${programs[@]}"; do ldd "build/$p"; done | awk '/=> \//{print $3}' | sort -u |
  { grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libcuda|ld-linux[^/]*)\.so' || true; } |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done

cat >"$dir/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the bundled CUDA tests and benchmarks (made by scripts/gpu-bundle.sh). Usage: run.sh [OUT]
cd "$(dirname "${BASH_SOURCE[0]}")"
out=${1:-${OUT:-$PWD/out}}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$out/gpu_tests.log
{ date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } >"$log" 2>&1
# step FILE SECONDS COMMAND...: runs it under a timeout, its output added to FILE.txt, and notes
# its exit status and time in the log. Few files: a lent machine may return only 8.
step() {
  local file=$1 limit=$2 start=$SECONDS rc=0
  shift 2
  timeout "$limit" "$@" >>"$out/$file.txt" 2>&1 || rc=$?
  echo "== $* rc=$rc secs=$((SECONDS - start))" | tee -a "$log"
}
for t in test_device_cuda test_data_parallel_device_cuda test_dist_device_cuda; do
  step cuda_tests 120 "./$t"
done
step memcheck 120 compute-sanitizer --tool memcheck --leak-check full ./test_dist_device_cuda
step device_bench_cuda 200 ./device_bench_cuda --json "$out/device_bench_cuda.json"
step shard_bench 200 ./shard_bench
if [[ -x kv_bench_base ]]; then
  # The base commit's kv_bench and this one's, alternated; the runs' outputs in one file.
  read -r -a ab_args <<<"${AB_ARGS:---only many_4096,backprop --setup 1x1,2x2 --reps 5}"
  runs=$(mktemp -d)
  for ((i = 1; i <= ${AB_ROUNDS:-3}; ++i)); do
    step ab_runs 120 ./kv_bench_base "${ab_args[@]}" --json "$runs/base_$i.json"
    step ab_runs 120 ./kv_bench "${ab_args[@]}" --json "$runs/head_$i.json"
  done
  step ab 30 python3 ab_summary.py --base "$runs"/base_*.json --head "$runs"/head_*.json \
    --title "kv_bench ${ab_args[*]}: $(cat ab_base) (base) against the bundled build (head)"
elif [[ ${RUN_KV_BENCH:-1} != 0 ]]; then
  step kv_bench 240 ./kv_bench --setup 1x1,2x2 --json "$out/kv_bench.json"
fi
EOF
chmod +x "$dir/run.sh"
echo "gpu-bundle: $dir ($(du -sh "$dir" | cut -f1)); on the GPU machine: bash $dir/run.sh [OUT]"
