#!/usr/bin/env bash
# The integration suite: `autocdc serve` over HTTP against each catalog/storage
# combination (hadoop-local, hadoop-s3, sql-s3, rest, and hadoop-local-nats:
# the ingest log on NATS JetStream), restarted between
# batches, the tables checked with DuckDB and PyIceberg and with the catalog's
# own view. One line per combination and check; exits non-zero on any FAIL.
# scripts/test (the test command) runs it.
#
#   bash integration/suite.sh [hadoop-local|hadoop-s3|sql-s3|rest|hadoop-local-nats]...
#
# Endpoints come only from the AUTOCDC_TEST_* variables: set them (e.g. for
# `docker compose up -d postgres seaweedfs`), or this starts the native
# backends with integration/backends.sh when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
combos=("$@")
[ ${#combos[@]} -eq 0 ] && combos=(hadoop-local hadoop-s3 sql-s3 rest hadoop-local-nats)

venv=${AUTOCDC_VENV:-$HOME/.cache/autocdc-venv}
py="$venv/bin/python"
[ -x "$py" ] || python3 -m venv "$venv"
if ! "$py" -c 'import duckdb, pyiceberg, pyarrow, duckdb_extension_iceberg, duckdb_extension_avro' 2>/dev/null; then
  "$py" -m pip install --quiet "duckdb==1.5.5" "duckdb-extension-iceberg==1.5.5" "duckdb-extension-avro==1.5.5" "pyiceberg==0.12.*" pyarrow
fi
# DuckDB reads s3:// through httpfs.
"$py" -c 'import duckdb_extension_httpfs' 2>/dev/null || "$py" -m pip install --quiet "duckdb-extension-httpfs==1.5.5"

needs_backends=false
for c in "${combos[@]}"; do
  case $c in
    hadoop-local) ;;
    hadoop-s3) [ -n "${AUTOCDC_TEST_S3_ENDPOINT:-}" ] || needs_backends=true ;;
    sql-s3) [ -n "${AUTOCDC_TEST_S3_ENDPOINT:-}" ] && [ -n "${AUTOCDC_TEST_POSTGRES_URL:-}" ] || needs_backends=true ;;
    rest) [ -n "${AUTOCDC_TEST_S3_ENDPOINT:-}" ] && [ -n "${AUTOCDC_TEST_REST_URI:-}" ] || needs_backends=true ;;
    hadoop-local-nats) [ -n "${AUTOCDC_TEST_NATS_URL:-}" ] || needs_backends=true ;;
    *) echo "unknown combination $c (hadoop-local, hadoop-s3, sql-s3, rest, hadoop-local-nats)" >&2; exit 2 ;;
  esac
done
if $needs_backends; then
  eval "$(bash integration/backends.sh up)"
fi

cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
work=$(mktemp -d)
# suite.py stops its own servers; this is for a suite.py that was killed.
trap 'pkill -KILL -f -- "--config $work/" 2>/dev/null || true' EXIT
"$bin" gen ghost-kitchen --orders 1500 --files 6 --seed 3 --format ndjson --no-null-keys --out "$work/gk" > /dev/null
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
if scenario suite "$work" "configs and server logs kept" "$py" integration/suite.py "$bin" "$work" "$work/gk" "${combos[@]}"; then
  rm -rf "$work"
else
  exit 1
fi
