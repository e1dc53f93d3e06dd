#!/usr/bin/env bash
# Starts real kvstore jobs the way cluster launchers do, on loopback only, and checks they succeed.
#
#   launch_test.sh MODE DIST_SMOKE KV_SERVER TRAIN_MNIST [PLACEMENT_SMOKE]
#
# MODE:
#   mpirun_train  mpirun -np 5 train_mnist (SPMD: rank 0 scheduler, 1-2 servers, 3-4 workers)
#   mpirun_smoke  mpirun -np 5 dist_smoke  (SPMD, exact values)
#   mpirun_mpmd   mpirun -np 1 kv_server --role scheduler : -np 2 kv_server --role server : -np 2 dist_smoke
#   mpirun_colocated  mpirun -np 3 -x KVSTORE_COLOCATED=1 placement_smoke (every rank a worker serving
#                 a shard, rank 0 also the scheduler), then dist_smoke the same way with 2 ranks, then
#                 a server count that differs (refused by every rank, naming both numbers)
#   env_slurm     4 dist_smoke processes with SLURM_PROCID/SLURM_NTASKS/SLURM_JOB_NODELIST (no srun here)
#   env_torchrun  4 dist_smoke processes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (no torchrun here)
#   env_dmlc      5 dist_smoke processes with DMLC_ROLE/DMLC_PS_ROOT_URI/... (as dmlc-tracker sets them)
#
# Exit 0: the job succeeded with the expected output; 1: it did not; 77: skipped (no mpirun).
# Every process is bounded in time (timeout) and reaped; the scheduler port is picked free per run.
set -uo pipefail

mode=${1:?mode}
dist_smoke=${2:?dist_smoke path}
kv_server=${3:?kv_server path}
train_mnist=${4:?train_mnist path}
placement_smoke=${5:-}

skip=77
limit=240          # seconds for one job (ctest gives the test 300)
out=$(mktemp -d "${TMPDIR:-/tmp}/kvstore-launch-$mode.XXXXXX")
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$out"
}
trap cleanup EXIT

fail() {
  echo "FAIL ($mode): $*" >&2
  local f
  for f in "$out"/*.log; do
    [[ -e $f ]] || continue
    echo "---- $(basename "$f")" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
}

# A free TCP port on 127.0.0.1, picked at random below the kernel's ephemeral range (from 32768):
# a port the kernel hands out for port 0 can become some outgoing connection's local port before
# the scheduler binds it (seen under parallel ctest). Else probe random ports.
free_port() {
  local p
  if p=$(python3 -c 'import random, socket
for _ in range(64):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(20000, 32000))); print(s.getsockname()[1]); break
    except OSError:
        s.close()' 2>/dev/null) &&
    [[ $p =~ ^[0-9]+$ ]]; then
    echo "$p"
    return
  fi
  for ((i = 0; i < 100; ++i)); do
    p=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  return 1
}

port=$(free_port) || fail "no free port"

# Loopback only: Open MPI's own wire-up (oob) and its byte transfer layer (btl) stay on lo; the
# programs do not link MPI, mpirun only starts them and gives each its rank.
mpirun_flags=(--oversubscribe --allow-run-as-root
              --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
# The environment of every app context. Open MPI 4.1 applies -x to the app context it is written
# in (before the first ':' it is the first one only), so an MPMD line repeats it in each.
job_env=(-x KVSTORE_NUM_SERVERS=2 -x "KVSTORE_SCHEDULER=127.0.0.1:$port" -x KVSTORE_LOG=0)

need_mpirun() {
  if ! command -v mpirun >/dev/null; then
    echo "SKIP ($mode): mpirun not found (Debian: apt-get install openmpi-bin)"
    exit $skip
  fi
}

# Runs one command with the time limit, output into $out/$1.log; returns its exit code.
run_logged() {
  local name=$1; shift
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
}

# Checks that $out/$1.log holds every one of the remaining arguments (fixed strings).
expect() {
  local log=$out/$1.log; shift
  local s
  for s in "$@"; do
    grep -qF -- "$s" "$log" || fail "'$s' not in $(basename "$log")"
  done
}

# Starts n copies of dist_smoke, the i-th with the environment that `env_for i` prints (one
# VAR=value per line), waits for all (bounded), fails unless every one exits 0.
run_by_hand() {
  local n=$1 env_for=$2 i rc
  local -a vars
  pids=()
  for ((i = 0; i < n; ++i)); do
    mapfile -t vars < <("$env_for" "$i")
    env KVSTORE_LOG=0 "${vars[@]}" timeout -k 10 "$limit" "$dist_smoke" >"$out/proc$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=()
  for ((i = 0; i < n; ++i)); do
    wait "${pids[$i]}"
    rc=$?
    ((rc == 0)) || failed+=("process $i exited $rc")
  done
  pids=()
  ((${#failed[@]} == 0)) || fail "${failed[*]}"
}

# The workers' "ok" lines: exactly one per worker rank, among all the logs.
expect_workers_ok() {
  local w=$1 r
  for ((r = 0; r < w; ++r)); do
    grep -qF "dist_smoke rank $r of $w workers" "$out"/*.log || fail "worker $r did not join a job of $w workers"
    grep -qF "dist_smoke rank $r ok" "$out"/*.log || fail "worker $r did not finish ok"
  done
}

case $mode in
  mpirun_train)
    need_mpirun
    run_logged job mpirun "${mpirun_flags[@]}" -np 5 "${job_env[@]}" \
      "$train_mnist" --limit 12000 --epochs 1 --target 0.70 ||
      fail "mpirun exited $?"
    expect job "dist_sync, 2 worker(s)" "done: test accuracy"
    ;;
  mpirun_smoke)
    need_mpirun
    run_logged job mpirun "${mpirun_flags[@]}" -np 5 "${job_env[@]}" "$dist_smoke" || fail "mpirun exited $?"
    expect_workers_ok 2
    ;;
  mpirun_mpmd)
    need_mpirun
    run_logged job mpirun "${mpirun_flags[@]}" \
      -np 1 "${job_env[@]}" "$kv_server" --role scheduler : \
      -np 2 "${job_env[@]}" "$kv_server" --role server : \
      -np 2 "${job_env[@]}" "$dist_smoke" || fail "mpirun exited $?"
    expect_workers_ok 2
    ;;
  mpirun_colocated)
    need_mpirun
    [[ -x $placement_smoke ]] || fail "no placement_smoke binary given"
    colocated_env=(-x KVSTORE_COLOCATED=1 -x "KVSTORE_SCHEDULER=127.0.0.1:$port" -x KVSTORE_LOG=0)
    run_logged placement mpirun "${mpirun_flags[@]}" -np 3 "${colocated_env[@]}" "$placement_smoke" ||
      fail "mpirun placement_smoke exited $?"
    for r in 0 1 2; do
      expect placement "placement_smoke rank $r of 3 workers, 3 servers, dist_sync, colocated" \
        "placement_smoke rank $r ok"
    done
    port=$(free_port) || fail "no free port"
    colocated_env=(-x KVSTORE_COLOCATED=1 -x "KVSTORE_SCHEDULER=127.0.0.1:$port" -x KVSTORE_LOG=0)
    run_logged smoke mpirun "${mpirun_flags[@]}" -np 2 "${colocated_env[@]}" "$dist_smoke" ||
      fail "mpirun dist_smoke exited $?"
    expect_workers_ok 2
    # A server count that differs from the ranks: every rank refuses it at once, naming both.
    if run_logged mismatch mpirun "${mpirun_flags[@]}" -np 2 "${colocated_env[@]}" \
      -x KVSTORE_NUM_SERVERS=3 "$dist_smoke"; then
      fail "a colocated job of 2 ranks with KVSTORE_NUM_SERVERS=3 succeeded"
    fi
    expect mismatch "2 workers" "KVSTORE_NUM_SERVERS=3"
    ;;
  env_slurm)
    # As `srun -n 4 dist_smoke` sets them: rank 0 scheduler, 1 server, 2 workers.
    slurm_env() {
      printf '%s\n' "SLURM_PROCID=$1" SLURM_NTASKS=4 SLURM_JOB_NODELIST=localhost \
        "KVSTORE_SCHEDULER=127.0.0.1:$port"
    }
    run_by_hand 4 slurm_env
    expect_workers_ok 2
    ;;
  env_torchrun)
    # As `torchrun --nproc-per-node 4 --master-addr 127.0.0.1 --master-port P` sets them.
    torchrun_env() {
      printf '%s\n' "RANK=$1" WORLD_SIZE=4 "LOCAL_RANK=$1" LOCAL_WORLD_SIZE=4 \
        MASTER_ADDR=127.0.0.1 "MASTER_PORT=$port"
    }
    run_by_hand 4 torchrun_env
    expect_workers_ok 2
    ;;
  env_dmlc)
    # As dmlc-tracker (MXNet tools/launch.py --launcher local -n 2 -s 2) sets them: the same
    # program in every role; a server's or the scheduler's KVStore<dist> runs that role and exits.
    dmlc_env() {
      local role=worker
      (($1 == 0)) && role=scheduler
      (($1 == 1 || $1 == 2)) && role=server
      printf '%s\n' "DMLC_ROLE=$role" DMLC_PS_ROOT_URI=127.0.0.1 "DMLC_PS_ROOT_PORT=$port" \
        DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=2
    }
    run_by_hand 5 dmlc_env
    expect_workers_ok 2
    ;;
  *)
    echo "launch_test.sh: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
echo "PASS ($mode)"
