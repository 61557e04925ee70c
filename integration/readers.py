"""Reads autocdc's tables with independent readers and compares them with
the expected rows: DuckDB's iceberg extension (position and equality deletes)
and PyIceberg 0.12 (position deletes only: it raises on equality deletes, so
reading a table proves autocdc wrote none where positions were known).

Each DIR/expected/*.json names a table's metadata file, the columns to read
and the expected rows, every value rendered as text (NULL for a null): the
SCD Type 1 battery, the history tables, whose columns include SCD Type
2's __START_AT / __END_AT (__END_AT NULL on the current version), and the
random-evolution cases after each step (columns added, widened, renamed and
dropped, specs added and reused: old files read through the current schema),
and the nested-column tables (struct, list and map values compared as JSON).

usage: readers.py E2E_OUT_DIR [GHOST_KITCHEN_INPUT_DIR GHOST_KITCHEN_METADATA]
"""

import glob
import json
import os
import sys

import duckdb
from pyiceberg.table import StaticTable


def duck():
    con = duckdb.connect()
    for ext in ("avro", "iceberg"):
        mod = __import__(f"duckdb_extension_{ext}")
        base = os.path.dirname(mod.__file__)
        paths = glob.glob(os.path.join(base, "extensions", "*", f"{ext}.duckdb_extension"))
        if not paths:
            sys.exit(f"no {ext}.duckdb_extension under {base}")
        con.execute(f"INSTALL '{paths[0]}'")
        con.execute(f"LOAD {ext}")
    return con


def fmt(v):
    return "NULL" if v is None else str(v)


def canon(v):
    """A nested value in one form whatever the reader: maps and structs as
    dicts without null entries (DuckDB gives maps as dicts, PyIceberg as
    lists of (key, value) pairs), lists as lists, dates as ISO text."""
    if isinstance(v, dict):
        return {str(k): canon(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        if v and all(isinstance(e, tuple) and len(e) == 2 for e in v):
            return {str(k): canon(x) for k, x in v if x is not None}
        return [canon(x) for x in v]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def fmt_json(v, is_map):
    v = canon(v)
    if is_map and v == []:
        v = {}
    return json.dumps(v, sort_keys=True)


def json_rows(rows, maps):
    return sorted(tuple(fmt_json(v, m) for v, m in zip(r, maps)) for r in rows)


def rows_duckdb(con, metadata, columns):
    cols = ", ".join(f'"{c}"' for c in columns)
    return sorted(tuple(fmt(v) for v in r) for r in con.execute(f"SELECT {cols} FROM iceberg_scan('{metadata}')").fetchall())


def rows_pyiceberg(metadata, columns):
    t = StaticTable.from_metadata(metadata).scan(selected_fields=tuple(columns)).to_arrow()
    cols = [t.column(c).to_pylist() for c in columns]
    return sorted(tuple(fmt(v) for v in r) for r in zip(*cols))


def interval_violations(con, metadata, keys):
    """SCD Type 2 tables, independently of the expected rows: per key, the
    versions' [__START_AT, __END_AT) intervals are non-empty and disjoint,
    and at most one version is open (__END_AT NULL)."""
    on = " AND ".join(f'a."{k}" = b."{k}"' for k in keys)
    by = ", ".join(f'"{k}"' for k in keys)
    scan = f"iceberg_scan('{metadata}')"
    return con.execute(
        f"""SELECT
              (SELECT count(*) FROM {scan} WHERE "__END_AT" <= "__START_AT"),
              (SELECT count(*) FROM (SELECT count(*) FILTER (WHERE "__END_AT" IS NULL) AS open
                                     FROM {scan} GROUP BY {by} HAVING open > 1)),
              (SELECT count(*) FROM {scan} a JOIN {scan} b ON {on}
                 AND a."__START_AT" < b."__START_AT"
                 AND (a."__END_AT" IS NULL OR b."__START_AT" < a."__END_AT"))
              + (SELECT count(*) FROM (SELECT 1 FROM {scan} GROUP BY {by}, "__START_AT"
                                       HAVING count(*) > 1))"""
    ).fetchone()


def main():
    out = sys.argv[1]
    con = duck()
    failed = []  # the FAIL lines: the first names the reason of a failed run
    interval_checks = 0

    def report(ok, line):
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
        if not ok:
            failed.append(line)

    cases = sorted(glob.glob(os.path.join(out, "expected", "*.json")))
    if not cases:
        sys.exit(f"no expected tables under {out}/expected")
    for path in cases:
        case = json.load(open(path))
        if case.get("json"):
            # Nested columns: every value compared as JSON.
            cols = ", ".join(f'"{c}"' for c in case["columns"])
            duck_raw = con.execute(f"SELECT {cols} FROM iceberg_scan('{case['metadata']}')").fetchall()
            t = StaticTable.from_metadata(case["metadata"]).scan(selected_fields=tuple(case["columns"])).to_arrow()
            maps = [str(t.schema.field(c).type).startswith("map") for c in case["columns"]]
            py_raw = list(zip(*[t.column(c).to_pylist() for c in case["columns"]]))
            want = json_rows(case["rows"], maps)
            # PyIceberg 0.12 reads a null list<struct<...>> as an empty list
            # (apache/iceberg-python#3833; the file holds a null, as DuckDB
            # and pyarrow read it): for PyIceberg the two compare equal.
            lists_of_structs = ["list<element: struct" in str(t.schema.field(c).type)
                                for c in case["columns"]]
            def blur(rows):
                return sorted(tuple("null" if l and v == "[]" else v for v, l in zip(r, lists_of_structs))
                              for r in rows)
            results = (("duckdb", json_rows(duck_raw, maps)),
                       ("pyiceberg", blur(json_rows(py_raw, maps))))
            want_py = blur(want)
        else:
            want = sorted(tuple(r) for r in case["rows"])
            results = (
                ("duckdb", rows_duckdb(con, case["metadata"], case["columns"])),
                ("pyiceberg", rows_pyiceberg(case["metadata"], case["columns"])),
            )
        for reader, got in results:
            expected = want_py if case.get("json") and reader == "pyiceberg" else want
            ok = got == expected
            report(ok, f"{reader:9} {case['name']} ({len(got)} rows)")
            if not ok:
                print(f"     want {expected[:10]}\n     got  {got[:10]}")
        if "__END_AT" in case["columns"]:
            empty, open_, overlaps = interval_violations(con, case["metadata"], case["keys"])
            ok = (empty, open_, overlaps) == (0, 0, 0)
            interval_checks += 1
            report(ok, f"{'duckdb':9} {case['name']} intervals: "
                       f"{empty} empty, {open_} keys with several open versions, {overlaps} overlaps")
    gk_checks = 0
    for metadata in sys.argv[3:]:
        inp = sys.argv[2]
        # The oracle, computed independently in SQL over the input files.
        oracle = con.execute(
            f"""SELECT order_id, event_type, location_id, ts_seconds, sequence, status, seq FROM (
                  SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY seq DESC) AS rn
                  FROM read_parquet('{inp}/*.parquet') WHERE order_id IS NOT NULL)
                WHERE rn = 1 AND op <> 'DELETE'"""
        ).fetchall()
        want = sorted(tuple(fmt(v) for v in r) for r in oracle)
        cols = ["order_id", "event_type", "location_id", "ts_seconds", "sequence", "status", "seq"]
        for reader, got in (
            ("duckdb", rows_duckdb(con, metadata, cols)),
            ("pyiceberg", rows_pyiceberg(metadata, cols)),
        ):
            ok = got == want
            gk_checks += 1
            table = metadata.split("/metadata/")[0].rsplit("/", 1)[-1]
            report(ok, f"{reader:9} ghost kitchen {table} vs SQL oracle ({len(got)} rows, oracle {len(want)})")
    if failed:
        # The last line: why.
        first = " ".join(failed[0].split())
        sys.exit(f"readers: FAIL: {len(failed)} reader checks failed, the first: {first}")
    print(f"readers: {len(cases) * 2 + interval_checks + gk_checks} passed, 0 failed")


if __name__ == "__main__":
    main()
