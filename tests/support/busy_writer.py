"""A second writer on wal2iceberg's tables, through pyiceberg: for a number
of seconds it keeps committing property changes to each table given, so
that wal2iceberg's commits meet catalog conflicts. Its own lost races are
counted, not errors.

usage: busy_writer.py <lake folder> <seconds> <namespace.table>...
Prints {"committed": n, "lost": n} on stdout.
"""
import json
import sys
import time

from lake_catalog import open_catalog
from pyiceberg.exceptions import CommitFailedException

lake, seconds, tables = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
catalog = open_catalog(lake)
committed = lost = 0
end = time.monotonic() + seconds
tick = 0
while time.monotonic() < end:
    for ident in tables:
        tick += 1
        table = catalog.load_table(ident)
        try:
            with table.transaction() as tx:
                tx.set_properties({"test.busy-writer": str(tick)})
            committed += 1
        except CommitFailedException:
            lost += 1
print(json.dumps({"committed": committed, "lost": lost}))
