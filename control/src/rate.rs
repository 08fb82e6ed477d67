//! A rate: units per second, as `--max-rate 500/s` spells it.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A positive, finite number of units per second, at most 10¹².
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Rate {
    /// The largest rate the limiter scripts accept.
    pub const MAX: f64 = 1e12;

    /// `per_second` units per second, if positive, finite and at most [`Rate::MAX`].
    pub fn per_second(per_second: f64) -> Result<Self, Error> {
        if per_second.is_finite() && per_second > 0.0 && per_second <= Self::MAX {
            Ok(Rate(per_second))
        } else {
            Err(Error::invalid(
                "rate",
                format!("{per_second} is not in (0, 1e12] per second"),
            ))
        }
    }

    /// Units per second.
    pub fn get(self) -> f64 {
        self.0
    }

    /// Seconds between two units.
    pub fn interval_secs(self) -> f64 {
        1.0 / self.0
    }
}

impl FromStr for Rate {
    type Err = Error;

    /// `500`, `500/s`, `30000/m`, `1e6/h` (per second, minute or hour).
    fn from_str(s: &str) -> Result<Self, Error> {
        let (number, per) = match s.trim().split_once('/') {
            Some((n, unit)) => (n, unit.trim()),
            None => (s.trim(), "s"),
        };
        let seconds = match per {
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            other => return Err(Error::invalid("rate", format!("unknown unit /{other}"))),
        };
        let n: f64 = number
            .trim()
            .parse()
            .map_err(|_| Error::invalid("rate", format!("{s:?} is not N/s")))?;
        Rate::per_second(n / seconds)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_and_without_a_unit() {
        for (text, want) in [
            ("500", 500.0),
            ("500/s", 500.0),
            ("120/m", 2.0),
            ("7200/h", 2.0),
        ] {
            assert_eq!(text.parse::<Rate>().unwrap().get(), want, "{text}");
        }
        for bad in ["", "0/s", "-1", "5/d", "x/s", "inf", "NaN", "2e12"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }
}
