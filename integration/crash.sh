#!/usr/bin/env bash
# SIGKILLs `autocdc serve` 20 times while a generated feed is pushed with
# idempotency keys and retries; then the table must equal the SQL oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
py=${AUTOCDC_PY:-$HOME/.cache/autocdc-venv/bin/python}
work=$(mktemp -d)
trap 'pkill -KILL -f "$work/serve.toml" 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
"$bin" gen ghost-kitchen --orders 1500 --files 6 --seed 3 --format ndjson --no-null-keys --out "$work/gk" > /dev/null
"$py" integration/crash.py "$bin" "$work" "$work/gk" "${AUTOCDC_CRASH_KILLS:-20}"
