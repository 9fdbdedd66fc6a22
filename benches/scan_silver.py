"""Full scan of a silver table through pyiceberg, for benches/pipeline.rs.

usage: scan_silver.py <lake folder> <namespace.table>
Prints {"rows", "seconds", "data_files", "delete_files", "bytes"} as JSON.
"""
import json
import os
import sys
import time

from pyiceberg.catalog.sql import SqlCatalog

lake, ident = sys.argv[1], sys.argv[2]
catalog = SqlCatalog(
    "local",
    uri="sqlite:///" + os.path.join(os.path.abspath(lake), "catalog.db"),
    warehouse="file://" + os.path.join(os.path.abspath(lake), "warehouse"),
)
table = catalog.load_table(ident)
start = time.monotonic()
rows = table.scan().to_arrow().num_rows
seconds = time.monotonic() - start
files = table.inspect.files().to_pylist()
print(json.dumps({
    "rows": rows,
    "seconds": seconds,
    "data_files": sum(1 for f in files if f["content"] == 0),
    "delete_files": sum(1 for f in files if f["content"] != 0),
    "bytes": sum(f["file_size_in_bytes"] for f in files),
}))
