//! Finding (or installing) `redis-server`, and `cargo xtask redis`: a private server or a
//! three-master cluster on free ports, for trying tranche by hand.

use std::env;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The oldest server with every command tranche relies on (XAUTOCLAIM came in 6.2).
const MIN_VERSION: (u32, u32) = (6, 2);

const HOW_TO_INSTALL: &str = "install it and run again: Debian/Ubuntu `sudo apt-get install \
redis-server`, Fedora `sudo dnf install redis`, macOS `brew install redis`; or point \
TRANCHE_REDIS_SERVER at a redis-server binary";

/// Returns the `redis-server` the tests should use, installing Debian's package first when
/// none is on PATH and this process may (root, with apt-get). Never falls back to a server
/// that is already running: tests start their own.
pub(crate) fn ensure_installed() -> Result<PathBuf> {
    if let Some(path) = env::var_os("TRANCHE_REDIS_SERVER") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("TRANCHE_REDIS_SERVER={} is not a file", path.display());
        }
        check_version(&path)?;
        return Ok(path);
    }
    if let Some(path) = find_on_path("redis-server") {
        check_version(&path)?;
        return Ok(path);
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!("redis-server is not on PATH and cannot be installed from here; {HOW_TO_INSTALL}");
    }
    eprintln!("xtask: redis-server is not on PATH; installing Debian's package with apt-get");
    apt_get(&["update"])?;
    apt_get(&["install", "-y", "--no-install-recommends", "redis-server"])?;
    let path = find_on_path("redis-server").with_context(|| {
        format!("apt-get installed redis-server but it is not on PATH; {HOW_TO_INSTALL}")
    })?;
    check_version(&path)?;
    Ok(path)
}

/// Makes sure Debian's `chromium` and `chromedriver` are there for the dashboard's
/// browser test, installing both with apt-get when missing and this runs as root;
/// otherwise says how to get them.
pub(crate) fn ensure_browser() -> Result<()> {
    let present = || find_on_path("chromium").is_some() && find_on_path("chromedriver").is_some();
    if present() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "chromium and chromedriver are not on PATH and cannot be installed from here \
             (the dashboard's browser test needs them): sudo apt-get install chromium chromium-driver"
        );
    }
    eprintln!("xtask: installing Debian's chromium and chromium-driver with apt-get");
    apt_get(&["update"])?;
    apt_get(&[
        "install",
        "-y",
        "--no-install-recommends",
        "chromium",
        "chromium-driver",
    ])?;
    if !present() {
        bail!("apt-get installed chromium but chromium or chromedriver is not on PATH");
    }
    Ok(())
}

/// Makes sure PostgreSQL's server binaries (`initdb`, `pg_ctl` under
/// /usr/lib/postgresql) are there for the backfill example's test, installing Debian's
/// package with apt-get when missing and this runs as root.
pub(crate) fn ensure_postgres() -> Result<()> {
    let present = || {
        std::fs::read_dir("/usr/lib/postgresql")
            .is_ok_and(|d| d.flatten().any(|e| e.path().join("bin/initdb").exists()))
    };
    if present() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "PostgreSQL's initdb is not installed and cannot be installed from here \
             (the backfill example's test needs it): sudo apt-get install postgresql"
        );
    }
    eprintln!("xtask: installing Debian's postgresql with apt-get");
    apt_get(&["update"])?;
    apt_get(&["install", "-y", "--no-install-recommends", "postgresql"])?;
    if !present() {
        bail!("apt-get installed postgresql but no initdb is under /usr/lib/postgresql");
    }
    Ok(())
}

/// Makes sure Debian's MariaDB server (`mariadbd`, `mariadb-install-db`, the `mariadb`
/// client) is there for the SQL handler's MariaDB tests, installing `mariadb-server`
/// with apt-get when missing and this runs as root. Its service is not started: the
/// tests start private servers of their own.
pub(crate) fn ensure_mariadb() -> Result<()> {
    let present = || {
        [
            "/usr/sbin/mariadbd",
            "/usr/bin/mariadb-install-db",
            "/usr/bin/mariadb",
        ]
        .iter()
        .all(|p| Path::new(p).exists())
    };
    if present() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "MariaDB's server is not installed and cannot be installed from here \
             (the SQL handler's MariaDB tests need it): sudo apt-get install mariadb-server"
        );
    }
    eprintln!("xtask: installing Debian's mariadb-server with apt-get");
    apt_get(&["update"])?;
    apt_get(&["install", "-y", "--no-install-recommends", "mariadb-server"])?;
    if !present() {
        bail!(
            "apt-get installed mariadb-server but mariadbd, mariadb-install-db or mariadb is missing"
        );
    }
    Ok(())
}

/// Makes sure a `python3` imports psycopg2, for the backfill bench's
/// `--exec-persistent` cell (`examples/persistent-psycopg.py`), installing Debian's
/// `python3-psycopg2` with apt-get when none does and this runs as root. Debian's package
/// serves `/usr/bin/python3`, which the bench tries after the `python3` on PATH.
pub(crate) fn ensure_psycopg() -> Result<()> {
    let present = || {
        ["python3", "/usr/bin/python3"].iter().any(|python| {
            Command::new(python)
                .args(["-c", "import psycopg2"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    };
    if present() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "no python3 imports psycopg2 and it cannot be installed from here \
             (the Python --exec-persistent example's test and the backfill bench need it): \
             sudo apt-get install python3-psycopg2"
        );
    }
    eprintln!("xtask: installing Debian's python3-psycopg2 with apt-get");
    apt_get(&["update"])?;
    apt_get(&[
        "install",
        "-y",
        "--no-install-recommends",
        "python3-psycopg2",
    ])?;
    if !present() {
        bail!("apt-get installed python3-psycopg2 but no python3 imports psycopg2");
    }
    Ok(())
}

/// Makes sure `promtool` (Debian's prometheus package) is there for the test that checks
/// the shipped alerting rules, installing it with apt-get when missing and this runs as
/// root. The package's service is not started (no init system runs it here).
pub(crate) fn ensure_promtool() -> Result<()> {
    if find_on_path("promtool").is_some() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "promtool is not on PATH and cannot be installed from here \
             (the alerting rules' test needs it): sudo apt-get install prometheus"
        );
    }
    eprintln!("xtask: installing Debian's prometheus (for promtool) with apt-get");
    apt_get(&["update"])?;
    apt_get(&["install", "-y", "--no-install-recommends", "prometheus"])?;
    if find_on_path("promtool").is_none() {
        bail!("apt-get installed prometheus but promtool is not on PATH");
    }
    Ok(())
}

/// Makes sure `systemd-analyze` (Debian's systemd package) is there for the test that
/// verifies the shipped unit (`deploy/systemd/`), installing it with apt-get when
/// missing and this runs as root. Nothing is started: no init system runs here.
pub(crate) fn ensure_systemd_analyze() -> Result<()> {
    if find_on_path("systemd-analyze").is_some() {
        return Ok(());
    }
    if !is_root() || find_on_path("apt-get").is_none() {
        bail!(
            "systemd-analyze is not on PATH and cannot be installed from here \
             (the systemd unit's test needs it): sudo apt-get install systemd"
        );
    }
    eprintln!("xtask: installing Debian's systemd (for systemd-analyze) with apt-get");
    apt_get(&["update"])?;
    apt_get(&["install", "-y", "--no-install-recommends", "systemd"])?;
    if find_on_path("systemd-analyze").is_none() {
        bail!("apt-get installed systemd but systemd-analyze is not on PATH");
    }
    Ok(())
}

fn apt_get(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        // Another apt (unattended upgrades, a concurrent CI step) may hold the lock.
        .args(["-o", "DPkg::Lock::Timeout=120"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("could not start apt-get")?;
    if !status.success() {
        bail!(
            "apt-get {} failed ({status}); {HOW_TO_INSTALL}",
            args.join(" ")
        );
    }
    Ok(())
}

fn check_version(server: &Path) -> Result<()> {
    let out = Command::new(server)
        .arg("--version")
        .output()
        .with_context(|| format!("could not run {} --version", server.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 ..."
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .with_context(|| format!("unexpected `redis-server --version` output: {text}"))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_VERSION {
        bail!(
            "{} is Redis {version}; tranche needs {}.{} or newer; {HOW_TO_INSTALL}",
            server.display(),
            MIN_VERSION.0,
            MIN_VERSION.1
        );
    }
    Ok(())
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `cargo xtask redis [--cluster [--replicas]]`.
pub(crate) fn serve(args: &[String]) -> Result<()> {
    let (cluster, replicas) = match args {
        [] => (false, false),
        [flag] if flag == "--cluster" => (true, false),
        [a, b] if a == "--cluster" && b == "--replicas" => (true, true),
        _ => bail!("usage: cargo xtask redis [--cluster [--replicas]]"),
    };
    let server = ensure_installed()?;
    let base = crate::workspace_root().join("target/xtask-redis");
    let mut children = Vec::new();
    let result = if cluster {
        start_cluster(&server, &base, &mut children, replicas)
    } else {
        start_one(&server, &base, free_port()?, &[]).map(|child| children.push(child))
    };
    if let Err(err) = result {
        stop(&mut children);
        return Err(err);
    }
    eprintln!("xtask: Redis is running; Ctrl-C stops it");
    // Ctrl-C reaches the servers too (same process group); wait for them to go.
    for child in &mut children {
        let _ = child.wait();
    }
    Ok(())
}

fn start_one(server: &Path, base: &Path, port: u16, extra: &[&str]) -> Result<Child> {
    let dir = base.join(port.to_string());
    std::fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let child = Command::new(server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("could not start {}", server.display()))?;
    wait_for_ping(port)?;
    println!("redis://127.0.0.1:{port}");
    Ok(child)
}

/// Three masters, and with `replicas` one replica each (`cluster-node-timeout` 2 s, so
/// a killed master's replica takes over within seconds, as in the tests).
fn start_cluster(
    server: &Path,
    base: &Path,
    children: &mut Vec<Child>,
    replicas: bool,
) -> Result<()> {
    let nodes_wanted = if replicas { 6 } else { 3 };
    let ports = free_cluster_ports(nodes_wanted)?;
    for &port in &ports {
        let conf = format!("nodes-{port}.conf");
        children.push(start_one(
            server,
            base,
            port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &conf,
                "--cluster-node-timeout",
                "2000",
            ],
        )?);
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let status = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args([
            "--cluster-replicas",
            if replicas { "1" } else { "0" },
            "--cluster-yes",
        ])
        .stdout(Stdio::null())
        .status()
        .context("could not run redis-cli --cluster create")?;
    if !status.success() {
        bail!("redis-cli --cluster create failed ({status})");
    }
    // A new cluster refuses writes for about two seconds; wait until every node says ok.
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in &ports {
        loop {
            let out = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "cluster", "info"])
                .output()
                .context("could not run redis-cli cluster info")?;
            if String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok") {
                break;
            }
            if Instant::now() > deadline {
                bail!("the cluster did not reach cluster_state:ok within 30 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    println!("cluster ready: {}", nodes.join(" "));
    Ok(())
}

fn stop(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A TCP port free on localhost now.
pub(crate) fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("could not find a free TCP port")?;
    Ok(listener.local_addr()?.port())
}

/// `n` distinct free ports whose cluster-bus ports (+10000) are free too, for a
/// cluster's nodes.
pub(crate) fn free_cluster_ports(n: usize) -> Result<Vec<u16>> {
    let mut ports = Vec::new();
    while ports.len() < n {
        let port = free_port()?;
        if port < 55535
            && !ports.contains(&port)
            && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10000)).is_ok()
        {
            ports.push(port);
        }
    }
    Ok(ports)
}

fn wait_for_ping(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("redis-server on port {port} did not start within 10 s");
        }
        thread::sleep(Duration::from_millis(5));
    }
}
