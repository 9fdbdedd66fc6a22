//! Production values: whatever PostgreSQL stores, the run goes on and the
//! lake keeps it, in its column where the column's type holds it and
//! verbatim in `_cdc_verbatim` where it does not (docs/values.md).

use serde_json::{Value, json};
use wal2iceberg::apply::run;

use crate::support::*;

/// Odd values in every column but the key, as SQL literals.
const ODD: &str = "'NaN', '24:00:00', ARRAY['a{', '{br}', '\"q\"', 'NULL', NULL, ' ', 'a,b', 'back\\slash'], \
                   '[0:1]={1,2}', '294276-12-31 23:59:59.999999+00', '{{1,2},{3,4}}', \
                   '294247-01-10 04:00:54.775807'";
/// Plain values of the same columns.
const PLAIN: &str = "12.50, '12:00:00', ARRAY['x'], '{1,2}', '2026-12-01 10:00:00+00', '{5}', '2026-12-01 10:00:00'";

/// The rows of a table through pyiceberg, by id.
async fn rows_by_id(lake: &std::path::Path, table: &str) -> std::collections::BTreeMap<i64, Value> {
    pyiceberg(lake, table, "rows")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r.clone()))
        .collect()
}

/// The `_cdc_verbatim` map of a row as pyiceberg gives it, sorted.
fn kept(row: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = row["_cdc_verbatim"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| (e[0].as_str().unwrap().into(), e[1].as_str().unwrap().into()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[tokio::test]
async fn values_a_column_cannot_hold_are_kept_verbatim_and_the_run_goes_on() {
    let db = TestDb::new().await;
    db.exec(&format!(
        "CREATE TABLE odd(id int PRIMARY KEY, amount numeric(12,2), at time, ta text[],
                          bounded int[], far timestamptz, grid int[], edge timestamp);
         CREATE TABLE plain(id int PRIMARY KEY, name text);
         INSERT INTO odd VALUES (1, {ODD}), (2, {PLAIN});
         INSERT INTO plain VALUES (1, 'a');"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("odd");
    let opts = run_options(&db, &["odd", "plain"], &slot, dir.path());
    run(&db.config, &opts).await.unwrap();

    // The same values streamed, into a new row and over a plain one, while
    // the other table goes on; then a verbatim value becomes plain again.
    db.exec(&format!(
        "INSERT INTO odd VALUES (3, {ODD});
         UPDATE odd SET amount = 'NaN', ta = ARRAY['}}'] WHERE id = 2;
         INSERT INTO plain VALUES (2, 'b');
         UPDATE odd SET amount = 7.25 WHERE id = 1;
         UPDATE plain SET name = 'c' WHERE id = 1;"
    ))
    .await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, 5);

    // Every value as the source holds it, verbatim ones brought to their
    // canonical form by PostgreSQL itself.
    assert_reconciled(&db, "odd", dir.path(), "shop.odd").await;
    assert_reconciled(&db, "plain", dir.path(), "shop.plain").await;

    let silver = rows_by_id(dir.path(), "shop.odd").await;
    let odd_kept = |amount: bool| {
        let mut expected = vec![
            ("at".to_owned(), "24:00:00".to_owned()),
            ("bounded".to_owned(), "[0:1]={1,2}".to_owned()),
            // i64::MAX microseconds: what `infinity` is stored as.
            ("edge".to_owned(), "294247-01-10 04:00:54.775807".to_owned()),
            (
                "far".to_owned(),
                "294276-12-31 23:59:59.999999+00".to_owned(),
            ),
            ("grid".to_owned(), "{{1,2},{3,4}}".to_owned()),
        ];
        if amount {
            expected.insert(0, ("amount".to_owned(), "NaN".to_owned()));
        }
        expected
    };
    assert_eq!(kept(&silver[&3]), odd_kept(true), "streamed");
    assert_eq!(
        kept(&silver[&1]),
        odd_kept(false),
        "loaded, then amount plain"
    );
    assert_eq!(silver[&1]["amount"], json!("7.25"));
    assert_eq!(
        kept(&silver[&2]),
        vec![("amount".to_owned(), "NaN".to_owned())]
    );
    assert_eq!(silver[&2]["ta"], json!(["}"]));
    for row in [&silver[&1], &silver[&3]] {
        assert_eq!(
            row["ta"],
            json!([
                "a{",
                "{br}",
                "\"q\"",
                "NULL",
                null,
                " ",
                "a,b",
                "back\\slash"
            ]),
            "any character in a quoted array element"
        );
        for column in ["at", "bounded", "edge", "far", "grid"] {
            assert_eq!(row[column], Value::Null, "{column} is null beside its text");
        }
    }

    // Bronze keeps the verbatim values of every change, before images too.
    let bronze = pyiceberg(dir.path(), "shop.odd_changes", "rows").await;
    let bronze = bronze.as_array().unwrap();
    let load = bronze
        .iter()
        .find(|r| r["_cdc_op"] == json!("r") && r["id"] == json!(1))
        .unwrap();
    assert_eq!(kept(load), odd_kept(true));
    let insert = bronze.iter().find(|r| r["_cdc_op"] == json!("c")).unwrap();
    assert_eq!(kept(insert), odd_kept(true));

    // A second reader reads the map too.
    let duck = duckdb(dir.path(), "shop.odd").await;
    let duck3 = duck
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == json!(3))
        .unwrap();
    assert!(
        duck3["_cdc_verbatim"].to_string().contains("294276-12-31"),
        "{duck3}"
    );

    // verify compares verbatim values too, and finds the lake equal.
    let out = verify_lake(&db, &slot, dir.path(), "public.odd,public.plain").await;
    assert_success(&out);
}

/// `schema` as wal2iceberg wrote it before `_cdc_verbatim` existed.
fn without_verbatim(schema: &iceberg::spec::Schema) -> iceberg::spec::Schema {
    use iceberg::spec::{NestedField, StructType, Type};
    let strip = |fields: &[iceberg::spec::NestedFieldRef]| -> Vec<iceberg::spec::NestedFieldRef> {
        fields
            .iter()
            .filter(|f| f.name != "_cdc_verbatim")
            .cloned()
            .collect()
    };
    let fields = strip(schema.as_struct().fields())
        .into_iter()
        .map(|f| match &*f.field_type {
            Type::Struct(inner) => std::sync::Arc::new(NestedField::optional(
                f.id,
                &f.name,
                Type::Struct(StructType::new(strip(inner.fields()))),
            )),
            _ => f,
        })
        .collect::<Vec<_>>();
    iceberg::spec::Schema::builder()
        .with_fields(fields)
        .with_identifier_field_ids(schema.identifier_field_ids())
        .build()
        .unwrap()
}

#[tokio::test]
async fn tables_written_before_verbatim_values_gain_the_column_and_keep_them() {
    use iceberg::TableIdent;
    use wal2iceberg::lake::catalog::{Lake, namespace};
    use wal2iceberg::lake::schema::{bronze_schema, silver_schema};

    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE old(id int PRIMARY KEY, amount numeric(12,2), n int);
         ALTER TABLE old REPLICA IDENTITY FULL;
         INSERT INTO old VALUES (1, 'NaN', 0), (2, 1.5, 0);",
    )
    .await;
    let mut capture = db.options(&["old"]);
    capture.temporary_slot = true;
    let (load, stream) = open_fresh(&db, &capture).await;
    stream.stop().await.unwrap();
    let relation = changes(&load)
        .first()
        .map(|c| c.relation.clone())
        .expect("the load describes the table");
    let dir = tempfile::tempdir().unwrap();
    {
        let lake = Lake::open_embedded(dir.path()).await.unwrap();
        let shop = namespace("shop");
        for (name, schema) in [
            ("old", silver_schema(&relation).unwrap()),
            ("old_changes", bronze_schema(&relation).unwrap()),
        ] {
            let ident = TableIdent::new(shop.clone(), name.into());
            lake.ensure_table(&ident, without_verbatim(&schema))
                .await
                .unwrap();
        }
    }
    let before = pyiceberg(dir.path(), "shop.old_changes", "schema").await;
    assert!(!before["fields"].to_string().contains("_cdc_verbatim"));

    let opts = run_options(&db, &["old"], &unique("old"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec(
        "INSERT INTO old VALUES (3, 'NaN', 0); DELETE FROM old WHERE id = 1;
         UPDATE old SET n = 1 WHERE id = 3;",
    )
    .await;
    run(&db.config, &opts).await.unwrap();

    assert_reconciled(&db, "old", dir.path(), "shop.old").await;
    for table in ["shop.old", "shop.old_changes"] {
        let schema = pyiceberg(dir.path(), table, "schema").await;
        assert_eq!(
            schema["fields"].as_array().unwrap().last(),
            Some(&json!("_cdc_verbatim")),
            "{table}"
        );
    }
    // Not inside _cdc_before (apache/iceberg-rust#2617: its reader could no
    // longer read the files written before): a before image's value goes
    // to the top-level map under _cdc_before.<column>.
    let schema = pyiceberg(dir.path(), "shop.old_changes", "schema").await;
    assert!(
        !schema["types"]["_cdc_before"]
            .as_str()
            .unwrap()
            .contains("_cdc_verbatim"),
        "{schema}"
    );
    let bronze = pyiceberg(dir.path(), "shop.old_changes", "rows").await;
    let update = bronze
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["_cdc_op"] == json!("u"))
        .unwrap();
    assert_eq!(
        kept(update),
        vec![
            ("_cdc_before.amount".to_owned(), "NaN".to_owned()),
            ("amount".to_owned(), "NaN".to_owned())
        ]
    );
    // Our own reader (iceberg-rust's scan) reads both tables whole, and
    // verify compares silver's values, not the before images' entries.
    let lake = dir.path().display().to_string();
    for table in ["old", "old_changes"] {
        assert_success(&cli(&["show", table, "--lake", &lake]).await);
    }
    let verified = verify_lake(&db, &opts.capture.slot, dir.path(), "public.old").await;
    assert_success(&verified);
}

#[tokio::test]
async fn arrays_of_a_type_with_another_delimiter_are_kept_whole() {
    // box's elements are separated by ';', and hold commas unquoted.
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE shapes(id int PRIMARY KEY, boxes box[]);
         INSERT INTO shapes VALUES (1, ARRAY['((1,1),(0,0))'::box, '((3,3),(2,2))'::box]);",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["shapes"], &unique("boxes"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec("INSERT INTO shapes VALUES (2, ARRAY['((5,5),(4,4))'::box])")
        .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "shapes", dir.path(), "shop.shapes").await;
    let silver = pyiceberg(dir.path(), "shop.shapes", "verbatim").await;
    let mut kept: Vec<(String, String)> =
        silver.as_array().unwrap().iter().flat_map(kept).collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("boxes".to_owned(), "{(1,1),(0,0);(3,3),(2,2)}".to_owned()),
            ("boxes".to_owned(), "{(5,5),(4,4)}".to_owned()),
        ]
    );
}

/// Random SQL literals of one element type, for the array property test.
mod random {
    use rand::Rng;
    use rand::rngs::StdRng;

    /// Characters that array input and output treat specially, and some
    /// that need more than one byte.
    const ODD: &[&str] = &[
        "{", "}", ",", "\"", "\\", " ", "\t", "\n", "'", "NULL", "null", "a", "Z", "0", "ż", "🦀",
        "=", "[", "]", ":",
    ];

    pub fn text(rng: &mut StdRng, max: usize) -> String {
        let n = rng.random_range(0..=max);
        let mut s = String::new();
        while s.chars().count() < n {
            let piece = ODD[rng.random_range(0..ODD.len())];
            if s.chars().count() + piece.chars().count() > max {
                break;
            }
            s.push_str(piece);
        }
        s
    }

    pub fn quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "''"))
    }

    pub fn numeric(rng: &mut StdRng, precision: usize, scale: usize) -> String {
        let whole: String = (0..rng.random_range(1..=precision - scale))
            .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
            .collect();
        let frac: String = (0..rng.random_range(0..=scale))
            .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
            .collect();
        let sign = if rng.random_bool(0.3) { "-" } else { "" };
        if frac.is_empty() {
            format!("{sign}{whole}")
        } else {
            format!("{sign}{whole}.{frac}")
        }
    }

    pub fn timestamptz(rng: &mut StdRng) -> String {
        match rng.random_range(0..20) {
            0 => "'infinity'".into(),
            1 => "'-infinity'".into(),
            _ => format!(
                "to_timestamp({})",
                rng.random_range(-62_135_596_800.0..253_402_300_799.0f64)
            ),
        }
    }

    pub fn date(rng: &mut StdRng) -> String {
        match rng.random_range(0..20) {
            0 => "'infinity'::date".into(),
            _ => format!(
                "(date '2000-01-01' + {})",
                rng.random_range(-2_000_000..2_000_000)
            ),
        }
    }

    pub fn bytea(rng: &mut StdRng) -> String {
        let bytes: String = (0..rng.random_range(0..8))
            .map(|_| format!("{:02x}", rng.random::<u8>()))
            .collect();
        format!("'\\x{bytes}'::bytea")
    }

    pub fn uuid(rng: &mut StdRng) -> String {
        let h: String = (0..16)
            .map(|_| format!("{:02x}", rng.random::<u8>()))
            .collect();
        format!("'{}'::uuid", h)
    }

    pub fn jsonb(rng: &mut StdRng) -> String {
        let doc = match rng.random_range(0..4) {
            0 => serde_json::json!(text(rng, 6)),
            1 => serde_json::json!({ text(rng, 4): [rng.random_range(-5..5), null, true] }),
            2 => serde_json::json!(rng.random_range(-1e6..1e6f64)),
            _ => serde_json::json!([text(rng, 3), {"k": text(rng, 3)}]),
        };
        format!("{}::jsonb", quote(&doc.to_string()))
    }

    pub fn float8(rng: &mut StdRng) -> String {
        match rng.random_range(0..10) {
            0 => "'NaN'::float8".into(),
            1 => "'-Infinity'::float8".into(),
            2 => "1e-300".into(),
            _ => format!("{:e}", rng.random_range(-1e20..1e20f64)),
        }
    }
}

/// One random array of the element SQL literals `element` gives, as an
/// ARRAY constructor of type `array_type` of `dimensions` dimensions
/// (rectangular, as PostgreSQL requires; elements null at random).
fn random_array(
    rng: &mut rand::rngs::StdRng,
    array_type: &str,
    dimensions: usize,
    element: &dyn Fn(&mut rand::rngs::StdRng) -> String,
) -> String {
    use rand::Rng;
    if rng.random_bool(0.05) {
        return "NULL".into();
    }
    let shape: Vec<usize> = (0..dimensions)
        .map(|level| rng.random_range(usize::from(level > 0)..5))
        .collect();
    if shape[0] == 0 {
        return format!("'{{}}'::{array_type}");
    }
    fn level(
        rng: &mut rand::rngs::StdRng,
        shape: &[usize],
        element: &dyn Fn(&mut rand::rngs::StdRng) -> String,
    ) -> String {
        let items: Vec<String> = (0..shape[0])
            .map(|_| match shape.len() {
                1 if rng.random_bool(0.15) => "NULL".to_owned(),
                1 => element(rng),
                _ => level(rng, &shape[1..], element),
            })
            .collect();
        format!("[{}]", items.join(", "))
    }
    format!("ARRAY{}::{array_type}", level(rng, &shape, element))
}

#[tokio::test]
async fn random_arrays_of_every_element_type_replicate_element_for_element() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("WAL2ICEBERG_ARRAY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("array property test: seed {seed} (WAL2ICEBERG_ARRAY_SEED={seed} repeats it)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    type Element = Box<dyn Fn(&mut rand::rngs::StdRng) -> String>;
    // Declared with two or three dimensions: nested lists.
    let grids: Vec<(&str, &str, Element)> = vec![
        (
            "g_text",
            "text[][]",
            Box::new(|r| random::quote(&random::text(r, 12))),
        ),
        (
            "g_int",
            "int8[][]",
            Box::new(|r| r.random::<i64>().to_string()),
        ),
        ("g_tstz", "timestamptz[][]", Box::new(random::timestamptz)),
        (
            "g_num",
            "numeric(12,2)[][][]",
            Box::new(|r| random::numeric(r, 12, 2)),
        ),
    ];
    let labels = ["sad", "a b", "{x}", "q\"uote", "NULL", "c,d", "back\\slash"];
    let columns: Vec<(&str, &str, Element)> = vec![
        (
            "a_text",
            "text[]",
            Box::new(|r| random::quote(&random::text(r, 12))),
        ),
        (
            "a_vc",
            "varchar(8)[]",
            Box::new(|r| random::quote(&random::text(r, 8))),
        ),
        (
            "a_int",
            "int8[]",
            Box::new(|r| r.random::<i64>().to_string()),
        ),
        (
            "a_bool",
            "bool[]",
            Box::new(|r| r.random::<bool>().to_string()),
        ),
        ("a_f8", "float8[]", Box::new(random::float8)),
        (
            "a_num",
            "numeric[]",
            Box::new(|r| match r.random_range(0..10) {
                0 => "'NaN'".into(),
                1 => "'Infinity'".into(),
                _ => random::numeric(r, 60, 30),
            }),
        ),
        (
            "a_dec",
            "numeric(12,2)[]",
            Box::new(|r| match r.random_range(0..40) {
                0 => "'NaN'".into(),
                _ => random::numeric(r, 12, 2),
            }),
        ),
        ("a_tstz", "timestamptz[]", Box::new(random::timestamptz)),
        ("a_date", "date[]", Box::new(random::date)),
        ("a_uuid", "uuid[]", Box::new(random::uuid)),
        ("a_bytea", "bytea[]", Box::new(random::bytea)),
        ("a_jsonb", "jsonb[]", Box::new(random::jsonb)),
        (
            "a_enum",
            "mood[]",
            Box::new(move |r| random::quote(labels[r.random_range(0..labels.len())])),
        ),
        (
            "a_dom",
            "posint[]",
            Box::new(|r| r.random_range(1..i32::MAX).to_string()),
        ),
    ];
    let columns: Vec<(&str, &str, Element)> = columns.into_iter().chain(grids).collect();
    let dimensions = |ty: &str| ty.matches("[]").count();
    let db = TestDb::new().await;
    let labels_sql: Vec<String> = labels.iter().map(|l| random::quote(l)).collect();
    db.exec(&format!(
        "CREATE TYPE mood AS ENUM ({});
         CREATE DOMAIN posint AS int CHECK (VALUE > 0);
         CREATE TABLE arrays(id int PRIMARY KEY, {});",
        labels_sql.join(", "),
        columns
            .iter()
            .map(|(name, ty, _)| format!("{name} {ty}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .await;
    const ROWS: usize = 500;
    let mut insert = |db_rows: std::ops::Range<usize>| {
        db_rows
            .map(|id| {
                let cells: Vec<String> = columns
                    .iter()
                    .map(|(_, ty, element)| {
                        random_array(&mut rng, ty, dimensions(ty), element.as_ref())
                    })
                    .collect();
                format!("INSERT INTO arrays VALUES ({id}, {});", cells.join(", "))
            })
            .collect::<String>()
    };
    let loaded = insert(0..ROWS / 2);
    let streamed = insert(ROWS / 2..ROWS);
    db.exec(&loaded).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["arrays"], &unique("arrays"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec(&streamed).await;
    let report = run(&db.config, &opts).await.unwrap();
    assert_eq!(report.changes_applied, (ROWS / 2) as u64, "seed {seed}");
    assert_reconciled(&db, "arrays", dir.path(), "shop.arrays").await;
    // Each array is a list, not text kept verbatim, but for the one kind
    // a list cannot hold: a decimal list with a NaN in it.
    let silver = pyiceberg(dir.path(), "shop.arrays", "verbatim").await;
    for row in silver.as_array().unwrap() {
        for (column, text) in kept(row) {
            assert!(
                column == "a_dec" && text.contains("NaN"),
                "seed {seed}: id {} kept {column} verbatim",
                row["id"]
            );
        }
    }
}

#[tokio::test]
async fn an_undecodable_key_stops_the_run_naming_table_column_lsn_and_xid_and_an_uncaptured_table_stops_nothing()
 {
    let db = TestDb::new().await;
    // A timestamp past 294246 is a key silver cannot hold: no column
    // value stands in for a key.
    db.exec(
        "CREATE TABLE t(id int PRIMARY KEY, v text);
         CREATE TABLE far(at timestamptz PRIMARY KEY);
         CREATE PUBLICATION both_tables FOR TABLE t, far;",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = run_options(&db, &["t"], &unique("keys"), dir.path());
    opts.capture.publication = "both_tables".into();
    run(&db.config, &opts).await.unwrap();
    db.exec(
        "INSERT INTO far VALUES ('294276-12-31 23:59:59+00');
         INSERT INTO t VALUES (1, 'a');",
    )
    .await;
    // A table the run does not capture, though published, stops nothing.
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "t", dir.path(), "shop.t").await;

    let far_dir = tempfile::tempdir().unwrap();
    let far_opts = run_options(&db, &["far"], &unique("far"), far_dir.path());
    let err = run(&db.config, &far_opts).await.unwrap_err().to_string();
    assert!(
        err.contains("table=public.far") && err.contains("column=at") && err.contains("lsn="),
        "{err}"
    );
    assert!(
        !err.contains("294276"),
        "the value stays out of errors: {err}"
    );
    db.exec("INSERT INTO far VALUES ('294276-12-31 23:59:58+00')")
        .await;
    let streamed = tempfile::tempdir().unwrap();
    let far_opts = run_options(&db, &["far"], &unique("far"), streamed.path());
    db.exec("DELETE FROM far").await;
    run(&db.config, &far_opts).await.unwrap();
    db.exec("INSERT INTO far VALUES ('294276-12-31 23:59:57+00')")
        .await;
    let err = run(&db.config, &far_opts).await.unwrap_err().to_string();
    assert!(
        err.contains("table=public.far") && err.contains("column=at") && err.contains("xid="),
        "{err}"
    );
}

/// Arrays declared with more dimensions are nested lists, level by level,
/// loaded and streamed; their values of other dimensions or bounds are
/// verbatim; and a table whose column was a flat list keeps it.
#[tokio::test]
async fn arrays_declared_multi_dimensional_are_nested_lists_and_their_odd_values_verbatim() {
    let db = TestDb::new().await;
    let rows = |from: i32| {
        format!(
            "INSERT INTO grids VALUES
               ({from}, '{{{{1,2}},{{3,4}}}}', ARRAY[[['a{{', 'b'], ['c', '\"d\"']]],
                '{{{{2026-12-01 10:00:00+00}}}}', '{{{{1.5,NULL}}}}', '{{{{1,2}}}}'),
               ({}, '{{{{NULL,5}}}}', '{{}}', NULL, '{{{{1.5,NaN}}}}', '{{{{3}}}}'),
               ({}, '{{1,2}}', NULL, '{{}}', NULL, NULL),
               ({}, '[0:1][1:2]={{{{1,2}},{{3,4}}}}', NULL, NULL, NULL, '{{{{4}}}}');",
            from + 1,
            from + 2,
            from + 3
        )
    };
    db.exec(&format!(
        "CREATE TABLE grids(id int PRIMARY KEY, g int[][], t text[][][], ts timestamptz[][],
                            n numeric(12,2)[][], flat int[]);
         {}",
        rows(1)
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["grids"], &unique("grids"), dir.path());
    run(&db.config, &opts).await.unwrap();
    db.exec(&rows(11)).await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "grids", dir.path(), "shop.grids").await;

    let silver = rows_by_id(dir.path(), "shop.grids").await;
    let duck: std::collections::BTreeMap<i64, Value> = duckdb(dir.path(), "shop.grids")
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r.clone()))
        .collect();
    for (id, how) in [(1, "loaded"), (11, "streamed")] {
        for rows in [&silver, &duck] {
            assert_eq!(rows[&id]["g"], json!([[1, 2], [3, 4]]), "{how}");
            assert_eq!(
                rows[&id]["t"],
                json!([[["a{", "b"], ["c", "\"d\""]]]),
                "{how}"
            );
            assert_eq!(rows[&(id + 1)]["g"], json!([[null, 5]]), "{how}");
        }
        assert_eq!(
            kept(&silver[&id]),
            vec![("flat".to_owned(), "{{1,2}}".to_owned())]
        );
        assert_eq!(
            kept(&silver[&(id + 1)]),
            vec![
                ("flat".to_owned(), "{{3}}".to_owned()),
                ("n".to_owned(), "{{1.50,NaN}}".to_owned())
            ],
            "{how}"
        );
        assert_eq!(
            kept(&silver[&(id + 2)]),
            vec![("g".to_owned(), "{1,2}".to_owned())],
            "one dimension in a column of two: {how}"
        );
        assert_eq!(
            kept(&silver[&(id + 3)]),
            vec![
                ("flat".to_owned(), "{{4}}".to_owned()),
                ("g".to_owned(), "[0:1][1:2]={{1,2},{3,4}}".to_owned())
            ],
            "{how}"
        );
    }

    // Declared with two dimensions later, a column whose table holds a
    // flat list keeps it, and its values of two dimensions verbatim.
    db.exec(
        "ALTER TABLE grids ALTER COLUMN flat TYPE int[][];
         INSERT INTO grids VALUES (21, NULL, NULL, NULL, NULL, '{{7,8}}');",
    )
    .await;
    run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "grids", dir.path(), "shop.grids").await;
    let silver = rows_by_id(dir.path(), "shop.grids").await;
    assert_eq!(
        kept(&silver[&21]),
        vec![("flat".to_owned(), "{{7,8}}".to_owned())]
    );
    assert_success(&verify_lake(&db, &opts.capture.slot, dir.path(), "public.grids").await);
}
