"""Integration suite: `autocdc serve` over HTTP against each catalog/storage
combination, restarted between batches, the tables checked with independent
readers (DuckDB's iceberg extension and PyIceberg) and with the catalog's own
view of the table.

For each combination, in a fresh data_dir and a unique table location:
- the ghost-kitchen feed, shuffled, pushed in several requests with
  Idempotency-Key headers over 4 server sessions (3 restarts: SIGTERM, exit 0,
  start again); the table must equal the SQL oracle of the feed (latest change
  per key by sequence, deletes removed);
- an SCD type 1 battery, one `?wait=commit` request per session to each of
  two flows writing one table (the changes split between them): an update, a
  delete, a late older upsert after a delete (stays deleted), a newer upsert
  after a delete (comes back), exact duplicates; the table must hold exactly
  the expected rows.

Combinations: hadoop-local, hadoop-s3, sql-s3, rest, and hadoop-local-nats:
hadoop-local with the ingest log on NATS JetStream (`[ingest] type = "nats"`),
each session started on an empty data_dir (a fresh machine), so everything it
replays and every retried key it recognises comes from JetStream. Endpoints
come only from the AUTOCDC_TEST_* variables (integration/backends.sh up, or
docker compose).

usage: suite.py AUTOCDC_BIN WORK_DIR GHOST_KITCHEN_DIR [COMBINATION...]
"""

import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid

import duckdb
from pyarrow import fs
from pyiceberg.table import StaticTable

COMBINATIONS = ["hadoop-local", "hadoop-s3", "sql-s3", "rest", "hadoop-local-nats"]
GK_COLUMNS = ["order_id", "event_type", "location_id", "ts_seconds", "sequence", "status", "seq"]
BATTERY_COLUMNS = ["id", "name", "city", "seq"]
SESSIONS = 4  # so 3 restarts between batches
EVOLVE_AT = 2  # the session that starts with the evolved ghost-kitchen definition


def evolve_gk(flow):
    """The ghost-kitchen flow widened (location_id int -> long), with a new
    column (note) and partitioned by a bucket of the key."""
    out = flow.replace('{ name = "location_id", type = "int"', '{ name = "location_id", type = "long"')
    out = out.replace('  { name = "status",', '  { name = "note", type = "string" },\n  { name = "status",')
    out = out.replace('keys = ["order_id"]\n', 'keys = ["order_id"]\npartition_by = ["bucket[4](order_id)"]\n')
    if out.count("note") != 1 or "partition_by" not in out or '"location_id", type = "long"' not in out:
        raise Fail("the ghost-kitchen flow.toml changed shape; update evolve_gk")
    return out
GK_REQUESTS = 12

# Two flows into the battery's table (one per source shard): each change
# goes to one of them; they share the table's state, so the table is the
# same as one flow would make.
BATTERY_FLOWS = ("scd1", "scd1_b")
BATTERY_FLOW = """[[flow]]
name = "{name}"
target = "{target}"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
commit_interval = "500ms"
snapshot_max_age = "1ms"
min_snapshots_to_keep = 2
table_properties = {{ "commit.manifest.min-count-to-merge" = "3" }}
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "name", type = "string" }},
  {{ name = "city", type = "string" }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"""


def change(id, name, city, op, seq):
    return {"id": id, "name": name, "city": city, "op": op, "seq": seq}


# One request per server session, each committed before the next.
BATTERY_STEPS = [
    [
        change(1, "ann", "paris", "UPSERT", 1),
        change(2, "bob", "rome", "UPSERT", 1),
        change(3, "cy", "oslo", "UPSERT", 1),
        change(4, "dan", "lima", "UPSERT", 1),
        change(5, "eve", "kyiv", "UPSERT", 1),
    ],
    [
        change(1, "ann", "berlin", "UPSERT", 2),  # update
        change(2, None, None, "DELETE", 3),  # delete
        change(4, None, None, "DELETE", 2),  # delete
        change(5, "eve", "minsk", "UPSERT", 3),  # update
        change(6, None, None, "DELETE", 5),  # delete of a key never seen
    ],
    [
        change(2, "bob", "madrid", "UPSERT", 2),  # late, older than its delete: stays deleted
        change(4, "dan", "quito", "UPSERT", 5),  # newer than its delete: comes back
        change(3, "cy", "oslo", "UPSERT", 1),  # exact duplicate of a committed change
        change(5, "eve", "kyiv", "UPSERT", 2),  # late, older update: ignored
        change(6, "fay", "bern", "UPSERT", 4),  # older than the tombstone: stays out
    ],
    [
        # The whole second request again, no idempotency key: exact duplicates.
        change(1, "ann", "berlin", "UPSERT", 2),
        change(2, None, None, "DELETE", 3),
        change(4, None, None, "DELETE", 2),
        change(5, "eve", "minsk", "UPSERT", 3),
        change(6, None, None, "DELETE", 5),
    ],
]
BATTERY_EXPECTED = sorted(
    [
        ("1", "ann", "berlin", "2"),
        ("3", "cy", "oslo", "1"),
        ("4", "dan", "quito", "5"),
        ("5", "eve", "minsk", "3"),
    ]
)


class Fail(Exception):
    pass


def fmt(v):
    return "NULL" if v is None else str(v)


def env(name):
    value = os.environ.get(name)
    if not value:
        raise Fail(f"{name} is not set (eval \"$(bash integration/backends.sh up)\")")
    return value


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_str(s):
    return json.dumps(s)


# ---------------------------------------------------------------- storage


class S3:
    """The AUTOCDC_TEST_S3_* settings, for autocdc's config and the readers."""

    def __init__(self):
        self.endpoint = env("AUTOCDC_TEST_S3_ENDPOINT")
        self.region = env("AUTOCDC_TEST_S3_REGION")
        self.key = env("AUTOCDC_TEST_S3_ACCESS_KEY_ID")
        self.secret = env("AUTOCDC_TEST_S3_SECRET_ACCESS_KEY")
        url = urllib.parse.urlparse(self.endpoint)
        self.hostport = url.netloc
        self.ssl = url.scheme == "https"

    def config_toml(self):
        return (
            "[catalog.s3]\n"
            f"endpoint = {toml_str(self.endpoint)}\n"
            f"region = {toml_str(self.region)}\n"
            f"access_key_id = {toml_str(self.key)}\n"
            f"secret_access_key = {toml_str(self.secret)}\n"
        )

    def filesystem(self):
        return fs.S3FileSystem(
            access_key=self.key,
            secret_key=self.secret,
            region=self.region,
            endpoint_override=self.hostport,
            scheme="https" if self.ssl else "http",
        )

    def pyiceberg_properties(self):
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.key,
            "s3.secret-access-key": self.secret,
            "s3.region": self.region,
            "s3.path-style-access": "true",
        }


class Files:
    """Read and list table files by location: a local path or s3://bucket/key."""

    def __init__(self, s3=None):
        self.local = fs.LocalFileSystem()
        self.s3 = s3.filesystem() if s3 else None

    def _split(self, location):
        if location.startswith("s3://"):
            return self.s3, location[len("s3://"):]
        if location.startswith("file://"):
            return self.local, location[len("file://"):]
        return self.local, location

    def read(self, location):
        filesystem, path = self._split(location)
        with filesystem.open_input_stream(path) as f:
            return f.read()

    def exists(self, location):
        filesystem, path = self._split(location)
        return filesystem.get_file_info(path).type == fs.FileType.File

    def names(self, folder):
        """The file names directly in `folder`."""
        filesystem, path = self._split(folder)
        infos = filesystem.get_file_info(fs.FileSelector(path.rstrip("/"), allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs.FileType.File)


# ---------------------------------------------------------------- catalogs
#
# Each combination writes autocdc's [catalog] section and answers "which
# metadata file is current" the way its catalog does, with a description of
# what it checked.


class HadoopCatalog:
    def __init__(self, warehouse, s3=None):
        self.warehouse = warehouse.rstrip("/")
        self.s3 = s3
        self.files = Files(s3)

    def config_toml(self):
        text = f'[catalog]\ntype = "hadoop"\nwarehouse = {toml_str(self.warehouse)}\n'
        return text + ("\n" + self.s3.config_toml() if self.s3 else "")

    def current_metadata(self, namespace, table):
        """version-hint.text names vN.metadata.json, and no later version exists."""
        folder = f"{self.warehouse}/{namespace}/{table}/metadata"
        hint = int(self.files.read(f"{folder}/version-hint.text").decode().strip())
        versions = sorted(
            int(m.group(1)) for m in map(re.compile(r"v(\d+)\.metadata\.json$").match, self.files.names(folder)) if m
        )
        if not versions or versions[-1] != hint:
            raise Fail(f"version-hint.text says v{hint}, metadata files are {versions}")
        return f"{folder}/v{hint}.metadata.json", f"version-hint.text -> v{hint}.metadata.json, the newest of {len(versions)}"


class SqlCatalog:
    def __init__(self, uri, name, warehouse, s3):
        self.uri, self.name, self.warehouse, self.s3 = uri, name, warehouse.rstrip("/"), s3
        self.files = Files(s3)

    def config_toml(self):
        return (
            f'[catalog]\ntype = "sql"\nuri = {toml_str(self.uri)}\nname = {toml_str(self.name)}\n'
            f"warehouse = {toml_str(self.warehouse)}\n\n{self.s3.config_toml()}"
        )

    def query(self, sql):
        psql = os.environ.get("PSQL") or "/usr/lib/postgresql/15/bin/psql"
        if not os.path.exists(psql):
            psql = shutil.which("psql") or psql
        out = subprocess.run(
            [psql, self.uri, "-X", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", sql],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise Fail(f"psql: {out.stderr.strip()}")
        return [line.split("\t") for line in out.stdout.splitlines() if line]

    def current_metadata(self, namespace, table):
        """The iceberg_tables row names the newest metadata file, and its
        previous_metadata_location is the last entry of that file's metadata-log."""
        esc = lambda s: s.replace("'", "''")  # noqa: E731
        rows = self.query(
            "SELECT metadata_location, coalesce(previous_metadata_location, '') FROM iceberg_tables "
            f"WHERE catalog_name = '{esc(self.name)}' AND table_namespace = '{esc(namespace)}' "
            f"AND table_name = '{esc(table)}'"
        )
        if len(rows) != 1:
            raise Fail(f"iceberg_tables has {len(rows)} rows for {self.name}/{namespace}.{table}")
        current, previous = rows[0]
        folder = current.rsplit("/", 1)[0]
        numbered = sorted(
            (int(m.group(1)), n) for n in self.files.names(folder) for m in [re.match(r"(\d+)-.*\.metadata\.json$", n)] if m
        )
        if not numbered or f"{folder}/{numbered[-1][1]}" != current:
            raise Fail(f"iceberg_tables names {current}, the newest metadata file is {numbered[-1:]}")
        log = json.loads(self.files.read(current)).get("metadata-log", [])
        if previous != (log[-1]["metadata-file"] if log else ""):
            raise Fail(f"previous_metadata_location {previous!r}, metadata-log ends with {log[-1:]}")
        return current, f"iceberg_tables.metadata_location = {current.rsplit('/', 1)[1]}, the newest of {len(numbered)}"


class RestCatalog:
    def __init__(self, uri, warehouse, s3):
        self.uri, self.warehouse, self.s3 = uri.rstrip("/"), warehouse, s3
        self.files = Files(s3)

    def config_toml(self):
        return (
            f'[catalog]\ntype = "rest"\nuri = {toml_str(self.uri)}\nwarehouse = {toml_str(self.warehouse)}\n'
            f"credential = {toml_str(self.s3.key + ':' + self.s3.secret)}\n\n{self.s3.config_toml()}"
        )

    def call(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.uri + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise Fail(f"REST {method} {path}: {e.code} {e.read()[:300]!r}")

    def current_metadata(self, namespace, table):
        """LoadTable's metadata-location, its current snapshot the one in that file."""
        form = urllib.parse.urlencode(
            {"grant_type": "client_credentials", "client_id": self.s3.key, "client_secret": self.s3.secret}
        ).encode()
        token = self.call("POST", "/v1/oauth/tokens", form, {"content-type": "application/x-www-form-urlencoded"})
        auth = {"authorization": f"Bearer {token['access_token']}"}
        config = self.call("GET", f"/v1/config?warehouse={urllib.parse.quote(self.warehouse)}", headers=auth)
        prefix = config.get("overrides", {}).get("prefix") or config.get("defaults", {}).get("prefix")
        base = f"/v1/{prefix}" if prefix else "/v1"
        loaded = self.call("GET", f"{base}/namespaces/{namespace}/tables/{table}", headers=auth)
        location = loaded["metadata-location"]
        in_file = json.loads(self.files.read(location)).get("current-snapshot-id")
        if in_file != loaded["metadata"].get("current-snapshot-id"):
            raise Fail(f"LoadTable's current snapshot differs from {location}'s")
        return location, f"LoadTable metadata-location = {location.rsplit('/', 1)[1]}"


# ---------------------------------------------------------------- readers


def duck(s3):
    """DuckDB with the iceberg, avro and httpfs extensions from their PyPI packages."""
    con = duckdb.connect()
    for ext in ("avro", "iceberg", "httpfs"):
        mod = __import__(f"duckdb_extension_{ext}")
        base = os.path.dirname(mod.__file__)
        paths = glob.glob(os.path.join(base, "extensions", "*", f"{ext}.duckdb_extension"))
        if not paths:
            sys.exit(f"no {ext}.duckdb_extension under {base}")
        con.execute(f"INSTALL '{paths[0]}'")
        con.execute(f"LOAD {ext}")
    if s3:
        con.execute(
            f"""CREATE SECRET (TYPE s3, KEY_ID '{s3.key}', SECRET '{s3.secret}', ENDPOINT '{s3.hostport}',
                URL_STYLE 'path', USE_SSL {str(s3.ssl).lower()}, REGION '{s3.region}')"""
        )
    return con


def rows_duckdb(con, metadata, columns):
    cols = ", ".join(f'"{c}"' for c in columns)
    return sorted(tuple(fmt(v) for v in r) for r in con.execute(f"SELECT {cols} FROM iceberg_scan('{metadata}')").fetchall())


def rows_pyiceberg(metadata, columns, s3):
    properties = s3.pyiceberg_properties() if s3 else {}
    t = StaticTable.from_metadata(metadata, properties=properties).scan(selected_fields=tuple(columns)).to_arrow()
    cols = [t.column(c).to_pylist() for c in columns]
    return sorted(tuple(fmt(v) for v in r) for r in zip(*cols))


def gk_oracle(gk):
    """The latest change per order by seq, deletes removed, computed in SQL."""
    con = duckdb.connect()
    rows = con.execute(
        f"""SELECT {", ".join(GK_COLUMNS)} FROM (
              SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY seq DESC) AS rn
              FROM read_json('{gk}/*.ndjson', format='newline_delimited') WHERE order_id IS NOT NULL)
            WHERE rn = 1 AND op <> 'DELETE'"""
    ).fetchall()
    return sorted(tuple(fmt(v) for v in r) for r in rows)


# ---------------------------------------------------------------- the service


class Server:
    def __init__(self, binary, config, log_path, base):
        self.binary, self.config, self.log_path, self.base = binary, config, log_path, base
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config], stdout=log, stderr=log)
        log.close()
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if self.proc.poll() is not None:
                lines = open(self.log_path, errors="replace").read().strip().splitlines()
                message = " | ".join(lines[-5:])
                raise Fail(f"autocdc serve exited with {self.proc.returncode} before ready: {message}")
            time.sleep(0.1)

    def stop(self):
        """SIGTERM: commits what is pending and must exit 0."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=300)
        if rc != 0:
            raise Fail(f"autocdc serve exited with {rc} on SIGTERM; see {self.log_path}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def request(self, method, path, body=None, headers=None):
        """The JSON answer; retries 429 and 503 (backpressure, degraded) a bounded number of times."""
        for _ in range(600):
            req = urllib.request.Request(f"{self.base}{path}", data=body, method=method, headers=headers or {})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                if e.code in (429, 503):
                    time.sleep(0.1)
                    continue
                raise Fail(f"{method} {path}: {e.code} {e.read()[:300]!r}")
        raise Fail(f"{method} {path}: still 429/503 after 600 tries")


def push_ndjson(server, flow, lines, key=None, wait=False):
    headers = {"content-type": "application/x-ndjson"}
    if key:
        headers["idempotency-key"] = key
    path = f"/v1/flows/{flow}/changes" + ("?wait=commit" if wait else "")
    return server.request("POST", path, "\n".join(lines).encode(), headers)


# ---------------------------------------------------------------- one combination


def make_catalog(combo, run_id, work):
    if combo in ("hadoop-local", "hadoop-local-nats"):
        return HadoopCatalog(os.path.join(work, "warehouse")), None
    s3 = S3()
    bucket = env("AUTOCDC_TEST_S3_BUCKET")
    if combo == "hadoop-s3":
        return HadoopCatalog(f"s3://{bucket}/suite-{run_id}-hadoop", s3), s3
    if combo == "sql-s3":
        return SqlCatalog(env("AUTOCDC_TEST_POSTGRES_URL"), f"suite_{run_id}", f"s3://{bucket}/suite-{run_id}-sql", s3), s3
    if combo == "rest":
        return RestCatalog(env("AUTOCDC_TEST_REST_URI"), env("AUTOCDC_TEST_REST_WAREHOUSE"), s3), s3
    raise Fail(f"unknown combination {combo} (one of {', '.join(COMBINATIONS)})")


def run_combination(combo, binary, root, gk, gk_lines, oracle, report):
    run_id = uuid.uuid4().hex[:10]
    work = os.path.join(root, combo)
    os.makedirs(work)
    catalog, s3 = make_catalog(combo, run_id, work)
    namespace = f"suite_{run_id}"
    port = free_port()
    gk_flow = open(os.path.join(gk, "flow.toml")).read()
    gk_flow = re.sub(r'^target = .*$', f'target = "{namespace}.orders"', gk_flow, flags=re.M)
    gk_flow = gk_flow.replace(
        'keys = ["order_id"]\n',
        'keys = ["order_id"]\ncommit_interval = "1s"\nsnapshot_max_age = "1ms"\nmin_snapshots_to_keep = 2\n'
        'table_properties = { "commit.manifest.min-count-to-merge" = "3" }\n',
    )
    config = os.path.join(work, "serve.toml")
    nats = combo.endswith("-nats")
    ingest = (
        f'[ingest]\ntype = "nats"\nurl = {toml_str(env("AUTOCDC_TEST_NATS_URL"))}\n'
        f'stream_prefix = "SUITE{run_id}"\nsubject_prefix = "suite{run_id}"\n\n'
        if nats
        else ""
    )

    def write_config(gk_flow, session=0):
        # On NATS every session starts on an empty data_dir: a new machine.
        data = work + (f"/data-{session}" if nats else "/data")
        with open(config, "w") as f:
            f.write(
                f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = {toml_str(data)}\n\n{ingest}'
                f"{catalog.config_toml()}\n{gk_flow}\n"
                + "\n".join(BATTERY_FLOW.format(name=n, target=namespace + ".customers") for n in BATTERY_FLOWS)
            )

    write_config(gk_flow)
    server = Server(binary, config, os.path.join(work, "serve.log"), f"http://127.0.0.1:{port}")

    # The feed in a shuffled arrival order, cut into requests, spread over the sessions.
    rng = random.Random(7)
    lines = list(gk_lines)
    rng.shuffle(lines)
    size = -(-len(lines) // GK_REQUESTS)
    requests = [lines[i : i + size] for i in range(0, len(lines), size)]
    per_session = -(-len(requests) // SESSIONS)

    acked = {}  # request number -> offset
    retry_problems = []
    restarts = 0
    maintained = {"runs": 0, "expired": 0, "deleted": 0, "problems": []}
    try:
        for session in range(SESSIONS):
            if session > 0:
                server.stop()
                restarts += 1
            if session >= EVOLVE_AT:
                # Mid-feed, the definition changes: a widened type, an added
                # column and a partition field (docs/schema-changes.md).
                write_config(evolve_gk(gk_flow), session)
            else:
                write_config(gk_flow, session)
            server.start()
            if session > 0:
                # The previous session's last request again, same key: applied once.
                n = max(acked)
                again = push_ndjson(server, "ghost_kitchen", requests[n], key=f"{run_id}-gk-{n}")
                if again["offset"] != acked[n]:
                    retry_problems.append(f"request {n}: first offset {acked[n]}, retry answered {again}")
            for n in range(session * per_session, min((session + 1) * per_session, len(requests))):
                answer = push_ndjson(server, "ghost_kitchen", requests[n], key=f"{run_id}-gk-{n}")
                acked[n] = answer["offset"]
            # The session's battery step split between the two flows
            # (the even changes to one, the odd to the other), in turn.
            for i, name in enumerate(BATTERY_FLOWS):
                step = [json.dumps(c) for c in BATTERY_STEPS[session][i::2]]
                push_ndjson(server, name, step, key=f"{run_id}-{name}-{session}" if session < 3 else None, wait=True)
            # Maintenance between the restarts: expiry down to 2 snapshots per table.
            for flow in ("ghost_kitchen",) + BATTERY_FLOWS:
                server.request("POST", f"/v1/flows/{flow}/commit")
                r = server.request("POST", f"/v1/flows/{flow}/maintain")
                maintained["runs"] += 1
                for t in ("target", "state"):
                    maintained["expired"] += r[t]["snapshots_expired"]
                    maintained["deleted"] += r[t]["manifest_lists_deleted"] + r[t]["manifests_deleted"]
                    if r[f"{t}_stats"]["snapshots"] > 3:
                        maintained["problems"].append(f"{flow} {t}: {r[f'{t}_stats']['snapshots']} snapshots after expiry")
        server.stop()
    finally:
        server.kill()
    sessions = f"{len(lines)} events in {len(requests)} requests over {SESSIONS} sessions, {restarts} SIGTERM restarts (exit 0)"

    con = duck(s3)
    gk_meta, how = catalog.current_metadata(namespace, "orders")
    report("catalog-view orders", True, how)
    battery_meta, how = catalog.current_metadata(namespace, "customers")
    report("catalog-view customers", True, how)

    for reader, read in (
        ("duckdb", lambda m, c: rows_duckdb(con, m, c)),
        ("pyiceberg", lambda m, c: rows_pyiceberg(m, c, s3)),
    ):
        got = read(gk_meta, GK_COLUMNS)
        detail = f"{len(got)} rows, oracle {len(oracle)}; {sessions}"
        if got != oracle:
            missing, extra = sorted(set(oracle) - set(got))[:3], sorted(set(got) - set(oracle))[:3]
            detail += f"; missing {missing} extra {extra}"
        report(f"ghost-kitchen {reader}", got == oracle, detail)
        got = read(battery_meta, BATTERY_COLUMNS)
        detail = f"{len(got)} rows" if got == BATTERY_EXPECTED else f"want {BATTERY_EXPECTED} got {got}"
        report(f"scd1-battery {reader}", got == BATTERY_EXPECTED, detail)

    report(
        "maintenance",
        maintained["runs"] > 0 and maintained["expired"] > 0 and not maintained["problems"],
        f"{maintained['runs']} runs between restarts: {maintained['expired']} snapshots expired, "
        f"{maintained['deleted']} manifest lists and manifests deleted; " + ("; ".join(maintained["problems"]) or "the tables above read back after it"),
    )
    report(
        "idempotent-retry",
        not retry_problems,
        "; ".join(retry_problems) or f"{SESSIONS - 1} retries after a restart (same Idempotency-Key) answered the first offset",
    )
    metadata = json.loads(catalog.files.read(gk_meta))
    schema = next(x for x in metadata["schemas"] if x["schema-id"] == metadata["current-schema-id"])
    types = {f["name"]: f["type"] for f in schema["fields"]}
    spec = next(x for x in metadata["partition-specs"] if x["spec-id"] == metadata["default-spec-id"])
    evolved = (
        types.get("location_id") == "long"
        and types.get("note") == "string"
        and [f["transform"] for f in spec["fields"]] == ["bucket[4]"]
        and len(metadata["partition-specs"]) == 2
    )
    report(
        "evolution",
        evolved,
        f"evolved before session {EVOLVE_AT}: schema {metadata['current-schema-id']} (location_id {types.get('location_id')}, "
        f"note {types.get('note')}), spec {metadata['default-spec-id']} {spec['fields']}; the rows above read back through both",
    )
    current = next(s for s in metadata["snapshots"] if s["snapshot-id"] == metadata["current-snapshot-id"])
    recorded = current["summary"].get("autocdc.input-offset")
    last = max(acked.values())
    report(
        "input-offset",
        recorded == str(last),
        f"current snapshot's autocdc.input-offset {recorded}, last acknowledged offset {last}",
    )


def main():
    binary, root, gk = sys.argv[1], sys.argv[2], sys.argv[3]
    combos = sys.argv[4:] or COMBINATIONS
    gk_lines = []
    for path in sorted(glob.glob(os.path.join(gk, "*.ndjson"))):
        gk_lines.extend(l for l in open(path).read().splitlines() if l.strip())
    oracle = gk_oracle(gk)
    counts = {"PASS": 0, "FAIL": 0}
    failed = []

    def line(combo, check, verdict, detail):
        counts[verdict] += 1
        if verdict == "FAIL":
            failed.append(f"{combo} {check}: {detail}")
        print(f"{verdict:7} {combo:12} {check:24} {detail}", flush=True)

    for combo in combos:
        started = time.monotonic()
        report = lambda check, ok, detail: line(combo, check, "PASS" if ok else "FAIL", detail)  # noqa: E731
        try:
            run_combination(combo, binary, root, gk, gk_lines, oracle, report)
        except Fail as e:
            line(combo, "run", "FAIL", f"{e} (logs in {os.path.join(root, combo)})")
        except Exception as e:  # a reader or the storage raised: report it, go on
            line(combo, "run", "FAIL", f"{type(e).__name__}: {e} (logs in {os.path.join(root, combo)})")
            traceback.print_exc(file=sys.stderr)
        print(f"        {combo:12} took {time.monotonic() - started:.0f} s", flush=True)
    print(f"suite: {counts['PASS']} passed, {counts['FAIL']} failed", flush=True)
    if failed:
        # The last line: why (the first failed check; the others are above).
        print(f"suite: FAIL: {failed[0]}" + (f" (and {len(failed) - 1} more above)" if len(failed) > 1 else ""), flush=True)
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
