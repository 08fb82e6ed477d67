//! `tranche doctor`: checks the Redis a namespace lives on for what tranche needs, one
//! line per check, and [`warn_at_start`], the eviction and persistence warnings `run`,
//! `plan` and `serve` print once.
//!
//! It talks to the node the URL names over a plain connection (not the cluster
//! client): a cluster node whose slots are not all served is exactly what it must be
//! able to report. On a cluster it then checks every master `CLUSTER NODES` lists the
//! same way, each over its own connection with the URL's credentials and TLS, and
//! each line names its node: eviction, persistence, replicas and ACL users are set
//! per node, and one master that evicts loses the shards it holds. Every verdict is a
//! pure function of what the server answered (`judge_*`), so each threshold is tested
//! without a server that misbehaves so.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::cli::args::DoctorArgs;
use crate::cli::common::{Global, Outcome};

/// How far this host's clock may be from Redis's `TIME`: leases and backoff are
/// stamped with Redis's time, the worker's own timers with this host's.
const MAX_CLOCK_OFFSET_MS: i64 = 1000;
/// Round-trip latency above which doctor warns: every chunk pays a few of them.
const SLOW_ROUND_TRIP: Duration = Duration::from_millis(50);
/// Round trips measured for the latency line (the median is shown).
const PINGS: usize = 9;
/// The oldest Redis tranche runs on: XAUTOCLAIM came with 6.2.
const MIN_VERSION: (u64, u64) = (6, 2);

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Ok,
    /// Works, with a risk worth knowing (exit 0).
    Warn,
    /// tranche cannot keep its promises on this server (exit 1).
    Fail,
    /// Could not be checked here; the text says why.
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
struct Finding {
    check: &'static str,
    verdict: Verdict,
    text: String,
    /// The cluster master checked (`host:port`); `None` on a standalone server, whose
    /// header names it already.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
}

impl Finding {
    fn new(check: &'static str, verdict: Verdict, text: impl Into<String>) -> Self {
        Self {
            check,
            verdict,
            text: text.into(),
            node: None,
        }
    }

    /// The same finding, said of cluster node `node`.
    fn on(mut self, node: &str) -> Self {
        self.node = Some(node.to_owned());
        self
    }
}

/// `doctor`.
pub(crate) async fn doctor(g: &Global, args: &DoctorArgs) -> Result<Outcome> {
    let (client, shown) = client(g)?;
    let mut conn = connect(&client, &shown).await?;
    let findings = match masters(&mut conn).await? {
        None => node_checks(&mut conn, g, args).await?,
        Some(mut masters) => {
            // A lone node does not know its own address: it is the URL's.
            for master in masters.iter_mut().filter(|m| m.myself && m.host.is_empty()) {
                if let redis::ConnectionAddr::Tcp(host, _)
                | redis::ConnectionAddr::TcpTls { host, .. } =
                    client.get_connection_info().addr()
                {
                    master.host.clone_from(host);
                }
            }
            let mut findings = Vec::new();
            for master in masters {
                findings.extend(master_checks(&client, g, args, master).await);
            }
            findings
        }
    };
    print_findings(&shown, &findings, g.json);
    match failures(&findings) {
        None => Ok(Outcome::Success),
        Some(failed) if findings.iter().any(|f| f.node.is_some()) => Ok(Outcome::Failed(format!(
            "doctor: {failed} (the cluster of {shown})"
        ))),
        Some(failed) => Ok(Outcome::Failed(format!("doctor: {failed} on {shown}"))),
    }
}

/// What failed, one group per node: `eviction, persistence failed` on a standalone
/// server, `eviction failed on 10.0.0.2:6379; acl failed on 10.0.0.3:6379` on a
/// cluster. `None` when nothing did.
fn failures(findings: &[Finding]) -> Option<String> {
    let mut groups: Vec<(Option<&str>, Vec<&str>)> = Vec::new();
    for f in findings.iter().filter(|f| f.verdict == Verdict::Fail) {
        let node = f.node.as_deref();
        match groups.iter_mut().find(|(n, _)| *n == node) {
            Some((_, checks)) => checks.push(f.check),
            None => groups.push((node, vec![f.check])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let said: Vec<String> = groups
        .into_iter()
        .map(|(node, checks)| match node {
            Some(node) => format!("{} failed on {node}", checks.join(", ")),
            None => format!("{} failed", checks.join(", ")),
        })
        .collect();
    Some(said.join("; "))
}

/// A master `CLUSTER NODES` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Master {
    host: String,
    port: u16,
    /// The cluster has flagged it failed (`fail`).
    failed: bool,
    /// It serves at least one slot.
    serves_slots: bool,
    /// It is the node the URL names (`myself`), which may not know its own address
    /// yet (a lone node lists itself as `:port`).
    myself: bool,
}

impl Master {
    fn name(&self) -> String {
        if self.host.is_empty() {
            format!("port {}", self.port)
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Every master of the cluster the connection's node belongs to, by address; `None`
/// for a standalone server.
async fn masters(conn: &mut MultiplexedConnection) -> Result<Option<Vec<Master>>> {
    let enabled = field(&info(conn, "cluster").await?, "cluster_enabled");
    if enabled.as_deref() != Some("1") {
        return Ok(None);
    }
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(conn)
        .await
        .context("CLUSTER NODES")?;
    Ok(Some(parse_masters(&nodes)))
}

/// The masters in `CLUSTER NODES` text (`id host:port@bus[,hostname] flags master
/// ping pong epoch link slot...`), sorted by address. A node without an address yet
/// (`noaddr`) cannot be asked and is left out.
fn parse_masters(nodes: &str) -> Vec<Master> {
    let mut masters: Vec<Master> = nodes
        .lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let flags: Vec<&str> = parts.get(2)?.split(',').collect();
            if !flags.contains(&"master") || flags.contains(&"noaddr") {
                return None;
            }
            let addr = parts.get(1)?.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some(Master {
                host: host.trim_matches(['[', ']']).to_owned(),
                port: port.parse().ok()?,
                failed: flags.contains(&"fail"),
                serves_slots: parts.len() > 8,
                myself: flags.contains(&"myself"),
            })
        })
        .collect();
    masters.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    masters
}

/// Every check on one cluster master, each line naming it. A master that cannot be
/// reached, or fails to answer, is one `node` line: FAIL when it serves slots, WARN
/// when the cluster already took them away (a failed-over master not yet forgotten).
async fn master_checks(
    client: &redis::Client,
    g: &Global,
    args: &DoctorArgs,
    master: Master,
) -> Vec<Finding> {
    let name = master.name();
    let checked = async {
        let client = if master.myself {
            client.clone()
        } else {
            node_client(client, &master)?
        };
        let mut conn = connect(&client, &name).await?;
        node_checks(&mut conn, g, args).await
    };
    match checked.await {
        Ok(findings) => findings.into_iter().map(|f| f.on(&name)).collect(),
        Err(e) => {
            let flagged = if master.failed {
                " (the cluster flags it failed)"
            } else {
                ""
            };
            let finding = if master.serves_slots {
                Finding::new(
                    "node",
                    Verdict::Fail,
                    format!(
                        "master not checked{flagged}: {}",
                        crate::cli::common::one_line(&e)
                    ),
                )
            } else {
                Finding::new(
                    "node",
                    Verdict::Warn,
                    format!(
                        "master serving no slot not checked{flagged} (CLUSTER FORGET it once it is gone for good): {}",
                        crate::cli::common::one_line(&e)
                    ),
                )
            };
            vec![finding.on(&name)]
        }
    }
}

/// The checks of one server, in the report's order.
async fn node_checks(
    conn: &mut MultiplexedConnection,
    g: &Global,
    args: &DoctorArgs,
) -> Result<Vec<Finding>> {
    let mut findings = Vec::new();
    let server = info(conn, "server").await?;
    findings.push(judge_version(field(&server, "redis_version")));
    findings.push(judge_eviction(
        field(&info(conn, "memory").await?, "maxmemory_policy").as_deref(),
    ));
    let aof = field(&info(conn, "persistence").await?, "aof_enabled");
    let save = config(conn, "save").await;
    let fsync = config(conn, "appendfsync").await;
    findings.push(judge_persistence(
        aof.as_deref() == Some("1"),
        save.as_deref(),
        fsync.as_deref(),
    ));
    let replication = info(conn, "replication").await?;
    let min_replicas = config(conn, "min-replicas-to-write").await;
    findings.push(judge_replicas(
        field(&replication, "role").as_deref(),
        field(&replication, "connected_slaves").and_then(|n| n.parse().ok()),
        min_replicas.and_then(|n| n.parse().ok()),
    ));
    findings.push(clock(conn).await);
    findings.push(cluster(conn).await?);
    findings.push(acl(conn, g, args.acl_user.as_deref()).await);
    findings.push(latency(conn).await?);
    Ok(findings)
}

/// The eviction and persistence warnings `run`, `plan` and `serve` give once at
/// start (on stderr; with `--quiet` in the debug log only). Silent embedded, and when
/// the server cannot be asked: the command itself then says what is wrong.
pub(crate) async fn warn_at_start(g: &Global) {
    if g.redis.is_none() && g.redis_file.is_none() {
        return;
    }
    let ask = async {
        let (client, shown) = client(g).ok()?;
        let mut conn = connect(&client, &shown).await.ok()?;
        let memory = info(&mut conn, "memory").await.ok()?;
        let aof = field(&info(&mut conn, "persistence").await.ok()?, "aof_enabled");
        let save = config(&mut conn, "save").await;
        let fsync = config(&mut conn, "appendfsync").await;
        Some([
            judge_eviction(field(&memory, "maxmemory_policy").as_deref()),
            judge_persistence(
                aof.as_deref() == Some("1"),
                save.as_deref(),
                fsync.as_deref(),
            ),
        ])
    };
    let Ok(Some(findings)) = tokio::time::timeout(Duration::from_secs(3), ask).await else {
        return;
    };
    for f in findings.iter().filter(|f| f.verdict == Verdict::Fail) {
        if g.quiet {
            tracing::debug!("{}: {}", f.check, f.text);
        } else {
            eprintln!("tranche: warning: {}", f.text);
        }
    }
}

/// A client of the node the URL names, with the TLS files given, and the URL to show
/// (password masked).
fn client(g: &Global) -> Result<(redis::Client, String)> {
    let location = g.location();
    let url = crate::backend::redis_url(&location)?
        .context("doctor checks a Redis: give --redis URL (the embedded mode has none)")?;
    let shown = crate::layers::redact(&url);
    let tls = tranche_active_store::TlsOptions::from_files(
        location.tls_ca.as_deref(),
        location.tls_cert.as_deref(),
        location.tls_key.as_deref(),
    )?;
    if url.starts_with("rediss://") {
        // rustls needs a process-wide crypto provider; a second install is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let client = if tls.is_empty() {
        redis::Client::open(url.as_str())
    } else {
        redis::Client::build_with_tls(
            url.as_str(),
            redis::TlsCertificates {
                client_tls: tls.client.clone().map(|(client_cert, client_key)| {
                    redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }
                }),
                root_cert: tls.ca.clone(),
            },
        )
    }
    .map_err(|e| anyhow!("invalid --redis URL `{shown}`: {e}"))?;
    Ok((client, shown))
}

/// A client of cluster master `master`: the URL's credentials, database and TLS
/// settings, its address.
fn node_client(client: &redis::Client, master: &Master) -> Result<redis::Client> {
    let info = client.get_connection_info().clone();
    let addr = match info.addr() {
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host: master.host.clone(),
            port: master.port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => redis::ConnectionAddr::Tcp(master.host.clone(), master.port),
    };
    redis::Client::open(info.set_addr(addr))
        .map_err(|e| anyhow!("cannot reach master {}: {e}", master.name()))
}

/// A plain connection through `client`; `shown` names the server in errors.
async fn connect(client: &redis::Client, shown: &str) -> Result<MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| anyhow!("cannot connect to Redis at {shown}: {e}"))?;
    Ok(conn)
}

mod checks;
use checks::*;

fn print_findings(shown: &str, findings: &[Finding], json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({"redis": shown, "checks": findings})
        );
        return;
    }
    println!("{}", render(shown, findings));
}

/// The report as text: a header naming the server, then one line per check.
fn render(shown: &str, findings: &[Finding]) -> String {
    let mut out = format!("doctor: {shown}");
    for f in findings {
        let verdict = match f.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "skip",
        };
        match &f.node {
            Some(node) => out.push_str(&format!(
                "\n{verdict:<5} {:<12} {node}: {}",
                f.check, f.text
            )),
            None => out.push_str(&format!("\n{verdict:<5} {:<12} {}", f.check, f.text)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(f: Finding) -> Verdict {
        f.verdict
    }

    #[test]
    fn every_threshold_is_where_the_issue_puts_it() {
        assert_eq!(verdict(judge_eviction(Some("noeviction"))), Verdict::Ok);
        assert_eq!(verdict(judge_eviction(Some("allkeys-lru"))), Verdict::Fail);
        assert!(
            judge_eviction(Some("volatile-lru"))
                .text
                .contains("CONFIG SET maxmemory-policy noeviction")
        );
        assert_eq!(
            verdict(judge_persistence(false, Some(""), Some("everysec"))),
            Verdict::Fail
        );
        assert_eq!(
            verdict(judge_persistence(false, Some("3600 1"), None)),
            Verdict::Ok
        );
        assert_eq!(
            verdict(judge_persistence(true, Some(""), Some("everysec"))),
            Verdict::Ok
        );
        assert_eq!(
            verdict(judge_persistence(true, Some(""), Some("no"))),
            Verdict::Warn
        );
        assert_eq!(
            verdict(judge_replicas(Some("master"), Some(0), Some(0))),
            Verdict::Warn
        );
        assert_eq!(
            verdict(judge_replicas(Some("master"), Some(1), Some(1))),
            Verdict::Ok
        );
        assert_eq!(
            verdict(judge_replicas(Some("slave"), Some(0), None)),
            Verdict::Fail
        );
        assert_eq!(verdict(judge_clock(1000)), Verdict::Ok);
        assert_eq!(verdict(judge_clock(-1000)), Verdict::Ok);
        assert_eq!(verdict(judge_clock(1001)), Verdict::Fail);
        assert_eq!(verdict(judge_clock(-5000)), Verdict::Fail);
        assert_eq!(verdict(judge_version(Some("7.0.15".into()))), Verdict::Ok);
        assert_eq!(verdict(judge_version(Some("6.0.9".into()))), Verdict::Fail);
        assert_eq!(verdict(judge_cluster(None)), Verdict::Ok);
        let full = "cluster_state:ok\r\ncluster_slots_ok:16384\r\n";
        assert_eq!(verdict(judge_cluster(Some(full))), Verdict::Ok);
        let partial = "cluster_state:fail\r\ncluster_slots_ok:100\r\n";
        assert_eq!(verdict(judge_cluster(Some(partial))), Verdict::Fail);
    }

    #[test]
    fn cluster_nodes_give_every_master_with_an_address() {
        let nodes = "\
a1 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922
b2 127.0.0.1:7001@17001,host-a myself,master - 0 0 1 connected 0-5460
c3 127.0.0.1:7004@17004 slave a1 0 1 2 connected
d4 :0@0 master,noaddr - 0 0 0 disconnected
e5 [::1]:7003@17003 master,fail - 0 1 3 disconnected
";
        let masters = parse_masters(nodes);
        let names: Vec<String> = masters.iter().map(Master::name).collect();
        assert_eq!(names, ["127.0.0.1:7001", "127.0.0.1:7002", "[::1]:7003"]);
        assert!(masters[0].serves_slots && !masters[0].failed);
        assert!(!masters[2].serves_slots && masters[2].failed);
        assert!(masters[0].myself && !masters[1].myself);
        let lone = parse_masters("f6 :6379@16379 myself,master - 0 0 0 connected\n");
        assert_eq!(lone[0].name(), "port 6379");
        assert!(lone[0].myself && !lone[0].serves_slots);
    }

    #[test]
    fn failures_name_each_node_with_its_checks() {
        let standalone = [
            Finding::new("eviction", Verdict::Fail, ""),
            Finding::new("replicas", Verdict::Warn, ""),
            Finding::new("acl", Verdict::Fail, ""),
        ];
        assert_eq!(
            failures(&standalone).as_deref(),
            Some("eviction, acl failed")
        );
        let cluster = [
            Finding::new("eviction", Verdict::Ok, "").on("a:1"),
            Finding::new("eviction", Verdict::Fail, "").on("b:2"),
            Finding::new("persistence", Verdict::Fail, "").on("c:3"),
            Finding::new("acl", Verdict::Fail, "").on("b:2"),
        ];
        assert_eq!(
            failures(&cluster).as_deref(),
            Some("eviction, acl failed on b:2; persistence failed on c:3")
        );
        assert_eq!(failures(&cluster[..1]), None);
    }

    #[test]
    fn info_fields_are_read_whole() {
        let info = "# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(
            field(info, "maxmemory_policy").as_deref(),
            Some("allkeys-lru")
        );
        assert_eq!(field(info, "maxmemory").as_deref(), Some("0"));
        assert_eq!(field(info, "policy"), None);
    }
}
