//! Finding and repairing damaged statistics: values that do not decode, set aside under
//! a quarantine key and rebuilt from the archived records they derive from.
//!
//! The rule for a repair ([`StatsStore::repair`](crate::StatsStore::repair)), given the
//! statistics rebuilt from every archived record that could still be read and the
//! count of those that could not (expired summary batches, batches that do not decode):
//! - every damaged value is moved to the shard's quarantine, never decoded again;
//! - when every archived record was read (`unreadable == 0`), the shard is replaced
//!   whole by the rebuilt statistics: exact;
//! - otherwise the values that decode are kept as they are (they still count the
//!   records nobody can read any more), and only the damaged values are rebuilt, from
//!   the records that could be read: those values undercount by the unreadable
//!   records that fell in them, and [`Repaired::unreadable`] says how many records
//!   the rebuild lacked;
//! - but damage to the worker palette (a `{worker}|idx` field, or `palette` in
//!   `global`) makes the packed ranges unreadable as a whole, so the shard is then
//!   rebuilt whole from the readable records ([`Repaired::whole`]), losing the
//!   unreadable ones from its statistics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::aggregate::Aggregate;
use crate::hist::BUCKETS;
use crate::packed::{block_of, read_block, read_day};

/// The five statistics hashes of a shard, in the order of
/// [`stats_keys`](crate::archive_protocol::stats_keys).
pub(crate) const HASHES: [&str; 5] = ["global", "workers", "ranges", "hourly", "hist"];

/// One stored statistics value that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Damage {
    /// The shard it belongs to.
    pub shard: u32,
    /// Which of the shard's statistics hashes holds it: `global`, `workers`, `ranges`,
    /// `hourly` or `hist`.
    pub hash: String,
    /// The field (a block number in `ranges`, a day in `hourly`, ...).
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {} stats:{} field {:?}: {}",
            self.shard, self.hash, self.field, self.detail
        )
    }
}

/// What a repair did to one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Repaired {
    /// The shard.
    pub shard: u32,
    /// The damaged values set aside in the quarantine (`{ns:s}:stats:quarantine` on
    /// Redis, field `<hash>:<field>@<ms>`, value the bytes as they were).
    pub quarantined: Vec<Damage>,
    /// Whether the shard was rebuilt whole; otherwise only the damaged values were.
    pub whole: bool,
    /// Archived records the rebuild could not read (expired or undecodable batches):
    /// missing from every value rebuilt. With [`whole`](Self::whole) they are gone from
    /// the shard's statistics; otherwise only from the values that were damaged.
    pub unreadable: u64,
}

/// Whether `d` damages the worker palette, which forces a whole rebuild.
pub(crate) fn palette_damage(d: &Damage) -> bool {
    (d.hash == "workers" && d.field.ends_with("|idx"))
        || (d.hash == "global" && d.field == "palette")
}

/// Whether a repair of `damage` with `unreadable` records missing rebuilds whole.
pub(crate) fn rebuild_whole(damage: &[Damage], unreadable: u64) -> bool {
    unreadable == 0 || damage.iter().any(palette_damage)
}

fn parses<T: std::str::FromStr>(v: &[u8]) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let s = std::str::from_utf8(v).map_err(|e| e.to_string())?;
    s.parse::<T>().map_err(|e| format!("{s:?}: {e}"))
}

/// Every value of one shard's five hashes (as `HGETALL` gives them, in the order of
/// [`HASHES`]) that does not decode, each on its own: unlike a read, a scan goes on
/// past the first.
pub(crate) fn scan(shard: u32, hashes: &[Vec<(String, Vec<u8>)>]) -> Vec<Damage> {
    let mut out = Vec::new();
    let mut bad = |hash: usize, field: &str, detail: String| {
        out.push(Damage {
            shard,
            hash: HASHES[hash].to_owned(),
            field: field.to_owned(),
            detail,
        })
    };
    let empty = Vec::new();
    let hash = |i: usize| hashes.get(i).unwrap_or(&empty);

    for (f, v) in hash(0) {
        let ok = match f.as_str() {
            "count" | "first_completed_ms" | "last_completed_ms" | "updated_ms" | "palette" => {
                parses::<u64>(v).map(drop)
            }
            "ids" | "dur_sum_ms" => parses::<u128>(v).map(drop),
            _ => Err("unknown field".to_owned()),
        };
        if let Err(e) = ok {
            bad(0, f, e);
        }
    }

    let mut palette: HashMap<u64, Arc<str>> = HashMap::new();
    for (f, v) in hash(1) {
        let Some((w, kind)) = f.rsplit_once('|') else {
            bad(1, f, "no '|'".to_owned());
            continue;
        };
        let ok = match kind {
            "idx" => parses::<u64>(v).and_then(|i| {
                if palette.insert(i, Arc::from(w)).is_some() {
                    Err(format!("palette index {i} used twice"))
                } else {
                    Ok(())
                }
            }),
            "count" => parses::<u64>(v).map(drop),
            "ids" | "dur" => parses::<u128>(v).map(drop),
            _ => Err("unknown field".to_owned()),
        };
        if let Err(e) = ok {
            bad(1, f, e);
        }
    }

    let key = "ranges";
    for (f, v) in hash(2) {
        let ok = parses::<u64>(f.as_bytes()).and_then(|block| {
            read_block(key, block, v, &palette, &mut BTreeMap::new()).map_err(|e| e.to_string())
        });
        if let Err(e) = ok {
            bad(2, f, e);
        }
    }

    for (f, v) in hash(3) {
        let ok = if f.len() < 10 || f.contains('|') {
            Err("not YYYY-MM-DD".to_owned())
        } else {
            read_day("hourly", v).map(drop).map_err(|e| e.to_string())
        };
        if let Err(e) = ok {
            bad(3, f, e);
        }
    }

    for (f, v) in hash(4) {
        let ok = match f.rsplit_once('|') {
            None => Err("no '|'".to_owned()),
            Some((_, b)) => match b.parse::<u32>() {
                Ok(b) if b < BUCKETS => parses::<u64>(v).map(drop),
                _ => Err("no such bucket".to_owned()),
            },
        };
        if let Err(e) = ok {
            bad(4, f, e);
        }
    }
    out
}

/// Sentinels for a patch that leaves the completion-time bounds alone: a first
/// completion no stored one is later than, a last one no stored one is earlier than
/// (`apply_stats` keeps the least first and the greatest last).
pub(crate) const KEEP_FIRST: &str = "999999999999999999";
pub(crate) const KEEP_LAST: &str = "0";

/// What a patch carries: the part of `rebuilt` that the damaged values held, so that
/// applying it with those values read as absent writes them back rebuilt and adds
/// nothing to the others. Returns the aggregate and whether the first and last
/// completion times are among the damaged values.
pub(crate) fn patch(rebuilt: &Aggregate, damage: &[Damage]) -> (Aggregate, bool, bool) {
    let mut p = Aggregate::default();
    let (mut first, mut last) = (false, false);
    let worker = |p: &mut Aggregate, w: &str| -> Option<Arc<str>> {
        let (name, _) = rebuilt.workers.get_key_value(w)?;
        p.workers.entry(name.clone()).or_default();
        Some(name.clone())
    };
    for d in damage {
        match (d.hash.as_str(), d.field.as_str()) {
            ("global", "count") => p.totals.count = rebuilt.totals.count,
            ("global", "ids") => p.totals.ids = rebuilt.totals.ids,
            ("global", "dur_sum_ms") => p.totals.dur = rebuilt.totals.dur,
            ("global", "first_completed_ms") => {
                first = true;
                p.first = rebuilt.first;
            }
            ("global", "last_completed_ms") => {
                last = true;
                p.last = rebuilt.last;
            }
            ("workers", f) => {
                let Some((w, kind)) = f.rsplit_once('|') else {
                    continue;
                };
                let Some(name) = worker(&mut p, w) else {
                    continue;
                };
                let from = &rebuilt.workers[&name].totals;
                let to = &mut p.workers.get_mut(&name).expect("added above").totals;
                match kind {
                    "count" => to.count = from.count,
                    "ids" => to.ids = from.ids,
                    "dur" => to.dur = from.dur,
                    _ => {}
                }
            }
            ("ranges", f) => {
                let Ok(block) = f.parse::<u64>() else {
                    continue;
                };
                for (&r, range) in &rebuilt.ranges {
                    if block_of(r).0 == block {
                        for w in range.workers.keys() {
                            p.workers.entry(w.clone()).or_default();
                        }
                        p.ranges.insert(r, range.clone());
                    }
                }
            }
            ("hourly", day) => {
                if let Some(hours) = rebuilt.hourly.get(day) {
                    p.hourly.insert(day.to_owned(), *hours);
                }
            }
            ("hist", f) => {
                let Some((who, b)) = f.rsplit_once('|') else {
                    continue;
                };
                let Ok(b) = b.parse::<u32>() else {
                    continue;
                };
                if who == "*" {
                    if let Some(&n) = rebuilt.hist.counts.get(&b) {
                        p.hist.add_bucket(b, n);
                    }
                } else if let Some(name) = worker(&mut p, who)
                    && let Some(&n) = rebuilt.workers[&name].hist.counts.get(&b)
                {
                    let h = &mut p.workers.get_mut(&name).expect("added above").hist;
                    h.add_bucket(b, n);
                }
            }
            _ => {}
        }
    }
    (p, first, last)
}

/// The memory backend's patch: `agg` takes from `rebuilt` every part `damage` names.
pub(crate) fn patch_in_place(agg: &mut Aggregate, rebuilt: &Aggregate, damage: &[Damage]) {
    let (p, first, last) = patch(rebuilt, damage);
    for d in damage {
        match (d.hash.as_str(), d.field.as_str()) {
            ("global", "count") => agg.totals.count = p.totals.count,
            ("global", "ids") => agg.totals.ids = p.totals.ids,
            ("global", "dur_sum_ms") => agg.totals.dur = p.totals.dur,
            ("workers", f) => {
                if let Some((w, kind)) = f.rsplit_once('|')
                    && let (Some(to), Some(from)) = (
                        agg.workers.get_mut(w),
                        p.workers.get(w).map(|x| x.totals.clone()),
                    )
                {
                    match kind {
                        "count" => to.totals.count = from.count,
                        "ids" => to.totals.ids = from.ids,
                        "dur" => to.totals.dur = from.dur,
                        _ => {}
                    }
                }
            }
            ("ranges", f) => {
                if let Ok(block) = f.parse::<u64>() {
                    agg.ranges.retain(|&r, _| block_of(r).0 != block);
                }
            }
            ("hourly", day) => {
                agg.hourly.remove(day);
            }
            ("hist", f) => {
                if let Some((who, b)) = f.rsplit_once('|')
                    && let Ok(b) = b.parse::<u32>()
                {
                    let h = if who == "*" {
                        Some(&mut agg.hist)
                    } else {
                        agg.workers.get_mut(who).map(|w| &mut w.hist)
                    };
                    if let Some(h) = h {
                        h.counts.remove(&b);
                    }
                }
            }
            _ => {}
        }
    }
    if first {
        agg.first = p.first;
    }
    if last {
        agg.last = p.last;
    }
    agg.ranges.extend(p.ranges);
    for (day, hours) in p.hourly {
        agg.hourly.insert(day, hours);
    }
    for (&b, &n) in &p.hist.counts {
        agg.hist.add_bucket(b, n);
    }
    for (w, wp) in &p.workers {
        if let Some(to) = agg.workers.get_mut(w) {
            for (&b, &n) in &wp.hist.counts {
                to.hist.add_bucket(b, n);
            }
        }
    }
}
