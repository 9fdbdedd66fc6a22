"""The load phase's peer reference (docs/benchmarks.md): DuckDB's postgres
extension reads one PostgreSQL table and writes it as one zstd Parquet
file. Prints the COPY statement's wall time and the file's rows as JSON.

Usage: duckdb_load.py <postgres url> <schema.table> <parquet file>
"""

import json
import os
import shutil
import sys
import tempfile
import time

import duckdb
import duckdb_extension_postgres

url, table, out = sys.argv[1:4]
shipped = os.path.join(
    os.path.dirname(duckdb_extension_postgres.__file__),
    "extensions",
    f"v{duckdb.__version__}",
    "postgres.duckdb_extension",
)
with tempfile.TemporaryDirectory() as folder:
    # DuckDB finds an extension's entry point by the file's name, and this
    # one's is postgres_scanner's.
    extension = os.path.join(folder, "postgres_scanner.duckdb_extension")
    shutil.copyfile(shipped, extension)
    con = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
    )
    con.execute(f"LOAD '{extension}'")
    con.execute(f"ATTACH '{url}' AS pg (TYPE postgres, READ_ONLY)")
    start = time.perf_counter()
    con.execute(
        f"COPY (SELECT * FROM pg.{table}) TO '{out}' (FORMAT parquet, COMPRESSION zstd)"
    )
    seconds = time.perf_counter() - start
    rows = con.execute(f"SELECT count(*) FROM '{out}'").fetchone()[0]
print(json.dumps({"seconds": seconds, "rows": rows, "bytes": os.path.getsize(out)}))
