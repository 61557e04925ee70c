#!/usr/bin/env bash
# Writes the SCD Type 1 battery (through the end-to-end test) and a
# ~100k-event ghost-kitchen feed (through `autocdc apply`) into Hadoop-catalog
# warehouses, then reads every table with DuckDB's iceberg extension and with
# PyIceberg and compares with the expected rows / an SQL oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=$HOME/.cache/autocdc-target}"
export CARGO_TARGET_DIR
py=${AUTOCDC_PY:-$HOME/.cache/autocdc-venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

AUTOCDC_E2E_OUT="$out" cargo nextest run --no-fail-fast --test e2e -E 'test(battery_through_the_hadoop_catalog)'

cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
"$bin" gen ghost-kitchen --orders 4000 --files 10 --seed 11 --no-null-keys --out "$out/gk"
{
  printf '[catalog]\ntype = "hadoop"\nwarehouse = "%s"\n\n' "$out/gkwh"
  cat "$out/gk/flow.toml"
} > "$out/autocdc.toml"
"$bin" apply --config "$out/autocdc.toml" --flow ghost_kitchen "$out"/gk/*.parquet
"$bin" state --config "$out/autocdc.toml" kitchen.orders
meta="$out/gkwh/kitchen/orders/metadata/v$(cat "$out/gkwh/kitchen/orders/metadata/version-hint.text").metadata.json"
"$py" integration/readers.py "$out" "$out/gk" "$meta"
