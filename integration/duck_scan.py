"""Times full scans for `autocdc bench-long --duckdb PYTHON`: the Iceberg
table through DuckDB's iceberg extension (deletes applied), and the same
rows as one Parquet file through DuckDB's read_parquet. Prints one line:
`<table ms> <one-file ms> <rows>`.

usage: duck_scan.py METADATA_JSON PARQUET_FILE
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readers import duck  # noqa: E402

metadata, single = sys.argv[1], sys.argv[2]
con = duck()


def timed(sql):
    best = None
    for _ in range(3):
        t = time.perf_counter()
        n = con.execute(sql).fetchall()[0][0]
        ms = (time.perf_counter() - t) * 1e3
        best = ms if best is None else min(best, ms)
    return best, n


# SUM over every column's length forces every value to be read.
table_ms, rows = timed(f"SELECT count(*) FROM (SELECT * FROM iceberg_scan('{metadata}'))")
file_ms, _ = timed(f"SELECT count(*) FROM (SELECT * FROM read_parquet('{single}'))")
print(f"{table_ms:.1f} {file_ms:.1f} {rows}")
