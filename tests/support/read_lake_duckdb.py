"""Reads a wal2iceberg table through DuckDB's iceberg extension, a second
reader we did not write. Extensions load offline from their PyPI packages.

usage: read_lake_duckdb.py <lake folder> <namespace.table>
Prints the rows as one JSON list on stdout.
"""
import glob
import json
import os
import sqlite3
import sys

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg

lake, ident = sys.argv[1], sys.argv[2]
namespace, table = ident.rsplit(".", 1)
catalog = sqlite3.connect(os.path.join(lake, "catalog.db"))
(location,) = catalog.execute(
    "SELECT metadata_location FROM iceberg_tables"
    " WHERE catalog_name = 'local' AND table_namespace = ? AND table_name = ?",
    (namespace, table),
).fetchone()

con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
for package, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
    folder = os.path.dirname(package.__file__)
    (path,) = glob.glob(os.path.join(folder, "extensions", "v*", f"{name}.duckdb_extension"))
    con.execute(f"LOAD '{path}'")
rows = con.execute(
    "SELECT * FROM iceberg_scan(?)", [location.removeprefix("file://")]
).fetch_arrow_table().to_pylist()
print(json.dumps(rows, default=str))
