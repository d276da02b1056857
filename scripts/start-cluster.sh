#!/usr/bin/env bash
# Start a test cluster of N hosts, node1..nodeN, on this one machine, as root:
#
#   eval "$(scripts/start-cluster.sh N)"   # prints: export CLUSTER_DIR=... OMPI_MCA_...=...
#   mpirun --hostfile "$CLUSTER_DIR/hostfile" -np 4 hostname     # node1 node1 node2 node2
#   scripts/cluster-link.sh down node2 | up node2 | rate node2 200mbit | unshape node2
#   scripts/stop-cluster.sh
#
# A host is what a real cluster node is to the software on it: its own network stack
# (a network namespace, /run/netns/nodeK, whose eth0 is a veth into the bridge mantissa-br0),
# its own hostname (a UTS namespace) and its own /tmp (a mount namespace with a private tmpfs
# there: PMIx and Open MPI keep per-job files in /tmp whose names would collide between hosts).
# Everything else of the file system is shared between the hosts, as a cluster file system
# would be: the build tree, configs, run directories. Each host is kept alive by one keeper
# process (`sleep infinity` inside its namespaces) whose PID is in CLUSTER_DIR/nodeK.pid;
# scripts/cluster-rsh-agent enters a host through it (Open MPI's plm_rsh_agent, instead of ssh).
#
# Addresses: only 198.18.0.0/24 (RFC 2544's benchmarking range, never routed outside): the
# bridge is 198.18.0.1 (the machine itself, where mpirun runs), nodeK is 198.18.0.(10+K).
# Nothing is forwarded or NATed: the hosts reach each other and the machine, nothing else.
# IPv6 is disabled on every interface made here, so no link-local address appears either.
#
# CLUSTER_DIR (default /var/tmp/mantissa-cluster, outside /tmp so that every host sees it)
# holds the hostfile (`nodeK slots=SLOTS`, SLOTS default 2), mpi.env (the exports printed
# above), the keepers' PIDs and logs. Running it again with the same N changes nothing (a
# larger N adds hosts; a smaller one is refused: stop the cluster first); a failed start says
# which step failed and stops whatever is there (scripts/stop-cluster.sh).
set -euo pipefail

usage="usage: start-cluster.sh N   (N hosts node1..nodeN, 1 <= N <= 99)"
here=$(cd "$(dirname "$0")" && pwd)
n=${1:?$usage}
[[ "$n" =~ ^[1-9][0-9]?$ ]] || { echo "start-cluster: $usage" >&2; exit 2; }
slots=${SLOTS:-2}
dir=${CLUSTER_DIR:-/var/tmp/mantissa-cluster}

if [ "$(id -u)" -ne 0 ]; then
  echo "start-cluster: must run as root (network namespaces, veths, a bridge)" >&2
  exit 1
fi
for tool in ip nsenter unshare setsid tc; do
  command -v "$tool" >/dev/null || {
    echo "start-cluster: $tool not found (iproute2, util-linux)" >&2
    exit 1
  }
done

bridge=mantissa-br0
subnet_prefix=198.18.0

# The step now running, named in the message if it fails.
step="checking for a cluster already running"
on_error() {
  echo "start-cluster: failed while $step; stopping the cluster" >&2
  CLUSTER_DIR="$dir" "$here/stop-cluster.sh" >&2 || true
}
trap on_error ERR

# Quietly true where a network namespace named $1 exists.
netns_exists() { [ -e "/run/netns/$1" ]; }

# A cluster is not shrunk (its hosts may be running jobs); it grows by the hosts it lacks.
running=$(ip netns list 2>/dev/null | sed -n 's/^\(node[0-9]\+\)\b.*/\1/p' | sort -V | tr '\n' ' ')
if [ -n "$running" ]; then
  for name in $running; do
    k=${name#node}
    if [ "$k" -gt "$n" ]; then
      trap - ERR
      echo "start-cluster: a cluster with hosts ${running% } is already running;" \
        "scripts/stop-cluster.sh first to start one of $n" >&2
      exit 1
    fi
  done
fi

step="creating $dir"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

step="creating the bridge $bridge ($subnet_prefix.1/24)"
if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
  sysctl -qw "net.ipv6.conf.$bridge.disable_ipv6=1" 2>/dev/null || true
  ip addr add "$subnet_prefix.1/24" dev "$bridge"
fi
ip link set "$bridge" up

for k in $(seq "$n"); do
  host=node$k
  addr=$subnet_prefix.$((10 + k))
  veth=mveth-$host # the machine's end, in the bridge; the host's end is its eth0

  step="creating the network namespace $host"
  netns_exists "$host" || ip netns add "$host"

  step="creating the veth $veth <-> $host:eth0"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name "$veth-in"
    sysctl -qw "net.ipv6.conf.$veth.disable_ipv6=1" 2>/dev/null || true
    ip link set "$veth-in" netns "$host"
    ip -n "$host" link set "$veth-in" name eth0
  fi
  ip link set "$veth" master "$bridge"
  ip link set "$veth" up

  step="configuring $host's interfaces (eth0 $addr/24, lo)"
  nsenter --net="/run/netns/$host" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null || true
  ip -n "$host" link set lo up
  ip -n "$host" addr replace "$addr/24" dev eth0
  ip -n "$host" link set eth0 up

  step="starting $host's keeper (hostname $host, private /tmp)"
  pid_file=$dir/$host.pid
  if ! { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
    rm -f "$pid_file"
    # nsenter --net (not `ip netns exec`, which remounts /sys and loses /sys/fs/cgroup, which
    # slurmd needs) into the namespace, then new UTS and mount namespaces (unshare makes the
    # mounts private, so the tmpfs stays this host's). The shell writes its PID and becomes
    # the keeper (exec), in a session of its own, away from the caller's terminal signals.
    # shellcheck disable=SC2016 # expanded by the host's shell
    setsid nsenter --net="/run/netns/$host" \
      unshare --uts --mount --propagation private \
      sh -c 'hostname "$1" && mount -t tmpfs -o mode=1777 tmpfs /tmp &&
             echo $$ >"$2.new" && mv "$2.new" "$2" && exec sleep infinity' \
      sh "$host" "$pid_file" </dev/null >"$dir/$host.log" 2>&1 &
    for _ in $(seq 50); do
      [ -f "$pid_file" ] && break
      sleep 0.1
    done
    [ -f "$pid_file" ] || { cat "$dir/$host.log" >&2; false; }
  fi

  step="checking $host (hostname, address, private /tmp)"
  pid=$(cat "$pid_file")
  # shellcheck disable=SC2016 # expanded by the host's shell
  seen=$(nsenter -t "$pid" --net --uts --mount sh -c \
    'echo "$(hostname) $(ip -4 -o addr show dev eth0 | awk "{print \$4}") $(stat -f -c %T /tmp)"')
  [ "$seen" = "$host $addr/24 tmpfs" ] || {
    echo "start-cluster: $host reports '$seen', expected '$host $addr/24 tmpfs'" >&2
    false
  }
done

step="checking that the hosts reach each other"
# A TCP connect to a port nothing listens on (9, discard): refused at once where the address
# answers, a timeout where it does not. From the machine to every host, and from node1 to
# every other host, over the bridge.
reaches() {
  python3 -c 'import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=3)
except ConnectionRefusedError:
    sys.exit(0)
except OSError as e:
    sys.exit(f"{e}")' "$1"
}
for k in $(seq "$n"); do
  reaches "$subnet_prefix.$((10 + k))" ||
    { echo "start-cluster: the machine cannot reach node$k" >&2; false; }
  [ "$k" = 1 ] && continue
  nsenter --net=/run/netns/node1 bash -c "$(declare -f reaches); reaches $subnet_prefix.$((10 + k))" ||
    { echo "start-cluster: node1 cannot reach node$k" >&2; false; }
done

step="writing $dir/hostfile, $dir/cluster-rsh-agent and $dir/mpi.env"
: >"$dir/hostfile.new"
for k in $(seq "$n"); do
  echo "node$k slots=$slots" >>"$dir/hostfile.new"
done
mv "$dir/hostfile.new" "$dir/hostfile"
# The remote shell goes where every host sees it (a checkout under /tmp is invisible inside
# the hosts, and Open MPI's daemons on the hosts check that the agent exists), knowing this
# cluster's directory without CLUSTER_DIR (which a fresh login environment does not carry).
sed "s|^dir=\${CLUSTER_DIR:-.*}\$|dir=\${CLUSTER_DIR:-$dir}|" "$here/cluster-rsh-agent" >"$dir/cluster-rsh-agent.new"
grep -q "^dir=\${CLUSTER_DIR:-$dir}\$" "$dir/cluster-rsh-agent.new"
chmod +x "$dir/cluster-rsh-agent.new"
mv "$dir/cluster-rsh-agent.new" "$dir/cluster-rsh-agent"
# Open MPI as on a real cluster: the remote shell enters a host's namespaces; its daemons and
# ranks talk only over the cluster's subnet; ranks talk TCP only (ob1 + tcp; also within a
# host, so that every test's traffic crosses the same transport); each orted binds nothing.
cat >"$dir/mpi.env" <<EOF
export CLUSTER_DIR=$dir
export OMPI_MCA_plm_rsh_agent=$dir/cluster-rsh-agent
export OMPI_MCA_oob_tcp_if_include=$subnet_prefix.0/24
export OMPI_MCA_btl_tcp_if_include=$subnet_prefix.0/24
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl=self,tcp
export OMPI_MCA_hwloc_base_binding_policy=none
EOF
trap - ERR

echo "start-cluster: $n hosts up: $(sed 's/ slots=.*//' "$dir/hostfile" | tr '\n' ' ')(hostfile $dir/hostfile)" >&2
cat "$dir/mpi.env"
