#!/usr/bin/env bash
# Checks deploy/prometheus: the scrape config and alert rules are valid, and the alert rules
# behave as alerts_test.yml says (promtool test rules).
#   promtool_rules.sh DEPLOY_PROMETHEUS_DIR
set -euo pipefail
dir=$1
if ! command -v promtool >/dev/null; then
  echo "SKIPPED (integration): promtool not installed (scripts/install-integration-deps.sh)"
  exit 0
fi
cd "$dir"
promtool check rules alerts.yml
# --syntax-only: the file_sd directory exists only on a Prometheus host.
promtool check config --syntax-only prometheus.yml
promtool test rules alerts_test.yml
