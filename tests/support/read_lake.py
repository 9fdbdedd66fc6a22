"""Reads a wal2iceberg lake through pyiceberg, a reader we did not write.

usage: read_lake.py <lake folder> <namespace.table> schema|rows
Prints one JSON document on stdout.
"""
import json
import os
import sys

from pyiceberg.catalog.sql import SqlCatalog

lake, ident, mode = sys.argv[1], sys.argv[2], sys.argv[3]
catalog = SqlCatalog(
    "local",
    uri="sqlite:///" + os.path.join(os.path.abspath(lake), "catalog.db"),
    warehouse="file://" + os.path.join(os.path.abspath(lake), "warehouse"),
)
table = catalog.load_table(ident)
if mode == "schema":
    schema = table.schema()
    print(json.dumps({
        "fields": [f.name for f in schema.fields],
        "types": {f.name: str(f.field_type) for f in schema.fields},
        "required": [f.name for f in schema.fields if f.required],
        "identifier": sorted(schema.find_column_name(i) for i in schema.identifier_field_ids),
        "format_version": table.format_version,
        "compression": table.properties.get("write.parquet.compression-codec"),
    }))
elif mode == "rows":
    rows = table.scan().to_arrow().to_pylist()
    print(json.dumps(rows, default=str))
else:
    sys.exit(f"unknown mode {mode}")
