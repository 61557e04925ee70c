#!/usr/bin/env bash
# Writes the SCD Type 1 battery and two history tables (SCD Type 2 with
# __START_AT/__END_AT, and SCD Type 1 with ignore_null_updates) through the
# end-to-end tests, the tables of 16 fixed cases of the random schema and
# partition evolution property test after each of their steps, two tables of nested
# (struct, list, map) columns, and a ~100k-event ghost-kitchen feed (through `autocdc
# apply`), and the schema-change example of docs/schema-changes.md (a table evolved by its
# definition), into Hadoop-catalog warehouses, then reads every table with
# DuckDB's iceberg extension and with PyIceberg and compares with the
# expected rows / an SQL oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
py=${AUTOCDC_PY:-$HOME/.cache/autocdc-venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# On failure the last line says which test (nextest ends with "error: test run failed").
if ! AUTOCDC_E2E_OUT="$out" cargo nextest run --no-fail-fast --test it \
  -E 'test(battery_through_the_hadoop_catalog) | test(people_through_the_hadoop_catalog) | test(nested_columns_through_the_hadoop_catalog) | test(fixed_cases_for_the_readers)' \
  2>&1 | tee "$out/nextest.out"; then
  echo "readers: FAIL: writing the tables: $(grep -a -E '^ *(FAIL|SIGSEGV|SIGABRT|TIMEOUT) ' "$out/nextest.out" | tail -n 1 | sed -E 's/^ +//')" >&2
  exit 1
fi

cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
"$bin" gen ghost-kitchen --orders 4000 --files 10 --seed 11 --no-null-keys --out "$out/gk"
{
  printf '[catalog]\ntype = "hadoop"\nwarehouse = "%s"\n\n' "$out/gkwh"
  # Manifests merged from 3 on, and `autocdc maintain` below expires all
  # but 2 snapshots: the readers read merged manifests of expired tables.
  sed -e 's/^keys = .*/&\nsnapshot_max_age = "1ms"\nmin_snapshots_to_keep = 2\ntable_properties = { "commit.manifest.min-count-to-merge" = "3" }/' "$out/gk/flow.toml"
  # The same feed into a partitioned table: every status change moves the
  # row to another partition, so position deletes land in many partitions.
  sed -e 's/^name = .*/name = "ghost_kitchen_partitioned"/' \
      -e 's/^target = .*/target = "kitchen.orders_partitioned"/' \
      -e 's/^keys = .*/&\npartition_by = ["status", "bucket[4](order_id)"]\nsnapshot_max_age = "1ms"\nmin_snapshots_to_keep = 2\ntable_properties = { "commit.manifest.min-count-to-merge" = "3" }/' "$out/gk/flow.toml"
} > "$out/autocdc.toml"
"$bin" apply --config "$out/autocdc.toml" --flow ghost_kitchen "$out"/gk/*.parquet
"$bin" apply --config "$out/autocdc.toml" --flow ghost_kitchen_partitioned "$out"/gk/*.parquet
# The same feed into a table repartitioned halfway (by status, then by a
# bucket of the key): rows of the first half are deleted in the older spec.
gk_files=("$out"/gk/*.parquet)
half=$(( ${#gk_files[@]} / 2 ))
for by in '["status"]' '["bucket[4](order_id)"]'; do
  sed -e 's/^name = .*/name = "ghost_kitchen_repartitioned"/' \
      -e 's/^target = .*/target = "kitchen.orders_repartitioned"/' \
      -e "s/^keys = .*/&\npartition_by = $by/" "$out/gk/flow.toml" \
    | cat <(printf '[catalog]\ntype = "hadoop"\nwarehouse = "%s"\n\n' "$out/gkwh") - > "$out/repartitioned.toml"
  if [ "$by" = '["status"]' ]; then
    "$bin" apply --config "$out/repartitioned.toml" --flow ghost_kitchen_repartitioned "${gk_files[@]:0:$half}"
  else
    "$bin" apply --config "$out/repartitioned.toml" --flow ghost_kitchen_repartitioned "${gk_files[@]:$half}"
  fi
done
"$bin" maintain --config "$out/autocdc.toml" --orphans-older-than off
"$bin" state --config "$out/autocdc.toml" kitchen.orders
# docs/schema-changes.md: a table whose definition evolved (widened,
# renamed and added columns), read through its older files.
mkdir -p "$out/expected"
for v in 1 2; do
  sed -e "s#^warehouse = .*#warehouse = \"$out/evowh\"#" "examples/orders-v$v.toml" > "$out/orders-v$v.toml"
  "$bin" apply --config "$out/orders-v$v.toml" --flow orders "examples/orders-$v.ndjson"
done
d="$out/evowh/shop/orders/metadata"
cat > "$out/expected/schema_change.json" <<EOF
{"name": "schema_change", "metadata": "$d/v$(cat "$d/version-hint.text").metadata.json",
 "columns": ["id", "qty", "product", "note", "seq"], "keys": ["id"],
 "rows": [["1", "2", "pen", "NULL", "1"], ["2", "3", "ink", "gift", "3"],
          ["3000000000", "5000000000", "box", "NULL", "4"]]}
EOF
metas=()
for t in orders orders_partitioned orders_repartitioned; do
  d="$out/gkwh/kitchen/$t/metadata"
  metas+=("$d/v$(cat "$d/version-hint.text").metadata.json")
done
"$py" integration/readers.py "$out" "$out/gk" "${metas[@]}"
