//! Test support for tranche's crates, a dev-dependency only: a private `redis-server`
//! per test on a free port, killed on drop ([`TestRedis`]); a private Redis Cluster
//! ([`TestCluster`]); a private PostgreSQL cluster ([`TestPostgres`]) and MariaDB
//! server ([`TestMariadb`]) for the SQL handler's tests and the backfill bench, and
//! the Python that talks to the former ([`psycopg_python`]); the
//! checks every crate's Lua scripts pass ([`lua_sources`], [`keys_not_from_keys`]); and
//! a throwaway PKI for TLS tests ([`pki`]).
//!
//! Never the shared 6379 (or 5432, 3306) and never a silent skip: without a server
//! binary the test fails and says how to get one (`TRANCHE_REDIS_SERVER` names a
//! `redis-server` elsewhere).

mod mariadb;
pub mod pki;
mod postgres;

pub use mariadb::TestMariadb;
pub use postgres::{TestPostgres, psycopg_python};

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running private Redis.
pub struct TestRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TestRedis {
    /// A standalone server.
    pub fn start() -> Self {
        Self::spawn(&[])
    }

    /// A one-node Redis Cluster owning every slot: scripts whose keys are not all in one
    /// slot fail on it with CROSSSLOT, exactly as on a real cluster.
    pub fn start_cluster() -> Self {
        let server = Self::spawn(&["--cluster-enabled", "yes"]);
        let out = server.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        assert!(out.contains("OK"), "CLUSTER ADDSLOTSRANGE: {out}");
        // A new master stays in cluster_state:fail for its first 2 s. Polled on one
        // connection: a connection per poll would leave a hundred sockets in TIME_WAIT,
        // which every server start then reads through (`listens_on`).
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// A server started with these extra `redis-server` arguments.
    pub fn start_with_args(args: &[&str]) -> Self {
        Self::spawn(args)
    }

    /// A server that wants `password` (URLs then need `redis://:password@...`).
    pub fn start_with_password(password: &str) -> Self {
        Self::spawn(&["--requirepass", password])
    }

    /// A server that also listens on the Unix socket `path` (`unix://PATH` URLs).
    pub fn start_with_unix_socket(path: &std::path::Path) -> Self {
        let socket = path.to_owned();
        let path = path.to_str().unwrap().to_owned();
        let server = Self::spawn_with(false, move |_| {
            vec![
                "--unixsocket".into(),
                path.clone(),
                "--unixsocketperm".into(),
                "700".into(),
            ]
        });
        // redis-server listens on TCP before it binds the socket: the TCP probe that
        // `spawn_with` waits for does not say the socket is there yet.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} never accepted",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        server
    }

    /// A server speaking TLS only, with the PEM certificate and key files given; connect
    /// with [`TestRedis::tls_url`].
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Self {
        Self::tls(cert, key, None)
    }

    /// A server speaking TLS only that also demands a client certificate signed by the CA
    /// in `ca` (`--tls-auth-clients yes`).
    pub fn start_mtls(cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path) -> Self {
        Self::tls(cert, key, Some(ca))
    }

    fn tls(cert: &std::path::Path, key: &std::path::Path, ca: Option<&std::path::Path>) -> Self {
        let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
        let mut tls = vec![
            "--tls-cert-file".to_owned(),
            path(cert),
            "--tls-key-file".to_owned(),
            path(key),
        ];
        match ca {
            Some(ca) => tls.extend([
                "--tls-ca-cert-file".to_owned(),
                path(ca),
                "--tls-auth-clients".to_owned(),
                "yes".to_owned(),
            ]),
            None => tls.extend(["--tls-auth-clients".to_owned(), "no".to_owned()]),
        }
        Self::spawn_with(false, move |port| {
            let mut args = vec![
                "--port".to_owned(),
                "0".to_owned(),
                "--tls-port".to_owned(),
                port.to_string(),
            ];
            args.extend(tls.iter().cloned());
            args
        })
    }

    /// `rediss://127.0.0.1:PORT/#insecure` (the test certificate is self-signed).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/#insecure", self.port)
    }

    fn spawn(extra: &[&str]) -> Self {
        let cluster = extra.windows(2).any(|w| w == ["--cluster-enabled", "yes"]);
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::spawn_with(cluster, move |_| extra.clone())
    }

    /// Starts a server on a free port, `cluster` saying whether it is a cluster node,
    /// which also listens on its cluster bus port, `port + CLUSTER_BUS_OFFSET`.
    fn spawn_with(cluster: bool, extra: impl Fn(u16) -> Vec<String>) -> Self {
        let binary = std::env::var_os("TRANCHE_REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        for _ in 0..10 {
            let port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            let dir =
                std::env::temp_dir().join(format!("tranche-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(extra(port))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|err| {
                    panic!(
                        "cannot start {}: {err}; run `cargo xtask test` (it installs redis-server) \
                         or set TRANCHE_REDIS_SERVER",
                        binary.display()
                    )
                });
            let mut server = Self { child, port, dir };
            let bus = cluster.then(|| port + CLUSTER_BUS_OFFSET);
            if server.wait_ready(bus) {
                return server;
            }
            // The port or the bus port was taken between probing and binding: try
            // another.
        }
        panic!("could not start a private redis-server after 10 attempts");
    }

    /// Whether the server came up listening on its port and, for a cluster node, on
    /// its cluster `bus` port too.
    fn wait_ready(&mut self, bus: Option<u16>) -> bool {
        let ports: Vec<u16> = std::iter::once(self.port).chain(bus).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            // The port answering is not enough: between probing a free port and binding
            // it, a server another test started may have taken it, and this one is
            // about to exit. Ready means the listening socket is this child's. A cluster
            // node listens on its port before it binds the bus port, and exits if that
            // bind fails, so it is ready only once it holds both.
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
                && listens_on(self.child.id(), &ports)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs one command through a fresh synchronous connection and returns the reply
    /// rendered as text.
    pub fn cli(&self, args: &[&str]) -> String {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        match cmd.query::<redis::Value>(&mut conn) {
            Ok(redis::Value::Okay) => "OK".to_owned(),
            Ok(v) => {
                redis::from_redis_value::<String>(v.clone()).unwrap_or_else(|_| format!("{v:?}"))
            }
            Err(e) => format!("ERR {e}"),
        }
    }

    /// Redis memory of every key, by `MEMORY USAGE`: what the data costs, without the
    /// server's own overhead that `used_memory` includes.
    pub fn bytes_of_all_keys(&self) -> u64 {
        let keys: Vec<String> = self.query(redis::cmd("KEYS").arg("*"));
        self.bytes_of(&keys)
    }

    /// Total `MEMORY USAGE` of `keys` (missing keys count 0).
    pub fn bytes_of<K: AsRef<str>>(&self, keys: &[K]) -> u64 {
        keys.iter()
            .map(|key| {
                self.query::<Option<u64>>(redis::cmd("MEMORY").arg("USAGE").arg(key.as_ref()))
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Every key with its DUMP (or nil), sorted: compare two to show nothing changed.
    /// One connection, two pipelines (the DUMPs and types, then the members of hashes
    /// and sets): the refusal tests take thousands.
    pub fn dump_all(&self) -> Vec<(String, Option<Dump>)> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        keys.sort();
        if keys.is_empty() {
            return Vec::new();
        }
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.cmd("DUMP").arg(k).cmd("TYPE").arg(k);
        }
        let dumps: Vec<(Option<Vec<u8>>, String)> = pipe.query(&mut conn).unwrap();
        let mut pipe = redis::pipe();
        for (k, (_, kind)) in keys.iter().zip(&dumps) {
            match kind.as_str() {
                "hash" => pipe.cmd("HGETALL").arg(k),
                "set" => pipe.cmd("SMEMBERS").arg(k),
                _ => continue,
            };
        }
        let mut members = if pipe.cmd_iter().next().is_some() {
            pipe.query::<Vec<Vec<Vec<u8>>>>(&mut conn).unwrap()
        } else {
            Vec::new()
        }
        .into_iter();
        keys.into_iter()
            .zip(dumps)
            .map(|(key, (bytes, kind))| {
                let members = match kind.as_str() {
                    "hash" | "set" => members.next(),
                    _ => None,
                };
                (key, bytes.map(|bytes| Dump::new(bytes, &kind, members)))
            })
            .collect()
    }

    /// The server's clock (`TIME`) in ms.
    pub fn time_ms(&self) -> u64 {
        let (s, us): (u64, u64) = self.query(&redis::cmd("TIME"));
        s * 1000 + us / 1000
    }

    /// Waits until the server's clock has passed `ms`, failing after 5 s: for a test
    /// that needs the server's time to move on, with no guess at how long a sleep
    /// must be.
    pub fn wait_for_time_past(&self, ms: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.time_ms() <= ms {
            assert!(Instant::now() < deadline, "the server's clock stood still");
            std::thread::yield_now();
        }
    }

    /// Runs a command and parses the reply.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        cmd.query(&mut conn).unwrap()
    }
}

/// Every `lua/*.lua` file of the crate at `manifest_dir`, as (file name, source), by name.
pub fn lua_sources(manifest_dir: &str) -> Vec<(String, String)> {
    let dir = std::path::Path::new(manifest_dir).join("lua");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// The lines of `sources` that hand Redis a key not taken from `KEYS[]`.
///
/// A script on a Redis Cluster must declare every key it touches, all in one slot;
/// Redis 7 does not stop an undeclared key on a one-node cluster, so this is checked on
/// the source. `redis.call(cmd, KEY, ...)` is checked, and so is every helper in
/// `forwarders` (name, position of its key argument) that passes a `key` parameter on
/// to `redis.call`: its callers must give it `KEYS[...]`, while its own body may
/// forward `key`.
pub fn keys_not_from_keys(
    sources: &[(String, String)],
    forwarders: &[(&str, usize)],
) -> Vec<String> {
    let calls: Vec<(String, usize)> = std::iter::once(("redis.call(".to_owned(), 1))
        .chain(
            forwarders
                .iter()
                .map(|&(name, at)| (format!("{name}("), at)),
        )
        .collect();
    let mut offenders = Vec::new();
    for (name, source) in sources {
        for (n, line) in source.lines().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            if code.contains("local function") {
                continue;
            }
            for (call, key_at) in &calls {
                let mut rest = code;
                while let Some(at) = rest.find(call.as_str()) {
                    // `xredis.call(` or `my_variadic(` are other functions.
                    let boundary = at == 0
                        || !rest[..at]
                            .ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.');
                    rest = &rest[at + call.len()..];
                    if !boundary {
                        continue;
                    }
                    let args: Vec<&str> = rest.splitn(key_at + 2, ',').map(str::trim).collect();
                    let command = args[0].trim_matches(|c| c == '\'' || c == '"' || c == ')');
                    let keyless = call == "redis.call(" && command == "TIME";
                    let key = args.get(*key_at).copied().unwrap_or("");
                    if !keyless && !key.starts_with("KEYS[") && key != "key" {
                        offenders.push(format!("{name}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
    }
    offenders
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` holds a socket listening on 127.0.0.1 on each of `ports`
/// (Linux: the listener's inode in /proc/net/tcp among the process's file descriptors).
///
/// The table lists every TCP socket of the machine, the thousands in TIME_WAIT that a
/// test run's short connections leave among them, so it is read once and searched for
/// the text of a listener's line rather than split into columns, which in a debug build
/// cost every server start a tenth of a second of CPU.
fn listens_on(pid: u32, ports: &[u16]) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // `sl: local rem st tx:rx tr:when retrnsmt uid timeout inode ...`: a listener's local
    // address ends in the port, its remote address is zero and its state 0A (LISTEN);
    // from the port on, its inode is the ninth column.
    let inodes_of = |port: u16| -> Vec<String> {
        let wanted = format!(":{port:04X} 00000000:0000 0A ");
        table
            .match_indices(&wanted)
            .filter_map(|(at, _)| {
                let line = table[at..].split('\n').next()?;
                let inode = line.split_whitespace().nth(8)?;
                Some(format!("socket:[{inode}]"))
            })
            .collect()
    };
    let wanted: Vec<Vec<String>> = ports.iter().map(|&port| inodes_of(port)).collect();
    if wanted.iter().any(Vec::is_empty) {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let held: Vec<PathBuf> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .collect();
    wanted.iter().all(|inodes| {
        inodes
            .iter()
            .any(|i| held.iter().any(|target| target.as_os_str() == i.as_str()))
    })
}

/// How far above its client port a cluster node listens for the cluster bus (Redis's
/// `CLUSTER_PORT_INCR`, used when no `cluster-port` is set).
const CLUSTER_BUS_OFFSET: u16 = 10000;

/// A port the OS hands out as free. Ephemeral, so test processes running side by side
/// do not pick the same one; the probe is closed at once, and a server that loses the
/// port to another in between is retried by `spawn_with`.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port for a cluster node: one whose bus port, `port + CLUSTER_BUS_OFFSET`, is
/// below 65536 and free too.
///
/// The OS hands out ephemeral ports up to 60999 on Linux, and a node given one above
/// 55535 has no bus port: redis-server exits and the cluster never forms. Holding the
/// first probe while binding the second keeps another process from taking either in
/// between; both are closed together just before the server binds them, so the window
/// another process has to take one is no wider than `free_port`'s.
fn free_cluster_port() -> u16 {
    for _ in 0..100 {
        let probe = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        let Some(bus) = port.checked_add(CLUSTER_BUS_OFFSET) else {
            continue;
        };
        if let Ok(_bus_probe) = TcpListener::bind((Ipv4Addr::LOCALHOST, bus)) {
            return port;
        }
    }
    panic!("no free port with a free cluster bus port after 100 tries");
}

/// A Redis Cluster of `masters` masters with one replica each, on free ports, every
/// node a [`TestRedis`] (stopped on drop). `cluster-node-timeout` is 2 s, so a killed
/// master's replica is promoted within seconds.
pub struct TestCluster {
    /// Every node, masters first as `redis-cli --cluster create` assigned them.
    pub nodes: Vec<TestRedis>,
}

impl TestCluster {
    /// Starts `masters` masters with a replica each, creates the cluster and waits
    /// until every node sees it whole and every replica is in sync.
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, 1)
    }

    /// As [`TestCluster::start`] with `replicas` replicas per master (0 for a cluster
    /// of masters only, as the end-to-end bench runs it).
    pub fn start_with(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<TestRedis> = (0..masters * (1 + replicas))
            .map(|_| {
                TestRedis::spawn(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok(Duration::from_secs(60));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cluster.nodes.iter().all(|n| {
            let info = n.cli(&["INFO", "replication"]);
            info.contains("role:master") || info.contains("master_link_status:up")
        }) {
            assert!(Instant::now() < deadline, "replicas did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self
            .nodes
            .iter()
            .filter(|n| n.is_alive())
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A URL of one live node (the client discovers the rest).
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .find(|n| n.is_alive())
            .expect("a live node")
            .url()
    }

    /// The live nodes that are masters now.
    pub fn masters(&self) -> Vec<&TestRedis> {
        self.nodes
            .iter()
            .filter(|n| n.is_alive() && n.cli(&["INFO", "replication"]).contains("role:master"))
            .collect()
    }
}

impl TestRedis {
    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the server process is still running.
    pub fn is_alive(&self) -> bool {
        TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
    }
}

impl TestRedis {
    /// Sends `signal` (a `kill` name: `STOP`, `CONT`, ...) to the server process.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{signal} failed");
    }
}

/// One key's DUMP, to put back with `RESTORE`, compared by what the key holds.
///
/// A hash or a set stored as a hash table DUMPs its members in the table's order, and
/// while the table is rehashing every lookup moves a bucket: two DUMPs of one unchanged
/// hash, with an `HGET` between them, differ. So a hash or a set compares by its
/// members, sorted; any other type by its DUMP, which is a function of its contents.
#[derive(Clone, Debug)]
pub struct Dump {
    bytes: Vec<u8>,
    /// A hash's fields and values (each pair in turn) or a set's members, sorted.
    members: Option<Vec<Vec<u8>>>,
}

impl Dump {
    fn new(bytes: Vec<u8>, kind: &str, members: Option<Vec<Vec<u8>>>) -> Dump {
        let members = match (kind, members) {
            ("hash", Some(members)) => {
                let mut pairs: Vec<[Vec<u8>; 2]> = members
                    .chunks_exact(2)
                    .map(|p| [p[0].clone(), p[1].clone()])
                    .collect();
                pairs.sort();
                Some(pairs.into_iter().flatten().collect())
            }
            ("set", Some(mut members)) => {
                members.sort();
                Some(members)
            }
            _ => None,
        };
        Dump { bytes, members }
    }

    /// The serialized value, as `DUMP` gave it: what `RESTORE` takes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl PartialEq for Dump {
    fn eq(&self, other: &Dump) -> bool {
        match (&self.members, &other.members) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.bytes == other.bytes,
            _ => false,
        }
    }
}

impl Eq for Dump {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux hands out ephemeral ports from 32768 to 60999, a fifth of them above 55535:
    /// of 200 picks some land there, so a choice that forgot the bus port fails here.
    #[test]
    fn a_cluster_port_leaves_room_for_its_bus_port() {
        for _ in 0..200 {
            let port = free_cluster_port();
            assert!(
                port.checked_add(CLUSTER_BUS_OFFSET).is_some(),
                "port {port} has no bus port"
            );
        }
    }

    #[test]
    fn listens_on_wants_every_port_held_by_the_process() {
        let me = std::process::id();
        let first = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let second = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let ports = [
            first.local_addr().unwrap().port(),
            second.local_addr().unwrap().port(),
        ];
        assert!(listens_on(me, &ports));
        drop(second);
        assert!(listens_on(me, &ports[..1]));
        assert!(!listens_on(me, &ports));
    }

    /// A hash table that is rehashing moves a bucket at every lookup, which reorders its
    /// DUMP: the same hash DUMPs differently after an `HGET`, and compares equal. A
    /// changed value does not.
    #[test]
    fn a_hash_compares_by_its_fields_not_its_tables_order() {
        let server = TestRedis::start();
        let long = "x".repeat(80);
        // Five fields of values too long for a listpack: a table of 4 grown to 8, which
        // rehashes one bucket a lookup.
        for field in 1..=5 {
            server.cli(&["HSET", "h", &field.to_string(), &long]);
        }
        server.cli(&["SADD", "s", &long, "a", "b"]);
        let raw = |server: &TestRedis| -> Vec<u8> { server.query(redis::cmd("DUMP").arg("h")) };
        let before = server.dump_all();
        let (mut reordered, first) = (false, raw(&server));
        for _ in 0..4 {
            server.cli(&["HGET", "h", "3"]);
            reordered |= raw(&server) != first;
        }
        assert!(
            reordered,
            "no lookup reordered the DUMP, so this shows nothing"
        );
        assert_eq!(server.dump_all(), before);
        server.cli(&["HSET", "h", "3", "changed"]);
        assert_ne!(server.dump_all(), before);
        server.cli(&["HSET", "h", "3", &long]);
        server.cli(&["SREM", "s", "a"]);
        assert_ne!(server.dump_all(), before);
    }
}
