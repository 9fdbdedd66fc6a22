"""The catalog of a wal2iceberg lake, through pyiceberg, for the test
helpers beside this file. By default the embedded lake's SQLite catalog in
<lake>/catalog.db, warehouse <lake>/warehouse. From the environment:
READ_LAKE_CATALOG_URI, a PostgreSQL database's URL (read through
SQLAlchemy's psycopg2 driver) or a REST catalog's http:// URI;
READ_LAKE_WAREHOUSE, a warehouse on S3; READ_LAKE_PROPS, the catalog
properties (s3.endpoint, ...) as a JSON object; READ_LAKE_CATALOG_NAME, a
SQL catalog's name (local by default).
"""
import json
import os


def open_catalog(lake):
    uri = os.environ.get("READ_LAKE_CATALOG_URI")
    props = json.loads(os.environ.get("READ_LAKE_PROPS", "{}"))
    if uri and uri.startswith(("http://", "https://")):
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("rest", uri=uri, **props)
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        os.environ.get("READ_LAKE_CATALOG_NAME", "local"),
        uri=(
            "postgresql+psycopg2://" + uri.split("://", 1)[1]
            if uri
            else "sqlite:///" + os.path.join(os.path.abspath(lake), "catalog.db")
        ),
        warehouse=os.environ.get(
            "READ_LAKE_WAREHOUSE", "file://" + os.path.join(os.path.abspath(lake), "warehouse")
        ),
        **props,
    )
