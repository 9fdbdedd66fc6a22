"""Reads a wal2iceberg table through DuckDB's iceberg extension, a second
reader we did not write. Extensions load offline from their PyPI packages.

usage: [READ_LAKE_PROPS={...}] [READ_LAKE_CATALOG_URI=postgresql://...|http://...] read_lake_duckdb.py <lake folder> <namespace.table>
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
# The table's metadata file, from the catalog: the SQLite file, or the
# PostgreSQL database in READ_LAKE_CATALOG_URI (through psycopg2), or the
# REST catalog there (its loadTable answer, through the standard library),
# or Glue's GetTable (through boto3) when READ_LAKE_CATALOG_TYPE is glue.
query = (
    "SELECT metadata_location FROM iceberg_tables"
    " WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?"
)
catalog_name = os.environ.get("READ_LAKE_CATALOG_NAME", "local")
pg_catalog = os.environ.get("READ_LAKE_CATALOG_URI")
if os.environ.get("READ_LAKE_CATALOG_TYPE") == "glue":
    import boto3

    from lake_catalog import glue_properties

    glue_props = glue_properties(pg_catalog, json.loads(os.environ.get("READ_LAKE_PROPS", "{}")))
    glue = boto3.client(
        "glue",
        endpoint_url=glue_props["glue.endpoint"],
        region_name=glue_props["glue.region"],
        aws_access_key_id=glue_props["glue.access-key-id"],
        aws_secret_access_key=glue_props["glue.secret-access-key"],
    )
    found = glue.get_table(DatabaseName=namespace, Name=table)
    location = found["Table"]["Parameters"]["metadata_location"]
elif pg_catalog and pg_catalog.startswith(("http://", "https://")):
    import urllib.parse
    import urllib.request

    # A credential in READ_LAKE_PROPS is exchanged for a token, as pyiceberg
    # does: OAuth2's client credentials grant at oauth2-server-uri.
    props = json.loads(os.environ.get("READ_LAKE_PROPS", "{}"))
    headers = {}
    if "credential" in props:
        client_id, client_secret = props["credential"].split(":", 1)
        form = urllib.parse.urlencode(
            {"grant_type": "client_credentials", "client_id": client_id,
             "client_secret": client_secret, "scope": props.get("scope", "catalog")}
        ).encode()
        with urllib.request.urlopen(props["oauth2-server-uri"], data=form) as response:
            headers["Authorization"] = "Bearer " + json.load(response)["access_token"]

    def get(path):
        request = urllib.request.Request(pg_catalog.rstrip("/") + "/v1/" + path, headers=headers)
        with urllib.request.urlopen(request) as response:
            return json.load(response)

    config = get("config")
    prefix = config.get("overrides", {}).get("prefix") or config.get("defaults", {}).get("prefix")
    path = "/".join(
        [*([prefix] if prefix else []), "namespaces", urllib.parse.quote(namespace, safe=""),
         "tables", urllib.parse.quote(table, safe="")]
    )
    location = get(path)["metadata-location"]
elif pg_catalog:
    import psycopg2

    with psycopg2.connect(pg_catalog) as catalog, catalog.cursor() as cursor:
        cursor.execute(query.replace("?", "%s"), (catalog_name, namespace, table))
        (location,) = cursor.fetchone()
else:
    catalog = sqlite3.connect(os.path.join(lake, "catalog.db"))
    (location,) = catalog.execute(query, (catalog_name, namespace, table)).fetchone()

con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
extensions = [(duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")]
# A warehouse on S3: its catalog properties as a JSON object in READ_LAKE_PROPS.
props = json.loads(os.environ.get("READ_LAKE_PROPS", "{}"))
on_s3 = "s3.endpoint" in props
if on_s3:
    import duckdb_extension_httpfs

    extensions.insert(0, (duckdb_extension_httpfs, "httpfs"))
for package, name in extensions:
    folder = os.path.dirname(package.__file__)
    (path,) = glob.glob(os.path.join(folder, "extensions", "v*", f"{name}.duckdb_extension"))
    con.execute(f"LOAD '{path}'")
if on_s3:
    endpoint = props["s3.endpoint"]
    con.execute(
        "CREATE SECRET lake (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?,"
        " URL_STYLE 'path', USE_SSL ?)",
        [
            props["s3.access-key-id"],
            props["s3.secret-access-key"],
            props.get("s3.region", "us-east-1"),
            endpoint.split("://", 1)[1],
            endpoint.startswith("https://"),
        ],
    )
rows = con.execute(
    "SELECT * FROM iceberg_scan(?)", [location.removeprefix("file://")]
).fetch_arrow_table().to_pylist()
print(json.dumps(rows, default=str))
