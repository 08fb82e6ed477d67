//! Reading the strings the Lua scripts write (see `lua/record.lua` for the layout).

use tranche_codec::{Partition, Status};

use crate::model::PlanEntry;

/// Parses an `active` hash value into a partition. `range_of` supplies the IDs of pids
/// issued from a uniform plan, whose records leave min and max empty. `None` if the
/// string is not a record this version wrote.
pub(super) fn parse(
    pid: u64,
    s: &str,
    range_of: impl Fn(u64) -> Option<(u64, u64)>,
) -> Option<Partition> {
    let f: Vec<&str> = s.splitn(12, '|').collect();
    if f.len() != 12 {
        return None;
    }
    let opt = |s: &str| -> Option<Option<u64>> {
        if s.is_empty() {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    let status = match f[0] {
        "p" => Status::Pending,
        "c" => Status::Claimed,
        "r" => Status::Running,
        "f" => Status::Failed,
        _ => return None,
    };
    let (min_id, max_id) = if f[8].is_empty() {
        range_of(pid)?
    } else {
        (f[8].parse().ok()?, f[9].parse().ok()?)
    };
    Some(Partition {
        pid,
        min_id,
        max_id,
        status,
        worker: (!f[7].is_empty()).then(|| f[7].to_owned()),
        attempts: f[1].parse().ok()?,
        progress: opt(f[10])?.unwrap_or(min_id),
        lease_token: opt(f[2])?,
        deadline_ms: opt(f[3])?,
        created_at_ms: f[4].parse().ok()?,
        claimed_at_ms: opt(f[5])?,
        updated_at_ms: opt(f[6])?.unwrap_or(0),
        completed_at_ms: None,
        duration_ms: None,
        last_error: (!f[11].is_empty()).then(|| f[11].to_owned()),
    })
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
    let plan = tranche_codec::Plan::new(
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
    fn error_text_may_contain_separators() {
        let p = parse(1, "f|5|||10|10|20|w|1|9|5|exit 1: a|b|c", |_| None).unwrap();
        assert_eq!(p.last_error.as_deref(), Some("exit 1: a|b|c"));
        assert_eq!((p.min_id, p.max_id, p.progress), (1, 9, 5));
    }

    #[test]
    fn rejects_foreign_strings() {
        for bad in [
            "",
            "x|1",
            "z|1||||10|20|w|1|9|5|",
            "c|one||||10|20|w|1|9|5|",
        ] {
            assert!(parse(1, bad, |_| Some((1, 2))).is_none(), "{bad:?}");
        }
    }
}
