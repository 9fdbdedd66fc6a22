//! compose.yaml and the Dockerfile, tested as far as a machine without
//! Docker can: the compose file parses, its commands are ones the binary
//! accepts, and the image builds the binary with the documented command
//! from everything the build needs.

use serde_json::Value;
use tokio::process::Command;

use crate::support::assert_success;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

async fn compose() -> Value {
    let out = Command::new(crate::support::python())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
            &format!("{ROOT}/compose.yaml"),
        ])
        .output()
        .await
        .expect("python3 with PyYAML");
    assert_success(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn compose_runs_the_documented_commands_next_to_a_logical_postgres_17() {
    let compose = compose().await;
    let services = compose["services"].as_object().unwrap();
    let postgres = &services["postgres"];
    assert_eq!(postgres["image"], "postgres:17");
    let command: Vec<&str> = postgres["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(command.contains(&"wal_level=logical"), "{command:?}");
    let init = compose["configs"]["init"]["content"].as_str().unwrap();
    assert!(
        init.contains("migrations/*.sql")
            && init.contains("ALTER PUBLICATION wal2iceberg ADD TABLE customers")
    );

    // Each wal2iceberg command, with its service's environment, gets past
    // option parsing: run fails to reach the compose network's host, show
    // finds no such lake (or table) here. Neither is a usage error.
    for (name, expected) in [("wal2iceberg", "postgres"), ("show", "lake")] {
        let service = &services[name];
        assert_eq!(service["build"], ".");
        let args: Vec<&str> = service["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_wal2iceberg"));
        cmd.args(&args).env("PGCONNECT_TIMEOUT", "5");
        if let Some(env) = service["environment"].as_object() {
            for (k, v) in env {
                cmd.env(k, v.as_str().unwrap());
            }
        }
        // The volume's path is the container's; keep this machine's clean.
        let lake = tempfile::tempdir().unwrap();
        cmd.env("WAL2ICEBERG_LAKE", lake.path());
        let out = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            !stderr.contains("Usage:") && stderr.contains(expected),
            "{name}: {args:?}: {stderr}"
        );
    }
}

#[test]
fn the_image_builds_with_the_documented_command_from_what_the_build_needs() {
    let dockerfile = std::fs::read_to_string(format!("{ROOT}/Dockerfile")).unwrap();
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let build = "cargo build --release --locked";
    assert!(readme.contains(build));
    assert!(dockerfile.contains(&format!("RUN {build} --bin wal2iceberg")));
    for needed in [
        "Cargo.toml Cargo.lock",
        "src ./src",
        "migrations ./migrations",
        "tests ./tests",
    ] {
        assert!(
            dockerfile.contains(&format!("COPY {needed}")),
            "COPY {needed}"
        );
    }
}
