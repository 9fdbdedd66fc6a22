//! An S3 server for the lake tests: moto's (`moto[server]` from PyPI,
//! installed with the readers in the harness's virtual environment), one
//! per test, on a free loopback port, stopped when dropped.

use std::process::{Child, Command, Stdio};

pub struct S3Server {
    child: Child,
    pub endpoint: String,
    /// The keys its properties give.
    key_id: String,
    secret: String,
}

/// The credentials moto takes (any would do).
pub const KEY_ID: &str = "testing";
pub const SECRET: &str = "testing-secret";

/// moto's server, its S3 clock set back by `argv[1]` seconds: every object
/// it stores reads that much older (S3 has no call that backdates one).
const MOTO_BEHIND: &str = "import datetime, sys\n\
                           import moto.s3.models as models\n\
                           from moto.server import main\n\
                           now, behind = models.utcnow, datetime.timedelta(seconds=int(sys.argv[1]))\n\
                           models.utcnow = lambda: now() - behind\n\
                           main(sys.argv[2:])";

/// Sets up a server that authenticates from its seventh request on
/// (`INITIAL_NO_AUTH_ACTION_COUNT`): the user `catalog`, allowed
/// everything, and its keys; the role [`WRITER_ROLE`] anyone may assume,
/// allowed S3; the bucket `argv[2]`. Prints the user's keys.
const AUTHENTICATING_SETUP: &str = "import json, sys, boto3\n\
    kw = dict(endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='setup', aws_secret_access_key='setup')\n\
    iam = boto3.client('iam', **kw)\n\
    allow = lambda action, principal=None: json.dumps({'Version': '2012-10-17', 'Statement': [dict({'Effect': 'Allow', 'Action': action}, **({'Principal': principal} if principal else {'Resource': '*'}))]})\n\
    iam.create_user(UserName='catalog')\n\
    key = iam.create_access_key(UserName='catalog')['AccessKey']\n\
    iam.put_user_policy(UserName='catalog', PolicyName='all', PolicyDocument=allow('*'))\n\
    iam.create_role(RoleName='writer', AssumeRolePolicyDocument=allow('sts:AssumeRole', {'AWS': '*'}))\n\
    iam.put_role_policy(RoleName='writer', PolicyName='s3', PolicyDocument=allow('s3:*'))\n\
    boto3.client('s3', **kw).create_bucket(Bucket=sys.argv[2])\n\
    print(key['AccessKeyId'], key['SecretAccessKey'])";

/// The requests [`AUTHENTICATING_SETUP`] makes.
const SETUP_REQUESTS: usize = 6;

/// The role an authenticating server's user may vend credentials of.
pub const WRITER_ROLE: &str = "arn:aws:iam::123456789012:role/writer";

impl S3Server {
    pub fn start() -> S3Server {
        S3Server::start_behind(0)
    }

    /// A server whose objects read `secs` older than they are: the age of
    /// files a crash left long ago, for the orphan sweep.
    pub fn start_behind(secs: u64) -> S3Server {
        S3Server::spawn(secs, None)
    }

    /// A server that takes only requests signed by keys it issued (its
    /// IAM user's, or a role's that STS vended), with the bucket
    /// `bucket`; its properties give its user's keys.
    pub async fn start_authenticating(bucket: &str) -> S3Server {
        let mut server = S3Server::spawn(0, Some(SETUP_REQUESTS));
        let keys = server
            .python(AUTHENTICATING_SETUP, &[&server.endpoint, bucket])
            .await;
        let (key_id, secret) = keys.trim().split_once(' ').expect("the user's keys");
        (server.key_id, server.secret) = (key_id.to_owned(), secret.to_owned());
        server
    }

    /// moto's server; authenticating after `unauthenticated` requests.
    fn spawn(behind_secs: u64, unauthenticated: Option<usize>) -> S3Server {
        let port = super::free_port();
        let python = crate::support::python();
        let mut command = Command::new(python);
        if let Some(n) = unauthenticated {
            command.env("INITIAL_NO_AUTH_ACTION_COUNT", n.to_string());
        }
        let child = command
            .args(["-c", MOTO_BEHIND, &behind_secs.to_string()])
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start moto with {}: {e}", python.display()));
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            key_id: KEY_ID.to_owned(),
            secret: SECRET.to_owned(),
        };
        super::wait_for_port(port, "moto_server", String::new);
        server
    }

    /// Creates a bucket named after `prefix`, unique to the test; its name.
    pub async fn bucket(&self, prefix: &str) -> String {
        let name = crate::support::unique(prefix)
            .to_lowercase()
            .replace('_', "-");
        let script = "import sys, urllib.request\n\
                      urllib.request.urlopen(urllib.request.Request(sys.argv[1], method='PUT'))";
        self.python(script, &[&format!("{}/{name}", self.endpoint)])
            .await;
        name
    }

    /// How many objects of `bucket` have keys beginning with `prefix`.
    /// Stores `body` at `key` (an unsigned PUT, which moto takes).
    pub async fn put(&self, bucket: &str, key: &str, body: &str) {
        let script = "import sys, urllib.request\n\
                      urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method='PUT'))";
        self.python(
            script,
            &[&format!("{}/{bucket}/{key}", self.endpoint), body],
        )
        .await;
    }

    pub async fn objects(&self, bucket: &str, prefix: &str) -> usize {
        let script = "import sys, urllib.parse, urllib.request\n\
                      q = urllib.parse.urlencode({'prefix': sys.argv[2]})\n\
                      body = urllib.request.urlopen(sys.argv[1] + '?' + q).read().decode()\n\
                      print(body.count('<Key>'))";
        let out = self
            .python(script, &[&format!("{}/{bucket}", self.endpoint), prefix])
            .await;
        out.trim().parse().unwrap()
    }

    /// Runs a Python `script` against the server; its stdout.
    async fn python(&self, script: &str, args: &[&str]) -> String {
        let out = tokio::process::Command::new(crate::support::python())
            .args(["-c", script])
            .args(args)
            .output()
            .await
            .expect("run python");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The catalog properties that reach this server, as flags take them.
    pub fn properties(&self) -> Vec<String> {
        vec![
            format!("s3.endpoint={}", self.endpoint),
            format!("s3.access-key-id={}", self.key_id),
            format!("s3.secret-access-key={}", self.secret),
        ]
    }

    /// The same as the `AWS_*` variables a user would set instead.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", self.key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
