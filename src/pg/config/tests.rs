use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;

use super::*;

fn parse(s: &str, env: &[(&str, &str)], home: Option<&Path>) -> Result<PgConfig> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PgConfig::parse_with(s, |k| env.get(k).cloned(), home)
}

#[test]
fn parses_a_url_with_escapes_and_parameters() {
    let c = parse(
        "postgres://app%40corp:p%3Ass@db.example.com:6543/shop?sslmode=verify-full&application_name=x",
        &[],
        None,
    )
    .unwrap();
    assert_eq!(c.user, "app@corp");
    assert_eq!(c.password.as_ref().unwrap().expose(), "p:ss");
    assert_eq!(c.host, "db.example.com");
    assert_eq!(c.port, 6543);
    assert_eq!(c.dbname, "shop");
    assert_eq!(c.sslmode, SslMode::VerifyFull);
    assert_eq!(c.application_name, "x");
}

#[test]
fn parses_key_values_with_quotes() {
    let c = parse(
        "host=/tmp port=5433 user=u password='it\\'s secret' dbname = d",
        &[],
        None,
    )
    .unwrap();
    assert!(c.is_unix_socket());
    assert_eq!(c.password.as_ref().unwrap().expose(), "it's secret");
    assert_eq!(c.dbname, "d");
}

#[test]
fn environment_fills_what_the_string_leaves_out() {
    let env = [
        ("PGHOST", "envhost"),
        ("PGPORT", "7000"),
        ("PGUSER", "envuser"),
        ("PGPASSWORD", "envpw"),
        ("PGDATABASE", "envdb"),
        ("PGSSLMODE", "require"),
    ];
    let c = parse("user=given", &env, None).unwrap();
    assert_eq!(c.host, "envhost");
    assert_eq!(c.port, 7000);
    assert_eq!(c.user, "given");
    assert_eq!(c.password.unwrap().expose(), "envpw");
    assert_eq!(c.dbname, "envdb");
    assert_eq!(c.sslmode, SslMode::Require);
}

#[test]
fn defaults_follow_libpq() {
    let c = parse("", &[("USER", "me")], None).unwrap();
    assert_eq!(
        (c.host.as_str(), c.port, c.user.as_str(), c.dbname.as_str()),
        ("localhost", 5432, "me", "me")
    );
    assert_eq!(c.sslmode, SslMode::Prefer);
}

#[test]
fn password_file_is_used_when_no_password_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(".pgpass");
    std::fs::write(
        &file,
        "# comment\nother:*:*:*:nope\nlocalhost:5432:shop:ada:s\\:cret\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = parse("user=ada dbname=shop", &[], Some(dir.path())).unwrap();
    assert_eq!(c.password.unwrap().expose(), "s:cret");

    // An explicit password wins over the file.
    let c = parse("user=ada dbname=shop password=x", &[], Some(dir.path())).unwrap();
    assert_eq!(c.password.unwrap().expose(), "x");

    // A file others can read is ignored, as libpq does.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let c = parse("user=ada dbname=shop", &[], Some(dir.path())).unwrap();
    assert!(c.password.is_none());
}

#[test]
fn malformed_strings_name_the_problem() {
    for (input, needle) in [
        ("host", "missing \"=\""),
        ("bogus=1", "unknown connection option \"bogus\""),
        ("port=0", "port \"0\""),
        ("port=http", "port \"http\""),
        ("sslmode=allow", "sslmode \"allow\""),
        ("password='open", "unterminated"),
        ("postgres://h/db?x", "has no \"=\""),
        ("postgres://%zz@h/db", "percent-encoding"),
        ("host=a,b", "several hosts"),
    ] {
        let err = parse(input, &[("USER", "me")], None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains(needle), "{input}: {err}");
    }
}

#[test]
fn passwords_never_show_in_debug_or_display() {
    let c = parse("user=u password=hunter2", &[], None).unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));
    assert!(!c.to_string().contains("hunter2"));
}
