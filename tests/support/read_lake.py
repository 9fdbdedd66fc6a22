"""Reads a wal2iceberg lake through pyiceberg, a reader we did not write.

usage: [READ_LAKE_* (lake_catalog.py)] read_lake.py <lake folder> <namespace.table> schema|rows|summary|codecs|canonical|snapshots|verbatim
Rows of a bronze table come sorted by (_cdc_commit_lsn, _cdc_seq).
`canonical` gives the source columns of each row in the form the
reconciliation helper (tests/support/reconcile.rs) compares: temporal values
as integers (days or microseconds since 1970, "infinity" and "-infinity" for
the stored infinities), binary as \\x-hex, decimals as plain text, floats
as exact text (repr, or NaN and the infinities), and a value kept in `_cdc_verbatim` as
{"$verbatim": its text}.
Prints one JSON document on stdout.
"""
import json
import sys

from lake_catalog import open_catalog

lake, ident, mode = sys.argv[1], sys.argv[2], sys.argv[3]
catalog = open_catalog(lake)
table = catalog.load_table(ident)
if mode == "schema":
    schema = table.schema()
    print(json.dumps({
        "fields": [f.name for f in schema.fields],
        "types": {f.name: str(f.field_type) for f in schema.fields},
        # Field ids, of bronze's before image's fields too.
        "ids": {f.name: f.field_id for f in schema.fields},
        "before_ids": {
            c.name: c.field_id
            for f in schema.fields if f.name == "_cdc_before"
            for c in f.field_type.fields
        },
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
elif mode == "canonical":
    import math
    import uuid

    import pyarrow as pa

    def plain(t):
        if pa.types.is_timestamp(t) or pa.types.is_time64(t):
            return pa.int64()
        if pa.types.is_date32(t):
            return pa.int32()
        if pa.types.is_list(t):
            return pa.list_(plain(t.value_type))
        return t

    def canonical(v, t):
        if v is None:
            return None
        if isinstance(v, uuid.UUID):
            return str(v)
        if pa.types.is_timestamp(t) or pa.types.is_date32(t):
            top = 2**63 - 1 if pa.types.is_timestamp(t) else 2**31 - 1
            return "infinity" if v == top else "-infinity" if v == -top else v
        if pa.types.is_floating(t):
            # As exact text: a JSON number would be parsed inexactly.
            if math.isnan(v) or math.isinf(v):
                return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
            return repr(v)
        if pa.types.is_fixed_size_binary(t):
            return str(uuid.UUID(bytes=v))
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return "\\x" + v.hex()
        if pa.types.is_decimal(t):
            return format(v, "f")
        if pa.types.is_list(t):
            return [canonical(x, t.value_type) for x in v]
        return v

    arrow = table.scan().to_arrow()
    names = [n for n in arrow.column_names if not n.startswith("_cdc_")]
    types = {n: arrow.schema.field(n).type for n in names}
    columns = {n: arrow.column(n).cast(plain(types[n])).to_pylist() for n in names}
    rows = [
        {n: canonical(columns[n][i], types[n]) for n in names}
        for i in range(arrow.num_rows)
    ]
    # A value kept verbatim (its column null) is handed over as its text,
    # for the caller to bring to canonical form through PostgreSQL itself.
    if "_cdc_verbatim" in arrow.column_names:
        for row, kept in zip(rows, arrow.column("_cdc_verbatim").to_pylist()):
            for column, text in kept or []:
                if column in row:
                    row[column] = {"$verbatim": text}
    print(json.dumps(rows))
elif mode == "verbatim":
    # The identifier columns and _cdc_verbatim of each row (which the
    # other columns of `rows` may not convert to Python for, infinities).
    key = [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids]
    rows = table.scan(selected_fields=tuple(key) + ("_cdc_verbatim",)).to_arrow().to_pylist()
    print(json.dumps(rows))
elif mode == "summary":
    snapshot = table.current_snapshot()
    print(json.dumps(snapshot.summary.additional_properties if snapshot else None))
elif mode == "snapshots":
    # Every snapshot, oldest first, scanned in full (the identifier columns,
    # deletes applied): its operation, source position, row count and the
    # data and delete files its scan plans.
    key = [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids]
    out = []
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number):
        scan = table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=tuple(key))
        tasks = list(scan.plan_files())
        out.append({
            "operation": str(snapshot.summary.operation.value),
            "commit_lsn": snapshot.summary.additional_properties.get("wal2iceberg.commit-lsn"),
            "rows": scan.to_arrow().num_rows,
            "data_files": len(tasks),
            "delete_files": len({d.file_path for t in tasks for d in t.delete_files}),
            "paths": sorted({t.file.file_path for t in tasks}
                            | {d.file_path for t in tasks for d in t.delete_files}),
        })
    print(json.dumps(out))
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
