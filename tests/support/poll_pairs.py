"""Polls two tables of a wal2iceberg lake through pyiceberg while a
workload writes the same keys to both in each transaction, and counts the
polls that saw a key in the table read first and not in the table read
after it: with commits of both tables at once, none can.

usage: [READ_LAKE_* (lake_catalog.py)] poll_pairs.py <lake folder> <seconds> <namespace.table> <namespace.table>
Prints {"polls": n, "torn": n, "sizes": [distinct sizes seen]} on stdout.
"""
import json
import sys
import time

from lake_catalog import open_catalog

lake, seconds, tables = sys.argv[1], float(sys.argv[2]), sys.argv[3:5]
catalog = open_catalog(lake)


def ids(ident):
    try:
        table = catalog.load_table(ident)
    except Exception:
        return None
    if table.current_snapshot() is None:
        return set()
    return {row["id"] for row in table.scan(selected_fields=("id",)).to_arrow().to_pylist()}


polls = torn = 0
sizes = set()
end = time.monotonic() + seconds
while time.monotonic() < end:
    # Each order in turn: what the first read saw, the second (later) must.
    first, second = tables if polls % 2 == 0 else tables[::-1]
    before = ids(first)
    after = ids(second)
    if before is None or after is None:
        continue
    polls += 1
    sizes.add(len(before))
    if not before <= after:
        torn += 1
print(json.dumps({"polls": polls, "torn": torn, "sizes": sorted(sizes)}))
