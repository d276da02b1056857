#!/usr/bin/env bash
# Start a Slurm cluster on this machine, as root, for the integration and multinode tests and
# for trying the sbatch scripts of deploy/slurm by hand. One node (this machine):
#
#   eval "$(scripts/start-slurm.sh [DIR])"   # prints: export SLURM_CONF=DIR/slurm.conf ...
#   sbatch ...; squeue; ...
#   scripts/stop-slurm.sh "$MANTISSA_SLURM_DIR"   # DIR, which the eval exported
#
# or one node per host of the test cluster of scripts/start-cluster.sh (hosts node1..N in
# network namespaces, CLUSTER_DIR default /var/tmp/mantissa-cluster):
#
#   eval "$(scripts/start-cluster.sh 2)"; eval "$(scripts/start-slurm.sh --hosts 2 [DIR])"
#   sbatch --nodes=2 ...
#   scripts/stop-slurm.sh DIR; scripts/stop-cluster.sh
#
# Everything lives in DIR (default: a new temporary directory; with --hosts, CLUSTER_DIR/slurm,
# since every host has a /tmp of its own): the munge key and socket, slurm.conf, controller
# state, spool, logs, and the PID of each daemon started (munged, slurmctld, one slurmd per
# node), which stop-slurm.sh stops by PID. Nothing under /etc or /var is touched, and a Slurm
# or munge already running on the machine is left alone: this cluster uses its own munge socket
# and free ports.
#
# With --hosts N, munged and slurmctld run on the machine (the cluster's bridge address
# 198.18.0.1) and each host runs its own slurmd (NodeName=nodeK NodeAddr=198.18.0.(10+K)),
# started inside the host's network, UTS and mount namespaces with nsenter (`ip netns exec`
# would remount /sys without the cgroup file system slurmd reads). Each slurmd has its own
# spool, PID and log file and TmpFS (DIR/.../%n): PMIx keeps per-job files there whose names
# would collide between nodes. Needs scripts/install-integration-deps.sh.
#
# Slurm's daemons take no bind address: slurmctld and slurmd listen on all interfaces of their
# (free, randomly chosen) ports, though the node is registered as 127.0.0.1 (or its cluster
# address). The tests therefore run this inside a private network namespace (unshare --net).
set -euo pipefail

usage="usage: start-slurm.sh [--hosts N] [DIR]"
hosts=0
if [ "${1:-}" = --hosts ]; then
  hosts=${2:?$usage}
  [[ "$hosts" =~ ^[1-9][0-9]?$ ]] || { echo "start-slurm: $usage" >&2; exit 2; }
  shift 2
fi
cluster_dir=${CLUSTER_DIR:-/var/tmp/mantissa-cluster}

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

# The cluster's hosts and the PIDs of their keepers (processes inside their namespaces).
node_names=()
keepers=()
for k in $(seq "$hosts"); do
  # shellcheck disable=SC2015 # the message when any of them fails
  pid=$(cat "$cluster_dir/node$k.pid" 2>/dev/null) && [ -e "/run/netns/node$k" ] &&
    [ "$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null)" = "$(stat -L -c %i "/run/netns/node$k")" ] || {
    echo "start-slurm: node$k is not a running host of the cluster in $cluster_dir" \
      "(scripts/start-cluster.sh $hosts)" >&2
    exit 1
  }
  node_names+=("node$k")
  keepers+=("$pid")
done

if [ "$hosts" -gt 0 ]; then
  dir=${1:-$cluster_dir/slurm}
else
  dir=${1:-$(mktemp -d /tmp/mantissa-slurm.XXXXXX)}
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
case "$dir" in /tmp | /tmp/*)
  [ "$hosts" -eq 0 ] || { echo "start-slurm: DIR $dir is under /tmp, which each host has of its own" >&2; exit 2; } ;;
esac
# munged refuses key and socket directories that others can write to (as /tmp is).
chmod 700 "$dir"
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/tmpfs"
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
if [ "$hosts" -gt 0 ]; then
  ctld_addr=198.18.0.1
  nodes_conf=""
  for k in $(seq "$hosts"); do
    nodes_conf+="NodeName=node$k NodeAddr=198.18.0.$((10 + k)) CPUs=$(nproc) State=UNKNOWN"$'\n'
    mkdir -p "$dir/spool/node$k" "$dir/tmpfs/node$k"
  done
  partition_nodes=node[1-$hosts]
else
  ctld_addr=127.0.0.1
  nodes_conf="NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN"
  mkdir -p "$dir/spool/$host" "$dir/tmpfs/$host"
  node_names=("$host")
  partition_nodes=$host
fi
ctld_port=$(free_port)
slurmd_port=$(free_port)
srun_low=$(free_port)
cat >"$dir/slurm.conf" <<EOF
# Test cluster written by scripts/start-slurm.sh.
ClusterName=mantissa-test
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SrunPortRange=$srun_low-$((srun_low + 100))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$dir/state
# Per node (%n: its name): several slurmd on one machine must not share these.
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/tmpfs/%n
SlurmctldPidFile=$dir/slurmctld.own.pid
SlurmdPidFile=$dir/slurmd.%n.own.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
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
$nodes_conf
PartitionName=debug Nodes=$partition_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF

export SLURM_CONF="$dir/slurm.conf"
# -i: ignore state left from an earlier start in the same DIR (a fresh cluster every time).
start_daemon slurmctld slurmctld -D -i -f "$SLURM_CONF"
daemons=(slurmctld)
if [ "$hosts" -gt 0 ]; then
  for k in $(seq "$hosts"); do
    # nsenter execs slurmd (it forks only to enter a PID namespace): the PID recorded is
    # slurmd's.
    start_daemon "slurmd.node$k" nsenter -t "${keepers[k - 1]}" --net --uts --mount \
      slurmd -D -f "$SLURM_CONF" -N "node$k"
    daemons+=("slurmd.node$k")
  done
else
  start_daemon slurmd slurmd -D -f "$SLURM_CONF" -N "$host"
  daemons+=(slurmd)
fi

# Ready when every node is idle (its slurmd registered with the controller); at most 30 s,
# and not a moment longer once a daemon has died.
waiting=
for _ in $(seq 60); do
  for daemon in "${daemons[@]}"; do
    kill -0 "$(cat "$dir/$daemon.pid")" 2>/dev/null || { waiting="$daemon died"; break 2; }
  done
  waiting=
  for node in "${node_names[@]}"; do
    state=$(timeout 5 scontrol show node "$node" 2>/dev/null |
      sed -n 's/.*State=\([A-Z+_]*\).*/\1/p' || true)
    case "$state" in IDLE*) ;; *) waiting+="$node ${state:-unknown}; " ;; esac
  done
  [ -z "$waiting" ] && break
  sleep 0.5
done
if [ -n "$waiting" ]; then
  echo "start-slurm: not idle: ${waiting% }; logs in $dir/log" >&2
  tail -n 20 "$dir/log/slurmctld.log" "$dir"/log/slurmd*.log >&2 || true
  false
fi
trap - ERR

echo "export SLURM_CONF=$SLURM_CONF"
echo "export MANTISSA_SLURM_DIR=$dir"
