//! The lake read back through readers we did not write: pyiceberg and
//! DuckDB, run as Python scripts from tests/support.

use serde_json::Value;

/// Runs one of the reader scripts in tests/support; its output as JSON.
async fn read_with(script: &str, args: &[&str]) -> Value {
    read_with_env(script, args, &[]).await
}

/// [`read_with`], with environment variables set.
pub async fn read_with_env(script: &str, args: &[&str], env: &[(&str, String)]) -> Value {
    let script = format!("{}/tests/support/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(crate::support::python())
        .arg(&script)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .await
        .expect("run the readers' python");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from the reader")
}

/// Reads a table through pyiceberg (`mode`: schema, rows, summary, codecs).
pub async fn pyiceberg(lake: &std::path::Path, table: &str, mode: &str) -> Value {
    read_with("read_lake.py", &[&lake.display().to_string(), table, mode]).await
}

/// Changes a silver table behind wal2iceberg's back through pyiceberg
/// (tests/support/tamper.py: `delete <id>`, `rewrite <id> <column>
/// <text>`); how many rows of the key it holds after.
pub async fn tamper(lake: &std::path::Path, table: &str, args: &[&str]) -> Value {
    let lake = lake.display().to_string();
    read_with("tamper.py", &[&[lake.as_str(), table][..], args].concat()).await
}

/// The `_cdc_op` of each row of a bronze table through pyiceberg, in the
/// order it gives them (commit LSN, then seq): `rrud`.
pub async fn bronze_ops(lake: &std::path::Path, table: &str) -> String {
    pyiceberg(lake, table, "rows")
        .await
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["_cdc_op"].as_str().expect("an op"))
        .collect()
}

/// Rows of a table as DuckDB's iceberg extension reads them.
pub async fn duckdb(lake: &std::path::Path, table: &str) -> Value {
    read_with("read_lake_duckdb.py", &[&lake.display().to_string(), table]).await
}

/// A lake whose catalog file is in `lake` and whose warehouse is on S3.
/// A lake the readers reach through settings of its own: a warehouse on
/// S3, a catalog in a PostgreSQL database.
pub struct RemoteLake<'a> {
    pub lake: &'a std::path::Path,
    env: Vec<(&'static str, String)>,
}

impl<'a> RemoteLake<'a> {
    /// The embedded lake in `lake`.
    pub fn embedded(lake: &'a std::path::Path) -> RemoteLake<'a> {
        RemoteLake {
            lake,
            env: Vec::new(),
        }
    }

    /// The lake in `lake` with the readers' settings `env`
    /// (tests/support/lake_catalog.py).
    pub fn with_env(lake: &'a std::path::Path, env: Vec<(&'static str, String)>) -> RemoteLake<'a> {
        RemoteLake { lake, env }
    }

    /// The lake whose catalog is in `lake` and warehouse on `server`.
    pub fn on_s3(
        lake: &'a std::path::Path,
        warehouse: String,
        server: &crate::support::s3::S3Server,
    ) -> RemoteLake<'a> {
        let props: serde_json::Map<String, Value> = server
            .properties()
            .iter()
            .chain(&["s3.region=us-east-1".to_owned()])
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), Value::from(v)))
            .collect();
        let env = vec![
            ("READ_LAKE_WAREHOUSE", warehouse),
            ("READ_LAKE_PROPS", Value::Object(props).to_string()),
        ];
        RemoteLake { lake, env }
    }

    /// The readers' settings, for a reader of its own
    /// (tests/support/lake_catalog.py).
    pub fn into_env(self) -> Vec<(&'static str, String)> {
        self.env
    }

    /// The lake whose catalog is the PostgreSQL database at `uri`, and
    /// warehouse in `lake`.
    pub fn with_catalog(lake: &'a std::path::Path, uri: String) -> RemoteLake<'a> {
        let env = vec![("READ_LAKE_CATALOG_URI", uri)];
        RemoteLake { lake, env }
    }

    /// The same lake, its SQL catalog opened by `name`.
    pub fn named(mut self, name: &str) -> RemoteLake<'a> {
        self.env.push(("READ_LAKE_CATALOG_NAME", name.to_owned()));
        self
    }

    /// [`pyiceberg`], with the lake's settings.
    pub async fn pyiceberg(&self, table: &str, mode: &str) -> Value {
        let lake = self.lake.display().to_string();
        read_with_env("read_lake.py", &[&lake, table, mode], &self.env).await
    }

    /// [`duckdb`], with the lake's settings.
    pub async fn duckdb(&self, table: &str) -> Value {
        let lake = self.lake.display().to_string();
        read_with_env("read_lake_duckdb.py", &[&lake, table], &self.env).await
    }
}

/// The customers every remote-lake test replicates: three rows loaded,
/// then [`change_customers`].
pub async fn create_customers(db: &crate::support::TestDb) {
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, plan text)")
        .await;
    db.exec("INSERT INTO customers VALUES (1, 'Ada', 'free'), (2, 'Grace', 'pro'), (3, 'Linus', 'free')")
        .await;
}

/// `run` of the customers into the lake `place` names, on `slot`.
pub fn customers_run(db: &crate::support::TestDb, slot: &str, place: &[&str]) -> Vec<String> {
    let url = db.config_url();
    [
        "run",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--slot",
        slot,
    ]
    .iter()
    .chain(place)
    .map(|s| (*s).to_owned())
    .collect()
}

/// Silver's (id, plan) pairs after the load of [`create_customers`].
pub fn loaded_customers() -> Vec<(i64, String)> {
    vec![(1, "free".into()), (2, "pro".into()), (3, "free".into())]
}

/// An update, a delete, an insert and an update of a column besides the
/// plan, one transaction each.
pub async fn change_customers(db: &crate::support::TestDb) {
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    db.exec("DELETE FROM customers WHERE id = 3").await;
    db.exec("INSERT INTO customers VALUES (4, 'Barbara', 'free')")
        .await;
    db.exec("UPDATE customers SET name = 'Grace H.' WHERE id = 2")
        .await;
}

impl RemoteLake<'_> {
    /// After [`change_customers`] streamed into `shop`: silver through
    /// both readers, bronze's ops (every change once) through pyiceberg.
    pub async fn assert_customers_changed(&self) {
        let want = vec![(1, "team".into()), (2, "pro".into()), (4, "free".into())];
        assert_eq!(
            id_plan_pairs(&self.pyiceberg("shop.customers", "rows").await),
            want
        );
        assert_eq!(id_plan_pairs(&self.duckdb("shop.customers").await), want);
        assert_eq!(
            self.bronze_ops("shop.customers_changes").await,
            "rrrudcu",
            "bronze holds every change once"
        );
    }

    /// The `_cdc_op` of each row of a bronze table, in commit order.
    pub async fn bronze_ops(&self, table: &str) -> String {
        self.pyiceberg(table, "rows")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["_cdc_op"].as_str().unwrap())
            .collect()
    }
}

/// The (id, plan) pairs of rows, sorted.
pub fn id_plan_pairs(rows: &Value) -> Vec<(i64, String)> {
    let mut pairs: Vec<(i64, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["plan"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

/// The (id, plan) pairs of a table, sorted, through pyiceberg.
pub async fn id_plan_rows(lake: &std::path::Path, table: &str) -> Vec<(i64, String)> {
    id_plan_pairs(&pyiceberg(lake, table, "rows").await)
}
