//! Every script refuses bad input before its first write: a table of one good call per
//! script (rows.rs), each argument replaced in turn by every bad value of its kind and
//! each key it reads corrupted, with DUMP of every key compared before and after; each
//! key of its call replaced by one of another type in wrong_type.rs.

use std::sync::LazyLock;

use crate::support;

use support::TestRedis;

use super::one_shard;

mod rows;
mod wrong_type;

use rows::refusal_rows;

/// What an argument of a script is, and so which values it must refuse.
#[derive(Clone, Copy, Debug)]
enum Arg {
    /// A time in ms or a count: digits, below 2^53.
    Num,
    /// A positive count (at least 1).
    Pos,
    /// How many partitions a claim wants: 1 to 100,000.
    Want,
    /// A pid, token, bit offset, row ID or checkpoint: a decimal u64.
    Id,
    /// A completed-index bit offset: an [`Arg::Id`] a bitmap holds (below 2^32).
    Bit,
    /// An [`Arg::Id`] or empty (keep, or every one).
    OptId,
    /// 1 to 64 [`Arg::Id`]s, ','-separated.
    IdList,
    /// A worker id: no '|' (a record's separator), not empty.
    Worker,
    /// A worker id or empty (any worker).
    OptWorker,
    /// Free text (an error message): nothing to refuse.
    Text,
    /// A plan kind, `u` or `r`.
    Kind,
    /// A shard's plan range, `first|last`.
    Range,
    /// Encoded completed records: one JSON line, or a group's lines (at most 128, none
    /// empty, joined by newlines).
    Record,
    /// A completed record of a lease told it was cut: `<`, its last ID, `|`, one JSON
    /// line.
    CutRecord,
    /// A carried status, `p` or `f`.
    Status,
    /// A shard number below the shard count (1 here).
    Shard,
    /// A failure's policy: empty (the backoff), `permanent`, or a delay in ms.
    Policy,
    /// A piece's field, `pid:start`.
    PieceKey,
    /// `piece_fail`'s mode, `fail`, `reap` or `worker`.
    Mode,
    /// What `carve` carves: `pids`, `worker`, `expired` or `all`.
    Which,
}

/// Records `complete` refuses: none, an empty line first, last or between, and a group
/// of 129 lines (a run holds at most 128 pids).
static BAD_RECORDS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let long: &'static str = vec!["{\"a\":1}"; 129].join("\n").leak();
    vec![
        "",
        "\n{\"b\":2}",
        "{\"a\":1}\n",
        "{\"a\":1}\n\n{\"b\":2}",
        long,
    ]
});

impl Arg {
    fn bad(self) -> &'static [&'static str] {
        const HUGE: &str = "123456789012345678901234";
        match self {
            Arg::Num => &["x", "-1", "", "1.5", "1e3", " 1", HUGE],
            Arg::Pos => &["x", "-1", "", "1.5", "0", HUGE],
            Arg::Want => &["x", "-1", "", "1.5", "0", "100001", HUGE],
            Arg::Id => &["x", "-1", "", "1.5", "0x1", HUGE],
            Arg::Bit => &["x", "-1", "", "1.5", "0x1", "4294967296", HUGE],
            Arg::OptId => &["x", "-1", "1.5", "0x1", HUGE],
            Arg::IdList => &["x", "", ",", "1600,", ",1600", "1600,,1750", "1600,x", HUGE],
            Arg::Worker => &["", "a|b"],
            Arg::OptWorker => &["a|b"],
            Arg::Text => &[],
            Arg::Kind => &["x", ""],
            Arg::Range => &["x", "", "5|", "|5", "20|11", "a|b", "1|2|3"],
            Arg::Record => &BAD_RECORDS,
            Arg::CutRecord => &[
                "<",
                "<5",
                "<|{\"completed_at\":1}",
                "<x|{\"completed_at\":1}",
                "<05|{\"completed_at\":1}",
                "<-5|{\"completed_at\":1}",
                "<5|",
                "<5|{\"completed_at\":1}\n{\"b\":2}",
            ],
            Arg::Status => &["r", ""],
            Arg::Policy => &["soon", "-5", "1.5", "permanently", HUGE],
            Arg::Shard => &["x", "-1", "", "1"],
            Arg::PieceKey => &["x", "", "2", "2:", ":5", "a:b", "2:1.5", "2:5:6"],
            Arg::Mode => &["x", ""],
            Arg::Which => &["x", "", "pid"],
        }
    }
}

/// A corrupt value put into one key a script reads.
#[derive(Clone, Debug)]
enum Corrupt {
    /// `HSET key field value`.
    Field(String, String, String),
    /// `SET key value`.
    Set(String, &'static str),
    /// `RPUSH key value`.
    Push(String, &'static str),
    /// `ZADD key score member`.
    Zadd(String, String, String),
}

impl Corrupt {
    fn key(&self) -> &str {
        match self {
            Corrupt::Field(k, ..)
            | Corrupt::Set(k, _)
            | Corrupt::Push(k, _)
            | Corrupt::Zadd(k, ..) => k,
        }
    }

    fn apply(&self, server: &TestRedis) {
        match self {
            Corrupt::Field(k, f, v) => server.cli(&["HSET", k, f, v]),
            Corrupt::Set(k, v) => server.cli(&["SET", k, v]),
            Corrupt::Push(k, v) => server.cli(&["RPUSH", k, v]),
            Corrupt::Zadd(k, score, m) => server.cli(&["ZADD", k, score, m]),
        };
    }
}

/// One call of one script: a good call (which must succeed and write), each of whose
/// arguments is replaced in turn by every bad value of its kind, and corruptions of
/// the keys it reads, each of which must make the good call refuse. `setup` is applied
/// to the starting state first (what the good call works on); each of `skipped` is a
/// corrupt record the good call must pass by: it succeeds, its reply says so as `says`
/// tells, and nothing named by the record's field changes anywhere (the whole dump is
/// compared).
#[derive(Default)]
struct Row {
    script: &'static str,
    keys: Vec<String>,
    args: Vec<(String, Arg)>,
    corrupt: Vec<Corrupt>,
    setup: Vec<Corrupt>,
    skipped: Vec<Corrupt>,
    /// How the reply to a call that passed a skipped record by says so.
    says: Says,
}

/// How a reply says that a call passed a corrupt record by, in the reply's debug form.
#[derive(Clone, Copy, Debug, Default)]
enum Says {
    /// Not given: a row with skipped records must say.
    #[default]
    Unset,
    /// The reply holds this: the script's word for it (`!ERR corrupt record …`, a
    /// CORRUPT code).
    Holds(&'static str),
    /// The reply is this (a count that leaves the record out).
    Is(&'static str),
    /// The reply, a list of the pids the call did, leaves this one out.
    Omits(&'static str),
}

/// The state every row starts from (namespace `elk`, one shard, pids 1..=10 of 1000
/// IDs): pids 1, 3, 4 claimed, 2 running, 5 pending (released), 6 failed, 7..=10 not
/// issued yet, every one with a record of its own (the claim's run carved out). Returns
/// the store's tokens by pid.
pub(super) async fn refusal_state(server: &TestRedis) -> std::collections::HashMap<u64, u64> {
    use tranche_active_store::{Carried, Leases};
    let store = one_shard(server).await;
    let leases = store.claim("w", 6).await.unwrap();
    // Carved at once, so the calls below meet records as they did before runs.
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = [schema.runs(0), schema.active(0), schema.leases(0)];
    call(&mut conn, "carve", &keys, &["all".to_owned()])
        .await
        .unwrap();
    store.heartbeat(&leases[1], 1500).await.unwrap();
    store.release(&leases[4], 4000).await.unwrap();
    store.release(&leases[5], 5000).await.unwrap();
    let carried = Carried {
        pid: 6,
        attempts: 3,
        failed: true,
        worker: "w".into(),
    };
    assert_eq!(store.carry(&[carried]).await.unwrap(), 1);
    leases.iter().map(|l| (l.pid, l.token)).collect()
}

/// Every key's type and contents, by key, in an order that does not depend on
/// encodings.
pub(super) fn contents(server: &TestRedis) -> Vec<(String, (String, Vec<String>))> {
    let mut keys: Vec<String> = server.query(redis::cmd("KEYS").arg("*"));
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let v = logical(server, &k);
            (k, v)
        })
        .collect()
}

/// A key's type and contents, in an order that does not depend on its encoding.
fn logical(server: &TestRedis, key: &str) -> (String, Vec<String>) {
    let kind = server.cli(&["TYPE", key]);
    let mut items: Vec<String> = match kind.as_str() {
        "hash" => server.query(redis::cmd("HGETALL").arg(key)),
        "list" => server.query(redis::cmd("LRANGE").arg(key).arg(0).arg(-1)),
        "string" => vec![server.query(redis::cmd("GET").arg(key))],
        "zset" => server.query(
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        ),
        // Its length and last entry's ID: an XADD changes both.
        "stream" => {
            let last: Vec<(String, Vec<(String, String)>)> = server.query(
                redis::cmd("XREVRANGE")
                    .arg(key)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1),
            );
            vec![
                server.cli(&["XLEN", key]),
                last.first().map(|(id, _)| id.clone()).unwrap_or_default(),
            ]
        }
        _ => vec![],
    };
    if kind == "hash" {
        let mut pairs: Vec<String> = items.chunks(2).map(|p| p.join("=")).collect();
        pairs.sort();
        items = pairs;
    }
    (kind, items)
}

/// Invokes `script` with `keys` and `args`.
pub(super) async fn call(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &str,
    keys: &[String],
    args: &[String],
) -> redis::RedisResult<redis::Value> {
    let script = tranche_active_store::scripts()
        .into_iter()
        .find(|(n, _)| *n == script)
        .unwrap_or_else(|| panic!("no script {script}"))
        .1;
    let mut invocation = script.prepare_invoke();
    for k in keys {
        invocation.key(k);
    }
    for a in args {
        invocation.arg(a);
    }
    invocation.invoke_async(conn).await
}

/// Every key's entries as `name=value` strings: a hash's fields, a sorted set's members
/// with their scores; a list's items and a string's value stand alone (no name).
fn entries(server: &TestRedis) -> std::collections::BTreeSet<(String, String)> {
    let mut all = std::collections::BTreeSet::new();
    for (key, (kind, items)) in contents(server) {
        match kind.as_str() {
            "zset" => all.extend(items.chunks(2).map(|p| {
                (
                    key.clone(),
                    format!("{}={}", p[0], p.get(1).map_or("", |s| s)),
                )
            })),
            _ => all.extend(items.into_iter().map(|i| (key.clone(), i))),
        }
    }
    all
}

/// `row`'s good call, on a fresh starting state with `skipped` (a corrupt record)
/// applied, succeeds, says so in its reply as the row tells, and changes no entry of any key
/// named by the record's field (the field itself, or `field:…`, as a pid's pieces are):
/// what was skipped is left whole, not only its one record.
async fn passes_by(row: &Row, skipped: &Corrupt) -> Result<(), String> {
    let server = TestRedis::start();
    refusal_state(&server).await;
    for c in &row.setup {
        c.apply(&server);
    }
    skipped.apply(&server);
    let Corrupt::Field(key, field, value) = skipped else {
        return Err(format!("skipped {skipped:?} is not a record"));
    };
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let good: Vec<String> = row.args.iter().map(|(v, _)| v.clone()).collect();
    let before = entries(&server);
    let reply = call(&mut conn, row.script, &row.keys, &good)
        .await
        .map_err(|err| format!("skipped {skipped:?}: refused: {err}"))?;
    let after: Option<String> = server.query(redis::cmd("HGET").arg(key).arg(field));
    if after.as_deref() != Some(value.as_str()) {
        return Err(format!("skipped {skipped:?}: it became {after:?}"));
    }
    let shown = format!("{reply:?}");
    let says = match row.says {
        Says::Unset => false,
        Says::Holds(part) => shown.contains(part),
        Says::Is(whole) => shown == whole,
        Says::Omits(part) => !shown.contains(part),
    };
    if !says {
        return Err(format!(
            "skipped {skipped:?}: the reply {shown} does not say it as {:?}",
            row.says
        ));
    }
    let name = field.split(':').next().unwrap_or(field);
    let names_it = |entry: &str| {
        entry
            .split_once('=')
            .is_some_and(|(n, _)| n == name || n.starts_with(&format!("{name}:")))
    };
    let now = entries(&server);
    let touched: Vec<String> = before
        .symmetric_difference(&now)
        .filter(|(_, e)| names_it(e))
        .map(|(k, e)| format!("{k} {e}"))
        .collect();
    if !touched.is_empty() {
        return Err(format!(
            "skipped {skipped:?}: entries named {name} changed: {}",
            touched.join(", ")
        ));
    }
    Ok(())
}

/// Every script checks every argument and everything it reads before its first write:
/// each row's call with one argument replaced by a bad value (non-number, negative,
/// empty, fractional, huge), with one argument too few or too many, and with a corrupt
/// value in each key it reads (a record that does not decode or has a bad field, a
/// non-numeric counter, a bad plan entry or cursor) is refused, and DUMP of every key
/// is unchanged. The unchanged good call then succeeds and writes, so each refusal is
/// the bad value's doing.
#[tokio::test]
async fn every_script_refuses_bad_input_before_writing() {
    let probe = TestRedis::start();
    let tokens = refusal_state(&probe).await;
    let rows = refusal_rows(&probe, &tokens);
    let covered: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.script).collect();
    for (name, _) in tranche_active_store::scripts() {
        assert!(covered.contains(name), "script {name} has no refusal row");
    }
    let n = rows.len();
    drop(probe);

    let mut failures = Vec::new();
    for i in 0..n {
        // A fresh server per row: each good call writes. Tokens follow the server's
        // clock, so the row is built from this server's state.
        let server = TestRedis::start();
        let tokens = refusal_state(&server).await;
        let row = &refusal_rows(&server, &tokens)[i];
        for c in &row.setup {
            c.apply(&server);
        }
        for skipped in &row.skipped {
            if let Err(failure) = passes_by(row, skipped).await {
                failures.push(format!("row {i} {}: {failure}", row.script));
            }
        }
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let good: Vec<String> = row.args.iter().map(|(v, _)| v.clone()).collect();
        let mut variants: Vec<(String, Vec<String>)> = Vec::new();
        for (at, (_, kind)) in row.args.iter().enumerate() {
            for bad in kind.bad() {
                let mut args = good.clone();
                args[at] = (*bad).to_owned();
                variants.push((format!("argument {} = {bad:?}", at + 1), args));
            }
        }
        if !good.is_empty() {
            variants.push((
                "one argument too few".into(),
                good[..good.len() - 1].to_vec(),
            ));
        }
        let mut more = good.clone();
        more.push("1".into());
        variants.push(("one argument too many".into(), more));
        let mut before = server.dump_all();
        for (what, args) in &variants {
            let reply = call(&mut conn, row.script, &row.keys, args).await;
            let wrote = server.dump_all() != before;
            if reply.is_ok() || wrote {
                failures.push(format!(
                    "row {i} {}: {what}: {reply:?}{}",
                    row.script,
                    if wrote { ", and it wrote" } else { "" }
                ));
            }
            if wrote {
                break;
            }
        }
        if server.dump_all() != before {
            continue;
        }
        for corrupt in &row.corrupt {
            let key = corrupt.key().to_owned();
            let saved: Option<Vec<u8>> = server.query(redis::cmd("DUMP").arg(&key));
            let contents = logical(&server, &key);
            corrupt.apply(&server);
            let corrupted = server.dump_all();
            let reply = call(&mut conn, row.script, &row.keys, &good).await;
            let wrote = server.dump_all() != corrupted;
            if reply.is_ok() || wrote {
                failures.push(format!(
                    "row {i} {}: corrupt {corrupt:?}: {reply:?}{}",
                    row.script,
                    if wrote { ", and it wrote" } else { "" }
                ));
            }
            if wrote {
                break;
            }
            server.cli(&["DEL", &key]);
            if let Some(dump) = saved {
                let mut restore = redis::cmd("RESTORE");
                restore.arg(&key).arg(0).arg(dump);
                let _: () = server.query(&restore);
            }
            // A hash in the hashtable encoding may DUMP in another order once
            // restored: compare its contents, then take the new DUMP as the baseline.
            assert_eq!(logical(&server, &key), contents, "restored {key}");
            before = server.dump_all();
        }
        if server.dump_all() != before {
            continue;
        }
        match call(&mut conn, row.script, &row.keys, &good).await {
            Ok(_) if server.dump_all() != before => {}
            Ok(reply) => failures.push(format!(
                "row {i} {}: the good call wrote nothing ({reply:?})",
                row.script
            )),
            Err(err) => failures.push(format!(
                "row {i} {}: the good call failed: {err}",
                row.script
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} refusals missing:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
