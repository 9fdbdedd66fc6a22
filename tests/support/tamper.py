"""Changes a silver table behind wal2iceberg's back, through pyiceberg, and
hides it: the new snapshot carries the source position of the one before.

usage: tamper.py <lake folder> <namespace.table> delete <id>
       tamper.py <lake folder> <namespace.table> rewrite <id> <column> <text>
       tamper.py <lake folder> <namespace.table> touch <id>
`delete` removes the row; `rewrite` puts a copy of it with the text column
changed in place of the file's row (a copy-on-write overwrite). `touch`
overwrites the rows of the id with themselves and hides nothing, as another
engine's commit would: its snapshot carries no wal2iceberg position.
"""
import os
import sys

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog

lake, ident, mode, key = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
catalog = SqlCatalog(
    "local",
    uri="sqlite:///" + os.path.join(os.path.abspath(lake), "catalog.db"),
    warehouse="file://" + os.path.join(os.path.abspath(lake), "warehouse"),
)
table = catalog.load_table(ident)
summary = table.current_snapshot().summary.additional_properties
hidden = {k: v for k, v in summary.items() if k.startswith("wal2iceberg.")}
if mode == "delete":
    table.delete(f"id == {key}", snapshot_properties=hidden)
elif mode == "rewrite":
    column, text = sys.argv[5], sys.argv[6]
    rows = table.scan(row_filter=f"id == {key}").to_arrow()
    assert rows.num_rows == 1, rows.num_rows
    index = rows.schema.get_field_index(column)
    changed = rows.set_column(index, rows.schema.field(index), pa.array([text], type=rows.schema.field(index).type))
    table.overwrite(changed, overwrite_filter=f"id == {key}", snapshot_properties=hidden)
elif mode == "touch":
    rows = table.scan(row_filter=f"id == {key}").to_arrow()
    assert rows.num_rows > 0, rows.num_rows
    table.overwrite(rows, overwrite_filter=f"id == {key}")
else:
    sys.exit(f"unknown mode {mode}")
print(pc.sum(pc.equal(table.refresh().scan().to_arrow()["id"], key)).as_py() or 0)
