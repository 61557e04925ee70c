#!/usr/bin/env bash
# A short soak of `autocdc serve` (the test command runs it for 2 minutes):
# a steady NDJSON load into one flow with a 1 s commit_interval, sampled
# every 20 s, a verdict per figure printed, and the table checked against
# the client's oracle. It fails only if the server dies, answers an error
# other than 429, or the table differs; the figures are for reading.
# Longer runs: `autocdc soak --duration 60m` (see docs/dev/benchmarks.md, "Soak").
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo's own default (./target, shared with `cargo run -- demo`) unless the caller sets one.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR
cargo build --quiet --bin autocdc
"$CARGO_TARGET_DIR/debug/autocdc" soak --duration "${AUTOCDC_SOAK_DURATION:-2m}" \
  --rate 10000 --keys 100000 --batch-rows 500 --commit-interval 1s --sample-every 20s
