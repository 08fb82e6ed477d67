//! The refusal table: one or more rows per script, each a good call, the kinds of its
//! arguments and the corruptions of the keys it reads.

use crate::support;

use support::TestRedis;

use super::{Arg, Corrupt, Row, Says};

/// The table: every script of `scripts()` has at least one row.
pub(super) fn refusal_rows(
    server: &TestRedis,
    tokens: &std::collections::HashMap<u64, u64>,
) -> Vec<Row> {
    use Arg::*;
    let schema = tranche_codec::KeySchema::new("elk", 1).unwrap();
    let (active, pending, leases) = (schema.active(0), schema.pending(0), schema.leases(0));
    let (plans, cursor, seq) = (
        schema.shard_key(0, "plans"),
        schema.shard_key(0, "cursor"),
        schema.shard_key(0, "seq"),
    );
    let runs = schema.runs(0);
    let (index, inbox, counts) = (
        schema.completed_index(0),
        schema.inbox(0),
        schema.shard_key(0, "counts"),
    );
    let (splits, pieces, piece_pending, piece_leases) = (
        schema.shard_key(0, "splits"),
        schema.shard_key(0, "pieces"),
        schema.shard_key(0, "piece_pending"),
        schema.shard_key(0, "piece_leases"),
    );
    // After every time the state's records hold (the store wrote them on the system
    // clock), so the released partition is ready.
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 60_000;
    let now = clock.to_string();
    let later = (clock + 30_000).to_string();
    let far = (clock + 1_000_000_000).to_string();
    let t = |pid: u64| tokens[&pid].to_string();
    let bit = |pid: u64| schema.bit_offset(pid).to_string();
    let a = |v: &str, kind: Arg| (v.to_owned(), kind);
    // A record of `pid` with field `n` (1-based, as in record.lua) replaced.
    let record = |pid: u64, n: usize, value: &str| {
        let rec: String = server.query(redis::cmd("HGET").arg(&active).arg(pid));
        let mut fields: Vec<&str> = rec.split('|').collect();
        fields[n - 1] = value;
        Corrupt::Field(active.clone(), pid.to_string(), fields.join("|"))
    };
    let garbage = |pid: u64| Corrupt::Field(active.clone(), pid.to_string(), "garbage".into());
    let counter = |status: &str| Corrupt::Field(counts.clone(), status.into(), "x".into());
    // Split entries' completed-record prefixes, and a piece of pid 2 (1700..=2000)
    // pending, or claimed by w2 under token 99.
    let prefix2 = r#"{"pid":2,"min_id":1001,"max_id":2000,"worker_id":"w""#.to_owned();
    let prefix3 = r#"{"pid":3,"min_id":2001,"max_id":3000,"worker_id":"w""#.to_owned();
    let pending_piece = format!("p|0||||{now}|{now}||1700|2000|1700|");
    let leased_piece = format!("c|1|99|{later}|{now}|{now}|{now}|w2|1700|2000|1700|");
    // Pid 2 split: a piece 1700..=2000 leased by w2, another 1900..=2000 pending (its
    // owner part running), for `piece_fail`; `expired_piece` with its lease run out.
    let piece_fail_keys = vec![
        pieces.clone(),
        piece_pending.clone(),
        piece_leases.clone(),
        splits.clone(),
        active.clone(),
        leases.clone(),
        pending.clone(),
        counts.clone(),
    ];
    let split_piece = vec![
        Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
        Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
        Corrupt::Field(
            pieces.clone(),
            "2:1900".into(),
            format!("p|0||||{now}|{now}||1900|2000|1900|"),
        ),
        Corrupt::Zadd(piece_pending.clone(), "0".into(), "2:1900".into()),
        Corrupt::Field(
            splits.clone(),
            "2".into(),
            format!("|||||2|0|1|1001|2000|{prefix2}"),
        ),
    ];
    let mut expired_piece = split_piece.clone();
    expired_piece[1] = Corrupt::Zadd(piece_leases.clone(), "1".into(), "2:1700".into());
    // Pids 7 and 8 held in a run under token 99 (not issued by the cursor, which no
    // script here reads with a run), its lease entry beside it; another run, 98, whose
    // value does not decode.
    let run = vec![
        Corrupt::Field(runs.clone(), "99".into(), format!("7|8|{later}|{now}|cc|w")),
        Corrupt::Zadd(leases.clone(), later.clone(), "r99".into()),
    ];
    let bad_run = Corrupt::Field(runs.clone(), "98".into(), "7|8|1|1|c|w".into());
    let carve_keys = vec![runs.clone(), active.clone(), leases.clone()];
    // The split keys fail, reap and discard read when a split partition ends there.
    let split_keys = [
        splits.clone(),
        pieces.clone(),
        piece_pending.clone(),
        piece_leases.clone(),
    ];
    let with_splits = |keys: &[&String]| -> Vec<String> {
        keys.iter()
            .map(|k| (*k).clone())
            .chain(split_keys.iter().cloned())
            .collect()
    };
    let fail_keys = with_splits(&[&active, &leases, &pending, &counts]);
    let discard_keys = with_splits(&[&active, &pending, &counts, &plans, &cursor]);
    // Pid 5 (pending, 4001..=5000) split: a piece 4500..=4799 pending, one 4800..=5000
    // leased by w2 under token 97, for `discard`.
    let prefix5 = r#"{"pid":5,"min_id":4001,"max_id":5000,"worker_id":"w""#.to_owned();
    let split_pending = vec![
        Corrupt::Field(
            pieces.clone(),
            "5:4500".into(),
            format!("p|0||||{now}|{now}||4500|4799|4500|"),
        ),
        Corrupt::Zadd(piece_pending.clone(), "0".into(), "5:4500".into()),
        Corrupt::Field(
            pieces.clone(),
            "5:4800".into(),
            format!("c|1|97|{later}|{now}|{now}|{now}|w2|4800|5000|4800|"),
        ),
        Corrupt::Zadd(piece_leases.clone(), later.clone(), "5:4800".into()),
        Corrupt::Field(
            splits.clone(),
            "5".into(),
            format!("|||||2|0|1|4001|5000|{prefix5}"),
        ),
    ];
    let piece_fail_corrupt = vec![
        Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
        Corrupt::Field(pieces.clone(), "2:1900".into(), "garbage".into()),
        Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
        garbage(2),
        record(2, 11, "x"),
        counter("r"),
        counter("f"),
    ];
    vec![
        Row {
            script: "claim",
            keys: vec![
                active.clone(),
                pending.clone(),
                leases.clone(),
                plans.clone(),
                cursor.clone(),
                seq.clone(),
                counts.clone(),
                runs.clone(),
            ],
            args: vec![
                a("w2", Worker),
                a("2", Want),
                a(&now, Num),
                a(&later, Num),
                a("0", Shard),
                a("1", Pos),
                a("100", Pos),
            ],
            corrupt: vec![
                garbage(5),
                record(5, 2, "x"),
                record(5, 1, "z"),
                counter("c"),
                counter("p"),
                Corrupt::Push(plans.clone(), "garbage"),
                Corrupt::Field(cursor.clone(), "1".into(), "x".into()),
                Corrupt::Set(seq.clone(), "x"),
            ],
            ..Row::default()
        },
        Row {
            script: "heartbeat",
            keys: vec![
                active.clone(),
                leases.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_pending.clone(),
                runs.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("1", Id),
                a(&t(1), Id),
                a("500", OptId),
                a("", OptId),
                a("3", Id),
                a(&t(3), Id),
                a("2500", OptId),
                a("2600", OptId),
            ],
            corrupt: vec![counter("c"), counter("r")],
            // A lease whose record does not decode is answered alone (`!`), left as it
            // is, and the other lease is renewed.
            skipped: vec![garbage(3), record(3, 11, "x"), record(3, 2, "x")],
            says: Says::Holds("!ERR corrupt record {elk:0}:active 3"),
            ..Row::default()
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                runs.clone(),
            ],
            args: vec![
                a("1", Id),
                a(&t(1), Id),
                a(&bit(1), Bit),
                a("{\"pid\":1}", Record),
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Bit),
                a("{\"pid\":3}", Record),
            ],
            corrupt: vec![counter("c")],
            // A pid whose record does not decode is answered CORRUPT and left as it is;
            // the other completes.
            skipped: vec![garbage(3)],
            says: Says::Holds("int(-2)"),
            ..Row::default()
        },
        // A running lease completes: the running counter is read and checked.
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                runs.clone(),
            ],
            args: vec![
                a("2", Id),
                a(&t(2), Id),
                a(&bit(2), Bit),
                a("{\"pid\":2}", Record),
            ],
            corrupt: vec![counter("r")],
            ..Row::default()
        },
        Row {
            script: "fail",
            keys: fail_keys.clone(),
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&now, Num),
                a("boom", Text),
                a("5", Pos),
                a("1000", Num),
                a("60000", Num),
                a("", Policy),
            ],
            corrupt: vec![record(3, 2, "x"), record(3, 11, "x"), counter("c")],
            ..Row::default()
        },
        // A split partition's owner part fails for good: whole again, its pieces gone.
        // Its entry, its pieces and the counters are read and checked first.
        Row {
            script: "fail",
            keys: fail_keys.clone(),
            args: vec![
                a("2", Id),
                a(&t(2), Id),
                a(&now, Num),
                a("boom", Text),
                a("5", Pos),
                a("1000", Num),
                a("60000", Num),
                a("permanent", Policy),
            ],
            setup: split_piece.clone(),
            corrupt: vec![
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Field(pieces.clone(), "2:1900".into(), "garbage".into()),
                record(2, 11, "x"),
                counter("r"),
                counter("f"),
            ],
            ..Row::default()
        },
        Row {
            script: "release",
            keys: vec![
                active.clone(),
                leases.clone(),
                pending.clone(),
                counts.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("1", Id),
                a(&t(1), Id),
                a("100", OptId),
                a("3", Id),
                a(&t(3), Id),
                a("2100", OptId),
            ],
            corrupt: vec![
                garbage(3),
                record(3, 2, "x"),
                record(3, 11, "x"),
                counter("c"),
                counter("p"),
            ],
            ..Row::default()
        },
        Row {
            script: "reap",
            keys: fail_keys.clone(),
            args: vec![a(&far, Num), a("100", Num), a("", OptWorker), a("5", Pos)],
            corrupt: vec![counter("c"), counter("p")],
            skipped: vec![garbage(3), record(3, 2, "x")],
            says: Says::Omits(r#"'"3"'"#),
            ..Row::default()
        },
        // Every lease expired on its last attempt: split pid 2 fails whole again, its
        // pieces gone. A split entry or piece of it that does not decode costs pid 2's
        // reaping only, as a corrupt record does.
        Row {
            script: "reap",
            keys: fail_keys.clone(),
            args: vec![a(&far, Num), a("100", Num), a("", OptWorker), a("1", Pos)],
            setup: split_piece.clone(),
            corrupt: vec![counter("c"), counter("r"), counter("f")],
            skipped: vec![
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                Corrupt::Field(pieces.clone(), "2:1900".into(), "garbage".into()),
            ],
            says: Says::Omits(r#"'"2"'"#),
        },
        Row {
            script: "retry_failed",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![a(&now, Num), a("6", OptId)],
            corrupt: vec![record(6, 1, "z"), counter("f")],
            ..Row::default()
        },
        Row {
            script: "retry_failed",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![a(&now, Num), a("", OptId)],
            corrupt: vec![garbage(3), counter("p")],
            ..Row::default()
        },
        Row {
            script: "discard",
            keys: discard_keys.clone(),
            args: vec![a("5", Id), a(&now, Num)],
            corrupt: vec![garbage(5), record(5, 1, "z"), counter("p"), counter("d")],
            ..Row::default()
        },
        // A split partition is discarded whole, its pieces gone, the leased one too.
        Row {
            script: "discard",
            keys: discard_keys.clone(),
            args: vec![a("5", Id), a(&now, Num)],
            setup: split_pending,
            corrupt: vec![
                Corrupt::Field(splits.clone(), "5".into(), "garbage".into()),
                Corrupt::Field(
                    splits.clone(),
                    "5".into(),
                    format!("|||||x|0|1|4001|5000|{prefix5}"),
                ),
                Corrupt::Field(pieces.clone(), "5:4500".into(), "garbage".into()),
                Corrupt::Field(pieces.clone(), "5:4800".into(), "garbage".into()),
                counter("p"),
                counter("d"),
            ],
            ..Row::default()
        },
        Row {
            script: "discard",
            keys: discard_keys.clone(),
            args: vec![a("8", Id), a(&now, Num)],
            corrupt: vec![
                counter("d"),
                Corrupt::Push(plans.clone(), "garbage"),
                Corrupt::Field(cursor.clone(), "1".into(), "x".into()),
            ],
            ..Row::default()
        },
        Row {
            script: "plan",
            keys: vec![schema.plans()],
            args: vec![
                a("u", Kind),
                a("20001", Id),
                a("30000", Id),
                a("1000", Pos),
                a("10", Pos),
            ],
            corrupt: vec![Corrupt::Push(schema.plans(), "garbage")],
            ..Row::default()
        },
        Row {
            script: "plan",
            keys: vec![schema.plans()],
            args: vec![
                a("r", Kind),
                a("40001", Id),
                a("40500", Id),
                a("500", Pos),
                a("50001", Id),
                a("50100", Id),
                a("100", Pos),
            ],
            corrupt: vec![Corrupt::Push(schema.plans(), "r|x|12|1|2|2")],
            ..Row::default()
        },
        Row {
            script: "plan_cursor",
            keys: vec![plans.clone()],
            args: vec![a("11|20", Range)],
            corrupt: vec![Corrupt::Push(plans.clone(), "garbage")],
            ..Row::default()
        },
        Row {
            script: "plan_ranges",
            keys: vec![
                active.clone(),
                pending.clone(),
                index.clone(),
                counts.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("11", Id),
                a("20001", Id),
                a("21000", Id),
                a(&bit(11), Id),
                a("12", Id),
                a("21001", Id),
                a("22000", Id),
                a(&bit(12), Id),
            ],
            corrupt: vec![counter("p")],
            ..Row::default()
        },
        Row {
            script: "recount",
            keys: vec![active.clone(), counts.clone()],
            args: vec![],
            skipped: vec![garbage(3), record(3, 1, "z")],
            says: Says::Is("array([int(1), int(2), int(1), int(1), int(0)])"),
            ..Row::default()
        },
        Row {
            script: "repair",
            keys: vec![
                active.clone(),
                pending.clone(),
                leases.clone(),
                index.clone(),
                counts.clone(),
                format!("{active}:quarantine"),
            ],
            args: vec![
                a("3", Id),
                a(&now, Num),
                a(&bit(3), Id),
                a("2001", Id),
                a("3000", Id),
            ],
            corrupt: vec![counter("p")],
            setup: vec![garbage(3)],
            ..Row::default()
        },
        Row {
            script: "carry",
            keys: vec![active.clone(), pending.clone(), counts.clone()],
            args: vec![
                a(&now, Num),
                a("5", Id),
                a("2", Num),
                a("p", Status),
                a("", OptWorker),
                a("5", Id),
                a("3", Num),
                a("f", Status),
                a("w", OptWorker),
            ],
            corrupt: vec![garbage(5), record(5, 2, "x"), counter("p")],
            ..Row::default()
        },
        Row {
            script: "register",
            keys: vec!["{new}:meta".into()],
            args: vec![a("4", Pos), a("2", Pos)],
            corrupt: vec![Corrupt::Field(
                "{new}:meta".into(),
                "shards".into(),
                "x".into(),
            )],
            ..Row::default()
        },
        // Split partitions (`split.lua`): pid 2 runs (1001..=2000, checkpoint 1500).
        Row {
            script: "heartbeat",
            keys: vec![
                active.clone(),
                leases.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_pending.clone(),
                runs.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("2", Id),
                a(&t(2), Id),
                a("1550", OptId),
                a("1700", OptId),
            ],
            setup: vec![Corrupt::Field(
                splits.clone(),
                "2".into(),
                format!("o|1600|1901|w2|{now}|0|0|1|1001|2000|{prefix2}"),
            )],
            corrupt: vec![
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("o|1600|1901|w2|{now}|x|0|1|1001|2000|{prefix2}"),
                ),
            ],
            skipped: vec![garbage(2)],
            says: Says::Holds("!ERR corrupt record {elk:0}:active 2"),
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                runs.clone(),
            ],
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Bit),
                a("{\"pid\":3}", Record),
            ],
            // A piece outstanding: the owner part ends, the bit stays clear. No status
            // moves, so the counters are not read (a corrupt one is found by the next
            // call that moves one).
            setup: vec![Corrupt::Field(
                splits.clone(),
                "3".into(),
                format!("|||||1|0|1|2001|3000|{prefix3}"),
            )],
            corrupt: vec![Corrupt::Field(splits.clone(), "3".into(), "garbage".into())],
            skipped: vec![garbage(3)],
            says: Says::Is("array([int(-2)])"),
        },
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                runs.clone(),
            ],
            args: vec![
                a("3", Id),
                a(&t(3), Id),
                a(&bit(3), Bit),
                a(
                    "{\"pid\":3,\"completed_at\":1719234405.5,\"duration\":1}",
                    Record,
                ),
            ],
            // Every piece done: the record spans the partition.
            setup: vec![Corrupt::Field(
                splits.clone(),
                "3".into(),
                format!("|||||0|0|1|2001|3000|{prefix3}"),
            )],
            corrupt: vec![Corrupt::Field(splits.clone(), "3".into(), "garbage".into())],
            ..Row::default()
        },
        Row {
            script: "split_request",
            keys: vec![active.clone(), splits.clone(), pieces.clone()],
            args: vec![
                a("2", Id),
                a("o", OptId),
                a(&t(2), Id),
                a("1600,1750", IdList),
                a("1650,1901", IdList),
                a("w2", Worker),
                a(&now, Num),
                a("30000", Num),
                a("1001", Id),
                a("2000", Id),
                a(&prefix2, Record),
            ],
            corrupt: vec![
                garbage(2),
                record(2, 11, "x"),
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_claim",
            keys: vec![
                pieces.clone(),
                piece_pending.clone(),
                piece_leases.clone(),
                seq.clone(),
            ],
            args: vec![a("w2", Worker), a("2", Want), a(&now, Num), a(&later, Num)],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), pending_piece.clone()),
                Corrupt::Zadd(piece_pending.clone(), "0".into(), "2:1700".into()),
            ],
            corrupt: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Set(seq.clone(), "x"),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_beat",
            keys: vec![
                pieces.clone(),
                piece_pending.clone(),
                piece_leases.clone(),
                splits.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("1850", OptId),
            ],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("1700|1800|1901|w3|{now}|1|0|1|1001|2000|{prefix2}"),
                ),
            ],
            corrupt: vec![Corrupt::Field(splits.clone(), "2".into(), "garbage".into())],
            skipped: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            says: Says::Holds("!ERR corrupt record {elk:0}:pieces 2:1700"),
        },
        Row {
            script: "piece_complete",
            keys: vec![
                active.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_leases.clone(),
            ],
            args: vec![
                a(&now, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a(&bit(2), Bit),
            ],
            // The last piece, its owner part done: the partition completes.
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
                Corrupt::Field(
                    splits.clone(),
                    "2".into(),
                    format!("|||||1|1|1|1001|2000|{prefix2}"),
                ),
            ],
            corrupt: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), "garbage".into()),
                Corrupt::Field(splits.clone(), "2".into(), "garbage".into()),
                garbage(2),
                counter("r"),
            ],
            ..Row::default()
        },
        Row {
            script: "piece_release",
            keys: vec![pieces.clone(), piece_pending.clone(), piece_leases.clone()],
            args: vec![
                a(&now, Num),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", Id),
            ],
            setup: vec![
                Corrupt::Field(pieces.clone(), "2:1700".into(), leased_piece.clone()),
                Corrupt::Zadd(piece_leases.clone(), later.clone(), "2:1700".into()),
            ],
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        // A failed chunk with attempts left: the piece waits out its backoff.
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("5", Pos),
                a("fail", Mode),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("boom", Text),
                a("1000", Num),
                a("60000", Num),
                a("", Policy),
            ],
            setup: split_piece.clone(),
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        // Its last attempt: the partition fails, whole again. Its record, its entry,
        // its other pieces and the counters are read and checked first.
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("1", Pos),
                a("fail", Mode),
                a("2:1700", PieceKey),
                a("99", Id),
                a("1750", OptId),
                a("boom", Text),
                a("1000", Num),
                a("60000", Num),
                a("5000", Policy),
            ],
            setup: split_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![a(&now, Num), a("5", Pos), a("reap", Mode)],
            setup: expired_piece.clone(),
            corrupt: vec![Corrupt::Field(
                pieces.clone(),
                "2:1700".into(),
                "garbage".into(),
            )],
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![a(&now, Num), a("1", Pos), a("reap", Mode)],
            setup: expired_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
        Row {
            script: "piece_fail",
            keys: piece_fail_keys.clone(),
            args: vec![
                a(&now, Num),
                a("1", Pos),
                a("worker", Mode),
                a("w2", Worker),
            ],
            setup: split_piece.clone(),
            corrupt: piece_fail_corrupt.clone(),
            ..Row::default()
        },
        // A pid held in a run completes in it: the run is read and checked; one that
        // does not decode costs its own pids (CORRUPT_RUN), not the call.
        Row {
            script: "complete",
            keys: vec![
                active.clone(),
                leases.clone(),
                index.clone(),
                inbox.clone(),
                counts.clone(),
                splits.clone(),
                runs.clone(),
            ],
            args: vec![
                a("7", Id),
                a("99", Id),
                a(&bit(7), Bit),
                a("{\"pid\":7}", Record),
            ],
            setup: run.clone(),
            corrupt: vec![counter("c")],
            skipped: vec![
                Corrupt::Field(runs.clone(), "99".into(), "7|8|1|1|c|w".into()),
                Corrupt::Field(runs.clone(), "99".into(), format!("7|8|{later}|x|cc|w")),
            ],
            says: Says::Is("array([int(-3)])"),
        },
        // A beat of a pid held in a run: the run is read and checked, the pid leaves it;
        // one that does not decode costs its own pids (`!`), not the call.
        Row {
            script: "heartbeat",
            keys: vec![
                active.clone(),
                leases.clone(),
                counts.clone(),
                splits.clone(),
                pieces.clone(),
                piece_pending.clone(),
                runs.clone(),
            ],
            args: vec![
                a(&now, Num),
                a(&later, Num),
                a("8", Id),
                a("99", Id),
                a("7050", OptId),
                a("", OptId),
            ],
            setup: run.clone(),
            corrupt: vec![counter("c")],
            skipped: vec![
                Corrupt::Field(runs.clone(), "99".into(), "7|8|1|1|c|w".into()),
                Corrupt::Field(runs.clone(), "99".into(), format!("7|8|{later}|{now}|cx|w")),
            ],
            says: Says::Holds("!ERR corrupt run {elk:0}:runs 99"),
        },
        Row {
            script: "carve",
            keys: carve_keys.clone(),
            args: vec![a("pids", Which), a("1", Pos), a("7", Id)],
            setup: run.clone(),
            skipped: vec![bad_run.clone()],
            says: Says::Is("int(1)"),
            ..Row::default()
        },
        Row {
            script: "carve",
            keys: carve_keys.clone(),
            args: vec![a("worker", Which), a("w", Worker)],
            setup: run.clone(),
            skipped: vec![bad_run.clone()],
            says: Says::Is("int(2)"),
            ..Row::default()
        },
        Row {
            script: "carve",
            keys: carve_keys.clone(),
            args: vec![a("expired", Which), a(&far, Num)],
            setup: run.clone(),
            ..Row::default()
        },
        // Breaking up a run that does not decode reads the plans and their cursors: it
        // breaks up only pids the shard issued (pids 7 and 8 are, with the cursor at 9).
        Row {
            script: "carve",
            keys: vec![
                runs.clone(),
                active.clone(),
                leases.clone(),
                plans.clone(),
                cursor.clone(),
            ],
            args: vec![
                a("broken", Which),
                a("98", Id),
                a("0", Shard),
                a("1", Pos),
                a("100", Pos),
            ],
            setup: vec![
                bad_run.clone(),
                Corrupt::Field(cursor.clone(), "1".into(), "9".into()),
            ],
            corrupt: vec![
                Corrupt::Field(cursor.clone(), "1".into(), "x".into()),
                Corrupt::Push(plans.clone(), "x"),
            ],
            // A run whose first and last fields do not read stays: its pids are unknown.
            skipped: vec![Corrupt::Field(runs.clone(), "98".into(), "garbage".into())],
            says: Says::Is("array([])"),
        },
        Row {
            script: "carve",
            keys: carve_keys.clone(),
            args: vec![a("all", Which)],
            setup: run.clone(),
            skipped: vec![bad_run],
            says: Says::Is("int(2)"),
            ..Row::default()
        },
    ]
}
