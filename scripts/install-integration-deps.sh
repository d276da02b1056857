#!/usr/bin/env bash
# Install what the integration tests (ctest -L integration) run against: a real Prometheus
# server and promtool, a Pushgateway, a single-node Slurm with munge, curl, and iproute2 (`ip`,
# to set up the private network namespace the tests run in).
# Idempotent: installs only what is missing. Debian 12 packages.
set -euo pipefail

packages=(prometheus prometheus-pushgateway slurm-wlm munge curl iproute2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "install-integration-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
# The packages' own services must not start on install (they would listen on all addresses,
# and Debian starts them where an init system runs): the tests start their own instances on
# 127.0.0.1 and stop them by PID. policy-rc.d exit 101 tells invoke-rc.d "do not start".
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod +x "$policy"
  created_policy=1
fi
trap '[ "$created_policy" -eq 0 ] || "${sudo_cmd[@]}" rm -f "$policy"' EXIT
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}"
