#!/usr/bin/env bash
# Installs what kvstore needs to build, test, run the demo and package (Debian 12).
# Idempotent and quiet when everything is already there: apt is touched only for missing packages.
set -euo pipefail

APT_PACKAGES=(
  cmake ninja-build g++ clang ccache                      # toolchain
  clang-format doxygen python3                            # format and layer checks, the docs target
  libclang-rt-14-dev                                      # libFuzzer + sanitizer runtimes (scripts/fuzz.sh)
  libboost1.81-dev libboost-serialization1.81-dev         # Boost.Asio + Boost.Serialization
  libboost-program-options1.81-dev                        # kv_server's and kv_launch's command lines
  doctest-dev libbenchmark-dev libssl-dev                 # tests, benchmarks, TLS/HMAC
  libthrust-dev                                           # KVStore<device> without CUDA (Thrust OMP backend)
  openmpi-bin libopenmpi-dev                              # launching under mpirun
  dataset-fashion-mnist zlib1g-dev                        # the demo's data (.gz) and its reader
  iproute2 nftables                                       # test_faults: namespaces, tc, lossy links
  python3-matplotlib                                      # scripts/plot_bench.py: the README's benchmark plots
  time                                                    # scripts/compile_times.sh: GNU time's peak memory
)

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "setup-deps: need root (or sudo) to run: $*" >&2; return 1
  fi
}

# pip is needed for Conan; a bare Debian has neither python3 nor pip.
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
  APT_PACKAGES+=(python3 python3-pip)
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Conan 2 from PyPI, only if missing. Debian's system python refuses `pip install` outside a venv
# (PEP 668, EXTERNALLY-MANAGED) unless told otherwise; a pyenv/venv python does not need the flag.
if ! command -v conan >/dev/null; then
  echo "setup-deps: installing conan (PyPI)"
  pip_flags=(-q --disable-pip-version-check)
  if python3 -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_flags+=(--break-system-packages)
  fi
  [[ $(id -u) -eq 0 ]] && pip_flags+=(--root-user-action=ignore)
  python3 -m pip install "${pip_flags[@]}" 'conan>=2,<3'
  command -v pyenv >/dev/null && pyenv rehash || true
  hash -r
  command -v conan >/dev/null || { echo "setup-deps: conan installed but not on PATH" >&2; exit 1; }
fi
