"""Scale-out chaos: a 3-node NATS JetStream cluster on localhost, 3 `autocdc
serve` instances sharing it (streams and key-value buckets with replicas = 3)
and one Hadoop warehouse, 3 flows: two in the config file, one made with
`PUT` on one instance (kept in the cluster's key-value bucket).

One client thread per flow pushes the ghost-kitchen feed, shuffled, in
requests with Idempotency-Keys, each to a random instance and retried on
random instances until acknowledged. Meanwhile a killer SIGKILLs a random
instance at random moments and restarts it with an empty data_dir (a lost
machine), and three times (AUTOCDC_CLUSTER_NATS_KILLS) a NATS node is
SIGKILLed and restarted while a restarted instance opens its flows.

At the end every instance is ready (/readyz 200) with nothing pushed since
the last NATS node came back, and for every flow:
- the acknowledged offsets are exactly 1..N for its N requests: every
  acknowledged batch is in the stream once, no retry stored twice;
- its committed offset is N and its table (read by DuckDB) equals the SQL
  oracle of the feed;
- the table's history shows one holder at a time: the lease epochs its
  snapshots record never go down, and each epoch is one instance's;
- the instances' logs show each lease epoch taken by one instance.

usage: cluster.py AUTOCDC_BIN NATS_SERVER WORK_DIR GHOST_KITCHEN_DIR KILLS
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
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from suite import GK_COLUMNS, Fail, HadoopCatalog, duck, gk_oracle, rows_duckdb, toml_str  # noqa: E402

REQUEST_EVENTS = 150
INSTANCES = 3
CONFIG_FLOWS = ["orders_a", "orders_b"]
PUT_FLOW = "orders_c"
NAMESPACE = "cluster"


def wait_until(what, ok, timeout, seen=None):
    """Polls `ok` for `timeout` s; the failure says what `seen()` answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    raise Fail(f"{what}: not after {timeout} s" + (f"; {seen()}" if seen else ""))


def free_ports(n):
    """`n` distinct free ports. Each socket stays bound until all are
    picked: one at a time, the kernel gave a port twice (a NATS node's
    monitor and an instance's HTTP port, and the instance could not start)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def http_answer(url):
    """What `url` answers, as one line: for a failure's message."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return f"{url} answered {r.status}"
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code} {e.read()[:600].decode(errors='replace')}"
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        return f"{url}: {e}"


class Node:
    """One nats-server of the cluster."""

    def __init__(self, binary, work, i, ports, cports, mports):
        self.binary, self.i = binary, i
        self.dir = os.path.join(work, f"nats{i}")
        self.log = os.path.join(work, f"nats{i}.log")
        self.port, self.cport, self.mport = ports[i], cports[i], mports[i]
        self.routes = ",".join(f"nats://127.0.0.1:{c}" for j, c in enumerate(cports) if j != i)
        self.proc = None

    def start(self):
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-sd", self.dir, "-n", f"n{self.i}", "-a", "127.0.0.1",
             "-p", str(self.port), "-m", str(self.mport), "--cluster_name", "autocdc",
             "--cluster", f"nats://127.0.0.1:{self.cport}", "--routes", self.routes],
            stdout=log, stderr=log,
        )
        log.close()

    def healthy(self):
        return http_ok(f"http://127.0.0.1:{self.mport}/healthz")

    def health(self):
        return http_answer(f"http://127.0.0.1:{self.mport}/healthz")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def catching(f):
    """None when `f()` returns, else what it raised, as text."""
    try:
        f()
        return None
    except Exception as e:  # noqa: BLE001 - reported by the caller
        return f"{type(e).__name__}: {e}"


class Instance:
    """One `autocdc serve`; restarted with an empty data_dir after a kill."""

    def __init__(self, binary, work, k, body, port):
        self.binary, self.k = binary, k
        self.port = port
        self.base = f"http://127.0.0.1:{self.port}"
        self.data = os.path.join(work, f"data{k}")
        self.config = os.path.join(work, f"i{k}.toml")
        self.log = os.path.join(work, f"i{k}.log")
        with open(self.config, "w") as f:
            f.write(f'[server]\nlisten = "127.0.0.1:{self.port}"\ndata_dir = {toml_str(self.data)}\n\n{body}')
        self.proc = None

    def start(self):
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config], stdout=log, stderr=log)
        log.close()

        def ready():
            if self.proc.poll() is not None:
                tail = " | ".join(open(self.log, errors="replace").read().strip().splitlines()[-5:])
                raise Fail(f"instance {self.k} exited with {self.proc.returncode} before ready: {tail}")
            return http_ok(f"{self.base}/readyz")

        wait_until(f"instance {self.k} ready", ready, 120, lambda: http_answer(f"{self.base}/readyz"))

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=120)
        if rc != 0:
            raise Fail(f"instance {self.k} exited with {rc} on SIGTERM; see {self.log}")


def call(base, method, path, body=None, headers=None, timeout=60):
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


def flow_toml(gk_flow, name):
    text = re.sub(r'^name = .*$', f'name = "{name}"', gk_flow, flags=re.M)
    text = re.sub(r"^target = .*$", f'target = "{NAMESPACE}.{name}"', text, flags=re.M)
    return text.replace('keys = ["order_id"]\n', 'keys = ["order_id"]\ncommit_interval = "300ms"\n')


def snapshot_epochs(metadata_path):
    """(epoch, instance) per run of snapshots, in commit order; asserts one holder at a time."""
    meta = json.load(open(metadata_path))
    runs = []
    for s in sorted(meta.get("snapshots", []), key=lambda s: s["sequence-number"]):
        summary = s.get("summary", {})
        if "autocdc.lease-epoch" not in summary:
            continue
        epoch, who = int(summary["autocdc.lease-epoch"]), summary.get("autocdc.committer", "")
        if runs:
            last, by = runs[-1]
            if epoch < last:
                raise Fail(f"{metadata_path}: epoch {epoch} by {who} committed after epoch {last} by {by}")
            if epoch == last:
                if who != by:
                    raise Fail(f"{metadata_path}: epoch {epoch} held by both {by} and {who}")
                continue
        runs.append((epoch, who))
    return runs


def main():
    binary, nats_server, work, gk, kills_wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    nats_kills_wanted = int(os.environ.get("AUTOCDC_CLUSTER_NATS_KILLS", "3"))
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    lines = []
    for path in sorted(glob.glob(os.path.join(gk, "*.ndjson"))):
        lines.extend(l for l in open(path).read().splitlines() if l.strip())
    oracle = gk_oracle(gk)
    gk_flow = open(os.path.join(gk, "flow.toml")).read()

    picked = free_ports(9 + INSTANCES)
    ports, cports, mports, iports = picked[0:3], picked[3:6], picked[6:9], picked[9:]
    nodes = [Node(nats_server, work, i, ports, cports, mports) for i in range(3)]
    urls = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    warehouse = os.path.join(work, "warehouse")
    catalog = HadoopCatalog(warehouse)
    body = (
        f'[ingest]\ntype = "nats"\nurl = "{urls}"\nstream_prefix = "CL{run_id}"\nsubject_prefix = "cl{run_id}"\n'
        f'replicas = 3\nlease_ttl = "3s"\npublish_timeout = "5s"\n\n'
        f"{catalog.config_toml()}\n" + "".join(flow_toml(gk_flow, f) for f in CONFIG_FLOWS)
    )
    instances = [Instance(binary, work, k, body, iports[k]) for k in range(INSTANCES)]
    # The instance name is the config's `instance`, set per process below.
    for k, inst in enumerate(instances):
        text = open(inst.config).read().replace("[ingest]\n", f'[ingest]\ninstance = "i{k}"\n')
        open(inst.config, "w").write(text)

    locks = [threading.Lock() for _ in instances]
    failure = []
    done = threading.Event()
    kills = [0] * INSTANCES
    nats_killed = []
    acked = {f: {} for f in CONFIG_FLOWS + [PUT_FLOW]}

    def restart_while_nats_node_dies(rng):
        # An instance opens its flows while a NATS node is SIGKILLed and
        # restarted (the cluster elects new leaders meanwhile, and may answer
        # "stream not found" for streams that exist): it must wait for them,
        # never make one again empty, and come up.
        k = rng.randrange(INSTANCES)
        node = nodes[rng.randrange(3)]
        with locks[k]:
            instances[k].kill()
            kills[k] += 1
            shutil.rmtree(instances[k].data, ignore_errors=True)
            opened = []
            opening = threading.Thread(target=lambda: opened.append(catching(instances[k].start)))
            opening.start()
            time.sleep(rng.uniform(0.0, 0.3))
            node.kill()
            nats_killed.append(f"n{node.i}")
            time.sleep(4)
            node.start()
            wait_until(f"NATS node n{node.i} healthy again", node.healthy, 60, node.health)
            opening.join()
            if opened != [None]:
                raise Fail(f"instance {k}, started while NATS node n{node.i} died: {opened}")

    def killer():
        rng = random.Random(17)
        try:
            while sum(kills) < kills_wanted and not done.is_set():
                time.sleep(rng.uniform(0.5, 1.5))
                due = (len(nats_killed) + 1) * kills_wanted // (nats_kills_wanted + 1)
                if len(nats_killed) < nats_kills_wanted and sum(kills) >= due:
                    restart_while_nats_node_dies(rng)
                    continue
                k = rng.randrange(INSTANCES)
                with locks[k]:
                    instances[k].kill()
                    kills[k] += 1
                    shutil.rmtree(instances[k].data, ignore_errors=True)
                    instances[k].start()
        except Exception as e:  # noqa: BLE001 - reported below
            failure.append(f"killer: {e}")

    def pusher(flow, seed):
        rng = random.Random(seed)
        mine = list(lines)
        rng.shuffle(mine)
        requests = [mine[i : i + REQUEST_EVENTS] for i in range(0, len(mine), REQUEST_EVENTS)]
        try:
            for n, chunk in enumerate(requests):
                key = f"{run_id}-{flow}-{n}"
                headers = {"content-type": "application/x-ndjson", "idempotency-key": key}
                data = "\n".join(chunk).encode()
                for attempt in range(3000):
                    base = instances[rng.randrange(INSTANCES)].base
                    try:
                        status, answer = call(base, "POST", f"/v1/flows/{flow}/changes", data, headers, timeout=30)
                        if status == 202:
                            acked[flow][key] = answer["offset"]
                            break
                    except urllib.error.HTTPError as e:
                        # 404: an instance that has not seen the PUT flow yet.
                        if e.code not in (404, 429) and e.code < 500:
                            raise Fail(f"{flow} request {n}: {e.code} {e.read()[:300]!r}")
                    except (urllib.error.URLError, ConnectionError, OSError):
                        pass
                    time.sleep(0.05)
                else:
                    raise Fail(f"{flow} request {n}: not acknowledged after 3000 tries")
                # Spread the requests over the killer's rounds.
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - reported below
            failure.append(f"pusher {flow}: {e}")

    def diagnose(flow):
        views = []
        for inst in instances:
            try:
                st = call(inst.base, "GET", f"/v1/flows/{flow}")[1]["status"]
                views.append(
                    f"i{inst.k}: committed {st['committed_offset']} applied {st['applied_offset']} "
                    f"pending {st['pending_batches']} next {st['wal']['next_offset']} lease {st.get('lease')}"
                )
            except Exception as e:  # noqa: BLE001 - diagnostics only
                views.append(f"i{inst.k}: {e}")
        return "; ".join(views)

    try:
        for node in nodes:
            node.start()
        for node in nodes:
            wait_until(f"NATS node n{node.i} healthy", node.healthy, 60, node.health)
        for inst in instances:
            inst.start()
        definition = tomllib.loads(flow_toml(gk_flow, PUT_FLOW))["flow"][0]
        status, _ = call(
            instances[0].base, "PUT", f"/v1/flows/{PUT_FLOW}", json.dumps(definition).encode(),
            {"content-type": "application/json"},
        )
        if status != 201:
            raise Fail(f"PUT /v1/flows/{PUT_FLOW}: {status}")
        k = threading.Thread(target=killer)
        k.start()
        pushers = [threading.Thread(target=pusher, args=(f, i)) for i, f in enumerate(acked)]
        for t in pushers:
            t.start()
        for t in pushers:
            t.join()
        pushed_in = time.monotonic() - started
        k.join()
        killed_in = time.monotonic() - started
        done.set()
        if failure:
            raise Fail(failure[0])
        # Everything acknowledged is committed by the flows' holders, and
        # `POST .../commit` answers on every instance, holder or not.
        committed = {}
        for flow in acked:
            for inst in instances:
                for attempt in range(100):
                    try:
                        call(inst.base, "POST", f"/v1/flows/{flow}/commit", b"", timeout=120)
                        _, view = call(inst.base, "GET", f"/v1/flows/{flow}")
                        committed[flow] = view["status"]["committed_offset"]
                        break
                    except urllib.error.HTTPError as e:
                        if e.code != 503:
                            raise Fail(f"POST /v1/flows/{flow}/commit on i{inst.k}: {e.code} {e.read()[:300]!r}; {diagnose(flow)}")
                    except (urllib.error.URLError, ConnectionError, OSError):
                        pass
                    time.sleep(0.2)
                else:
                    raise Fail(f"POST /v1/flows/{flow}/commit on i{inst.k}: unanswered; {diagnose(flow)}")
        committed_in = time.monotonic() - started
        # Every instance is ready again by itself, though nothing was pushed
        # since the NATS nodes came back: a push or commit that failed
        # during an election must not leave /readyz 503 (a load balancer
        # would never send the instance the push that cleared it).
        for inst in instances:
            wait_until(f"instance {inst.k} ready after the run", lambda: http_ok(f"{inst.base}/readyz"), 30,
                       lambda: http_answer(f"{inst.base}/readyz"))
        for inst in instances:
            inst.stop()
        stopped_in = time.monotonic() - started
    finally:
        done.set()
        for inst in instances:
            inst.kill()
        for node in nodes:
            node.kill()

    con = duck(None)
    taken = {}
    for k in range(INSTANCES):
        for line in open(instances[k].log, errors="replace"):
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            m = re.search(r"lease_taken flow=(\S+) epoch=(\d+) instance=(\S+)", line)
            if m:
                taken.setdefault((m.group(1), int(m.group(2))), set()).add(m.group(3))
    for (flow, epoch), who in taken.items():
        if len(who) > 1:
            raise Fail(f"{flow}: lease epoch {epoch} taken by {sorted(who)}")
    for flow, offsets in acked.items():
        n = len(offsets)
        if sorted(offsets.values()) != list(range(1, n + 1)):
            dup = n - len(set(offsets.values()))
            raise Fail(f"{flow}: {n} acknowledged requests, offsets not 1..{n} ({dup} shared, max {max(offsets.values())})")
        if committed.get(flow) != n:
            raise Fail(f"{flow}: committed offset {committed.get(flow)}, {n} batches acknowledged")
        metadata, _ = catalog.current_metadata(NAMESPACE, flow)
        got = rows_duckdb(con, metadata, GK_COLUMNS)
        if got != oracle:
            missing = sorted(set(oracle) - set(got))
            extra = sorted(set(got) - set(oracle))
            raise Fail(f"{flow}: table {len(got)} rows, oracle {len(oracle)}: {len(missing)} missing, {len(extra)} extra or wrong")
        runs = snapshot_epochs(metadata)
        holders = sorted({who for _, who in runs})
        epochs = sorted(e for (f, e) in taken if f == flow)
        print(
            f"cluster: {flow}: {n} requests ({len(lines)} events) acknowledged once each, committed, "
            f"table = oracle ({len(got)} rows); {len(runs)} holder runs in the table history by {holders}, "
            f"{len(epochs)} lease epochs taken: ok",
            flush=True,
        )
    print(
        f"cluster: 3 NATS nodes (killed {', '.join(nats_killed) or 'none'}), {INSTANCES} instances, "
        f"SIGKILLs {kills}; pushes done at {pushed_in:.0f} s, kills at {killed_in:.0f} s, committed at {committed_in:.0f} s, stopped at {stopped_in:.0f} s, took {time.monotonic() - started:.0f} s",
        flush=True,
    )


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"cluster: FAIL: {e}", flush=True)
        sys.exit(1)
