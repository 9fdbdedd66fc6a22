"""Changes a silver table behind wal2iceberg's back, through pyiceberg, and
hides it: the new snapshot carries the source position of the one before.

usage: tamper.py <lake folder> <namespace.table> delete <id>
       tamper.py <lake folder> <namespace.table> rewrite <id> <column> <text>
       tamper.py <lake folder> <namespace.table> touch <id>
       tamper.py <lake folder> <namespace.table> forget <id>
`delete` removes the row; `rewrite` puts a copy of it with the text column
changed in place of the file's row (a copy-on-write overwrite). `touch`
overwrites the rows of ids from <id> up with themselves and hides nothing,
as another engine's commit would: its snapshot carries no wal2iceberg
position. `forget` removes the source properties a bronze table records
(`wal2iceberg.source-table`, `-oid`, `wal2iceberg.slot`) and its mark
(`wal2iceberg.mark-lsn`), as a bronze made before they were recorded
lacks them.
"""
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from lake_catalog import open_catalog
from pyiceberg.exceptions import CommitFailedException, ValidationException

lake, ident, mode, key = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
catalog = open_catalog(lake)
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
    # Beside a running run, whose commits may come first: tried again on
    # the table as it is then, for up to two minutes (a loaded machine
    # makes each try slow, and the run's commits more likely between).
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        try:
            within = f"id >= {key}"
            rows = table.scan(row_filter=within).to_arrow()
            if rows.num_rows > 0:
                table.overwrite(rows, overwrite_filter=within)
                break
            # A writer's truncate just emptied it: rows come back.
            time.sleep(0.2)
        except (CommitFailedException, ValidationException):
            pass
        table = catalog.load_table(ident)
    else:
        sys.exit("the table kept changing under the overwrite")
elif mode == "forget":
    with table.transaction() as tx:
        tx.remove_properties(
            "wal2iceberg.source-table", "wal2iceberg.source-oid", "wal2iceberg.slot", "wal2iceberg.mark-lsn"
        )
else:
    sys.exit(f"unknown mode {mode}")
print(pc.sum(pc.equal(table.refresh().scan().to_arrow()["id"], key)).as_py() or 0)
