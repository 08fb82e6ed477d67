//! The gate's rules, pure functions of a control record and the time: which AIMD
//! steps wait, the ID rate in force, why claims wait, the first chunk size of a
//! partition sized by time. `status`, `serve` and the dashboard read the record through
//! the same ones.

use std::time::Duration;

use tranche_control::{ActiveHours, ControlRecord, ProbeStale, Rate};

use super::ChunkTime;

/// Whether `next` is only a small AIMD increase over `current` (under a tenth, and
/// below the ceiling), which is not applied yet: a pacer drops what is left of its
/// reservation when the rate changes, and the AIMD rate rises a little every probe, so
/// applying each step would waste a batch per second. Decreases apply at once.
pub(super) fn aimd_step(
    record: &ControlRecord,
    current: Option<Rate>,
    next: Option<Rate>,
    own: Option<Rate>,
) -> bool {
    let (Some(current), Some(next)) = (current, next) else {
        return false;
    };
    let ceiling = record
        .settings
        .max_rate
        .and_then(|r| Rate::per_second(r).ok())
        .or(own);
    record.settings.keep_below.is_some()
        && next > current
        && next.get() < current.get() * 1.1
        && ceiling.is_none_or(|c| next < c)
}

/// The ID rate in force at `now_ms` ([`ControlRecord::ids_rate`] over `own`), but an
/// AIMD rate nobody renewed for `stale` (its prober stopped, or a past run's) is
/// ignored like a stale probe throttle: the ceiling is in force again.
pub(crate) fn ids_rate_as_of(
    r: &ControlRecord,
    own: Option<Rate>,
    now_ms: u64,
    stale: Duration,
) -> Option<Rate> {
    let fresh = r
        .probe
        .as_ref()
        .is_some_and(|p| u128::from(now_ms.saturating_sub(p.at_ms)) <= stale.as_millis());
    if fresh {
        r.ids_rate(own)
    } else {
        ControlRecord {
            probe: None,
            ..r.clone()
        }
        .ids_rate(own)
    }
}

/// Why claims and chunk starts wait at `now_ms`, if they do: a throttle in force (the
/// manual one, any live prober's, or a stale finding unless `stale` is
/// [`ProbeStale::Go`]), or the time outside the active hours (the record's, else the
/// worker's own).
pub(crate) fn closed_reason(
    record: &ControlRecord,
    own_hours: Option<&ActiveHours>,
    now_ms: u64,
    stale: ProbeStale,
) -> Option<String> {
    if let Some(t) = record.throttle_in_force(now_ms, stale) {
        return Some(format!(
            "throttled since {}: {}",
            time(t.since_ms),
            t.reason
        ));
    }
    let hours = record.active_hours().or_else(|| own_hours.cloned())?;
    if hours.is_active(now_ms) {
        return None;
    }
    Some(format!(
        "outside active hours {}{} until {}",
        hours.spec(),
        hours.tz().map(|z| format!(" ({z})")).unwrap_or_default(),
        time(hours.next_change(now_ms))
    ))
}

/// A time stamp (ms since the epoch) as RFC 3339 UTC, to the second.
pub(crate) fn time(ms: u64) -> String {
    jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| ms.to_string())
}

/// The first chunk size of a partition sized by `t`: what the worker learned under the
/// same `t`, else `chunk` (`--chunk`, or `set --chunk`).
pub(super) fn first_size(t: ChunkTime, learned: Option<(ChunkTime, u64)>, chunk: u64) -> u64 {
    match learned {
        Some((under, size)) if under == t => size,
        _ => chunk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tranche_control::{ManualThrottle, ProbeState, Settings, Throttled};

    fn rate(r: f64) -> Rate {
        Rate::per_second(r).unwrap()
    }

    fn aimd_record(at_ms: u64) -> ControlRecord {
        ControlRecord {
            settings: Settings {
                keep_below: Some(10.0),
                ..Settings::default()
            },
            probe: Some(ProbeState {
                rate: Some(100.0),
                at_ms,
                ..ProbeState::default()
            }),
            ..ControlRecord::default()
        }
    }

    #[test]
    fn a_partition_sized_by_time_starts_where_the_last_one_got_to() {
        let t = ChunkTime {
            target: Duration::from_millis(200),
            min: 50,
            max: 50_000,
        };
        assert_eq!(first_size(t, None, 100), 100);
        assert_eq!(first_size(t, Some((t, 4_000)), 100), 4_000);
        // Learned under another target (`set --chunk-time`): `--chunk` again.
        let other = ChunkTime {
            target: Duration::from_secs(1),
            ..t
        };
        assert_eq!(first_size(other, Some((t, 4_000)), 100), 100);
    }

    #[test]
    fn a_stale_aimd_rate_gives_way_to_the_ceiling() {
        let stale = Duration::from_secs(30);
        let r = aimd_record(1_000_000);
        let own = Some(rate(1000.0));
        assert_eq!(ids_rate_as_of(&r, own, 1_010_000, stale), Some(rate(100.0)));
        assert_eq!(
            ids_rate_as_of(&r, own, 1_031_000, stale),
            Some(rate(1000.0))
        );
    }

    #[test]
    fn small_aimd_increases_wait_decreases_do_not() {
        let r = aimd_record(0);
        let own = Some(rate(1000.0));
        let step = |from: f64, to: f64| aimd_step(&r, Some(rate(from)), Some(rate(to)), own);
        assert!(step(100.0, 105.0), "under a tenth: held back");
        assert!(!step(100.0, 111.0), "a tenth or more applies");
        assert!(!step(100.0, 70.0), "a decrease applies at once");
        assert!(!step(995.0, 1000.0), "the ceiling applies");
        let plain = ControlRecord::default();
        assert!(!aimd_step(
            &plain,
            Some(rate(100.0)),
            Some(rate(105.0)),
            own
        ));
    }

    #[test]
    fn the_gate_closes_for_a_throttle_then_for_the_hours() {
        let stale = ProbeStale::Go;
        let mut r = ControlRecord {
            manual: Some(ManualThrottle {
                reason: "vacuum".into(),
                since_ms: 0,
                origin: "me".into(),
            }),
            ..ControlRecord::default()
        };
        let why = closed_reason(&r, None, 60_000, stale).unwrap();
        assert_eq!(why, "throttled since 1970-01-01T00:00:00Z: vacuum");
        r.manual = None;
        r.probe = Some(ProbeState {
            throttled: Some(Throttled {
                reason: "lag".into(),
                since_ms: 0,
            }),
            at_ms: 0,
            ..ProbeState::default()
        });
        assert!(closed_reason(&r, None, 10_000, stale).is_some());
        assert_eq!(
            closed_reason(&r, None, 31_000, stale),
            None,
            "stale, --probe-stale go"
        );
        let held = closed_reason(&r, None, 31_000, ProbeStale::Throttle).unwrap();
        assert!(
            held.contains("no prober renewed"),
            "stale fails closed: {held}"
        );
        // 00:01 UTC is outside 02:00-03:00.
        let hours = ActiveHours::parse("02:00-03:00", Some("UTC")).unwrap();
        r.probe = None;
        let why = closed_reason(&r, Some(&hours), 31_000, stale).unwrap();
        assert_eq!(
            why,
            "outside active hours 02:00-03:00 (UTC) until 1970-01-01T02:00:00Z"
        );
        assert_eq!(closed_reason(&r, Some(&hours), 7_200_000, stale), None);
    }
}
