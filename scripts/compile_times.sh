#!/usr/bin/env bash
# Compile time and peak memory of a user's programs, as ratios to a baseline compiled in the same
# run: a file that includes <boost/asio.hpp> and runs an io_context. Each file is compiled alone
# (no ccache, nothing else running), with the flags a user would type: g++ -std=c++20 -O2.
#   bash scripts/compile_times.sh [--runs N] [--json FILE]
# Prints one row per case: seconds and MB (median of N runs, default 1) and both ratios to the
# baseline. The cases: hello_dist.cpp header-only and with KVSTORE_SEPARATE_COMPILATION (what a
# program that links kvstore::compiled compiles), hello_local.cpp header-only (it includes
# <kvstore/local.hpp>) and the same file through <kvstore/kvstore.hpp>, which brings the dist
# store too, and src/kvstore.cpp, the compiled library itself (built once).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=1 json=""
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--json FILE]" >&2; exit 2 ;;
  esac
done
CXX=${CXX:-g++}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/baseline.cpp" <<'CPP'
#include <boost/asio.hpp>
int main() {
  boost::asio::io_context io;
  boost::asio::post(io, [] {});
  io.run();
}
CPP

# measure NAME FILE [FLAGS...]: compiles FILE to an object $runs times; prints "seconds MB".
measure() {
  local file=$1; shift
  local samples=()
  for ((i = 0; i < runs; i++)); do
    /usr/bin/time -f '%e %M' -o "$tmp/t" "$CXX" -std=c++20 -O2 -Iinclude "$@" -c "$file" -o "$tmp/x.o"
    samples+=("$(cat "$tmp/t")")
  done
  printf '%s\n' "${samples[@]}" | sort -n | awk -v n="$runs" 'NR == int((n + 1) / 2) {printf "%s %.0f\n", $1, $2 / 1024}'
}

sed 's|#include <kvstore/local.hpp>|#include <kvstore/kvstore.hpp>|' examples/hello_local.cpp \
  >"$tmp/hello_local_all.cpp"

names=(baseline hello_dist_header_only hello_dist_compiled hello_local_header_only
  hello_local_via_kvstore_hpp kvstore_compiled_library)
read -r base_s base_mb < <(measure "$tmp/baseline.cpp")
results=("$base_s $base_mb")
results+=("$(measure examples/hello_dist.cpp)")
results+=("$(measure examples/hello_dist.cpp -DKVSTORE_SEPARATE_COMPILATION)")
results+=("$(measure examples/hello_local.cpp)")
results+=("$(measure "$tmp/hello_local_all.cpp")")
results+=("$(measure src/kvstore.cpp -DKVSTORE_SEPARATE_COMPILATION)")

printf '%-28s %8s %8s %8s %8s\n' case seconds MB "x time" "x MB"
rows=()
for i in "${!names[@]}"; do
  read -r s mb <<<"${results[$i]}"
  rt=$(awk -v a="$s" -v b="$base_s" 'BEGIN {printf "%.2f", a / b}')
  rm=$(awk -v a="$mb" -v b="$base_mb" 'BEGIN {printf "%.2f", a / b}')
  printf '%-28s %8s %8s %8s %8s\n' "${names[$i]}" "$s" "$mb" "$rt" "$rm"
  rows+=("{\"case\": \"${names[$i]}\", \"seconds\": $s, \"mb\": $mb, \"time_ratio\": $rt, \"mb_ratio\": $rm}")
done
if [[ -n $json ]]; then
  { echo "["; (IFS=$'\n'; echo "${rows[*]}" | sed '$!s/$/,/'); echo "]"; } >"$json"
fi
