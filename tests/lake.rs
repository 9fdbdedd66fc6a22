//! The embedded lake, read back through pyiceberg.

use iceberg::TableIdent;
use serde_json::{Value, json};
use wal2iceberg::lake::catalog::{Lake, namespace};
use wal2iceberg::lake::schema::{bronze_schema, silver_schema};

use crate::support::*;

#[tokio::test]
async fn silver_and_bronze_tables_are_created_as_pyiceberg_reads_them() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, amount numeric(12,2), tags text[])")
        .await;
    db.exec("INSERT INTO customers VALUES (1, 'Ada', 1.50, '{a}')")
        .await;
    let mut options = db.options(&["customers"]);
    options.temporary_slot = true;
    let (load, stream) = open_fresh(&db, &options).await;
    stream.stop().await.unwrap();
    let relation = changes(&load)[0].relation.clone();

    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open_embedded(dir.path()).await.unwrap();
    let shop = namespace("shop");
    let silver = TableIdent::new(shop.clone(), "customers".into());
    let bronze = TableIdent::new(shop, "customers_changes".into());
    lake.ensure_table(&silver, silver_schema(&relation).unwrap())
        .await
        .unwrap();
    lake.ensure_table(&bronze, bronze_schema(&relation).unwrap())
        .await
        .unwrap();
    // Opening again finds them instead of failing.
    let again = Lake::open_embedded(dir.path()).await.unwrap();
    again
        .ensure_table(&silver, silver_schema(&relation).unwrap())
        .await
        .unwrap();

    let s = pyiceberg(dir.path(), "shop.customers", "schema").await;
    assert_eq!(
        s["fields"],
        json!([
            "id",
            "name",
            "amount",
            "tags",
            "_cdc_commit_lsn",
            "_cdc_commit_ts",
            "_cdc_verbatim"
        ])
    );
    assert_eq!(s["identifier"], json!(["id"]));
    assert_eq!(s["types"]["amount"], json!("decimal(12, 2)"));
    assert_eq!(s["format_version"], json!(2));
    assert_eq!(s["compression"], json!("zstd"));
    let b = pyiceberg(dir.path(), "shop.customers_changes", "schema").await;
    assert_eq!(b["fields"][5], json!("_cdc_op"));
    let fields = b["fields"].as_array().unwrap();
    assert_eq!(
        fields[fields.len() - 2..],
        [json!("_cdc_before"), json!("_cdc_verbatim")]
    );
    assert_eq!(
        pyiceberg(dir.path(), "shop.customers", "rows").await,
        json!([])
    );
}

async fn append_changes(
    lake: &Lake,
    table: iceberg::table::Table,
    events: &[wal2iceberg::cdc::event::Event],
) -> iceberg::table::Table {
    use wal2iceberg::lake::catalog::row_delta::{RowDelta, commit_row_delta};
    use wal2iceberg::lake::files::writer;
    use wal2iceberg::lake::table::bronze::bronze_batch;
    let c = changes(events);
    let last = c.last().expect("changes").tx.commit_lsn;
    let batch = bronze_batch(&writer::arrow_schema(&table).unwrap(), &c).unwrap();
    let delta = RowDelta {
        data_files: writer::write_data_files(&table, batch).await.unwrap(),
        properties: writer::Position {
            commit_lsn: last,
            end_lsn: last,
            commit_ts: 0,
        }
        .summary(),
        ..RowDelta::default()
    };
    commit_row_delta(lake, table.identifier(), &delta)
        .await
        .unwrap()
}

#[tokio::test]
async fn bronze_keeps_every_change_in_order_with_its_before_image_and_position() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
         ALTER TABLE customers REPLICA IDENTITY FULL;
         INSERT INTO customers VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');
         CREATE TABLE plain(id int PRIMARY KEY, name text, plan text);
         INSERT INTO plain VALUES (3,'Linus','free');",
    )
    .await;
    let (load, mut stream) = open_fresh(&db, &db.options(&["customers", "plain"])).await;
    let relation = changes(&load)[0].relation.clone();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open_embedded(dir.path()).await.unwrap();
    let ident = TableIdent::new(namespace("shop"), "customers_changes".into());
    let table = lake
        .ensure_table(&ident, bronze_schema(&relation).unwrap())
        .await
        .unwrap();
    let loaded: Vec<_> = load
        .iter()
        .filter(|e| !matches!(e, wal2iceberg::cdc::event::Event::Change(c) if c.relation.name.name != "customers"))
        .cloned()
        .collect();
    let table = append_changes(&lake, table, &loaded).await;

    for sql in SEED_CHANGES {
        db.exec(sql).await;
    }
    let events = read_commits(&mut stream, 4).await;
    let last_commit = changes(&events).last().unwrap().tx.commit_lsn;
    let table = append_changes(&lake, table, &events).await;
    assert_eq!(
        wal2iceberg::lake::files::writer::Position::of(&table)
            .unwrap()
            .map(|p| p.commit_lsn),
        Some(last_commit)
    );

    let rows = pyiceberg(dir.path(), "shop.customers_changes", "rows").await;
    let rows = rows.as_array().unwrap();
    let ops: String = rows
        .iter()
        .map(|r| r["_cdc_op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, "rrruudc");
    let plans: Vec<&str> = rows.iter().map(|r| r["plan"].as_str().unwrap()).collect();
    assert_eq!(
        plans,
        ["free", "pro", "free", "pro", "team", "free", "free"]
    );
    assert_eq!(
        rows[0]["_cdc_before"],
        Value::Null,
        "the load has no before image"
    );
    assert_eq!(rows[3]["_cdc_before"]["_cdc_image"], json!("full"));
    assert_eq!(rows[3]["_cdc_before"]["plan"], json!("free"));
    assert_eq!(rows[3]["_cdc_before"]["_cdc_not_sent"], json!([]));
    assert_eq!(
        rows[5]["name"],
        json!("Linus"),
        "a delete shows the row it removed"
    );
    assert_eq!(rows[6]["id"], json!(4));
    assert!(rows[3]["_cdc_commit_lsn"].as_i64() < rows[4]["_cdc_commit_lsn"].as_i64());
    let summary = pyiceberg(dir.path(), "shop.customers_changes", "summary").await;
    assert_eq!(
        summary["wal2iceberg.commit-lsn"],
        json!(last_commit.0.to_string())
    );
    assert_eq!(
        pyiceberg(dir.path(), "shop.customers_changes", "codecs").await,
        json!(["ZSTD"])
    );

    // Under REPLICA IDENTITY DEFAULT a delete carries the key only: the
    // other columns are null and named as not sent.
    let plain = changes(&load)
        .iter()
        .find(|c| c.relation.name.name == "plain")
        .unwrap()
        .relation
        .clone();
    let ident = TableIdent::new(namespace("shop"), "plain_changes".into());
    let table = lake
        .ensure_table(&ident, bronze_schema(&plain).unwrap())
        .await
        .unwrap();
    db.exec("DELETE FROM plain WHERE id = 3").await;
    let events = read_commits(&mut stream, 1).await;
    append_changes(&lake, table, &events).await;
    let rows = pyiceberg(dir.path(), "shop.plain_changes", "rows").await;
    let delete = &rows[0];
    assert_eq!(delete["_cdc_op"], json!("d"));
    assert_eq!(delete["id"], json!(3));
    assert_eq!(delete["name"], Value::Null);
    assert_eq!(delete["_cdc_before"]["_cdc_image"], json!("key"));
    assert_eq!(
        delete["_cdc_before"]["_cdc_not_sent"],
        json!(["name", "plan"])
    );
    stream.stop().await.unwrap();
}

mod row_delta {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::{ArrayRef, RecordBatch};
    use iceberg::TableIdent;
    use serde_json::json;
    use wal2iceberg::cdc::relation::{ColumnInfo, RelationInfo};
    use wal2iceberg::cdc::temporal::MaybeInfinite;
    use wal2iceberg::cdc::value::{PgType, Value};
    use wal2iceberg::lake::catalog::row_delta::{RowDelta, commit_row_delta};
    use wal2iceberg::lake::catalog::{Lake, namespace};
    use wal2iceberg::lake::files::arrow::build_array;
    use wal2iceberg::lake::files::position_deletes::write_position_deletes;
    use wal2iceberg::lake::files::writer::{arrow_schema, write_data_files};
    use wal2iceberg::lake::schema::silver_schema;
    use wal2iceberg::model::TableName;

    use crate::support::pyiceberg;

    use super::id_plan_rows;

    fn relation() -> RelationInfo {
        let column = |name: &str, pg_type, is_primary_key| ColumnInfo {
            name: name.to_owned(),
            type_oid: 0,
            type_modifier: -1,
            pg_type,
            is_identity_key: is_primary_key,
            is_primary_key,
            has_default: false,
            attnum: None,
        };
        RelationInfo {
            oid: 1,
            name: TableName::parse("public.customers").unwrap(),
            replica_identity: b'd',
            columns: vec![
                column("id", PgType::Int4, true),
                column("plan", PgType::Text, false),
            ],
            has_primary_key: true,
        }
    }

    /// Silver rows (id, plan) written at commit LSN `lsn`.
    fn batch(schema: &Arc<arrow_schema::Schema>, rows: &[(i32, &str)], lsn: i64) -> RecordBatch {
        let values: Vec<[Value; 4]> = rows
            .iter()
            .map(|(id, plan)| {
                [
                    Value::Int4(*id),
                    Value::Text((*plan).to_owned()),
                    Value::Int8(lsn),
                    Value::TimestampTz(MaybeInfinite::Finite(0)),
                ]
            })
            .collect();
        let mut columns: Vec<ArrayRef> = (0..4)
            .map(|i| {
                let cells: Vec<Option<&Value>> = values.iter().map(|row| Some(&row[i])).collect();
                build_array(schema.field(i), &cells).unwrap()
            })
            .collect();
        columns.push(arrow_array::new_null_array(
            schema.field(4).data_type(),
            rows.len(),
        ));
        RecordBatch::try_new(schema.clone(), columns).unwrap()
    }

    /// A new lake with an empty silver `shop.customers`.
    async fn empty_customers(
        dir: &std::path::Path,
    ) -> (
        Lake,
        TableIdent,
        iceberg::table::Table,
        Arc<arrow_schema::Schema>,
    ) {
        let lake = Lake::open_embedded(dir).await.unwrap();
        let ident = TableIdent::new(namespace("shop"), "customers".into());
        let table = lake
            .ensure_table(&ident, silver_schema(&relation()).unwrap())
            .await
            .unwrap();
        let schema = arrow_schema(&table).unwrap();
        (lake, ident, table, schema)
    }

    fn at(lsn: i64) -> HashMap<String, String> {
        HashMap::from([("wal2iceberg.commit-lsn".to_owned(), lsn.to_string())])
    }

    #[tokio::test]
    async fn one_snapshot_deletes_rows_by_position_and_adds_their_new_versions() {
        let dir = tempfile::tempdir().unwrap();
        let (lake, ident, table, schema) = empty_customers(dir.path()).await;

        let files = write_data_files(
            &table,
            batch(&schema, &[(1, "free"), (2, "pro"), (3, "free")], 10),
        )
        .await
        .unwrap();
        let first_file = files[0].file_path().to_owned();
        let delta = RowDelta {
            data_files: files,
            delete_files: vec![],
            properties: at(10),
            ..RowDelta::default()
        };
        let table = commit_row_delta(&lake, &ident, &delta).await.unwrap();
        assert_eq!(
            table
                .metadata()
                .current_snapshot()
                .unwrap()
                .sequence_number(),
            1
        );

        // Ada (row 0) moves to team, Linus (row 2) is deleted.
        let first_file: std::sync::Arc<str> = first_file.into();
        let deletes =
            write_position_deletes(&table, vec![(first_file.clone(), 2), (first_file, 0)])
                .await
                .unwrap();
        let added = write_data_files(&table, batch(&schema, &[(1, "team")], 20))
            .await
            .unwrap();
        let delta = RowDelta {
            data_files: added,
            delete_files: vec![deletes],
            properties: at(20),
            ..RowDelta::default()
        };
        let table = commit_row_delta(&lake, &ident, &delta).await.unwrap();
        let snapshot = table.metadata().current_snapshot().unwrap();
        assert_eq!(snapshot.sequence_number(), 2);

        let got = id_plan_rows(dir.path(), "shop.customers").await;
        assert_eq!(got, [(1, "team".to_owned()), (2, "pro".to_owned())]);

        let summary = pyiceberg(dir.path(), "shop.customers", "summary").await;
        assert_eq!(summary["wal2iceberg.commit-lsn"], json!("20"));
        assert_eq!(summary["total-records"], json!("4"));
        assert_eq!(summary["total-data-files"], json!("2"));
        assert_eq!(summary["total-delete-files"], json!("1"));
        assert_eq!(summary["total-position-deletes"], json!("2"));
        assert_eq!(summary["added-position-deletes"], json!("2"));
    }

    #[tokio::test]
    async fn concurrent_commits_both_land_one_after_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let (lake, ident, table, schema) = empty_customers(dir.path()).await;
        let a = RowDelta {
            data_files: write_data_files(&table, batch(&schema, &[(1, "a")], 1))
                .await
                .unwrap(),
            ..RowDelta::default()
        };
        let b = RowDelta {
            data_files: write_data_files(&table, batch(&schema, &[(2, "b")], 2))
                .await
                .unwrap(),
            ..RowDelta::default()
        };
        let (ra, rb) = tokio::join!(
            commit_row_delta(&lake, &ident, &a),
            commit_row_delta(&lake, &ident, &b)
        );
        ra.unwrap();
        rb.unwrap();
        let rows = pyiceberg(dir.path(), "shop.customers", "rows").await;
        assert_eq!(rows.as_array().unwrap().len(), 2, "{rows}");
        let summary = pyiceberg(dir.path(), "shop.customers", "summary").await;
        assert_eq!(summary["total-records"], json!("2"));
    }
}

mod silver {
    use std::sync::Arc;

    use iceberg::TableIdent;
    use serde_json::json;
    use wal2iceberg::cdc::event::Event;
    use wal2iceberg::lake::catalog::{Lake, namespace};
    use wal2iceberg::lake::files::writer::Position;
    use wal2iceberg::lake::table::silver::SilverTable;

    use super::id_plan_rows;
    use crate::support::*;

    fn pairs(rows: &[(i64, &str)]) -> Vec<(i64, String)> {
        rows.iter().map(|(i, p)| (*i, (*p).to_owned())).collect()
    }

    /// Silver of `public.<table>` in a new lake, loaded from a fresh slot's
    /// initial load; the lake's folder, the lake, silver and the stream
    /// after the load.
    async fn loaded_silver(
        db: &TestDb,
        table: &str,
    ) -> (
        tempfile::TempDir,
        Lake,
        SilverTable,
        wal2iceberg::cdc::stream::ChangeStream,
    ) {
        let (load, stream) = open_fresh(db, &db.options(&[table])).await;
        let relation = changes(&load)[0].relation.clone();
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open_embedded(dir.path()).await.unwrap();
        let ident = TableIdent::new(namespace("shop"), table.into());
        let mut silver = SilverTable::open(&lake, ident, &relation).await.unwrap();
        apply(&mut silver, &lake, &load).await;
        (dir, lake, silver, stream)
    }

    async fn apply(silver: &mut SilverTable, lake: &Lake, events: &[Event]) {
        for change in changes(events) {
            let mut change = change.clone();
            silver.fill_unchanged(lake, &mut change).await.unwrap();
            let bytes = change.approx_bytes();
            silver.stage(lake, Arc::new(change), bytes).await.unwrap();
        }
        let position = events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Commit { tx, end_lsn } => Some(Position {
                    commit_lsn: tx.commit_lsn,
                    end_lsn: *end_lsn,
                    commit_ts: tx.commit_ts,
                }),
                _ => None,
            })
            .unwrap();
        silver.commit(lake, position).await.unwrap();
    }

    /// A DELETE of most rows in one transaction, with the batch holding
    /// at most 300 deletes in memory: they go to several delete files of
    /// the one snapshot, which pyiceberg and DuckDB read as the source.
    #[tokio::test]
    async fn a_bulk_delete_goes_to_delete_files_as_it_grows() {
        let db = TestDb::new().await;
        db.exec(
            "CREATE TABLE accounts(id int PRIMARY KEY, plan text NOT NULL);
             INSERT INTO accounts SELECT g, 'free' FROM generate_series(1, 1000) g;",
        )
        .await;
        let (dir, lake, mut silver, mut stream) = loaded_silver(&db, "accounts").await;
        silver.hold_deletes(300);
        // One transaction (a multi-statement query is one).
        db.exec("DELETE FROM accounts WHERE id % 10 <> 0; UPDATE accounts SET plan = 'kept'")
            .await;
        let events = read_commits(&mut stream, 1).await;
        apply(&mut silver, &lake, &events).await;
        stream.stop().await.unwrap();

        let (snapshots, rows) = snapshots_and_rows(dir.path()).await;
        assert_eq!(rows.last(), Some(&100), "{snapshots:?}");
        let delete_files = snapshots.last().unwrap()["delete_files"].as_u64().unwrap();
        assert!(
            delete_files >= 3,
            "1,000 deletes held 300 at a time: {delete_files} delete files"
        );
        let mut read = id_plan_rows(dir.path(), "shop.accounts").await;
        read.sort();
        let expected: Vec<(i64, String)> = (1..=100).map(|i| (i * 10, "kept".to_owned())).collect();
        assert_eq!(read, expected);
        let duck = duckdb(dir.path(), "shop.accounts").await;
        assert_eq!(duck.as_array().unwrap().len(), 100, "{duck}");
        assert_reconciled(&db, "accounts", dir.path(), "shop.accounts").await;
    }

    #[tokio::test]
    async fn compaction_keeps_the_files_few_and_every_snapshot_readable() {
        compaction_run(120).await;
    }

    /// Issue 7's acceptance run: 500 batches. About 5 minutes in a debug
    /// build, most of it commits slowing down as snapshots pile up (the
    /// test expires none), so it is opt-in: `cargo test -- --ignored`.
    #[tokio::test]
    #[ignore]
    async fn compaction_over_500_batches_keeps_the_files_few_and_every_snapshot_readable() {
        compaction_run(500).await;
    }

    /// Files the earlier merges may leave beside the new ones: each tier at
    /// least twice the one below (docs/tables.md, "Compaction").
    const TIERS: usize = 6;

    /// A silver table after a run of small random batches.
    struct Churned {
        dir: tempfile::TempDir,
        lake: Lake,
        ident: TableIdent,
        silver: SilverTable,
        relation: std::sync::Arc<wal2iceberg::cdc::relation::RelationInfo>,
        /// The source's rows at the end, by key.
        expected: Vec<(i64, String)>,
        /// The row count of each snapshot, oldest first.
        rows_per_snapshot: Vec<usize>,
        compactions: usize,
    }

    /// `batches` transactions of eight random updates, a delete and an
    /// insert on a table of `rows` rows, each applied and committed, then
    /// compaction after `after_files` files.
    async fn churn(rows: i64, batches: usize, after_files: usize) -> Churned {
        use rand::{Rng, SeedableRng};

        let db = TestDb::new().await;
        db.exec(&format!(
            "CREATE TABLE accounts(id int PRIMARY KEY, plan text NOT NULL);
             INSERT INTO accounts SELECT g, 'free' FROM generate_series(1, {rows}) g;"
        ))
        .await;
        let (load, mut stream) = open_fresh(&db, &db.options(&["accounts"])).await;
        let relation = changes(&load)[0].relation.clone();
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open_embedded(dir.path()).await.unwrap();
        let ident = TableIdent::new(namespace("shop"), "accounts".into());
        let mut silver = SilverTable::open(&lake, ident.clone(), &relation)
            .await
            .unwrap();
        apply(&mut silver, &lake, &load).await;
        let mut model: std::collections::BTreeMap<i64, String> =
            (1..=rows).map(|i| (i, "free".to_owned())).collect();
        let mut rows_per_snapshot = vec![model.len()];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut compactions = 0;
        for (batch, next_id) in (0..batches).zip(rows + 1..) {
            let mut sql = String::from("BEGIN;");
            for _ in 0..8 {
                let id = rng.random_range(1..next_id);
                let plan = format!("p{batch}");
                sql += &format!("UPDATE accounts SET plan = '{plan}' WHERE id = {id};");
                if let Some(p) = model.get_mut(&id) {
                    *p = plan;
                }
            }
            let gone = rng.random_range(1..next_id);
            sql += &format!("DELETE FROM accounts WHERE id = {gone};");
            model.remove(&gone);
            sql += &format!("INSERT INTO accounts VALUES ({next_id}, 'new');");
            model.insert(next_id, "new".to_owned());
            db.exec(&(sql + "COMMIT;")).await;
            let events = read_commits(&mut stream, 1).await;
            apply(&mut silver, &lake, &events).await;
            rows_per_snapshot.push(model.len());
            if silver.compact(&lake, after_files).await.unwrap().is_some() {
                compactions += 1;
                rows_per_snapshot.push(model.len());
            }
            let (data, deletes) = silver.file_counts();
            assert!(
                data <= after_files + TIERS && deletes <= after_files + TIERS,
                "batch {batch}: {data} data and {deletes} delete files"
            );
        }
        stream.stop().await.unwrap();
        Churned {
            dir,
            lake,
            ident,
            silver,
            relation,
            expected: model.into_iter().collect(),
            rows_per_snapshot,
            compactions,
        }
    }

    /// Every snapshot of silver as pyiceberg reads it (read_lake.py's
    /// `snapshots` mode), and the row count of each.
    async fn snapshots_and_rows(dir: &std::path::Path) -> (Vec<serde_json::Value>, Vec<usize>) {
        let snapshots = pyiceberg(dir, "shop.accounts", "snapshots").await;
        let snapshots = snapshots.as_array().unwrap().clone();
        let rows = snapshots
            .iter()
            .map(|s| s["rows"].as_u64().unwrap() as usize)
            .collect();
        (snapshots, rows)
    }

    /// Prints how long pyiceberg takes to scan silver against the same
    /// rows freshly written (`benches/scan_silver.py`).
    async fn print_scan_ratio(dir: &std::path::Path, when: &str, rows: usize) {
        let script = format!("{}/benches/scan_silver.py", env!("CARGO_MANIFEST_DIR"));
        let out = tokio::process::Command::new(crate::support::python())
            .arg(script)
            .arg(dir)
            .arg("shop.accounts")
            .output()
            .await
            .unwrap();
        assert_success(&out);
        let scan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(scan["rows"], rows);
        let (seconds, fresh) = (
            scan["seconds"].as_f64().unwrap(),
            scan["fresh_seconds"].as_f64().unwrap(),
        );
        println!(
            "pyiceberg scan of silver {when} ({} data, {} delete files): {seconds:.3} s, \
             of the same rows freshly written: {fresh:.3} s ({:.2}x)",
            scan["data_files"],
            scan["delete_files"],
            seconds / fresh
        );
    }

    /// 50,000 rows, compaction after 16 files.
    async fn compaction_run(batches: usize) {
        const AFTER_FILES: usize = 16;
        let mut run = churn(50_000, batches, AFTER_FILES).await;
        let dir = run.dir.path();
        assert!(
            run.compactions >= batches / AFTER_FILES,
            "{} compactions",
            run.compactions
        );
        assert_eq!(id_plan_rows(dir, "shop.accounts").await, run.expected);
        assert_eq!(
            id_plan_pairs(&duckdb(dir, "shop.accounts").await),
            run.expected
        );
        let (snapshots, rows) = snapshots_and_rows(dir).await;
        assert_eq!(
            rows, run.rows_per_snapshot,
            "every snapshot reads as it was"
        );
        let replaced = snapshots
            .iter()
            .filter(|s| s["operation"] == "replace")
            .count();
        assert_eq!(replaced, run.compactions);
        let last = snapshots.last().unwrap();
        assert!(
            last["data_files"].as_u64().unwrap() <= (AFTER_FILES + TIERS) as u64
                && last["delete_files"].as_u64().unwrap() <= (AFTER_FILES + TIERS) as u64,
            "{last}"
        );
        // Reader speed against the same rows written fresh: printed here,
        // enforced by the benchmark's read phase (docs/benchmarks.md); as
        // the last batch left silver, and after the full compaction a run
        // does once the stream is quiet.
        print_scan_ratio(dir, &format!("after {batches} batches"), run.expected.len()).await;
        while run
            .silver
            .compact_now(
                &run.lake,
                wal2iceberg::lake::maintenance::compaction::Merge::All,
            )
            .await
            .unwrap()
            .is_some()
        {}
        print_scan_ratio(dir, "after the quiet full compaction", run.expected.len()).await;
        // The index moved with the rows: a restart rebuilds the same count.
        drop(run.silver);
        let silver = SilverTable::open(&run.lake, run.ident, &run.relation)
            .await
            .unwrap();
        assert_eq!(silver.row_count(), run.expected.len());
    }

    /// Every file under `folder`, recursively.
    fn files_under(folder: &std::path::Path) -> std::collections::BTreeSet<String> {
        let mut files = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(files_under(&path));
            } else {
                files.insert(path.display().to_string());
            }
        }
        files
    }

    #[tokio::test]
    async fn expire_snapshots_deletes_exactly_what_no_kept_snapshot_reads() {
        let run = churn(2_000, 30, 4).await;
        let dir = run.dir.path();
        let data = dir.join("warehouse/shop/accounts/data");
        let metadata = dir.join("warehouse/shop/accounts/metadata");
        // What crashes leave: files nothing refers to, two hours old, and
        // one just written, which might still be on its way to a commit.
        let some_data_file = files_under(&data).into_iter().next().unwrap();
        let planted = |path: std::path::PathBuf, age_secs: u64| {
            std::fs::copy(&some_data_file, &path).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(
                    std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs),
                )
                .unwrap();
            path.display().to_string()
        };
        let old_orphans = [
            planted(data.join("crashed-00000.parquet"), 7200),
            planted(metadata.join("99999-crashed.metadata.json"), 7200),
        ];
        let young_orphan = planted(data.join("in-flight-00000.parquet"), 0);
        let before = files_under(&data);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
            .args(["expire-snapshots", "--lake"])
            .arg(dir)
            .args(["--older-than", "0s", "--retain-last", "5", "accounts"])
            .output()
            .unwrap();
        assert_success(&out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let expired = run.rows_per_snapshot.len() - 5;
        assert!(
            stdout.contains(&format!("shop.accounts: {expired} snapshots expired"))
                && stdout.contains(", 2 orphan files deleted"),
            "{stdout}"
        );
        for orphan in &old_orphans {
            assert!(!std::path::Path::new(orphan).exists(), "{orphan} kept");
        }
        let mut after = files_under(&data);
        assert!(after.remove(&young_orphan), "the young orphan is kept");
        assert!(
            after.len() < before.len(),
            "{} -> {}",
            before.len(),
            after.len()
        );

        // The five kept snapshots scan in full, as they were, and the data
        // folder holds exactly the files they read.
        let (snapshots, rows) = snapshots_and_rows(dir).await;
        assert_eq!(rows, run.rows_per_snapshot[expired..]);
        // Time travel reaches each of them.
        for snapshot in &snapshots {
            let lsn: u64 = snapshot["commit_lsn"].as_str().unwrap().parse().unwrap();
            let lsn = wal2iceberg::model::Lsn(lsn).to_string();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
                .args([
                    "show", "accounts", "--format", "json", "--as-of", &lsn, "--lake",
                ])
                .arg(dir)
                .output()
                .unwrap();
            assert_success(&out);
            let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                shown.as_array().unwrap().len(),
                snapshot["rows"].as_u64().unwrap() as usize,
                "as of {lsn}"
            );
        }
        let read: std::collections::BTreeSet<String> = snapshots
            .iter()
            .flat_map(|s| s["paths"].as_array().unwrap())
            .map(|p| p.as_str().unwrap().trim_start_matches("file://").to_owned())
            .collect();
        assert_eq!(after, read);
        assert_eq!(id_plan_rows(dir, "shop.accounts").await, run.expected);

        // Nothing left to expire: a second run deletes nothing.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
            .args(["expire-snapshots", "--lake"])
            .arg(dir)
            .args(["--older-than", "0s", "--retain-last", "5"])
            .output()
            .unwrap();
        assert_success(&out);
        assert!(String::from_utf8_lossy(&out.stdout).contains(
            "shop.accounts: 0 snapshots expired, 0 files deleted, 0 orphan files deleted"
        ));
        let mut again = files_under(&data);
        assert!(again.remove(&young_orphan));
        assert_eq!(again, after);
    }

    #[tokio::test]
    async fn silver_follows_the_seed_walkthrough_and_survives_a_restart() {
        let db = TestDb::new().await;
        db.exec(
            "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
             INSERT INTO customers VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');",
        )
        .await;
        let (load, mut stream) = open_fresh(&db, &db.options(&["customers"])).await;
        let relation = changes(&load)[0].relation.clone();
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open_embedded(dir.path()).await.unwrap();
        let ident = TableIdent::new(namespace("shop"), "customers".into());
        let mut silver = SilverTable::open(&lake, ident.clone(), &relation)
            .await
            .unwrap();
        apply(&mut silver, &lake, &load).await;
        assert_eq!(
            id_plan_rows(dir.path(), "shop.customers").await,
            pairs(&[(1, "free"), (2, "pro"), (3, "free")])
        );

        for sql in SEED_CHANGES {
            db.exec(sql).await;
        }
        let events = read_commits(&mut stream, 4).await;
        apply(&mut silver, &lake, &events).await;
        assert_eq!(
            id_plan_rows(dir.path(), "shop.customers").await,
            pairs(&[(1, "team"), (2, "pro"), (4, "free")])
        );
        let summary = pyiceberg(dir.path(), "shop.customers", "summary").await;
        assert_eq!(
            summary["total-position-deletes"],
            json!("2"),
            "Ada's old row and Linus: {summary}"
        );

        // A restart rebuilds the key index from the table: the next update
        // replaces the live row instead of adding a second one, and the
        // deleted key stays deleted.
        drop(silver);
        let mut silver = SilverTable::open(&lake, ident.clone(), &relation)
            .await
            .unwrap();
        assert_eq!(silver.row_count(), 3);
        db.exec("UPDATE customers SET plan='enterprise' WHERE id=4")
            .await;
        db.exec("UPDATE customers SET id=5 WHERE id=2").await;
        let events = read_commits(&mut stream, 2).await;
        apply(&mut silver, &lake, &events).await;
        assert_eq!(
            id_plan_rows(dir.path(), "shop.customers").await,
            pairs(&[(1, "team"), (4, "enterprise"), (5, "pro")]),
            "a primary-key update moves the row"
        );
        let rows = pyiceberg(dir.path(), "shop.customers", "rows").await;
        let lsn_of_4 = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == json!(4))
            .unwrap()["_cdc_commit_lsn"]
            .clone();
        assert_eq!(
            lsn_of_4,
            json!(changes(&events)[0].tx.commit_lsn.0),
            "silver records the change that wrote the row"
        );
        stream.stop().await.unwrap();
    }

    #[tokio::test]
    async fn one_batch_collapses_each_key_and_a_truncate_empties_the_table() {
        let db = TestDb::new().await;
        db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text NOT NULL); INSERT INTO customers VALUES (1,'free');")
            .await;
        let (dir, lake, mut silver, mut stream) = loaded_silver(&db, "customers").await;

        db.exec("INSERT INTO customers VALUES (7,'trial')").await;
        db.exec("UPDATE customers SET plan='pro' WHERE id=7").await;
        db.exec("DELETE FROM customers WHERE id=7").await;
        db.exec("UPDATE customers SET plan='team' WHERE id=1").await;
        let events = read_commits(&mut stream, 4).await;
        apply(&mut silver, &lake, &events).await;
        assert_eq!(
            id_plan_rows(dir.path(), "shop.customers").await,
            pairs(&[(1, "team")])
        );
        let summary = pyiceberg(dir.path(), "shop.customers", "summary").await;
        assert_eq!(
            summary["added-records"],
            json!("1"),
            "key 7 came and went inside the batch: {summary}"
        );

        db.exec("BEGIN; TRUNCATE customers; INSERT INTO customers VALUES (9,'new'); COMMIT;")
            .await;
        let events = read_commits(&mut stream, 1).await;
        apply(&mut silver, &lake, &events).await;
        assert_eq!(
            id_plan_rows(dir.path(), "shop.customers").await,
            pairs(&[(9, "new")])
        );
        assert_eq!(silver.row_count(), 1);
        stream.stop().await.unwrap();
    }
}
