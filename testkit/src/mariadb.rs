//! A private MariaDB server per test ([`TestMariadb`]): Debian's mariadb-server,
//! installed into a directory of its own with mariadb-install-db and started on a free
//! port and a socket of its own, grants skipped; killed and removed on drop. It can
//! serve TLS with a throwaway CA's certificate ([`TestMariadb::start_tls`]) and take
//! options of the test's own ([`TestMariadb::start_with`]: a binary log and a server
//! ID for a primary and its replica).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A running private MariaDB server with an empty database `test`, reachable as `root`
/// without a password (`--skip-grant-tables`).
///
/// Durability is off (`--innodb-flush-log-at-trx-commit=0`, no doublewrite, no binary
/// log unless asked for): a throwaway server has no use for it.
pub struct TestMariadb {
    /// The server's directory: `data`, `sock`, `pid`, `log`. Removed on drop.
    dir: PathBuf,
    server: Child,
    port: u16,
}

impl TestMariadb {
    /// Installs a data directory and starts `mariadbd` on it, waiting (60 s at most)
    /// until it creates the database `test`. Panics, saying how to install one, when
    /// MariaDB's server is not installed.
    pub fn start() -> Self {
        Self::launch(false, &[])
    }

    /// [`TestMariadb::start`], serving TLS too with a certificate for 127.0.0.1 and
    /// `localhost` signed by a throwaway CA ([`crate::pki`]), whose PEM file is
    /// [`TestMariadb::ca`]. Plain connections are still accepted.
    pub fn start_tls() -> Self {
        Self::launch(true, &[])
    }

    /// [`TestMariadb::start`] with `options` after the usual ones (as
    /// `--server-id=2`); `--log-bin=…` among them turns the binary log on.
    pub fn start_with(options: &[&str]) -> Self {
        Self::launch(false, options)
    }

    /// The CA that signed the server's certificate, a PEM file (after
    /// [`TestMariadb::start_tls`]; absent otherwise).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn launch(tls: bool, options: &[&str]) -> Self {
        for program in ["mariadb-install-db", "mariadbd", "mariadb"] {
            assert!(
                find(program).is_some(),
                "{program} not found: apt-get install mariadb-server (cargo xtask test does)"
            );
        }
        // One directory per server: the tests of one binary run side by side.
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tranche-my-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data");
        // A temporary directory of its own: servers installed at once in the shared
        // /tmp collide on their `#sql-temptable-…` files ("Could not remove temporary
        // table") and the install fails.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let user = whoami();
        let out = Command::new(find("mariadb-install-db").unwrap())
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--user={user}"))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .expect("cannot run mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let socket = dir.join("sock");
        let mut extra: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        if tls {
            let [ca, cert, key, ..] = crate::pki::write(&dir);
            for (option, file) in [("ssl-ca", ca), ("ssl-cert", cert), ("ssl-key", key)] {
                extra.push(format!("--{option}={}", file.display()));
            }
        }
        let log_bin = extra.iter().any(|o| o.starts_with("--log-bin"));
        let server = Command::new(find("mariadbd").unwrap())
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--log-error={}", dir.join("log").display()))
            .arg(format!("--port={port}"))
            .arg(format!("--user={user}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-grant-tables",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-buffer-pool-size=32M",
                "--innodb-doublewrite=0",
                "--performance-schema=0",
            ])
            .args((!log_bin).then_some("--skip-log-bin"))
            .args(&extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start mariadbd");
        let mut me = Self { dir, server, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let created = Command::new(find("mariadb").unwrap())
                .arg("--no-defaults")
                .arg(format!("--socket={}", socket.display()))
                .args(["-u", "root", "-e", "CREATE DATABASE IF NOT EXISTS test"])
                .output()
                .expect("cannot run mariadb");
            if created.status.success() {
                break;
            }
            if let Ok(Some(status)) = me.server.try_wait() {
                panic!(
                    "mariadbd exited ({status}): {}",
                    std::fs::read_to_string(me.dir.join("log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not answer within 60 s: {}",
                String::from_utf8_lossy(&created.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    }

    /// The server's `mysql://` URL, database `test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory, removed on drop: a place for a test's own files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestMariadb {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Debian puts `mariadbd` in /usr/sbin, which a user's PATH may lack.
fn find(program: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| PathBuf::from(d).join(program))
        .find(|p| p.exists())
}

fn whoami() -> String {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .expect("cannot run id");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
