#!/usr/bin/env bash
# Compares two builds of kv_bench in one sitting: the working tree's (build/) against a base
# commit's (built in build-ab/, from a git worktree), run alternately so that both see the same
# machine, and summarized as ranges (scripts/ab_summary.py). What a change to a hot path is
# measured with: one run of each says little when runs differ by 10-20%.
#   bash scripts/bench-ab.sh BASE_REV [ROUNDS] [KV_BENCH_ARGS...]
#   e.g. bash scripts/bench-ab.sh 139b5e6 6 --only many_4096,backprop --setup 1x1,2x2 --reps 5
# ROUNDS (default 3) alternations; the kv_bench arguments default to the line above's. Outputs:
# build-ab/out/{base,head}_N.{json,txt} and the summary on stdout.
# KV_BENCH_BASE / KV_BENCH_HEAD: use these binaries instead of building (e.g. on a lent machine,
# where scripts/gpu-bundle.sh with AB_BASE set bundled both).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh

base_rev=${1:?usage: bench-ab.sh BASE_REV [ROUNDS] [KV_BENCH_ARGS...]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
args=("$@")
((${#args[@]})) || args=(--only many_4096,backprop --setup 1x1,2x2 --reps 5)

base=${KV_BENCH_BASE:-}
head=${KV_BENCH_HEAD:-}
if [[ -z $head ]]; then
  [[ -f build/build.ninja ]] || configure build
  cmake --build build -j"$JOBS" --target kv_bench >/dev/null
  head=build/benchmarks/kv_bench
fi
[[ -n $base ]] || base=$(build_kv_bench_at "$base_rev")

out=build-ab/out
rm -rf "$out"
mkdir -p "$out"
for ((i = 1; i <= rounds; ++i)); do
  for side in base head; do
    bin=$base
    [[ $side == head ]] && bin=$head
    "$bin" "${args[@]}" --json "$out/${side}_$i.json" >"$out/${side}_$i.txt" 2>&1 || {
      echo "bench-ab: $side run $i failed (see $out/${side}_$i.txt)" >&2
      exit 1
    }
  done
done
python3 scripts/ab_summary.py --base "$out"/base_*.json --head "$out"/head_*.json \
  --title "kv_bench ${args[*]}: $base_rev (base) against the working tree (head), $rounds alternations"
