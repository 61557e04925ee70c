#!/usr/bin/env bash
# docker-compose.yml as a user runs it: the `autocdc` service up and healthy,
# a batch pushed with ?wait=commit and read back with `exec ... autocdc show`,
# a flow PUT over HTTP and pushed to, the service stopped (it must exit 0) and
# started again, then both tables' rows, the PUT flow and pushes to it must all
# still be there; `down -v` at the end, and on any failure.
#
#   bash integration/compose.sh [AUTOCDC_BIN]
#
# The image is the Dockerfile's runtime-prebuilt target around the binary
# given (default $CARGO_TARGET_DIR/debug/autocdc, which the tests built), so
# nothing is compiled here. Installs docker.io, docker-compose and debootstrap
# when missing (as root), starts dockerd if none answers (skips, exit 0, only
# if it cannot start), and makes debian:bookworm-slim with debootstrap when the
# image is missing (no image registry is needed). Traffic goes to 127.0.0.1 only.
set -eEuo pipefail
cd "$(dirname "$0")/.."
: "${CARGO_TARGET_DIR:=$PWD/target}"
bin=${1:-$CARGO_TARGET_DIR/debug/autocdc}
project=autocdc-compose-$$
image=autocdc:compose-test-$$
cfg=/etc/autocdc/autocdc.toml

why=""
err=0
work=""
dockerd_pid=""
compose=()
up=""
fail() { why=$*; exit 1; }
# fail_log FILE WHY: the end of FILE, then fail.
fail_log() { tail -n 25 "$1" >&2 || true; fail "$2"; }
trap 'err=$?; [ -n "$why" ] || why="line $LINENO: \`$BASH_COMMAND\` exited $err"' ERR
trap 'why=${why:-interrupted}; exit 130' INT TERM
cleanup() {
  local rc=$?
  trap - ERR
  set +e
  if [ -n "$up" ]; then
    if [ "$rc" -ne 0 ]; then
      echo "--- the autocdc service's log:" >&2
      timeout 60 "${compose[@]}" -p "$project" logs --no-color --tail 40 autocdc >&2 2>&1
    fi
    timeout 120 "${compose[@]}" -p "$project" down -v --timeout 30 >/dev/null 2>&1
  fi
  docker image rm --no-prune "$image" >/dev/null 2>&1
  if [ -n "$dockerd_pid" ]; then
    kill "$dockerd_pid" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 1; done
  fi
  if [ -n "$work" ]; then
    umount "$work/rootfs/proc" "$work/rootfs/sys" 2>/dev/null
    rm -rf --one-file-system "$work"
  fi
  [ "$rc" -eq 0 ] || echo "compose: FAIL: ${why:-exit $rc}" >&2
  exit "$rc"
}
trap cleanup EXIT
work=$(mktemp -d)

# --- what it needs ------------------------------------------------------------
pick_compose() {
  if command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
  elif docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
  fi
}
pick_compose
need=()
command -v docker >/dev/null 2>&1 || need+=(docker.io)
[ ${#compose[@]} -gt 0 ] || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "missing packages; as root: apt-get install -y ${need[*]}"
  echo "compose: installing ${need[*]}"
  timeout 900 apt-get update -qq >"$work/apt.log" 2>&1 || fail_log "$work/apt.log" "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >>"$work/apt.log" 2>&1 || fail_log "$work/apt.log" "apt-get install ${need[*]} failed"
  pick_compose
fi
[ -x "$bin" ] || fail "no autocdc binary at $bin (give one as the first argument)"

# --- a Docker engine ----------------------------------------------------------
if ! timeout 20 docker info >/dev/null 2>&1; then
  echo "compose: no Docker engine answers; starting dockerd (log in $work/dockerd.log)"
  dockerd >"$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 1 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    kill -0 "$dockerd_pid" 2>/dev/null || break
    sleep 1
  done
  if ! timeout 5 docker info >/dev/null 2>&1; then
    tail -n 5 "$work/dockerd.log" 2>/dev/null
    echo "compose: SKIP: dockerd cannot start on this machine (its log's end above)"
    exit 0
  fi
fi

# --- the image ------------------------------------------------------------------
t0=$SECONDS
if ! docker image inspect debian:bookworm-slim >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "debian:bookworm-slim is missing and debootstrap needs root"
  echo "compose: making debian:bookworm-slim with debootstrap (no registry needed)"
  timeout 900 debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian \
    >"$work/debootstrap.log" 2>&1 || fail_log "$work/debootstrap.log" "debootstrap bookworm failed"
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* \
    "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/*
  # As in the published image: apt keeps no package caches in a layer.
  cat >"$work/rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  tar -C "$work/rootfs" -c . | timeout 300 docker import --change 'CMD ["bash"]' - debian:bookworm-slim \
    >/dev/null || fail "docker import of the debootstrap tree failed"
  rm -rf --one-file-system "$work/rootfs"
fi
mkdir "$work/context"
cp "$bin" "$work/context/autocdc"
# Symbols only make the context and the image bigger.
strip "$work/context/autocdc" 2>/dev/null || true
timeout 900 docker build --target runtime-prebuilt -f Dockerfile -t "$image" "$work/context" \
  >"$work/build.log" 2>&1 || fail_log "$work/build.log" "docker build --target runtime-prebuilt failed"
echo "compose: image $image ready in $((SECONDS - t0)) s"

# --- the scenario ---------------------------------------------------------------
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
export AUTOCDC_IMAGE=$image AUTOCDC_PORT=127.0.0.1:$port
dc() { timeout "$1" "${compose[@]}" -p "$project" "${@:2}"; }

# healthy WHAT: waits (2 minutes at most) for the service's healthcheck to pass.
healthy() {
  local id status=""
  id=$(dc 30 ps -q autocdc)
  [ -n "$id" ] || fail "$1: the autocdc service has no container"
  for _ in $(seq 1 120); do
    status=$(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$id")
    case $status in
      "running healthy") return 0 ;;
      exited*|dead*) fail "$1: the container stopped ($status)" ;;
    esac
    sleep 1
  done
  fail "$1: not healthy after 120 s ($status)"
}

# request WHAT EXPECTED_STATUS curl-args...: the body in $work/body.
request() {
  local what=$1 want=$2 code
  shift 2
  code=$(curl -sS --max-time 90 -o "$work/body" -w '%{http_code}' "$@") ||
    fail "$what: curl failed"
  [ "$code" = "$want" ] || fail "$what: HTTP $code, not $want: $(head -c 300 "$work/body")"
}

push() { # push WHAT FLOW QUERY STATUS NDJSON
  printf '%s\n' "$5" >"$work/batch.ndjson"
  request "$1" "$4" -H 'content-type: application/x-ndjson' \
    --data-binary @"$work/batch.ndjson" "$base/v1/flows/$2/changes$3"
}

# rows WHAT TABLE EXPECTED: the table's rows by `autocdc show` in the
# container, sorted, tab-separated, against EXPECTED (one row a line).
rows() {
  local got want
  dc 120 exec -T autocdc autocdc show --config "$cfg" "$2" >"$work/show" 2>&1 ||
    fail_log "$work/show" "$1: autocdc show $2 failed"
  got=$(sed '1d;$d' "$work/show" | sort)
  want=$(printf '%s\n' "$3" | sort)
  [ "$got" = "$want" ] ||
    fail "$1: $2 holds [$(echo "$got" | paste -sd'|')], not [$(echo "$want" | paste -sd'|')]"
}

up=1
dc 300 up -d --no-build autocdc >"$work/up.log" 2>&1 || fail_log "$work/up.log" "docker-compose up -d autocdc failed"
healthy "up"
echo "compose: autocdc healthy on $base ($project, ${compose[*]})"

push "customers: push with ?wait=commit" customers '?wait=commit' 200 "$(cat examples/customers.ndjson)"
grep -q '"snapshot_id":[0-9]' "$work/body" || fail "customers: no snapshot_id in $(cat "$work/body")"
# examples/customers.ndjson: id 1's latest is Bath (seq 5); id 2's is a delete.
customers=$'1\tAda\tBath\t5'
rows "customers: read back" crm.customers "$customers"

request "PUT /v1/flows/contacts" 201 -X PUT -H 'content-type: application/json' \
  --data '{"target": "crm.contacts", "keys": ["id"], "sequence_by": "seq",
           "columns": [{"name": "id", "type": "long", "required": true},
                       {"name": "email", "type": "string"},
                       {"name": "seq", "type": "long", "required": true}]}' \
  "$base/v1/flows/contacts"
push "contacts: push with ?wait=commit" contacts '?wait=commit' 200 \
  '{"id": 1, "email": "ada@example.org", "seq": 1}
{"id": 2, "email": "bob@example.org", "seq": 1}
{"id": 1, "email": "ada@example.com", "seq": 2}'
contacts=$'1\tada@example.com\t2\n2\tbob@example.org\t1'
rows "contacts: read back" crm.contacts "$contacts"

# Acknowledged (in the flow's log), not yet committed when the stop comes.
push "customers: push without waiting" customers '' 202 \
  '{"id": 3, "name": "Cy", "city": "Ely", "op": "UPSERT", "seq": 7}'
customers+=$'\n3\tCy\tEly\t7'
id=$(dc 30 ps -q autocdc)
dc 120 stop autocdc >"$work/stop.log" 2>&1 || fail_log "$work/stop.log" "docker-compose stop failed"
code=$(docker inspect -f '{{.State.ExitCode}}' "$id")
[ "$code" = 0 ] || fail "stop: autocdc exited $code on SIGTERM, not 0"
dc 120 start autocdc >"$work/start.log" 2>&1 || fail_log "$work/start.log" "docker-compose start failed"
healthy "start"
echo "compose: stopped (exit 0) and started again"

request "customers: commit after the restart" 200 -X POST "$base/v1/flows/customers/commit"
rows "customers: after the restart" crm.customers "$customers"
rows "contacts: after the restart" crm.contacts "$contacts"
request "GET /v1/flows/contacts after the restart" 200 "$base/v1/flows/contacts"
push "contacts: push after the restart" contacts '?wait=commit' 200 \
  '{"id": 3, "email": "cy@example.org", "seq": 1}'
rows "contacts: after the restart's push" crm.contacts "$contacts"$'\n3\tcy@example.org\t1'

dc 120 down -v --timeout 30 >"$work/down.log" 2>&1 || fail_log "$work/down.log" "docker-compose down -v failed"
up=""
echo "compose: ok (${compose[*]}: up, push, show, PUT flow, stop/start, nothing lost, down -v)"
