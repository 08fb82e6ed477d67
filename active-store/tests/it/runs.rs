//! Interval leases on Redis (`lua/runs.lua`): what a run costs in keys, and that a pid
//! a run holds behaves as a fresh claim's record everywhere. The behaviour suite runs
//! every trait call over runs already; these look at the keys underneath.

use crate::support;

use redis::AsyncCommands;
use support::TestRedis;
use tranche_active_store::{
    ActiveQuery, Completion, Leases, Maintenance, RedisActiveStore, RedisConnection,
};
use tranche_codec::Status;

const RUNS: &str = "{rn:0}:runs";
const ACTIVE: &str = "{rn:0}:active";
const LEASES: &str = "{rn:0}:leases";

async fn store(server: &TestRedis) -> (RedisActiveStore, redis::aio::MultiplexedConnection) {
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = crate::planned(conn, "rn", 1, (1, 100_000, 100)).await;
    let client = redis::Client::open(server.url()).unwrap();
    (
        store,
        client.get_multiplexed_async_connection().await.unwrap(),
    )
}

/// The lease index's members but the skiplist keeper.
async fn lease_entries(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let all: Vec<String> = conn.zrange(LEASES, 0, -1).await.unwrap();
    all.into_iter()
        .filter(|m| !m.starts_with("tranche:"))
        .collect()
}

#[tokio::test]
async fn a_claim_is_one_run_and_its_completions_empty_it() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 10).await.unwrap();
    assert_eq!(
        leases.iter().map(|l| l.pid).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    assert!(
        leases
            .iter()
            .all(|l| l.token == leases[0].token && l.attempt == 1)
    );
    // One field, one lease entry, no record.
    let runs: Vec<(String, String)> = conn.hgetall(RUNS).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, leases[0].token.to_string());
    assert!(runs[0].1.starts_with("1|10|"), "{runs:?}");
    assert_eq!(
        lease_entries(&mut conn).await,
        vec![format!("r{}", leases[0].token)]
    );
    let records: u64 = conn.hlen(ACTIVE).await.unwrap();
    assert_eq!(records, 0);
    assert_eq!(store.counts().await.unwrap().claimed, 10);
    // A pid the run holds reads as claimed, with the run's token and worker.
    let p = store.get(4).await.unwrap().unwrap();
    assert_eq!((p.status, p.attempts), (Status::Claimed, 1));
    assert_eq!(p.lease_token, Some(leases[0].token));
    assert_eq!(store.all_active().await.unwrap().partitions.len(), 10);

    // Half complete: the run keeps the rest.
    let done: Vec<_> = leases[..5].iter().map(|l| (l.clone(), 5)).collect();
    for outcome in store.complete_many(&done).await.unwrap() {
        assert_eq!(outcome.unwrap(), Completion::Completed);
    }
    let run: String = conn.hget(RUNS, leases[0].token.to_string()).await.unwrap();
    assert!(run.contains("|.....ccccc|"), "{run}");
    // Again: duplicates, and the run is as it was.
    for outcome in store.complete_many(&done).await.unwrap() {
        assert_eq!(outcome.unwrap(), Completion::Duplicate);
    }
    // The rest: the run and its lease entry go.
    let rest: Vec<_> = leases[5..].iter().map(|l| (l.clone(), 5)).collect();
    for outcome in store.complete_many(&rest).await.unwrap() {
        assert_eq!(outcome.unwrap(), Completion::Completed);
    }
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    assert!(lease_entries(&mut conn).await.is_empty());
    assert_eq!(store.counts().await.unwrap().claimed, 0);
    assert!(store.get(4).await.unwrap().is_none(), "completed");
}

#[tokio::test]
async fn a_heartbeat_carves_its_pid_out_of_the_run() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 4).await.unwrap();
    let token = leases[0].token.to_string();
    store
        .heartbeat(&leases[1], leases[1].min_id + 50)
        .await
        .unwrap();
    // Pid 2 has its own record and lease entry; the run holds 1, 3 and 4.
    let run: String = conn.hget(RUNS, &token).await.unwrap();
    assert!(run.contains("|c.cc|"), "{run}");
    let mut entries = lease_entries(&mut conn).await;
    entries.sort();
    assert_eq!(entries, vec!["2".to_owned(), format!("r{token}")]);
    let p = store.get(2).await.unwrap().unwrap();
    assert_eq!(p.status, Status::Running);
    assert_eq!(p.progress, leases[1].min_id + 50);
    // A stale token is refused for a carved pid and for one still in the run.
    let mut stale = leases[2].clone();
    stale.token += 1;
    assert!(store.heartbeat(&stale, stale.min_id).await.is_err());
    assert!(matches!(
        store.complete(&stale, 5).await,
        Err(tranche_active_store::Error::LeaseLost { .. })
    ));
    // Release one, fail one, complete the others: the run goes, nothing is left held.
    store
        .release(&leases[0], leases[0].min_id + 10)
        .await
        .unwrap();
    store.fail(&leases[2], "boom").await.unwrap();
    for l in [&leases[1], &leases[3]] {
        assert_eq!(store.complete(l, 5).await.unwrap(), Completion::Completed);
    }
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.claimed, counts.running, counts.pending), (0, 0, 2));
    let released = store.get(1).await.unwrap().unwrap();
    assert_eq!(released.progress, leases[0].min_id + 10);
}

#[tokio::test]
async fn an_expired_run_is_reaped_pid_by_pid() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 6).await.unwrap();
    // One pid checkpointed before the worker died.
    store
        .heartbeat(&leases[3], leases[3].min_id + 7)
        .await
        .unwrap();
    let after = leases.iter().map(|l| l.deadline_ms).max().unwrap() + 60_000;
    let reaped = store.reap(after).await.unwrap();
    assert_eq!(reaped, (1..=6).collect::<Vec<_>>());
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    assert!(lease_entries(&mut conn).await.is_empty());
    // Each is pending from its own checkpoint: the fresh ones from their first ID.
    for l in &leases {
        let p = store.get(l.pid).await.unwrap().unwrap();
        let want = if l.pid == 4 { l.min_id + 7 } else { l.min_id };
        assert_eq!(
            (p.status, p.progress, p.attempts),
            (Status::Pending, want, 1)
        );
    }
    // The old holder is fenced off, whether its pid was carved or still in the run.
    assert!(store.complete(&leases[0], 5).await.is_err());
    assert!(store.complete(&leases[3], 5).await.is_err());
}

#[tokio::test]
async fn a_released_worker_gives_back_its_runs() {
    let server = TestRedis::start();
    let (store, _conn) = store(&server).await;
    let mine = store.claim("w", 3).await.unwrap();
    let theirs = store.claim("v", 2).await.unwrap();
    assert_eq!(store.release_worker("w").await.unwrap(), vec![1, 2, 3]);
    assert_eq!(store.counts().await.unwrap().claimed, 2);
    for l in &theirs {
        assert_eq!(store.complete(l, 5).await.unwrap(), Completion::Completed);
    }
    assert!(store.complete(&mine[0], 5).await.is_err());
    // A discard of a pid still held in a run is refused as leased.
    let held = store.claim("u", 1).await.unwrap().remove(0);
    assert!(matches!(
        store.discard(held.pid).await,
        Err(tranche_active_store::Error::Leased(_))
    ));
}

#[tokio::test]
async fn a_corrupt_run_is_listed_by_its_pids_and_repaired() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 3).await.unwrap();
    let token = leases[0].token.to_string();
    // One byte of the mask flipped: the run no longer decodes.
    let run: String = conn.hget(RUNS, &token).await.unwrap();
    let _: () = conn
        .hset(RUNS, &token, run.replace("|ccc|", "|cxc|"))
        .await
        .unwrap();
    let corrupt = store.corrupt_records().await.unwrap();
    assert_eq!(
        corrupt.iter().map(|c| c.pid).collect::<Vec<_>>(),
        vec![Some(1), Some(2), Some(3)]
    );
    assert!(
        corrupt[0].key.ends_with(&format!(":runs {token}")),
        "{corrupt:?}"
    );
    // Its holder's completion is refused, not taken as done.
    assert!(store.complete(&leases[0], 5).await.is_err());
    // The first repair rebuilds every pid the run held; the rest find them sound.
    let repaired: Vec<_> = {
        let mut out = Vec::new();
        for c in &corrupt {
            out.push(store.repair_corrupt(c.pid.unwrap()).await.unwrap());
        }
        out
    };
    use tranche_active_store::Repair::{Nothing, Rebuilt};
    assert_eq!(repaired, [Rebuilt, Nothing, Nothing]);
    assert!(store.corrupt_records().await.unwrap().is_empty());
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    assert!(lease_entries(&mut conn).await.is_empty());
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.claimed, counts.pending), (0, 3));
    for pid in 1..=3 {
        assert_eq!(
            store.get(pid).await.unwrap().unwrap().status,
            Status::Pending
        );
    }
}

/// A run that does not decode and is not even UTF-8, its first and last fields still
/// read: listed by its pids with its raw bytes, and repaired as a UTF-8 one is (each pid
/// pending again, its broken-up record set aside as bytes); another run of the shard is
/// untouched.
#[tokio::test]
async fn a_non_utf8_corrupt_run_is_listed_by_its_pids_and_repaired() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let broken = store.claim("w", 3).await.unwrap();
    let sound = store.claim("v", 2).await.unwrap();
    let token = broken[0].token.to_string();
    let raw = b"1|3|\xff\xfe|garbage".to_vec();
    let _: () = conn.hset(RUNS, &token, &raw).await.unwrap();
    let mut kept = Vec::new();
    for l in &sound {
        kept.push(store.get(l.pid).await.unwrap().unwrap());
    }
    let corrupt = store.corrupt_records().await.unwrap();
    assert_eq!(
        corrupt.iter().map(|c| c.pid).collect::<Vec<_>>(),
        vec![Some(1), Some(2), Some(3)]
    );
    assert!(
        corrupt
            .iter()
            .all(|c| c.key == format!("{RUNS} {token}") && c.raw == raw),
        "{corrupt:?}"
    );
    assert_eq!(
        store.repair_corrupt(1).await.unwrap(),
        tranche_active_store::Repair::Rebuilt
    );
    // Every pid the run held was broken up and rebuilt with it: 2 and 3 are sound now.
    assert_eq!(store.get(2).await.unwrap().unwrap().status, Status::Pending);
    for pid in [2, 3] {
        assert_eq!(
            store.repair_corrupt(pid).await.unwrap(),
            tranche_active_store::Repair::Nothing
        );
    }
    assert!(store.corrupt_records().await.unwrap().is_empty());
    let quarantined: Vec<(String, Vec<u8>)> =
        conn.hgetall(format!("{ACTIVE}:quarantine")).await.unwrap();
    assert_eq!(quarantined.len(), 3, "{quarantined:?}");
    let mut record = format!("broken run {token}: ").into_bytes();
    record.extend_from_slice(&raw);
    assert!(
        quarantined.iter().all(|(_, r)| *r == record),
        "{quarantined:?}"
    );
    for pid in 1..=3 {
        assert_eq!(
            store.get(pid).await.unwrap().unwrap().status,
            Status::Pending
        );
    }
    // The other run's pids are as they were (carved out into records of their own,
    // which changes how they are held, not what), and their holder completes them.
    for (l, was) in sound.iter().zip(&kept) {
        assert_eq!(store.get(l.pid).await.unwrap().as_ref(), Some(was));
    }
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.claimed, counts.pending), (2, 3));
    for l in &sound {
        assert_eq!(store.complete(l, 5).await.unwrap(), Completion::Completed);
    }
}

/// A run whose first and last fields do not read: listed once, without a pid, by runs
/// key and token; repairing the other corrupt records of its shard neither fails on it
/// nor touches it (what it holds is unknown).
#[tokio::test]
async fn a_run_whose_pids_cannot_be_read_is_listed_without_a_pid_and_left() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let lost = store.claim("w", 3).await.unwrap();
    let other = store.claim("v", 2).await.unwrap();
    let (lost_token, other_token) = (lost[0].token.to_string(), other[0].token.to_string());
    let garbage = b"\xffgarbage".to_vec();
    let _: () = conn.hset(RUNS, &lost_token, &garbage).await.unwrap();
    let _: () = conn.hset(RUNS, &other_token, "4|5|x").await.unwrap();
    let corrupt = store.corrupt_records().await.unwrap();
    let listed: Vec<_> = corrupt.iter().map(|c| (c.pid, c.key.as_str())).collect();
    let (lost_key, other_key) = (
        format!("{RUNS} {lost_token}"),
        format!("{RUNS} {other_token}"),
    );
    assert_eq!(
        listed,
        vec![
            (None, lost_key.as_str()),
            (Some(4), other_key.as_str()),
            (Some(5), other_key.as_str())
        ]
    );
    assert_eq!(corrupt[0].raw, garbage);
    assert_eq!(
        store.repair_corrupt(4).await.unwrap(),
        tranche_active_store::Repair::Rebuilt
    );
    assert_eq!(store.get(5).await.unwrap().unwrap().status, Status::Pending);
    let left = store.corrupt_records().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        (left[0].pid, left[0].key.as_str()),
        (None, lost_key.as_str())
    );
    let after: Vec<u8> = conn.hget(RUNS, &lost_token).await.unwrap();
    assert_eq!(after, garbage);
    assert!(
        lease_entries(&mut conn)
            .await
            .contains(&format!("r{lost_token}"))
    );
}

#[tokio::test]
async fn a_pid_completed_twice_in_one_call_leaves_its_run_once() {
    let server = TestRedis::start();
    let (store, _conn) = store(&server).await;
    let leases = store.claim("w", 3).await.unwrap();
    let twice = [(leases[1].clone(), 5), (leases[1].clone(), 5)];
    let outcomes: Vec<_> = store
        .complete_many(&twice)
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outcomes, vec![Completion::Completed, Completion::Duplicate]);
    assert_eq!(store.counts().await.unwrap().claimed, 2);
}

/// The pids of each inbox entry's records, entry by entry.
async fn inbox_pids(conn: &mut redis::aio::MultiplexedConnection) -> Vec<Vec<u64>> {
    let reply: redis::streams::StreamRangeReply = conn.xrange_all("{rn:0}:inbox").await.unwrap();
    reply
        .ids
        .iter()
        .map(|entry| {
            let body: String = entry.get("r").unwrap();
            body.split('\n')
                .map(|line| {
                    let v: serde_json::Value = serde_json::from_str(line).unwrap();
                    v["pid"].as_u64().unwrap()
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_run_completed_together_is_one_group_and_one_inbox_entry() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 40).await.unwrap();
    // Pid 35's bit set while its run holds it (a restored archive): the group sets its
    // bits 32 at a time and must read this one back from the second field.
    let _: i64 = conn
        .setbit("{rn:0}:completed:index", 35, true)
        .await
        .unwrap();
    let done: Vec<_> = leases.iter().map(|l| (l.clone(), 5)).collect();
    let outcomes = store.complete_many(&done).await.unwrap();
    for (l, outcome) in leases.iter().zip(outcomes) {
        let want = if l.pid == 35 {
            Completion::Duplicate
        } else {
            Completion::Completed
        };
        assert_eq!(outcome.unwrap(), want, "pid {}", l.pid);
    }
    // One entry of the fresh ones' records, in pid order; the run and its lease went.
    let want: Vec<u64> = (1..=40).filter(|&p| p != 35).collect();
    assert_eq!(inbox_pids(&mut conn).await, vec![want]);
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    assert!(lease_entries(&mut conn).await.is_empty());
    assert_eq!(store.counts().await.unwrap().claimed, 0);
    let set: u64 = conn.bitcount("{rn:0}:completed:index").await.unwrap();
    assert_eq!(set, 40);
}

#[tokio::test]
async fn a_group_its_run_no_longer_holds_whole_completes_pid_by_pid() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    let leases = store.claim("w", 10).await.unwrap();
    assert_eq!(
        store.complete(&leases[2], 5).await.unwrap(),
        Completion::Completed
    );
    // All ten again, and pid 11 under the run's token, which it never held: one group
    // the script takes apart.
    let mut past = leases[9].clone();
    past.pid = 11;
    let mut done: Vec<_> = leases.iter().map(|l| (l.clone(), 5)).collect();
    done.push((past, 5));
    let outcomes = store.complete_many(&done).await.unwrap();
    for ((l, _), outcome) in done.iter().zip(outcomes) {
        match l.pid {
            3 => assert_eq!(outcome.unwrap(), Completion::Duplicate),
            11 => assert!(matches!(
                outcome,
                Err(tranche_active_store::Error::LeaseLost { .. })
            )),
            _ => assert_eq!(outcome.unwrap(), Completion::Completed, "pid {}", l.pid),
        }
    }
    let want: Vec<u64> = (1..=10).filter(|&p| p != 3).collect();
    assert_eq!(inbox_pids(&mut conn).await, vec![vec![3], want]);
    let runs: u64 = conn.hlen(RUNS).await.unwrap();
    assert_eq!(runs, 0);
    assert!(lease_entries(&mut conn).await.is_empty());
    assert_eq!(store.counts().await.unwrap().claimed, 0);
    // Pid 11 is as it was: fresh, pending in the plan.
    let fresh = store.get(11).await.unwrap().unwrap();
    assert_eq!((fresh.status, fresh.attempts), (Status::Pending, 0));
    // A stale token for a whole run: every pid lost, nothing written.
    let leases = store.claim("w", 5).await.unwrap();
    let stale: Vec<_> = leases
        .iter()
        .map(|l| {
            let mut l = l.clone();
            l.token += 1;
            (l, 5)
        })
        .collect();
    for outcome in store.complete_many(&stale).await.unwrap() {
        assert!(matches!(
            outcome,
            Err(tranche_active_store::Error::LeaseLost { .. })
        ));
    }
    let run: String = conn.hget(RUNS, leases[0].token.to_string()).await.unwrap();
    assert!(run.contains("|ccccc|"), "{run}");
    assert_eq!(inbox_pids(&mut conn).await.len(), 2);
    assert_eq!(store.counts().await.unwrap().claimed, 5);
}

/// A broken run whose first or last field is itself the damaged one names the wrong
/// pids. Its repair rebuilds the pids it may have held that the shard issued and no
/// sound run holds, the spans its mask's length gives from either end included: a last
/// misread as higher makes no pid the cursor has not issued pending (the cursor would
/// issue it again: two leases on one pid), and a first misread as higher loses no pid.
#[tokio::test]
async fn a_broken_run_with_a_wrong_end_rebuilds_only_its_own_pids() {
    let server = TestRedis::start();
    let (store, mut conn) = store(&server).await;
    // Runs 1..=3 (w) and 4..=6 (v); the cursor is at 7.
    let first = store.claim("w", 3).await.unwrap();
    let second = store.claim("v", 3).await.unwrap();
    let (t1, t2) = (first[0].token.to_string(), second[0].token.to_string());
    let run1: String = conn.hget(RUNS, &t1).await.unwrap();
    let run2: String = conn.hget(RUNS, &t2).await.unwrap();
    // Run 1's first field read as 2 (its mask still of 3: it held 1..=3 or 2..=4), run
    // 2's last as 9 (4..=9; 7, 8 and 9 not issued).
    let broken1 = run1.replacen("1|3|", "2|3|", 1);
    let broken2 = run2.replacen("4|6|", "4|9|", 1);
    assert!(broken1 != run1 && broken2 != run2);
    let _: () = conn.hset(RUNS, &t1, &broken1).await.unwrap();
    let _: () = conn.hset(RUNS, &t2, &broken2).await.unwrap();
    for c in store.corrupt_records().await.unwrap() {
        store.repair_corrupt(c.pid.unwrap()).await.unwrap();
    }
    assert!(store.corrupt_records().await.unwrap().is_empty());
    // Every pid the two runs held is pending again, pid 1 too; none the cursor has not
    // issued has a record.
    for pid in 1..=6 {
        let p = store.get(pid).await.unwrap().unwrap();
        assert_eq!(p.status, Status::Pending, "pid {pid}");
    }
    for pid in 7..=9 {
        let rec: Option<Vec<u8>> = conn.hget(ACTIVE, pid).await.unwrap();
        assert_eq!(rec, None, "pid {pid}");
    }
    let counts = store.counts().await.unwrap();
    assert_eq!((counts.pending, counts.claimed), (6, 0));
    // Claimed again, every pid once.
    let again = store.claim("u", 20).await.unwrap();
    let mut pids: Vec<u64> = again.iter().map(|l| l.pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, (1..=20).collect::<Vec<_>>());
}
