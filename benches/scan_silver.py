"""Full scan of a silver table through pyiceberg, against a scan of the same
rows freshly written as one table, for benches/pipeline/main.rs and the
500-batch compaction test.

usage: scan_silver.py <lake folder> <namespace.table>
Prints {"rows", "seconds", "fresh_seconds", "data_files", "delete_files",
"bytes"} as JSON. The first scan (which gives the rows to write) warms the
process up and is not timed; then the two tables are scanned in turn, three
times each, and each time is the fastest of its three: timed one after the
other, the table scanned first paid the warm-up, and single scans moved by
half between runs.
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


def timed_scan(table):
    start = time.monotonic()
    rows = table.scan().to_arrow()
    return rows, time.monotonic() - start


lake, ident = sys.argv[1], sys.argv[2]
table = catalog_in(lake).load_table(ident)
rows, _ = timed_scan(table)
files = table.inspect.files().to_pylist()

with tempfile.TemporaryDirectory() as scratch:
    os.makedirs(os.path.join(scratch, "warehouse"))
    fresh_catalog = catalog_in(scratch)
    fresh_catalog.create_namespace("fresh")
    fresh_catalog.create_table("fresh.rows", schema=table.schema()).append(rows)
    fresh = fresh_catalog.load_table("fresh.rows")
    seconds, fresh_seconds = float("inf"), float("inf")
    for _ in range(3):
        silver_rows, scanned = timed_scan(table)
        seconds = min(seconds, scanned)
        fresh_rows, scanned = timed_scan(fresh)
        fresh_seconds = min(fresh_seconds, scanned)
        assert silver_rows.num_rows == fresh_rows.num_rows == rows.num_rows

print(json.dumps({
    "rows": rows.num_rows,
    "seconds": seconds,
    "fresh_seconds": fresh_seconds,
    "data_files": sum(1 for f in files if f["content"] == 0),
    "delete_files": sum(1 for f in files if f["content"] != 0),
    "bytes": sum(f["file_size_in_bytes"] for f in files),
}))
