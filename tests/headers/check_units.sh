#!/bin/sh
# check_units.sh INCLUDE_ROOT UNITS_DIR [SKIPPED_HEADER...]: the ctest header_checks (see
# CMakeLists.txt here). Every header `find` sees under INCLUDE_ROOT/kvstore has a generated unit
# UNITS_DIR/kvstore/<header>.cpp or is one of the SKIPPED_HEADERs, and nothing else is there: a
# glob that misses headers, or units of headers since removed, fail it. Compares the names, so
# the counts are equal too.
root=$1 units=$2
shift 2
headers=$(cd "$root" && find kvstore -name '*.hpp' | LC_ALL=C sort)
checked=$({
  (cd "$units" && find kvstore -name '*.hpp.cpp' | sed 's/\.cpp$//')
  [ $# -eq 0 ] || printf '%s\n' "$@"
} | LC_ALL=C sort)
n_headers=$(printf '%s\n' "$headers" | grep -c .)
n_units=$(find "$units" -name '*.hpp.cpp' | wc -l)
echo "$n_headers headers under $root/kvstore; $n_units generated units in $units; $# skipped${*:+: $*}"
if [ "$headers" != "$checked" ]; then
  printf '%s\n' "$headers" | while read -r h; do
    printf '%s\n' "$checked" | grep -qxF "$h" || echo "not checked (build again to re-run the glob): $h"
  done
  printf '%s\n' "$checked" | while read -r h; do
    printf '%s\n' "$headers" | grep -qxF "$h" || echo "checked but no such header: $h"
  done
  exit 1
fi
[ "$n_headers" -gt 0 ]
