//! The lake read back through readers we did not write: pyiceberg and
//! DuckDB, run as Python scripts from tests/support.

use serde_json::Value;

/// Runs one of the reader scripts in tests/support; its output as JSON.
async fn read_with(script: &str, args: &[&str]) -> Value {
    read_with_env(script, args, &[]).await
}

/// [`read_with`], with environment variables set.
async fn read_with_env(script: &str, args: &[&str], env: &[(&str, String)]) -> Value {
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
pub struct S3Lake<'a> {
    pub lake: &'a std::path::Path,
    pub warehouse: String,
    pub server: &'a crate::support::s3::S3Server,
}

impl S3Lake<'_> {
    fn env(&self) -> Vec<(&'static str, String)> {
        let props: serde_json::Map<String, Value> = self
            .server
            .properties()
            .iter()
            .chain(&["s3.region=us-east-1".to_owned()])
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), Value::from(v)))
            .collect();
        vec![
            ("READ_LAKE_WAREHOUSE", self.warehouse.clone()),
            ("READ_LAKE_PROPS", Value::Object(props).to_string()),
        ]
    }

    /// [`pyiceberg`], reading from S3.
    pub async fn pyiceberg(&self, table: &str, mode: &str) -> Value {
        let lake = self.lake.display().to_string();
        read_with_env("read_lake.py", &[&lake, table, mode], &self.env()).await
    }

    /// [`duckdb`], reading from S3.
    pub async fn duckdb(&self, table: &str) -> Value {
        let lake = self.lake.display().to_string();
        read_with_env("read_lake_duckdb.py", &[&lake, table], &self.env()).await
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
