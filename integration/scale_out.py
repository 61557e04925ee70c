"""Figures for `autocdc serve` scaled out on NATS JetStream (docs/scale-out.md, "Scaling
out"): N instances sharing one NATS and one Hadoop warehouse, F flows, C
client threads pushing NDJSON requests of B events to random instances.

Prints, per instance count: acknowledged events/s (pushes answered 202),
committed events/s (until every flow's target holds every acknowledged
batch), the append (publish) latency p50/p99 the instances report, and the
lease holders per instance. Then the takeover time: the holder of one flow
is killed with SIGKILL; the time until another instance holds its lease,
and until a batch pushed after the kill is committed.

A measuring tool, not a test: it asserts only that every acknowledged
batch is committed. Not run by the test command.

usage: scale_out.py AUTOCDC_BIN NATS_URL [--instances 1,2,3] [--flows 6]
       [--clients 4] [--batch 500] [--seconds 20] [--lease-ttl 5s]
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


FLOW = """
[[flow]]
name = "{name}"
target = "scale.{name}"
keys = ["id"]
sequence_by = "seq"
apply_as_deletes = "op = 'DELETE'"
except_column_list = ["op"]
commit_interval = "1s"
columns = [
  {{ name = "id", type = "long", required = true }},
  {{ name = "city", type = "string" }},
  {{ name = "op", type = "string", required = true }},
  {{ name = "seq", type = "long", required = true }},
]
"""


def call(base, method, path, body=None, headers=None, timeout=60):
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


class Instance:
    def __init__(self, binary, work, i, nats, prefix, flows, ttl):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.config = os.path.join(work, f"i{i}.toml")
        self.log = os.path.join(work, f"i{i}.log")
        with open(self.config, "w") as f:
            f.write(
                f'[server]\nlisten = "127.0.0.1:{self.port}"\ndata_dir = "{work}/data{i}"\nmax_connections = 256\n\n'
                f'[ingest]\ntype = "nats"\nurl = "{nats}"\nstream_prefix = "{prefix}"\nsubject_prefix = "{prefix.lower()}"\n'
                f'lease_ttl = "{ttl}"\ninstance = "i{i}"\n\n'
                f'[catalog]\ntype = "hadoop"\nwarehouse = "{work}/wh"\n\n[maintenance]\ninterval = "0s"\n'
                + "".join(FLOW.format(name=f) for f in flows)
            )
        self.binary = binary
        self.proc = None

    def start(self):
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([self.binary, "serve", "--config", self.config], stdout=log, stderr=log)
        for _ in range(600):
            try:
                if call(self.base, "GET", "/readyz", timeout=2)[0] == 200:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise SystemExit(f"instance on {self.port} did not start; see {self.log}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def status(self, flow):
        return call(self.base, "GET", f"/v1/flows/{flow}")[1]["status"]


def body(batch, seq0, keys):
    lines = []
    for j in range(batch):
        k = random.randrange(keys)
        op = "DELETE" if random.random() < 0.1 else "UPSERT"
        lines.append(json.dumps({"id": k, "city": "Oslo", "op": op, "seq": seq0 + j}))
    return "\n".join(lines).encode()


def push_for(instances, flows, clients, batch, seconds):
    """Pushes from `clients` threads for `seconds`; returns (events acked, per-flow acked offsets)."""
    stop = time.monotonic() + seconds
    acked = {f: set() for f in flows}
    count = [0]
    lock = threading.Lock()
    seq = [0]

    def run(t):
        rnd = random.Random(t)
        while time.monotonic() < stop:
            f = rnd.choice(flows)
            inst = rnd.choice(instances)
            with lock:
                seq0 = seq[0]
                seq[0] += batch
            data = body(batch, seq0, 100_000)
            key = uuid.uuid4().hex
            while True:
                try:
                    _, a = call(inst.base, "POST", f"/v1/flows/{f}/changes", data,
                                {"content-type": "application/x-ndjson", "idempotency-key": key})
                    break
                except urllib.error.HTTPError as e:
                    if e.code in (429, 503):
                        time.sleep(0.05)
                        continue
                    raise
            with lock:
                count[0] += batch
                acked[f].add(a["offset"])

    threads = [threading.Thread(target=run, args=(t,)) for t in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return count[0], acked


def wait_committed(instances, acked, timeout=300):
    deadline = time.monotonic() + timeout
    for f, offs in acked.items():
        want = max(offs, default=0)
        while True:
            got = max(i.status(f)["committed_offset"] for i in instances)
            if got >= want:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{f}: committed {got}, acknowledged through {want}")
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("nats")
    ap.add_argument("--instances", default="1,2,3")
    ap.add_argument("--flows", type=int, default=6)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--lease-ttl", default="5s")
    a = ap.parse_args()
    flows = [f"f{i}" for i in range(a.flows)]
    print(f"{a.flows} flows, {a.clients} clients, {a.batch} events per request, {a.seconds:.0f} s of pushes per run")
    print(f"{'instances':>9} {'acked ev/s':>11} {'committed ev/s':>15} {'append p50 ms':>14} {'append p99 ms':>14}  leases per instance")
    for n in [int(x) for x in a.instances.split(",")]:
        work = tempfile.mkdtemp(prefix="autocdc-scale-")
        prefix = "S" + uuid.uuid4().hex[:8]
        insts = [Instance(a.binary, work, i, a.nats, prefix, flows, a.lease_ttl) for i in range(n)]
        for i in insts:
            i.start()
        time.sleep(2)  # leases settle
        started = time.monotonic()
        events, acked = push_for(insts, flows, a.clients, a.batch, a.seconds)
        pushed = time.monotonic() - started
        wait_committed(insts, acked)
        committed = time.monotonic() - started
        p50 = max((i.status(f)["recent_append_ms_p50"] or 0) for i in insts for f in flows)
        p99 = max((i.status(f)["recent_append_ms_p99"] or 0) for i in insts for f in flows)
        held = [sum(1 for f in flows if i.status(f)["lease"]["held_here"]) for i in insts]
        print(f"{n:>9} {events / pushed:>11,.0f} {events / committed:>15,.0f} {p50:>14.1f} {p99:>14.1f}  {held}")
        if n >= 2:
            # Takeover: SIGKILL the holder of f0.
            victim = next(i for i in insts if i.status("f0")["lease"]["held_here"])
            others = [i for i in insts if i is not victim]
            victim.kill()
            killed = time.monotonic()
            _, a0 = call(others[0].base, "POST", "/v1/flows/f0/changes", body(10, 10**12, 10),
                         {"content-type": "application/x-ndjson"})
            taken = None
            while True:
                if taken is None and any(o.status("f0")["lease"]["held_here"] for o in others):
                    taken = time.monotonic() - killed
                if max(o.status("f0")["committed_offset"] for o in others) >= a0["offset"]:
                    break
                time.sleep(0.02)
            done = time.monotonic() - killed
            taken = done if taken is None else taken
            print(f"          takeover after SIGKILL of the holder of f0 (lease_ttl {a.lease_ttl}): "
                  f"lease taken after {taken:.2f} s, a batch pushed after the kill committed after {done:.2f} s")
        for i in insts:
            i.stop()


if __name__ == "__main__":
    main()
