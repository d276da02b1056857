#!/usr/bin/env bash
# Faults and limits on the links of the test cluster's hosts (scripts/start-cluster.sh), as root:
#   cluster-link.sh down HOST            cut HOST's link (its veth in the bridge goes down; HOST's
#                                        eth0 loses its carrier): nothing reaches it, nothing leaves
#   cluster-link.sh up HOST              restore it
#   cluster-link.sh rate HOST RATE [BURST]
#                                        limit HOST's link to RATE (tc units: 200mbit, 1gbit) in
#                                        each direction, with a token bucket (tbf) on both ends of
#                                        its veth: tbf shapes only what an interface sends
#   cluster-link.sh unshape HOST         remove the limit
#   cluster-link.sh show [HOST...]       state and qdiscs of the hosts' links (default: all)
# HOST is nodeK. BURST (default: 10 ms of RATE, at least 32kb) is the bucket's size: at least
# RATE / HZ, or the link runs slower than RATE. Packets wait at most 50 ms for tokens (latency).
set -euo pipefail

usage="usage: cluster-link.sh down|up|rate|unshape|show HOST [RATE [BURST]]"
if [ "$(id -u)" -ne 0 ]; then
  echo "cluster-link: must run as root" >&2
  exit 1
fi
cmd=${1:?$usage}
shift

check_host() {
  # shellcheck disable=SC2015 # the message when any of them fails
  [[ "$1" =~ ^node[0-9]+$ ]] && [ -e "/run/netns/$1" ] && ip link show "mveth-$1" >/dev/null 2>&1 || {
    echo "cluster-link: $1 is not a host of the running cluster (scripts/start-cluster.sh)" >&2
    exit 1
  }
}

# RATE in tc's notation as bytes per second (kbit, mbit, gbit, bit, or bps / kbps / mbps bytes).
rate_bytes() {
  local num unit
  [[ "$1" =~ ^([0-9]+)([a-z]*)$ ]] || {
    echo "cluster-link: rate '$1' is not NUMBER[bit|kbit|mbit|gbit|bps|kbps|mbps]" >&2
    exit 2
  }
  num=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case "$unit" in
    bit) echo $((num / 8)) ;;
    kbit) echo $((num * 1000 / 8)) ;;
    mbit) echo $((num * 1000000 / 8)) ;;
    gbit) echo $((num * 1000000000 / 8)) ;;
    bps) echo "$num" ;;
    kbps) echo $((num * 1000)) ;;
    mbps) echo $((num * 1000000)) ;;
    *)
      echo "cluster-link: rate unit '$unit' unknown (bit, kbit, mbit, gbit, bps, kbps, mbps)" >&2
      exit 2
      ;;
  esac
}

case "$cmd" in
  down | up)
    host=${1:?$usage}
    check_host "$host"
    ip link set "mveth-$host" "$cmd"
    ;;
  rate)
    host=${1:?$usage}
    rate=${2:?$usage}
    check_host "$host"
    bytes=$(rate_bytes "$rate")
    burst=${3:-$((bytes / 100 > 32768 ? bytes / 100 : 32768))}
    # The machine's end shapes what HOST receives; HOST's eth0 what it sends.
    tc qdisc replace dev "mveth-$host" root tbf rate "$rate" burst "$burst" latency 50ms
    nsenter --net="/run/netns/$host" \
      tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    ;;
  unshape)
    host=${1:?$usage}
    check_host "$host"
    tc qdisc del dev "mveth-$host" root 2>/dev/null || true
    nsenter --net="/run/netns/$host" tc qdisc del dev eth0 root 2>/dev/null || true
    ;;
  show)
    hosts=${*:-$(ip netns list | sed -n 's/^\(node[0-9]\+\)\b.*/\1/p' | sort -V)}
    for host in $hosts; do
      check_host "$host"
      state=$(ip -br link show "mveth-$host" | awk '{print $2}')
      echo "$host: link $state | machine's end: $(tc qdisc show dev "mveth-$host" root | head -1)" \
        "| $host's eth0: $(nsenter --net="/run/netns/$host" tc qdisc show dev eth0 root | head -1)"
    done
    ;;
  *)
    echo "cluster-link: $usage" >&2
    exit 2
    ;;
esac
