#!/usr/bin/env bash
# Stop the test cluster of scripts/start-cluster.sh, whatever state it is in (also after a
# failed start): for every host nodeK, every process inside its network namespace (its keeper,
# and whatever ran there: orteds, ranks, daemons) gets SIGTERM, then SIGKILL after 10 s; then
# its namespace and veth go, then the bridge mantissa-br0. The state files in CLUSTER_DIR
# (default /var/tmp/mantissa-cluster) are removed; the directory itself only when empty (run
# directories put there are left alone). Exits non-zero, naming it, if anything is left.
#   scripts/stop-cluster.sh
set -uo pipefail

dir=${CLUSTER_DIR:-/var/tmp/mantissa-cluster}
bridge=mantissa-br0

if [ "$(id -u)" -ne 0 ]; then
  echo "stop-cluster: must run as root" >&2
  exit 1
fi

# The hosts: the namespaces named nodeK, and the machine's veth ends mveth-nodeK (a failed
# start may have left one without the other).
hosts=$({
  ip netns list 2>/dev/null | sed -n 's/^\(node[0-9]\+\)\b.*/\1/p'
  ip -o link show 2>/dev/null | sed -n 's/^[0-9]\+: mveth-\(node[0-9]\+\)[@:].*/\1/p'
} | sort -uV)

# The PIDs of the processes in host $1's network namespace.
host_pids() { [ -e "/run/netns/$1" ] && ip netns pids "$1" 2>/dev/null; }

for host in $hosts; do
  pids=$(host_pids "$host" | tr '\n' ' ')
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086 # one word per PID
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 100); do
      [ -z "$(host_pids "$host")" ] && break
      sleep 0.1
    done
    pids=$(host_pids "$host" | tr '\n' ' ')
    if [ -n "$pids" ]; then
      echo "stop-cluster: $host: pids $pids ignored SIGTERM; killing them" >&2
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null
      sleep 0.5
    fi
  fi
  # The veth goes with its peer (eth0 inside); deleting the namespace deletes eth0 anyway.
  ip link del "mveth-$host" 2>/dev/null
  [ -e "/run/netns/$host" ] && ip netns del "$host"
  rm -f "$dir/$host.pid" "$dir/$host.pid.new" "$dir/$host.log"
done

ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge"
rm -f "$dir/hostfile" "$dir/hostfile.new" "$dir/mpi.env" "$dir/cluster-rsh-agent" \
  "$dir/cluster-rsh-agent.new"
rmdir "$dir" 2>/dev/null

left=
for host in $hosts; do
  [ -e "/run/netns/$host" ] && left="$left namespace $host;"
  [ -n "$(host_pids "$host")" ] && left="$left processes in $host;"
  ip link show "mveth-$host" >/dev/null 2>&1 && left="$left veth mveth-$host;"
done
ip link show "$bridge" >/dev/null 2>&1 && left="$left bridge $bridge;"
if [ -n "$left" ]; then
  echo "stop-cluster: left behind:$left" >&2
  exit 1
fi
[ -n "$hosts" ] && echo "stop-cluster: stopped $(echo "$hosts" | tr '\n' ' ')" >&2
exit 0
