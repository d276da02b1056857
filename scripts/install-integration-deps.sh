#!/usr/bin/env bash
# Install what the integration tests (ctest -L integration) run against: a real Prometheus
# server and promtool, a Pushgateway, a single-node Slurm with munge, curl, and iproute2 (`ip`,
# to set up the private network namespace the tests run in). Debian 12 packages, idempotent.
set -euo pipefail
exec "$(dirname "$0")/install-packages.sh" \
  prometheus prometheus-pushgateway slurm-wlm munge curl iproute2
