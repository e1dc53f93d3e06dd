# Shared by scripts/*.sh (sourced, not run). Expects the caller to be in the repository root.

JOBS=${JOBS:-$(nproc)}

# ccache keys on paths relative to the checkout, not on where it lies, so a second clone (CI's
# fresh clone beside a developer's) reuses what the first compiled instead of building it all again.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

# configure DIR [CMAKE_ARGS...]: Ninja, RelWithDebInfo, ccache when present. Debug information
# is line tables only (-g1): what a backtrace, perf and a sanitizer report need, and a quarter
# less compile time than -g (g++ of tests/cluster/test_dist_sync.cpp: 66 s -> 50 s). Later
# CMAKE_ARGS win (the sanitizer trees of scripts/test.sh pass their own).
configure() {
  local dir=$1; shift
  local args=(-S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
    "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -Xcompiler=-g1 -DNDEBUG")  # nvcc: 61 s -> 45 s a test
  if command -v ccache >/dev/null; then args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake "${args[@]}" "$@" >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log" >&2
    echo "configure of $dir failed" >&2
    return 1
  }
}

# executables DIR: the programs directly in DIR (what a CMake subdirectory built), one per line.
executables() {
  [[ -d $1 ]] || return 0
  find "$1" -maxdepth 1 -type f -perm -u+x | sort
}

# build_kv_bench_at REV: builds kv_bench of commit REV in build-ab/ (from a git worktree kept
# there for the next time) and prints the program's path. For scripts/bench-ab.sh and
# scripts/gpu-bundle.sh's AB_BASE.
build_kv_bench_at() {
  local rev=$1 tree=build-ab/tree
  if [[ -d $tree ]]; then
    git -C "$tree" checkout -q --detach "$rev"
  else
    mkdir -p build-ab
    git worktree add -q --detach "$tree" "$rev"
  fi
  (cd "$tree" && configure ../build -DKVSTORE_BUILD_EXAMPLES=OFF -DKVSTORE_BUILD_TESTS=OFF &&
    cmake --build ../build -j"$JOBS" --target kv_bench >/dev/null) >&2
  echo build-ab/build/benchmarks/kv_bench
}
