"""Full scan of a silver table through pyiceberg, against a scan of the same
rows freshly written as one table, for benches/pipeline.rs and the
500-batch compaction test.

usage: scan_silver.py <lake folder> <namespace.table>
Prints {"rows", "seconds", "fresh_seconds", "data_files", "delete_files",
"bytes"} as JSON; each time is the faster of two scans.
"""
import json
import os
import sys
import tempfile
import time

from pyiceberg.catalog.sql import SqlCatalog


def catalog_in(folder):
    return SqlCatalog(
        "local",
        uri="sqlite:///" + os.path.join(os.path.abspath(folder), "catalog.db"),
        warehouse="file://" + os.path.join(os.path.abspath(folder), "warehouse"),
    )


def fastest_scan(table):
    best, rows = None, None
    for _ in range(2):
        start = time.monotonic()
        rows = table.scan().to_arrow()
        seconds = time.monotonic() - start
        best = seconds if best is None else min(best, seconds)
    return rows, best


lake, ident = sys.argv[1], sys.argv[2]
table = catalog_in(lake).load_table(ident)
rows, seconds = fastest_scan(table)
files = table.inspect.files().to_pylist()

with tempfile.TemporaryDirectory() as scratch:
    os.makedirs(os.path.join(scratch, "warehouse"))
    fresh_catalog = catalog_in(scratch)
    fresh_catalog.create_namespace("fresh")
    fresh = fresh_catalog.create_table("fresh.rows", schema=table.schema())
    fresh.append(rows)
    fresh_rows, fresh_seconds = fastest_scan(fresh_catalog.load_table("fresh.rows"))
    assert fresh_rows.num_rows == rows.num_rows

print(json.dumps({
    "rows": rows.num_rows,
    "seconds": seconds,
    "fresh_seconds": fresh_seconds,
    "data_files": sum(1 for f in files if f["content"] == 0),
    "delete_files": sum(1 for f in files if f["content"] != 0),
    "bytes": sum(f["file_size_in_bytes"] for f in files),
}))
