#!/usr/bin/env bash
# Counts the headers a dist push runs through: scripts/push_path.cpp (a worker, a server and a
# scheduler in one process over loopback TCP) is built with gcov and run twice, with 0 pushes and
# with N; a header of include/kvstore whose lines ran at least N times more in the second run is
# on the push path (worker call, engine, client, wire, link, server, shard). Setup code (join,
# init, barrier) runs as often in both runs and is not counted. Prints the headers and the count.
# Usage: scripts/push_path_headers.sh [N=200]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export LC_ALL=C
g++ -std=c++20 -O0 --coverage -I"$PWD/include" "$PWD/scripts/push_path.cpp" -o "$dir/push_path" -lboost_serialization -lssl -lcrypto -lpthread
count() {  # $1: pushes; prints "header executions" per header of include/kvstore
  rm -f "$dir"/*.gcda "$dir"/*.gcov
  (cd "$dir" && ./push_path "$1" && gcov -p -o . push_path.gcda >/dev/null 2>&1 || true)
  for f in "$dir"/*"include#kvstore#"*.gcov; do
    [[ -e $f ]] || continue
    h=${f##*include#kvstore#}
    h=${h%.gcov}
    awk -F: -v h="${h//#//}" '$1 ~ /^ *[0-9]+\*? *$/ {gsub(/[ *]/, "", $1); s += $1} END {print h, s + 0}' "$f"
  done | sort
}
count 0 >"$dir/zero"
count "$n" >"$dir/many"
join -a 2 -e 0 -o 0,1.2,2.2 "$dir/zero" "$dir/many" |
  awk -v n="$n" '$3 - $2 >= n {print $1; c++} END {print c + 0, "headers run once or more per push"}'
