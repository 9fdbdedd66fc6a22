//! The Python the reader scripts run with: a virtual environment under
//! `target/test-python`, made from `tests/support/requirements.txt` by the
//! first test that needs it, so `cargo test` on a fresh machine needs only
//! a `python3` that can make one. Test binaries running at once take turns
//! through a file lock; later runs reuse the environment while the
//! requirements file is unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const REQUIREMENTS: &str = include_str!("requirements.txt");

/// The environment's interpreter, made or brought up to date on first use.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(provision)
}

fn provision() -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).expect("create target/");
    let venv = target.join("test-python");
    let python = venv.join("bin").join("python");
    let marker = venv.join("requirements.installed");
    let ready = || std::fs::read_to_string(&marker).is_ok_and(|r| r == REQUIREMENTS);
    if ready() {
        return python;
    }
    let lock = std::fs::File::create(target.join("test-python.lock")).expect("create the lock");
    lock.lock().expect("lock target/test-python.lock");
    if ready() {
        return python;
    }
    let run = |command: &mut Command, what: &str| {
        let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    eprintln!(
        "making the readers' Python environment in {}",
        venv.display()
    );
    if !python.is_file() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv target/test-python (on Debian: apt-get install python3-venv)",
        );
    }
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/requirements.txt");
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements),
        "pip install -r tests/support/requirements.txt",
    );
    std::fs::write(&marker, REQUIREMENTS).expect("mark the environment ready");
    python
}
