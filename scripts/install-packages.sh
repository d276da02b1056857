#!/usr/bin/env bash
# Install the named Debian packages that are missing (apt-get; sudo when not root).
# Idempotent. Services the packages bring do not start on install (policy-rc.d exit 101):
# the tests start their own instances on 127.0.0.1 and stop them by PID.
#   scripts/install-packages.sh PACKAGE...
set -euo pipefail

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "install-packages: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
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
