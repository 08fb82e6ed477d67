//! Times as people and JSON read them: milliseconds since the epoch as RFC 3339 or as a
//! UTC wall-clock line, without a date-time dependency.

/// Milliseconds since the epoch as RFC 3339 in UTC: `2026-11-24T19:32:46.053Z`.
pub(crate) fn rfc3339(ms: u64) -> String {
    let (date, clock) = parts(ms);
    format!("{date}T{clock}Z")
}

/// Milliseconds since the epoch as `YYYY-MM-DD hh:mm:ss.mmm UTC`.
pub(crate) fn time(ms: u64) -> String {
    let (date, clock) = parts(ms);
    format!("{date} {clock} UTC")
}

/// `YYYY-MM-DD` and `hh:mm:ss.mmm` of `ms`, in UTC.
fn parts(ms: u64) -> (String, String) {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!(
            "{:02}:{:02}:{:02}.{:03}",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60,
            ms % 1000
        ),
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian, UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
