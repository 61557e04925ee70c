#!/usr/bin/env bash
# Two `autocdc serve` instances on one flow (own data_dir and log each, one
# table), pushes with Idempotency-Keys to a random instance while random
# instances are SIGKILLed and restarted; the table must equal the oracle.
# Runs on hadoop-local and sql-s3 (PostgreSQL + S3 from integration/backends.sh).
#
#   bash integration/two_instances.sh [hadoop-local|sql-s3]...
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
combos=("$@")
[ ${#combos[@]} -eq 0 ] && combos=(hadoop-local sql-s3)
py="${AUTOCDC_VENV:-$HOME/.cache/autocdc-venv}/bin/python"
for c in "${combos[@]}"; do
  if [ "$c" = sql-s3 ] && [ -z "${AUTOCDC_TEST_POSTGRES_URL:-}" ]; then
    eval "$(bash integration/backends.sh up)"
  fi
done
cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
work=$(mktemp -d)
trap 'pkill -KILL -f -- "$work/" 2>/dev/null || true' EXIT
"$bin" gen ghost-kitchen --orders 800 --files 4 --seed 5 --format ndjson --no-null-keys --out "$work/gk" > /dev/null
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
if scenario two-instances "$work" "configs and server logs kept" \
    "$py" integration/two_instances.py "$bin" "$work" "$work/gk" "${AUTOCDC_TWO_KILLS:-12}" "${combos[@]}"; then
  rm -rf "$work"
else
  exit 1
fi
