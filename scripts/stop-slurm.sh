#!/usr/bin/env bash
# Stop the cluster that scripts/start-slurm.sh started in DIR: every slurmd, slurmctld and
# munged, each by the PID recorded in DIR, in that order; SIGKILL after 10 s. Then the
# directory is removed unless KEEP=1.
#   scripts/stop-slurm.sh DIR
set -uo pipefail

dir=${1:?usage: stop-slurm.sh DIR}

stop_pid_file() {
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  rm -f "$file"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "stop-slurm: pid $pid ($file) ignored SIGTERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

# Jobs still running would leave their slurmstepd and tasks behind: cancel them (all jobs of
# this cluster, which only the tests use) while the controller is still up.
if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
  export SLURM_CONF="$dir/slurm.conf"
  if [ -n "$(squeue --noheader --format=%i 2>/dev/null)" ]; then
    scancel --user="$(id -un)" 2>/dev/null
    for _ in $(seq 30); do
      [ -z "$(squeue --noheader --format=%i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
fi

for pid_file in "$dir"/slurmd.pid "$dir"/slurmd.node*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
  stop_pid_file "$pid_file"
done

if [ "${KEEP:-0}" = 1 ]; then
  echo "stop-slurm: kept $dir"
else
  rm -rf "$dir"
fi
