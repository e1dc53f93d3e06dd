#!/usr/bin/env bash
# The demo: trains a small Fashion-MNIST model through kvstore. With the distributed tools built
# (kv_launch and kv_server) it runs 2 workers and 2 servers on this machine through kv_launch;
# otherwise one process in local mode.
# Extra arguments go to train_mnist. Environment: JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib.sh
bash scripts/setup-deps.sh

configure build
cmake --build build -j"$JOBS" --target examples/all

if [[ ! -x build/examples/train_mnist ]]; then
  echo "demo: build/examples/train_mnist was not built" >&2
  exit 1
fi
if [[ -x build/examples/kv_launch && -x build/examples/kv_server ]]; then
  set -x
  exec build/examples/kv_launch -w 2 -s 2 -- build/examples/train_mnist "$@"
else
  set -x
  exec build/examples/train_mnist --local "$@"
fi
