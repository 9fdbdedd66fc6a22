//! The binary itself: `tail` prints the stream as JSON lines, consumes a
//! slot only when told to and then resumes after what it printed; `check`
//! and bad options exit non-zero with a message that says what to fix.

use serde_json::{Value, json};
use tokio::process::Command;

use crate::support::*;

async fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .env("RUST_LOG", "wal2iceberg=warn")
        .output()
        .await
        .expect("run wal2iceberg");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn change_ops(stdout: &str) -> String {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v["event"] == "change")
        .map(|v| v["op"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn each_commands_help_shows_the_flags_it_reads_and_the_others_are_still_accepted() {
    let flags = |help: &str| -> Vec<String> {
        help.lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| l.split([' ', '<', '[']).next().unwrap().to_owned())
            .collect()
    };
    let help = |command: &'static str| async move {
        let (code, stdout, stderr) = run(&[command, "--help"]).await;
        assert_eq!(code, 0, "{stderr}");
        flags(&stdout)
    };
    let run_flags = help("run").await;
    for flag in [
        "flush-interval",
        "metrics-addr",
        "exit-when-idle",
        "streaming",
        "lake",
    ] {
        assert!(run_flags.iter().any(|f| f == flag), "run: {run_flags:?}");
    }
    for (command, shown, hidden) in [
        (
            "status",
            &["source", "slot", "lake"][..],
            &["flush-interval", "tables", "streaming"][..],
        ),
        (
            "setup",
            &["source", "tables"],
            &["lake", "slot", "max-batch-rows"],
        ),
        (
            "tail",
            &["slot", "streaming", "exit-when-idle", "consume"],
            &["lake", "compact-after-files"],
        ),
        (
            "check",
            &["tables", "lake", "proto-version"],
            &["load-connections", "exit-when-idle"],
        ),
        (
            "verify",
            &["tables", "lake", "wait"],
            &["snapshot-retention"],
        ),
        (
            "drop-table",
            &["table", "lake", "publication"],
            &["tables", "heartbeat-interval"],
        ),
        ("teardown", &["slot", "drop-tables"], &["retain-snapshots"]),
        (
            "show",
            &["config", "lake", "catalog-uri", "namespace", "as-of"],
            &["source", "tables", "slot", "flush-interval"],
        ),
        (
            "compact",
            &["config", "lake", "catalog-property", "table"],
            &["source", "publication", "streaming"],
        ),
        (
            "expire-snapshots",
            &["config", "warehouse", "older-than", "retain-last"],
            &["source", "retain-snapshots", "exit-when-idle"],
        ),
    ] {
        let listed = help(command).await;
        for flag in shown {
            assert!(
                listed.iter().any(|f| f == flag),
                "{command} lacks --{flag}: {listed:?}"
            );
        }
        for flag in hidden {
            assert!(
                !listed.iter().any(|f| f == flag),
                "{command} lists --{flag}: {listed:?}"
            );
        }
    }
    // A flag left out of a command's help is still accepted there.
    let (code, _, stderr) = run(&[
        "status",
        "--flush-interval",
        "5s",
        "--source",
        "host=/nonexistent port=1 user=nobody dbname=x",
    ])
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

#[tokio::test]
async fn tail_consuming_its_slot_prints_the_load_then_changes_and_resumes_after_what_it_printed() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, plan text NOT NULL);
         INSERT INTO customers VALUES (1,'Ada','free'),(2,'Grace','pro'),(3,'Linus','free');
         CREATE PUBLICATION wal2iceberg FOR TABLE customers;",
    )
    .await;
    let url = db.config_url();
    let slot = unique("cli");
    let tail = [
        "tail",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--slot",
        &slot,
        "--consume",
        "--exit-when-idle",
        "1500ms",
    ];

    let (code, stdout, stderr) = run(&tail).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("never sees those changes"), "{stderr}");
    assert_eq!(change_ops(&stdout), "rrr", "{stdout}");
    let first: Value = serde_json::from_str(stdout.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        first["after"],
        serde_json::json!({"id": 1, "name": "Ada", "plan": "free"})
    );

    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    db.exec("DELETE FROM customers WHERE id = 3").await;
    let (code, stdout, stderr) = run(&tail).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(change_ops(&stdout), "ud", "{stdout}");

    let (code, stdout, _) = run(&tail).await;
    assert_eq!(code, 0);
    assert_eq!(
        change_ops(&stdout),
        "",
        "nothing printed before comes again: {stdout}"
    );
}

#[tokio::test]
async fn tail_never_consumes_a_slot_it_did_not_create_and_the_run_gets_every_change() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text);
         INSERT INTO customers VALUES (1, 'free'), (2, 'pro');",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("shared");
    let opts = run_options(&db, &["customers"], &slot, dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1; DELETE FROM customers WHERE id = 2;")
        .await;
    let url = db.config_url();
    let tail = |slot: Option<&str>| {
        let mut args = vec![
            "tail".to_owned(),
            "--source".into(),
            url.clone(),
            "--tables".into(),
            "public.customers".into(),
            "--publication".into(),
            opts.capture.publication.clone(),
            "--exit-when-idle".into(),
            "1500ms".into(),
        ];
        if let Some(slot) = slot {
            args.extend(["--slot".into(), slot.to_owned()]);
        }
        args
    };
    let run_tail = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args).await
    };

    // The run's slot, read twice: the same changes both times.
    for _ in 0..2 {
        let (code, stdout, stderr) = run_tail(tail(Some(&slot))).await;
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(change_ops(&stdout), "ud", "{stdout}");
    }
    // Consuming the run's slot is refused for the lake that records it.
    let confirmed = db.confirmed_flush(&slot).await;
    let mut consume = tail(Some(&slot));
    consume.extend(["--consume".into(), "--lake".into()]);
    consume.extend([
        dir.path().display().to_string(),
        "--namespace".into(),
        "shop".into(),
    ]);
    let (code, stdout, stderr) = run_tail(consume).await;
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains("is the lake's") && stderr.contains("Leave out --consume"),
        "{stderr}"
    );
    assert_eq!(change_ops(&stdout), "", "{stdout}");
    assert_eq!(db.confirmed_flush(&slot).await, confirmed);
    // A slot of its own: the rows now, and no slot left behind.
    let slots = db.slot_count().await;
    let (code, stdout, stderr) = run_tail(tail(None)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(change_ops(&stdout), "r", "{stdout}");
    assert_eq!(
        db.settled_slot_count(slots).await,
        slots,
        "the temporary slot is gone"
    );
    // A named slot that does not exist is not created.
    let (code, _, stderr) = run_tail(tail(Some("nobody_s_slot"))).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("--consume"), "{stderr}");
    assert_eq!(db.slot_count().await, slots);
    // Nor is a publication changed: a table it does not publish is refused.
    db.exec("CREATE TABLE unpublished(id int PRIMARY KEY)")
        .await;
    let mut other = tail(None);
    other[4] = "public.unpublished".into();
    let (code, _, stderr) = run_tail(other).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("does not publish public.unpublished") && stderr.contains("changes no"),
        "{stderr}"
    );
    assert_eq!(db.publishing("unpublished").await, 0);
    assert_eq!(db.slot_count().await, slots);

    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    assert_eq!(
        bronze_ops(dir.path(), "shop.customers_changes").await,
        "rrud"
    );
}

#[tokio::test]
async fn tail_stops_cleanly_on_sigterm_with_exit_0() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION wal2iceberg FOR TABLE t;")
        .await;
    let slots = db.slot_count().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(["tail", "--source", &db.config_url(), "--tables", "public.t"])
        .env("RUST_LOG", "wal2iceberg=warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while db.slot_count().await == slots {
        assert!(
            std::time::Instant::now() < give_up,
            "tail never made its slot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("tail stopped")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        db.settled_slot_count(slots).await,
        slots,
        "its temporary slot went with it"
    );
}

#[tokio::test]
async fn check_lists_failures_with_fixes_and_exits_non_zero() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE nokey(v text)").await;
    let url = db.config_url();
    let (code, stdout, _) = run(&["check", "--source", &url, "--tables", "nokey,missing"]).await;
    assert_eq!(code, 1);
    assert!(
        stdout.contains("[replica_identity]") && stdout.contains("REPLICA IDENTITY FULL"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[table_exists]") && stdout.contains("public.missing"),
        "{stdout}"
    );

    // Under FULL, run keeps the table's history (bronze) without a key.
    db.exec("ALTER TABLE nokey REPLICA IDENTITY FULL").await;
    let (code, stdout, _) = run(&["check", "--source", &url, "--tables", "nokey"]).await;
    assert_eq!(code, 0, "{stdout}");

    // What run refuses before its preflight, check refuses too: two
    // tables of one Iceberg name.
    db.exec(
        "CREATE SCHEMA sales; CREATE TABLE sales.x(id int PRIMARY KEY);
         CREATE TABLE public.sales__x(id int PRIMARY KEY);",
    )
    .await;
    let tables = "sales.x,public.sales__x";
    let (code, _, stderr) = run(&["check", "--source", &url, "--tables", tables]).await;
    let (run_code, _, run_stderr) = run(&["run", "--source", &url, "--tables", tables]).await;
    assert_eq!((code, run_code), (2, 2), "{stderr}\n{run_stderr}");
    assert!(stderr.contains("would both use"), "{stderr}");
}

#[tokio::test]
async fn malformed_options_exit_2_naming_the_problem() {
    let (code, _, stderr) = run(&["tail", "--source", "host=h bogus=1", "--tables", "t"]).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("unknown connection option \"bogus\""),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["tail", "--source", "host=h user=u", "--tables", "a.b.c"]).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("schema.table"), "{stderr}");
    let (code, _, stderr) = run(&[
        "tail",
        "--source",
        "host=h user=u",
        "--tables",
        "t",
        "--slot",
        "Bad",
    ])
    .await;
    assert_eq!(code, 2);
    assert!(stderr.contains("slot name"), "{stderr}");
}

#[tokio::test]
async fn unreachable_hosts_wrong_passwords_and_wrong_certificates_exit_1_saying_why() {
    let db = TestDb::new().await;
    ensure_role(&db.client, SCRAM_USER, "scram-sha-256").await;
    db.exec("CREATE TABLE t(id int PRIMARY KEY)").await;
    let port = server().pg.port();
    let dbname = &db.config.dbname;
    let ca = server().ca_file.display().to_string();
    let other_ca = {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    };
    let dir = tempfile::tempdir().unwrap();
    let other_ca_file = dir.path().join("other.pem");
    std::fs::write(&other_ca_file, other_ca).unwrap();
    let lake = dir.path().join("lake").display().to_string();
    let cases = [
        (
            format!("postgres://postgres@127.0.0.1:{}/{dbname}", free_port()),
            "onnection refused",
        ),
        (
            format!("postgres://{SCRAM_USER}:Wr0ng-pw@127.0.0.1:{port}/{dbname}"),
            "password authentication failed",
        ),
        // The certificate names localhost, not the address.
        (
            format!(
                "postgres://postgres@127.0.0.1:{port}/{dbname}?sslmode=verify-full&sslrootcert={ca}"
            ),
            "not valid for name",
        ),
        (
            format!(
                "postgres://postgres@localhost:{port}/{dbname}?sslmode=verify-full&sslrootcert={}",
                other_ca_file.display()
            ),
            "certificate",
        ),
    ];
    for (source, reason) in cases {
        let (code, _, stderr) = run(&[
            "run",
            "--source",
            &source,
            "--tables",
            "t",
            "--lake",
            &lake,
            "--exit-when-idle",
            "1s",
        ])
        .await;
        assert_eq!(code, 1, "{source}: {stderr}");
        assert!(stderr.contains(reason), "{source}: {stderr}");
        assert!(!stderr.contains("Wr0ng-pw"), "{stderr}");
        assert!(
            !std::path::Path::new(&lake).exists(),
            "{source}: a run that never connected made no lake"
        );
    }
    let slots = db.slot_count().await;
    assert_eq!(slots, 0, "no failed run left a slot behind");
}

#[tokio::test]
async fn demo_walks_the_seed_steps_and_cleans_up() {
    let (code, stdout, stderr) = run(&["demo"]).await;
    assert_eq!(code, 0, "{stderr}");
    let step7 = stdout.split("# step 7").nth(1).expect("step 7 printed");
    assert!(step7.contains("received 4 changes again"), "{stdout}");
    let silver: Vec<&str> = step7
        .lines()
        .filter(|l| l.starts_with("| 1 ") || l.starts_with("| 2 ") || l.starts_with("| 4 "))
        .collect();
    assert!(
        silver
            .iter()
            .any(|l| l.contains("Ada") && l.contains("team")),
        "{step7}"
    );
    assert!(
        silver
            .iter()
            .any(|l| l.contains("Barbara") && l.contains("free")),
        "{step7}"
    );
    assert!(
        !step7.contains("Linus"),
        "Linus is gone from silver: {step7}"
    );
    let bronze_rows = step7
        .lines()
        .filter(|l| {
            l.contains("| r ") || l.contains("| u ") || l.contains("| d ") || l.contains("| c ")
        })
        .count();
    assert_eq!(
        bronze_rows, 7,
        "bronze keeps seven rows after the replay: {step7}"
    );
}

#[tokio::test]
async fn run_loads_a_table_into_the_lake_and_reports_what_it_applied() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free'),(2,'pro');")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("clirun");
    let args = [
        "run",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--slot",
        &slot,
        "--lake",
        &lake_path,
        "--namespace",
        "shop",
        "--exit-when-idle",
        "1s",
    ];
    let (code, stdout, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("applied 2 changes"), "{stdout}");
    assert!(lake.path().join("catalog.db").is_file());
    assert!(
        lake.path()
            .join("warehouse/shop/customers_changes")
            .is_dir(),
        "bronze under the namespace"
    );

    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1")
        .await;
    let (code, stdout, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("applied 1 changes"), "{stdout}");

    // A table added to the list: one line says it loads beside the
    // stream, and nothing warns.
    db.exec("CREATE TABLE orders(id int PRIMARY KEY); INSERT INTO orders VALUES (1); UPDATE customers SET plan = 'pro' WHERE id = 1;")
        .await;
    let added = args.map(|a| match a {
        "public.customers" => "public.customers,public.orders",
        a => a,
    });
    let out = logged(&added).await;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let beside: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("loading beside the stream"))
        .collect();
    assert!(
        beside.len() == 1 && beside[0].contains("public.orders"),
        "{log}"
    );
    assert!(!log.lines().any(|l| l.contains(" WARN ")), "{log}");
}

#[tokio::test]
async fn sigterm_during_a_run_stops_cleanly_and_a_restart_loses_and_repeats_nothing() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE events(id int PRIMARY KEY, n int NOT NULL, note text)")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("sigterm");
    let base = [
        "run",
        "--source",
        &url,
        "--tables",
        "public.events",
        "--slot",
        &slot,
        "--lake",
        &lake_path,
        "--namespace",
        "shop",
        "--flush-interval",
        "100ms",
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(base)
        .env("RUST_LOG", "wal2iceberg=info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start wal2iceberg run");

    // Streaming, the initial load committed. The slot is active while it
    // is made too: writes then can fall inside the slot's snapshot, and a
    // stop during that load leaves the restart to read the table again,
    // every row a read (`r`) and none an insert.
    db.wait_until_streaming(&slot).await;

    // Transactions of 2,000 rows keep batches and transactions in flight.
    let db = &db;
    let write = |from: i32| {
        let sql = format!(
            "BEGIN;
             INSERT INTO events SELECT i, 0, 'n' || i FROM generate_series({from}, {}) i;
             UPDATE events SET n = n + 1 WHERE id % 7 = 0 AND id >= {from};
             COMMIT;",
            from + 1999
        );
        async move { db.exec(&sql).await }
    };
    let mut next = 1;
    for _ in 0..10 {
        write(next).await;
        next += 2000;
    }
    let pid = child.id().expect("pid").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    for _ in 0..3 {
        write(next).await;
        next += 2000;
    }
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");

    let mut again = base.to_vec();
    again.extend(["--exit-when-idle", "2s"]);
    let (code, _, stderr) = run(&again).await;
    assert_eq!(code, 0, "{stderr}");
    assert_reconciled(db, "events", lake.path(), "shop.events").await;
    let bronze = pyiceberg(lake.path(), "shop.events_changes", "rows").await;
    let rows = bronze.as_array().unwrap();
    let inserts = rows.iter().filter(|r| r["_cdc_op"] == "c").count();
    assert_eq!(inserts, (next - 1) as usize, "every insert exactly once");
    let mut ids: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["_cdc_commit_lsn"].as_i64().unwrap(),
                r["_cdc_seq"].as_i64().unwrap(),
            )
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), rows.len(), "no change twice");
}

#[tokio::test]
async fn status_shows_the_slot_as_the_server_does_and_each_tables_position() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("status");
    let common = ["--source", &url, "--slot", &slot, "--lake", &lake_path];
    let (code, stdout, _) = run(&[&["status"], &common[..]].concat()).await;
    assert_eq!(code, 0);
    assert!(stdout.contains("does not exist"), "{stdout}");

    let mut args = vec![
        "run",
        "--tables",
        "public.customers",
        "--exit-when-idle",
        "1s",
    ];
    args.extend(common);
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let before = db.wal_insert_lsn().await;
    db.exec("UPDATE customers SET plan = 'pro'").await;
    let after = db.wal_insert_lsn().await;
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");

    let wal_before = current_wal(&db).await;
    // A slot, and no lake where status was told to look: exit 1.
    let elsewhere = format!("{lake_path}/typo");
    let (code, stdout, _) = run(&[
        "status", "--source", &url, "--slot", &slot, "--lake", &elsewhere,
    ])
    .await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("no lake") && stdout.contains("typo"),
        "{stdout}"
    );
    // A lake, and a slot its tables do not record: exit 1 too.
    let (code, stdout, _) = run(&[
        "status", "--source", &url, "--slot", "nosuch", "--lake", &lake_path,
    ])
    .await;
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!("replicated from slot {slot}, not nosuch")),
        "{stdout}"
    );

    let (code, stdout, stderr) = run(&[&["status", "--json"], &common[..]].concat()).await;
    let wal_after = current_wal(&db).await;
    assert_eq!(code, 0, "{stderr}");
    let status: Value = serde_json::from_str(&stdout).unwrap();
    let row = db
        .client
        .query_one(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, active \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .unwrap();
    let s = &status["slot"];
    assert_eq!(s["confirmed_flush_lsn"], row.get::<_, String>(0));
    assert_eq!(s["restart_lsn"], row.get::<_, String>(1));
    assert_eq!(s["wal_status"], row.get::<_, String>(2));
    assert_eq!(s["active"], row.get::<_, bool>(3));
    let restart: wal2iceberg::model::Lsn = row.get::<_, String>(1).parse().unwrap();
    let retained = s["retained_wal_bytes"].as_i64().unwrap();
    assert!(
        (wal_before.0 - restart.0) as i64 <= retained
            && retained <= (wal_after.0 - restart.0) as i64,
        "{retained} between the WAL positions around the call"
    );
    let confirmed: wal2iceberg::model::Lsn = row.get::<_, String>(0).parse().unwrap();
    let lag = s["lag_bytes"].as_i64().unwrap();
    assert!(
        (wal_before.0 - confirmed.0) as i64 <= lag && lag <= (wal_after.0 - confirmed.0) as i64
    );

    let tables = status["tables"].as_array().unwrap();
    let names: Vec<&str> = tables
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            format!("{}.customers", db.config.dbname),
            format!("{}.customers_changes", db.config.dbname)
        ]
    );
    for t in tables {
        let lsn: wal2iceberg::model::Lsn = t["commit_lsn"].as_str().unwrap().parse().unwrap();
        assert!(before < lsn && lsn < after, "the update's commit: {t}");
        let lag = t["lag_seconds"].as_f64().unwrap();
        assert!((0.0..60.0).contains(&lag), "{t}");
        // The load and the update: two snapshots and two data files each;
        // silver deletes the old row by position. Nothing was compacted or
        // expired, so every file in the data folder is live.
        let silver = !t["table"].as_str().unwrap().ends_with("_changes");
        assert_eq!(t["snapshots"], 2, "{t}");
        assert_eq!(t["data_files"], 2, "{t}");
        assert_eq!(t["delete_files"], u64::from(silver), "{t}");
        assert_eq!(t["last_compaction"], Value::Null, "{t}");
        assert_eq!(t["last_expiry"], Value::Null, "{t}");
        let name = t["table"].as_str().unwrap().split('.').nth(1).unwrap();
        let data = lake
            .path()
            .join(format!("warehouse/{}/{name}/data", db.config.dbname));
        let bytes: u64 = std::fs::read_dir(&data)
            .unwrap()
            .map(|f| f.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(t["file_bytes"], bytes, "{t}");
    }
    let (_, text, _) = run(&[&["status"], &common[..]].concat()).await;
    assert!(
        text.contains("inactive")
            && text.contains("customers_changes")
            && text.contains("delete files"),
        "{text}"
    );
}

#[tokio::test]
async fn seconds_behind_is_the_age_of_the_oldest_commit_not_in_the_lake_stopped_or_running() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("behind");
    let common = ["--source", &url, "--slot", &slot, "--lake", &lake_path];
    let once = [
        &[
            "run",
            "--tables",
            "public.customers",
            "--exit-when-idle",
            "1s",
        ][..],
        &common[..],
    ]
    .concat();
    let status = || async {
        let (code, stdout, stderr) = run(&[&["status", "--json"], &common[..]].concat()).await;
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let (code, _, stderr) = run(&once).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(status().await["slot"]["seconds_behind"], json!(0.0));

    // Stopped: the age of the update not yet in the lake.
    db.exec("UPDATE customers SET plan = 'pro'").await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let behind = status().await["slot"]["seconds_behind"].as_f64().unwrap();
    assert!((2.0..60.0).contains(&behind), "{behind}");
    let (code, _, stderr) = run(&once).await;
    assert_eq!(code, 0, "{stderr}");
    let caught_up = status().await;
    assert_eq!(
        caught_up["slot"]["seconds_behind"],
        json!(0.0),
        "{caught_up}"
    );

    // A table's latency is its last transaction's, whatever came after
    // it with the same position (a compaction).
    let (code, _, stderr) = run(&["compact", "--lake", &lake_path]).await;
    assert_eq!(code, 0, "{stderr}");
    let compacted = status().await;
    let tables = |s: &Value| s["tables"].as_array().unwrap().clone();
    for (before, after) in tables(&caught_up).iter().zip(&tables(&compacted)) {
        assert_eq!(before["visible_time"], after["visible_time"], "{after}");
        assert_eq!(before["lag_seconds"], after["lag_seconds"], "{after}");
    }
    assert!(
        tables(&compacted)
            .iter()
            .zip(&tables(&caught_up))
            .any(|(a, b)| a["snapshots"].as_u64() > b["snapshots"].as_u64()),
        "a compaction committed: {compacted}"
    );

    // Running: the first pending transaction of a copy of the slot.
    let mut streaming = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args([&["run", "--tables", "public.customers"][..], &common[..]].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    db.wait_until_active(&slot).await;
    db.exec("UPDATE customers SET plan = 'team'").await;
    let held = status().await;
    assert_eq!(held["slot"]["active"], json!(true), "{held}");
    let behind = held["slot"]["seconds_behind"].as_f64().unwrap();
    assert!((0.0..60.0).contains(&behind), "{held}");
    streaming.kill().await.unwrap();
}

#[tokio::test]
async fn resync_while_stopped_keeps_bronzes_history_and_a_crash_inside_it_does_it_once() {
    let db = TestDb::new().await;
    db.exec(TOASTED_DOCS).await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("resync");
    let place = ["--source", &url, "--slot", &slot, "--lake", &lake_path];
    let once = [
        &["run", "--tables", "public.docs", "--exit-when-idle", "1s"][..],
        &place[..],
    ]
    .concat();
    let (code, _, stderr) = run(&once).await;
    assert_eq!(code, 0, "{stderr}");

    // Changes the next run streams, one leaving the large value alone
    // (TOAST) after another changed it; then the resync.
    db.exec(
        "UPDATE docs SET body = repeat('changed ', 800) WHERE id = 1;
         UPDATE docs SET n = 1 WHERE id = 1;
         DELETE FROM docs WHERE id = 2;
         INSERT INTO docs VALUES (4, 0, 'new');",
    )
    .await;
    let (code, stdout, stderr) =
        run(&[&["resync", "--table", "public.docs"][..], &place[..]].concat()).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("requested"), "{stdout}");

    // A crash between the resync's silver commit and bronze's: the next
    // run does the whole resync again, once.
    let crashed = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(&once)
        .env(
            wal2iceberg::failpoint::VARIABLE,
            "between-resync-silver-and-bronze:1",
        )
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&crashed.stderr);
    assert!(
        !crashed.status.success()
            && said.contains("failpoint between-resync-silver-and-bronze reached"),
        "{said}"
    );
    let (code, _, stderr) = run(&once).await;
    assert_eq!(code, 0, "{stderr}");

    assert_reconciled(
        &db,
        "docs",
        lake.path(),
        &format!("{}.docs", db.config.dbname),
    )
    .await;
    let bronze_table = format!("{}.docs_changes", db.config.dbname);
    // The load, the changes before the resync's snapshot, the reload.
    assert_eq!(bronze_ops(lake.path(), &bronze_table).await, "rrruudcrrr");
    let bronze = pyiceberg(lake.path(), &bronze_table, "rows").await;
    let rows = bronze.as_array().unwrap();
    let body: String = db
        .client
        .query_one("SELECT body FROM docs WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows[4]["body"].as_str(),
        Some(body.as_str()),
        "the value it had then"
    );
    let mut reloaded: Vec<i64> = rows[7..]
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    reloaded.sort_unstable();
    assert_eq!(reloaded, [1, 3, 4]);

    // Done: a later run resyncs nothing.
    let (code, _, stderr) = run(&once).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(bronze_ops(lake.path(), &bronze_table).await, "rrruudcrrr");
}

async fn current_wal(db: &TestDb) -> wal2iceberg::model::Lsn {
    let row = db
        .client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

#[tokio::test]
async fn teardown_asks_drops_only_what_wal2iceberg_made_and_keeps_the_lake_unless_told() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');
             CREATE TABLE other(id int PRIMARY KEY); CREATE PUBLICATION owners_pub FOR TABLE other;")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("teardown");
    let publication = unique("ourpub");
    let run_args = [
        "run",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--slot",
        &slot,
        "--publication",
        &publication,
        "--lake",
        &lake_path,
        "--exit-when-idle",
        "1s",
    ];
    let (code, _, stderr) = run(&run_args).await;
    assert_eq!(code, 0, "{stderr}");
    let count = |sql: &'static str, name: String| {
        let db = &db;
        async move {
            db.client
                .query_one(sql, &[&name])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1";
    let pubs = "SELECT count(*) FROM pg_publication WHERE pubname = $1";

    let teardown = [
        "teardown",
        "--source",
        &url,
        "--slot",
        &slot,
        "--publication",
        &publication,
        "--lake",
        &lake_path,
    ];
    let (code, _, stderr) = run(&teardown).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("not confirmed") && stderr.contains("--yes"),
        "{stderr}"
    );
    assert_eq!(
        count(slots, slot.clone()).await,
        1,
        "nothing dropped without a yes"
    );

    // Another slot of the database may read the publication: it stays
    // until the last slot's teardown.
    let second = unique("second");
    db.client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&second],
        )
        .await
        .unwrap();
    // A change the lake lacks: the slot is kept unless forced.
    db.exec("UPDATE customers SET plan = 'pro' WHERE id = 1")
        .await;
    let (code, stdout, stderr) = run(&[&teardown[..], &["--yes"]].concat()).await;
    assert_eq!(code, 1, "{stdout} {stderr}");
    assert!(
        stderr.contains("bytes of WAL past what the lake confirmed, with changes the lake lacks")
            && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(count(slots, slot.clone()).await, 1, "kept");
    let (code, stdout, stderr) = run(&[&teardown[..], &["--yes", "--force"]].concat()).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("slot {slot}: dropped"))
            && stdout.contains(&format!(
                "other slots of this database may read it ({second})"
            )),
        "{stdout}"
    );
    assert_eq!(count(slots, slot.clone()).await, 0);
    assert_eq!(count(pubs, publication.clone()).await, 1);
    let dbname = db.config.dbname.clone();
    assert!(
        stdout.contains(&format!(
            "table {dbname}.customers_changes: kept; it no longer claims slot {slot}"
        )),
        "{stdout}"
    );
    // The kept tables' history cannot go on from a new slot: refused,
    // none made.
    let (code, _, stderr) = run(&run_args).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "holds this table's history from replication slot \"{slot} (dropped)\""
        )),
        "{stderr}"
    );
    assert_eq!(count(slots, slot.clone()).await, 0);
    // Nor from a slot made later under that name: refused, the slot not
    // moved.
    db.client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .unwrap();
    db.exec("INSERT INTO customers VALUES (2, 'pro')").await;
    let made = db.confirmed_flush(&slot).await;
    let (code, _, stderr) = run(&run_args).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("holds this table's history from replication slot"),
        "{stderr}"
    );
    assert_eq!(db.confirmed_flush(&slot).await, made);
    db.client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .unwrap();
    let last = teardown.map(|a| {
        if a == slot.as_str() {
            second.as_str()
        } else {
            a
        }
    });
    let (code, stdout, stderr) = run(&[&last[..], &["--yes"]].concat()).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("publication {publication}: dropped")),
        "{stdout}"
    );
    assert_eq!(count(pubs, publication.clone()).await, 0);
    assert_eq!(
        pyiceberg(lake.path(), &format!("{dbname}.customers"), "rows")
            .await
            .as_array()
            .unwrap()
            .len(),
        1,
        "the lake is untouched"
    );

    // A publication someone else made stays; --drop-tables empties the lake.
    let keep = [
        "teardown",
        "--source",
        &url,
        "--slot",
        &slot,
        "--publication",
        "owners_pub",
        "--lake",
        &lake_path,
        "--drop-tables",
        "--yes",
    ];
    let (code, stdout, stderr) = run(&keep).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("kept"), "{stdout}");
    assert_eq!(count(pubs, "owners_pub".to_owned()).await, 1);
    assert!(
        stdout.contains(&format!("table {dbname}.customers: dropped")),
        "{stdout}"
    );
    assert!(
        !lake
            .path()
            .join(format!("warehouse/{dbname}/customers"))
            .exists()
    );
}

#[tokio::test]
async fn teardown_refuses_a_slot_in_use() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY)").await;
    let options = db.options(&["customers"]);
    let (_, stream) = open_fresh(&db, &options).await;
    let url = db.config_url();
    let (code, _, stderr) = run(&[
        "teardown",
        "--source",
        &url,
        "--slot",
        &options.slot,
        "--yes",
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("in use: the server's walsender process"),
        "{stderr}"
    );
    assert!(
        db.confirmed_flush(&options.slot).await.is_some(),
        "the slot stays"
    );
    stream.stop().await.unwrap();
}

#[tokio::test]
async fn check_beside_a_running_run_says_a_run_holds_the_slot_and_exits_3() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY)").await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("held");
    let mut opts = run_options(&db, &["customers"], &slot, dir.path());
    opts.run.exit_when_idle = None;
    let shutdown = opts.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { wal2iceberg::apply::run(&config, &opts).await });
    db.wait_until_streaming(&slot).await;
    let url = db.config_url();
    let lake = dir.path().display().to_string();
    let check = [
        "check",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--slot",
        &slot,
        "--publication",
        "pub",
        "--lake",
        &lake,
        "--namespace",
        "shop",
    ];
    let (code, stdout, _) = run(&check).await;
    assert_eq!(code, 3, "{stdout}");
    assert!(
        stdout.contains("a wal2iceberg run")
            && stdout.contains("application_name \"wal2iceberg\"")
            && stdout.contains("connected from")
            && stdout.contains("the server's walsender process")
            && !stdout.contains("pg_terminate_backend"),
        "{stdout}"
    );
    shutdown.request();
    pipeline.await.unwrap().unwrap();
    let (code, stdout, _) = run(&check).await;
    assert_eq!(code, 0, "{stdout}");
}

/// `run` of `public.customers` from `url` on `slot` into `lake`, until the
/// stream is quiet for a second.
fn customers_run<'a>(url: &'a str, slot: &'a str, lake: &'a str) -> [&'a str; 11] {
    [
        "run",
        "--source",
        url,
        "--tables",
        "public.customers",
        "--slot",
        slot,
        "--lake",
        lake,
        "--exit-when-idle",
        "1s",
    ]
}

#[tokio::test]
async fn show_prints_a_table_as_of_an_lsn_as_text_json_or_csv() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free'),(2,'pro');")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("show");
    let args = customers_run(&url, &slot, &lake_path);
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let loaded_at = db.wal_insert_lsn().await.to_string();
    db.exec("UPDATE customers SET plan = 'team' WHERE id = 1; DELETE FROM customers WHERE id = 2;")
        .await;
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");

    let show = |extra: &[&str]| {
        let mut a = vec!["show", "customers", "--lake", &lake_path];
        a.extend_from_slice(extra);
        let a: Vec<String> = a.into_iter().map(str::to_owned).collect();
        async move {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            run(&a).await
        }
    };
    let (code, now, stderr) = show(&["--format", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let now: Value = serde_json::from_str(&now).unwrap();
    assert_eq!(now.as_array().unwrap().len(), 1);
    assert_eq!(now[0]["plan"], "team");
    // LSNs in PostgreSQL's form, which --as-of takes, as it takes the
    // lake's integer.
    let lsn: wal2iceberg::model::Lsn = now[0]["_cdc_commit_lsn"].as_str().unwrap().parse().unwrap();
    let (code, same, stderr) = show(&["--as-of", &lsn.0.to_string(), "--format", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&same).unwrap(), now);

    let (code, then, stderr) = show(&["--as-of", &loaded_at, "--format", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let then: Value = serde_json::from_str(&then).unwrap();
    let plans: Vec<&str> = then
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["plan"].as_str().unwrap())
        .collect();
    assert_eq!(plans, ["free", "pro"], "the table as it was after the load");

    let (code, text, _) = show(&[]).await;
    assert_eq!(code, 0);
    assert!(
        text.contains("| team") && text.contains("_cdc_commit_lsn"),
        "{text}"
    );

    let (code, csv, stderr) = show(&["--format", "csv", "--limit", "1"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(csv.lines().count(), 2, "a header and one row: {csv}");
    assert!(csv.starts_with("id,plan,_cdc_commit_lsn"), "{csv}");

    let (code, bronze, stderr) = run(&[
        "show",
        "customers_changes",
        "--lake",
        &lake_path,
        "--format",
        "csv",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        bronze.lines().count(),
        5,
        "header, two loads, an update, a delete: {bronze}"
    );

    // Schema changes since: a snapshot before them shows the columns of
    // its time, under their names then.
    db.exec(
        "ALTER TABLE customers ADD COLUMN note text;
         ALTER TABLE customers RENAME COLUMN plan TO tier;
         UPDATE customers SET note = 'n', tier = 'gold' WHERE id = 1;",
    )
    .await;
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, then_again, stderr) = show(&["--as-of", &loaded_at, "--format", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&then_again).unwrap(), then);
    let (code, history, stderr) = run(&[
        "show",
        "customers_changes",
        "--lake",
        &lake_path,
        "--as-of",
        &loaded_at,
        "--format",
        "csv",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        history.lines().count(),
        3,
        "header and the two loads: {history}"
    );

    let (code, _, stderr) = show(&["--as-of", "0/1"]).await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("no snapshot as of") && stderr.contains("its history starts later"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["show", "nope", "--lake", &lake_path]).await;
    assert_ne!(code, 0);
    assert!(stderr.contains("no such table"), "{stderr}");

    // A typo'd age is refused before anything is expired: its cutoff
    // would lie in the future and take every snapshot past --retain-last.
    let (code, _, stderr) = run(&[
        "expire-snapshots",
        "--lake",
        &lake_path,
        "--older-than",
        "150000000000d",
        "--retain-last",
        "1",
        "customers",
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--older-than") && stderr.contains("3650d this setting takes at most"),
        "{stderr}"
    );
    let (code, _, stderr) = show(&["--as-of", &loaded_at]).await;
    assert_eq!(code, 0, "the refused expiry removed nothing: {stderr}");

    // Once expiry removed the snapshot, --as-of says so, and what is kept.
    let (code, _, stderr) = run(&[
        "expire-snapshots",
        "--lake",
        &lake_path,
        "--older-than",
        "0s",
        "--retain-last",
        "1",
        "customers",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = show(&["--as-of", &loaded_at]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("expiry removed the snapshots that far back")
            && stderr.contains("the oldest kept is snapshot"),
        "{stderr}"
    );
}

#[tokio::test]
async fn show_prints_uuids_with_dashes_and_json_numerics_exactly_and_nulls_as_null() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE t(id uuid PRIMARY KEY, amount numeric(30,10), note text);
         INSERT INTO t VALUES ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 12345678901234567890.0123456789, NULL);",
    )
    .await;
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let (code, _, stderr) = run(&[
        "run",
        "--source",
        &db.config_url(),
        "--tables",
        "public.t",
        "--slot",
        &unique("show_values"),
        "--lake",
        &lake_path,
        "--exit-when-idle",
        "1s",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, json, stderr) = run(&["show", "t", "--lake", &lake_path, "--format", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    let rows: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        rows[0]["id"], "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "{json}"
    );
    assert_eq!(
        rows[0]["amount"], "12345678901234567890.0123456789",
        "{json}"
    );
    assert_eq!(rows[0].get("note"), Some(&Value::Null), "{json}");
    let (code, text, stderr) = run(&["show", "t", "--lake", &lake_path]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        "{text}"
    );
}

#[tokio::test]
async fn a_config_file_env_and_flags_layer_in_that_order_and_bad_values_stop_before_connecting() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');")
        .await;
    let lake = tempfile::tempdir().unwrap();
    let slot = unique("config");
    let config = lake.path().join("wal2iceberg.toml");
    std::fs::write(
        &config,
        format!(
            "source = {url:?}\ntables = [\"public.customers\"]\nslot = \"not_this_one\"\nlake = {lake:?}\n\
             namespace = \"from_file\"\nexit_when_idle = \"1s\"\ntable_names = {{ \"public.customers\" = \"clients\" }}\n",
            url = db.config_url(),
            lake = lake.path().display().to_string(),
        ),
    )
    .unwrap();
    let config_path = config.display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(["run", "--config", &config_path, "--slot", &slot])
        .env("WAL2ICEBERG_NAMESPACE", "from_env")
        .env("WAL2ICEBERG_SLOT", "nor_this_one")
        .output()
        .await
        .unwrap();
    assert_success(&out);
    assert!(db.confirmed_flush(&slot).await.is_some(), "the flag's slot");
    assert_eq!(
        id_plan_rows(lake.path(), "from_env.clients").await,
        [(1, "free".to_owned())],
        "the environment's namespace, the file's table name"
    );

    // The catalog file and the warehouse may live apart.
    let apart = tempfile::tempdir().unwrap();
    let catalog = apart.path().join("meta/catalog.sqlite");
    let warehouse = apart.path().join("data");
    let (catalog_arg, warehouse_arg) = (
        catalog.display().to_string(),
        warehouse.display().to_string(),
    );
    let other_slot = unique("apart");
    let (code, _, stderr) = run(&[
        "run",
        "--config",
        &config_path,
        "--slot",
        &other_slot,
        "--catalog",
        &catalog_arg,
        "--warehouse",
        &warehouse_arg,
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(catalog.is_file() && warehouse.join("from_file/clients").is_dir());
    let (code, json, stderr) = run(&[
        "show",
        "from_file.clients",
        "--catalog",
        &catalog_arg,
        "--format",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(json.contains("\"plan\":\"free\""), "{json}");

    // Bad values: exit 2, naming the option and where it came from, before
    // any connection (the source here would not answer).
    std::fs::write(&config, "source = \"host=192.0.2.1 user=x dbname=y connect_timeout=30\"\ntables = [\"public.t\"]\nflush_interval = \"often\"\n").unwrap();
    let started = std::time::Instant::now();
    let (code, _, stderr) = run(&["run", "--config", &config_path]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("flush_interval (from the config file"),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    std::fs::write(&config, "tables = [\"public.t\"]\nflushinterval = \"1s\"\n").unwrap();
    let (code, _, stderr) = run(&["run", "--config", &config_path]).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("flushinterval"), "{stderr}");
    let (code, _, stderr) = run(&["run", "--config", "/nonexistent/wal2iceberg.toml"]).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read the config file"), "{stderr}");
}

/// The value of one sample line of a scrape.
fn sample(scrape: &str, series: &str) -> f64 {
    sample_if_any(scrape, series).unwrap_or_else(|| panic!("no {series} in\n{scrape}"))
}

/// The value of one sample line of a scrape, if the series has one.
fn sample_if_any(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test]
async fn metrics_show_the_lag_and_the_counters_move_during_a_run() {
    use tokio::io::AsyncBufReadExt;
    let db = TestDb::new().await;
    db.exec("CREATE TABLE events(id int PRIMARY KEY, note text)")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("metrics");
    let start = || async {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
            .stdout(std::process::Stdio::null())
            .args([
                "run",
                "--source",
                &url,
                "--tables",
                "public.events",
                "--slot",
                &slot,
                "--lake",
                &lake_path,
                "--flush-interval",
                "100ms",
                "--metrics-addr",
                "127.0.0.1:0",
                "--retained-wal-warn-bytes",
                "1",
                "--compact-after-files",
                "2",
            ])
            .env("RUST_LOG", "wal2iceberg=info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = metrics_address(&mut lines).await;
        let logged = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let log = logged.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        (child, addr, logged)
    };
    let (mut child, addr, logged) = start().await;
    assert_eq!(http_get(&addr, "/healthz").await, "ok\n");

    let applied = "wal2iceberg_changes_applied_total{table=\"public.events\",op=\"c\"}";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut next = 0;
    let scrape = loop {
        db.exec(&format!(
            "INSERT INTO events SELECT i, repeat('x', 100) FROM generate_series({}, {}) i",
            next + 1,
            next + 100
        ))
        .await;
        next += 100;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let scrape = http_get(&addr, "/metrics").await;
        let seen = scrape.lines().any(|l| l.starts_with(applied));
        // Seconds behind has a sample once the stream read past one of
        // the monitor's looks at the source's WAL end (every 5 s).
        let behind_known = sample_if_any(&scrape, "wal2iceberg_seconds_behind").is_some();
        if seen
            && behind_known
            && sample(&scrape, "wal2iceberg_retained_wal_over_threshold") == 1.0
            && sample(&scrape, "wal2iceberg_compactions_total") >= 1.0
        {
            break scrape;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics never moved:\n{scrape}"
        );
    };
    assert!(sample(&scrape, applied) >= 100.0);
    let behind = sample(&scrape, "wal2iceberg_lag_seconds");
    assert!((0.0..60.0).contains(&behind), "{scrape}");
    assert_eq!(
        sample(&scrape, "wal2iceberg_seconds_behind"),
        behind,
        "the old name serves the same sample"
    );
    assert!(sample(&scrape, "wal2iceberg_received_bytes_total") > 0.0);
    assert!(sample(&scrape, "wal2iceberg_iceberg_commits_total") >= 2.0);
    assert!(sample(&scrape, "wal2iceberg_commit_to_visible_seconds_count") >= 1.0);
    assert!(
        scrape.contains("wal2iceberg_replication_lag_bytes "),
        "{scrape}"
    );
    assert!(scrape.contains("# TYPE wal2iceberg_iceberg_commit_duration_seconds histogram"));
    // Compaction every second data file, and an expiry after each.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for stamp in [
        "wal2iceberg_last_compaction_timestamp_seconds",
        "wal2iceberg_last_expiry_timestamp_seconds",
    ] {
        let at = sample(&scrape, stamp);
        assert!(now - 120.0 < at && at <= now + 1.0, "{stamp} {at}");
    }
    let data_files = sample(
        &scrape,
        "wal2iceberg_silver_files{table=\"public.events\",content=\"data\"}",
    );
    assert!(
        (1.0..=3.0).contains(&data_files),
        "at most two files since the last compaction, and its own: {data_files}"
    );
    // Both lake tables, as their last compaction or expiry left them.
    for table in ["events", "events_changes"] {
        let table = format!("{}.{table}", db.config.dbname);
        let bytes = sample(
            &scrape,
            &format!("wal2iceberg_lake_table_bytes{{table=\"{table}\"}}"),
        );
        let files = sample(
            &scrape,
            &format!("wal2iceberg_lake_table_files{{table=\"{table}\",content=\"data\"}}"),
        );
        assert!(
            bytes > 0.0 && files >= 1.0,
            "{table}: {files} files, {bytes} bytes"
        );
    }

    db.exec("INSERT INTO events VALUES (-1, 'one more')").await;
    let before = sample(&scrape, applied);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let later = http_get(&addr, "/metrics").await;
        if sample(&later, applied) > before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the counter did not move"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(sample(&scrape, "wal2iceberg_retained_wal_bytes") > 1.0);
    let pid = child.id().unwrap().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    let logged = logged.lock().unwrap().clone();
    assert!(
        logged.contains("retains more WAL than the threshold"),
        "a loud warning: {logged}"
    );
    // Each commit's line says what it wrote, table by table.
    let commit_line = logged
        .lines()
        .find(|l| l.contains("batch committed and confirmed") && l.contains("inserts 100,"))
        .unwrap_or_else(|| panic!("{logged}"));
    assert!(
        commit_line
            .contains("tables=public.events (inserts 100, updates 0, deletes 0, rows 100, files "),
        "{commit_line}"
    );
    assert!(!scrape.contains("NaN"), "{scrape}");

    // Restarted on a caught-up lake: the last source commit's age known
    // from the lake before any change arrives, and nothing behind once
    // what the server sends at the start (a transaction whose
    // confirmation it had not yet taken, say) is committed.
    let (mut child, addr, _) = start().await;
    let age = "wal2iceberg_last_source_commit_age_seconds ";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let scrape = loop {
        let scrape = http_get(&addr, "/metrics").await;
        assert!(!scrape.contains("NaN"), "{scrape}");
        if scrape.lines().any(|l| l.starts_with(age))
            && sample_if_any(&scrape, "wal2iceberg_seconds_behind") == Some(0.0)
        {
            break scrape;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never caught up: {scrape}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let age = sample(&scrape, age.trim_end());
    assert!((0.0..120.0).contains(&age), "{scrape}");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn no_output_of_any_command_ever_shows_the_password() {
    let db = TestDb::new().await;
    ensure_role(&db.client, SCRAM_USER, "scram-sha-256").await;
    let dbname = db.config.dbname.clone();
    db.exec(&format!(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');
         ALTER TABLE customers OWNER TO {SCRAM_USER}; GRANT CREATE ON DATABASE {dbname} TO {SCRAM_USER};"
    ))
    .await;
    let url = format!(
        "postgres://{SCRAM_USER}:{PASSWORD}@127.0.0.1:{}/{dbname}?sslmode=require",
        server().pg.port()
    );
    let wrong = url.replace(PASSWORD, "Wr0ng-s3cret");
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("secret");
    let common = [
        "--slot",
        &slot,
        "--lake",
        &lake_path,
        "--tables",
        "public.customers",
    ];
    let mut outputs = String::new();
    for (source, command, extra) in [
        (&url, "check", &[][..]),
        (
            &url,
            "run",
            &["--exit-when-idle", "1s", "--log-format", "json"][..],
        ),
        (&url, "status", &["--json"][..]),
        (&wrong, "run", &["--exit-when-idle", "1s"][..]),
        (&url, "teardown", &["--yes"][..]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
            .arg(command)
            .args(["--source", source])
            .args(common)
            .args(extra)
            .env("RUST_LOG", "trace")
            .output()
            .await
            .unwrap();
        outputs.push_str(&String::from_utf8_lossy(&out.stdout));
        outputs.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    assert!(
        outputs.contains("applied 1 changes"),
        "the run worked: {outputs}"
    );
    assert!(
        outputs.contains("password"),
        "the wrong password was reported: {outputs}"
    );
    assert!(
        !outputs.contains(PASSWORD),
        "the password leaked:\n{outputs}"
    );
    assert!(
        !outputs.contains("Wr0ng-s3cret"),
        "the wrong password leaked:\n{outputs}"
    );
}

#[tokio::test]
async fn setup_prepares_the_source_so_a_least_privileged_role_runs_the_pipeline() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free');
         CREATE TABLE nokey(x int);",
    )
    .await;
    let admin = db.config_url();
    let (code, _, stderr) = run(&[
        "setup",
        "--source",
        &admin,
        "--tables",
        "public.customers,public.nokey",
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("nokey") && stderr.contains("REPLICA IDENTITY FULL"),
        "{stderr}"
    );
    assert_eq!(publications(&db.client).await, 0, "nothing changed");

    for _ in 0..2 {
        let (code, stdout, stderr) =
            run(&["setup", "--source", &admin, "--tables", "public.customers"]).await;
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("role wal2iceberg"), "{stdout}");
    }
    assert_eq!(publications(&db.client).await, 1);

    // The role owns nothing and may only read the table and replicate.
    let lake = tempfile::tempdir().unwrap();
    let slot = unique("least");
    // No --tables: the publication setup made says which.
    let run_least = || run_as_setup_role(&admin, &slot, lake.path());
    let (code, _, stderr) = run_least().await;
    assert_eq!(code, 0, "{stderr}");
    db.exec("UPDATE customers SET plan = 'pro'").await;
    let (code, _, stderr) = run_least().await;
    assert_eq!(code, 0, "{stderr}");
    assert_reconciled(&db, "customers", lake.path(), "shop.customers").await;

    // A table added later: the role cannot publish it, and is told how.
    db.exec("CREATE TABLE orders(id int PRIMARY KEY); GRANT SELECT ON orders TO wal2iceberg;")
        .await;
    let least = admin.replace("postgres@", "wal2iceberg@");
    let lake_path = lake.path().display().to_string();
    let (code, _, stderr) = run(&[
        "run",
        "--source",
        &least,
        "--slot",
        &slot,
        "--lake",
        &lake_path,
        "--namespace",
        "shop",
        "--tables",
        "public.customers,public.orders",
        "--exit-when-idle",
        "1s",
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        stderr.contains("wal2iceberg setup --tables public.orders ")
            && stderr.contains("ALTER PUBLICATION"),
        "{stderr}"
    );

    // Its teardown drops its slot and says it cannot drop the owner's
    // publication, and what the owner runs: exit 1, something is left.
    let (code, stdout, stderr) =
        run(&["teardown", "--source", &least, "--slot", &slot, "--yes"]).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("slot {slot}: dropped"))
            && stdout.contains("NOT dropped")
            && stdout.contains("DROP PUBLICATION \"wal2iceberg\";"),
        "{stdout}"
    );
    assert_eq!(publications(&db.client).await, 1);
    let owner: String = db
        .client
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE tablename = 'customers'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "postgres");
}

#[tokio::test]
async fn setup_again_takes_a_partitioned_table_into_a_publication_an_older_setup_made() {
    let db = TestDb::new().await;
    // The publication as migration 002 made it before partitioned tables
    // were captured: without publish_via_partition_root.
    db.exec(
        "CREATE PUBLICATION wal2iceberg; COMMENT ON PUBLICATION wal2iceberg IS 'created by wal2iceberg';
         CREATE TABLE ev(id int PRIMARY KEY, v int) PARTITION BY RANGE (id);
         CREATE TABLE ev_a PARTITION OF ev FOR VALUES FROM (0) TO (10);
         CREATE TABLE ev_b PARTITION OF ev FOR VALUES FROM (10) TO (MAXVALUE);
         INSERT INTO ev SELECT i, i FROM generate_series(0, 19) i;",
    )
    .await;
    let admin = db.config_url();
    for _ in 0..2 {
        let (code, _, stderr) = run(&["setup", "--source", &admin, "--tables", "public.ev"]).await;
        assert_eq!(code, 0, "{stderr}");
    }
    let via_root: bool = db
        .client
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'wal2iceberg'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(via_root);
    let lake = tempfile::tempdir().unwrap();
    let slot = unique("parts");
    let run_least = || run_as_setup_role(&admin, &slot, lake.path());
    let (code, _, stderr) = run_least().await;
    assert_eq!(code, 0, "{stderr}");
    db.exec("UPDATE ev SET id = id + 100 WHERE id < 5; DELETE FROM ev WHERE id = 15; INSERT INTO ev VALUES (3, 3);")
        .await;
    let (code, _, stderr) = run_least().await;
    assert_eq!(code, 0, "{stderr}");
    assert_reconciled(&db, "ev", lake.path(), "shop.ev").await;
}

/// `run` as the role setup made, on the publication's tables, until the
/// stream is quiet for a second.
async fn run_as_setup_role(
    admin: &str,
    slot: &str,
    lake: &std::path::Path,
) -> (i32, String, String) {
    let least = admin.replace("postgres@", "wal2iceberg@");
    let lake = lake.display().to_string();
    run(&[
        "run",
        "--source",
        &least,
        "--slot",
        slot,
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--exit-when-idle",
        "1s",
    ])
    .await
}

async fn publications(client: &wal2iceberg::pg::source::SourceClient) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_publication WHERE pubname = 'wal2iceberg'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs the binary with its standard output a pipe whose reader is gone
/// before anything is written (`| head -1` once head has its line): exit
/// code and standard error.
async fn run_into_closed_pipe(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"))
        .args(args)
        .env("RUST_LOG", "wal2iceberg=warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run wal2iceberg");
    drop(child.stdout.take());
    let out = child
        .wait_with_output()
        .await
        .expect("wait for wal2iceberg");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn show_and_tail_end_quietly_with_exit_0_when_their_reader_goes_away() {
    let db = TestDb::new().await;
    db.exec("CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1,'free'),(2,'pro');")
        .await;
    let url = db.config_url();
    let lake = tempfile::tempdir().unwrap();
    let lake_path = lake.path().display().to_string();
    let slot = unique("pipe");
    let (code, _, stderr) = run(&customers_run(&url, &slot, &lake_path)).await;
    assert_eq!(code, 0, "{stderr}");

    for format in ["table", "json", "csv"] {
        let (code, stderr) = run_into_closed_pipe(&[
            "show",
            "customers",
            "--lake",
            &lake_path,
            "--format",
            format,
        ])
        .await;
        assert_eq!((code, stderr.as_str()), (0, ""), "show --format {format}");
    }
    let (code, stderr) = run_into_closed_pipe(&[
        "tail",
        "--source",
        &url,
        "--tables",
        "public.customers",
        "--exit-when-idle",
        "1s",
    ])
    .await;
    assert_eq!((code, stderr.as_str()), (0, ""), "tail");
}

#[tokio::test]
async fn drop_table_takes_one_table_out_of_the_lake_and_the_publication_and_it_can_come_back() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE customers(id int PRIMARY KEY, plan text); INSERT INTO customers VALUES (1, 'free');
         CREATE TABLE orders(id int PRIMARY KEY, total int); INSERT INTO orders VALUES (1, 10);",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let slot = unique("drop");
    let both = run_options(&db, &["customers", "orders"], &slot, dir.path());
    wal2iceberg::apply::run(&db.config, &both).await.unwrap();
    let url = db.config_url();
    let lake = dir.path().display().to_string();
    let drop = [
        "drop-table",
        "--source",
        &url,
        "--lake",
        &lake,
        "--namespace",
        "shop",
        "--publication",
        "pub",
        "--table",
        "public.orders",
        "--yes",
    ];

    // Beside a running run: refused, nothing dropped.
    let mut streaming = run_options(&db, &["customers", "orders"], &slot, dir.path());
    streaming.run.exit_when_idle = None;
    let shutdown = streaming.shutdown.clone();
    let config = db.config.clone();
    let pipeline = tokio::spawn(async move { wal2iceberg::apply::run(&config, &streaming).await });
    db.wait_until_streaming(&slot).await;
    let (code, _, stderr) = run(&drop).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("lock"), "{stderr}");
    shutdown.request();
    pipeline.await.unwrap().unwrap();
    let kept = dir.path().join("state/shop/orders");
    assert!(
        kept.join("index.json").exists(),
        "the clean stop kept the key index"
    );

    // By a role that may not change the publication: refused before
    // anything is dropped, with the statement its owner runs.
    let role = unique("plain");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    let plain = url.replace("postgres@", &format!("{role}@"));
    let by_plain = drop.map(|a| if a == url { plain.as_str() } else { a });
    let (code, _, stderr) = run(&by_plain).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("ALTER PUBLICATION \"pub\" DROP TABLE \"public\".\"orders\";")
            && stderr.contains("nothing dropped"),
        "{stderr}"
    );
    assert!(kept.join("index.json").exists() && dir.path().join("warehouse/shop/orders").exists());
    assert_eq!(db.publishing("orders").await, 1);

    let (code, stdout, stderr) = run(&drop).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!kept.exists(), "the key index goes with the table");
    assert!(dir.path().join("state/shop/customers").exists());
    assert!(
        stdout.contains("table shop.orders_changes: dropped")
            && stdout.contains("table shop.orders: dropped")
            && stdout.contains("public.orders removed"),
        "{stdout}"
    );
    assert!(
        !dir.path().join("warehouse/shop/orders").exists()
            && dir.path().join("warehouse/shop/customers").exists(),
        "its files are gone, the other table's stay"
    );
    assert_eq!(db.publishing("orders").await, 0);

    // Runs no longer apply it; named again, it is loaded afresh.
    db.exec("UPDATE orders SET total = 20; UPDATE customers SET plan = 'pro';")
        .await;
    let customers = run_options(&db, &["customers"], &slot, dir.path());
    wal2iceberg::apply::run(&db.config, &customers)
        .await
        .unwrap();
    assert_reconciled(&db, "customers", dir.path(), "shop.customers").await;
    let (code, stdout, _) = run(&["show", "orders", "--lake", &lake, "--namespace", "shop"]).await;
    assert_ne!(code, 0, "{stdout}");
    wal2iceberg::apply::run(&db.config, &both).await.unwrap();
    assert_reconciled(&db, "orders", dir.path(), "shop.orders").await;

    // The last table out: the slot claims nothing of the lake now, which
    // drop-table says, and a run of the lake on it is refused.
    let (code, stdout, stderr) = run(&drop).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("no other table"), "{stdout}");
    let drop_customers = drop.map(|a| match a {
        "public.orders" => "public.customers",
        a => a,
    });
    let (code, stdout, stderr) = run(&drop_customers).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "slot {slot}: the lake holds no other table from it"
        )),
        "{stdout}"
    );
    let refused = wal2iceberg::apply::run(&db.config, &both)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!(
            "replication slot {slot:?} exists, and this lake records no table"
        )),
        "{refused}"
    );
}

#[tokio::test]
async fn show_prints_infinite_dates_and_timestamps_as_postgresql_does() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE inf(id int PRIMARY KEY, ts timestamp, tz timestamptz, d date, tsa timestamp[]);
         ALTER TABLE inf REPLICA IDENTITY FULL;
         INSERT INTO inf VALUES (1, 'infinity', '-infinity', 'infinity', ARRAY['infinity', '2026-01-01']::timestamp[]),
                                (2, '2026-12-01 10:00:00', '2026-12-01 10:00:00+00', '2026-12-01', NULL),
                                (3, '294247-01-10 04:00:54.775806', NULL, '5874897-12-31', NULL);",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["inf"], &unique("inf"), dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    // Bronze: infinite values in the before image too.
    db.exec("UPDATE inf SET ts = '2027-01-01' WHERE id = 1")
        .await;
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let lake = dir.path().display().to_string();
    let show_table = |table: &'static str, format: &'static str| {
        let lake = lake.clone();
        async move {
            run(&[
                "show",
                table,
                "--lake",
                &lake,
                "--namespace",
                "shop",
                "--format",
                format,
            ])
            .await
        }
    };
    let (code, json, stderr) = show_table("inf", "json").await;
    assert_eq!(code, 0, "{stderr}");
    let rows: Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(
        (&rows[0]["tz"], &rows[0]["d"]),
        (&json!("-infinity"), &json!("infinity")),
        "{json}"
    );
    assert!(
        rows[0]["ts"].as_str().unwrap().starts_with("2027-01-01"),
        "{json}"
    );
    assert_eq!(rows[0]["tsa"][0], json!("infinity"), "{json}");
    // Past Arrow's calendar, not PostgreSQL's.
    assert_eq!(
        (&rows[2]["ts"], &rows[2]["d"]),
        (
            &json!("294247-01-10 04:00:54.775806"),
            &json!("5874897-12-31")
        ),
        "{json}"
    );
    assert!(
        rows[1]["ts"].as_str().unwrap().starts_with("2026-12-01"),
        "{json}"
    );
    let (code, json, stderr) = show_table("inf_changes", "json").await;
    assert_eq!(code, 0, "{stderr}");
    let rows: Value = serde_json::from_str(&json).expect("valid JSON");
    let update = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["_cdc_op"] == json!("u"))
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(update["_cdc_before"]["ts"], json!("infinity"), "{json}");
    assert_eq!(update["_cdc_before"]["tsa"][0], json!("infinity"), "{json}");
    for table in ["inf", "inf_changes"] {
        for format in ["table", "csv"] {
            let (code, text, stderr) = show_table(table, format).await;
            assert_eq!(code, 0, "{stderr}");
            assert!(
                text.contains("-infinity") && !text.contains("ERROR"),
                "{table} {format}: {text}"
            );
            // Arrays as PostgreSQL writes them, their elements as show
            // writes values.
            assert!(
                text.contains("{infinity,2026-01-01T00:00:00}"),
                "{table} {format}: {text}"
            );
        }
    }
}

#[tokio::test]
async fn show_prints_arrays_as_postgresql_does_where_a_comma_brace_or_null_is_no_surprise() {
    let db = TestDb::new().await;
    db.exec(
        r#"CREATE TABLE tagged(id int PRIMARY KEY, tags text[], n int[]);
         INSERT INTO tagged VALUES (1, ARRAY[NULL, 'x', '', 'a,b', 'c"d', '{e}', 'NULL'], '{1,NULL,3}');"#,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let opts = run_options(&db, &["tagged"], &unique("tagged"), dir.path());
    wal2iceberg::apply::run(&db.config, &opts).await.unwrap();
    let source: String = db
        .client
        .query_one("SELECT tags::text || ' ' || n::text FROM tagged", &[])
        .await
        .unwrap()
        .get(0);
    let (tags, n) = source.split_once(' ').unwrap();
    let lake = dir.path().display().to_string();
    for format in ["table", "csv"] {
        let (code, text, stderr) = run(&[
            "show",
            "tagged",
            "--lake",
            &lake,
            "--namespace",
            "shop",
            "--format",
            format,
        ])
        .await;
        assert_eq!(code, 0, "{stderr}");
        // CSV quotes a field with a comma or quote, doubling its quotes.
        let tags = match format {
            "csv" => format!("\"{}\"", tags.replace('"', "\"\"")),
            _ => tags.to_owned(),
        };
        assert!(
            text.contains(&tags) && text.contains(n),
            "{format}: {tags} {n} in {text}"
        );
    }
}
