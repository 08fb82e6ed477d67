//! Durations as people write and read them: `30s`, `1500ms`, `5m`, `24h`. The library
//! floor parses them from the environment; the command line reuses the parser for its
//! options and the formatter for its tables. [`now_ms`] is the binary's one "now".

use std::time::Duration;

/// Parses `1500ms`, `30s`, `5m`, `24h` or a bare number of seconds.
pub(crate) fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (try 500ms, 30s, 5m, 24h)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("`{s}` has an unknown unit (use ms, s, m or h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// How long an archiver's unacknowledged inbox entries must sit before another takes
/// them over. `TRANCHE_ARCHIVE_CLAIM_IDLE` shortens it for tests and demos.
pub(crate) fn claim_idle() -> Duration {
    std::env::var("TRANCHE_ARCHIVE_CLAIM_IDLE")
        .ok()
        .and_then(|s| parse(&s).ok())
        .unwrap_or(Duration::from_secs(60))
}

/// A duration in ms, short: `850ms`, `2.00s`, `1.5m`.
pub(crate) fn ms(v: f64) -> String {
    if v >= 60_000.0 {
        format!("{:.1}m", v / 60_000.0)
    } else if v >= 1000.0 {
        format!("{:.2}s", v / 1000.0)
    } else {
        format!("{v:.0}ms")
    }
}

/// Milliseconds since the Unix epoch, by the system clock: the binary's one "now",
/// read from the same [`Clock`](tranche_codec::Clock) the stores take.
pub(crate) fn now_ms() -> u64 {
    use tranche_codec::Clock;
    tranche_codec::SystemClock.now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert!(parse("5 weeks").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("").is_err());
    }
}
