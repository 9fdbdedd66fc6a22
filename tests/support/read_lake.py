"""Reads a wal2iceberg lake through pyiceberg, a reader we did not write.

usage: read_lake.py <lake folder> <namespace.table> schema|rows|summary|codecs
Rows of a bronze table come sorted by (_cdc_commit_lsn, _cdc_seq).
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
    if rows and "_cdc_seq" in rows[0]:
        rows.sort(key=lambda r: (r["_cdc_commit_lsn"], r["_cdc_seq"]))
    print(json.dumps(rows, default=str))
elif mode == "summary":
    snapshot = table.current_snapshot()
    print(json.dumps(snapshot.summary.additional_properties if snapshot else None))
elif mode == "codecs":
    import pyarrow.parquet as pq
    codecs = set()
    for task in table.scan().plan_files():
        meta = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                codecs.add(meta.row_group(g).column(c).compression)
    print(json.dumps(sorted(codecs)))
else:
    sys.exit(f"unknown mode {mode}")
