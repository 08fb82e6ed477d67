//! Active hours: `--active-hours 22:00-06:00 --tz Europe/Paris`.

use jiff::civil::Time;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::Error;

/// A daily window of local time outside which workers claim nothing. `start` is
/// inclusive and `end` exclusive; a window whose end is before its start wraps midnight.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveHours {
    /// Minutes after local midnight.
    start: u16,
    end: u16,
    /// The IANA zone name as given; `None` is the system's zone.
    tz_name: Option<String>,
    tz: TimeZone,
}

impl ActiveHours {
    /// Parses `HH:MM-HH:MM` in the zone `tz` (an IANA name; the system's when `None`).
    pub fn parse(spec: &str, tz: Option<&str>) -> Result<Self, Error> {
        let bad = |why: &str| Error::invalid("active hours", format!("{spec:?}: {why}"));
        let minute = |hhmm: &str| -> Option<u16> {
            let (h, m) = hhmm.split_once(':')?;
            if h.len() != 2 || m.len() != 2 {
                return None;
            }
            let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
            (h < 24 && m < 60).then_some(h * 60 + m)
        };
        let (a, b) = spec.split_once('-').ok_or_else(|| bad("not HH:MM-HH:MM"))?;
        let (start, end) = match (minute(a), minute(b)) {
            (Some(s), Some(e)) => (s, e),
            _ => return Err(bad("not HH:MM-HH:MM (00:00 to 23:59)")),
        };
        if start == end {
            return Err(bad("an empty window (start equals end)"));
        }
        let zone = match tz {
            Some(name) => TimeZone::get(name)
                .map_err(|e| Error::invalid("time zone", format!("{name:?}: {e}")))?,
            None => TimeZone::system(),
        };
        Ok(Self {
            start,
            end,
            tz_name: tz.map(str::to_owned),
            tz: zone,
        })
    }

    /// The window as given, `HH:MM-HH:MM`.
    pub fn spec(&self) -> String {
        format!(
            "{:02}:{:02}-{:02}:{:02}",
            self.start / 60,
            self.start % 60,
            self.end / 60,
            self.end % 60
        )
    }

    /// The zone name, if one was given.
    pub fn tz(&self) -> Option<&str> {
        self.tz_name.as_deref()
    }

    fn local_minute(&self, now_ms: u64) -> u16 {
        let ts = Timestamp::from_millisecond(now_ms as i64).unwrap_or(Timestamp::UNIX_EPOCH);
        let t = ts.to_zoned_datetime(self.tz.clone()).time();
        t.hour() as u16 * 60 + t.minute() as u16
    }

    /// Whether `now_ms` (ms since the epoch) is inside the window.
    pub fn is_active(&self, now_ms: u64) -> bool {
        let m = self.local_minute(now_ms);
        if self.start < self.end {
            (self.start..self.end).contains(&m)
        } else {
            m >= self.start || m < self.end
        }
    }

    /// The first instant after `now_ms` at which [`ActiveHours::is_active`] changes (ms
    /// since the epoch). Local times that a DST change skips resolve to the instant after
    /// the gap.
    pub fn next_change(&self, now_ms: u64) -> u64 {
        let ts = Timestamp::from_millisecond(now_ms as i64).unwrap_or(Timestamp::UNIX_EPOCH);
        let today = ts.to_zoned_datetime(self.tz.clone()).date();
        let boundary = if self.is_active(now_ms) {
            self.end
        } else {
            self.start
        };
        let time = Time::new((boundary / 60) as i8, (boundary % 60) as i8, 0, 0)
            .expect("a checked minute of the day");
        (-1..=2i64)
            .filter_map(|days| {
                let date = today.checked_add(days.days()).ok()?;
                let zoned = date
                    .to_datetime(time)
                    .to_zoned_datetime(self.tz.clone())
                    .ok()?;
                u64::try_from(zoned.timestamp().as_millisecond()).ok()
            })
            .filter(|&at| at > now_ms)
            .min()
            .unwrap_or(now_ms + 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-15T00:00:00Z.
    const MIDNIGHT_UTC: u64 = 1_768_435_200_000;
    const H: u64 = 3_600_000;

    #[test]
    fn a_window_wrapping_midnight() {
        let w = ActiveHours::parse("22:00-06:00", Some("UTC")).unwrap();
        let check = |at: u64, active: bool, next: u64| {
            assert_eq!(w.is_active(at), active, "at +{}h", (at - MIDNIGHT_UTC) / H);
            assert_eq!(
                w.next_change(at),
                next,
                "next after +{}h",
                (at - MIDNIGHT_UTC) / H
            );
        };
        check(MIDNIGHT_UTC, true, MIDNIGHT_UTC + 6 * H);
        check(MIDNIGHT_UTC + 6 * H - 1, true, MIDNIGHT_UTC + 6 * H);
        check(MIDNIGHT_UTC + 6 * H, false, MIDNIGHT_UTC + 22 * H);
        check(MIDNIGHT_UTC + 12 * H, false, MIDNIGHT_UTC + 22 * H);
        check(MIDNIGHT_UTC + 22 * H, true, MIDNIGHT_UTC + 30 * H);
    }

    #[test]
    fn a_window_within_a_day_in_a_zone() {
        // Paris is UTC+1 in January: 09:00-17:00 local is 08:00-16:00 UTC.
        let w = ActiveHours::parse("09:00-17:00", Some("Europe/Paris")).unwrap();
        assert!(!w.is_active(MIDNIGHT_UTC + 8 * H - 1));
        assert!(w.is_active(MIDNIGHT_UTC + 8 * H));
        assert_eq!(w.next_change(MIDNIGHT_UTC), MIDNIGHT_UTC + 8 * H);
        assert_eq!(w.next_change(MIDNIGHT_UTC + 9 * H), MIDNIGHT_UTC + 16 * H);
        assert!(!w.is_active(MIDNIGHT_UTC + 16 * H));
        assert_eq!(w.spec(), "09:00-17:00");
        assert_eq!(w.tz(), Some("Europe/Paris"));
    }

    #[test]
    fn bad_windows_are_refused() {
        for bad in [
            "",
            "22:00",
            "24:00-06:00",
            "22:60-06:00",
            "9:00-17:00",
            "10:00-10:00",
        ] {
            assert!(ActiveHours::parse(bad, Some("UTC")).is_err(), "{bad}");
        }
        assert!(ActiveHours::parse("22:00-06:00", Some("Mars/Olympus")).is_err());
    }
}
