#!/usr/bin/env bash
# Scale-out chaos (docs/scale-out.md): a 3-node NATS JetStream cluster on
# localhost, 3 `autocdc serve` instances, 3 flows; pushes to random
# instances while instances are SIGKILLed (and restarted with an empty
# data_dir) and, three times, a NATS node is SIGKILLed and restarted while
# an instance opens its flows. Every table must
# equal the oracle, every acknowledged batch be in once, and the tables'
# history show one lease holder at a time. See integration/cluster.py.
#
#   bash integration/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
py="${AUTOCDC_VENV:-$HOME/.cache/autocdc-venv}/bin/python"
if [ -z "${AUTOCDC_TEST_NATS_SERVER:-}" ]; then
  eval "$(bash integration/backends.sh up)"
fi
cargo build --quiet --bin autocdc
bin="$CARGO_TARGET_DIR/debug/autocdc"
work=$(mktemp -d)
trap 'pkill -KILL -f -- "$work/" 2>/dev/null || true' EXIT
"$bin" gen ghost-kitchen --orders 800 --files 4 --seed 7 --format ndjson --no-null-keys --out "$work/gk" > /dev/null
# shellcheck source=integration/verdict.sh
. integration/verdict.sh
if scenario cluster "$work" "configs and logs kept" \
    "$py" integration/cluster.py "$bin" "$AUTOCDC_TEST_NATS_SERVER" "$work" "$work/gk" "${AUTOCDC_CLUSTER_KILLS:-8}"; then
  rm -rf "$work"
else
  exit 1
fi
