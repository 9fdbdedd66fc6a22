"""The catalog of a wal2iceberg lake, through pyiceberg, for the test
helpers beside this file. By default the embedded lake's SQLite catalog in
<lake>/catalog.db, warehouse <lake>/warehouse. From the environment:
READ_LAKE_CATALOG_URI, a PostgreSQL database's URL (read through
SQLAlchemy's psycopg2 driver) or a REST catalog's http:// URI;
READ_LAKE_WAREHOUSE, a warehouse on S3; READ_LAKE_PROPS, the catalog
properties (s3.endpoint, ...) as a JSON object; READ_LAKE_CATALOG_NAME, a
SQL catalog's name (local by default); READ_LAKE_CATALOG_TYPE=glue, AWS
Glue's API at READ_LAKE_CATALOG_URI (moto's server), with the S3
credential and region of READ_LAKE_PROPS.
"""
import json
import os


def open_catalog(lake):
    uri = os.environ.get("READ_LAKE_CATALOG_URI")
    props = json.loads(os.environ.get("READ_LAKE_PROPS", "{}"))
    if os.environ.get("READ_LAKE_CATALOG_TYPE") == "glue":
        from pyiceberg.catalog.glue import GlueCatalog

        return GlueCatalog("glue", **glue_properties(uri, props), **props)
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


def glue_properties(endpoint, props):
    """pyiceberg's Glue settings for the API at `endpoint`, with the S3
    credential and region of `props`."""
    return {
        "glue.endpoint": endpoint,
        "glue.region": props.get("s3.region", "us-east-1"),
        "glue.access-key-id": props["s3.access-key-id"],
        "glue.secret-access-key": props["s3.secret-access-key"],
    }
