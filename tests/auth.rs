//! Authentication (trust, cleartext, md5, SCRAM-SHA-256) and TLS (each
//! sslmode) on both connections: the replication one we speak ourselves
//! and the ordinary one through tokio-postgres.

use wal2iceberg::ErrorKind;
use wal2iceberg::ops::scratch::ScratchPostgres;
use wal2iceberg::pg::config::PgConfig;
use wal2iceberg::pg::conn::ReplicationConnection;
use wal2iceberg::pg::source::SourceClient;

use crate::support::*;

fn url(user: &str, password: Option<&str>, host: &str, sslmode: &str) -> String {
    let auth = match password {
        Some(p) => format!("{user}:{p}"),
        None => user.to_owned(),
    };
    format!(
        "postgres://{auth}@{host}:{}/postgres?sslmode={sslmode}",
        server().pg.port()
    )
}

/// Both connections work, and report whether TLS is in use.
async fn connect_both(config: &PgConfig) -> wal2iceberg::Result<(bool, bool)> {
    let mut replication = ReplicationConnection::connect(config).await?;
    let identity = replication.identify_system().await?;
    assert!(!identity.system_id.is_empty());
    let client = SourceClient::connect(config).await?;
    let ssl = |pid: i32| {
        let client = &client;
        async move {
            client
                .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&pid])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    let own_pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let result = (ssl(replication.process_id()).await, ssl(own_pid).await);
    replication.close().await?;
    Ok(result)
}

#[tokio::test]
async fn every_password_method_authenticates_and_rejects_wrong_passwords() {
    let admin = SourceClient::connect(&config_for(&server().pg.url("postgres")))
        .await
        .unwrap();
    ensure_role(&admin, MD5_USER, "md5").await;
    ensure_role(&admin, SCRAM_USER, "scram-sha-256").await;
    ensure_role(&admin, CLEARTEXT_USER, "scram-sha-256").await;
    for user in [MD5_USER, SCRAM_USER, CLEARTEXT_USER] {
        let good = config_for(&url(user, Some(PASSWORD), "127.0.0.1", "disable"));
        connect_both(&good)
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));

        let bad = config_for(&url(user, Some("wrong"), "127.0.0.1", "disable"));
        let err = ReplicationConnection::connect(&bad).await.err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Authentication, "{user}: {err}");
        assert!(err.to_string().contains("rejected the login"), "{err}");
        assert!(
            !err.to_string().contains("wrong"),
            "no password in errors: {err}"
        );
        let err = SourceClient::connect(&bad).await.err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Authentication, "{user}: {err}");

        let missing = config_for(&url(user, None, "127.0.0.1", "disable"));
        let err = ReplicationConnection::connect(&missing)
            .await
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("none is configured"),
            "{user}: {err}"
        );
    }
    // Trust: the superuser of the harness has no password at all.
    let trust = config_for(&url("postgres", None, "127.0.0.1", "disable"));
    connect_both(&trust).await.unwrap();
}

#[tokio::test]
async fn each_sslmode_encrypts_and_verifies_as_libpq_does() {
    let ca = server().ca_file.display().to_string();
    let with_ca = |host: &str, mode: &str| {
        config_for(&format!(
            "{}&sslrootcert={ca}",
            url("postgres", None, host, mode)
        ))
    };

    assert_eq!(
        connect_both(&with_ca("127.0.0.1", "disable"))
            .await
            .unwrap(),
        (false, false)
    );
    assert_eq!(
        connect_both(&with_ca("127.0.0.1", "prefer")).await.unwrap(),
        (true, true)
    );
    assert_eq!(
        connect_both(&with_ca("127.0.0.1", "require"))
            .await
            .unwrap(),
        (true, true)
    );
    assert_eq!(
        connect_both(&with_ca("localhost", "verify-full"))
            .await
            .unwrap(),
        (true, true)
    );
    // The certificate names localhost only: verify-ca accepts it for the
    // address, verify-full does not.
    assert_eq!(
        connect_both(&with_ca("127.0.0.1", "verify-ca"))
            .await
            .unwrap(),
        (true, true)
    );
    let err = ReplicationConnection::connect(&with_ca("127.0.0.1", "verify-full"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    let err = SourceClient::connect(&with_ca("127.0.0.1", "verify-full"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    assert!(err.to_string().contains("not valid for name"), "{err}");

    // A CA that did not sign the server's certificate is refused.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other = params.self_signed(&other_key).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other_file = dir.path().join("other.pem");
    std::fs::write(&other_file, other.pem()).unwrap();
    let config = config_for(&format!(
        "{}&sslrootcert={}",
        url("postgres", None, "localhost", "verify-full"),
        other_file.display()
    ));
    let err = ReplicationConnection::connect(&config).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
}

#[tokio::test]
async fn sslmode_require_fails_clearly_when_the_server_has_no_tls() {
    let pg = ScratchPostgres::start(&[], &[]).unwrap();
    let config = config_for(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        pg.port()
    ));
    let err = ReplicationConnection::connect(&config).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Tls);
    assert!(err.to_string().contains("does not accept TLS"), "{err}");
    // prefer falls back to plain text.
    let prefer = config_for(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=prefer",
        pg.port()
    ));
    let (replication_ssl, client_ssl) = connect_both(&prefer).await.unwrap();
    assert!(!replication_ssl && !client_ssl);
}

#[tokio::test]
async fn a_unix_socket_connection_works_for_replication() {
    let socket_dir = server().pg.work_dir().display().to_string();
    let config = config_for(&format!(
        "host={socket_dir} port={} user=postgres dbname=postgres",
        server().pg.port()
    ));
    let mut conn = ReplicationConnection::connect(&config).await.unwrap();
    conn.identify_system().await.unwrap();
    conn.close().await.unwrap();
}
