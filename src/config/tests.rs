use super::duration::LONGEST;
use super::layers::{KEYS, Kind};
use super::*;
use crate::lake::catalog::db::CatalogDb;
use crate::lake::catalog::uri::CatalogUri;
use crate::lake::storage::{CatalogProperties, Warehouse};

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Resolves with a complete source in the environment unless the test
/// sets one.
fn resolve(file_text: Option<&str>, env: &[(&str, &str)], flags: Raw) -> Result<Settings> {
    let f = file_text.map(file);
    let mut env = vars(env);
    if !env.iter().any(|(k, _)| k == "WAL2ICEBERG_SOURCE") {
        env.insert(
            0,
            (
                "WAL2ICEBERG_SOURCE".into(),
                "host=db user=app dbname=shop".into(),
            ),
        );
    }
    Settings::resolve(f.as_ref().map(|f| f.path()), env, flags)
}

#[test]
fn flags_override_the_environment_which_overrides_the_file() {
    let text = r#"
        source = "host=db dbname=shop user=app"
        tables = ["public.customers", "sales.orders"]
        slot = "from_file"
        publication = "file_pub"
        flush_interval = "2s"
        max_batch_rows = 10
        table_names = { "sales.orders" = "orders" }
    "#;
    let env = [
        ("WAL2ICEBERG_SOURCE", "host=envdb user=app dbname=shop"),
        ("WAL2ICEBERG_SLOT", "from_env"),
        ("WAL2ICEBERG_MAX_BATCH_ROWS", "20"),
        ("PATH", "/bin"),
    ];
    let flags = Raw {
        slot: Some("from_flag".into()),
        ..Raw::default()
    };
    let s = resolve(Some(text), &env, flags).unwrap();
    assert_eq!(s.slot, "from_flag");
    assert_eq!(s.run.max_batch_rows, 20);
    assert_eq!(s.publication, "file_pub");
    assert_eq!(s.run.flush_interval, Duration::from_secs(2));
    assert_eq!(s.tables.len(), 2);
    assert_eq!(
        s.source.host, "envdb",
        "the environment's source wins over the file's"
    );
    assert_eq!(
        s.table_names
            .get(&TableName::parse("sales.orders").unwrap()),
        Some(&"orders".to_owned())
    );
    assert_eq!(s.lake, LakeLocation::in_folder(Path::new("./lake")));
    let flags = Raw {
        lake: Some("/srv/lake".into()),
        warehouse: Some("/data/warehouse".into()),
        ..Raw::default()
    };
    let apart = resolve(
        None,
        &[("WAL2ICEBERG_CATALOG", "/etc/w2i/catalog.db")],
        flags,
    )
    .unwrap();
    assert_eq!(
        apart.lake.catalog,
        CatalogUri::Sql(CatalogDb::File(PathBuf::from("/etc/w2i/catalog.db")))
    );
    assert_eq!(
        apart.lake.warehouse,
        Warehouse::Folder(PathBuf::from("/data/warehouse"))
    );
    // Defaults where nobody said anything.
    assert_eq!(s.run.max_batch_bytes, 128 << 20);
    assert_eq!(s.run.load_connections, 2);
    assert_eq!(s.log_format, LogFormat::Text);
    assert_eq!(s.run.exit_when_idle, None);
}

#[test]
fn a_catalog_in_postgresql_from_a_variable_and_never_with_a_catalog_file() {
    let uri = "postgresql://w2i:pw@catalog/lake";
    let s = resolve(
        Some("lake = \"/srv/lake\"\n"),
        &[("WAL2ICEBERG_CATALOG_URI", uri)],
        Raw::default(),
    )
    .unwrap();
    assert_eq!(
        s.lake.catalog,
        CatalogUri::Sql(CatalogDb::Postgres(uri.into()))
    );
    assert_eq!(s.state_dir, PathBuf::from("/srv/lake/state"));
    assert!(!format!("{s:?}").contains("pw@"), "the password is hidden");
    let both = Raw {
        catalog: Some(CatalogSetting::File("/etc/w2i/catalog.db".into())),
        ..Raw::default()
    };
    let err = resolve(None, &[("WAL2ICEBERG_CATALOG_URI", uri)], both).unwrap_err();
    assert!(err.to_string().contains("catalog_uri"), "{err}");
    let sqlite = resolve(
        None,
        &[("WAL2ICEBERG_CATALOG_URI", "sqlite:/x/c.db")],
        Raw::default(),
    );
    assert_eq!(
        sqlite.unwrap().lake.catalog,
        CatalogUri::Sql(CatalogDb::File("/x/c.db".into()))
    );
}

#[test]
fn a_rest_catalog_from_a_catalog_table_whose_keys_the_flags_override() {
    let text = "lake = \"/srv/lake\"\n[catalog]\ntype = \"rest\"\nuri = \"http://cat:8181\"\n\
                warehouse = \"analytics\"\ntoken = \"t0ken-not-shown\"\n\"header.X-Tenant\" = \"a\"\n";
    let s = resolve(Some(text), &[], Raw::default()).unwrap();
    assert_eq!(
        s.lake.catalog,
        CatalogUri::Rest {
            uri: "http://cat:8181".into(),
            warehouse: Some("analytics".into())
        }
    );
    assert_eq!(
        s.lake.properties,
        CatalogProperties::parse(["token=t0ken-not-shown", "header.X-Tenant=a"]).unwrap()
    );
    assert_eq!(
        s.lake.warehouse,
        Warehouse::Folder("/srv/lake/warehouse".into())
    );
    assert_eq!(s.state_dir, PathBuf::from("/srv/lake/state"));
    assert!(!format!("{s:?}").contains("t0ken"), "a token is hidden");
    // A flag wins over the table's key; a property names its setting.
    let flags = Raw {
        catalog_uri: Some("https://other/api".into()),
        catalog_property: Some(vec!["token=newer".into()]),
        ..Raw::default()
    };
    let s = resolve(Some(text), &[], flags).unwrap();
    assert!(matches!(&s.lake.catalog, CatalogUri::Rest { uri, .. } if uri == "https://other/api"));
    assert_eq!(
        s.lake.properties,
        CatalogProperties::parse(["token=newer", "header.X-Tenant=a"]).unwrap()
    );
    let on_s3 = resolve(
        Some("[catalog]\nuri = \"http://cat:8181\"\nwarehouse = \"s3://bucket/lake\"\n"),
        &[],
        Raw::default(),
    )
    .unwrap();
    assert_eq!(
        on_s3.lake.warehouse,
        Warehouse::Uri("s3://bucket/lake".into())
    );
    for (text, key) in [
        ("[catalog]\ntype = \"glue\"\n", "warehouse"),
        ("[catalog]\ntype = \"hive\"\n", "catalog_type"),
        ("[catalog]\ntype = \"rest\"\n", "catalog_type"),
        ("catalog_property = [\"token=x\"]\n", "catalog_property"),
        (
            "catalog = \"/x/c.db\"\ncatalog_type = \"rest\"\n",
            "catalog_type",
        ),
        ("[catalog]\nname = \" \"\n", "catalog_name"),
    ] {
        let err = resolve(Some(text), &[], Raw::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    // The catalog's name: the table's `name`, which the flat key overrides;
    // `local` by default.
    let named = "[catalog]\nuri = \"sqlite:/x/c.db\"\nname = \"lakehouse\"\n";
    assert_eq!(
        resolve(Some(named), &[], Raw::default()).unwrap().lake.name,
        "lakehouse"
    );
    let flag = Raw {
        catalog_name: Some("prod".into()),
        ..Raw::default()
    };
    assert_eq!(resolve(Some(named), &[], flag).unwrap().lake.name, "prod");
    assert_eq!(
        resolve(None, &[], Raw::default()).unwrap().lake.name,
        "local"
    );
}

#[test]
fn an_s3_warehouse_and_catalog_properties_from_a_file_and_the_environment() {
    let s = resolve(
        Some("warehouse = \"s3://lake/shop\"\ncatalog_property = [\"s3.endpoint=http://minio:9000\"]\n"),
        &[],
        Raw::default(),
    )
    .unwrap();
    assert_eq!(s.lake.warehouse, Warehouse::Uri("s3://lake/shop".into()));
    assert_eq!(
        s.lake.properties,
        CatalogProperties::parse(["s3.endpoint=http://minio:9000"]).unwrap()
    );
    let err = resolve(
        None,
        &[("WAL2ICEBERG_CATALOG_PROPERTY", "s3.region=eu-west-1,oops")],
        Raw::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("catalog_property") && err.contains("WAL2ICEBERG_CATALOG_PROPERTY"),
        "{err}"
    );
    let err = resolve(
        None,
        &[],
        Raw {
            warehouse: Some("abfss://c@a.dfs.core.windows.net/w".into()),
            ..Raw::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("warehouse") && err.contains("abfss:// is not supported"),
        "{err}"
    );
}

#[test]
fn unknown_keys_are_errors_wherever_they_are() {
    let err = resolve(Some("slott = \"x\"\n"), &[], Raw::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("slott") && err.contains("config file"),
        "{err}"
    );
    let err = resolve(None, &[("WAL2ICEBERG_SLOTT", "x")], Raw::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("WAL2ICEBERG_SLOTT"), "{err}");
    resolve(None, &[("WAL2ICEBERG_PG_BIN", "/usr/bin")], Raw::default()).unwrap();
}

#[test]
fn each_error_names_the_option_its_origin_and_the_rule() {
    type Case<'a> = (Option<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            Some("max_batch_rows = 0"),
            vec![],
            "max_batch_rows (from the config file",
        ),
        (
            None,
            vec![("WAL2ICEBERG_FLUSH_INTERVAL", "soon")],
            "flush_interval (from the environment variable WAL2ICEBERG_FLUSH_INTERVAL)",
        ),
        (
            None,
            vec![("WAL2ICEBERG_MAX_BATCH_BYTES", "lots")],
            "WAL2ICEBERG_MAX_BATCH_BYTES must be a whole number",
        ),
        (
            None,
            vec![("WAL2ICEBERG_LOAD_CONNECTIONS", "0")],
            "load_connections (from the environment variable WAL2ICEBERG_LOAD_CONNECTIONS): \
             must be at least 1, not 0",
        ),
        (
            Some("log_format = \"xml\""),
            vec![],
            "log_format (from the config file",
        ),
        (Some("proto_version = 3"), vec![], "is not 1 or 2"),
        (
            Some("proto_version = 1\nstreaming = true"),
            vec![],
            "streaming",
        ),
        (Some("metrics_addr = \"localhost\""), vec![], "metrics_addr"),
        (
            Some("tables = [\"a.b.c\"]"),
            vec![],
            "tables (from the config file",
        ),
        (
            Some("tables = [\"public.a\"]\ntable_names = { \"public.b\" = \"x\" }"),
            vec![],
            "not among the tables",
        ),
        (
            Some("table_names = { \"public.a\" = \"a_changes\" }"),
            vec![],
            "_changes",
        ),
        (Some("max_batch_rows = \"ten\""), vec![], "config file"),
    ];
    for (text, env, expected) in cases {
        let err = resolve(text, &env, Raw::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    let flags = Raw {
        exit_when_idle: Some("6 days".into()),
        ..Raw::default()
    };
    let err = resolve(None, &[], flags).unwrap_err().to_string();
    assert!(
        err.contains("exit_when_idle (from the command line)"),
        "{err}"
    );
}

#[test]
fn durations_take_a_unit_or_mean_seconds() {
    let parse = |text| parse_duration("exit_when_idle", text);
    assert_eq!(parse("6"), Ok(Duration::from_secs(6)));
    assert_eq!(parse("6s"), Ok(Duration::from_secs(6)));
    assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse("1.5m"), Ok(Duration::from_secs(90)));
    assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
    for bad in ["", "s", "6 days", "-1s", "1e999", "6x"] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_duration_setting_refuses_a_value_past_its_ceiling() {
    for (key, longest) in LONGEST {
        assert_eq!(
            parse_duration(key, &format!("{}s", longest.as_secs())),
            Ok(*longest)
        );
        let err = parse_duration(key, &format!("{}s", longest.as_secs() + 1)).unwrap_err();
        assert!(err.contains("at most"), "{key}: {err}");
        let err = parse_duration(key, "150000000000d").unwrap_err();
        assert!(err.contains("150000000000d"), "{key}: {err}");
    }
    let flags = Raw {
        flush_interval: Some("2d".into()),
        storage_retry_deadline: Some("400d".into()),
        ..Raw::default()
    };
    let err = resolve(None, &[], flags).unwrap_err().to_string();
    assert!(
        err.contains("flush_interval (from the command line)"),
        "{err}"
    );
    assert!(
        err.contains("storage_retry_deadline (from the command line)"),
        "{err}"
    );
    assert!(err.contains("1h this setting takes at most"), "{err}");
}

#[test]
fn an_unknown_key_is_reported_at_its_own_line() {
    let err = resolve(
        Some("slot = \"s\"\npublication = \"p\"\nflush_intervall = \"2s\"\n"),
        &[],
        Raw::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("flush_intervall") && err.contains("line=3"),
        "{err}"
    );
}

/// The keys of the settings table of docs/configuration.md.
fn documented_keys() -> std::collections::BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .skip_while(|l| !l.starts_with("| setting |"))
        .skip(2)
        .take_while(|l| l.starts_with("| `"))
        .map(|l| l[3..].split('`').next().unwrap().to_owned())
        .collect()
}

#[test]
fn the_settings_the_docs_list_are_the_structs_flags_and_keys() {
    use clap::Args;
    let keys: std::collections::BTreeSet<String> =
        KEYS.iter().map(|(k, _)| (*k).to_owned()).collect();
    assert_eq!(
        documented_keys(),
        keys,
        "docs/configuration.md against KEYS"
    );
    let flags: std::collections::BTreeSet<String> = Raw::augment_args(clap::Command::new("t"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .chain(["table_names".to_owned()])
        .collect();
    assert_eq!(
        flags, keys,
        "Raw's flags (and table_names, file only) against KEYS"
    );
    // Every key is one of Raw's: a file naming each is read.
    let every: String = KEYS
        .iter()
        .map(|(key, kind)| {
            let value = match kind {
                Kind::Text => "\"x\"",
                Kind::List => "[]",
                Kind::Integer => "1",
                Kind::Bool => "false",
                Kind::Map => "{}",
            };
            format!("{key} = {value}\n")
        })
        .collect();
    let read: Raw = toml::from_str(&every).unwrap();
    assert_eq!(toml::Table::try_from(read).unwrap().len(), KEYS.len());
}

#[test]
fn streaming_is_a_flag_that_may_say_false() {
    use clap::Parser;
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        raw: Raw,
    }
    let parse = |args: &[&str]| Flags::try_parse_from([&["t"][..], args].concat()).map(|f| f.raw);
    assert_eq!(parse(&["--streaming"]).unwrap().streaming, Some(true));
    assert_eq!(
        parse(&["--streaming=false"]).unwrap().streaming,
        Some(false)
    );
    assert_eq!(parse(&[]).unwrap().streaming, None);
    let tables = parse(&["--streaming", "--tables", "a.b,c.d"]).unwrap();
    assert_eq!(
        tables.tables,
        Some(vec!["a.b".to_owned(), "c.d".to_owned()])
    );
    assert!(parse(&["--table-names", "x"]).is_err(), "a file-only key");
}

#[test]
fn the_lake_commands_take_the_lake_from_the_same_layers_and_no_source() {
    let f = file(
        r#"
        source = "port=notanumber"
        lake = "/srv/lake"
        namespace = "shop"
        [catalog]
        type = "sql"
        name = "lakehouse"
    "#,
    );
    let env = vars(&[("WAL2ICEBERG_LOG_FORMAT", "json")]);
    let run = Settings::resolve(Some(f.path()), env.clone(), Raw::default());
    assert!(run.is_err(), "a run needs a valid source");
    let flags = Raw {
        namespace: Some("sales".into()),
        ..Raw::default()
    };
    let lake = LakeSettings::resolve(Some(f.path()), env, flags).unwrap();
    assert_eq!(lake.namespace.as_deref(), Some("sales"));
    assert_eq!(lake.log_format, LogFormat::Json);
    assert_eq!(lake.lake.name, "lakehouse");
    assert_eq!(lake.lake.folder, Path::new("/srv/lake"));
}

#[test]
fn every_invalid_setting_is_told_at_once() {
    let err = resolve(
        Some(
            "flush_interval = \"often\"\n\
             max_batch_rows = 0\ntables = [\"a.b.c\"]\n",
        ),
        &[
            ("WAL2ICEBERG_METRICS_ADDR", "localhost"),
            (
                "WAL2ICEBERG_SOURCE",
                "host=db port=none user=app dbname=shop",
            ),
        ],
        Raw::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    let text = err.to_string();
    assert!(text.starts_with("5 settings are invalid:"), "{text}");
    for key in [
        "source (from the environment variable WAL2ICEBERG_SOURCE)",
        "port \"none\"",
        "flush_interval (from the config file",
        "max_batch_rows (from the config file",
        "tables (from the config file",
        "metrics_addr (from the environment variable WAL2ICEBERG_METRICS_ADDR)",
    ] {
        assert!(text.contains(key), "{key}: {text}");
    }
}
