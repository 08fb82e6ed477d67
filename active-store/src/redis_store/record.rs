//! Reading the strings the Lua scripts write (see `lua/record.lua` for the layout).

use tranche_codec::{Partition, Status};

use super::MAX_RUN;
use crate::model::PlanEntry;

/// Parses an `active` hash value into a partition. `range_of` supplies the IDs of pids
/// issued from a uniform plan, whose records leave min and max empty. `None` if the
/// string is not a record this version wrote.
pub(super) fn parse(
    pid: u64,
    s: &str,
    range_of: impl Fn(u64) -> Option<(u64, u64)>,
) -> Option<Partition> {
    parse_bytes(pid, s.as_bytes(), range_of)
}

/// [`parse`] on the bytes of a reply, as they came: the fields are slices of `s`, and
/// only the worker id and the error text are copied out.
pub(super) fn parse_bytes(
    pid: u64,
    s: &[u8],
    range_of: impl Fn(u64) -> Option<(u64, u64)>,
) -> Option<Partition> {
    // Eleven separated fields, then the error text, which may itself contain '|'.
    let mut f: [&[u8]; 12] = [&[]; 12];
    let mut rest = s;
    for field in f.iter_mut().take(11) {
        let at = rest.iter().position(|&b| b == b'|')?;
        *field = &rest[..at];
        rest = &rest[at + 1..];
    }
    f[11] = rest;
    let opt = |s: &[u8]| -> Option<Option<u64>> {
        if s.is_empty() {
            Some(None)
        } else {
            parse_u64(s).map(Some)
        }
    };
    let text = |s: &[u8]| -> Option<Option<String>> {
        if s.is_empty() {
            Some(None)
        } else {
            std::str::from_utf8(s).ok().map(|s| Some(s.to_owned()))
        }
    };
    let status = match f[0] {
        b"p" => Status::Pending,
        b"c" => Status::Claimed,
        b"r" => Status::Running,
        b"f" => Status::Failed,
        b"d" => Status::Discarded,
        _ => return None,
    };
    let (min_id, max_id) = if f[8].is_empty() {
        range_of(pid)?
    } else {
        (parse_u64(f[8])?, parse_u64(f[9])?)
    };
    Some(Partition {
        pid,
        min_id,
        max_id,
        status,
        worker: text(f[7])?,
        attempts: u32::try_from(parse_u64(f[1])?).ok()?,
        progress: opt(f[10])?.unwrap_or(min_id),
        lease_token: opt(f[2])?,
        deadline_ms: opt(f[3])?,
        created_at_ms: parse_u64(f[4])?,
        claimed_at_ms: opt(f[5])?,
        updated_at_ms: opt(f[6])?.unwrap_or(0),
        completed_at_ms: None,
        duration_ms: None,
        last_error: text(f[11])?,
    })
}

/// A run of fresh pids claimed as one lease, as `lua/runs.lua` stores it in a shard's
/// `runs` hash: field the token, value `first|last|deadline|claimed|mask|worker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) token: u64,
    pub(super) first: u64,
    pub(super) last: u64,
    deadline: u64,
    claimed: u64,
    /// One byte per pid of `first..=last`: `c` while the run holds it, `.` once it left.
    mask: Vec<u8>,
    worker: String,
}

impl Run {
    /// The pids the run still holds, in order.
    pub(super) fn pids(&self) -> impl Iterator<Item = u64> + '_ {
        (self.first..=self.last)
            .zip(&self.mask)
            .filter(|&(_, &held)| held == b'c')
            .map(|(pid, _)| pid)
    }

    /// The record a pid the run holds stands for: a fresh claim's (`lua/runs.lua`).
    pub(super) fn record(&self) -> String {
        let (token, deadline, at, worker) = (self.token, self.deadline, self.claimed, &self.worker);
        format!("c|1|{token}|{deadline}|{at}|{at}|{at}|{worker}||||")
    }

    /// The partition `pid`, which the run holds, with its IDs `range` (from its uniform
    /// plan): what [`parse`] makes of [`Run::record`], built without the string (an
    /// `all_active` of 10,000 claimed partitions makes 10,000 of them).
    pub(super) fn partition(&self, pid: u64, (min_id, max_id): (u64, u64)) -> Partition {
        Partition {
            pid,
            min_id,
            max_id,
            status: Status::Claimed,
            worker: Some(self.worker.clone()),
            attempts: 1,
            progress: min_id,
            lease_token: Some(self.token),
            deadline_ms: Some(self.deadline),
            created_at_ms: self.claimed,
            claimed_at_ms: Some(self.claimed),
            updated_at_ms: self.claimed,
            completed_at_ms: None,
            duration_ms: None,
            last_error: None,
        }
    }

    /// Whether the run still holds `pid`.
    pub(super) fn holds(&self, pid: u64) -> bool {
        pid.checked_sub(self.first)
            .and_then(|k| self.mask.get(k as usize))
            == Some(&b'c')
    }
}

/// Parses a `runs` hash entry; `None` if it is not a run this version wrote (checked as
/// `run_decode_or` in `lua/runs.lua` checks it).
pub(super) fn parse_run(token: &[u8], value: &[u8]) -> Option<Run> {
    let short = |f: &[u8]| {
        (f.len() <= 15 && (f.len() <= 1 || f[0] != b'0'))
            .then(|| parse_u64(f))
            .flatten()
    };
    let mut f = value.splitn(6, |&b| b == b'|');
    let (first, last) = (short(f.next()?)?, short(f.next()?)?);
    let (deadline, claimed) = (short(f.next()?)?, short(f.next()?)?);
    let mask = f.next()?;
    let worker = std::str::from_utf8(f.next()?).ok()?;
    let len = last.checked_sub(first)?.checked_add(1)?;
    if mask.len() as u64 != len
        || !mask.iter().all(|&b| b == b'c' || b == b'.')
        || worker.is_empty()
        || worker.contains('|')
    {
        return None;
    }
    Some(Run {
        token: parse_u64(token).filter(|&t| t > 0)?,
        first,
        last,
        deadline,
        claimed,
        mask: mask.to_vec(),
        worker: worker.to_owned(),
    })
}

/// The first and last pid a `runs` value still names in its first two fields, whether or
/// not the rest of it parses (at most 128 pids, as `lua/runs.lua` makes them, each of at
/// most 15 digits, as `carve.lua`'s 'broken' mode reads them): the pids of a corrupt run,
/// for `check` to list and `repair` to rebuild.
pub(super) fn run_span(value: &[u8]) -> Option<(u64, u64)> {
    let mut f = value.splitn(3, |&b| b == b'|');
    let pid = |f: &[u8]| (f.len() <= 15).then(|| parse_u64(f)).flatten();
    let first = pid(f.next()?)?;
    let last = pid(f.next()?)?;
    f.next()?;
    (last >= first && last - first < MAX_RUN as u64).then_some((first, last))
}

/// A `runs` hash entry that does not parse as a run, borrowed from the reply.
#[derive(Debug, Clone, Copy)]
pub(super) struct BrokenRun<'a> {
    /// Its field.
    pub(super) token: &'a [u8],
    /// Its value as stored, UTF-8 or not.
    pub(super) value: &'a [u8],
    /// The pids its first and last fields still name ([`run_span`]); `None` when they do
    /// not read, and what the run holds is unknown.
    pub(super) span: Option<(u64, u64)>,
}

impl BrokenRun<'_> {
    /// Whether its first and last fields name `pid`.
    pub(super) fn names(&self, pid: u64) -> bool {
        self.span
            .is_some_and(|(first, last)| (first..=last).contains(&pid))
    }
}

/// A shard's runs hash, as (token, value) pairs of bytes, split into the runs that parse
/// and the rest. A run that does not parse is set apart rather than failing the read, as
/// a corrupt record is: one damaged value must not blind every reader of the shard.
pub(super) fn runs_of<'a>(runs: &[(&'a [u8], &'a [u8])]) -> (Vec<Run>, Vec<BrokenRun<'a>>) {
    let mut sound = Vec::with_capacity(runs.len());
    let mut broken = Vec::new();
    for &(token, value) in runs {
        match parse_run(token, value) {
            Some(run) => sound.push(run),
            None => broken.push(BrokenRun {
                token,
                value,
                span: run_span(value),
            }),
        }
    }
    (sound, broken)
}

/// A decimal u64 of ASCII digits only (no sign, no space), as the scripts write them.
pub(super) fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s.len() < 20 {
        // Below 10^19 < 2^64: no digit can overflow, so no check per digit (this runs
        // some eighty thousand times in one `all_active` over 10,000 partitions).
        let mut n = 0u64;
        for &b in s {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            n = n * 10 + u64::from(digit);
        }
        return Some(n);
    }
    s.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The (field, value) pairs of a hash reply, borrowed from it: a flat array in RESP2, a
/// map in RESP3. `None` if the reply is neither or holds anything but bulk strings.
pub(super) fn hash_entries(reply: &redis::Value) -> Option<Vec<(&[u8], &[u8])>> {
    use redis::Value;
    fn bytes(v: &Value) -> Option<&[u8]> {
        match v {
            Value::BulkString(b) => Some(b.as_slice()),
            _ => None,
        }
    }
    match reply {
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks_exact(2)
            .map(|kv| Some((bytes(&kv[0])?, bytes(&kv[1])?)))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| Some((bytes(k)?, bytes(v)?)))
            .collect(),
        _ => None,
    }
}

/// Parses a registry entry `kind|first|last|min|max|size`.
pub(super) fn parse_plan_entry(s: &str) -> Option<PlanEntry> {
    let f: Vec<&str> = s.split('|').collect();
    let [kind, first, _last, min, max, size] = f.as_slice() else {
        return None;
    };
    let explicit = match *kind {
        "u" => false,
        "r" => true,
        _ => return None,
    };
    let plan = tranche_codec::PlanGeometry::new(
        first.parse().ok()?,
        min.parse().ok()?,
        max.parse().ok()?,
        size.parse().ok()?,
    )
    .ok()?;
    Some(PlanEntry { plan, explicit })
}

/// Parses a shard's plans-list entry `first|last`.
pub(super) fn parse_cursor_plan(s: &str) -> Option<(u64, u64)> {
    let (first, last) = s.split_once('|')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_claimed_record_with_plan_derived_range() {
        let p = parse(4970, "c|1|17|1000|10|10|10|worker1||||", |_| {
            Some((4_969_001, 4_970_000))
        })
        .unwrap();
        assert_eq!(p.status, Status::Claimed);
        assert_eq!(
            (p.min_id, p.max_id, p.progress),
            (4_969_001, 4_970_000, 4_969_001)
        );
        assert_eq!(p.lease_token, Some(17));
        assert_eq!(p.worker.as_deref(), Some("worker1"));
    }

    #[test]
    fn a_runs_partition_is_its_record_parsed() {
        let run = parse_run(b"4242", b"10|13|90000|1000|c.cc|worker-7").unwrap();
        assert_eq!(run.pids().collect::<Vec<_>>(), [10, 12, 13]);
        assert!(run.holds(12) && !run.holds(11) && !run.holds(9) && !run.holds(14));
        for pid in run.pids() {
            let range = (pid * 1000 - 999, pid * 1000);
            let parsed = parse(pid, &run.record(), |_| Some(range)).unwrap();
            assert_eq!(run.partition(pid, range), parsed, "pid {pid}");
        }
        assert_eq!(run.record(), "c|1|4242|90000|1000|1000|1000|worker-7||||");
    }

    #[test]
    fn a_broken_runs_span_reads_as_carve_reads_it() {
        assert_eq!(run_span(b"4|6|\xff|x"), Some((4, 6)));
        assert_eq!(run_span(b"007|9|"), Some((7, 9)));
        // carve.lua's 'broken' mode reads no pid of more than 15 digits, nor a span of
        // more than 128 pids, nor one backwards: nor does `check`.
        for bad in [
            &b"garbage"[..],
            b"4|6",
            b"6|4|",
            b"1|129|",
            b"0000000000000001|2|",
            b"\xff|2|",
        ] {
            assert_eq!(run_span(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn error_text_may_contain_separators() {
        let p = parse(1, "f|5|||10|10|20|w|1|9|5|exit 1: a|b|c", |_| None).unwrap();
        assert_eq!(p.last_error.as_deref(), Some("exit 1: a|b|c"));
        assert_eq!((p.min_id, p.max_id, p.progress), (1, 9, 5));
    }

    #[test]
    fn parses_u64_exactly() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"-1",
            b"+1",
            b" 1",
            b"1a",
            b"1.0",
        ] {
            assert_eq!(parse_u64(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reads_hash_replies_in_both_protocols() {
        use redis::Value;
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let flat = Value::Array(vec![bulk("1"), bulk("a"), bulk("2"), bulk("b")]);
        let map = Value::Map(vec![(bulk("1"), bulk("a")), (bulk("2"), bulk("b"))]);
        for reply in [flat, map] {
            assert_eq!(
                hash_entries(&reply).unwrap(),
                vec![(&b"1"[..], &b"a"[..]), (&b"2"[..], &b"b"[..])]
            );
        }
        assert!(hash_entries(&Value::Array(vec![bulk("1")])).is_none());
        assert!(hash_entries(&Value::Array(vec![bulk("1"), Value::Int(2)])).is_none());
        assert!(hash_entries(&Value::Int(2)).is_none());
    }

    #[test]
    fn rejects_foreign_strings() {
        for bad in [
            "",
            "x|1",
            "z|1||||10|20|w|1|9|5|",
            "c|one||||10|20|w|1|9|5|",
            "c|-1||||10|20|w|1|9|5|",
            "c|1|| 5||10|20|w|1|9|5|",
        ] {
            assert!(parse(1, bad, |_| Some((1, 2))).is_none(), "{bad:?}");
        }
    }
}
