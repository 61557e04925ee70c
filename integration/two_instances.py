"""Two `autocdc serve` instances on one flow, each with its own data_dir and
local ingest log, one catalog and table (a rolling deploy's overlap, a double
start, two replicas behind one load balancer). The ghost-kitchen feed,
shuffled, is pushed in small requests with Idempotency-Keys to a random
instance while another thread SIGKILLs a random instance at random moments
and restarts it. Every request is retried against the same instance (same
key) until acknowledged. At the end the table, read with DuckDB, must equal
the SQL oracle of the whole feed: every acknowledged batch in, exactly once.

usage: two_instances.py AUTOCDC_BIN WORK_DIR GHOST_KITCHEN_DIR KILLS [COMBINATION...]
(combinations: hadoop-local, sql-s3; endpoints from the AUTOCDC_TEST_* variables)
"""

import glob
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from suite import GK_COLUMNS, Fail, Server, duck, free_port, gk_oracle, make_catalog, rows_duckdb, toml_str  # noqa: E402

REQUEST_EVENTS = 150


def run(combo, binary, root, gk, lines, oracle, kills_wanted):
    run_id = uuid.uuid4().hex[:10]
    work = os.path.join(root, combo)
    os.makedirs(work)
    catalog, s3 = make_catalog(combo, run_id, work)
    namespace = f"two_{run_id}"
    flow = open(os.path.join(gk, "flow.toml")).read()
    flow = re.sub(r"^target = .*$", f'target = "{namespace}.orders"', flow, flags=re.M)
    flow = flow.replace('keys = ["order_id"]\n', 'keys = ["order_id"]\ncommit_interval = "200ms"\n')
    servers = []
    for i in range(2):
        port = free_port()
        config = os.path.join(work, f"serve-{i}.toml")
        with open(config, "w") as f:
            f.write(
                f'[server]\nlisten = "127.0.0.1:{port}"\ndata_dir = {toml_str(f"{work}/data-{i}")}\n\n'
                f"{catalog.config_toml()}\n{flow}"
            )
        servers.append(Server(binary, config, os.path.join(work, f"serve-{i}.log"), f"http://127.0.0.1:{port}"))
    locks = [threading.Lock(), threading.Lock()]
    rng = random.Random(11)
    kills = [0, 0]
    done = threading.Event()
    failure = []

    def killer():
        k = random.Random(13)
        try:
            while sum(kills) < kills_wanted and not done.is_set():
                time.sleep(k.uniform(0.2, 0.8))
                i = k.randrange(2)
                with locks[i]:
                    servers[i].kill()
                    kills[i] += 1
                    servers[i].start()
        except Exception as e:  # noqa: BLE001 - reported below
            failure.append(f"killer: {e}")

    def push(i, n, body):
        """Until acknowledged by instance i (same key on every retry)."""
        headers = {"content-type": "application/x-ndjson", "idempotency-key": f"{run_id}-{n}"}
        for _ in range(3000):
            req = urllib.request.Request(
                f"{servers[i].base}/v1/flows/ghost_kitchen/changes", data=body, method="POST", headers=headers
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    if r.status == 202:
                        return
            except urllib.error.HTTPError as e:
                if e.code != 429 and e.code < 500:
                    raise Fail(f"request {n} to instance {i}: {e.code} {e.read()[:300]!r}")
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        raise Fail(f"request {n} to instance {i}: not acknowledged after 3000 tries")

    for s in servers:
        s.start()
    t = threading.Thread(target=killer)
    t.start()
    requests = [lines[i : i + REQUEST_EVENTS] for i in range(0, len(lines), REQUEST_EVENTS)]
    try:
        for n, chunk in enumerate(requests):
            push(rng.randrange(2), n, "\n".join(chunk).encode())
            if sum(kills) < kills_wanted:
                time.sleep(0.01)
        # Let the killer finish its round, then commit everything on both.
        while sum(kills) < kills_wanted and t.is_alive():
            time.sleep(0.1)
        done.set()
        t.join()
        if failure:
            raise Fail(failure[0])
        for i, s in enumerate(servers):
            with locks[i]:
                s.request("POST", "/v1/flows/ghost_kitchen/commit")
        for s in servers:
            s.stop()
    finally:
        done.set()
        t.join()
        for s in servers:
            s.kill()
    metadata, _ = catalog.current_metadata(namespace, "orders")
    got = rows_duckdb(duck(s3), metadata, GK_COLUMNS)
    summary = (
        f"{combo}: {len(requests)} requests ({len(lines)} events) to 2 instances, "
        f"SIGKILLs {kills[0]} + {kills[1]}; table {len(got)} rows, oracle {len(oracle)}"
    )
    if got != oracle:
        missing = sorted(set(oracle) - set(got))
        extra = sorted(set(got) - set(oracle))
        raise Fail(f"{summary}: {len(missing)} missing, e.g. {missing[:2]}; {len(extra)} extra or wrong, e.g. {extra[:2]}")
    print(f"two-instances: {summary}: ok", flush=True)


def main():
    binary, root, gk, kills = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    combos = sys.argv[5:] or ["hadoop-local", "sql-s3"]
    lines = []
    for path in sorted(glob.glob(os.path.join(gk, "*.ndjson"))):
        lines.extend(l for l in open(path).read().splitlines() if l.strip())
    random.Random(3).shuffle(lines)
    oracle = gk_oracle(gk)
    failed = []
    for combo in combos:
        started = time.monotonic()
        try:
            run(combo, binary, root, gk, lines, oracle, kills)
        except Fail as e:
            failed.append(f"{combo}: {e}")
            print(f"two-instances: FAIL {e} (logs in {os.path.join(root, combo)})", flush=True)
        print(f"two-instances: {combo} took {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        # The last line: why.
        print(f"two-instances: FAIL: {'; '.join(failed)}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
