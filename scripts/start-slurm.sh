#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine, as root, for the integration tests and
# for trying the sbatch scripts of deploy/slurm by hand:
#
#   eval "$(scripts/start-slurm.sh [DIR])"   # prints: export SLURM_CONF=DIR/slurm.conf ...
#   sbatch ...; squeue; ...
#   scripts/stop-slurm.sh DIR
#
# Everything lives in DIR (default: a new temporary directory): the munge key and socket,
# slurm.conf, controller state, spool, logs, and the PID of each daemon started (munged,
# slurmctld, slurmd), which stop-slurm.sh stops by PID. Nothing under /etc or /var is touched,
# and a Slurm or munge already running on the machine is left alone: this cluster uses its own
# munge socket and free ports. Needs scripts/install-integration-deps.sh.
#
# Slurm's daemons take no bind address: slurmctld and slurmd listen on all interfaces of their
# (free, randomly chosen) ports, though the node is registered as 127.0.0.1. The integration
# test therefore runs this inside a private network namespace (unshare --net) where it can.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "start-slurm: must run as root (slurmd starts jobs as their users)" >&2
  exit 1
fi
for tool in munged mungekey slurmctld slurmd scontrol python3; do
  command -v "$tool" >/dev/null || {
    echo "start-slurm: $tool not found (scripts/install-integration-deps.sh)" >&2
    exit 1
  }
done

dir=${1:-$(mktemp -d /tmp/mantissa-slurm.XXXXXX)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# munged refuses key and socket directories that others can write to (as /tmp is).
chmod 700 "$dir"
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
chmod 700 "$dir/munge"

# If anything below fails, stop what was already started.
trap 'echo "start-slurm: failed; stopping what was started" >&2; \
      "$(dirname "$0")/stop-slurm.sh" "$dir" >&2' ERR

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts a daemon in the foreground mode of its own, in the background of this script, in a
# new session (so a Ctrl-C in the calling shell does not reach it), and records its PID.
start_daemon() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/$name.pid"
}

# munge: a fresh key for this cluster only.
mungekey --create --keyfile="$dir/munge/munge.key" --force
chmod 400 "$dir/munge/munge.key"
socket="$dir/munge/munge.socket"
start_daemon munged munged --foreground --force --key-file="$dir/munge/munge.key" \
  --socket="$socket" --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed"
for _ in $(seq 50); do
  [ -S "$socket" ] && break
  sleep 0.1
done
[ -S "$socket" ] || { echo "start-slurm: munged did not start:" >&2; cat "$dir/log/munged.out" >&2; false; }

host=$(hostname -s)
ctld_port=$(free_port)
slurmd_port=$(free_port)
srun_low=$(free_port)
cat >"$dir/slurm.conf" <<EOF
# Single-node test cluster written by scripts/start-slurm.sh.
ClusterName=mantissa-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SrunPortRange=$srun_low-$((srun_low + 100))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.own.pid
SlurmdPidFile=$dir/slurmd.own.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container: track processes by their parent, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Debian's Slurm 22.05 needs the selector named explicitly; cores are the unit handed out.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# Requeued jobs (scontrol requeue) may run again, here at once.
JobRequeue=1
# Short timeouts: a test waits for the scheduler, not for the defaults' minutes.
SchedulerParameters=bf_interval=1,sched_min_interval=100000
MessageTimeout=10
KillWait=10
InactiveLimit=0
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

export SLURM_CONF="$dir/slurm.conf"
# -i: ignore state left from an earlier start in the same DIR (a fresh cluster every time).
start_daemon slurmctld slurmctld -D -i -f "$SLURM_CONF"
start_daemon slurmd slurmd -D -f "$SLURM_CONF" -N "$host"

# Ready when the node is idle (slurmd registered with the controller); at most 30 s, and not
# a moment longer once a daemon has died.
state=
for _ in $(seq 60); do
  for daemon in slurmctld slurmd; do
    kill -0 "$(cat "$dir/$daemon.pid")" 2>/dev/null || { state="$daemon died"; break 2; }
  done
  state=$(timeout 5 scontrol show node "$host" 2>/dev/null |
    sed -n 's/.*State=\([A-Z+_]*\).*/\1/p' || true)
  case "$state" in IDLE*) break ;; esac
  sleep 0.5
done
case "$state" in
  IDLE*) ;;
  *)
    echo "start-slurm: node $host not idle (state '${state:-unknown}'); logs in $dir/log" >&2
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    false
    ;;
esac
trap - ERR

echo "export SLURM_CONF=$SLURM_CONF"
echo "export MANTISSA_SLURM_DIR=$dir"
