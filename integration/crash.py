"""Crash test for `autocdc serve`: pushes a generated ghost-kitchen feed in
small batches, each with an Idempotency-Key, while another thread kills the
server with SIGKILL at random moments and restarts it. Every request is
retried (same key) until acknowledged. At the end the table, read with
DuckDB's iceberg extension, must equal the SQL oracle of the whole feed:
nothing lost, nothing twice.

usage: crash.py AUTOCDC_BIN WORK_DIR GHOST_KITCHEN_DIR [KILLS]
"""

import glob
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from readers import duck, fmt, rows_duckdb  # noqa: E402

binary, work, gk = sys.argv[1], sys.argv[2], sys.argv[3]
kills_wanted = int(sys.argv[4]) if len(sys.argv) > 4 else 20
rng = random.Random(5)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
base = f"http://127.0.0.1:{port}"

flow = open(os.path.join(gk, "flow.toml")).read()
flow = flow.replace('keys = ["order_id"]\n', 'keys = ["order_id"]\ncommit_interval = "250ms"\n')
config = os.path.join(work, "serve.toml")
with open(config, "w") as f:
    f.write(
        f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = "{work}/data"\n\n'
        f'[catalog]\ntype = "hadoop"\nwarehouse = "{work}/wh"\n\n{flow}'
    )

log = open(os.path.join(work, "serve.log"), "ab")
lock = threading.Lock()
proc = None


def start():
    global proc
    proc = subprocess.Popen([binary, "serve", "--config", config], stdout=log, stderr=log)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None:
            sys.exit(f"autocdc serve exited with {proc.returncode}; see {work}/serve.log")
        time.sleep(0.05)
    sys.exit("autocdc serve did not become ready")


def request(method, path, body=None, headers=None):
    req = urllib.request.Request(f"{base}{path}", data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


def until_ok(method, path, body=None, headers=None):
    while True:
        try:
            return request(method, path, body, headers)
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                time.sleep(0.1)
                continue
            sys.exit(f"{method} {path}: {e.code} {e.read()[:300]!r}")
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.05)


kills = 0
done = threading.Event()


def killer():
    global kills
    while kills < kills_wanted:
        time.sleep(rng.uniform(0.15, 0.6))
        with lock:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            start()
    done.set()


start()
lines = []
for path in sorted(glob.glob(os.path.join(gk, "*.ndjson"))):
    lines.extend(l for l in open(path).read().splitlines() if l.strip())
chunks = [lines[i : i + 200] for i in range(0, len(lines), 200)]
t = threading.Thread(target=killer)
t.start()
acked = 0
for n, chunk in enumerate(chunks):
    body = ("\n".join(chunk)).encode()
    until_ok("POST", "/v1/flows/ghost_kitchen/changes", body,
             {"content-type": "application/x-ndjson", "idempotency-key": f"chunk-{n}"})
    acked += 1
    if not done.is_set():
        time.sleep(0.02)
t.join()
until_ok("POST", "/v1/flows/ghost_kitchen/commit")
_, status = until_ok("GET", "/v1/flows/ghost_kitchen")
proc.send_signal(signal.SIGTERM)
if proc.wait(timeout=60) != 0:
    sys.exit(f"autocdc serve exited with {proc.returncode} on SIGTERM")

con = duck()
hint = open(f"{work}/wh/kitchen/orders/metadata/version-hint.text").read().strip()
metadata = f"{work}/wh/kitchen/orders/metadata/v{hint}.metadata.json"
cols = ["order_id", "event_type", "location_id", "ts_seconds", "sequence", "status", "seq"]
oracle = con.execute(
    f"""SELECT {", ".join(cols)} FROM (
          SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY seq DESC) AS rn
          FROM read_json('{gk}/*.ndjson', format='newline_delimited') WHERE order_id IS NOT NULL)
        WHERE rn = 1 AND op <> 'DELETE'"""
).fetchall()
want = sorted(tuple(fmt(v) for v in r) for r in oracle)
got = rows_duckdb(con, metadata, cols)
print(f"crash: {kills} SIGKILLs, {acked} batches acknowledged ({len(lines)} events), "
      f"committed offset {status['status']['committed_offset']}, table {len(got)} rows, oracle {len(want)}")
if got != want:
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    sys.exit(f"crash: table differs from the oracle; missing {missing} extra {extra}")
print("crash: ok")
