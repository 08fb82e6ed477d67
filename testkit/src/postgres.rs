//! A private PostgreSQL cluster per test or bench ([`TestPostgres`]): Debian's server
//! binaries (initdb and pg_ctl under /usr/lib/postgresql), a directory of its own and a
//! free port, stopped and removed on drop. As root the server runs as `postgres`, since
//! initdb refuses root. It can serve TLS with a throwaway CA's certificate
//! ([`TestPostgres::start_tls`]).

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// A running private PostgreSQL cluster: user `postgres`, trust authentication,
/// database `postgres`, on 127.0.0.1 and a Unix socket in its directory.
///
/// Durability is off (`fsync`, `synchronous_commit` and `full_page_writes`): a
/// throwaway cluster has no use for it, and without it a million-row UPDATE costs what
/// the CPU does, so the benches measure the work and the round trips, not the disk.
pub struct TestPostgres {
    /// The cluster's directory: `data`, the socket, `log`, and room for the caller's
    /// files. Removed on drop.
    dir: PathBuf,
    /// The server binaries' directory (`/usr/lib/postgresql/N/bin`), for `pg_ctl stop`.
    bin: PathBuf,
    port: u16,
}

impl TestPostgres {
    /// Initialises a cluster and starts it, waiting until it accepts connections.
    /// Panics, saying how to install one, when PostgreSQL's server is not installed.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// [`TestPostgres::start`], serving TLS too (`ssl=on`) with a certificate for
    /// 127.0.0.1 and `localhost` signed by a throwaway CA ([`crate::pki`]), whose PEM
    /// file is [`TestPostgres::ca`]. Plain connections are still accepted.
    pub fn start_tls() -> Self {
        Self::launch(true)
    }

    /// The CA that signed the server's certificate, a PEM file (after
    /// [`TestPostgres::start_tls`]; absent otherwise).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn launch(tls: bool) -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| {
                d.flatten()
                    .map(|e| e.path().join("bin"))
                    .find(|p| p.join("initdb").exists())
            })
            .expect(
                "PostgreSQL's initdb not found: apt-get install postgresql (cargo xtask test does)",
            );
        // One directory per server: the tests of one binary run side by side.
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tranche-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut ssl = String::new();
        if tls {
            let [_, cert, key, ..] = crate::pki::write(&dir);
            // The server refuses a key others may read; it is the cluster owner's
            // below, as the whole directory is.
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            ssl = format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            );
        }
        let root = is_root();
        if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(ok.success(), "chown -R postgres {}", dir.display());
        }
        let data = dir.join("data");
        let data = data.to_str().unwrap();
        run_as_owner(
            root,
            &bin.join("initdb"),
            &["-D", data, "-U", "postgres", "-A", "trust"],
        );
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off{ssl}",
            dir.display()
        );
        let log = dir.join("log");
        run_as_owner(
            root,
            &bin.join("pg_ctl"),
            &[
                "-D",
                data,
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        Self { dir, bin, port }
    }

    /// The connection string (libpq's `key=value` form, which tokio-postgres, psql and
    /// psycopg all read).
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory, removed on drop: a place for a test's own files (logs,
    /// scripts) that go when the server goes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PostgreSQL's binaries of the same version as the server (`psql`, `pg_ctl`, …).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Points `cmd` at the server the way its clients look for one: `PGHOST`, `PGPORT`,
    /// `PGUSER` and `PGDATABASE` for psql and psycopg, `TRANCHE_DATABASE_URL` for
    /// `tranche run --sql`.
    pub fn env(&self, cmd: &mut Command) {
        cmd.env("PGHOST", "127.0.0.1")
            .env("PGPORT", self.port.to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env("TRANCHE_DATABASE_URL", self.url());
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = cmd
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The first Python that imports psycopg2, PostgreSQL's Python driver (for the
/// `--exec-persistent` example): `python3` on PATH, else `/usr/bin/python3`, where
/// Debian's `python3-psycopg2` installs it (a PATH may lead to another Python first).
pub fn psycopg_python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import psycopg2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Runs `program` as the cluster's owner (`postgres` when this process is root) and
/// panics with its output when it fails.
fn run_as_owner(root: bool, program: &Path, args: &[&str]) {
    let mut cmd = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let out = cmd
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
