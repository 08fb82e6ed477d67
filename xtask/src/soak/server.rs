//! The soak's Redis: one private server with an append-only file (so a SIGKILL and a
//! restart from the AOF is a fault it can survive), or a 3-master + 3-replica cluster.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::resp;

/// One redis-server process the soak owns, restartable on the same port and directory.
pub(crate) struct Node {
    pub(crate) port: u16,
    server: PathBuf,
    dir: PathBuf,
    extra: Vec<String>,
    pub(crate) child: Option<Child>,
}

impl Node {
    /// Starts a server on `port` keeping its AOF (fsync always) under `base/port`.
    pub(crate) fn start(server: &Path, base: &Path, port: u16, extra: &[&str]) -> Result<Node> {
        let dir = base.join(port.to_string());
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
        let mut node = Node {
            port,
            server: server.to_owned(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.dir.join("redis.log"))?;
        let child = Command::new(&self.server)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start {}", self.server.display()))?;
        self.child = Some(child);
        wait_for_ping(self.port)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory: it loads its AOF.
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the port answers PING (a restart loading its AOF answers LOADING first).
fn wait_for_ping(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok()
            && resp::cmd(port, &["PING"]).is_ok_and(|r| r.text() == "PONG")
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("redis-server on port {port} did not answer PING within 30 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Three masters and a replica each (`cluster-node-timeout` 2 s), ready for writes.
pub(crate) fn start_cluster(server: &Path, base: &Path) -> Result<Vec<Node>> {
    let ports = crate::redis::free_cluster_ports(6)?;
    let mut nodes = Vec::new();
    for &port in &ports {
        let conf = format!("nodes-{port}.conf");
        nodes.push(Node::start(
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
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let status = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdout(Stdio::null())
        .status()
        .context("could not run redis-cli --cluster create")?;
    if !status.success() {
        bail!("redis-cli --cluster create failed ({status})");
    }
    wait_cluster_ok(&ports)?;
    Ok(nodes)
}

/// Waits until every node in `ports` says `cluster_state:ok`.
pub(crate) fn wait_cluster_ok(ports: &[u16]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for &port in ports {
        loop {
            let ok = resp::cmd(port, &["CLUSTER", "INFO"])
                .is_ok_and(|r| r.text().contains("cluster_state:ok"));
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("the cluster did not reach cluster_state:ok within 30 s");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The role (`master`/`slave`) of the node on `port`, per `INFO replication`.
pub(crate) fn role(port: u16) -> Option<String> {
    let text = resp::cmd(port, &["INFO", "replication"]).ok()?.text();
    text.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_owned())
}
