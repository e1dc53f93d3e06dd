#!/usr/bin/env bash
# Builds and runs every benchmark in build/benchmarks/, each writing its results as JSON to
# build/bench/<name>.json, then plots them (build/bench/plots/, one PNG per table). Extra
# arguments (e.g. --quick) go to every benchmark.
# Environment: JOBS (default: nproc). Run on an otherwise idle machine for figures worth quoting.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh
bash scripts/setup-deps.sh

configure build
cmake --build build -j"$JOBS" --target benchmarks/all
mkdir -p build/bench

status=0 ran=0
while read -r b; do
  [[ -n $b ]] || continue
  name=$(basename "$b")
  echo "== $name =="
  if "$b" --json "build/bench/$name.json" "$@"; then ran=$((ran + 1)); else echo "$name failed" >&2; status=1; fi
done < <(executables build/benchmarks)
((ran > 0 || status != 0)) || echo "bench: no benchmarks built yet (benchmarks/CMakeLists.txt lists none)"
if ((status == 0)) && ((ran > 0)); then
  echo "results: build/bench/*.json"
  # One PNG per table (docs/bench/ holds the README's, made the same way).
  python3 scripts/plot_bench.py --out build/bench/plots build/bench/*.json
fi
exit $status
