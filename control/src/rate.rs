//! A rate: units per second, as `--max-rate 500/s` spells it.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A number of units per second in [[`Rate::MIN`], [`Rate::MAX`]].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Rate {
    /// The largest rate the limiter scripts accept.
    pub const MAX: f64 = 1e12;
    /// The smallest rate: one unit per 10 000 s (2.8 h). A smaller one would put a
    /// reservation of 10¹² units beyond what a clock can hold (`1e-300` made the
    /// embedded limiter panic turning `units / rate` into a `Duration`).
    pub const MIN: f64 = 1e-4;

    /// `per_second` units per second, if in [[`Rate::MIN`], [`Rate::MAX`]].
    pub fn per_second(per_second: f64) -> Result<Self, Error> {
        if Self::allowed(per_second) {
            Ok(Rate(per_second))
        } else if per_second.is_finite() && per_second > 0.0 && per_second < Self::MIN {
            Err(Error::invalid(
                "rate",
                format!(
                    "{per_second}/s is below the smallest rate, {}/s (one unit per 2.8 h)",
                    Self::MIN
                ),
            ))
        } else if per_second.is_finite() && per_second > Self::MAX {
            Err(Error::invalid(
                "rate",
                format!("{per_second}/s is above the largest rate, 1e12/s"),
            ))
        } else {
            Err(Error::invalid(
                "rate",
                format!("{per_second} is not a positive number per second"),
            ))
        }
    }

    /// Whether `per_second` is a rate (the check `lua/set.lua` and `lua/take.lua` make).
    pub fn allowed(per_second: f64) -> bool {
        per_second.is_finite() && (Self::MIN..=Self::MAX).contains(&per_second)
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
        for bad in [
            "", "0/s", "-1", "5/d", "x/s", "inf", "NaN", "2e12", "1e-300", "1e-5", "1/d",
        ] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
        assert_eq!("1/h".parse::<Rate>().unwrap().get(), 1.0 / 3600.0);
        let tiny = Rate::per_second(1e-300).unwrap_err().to_string();
        assert!(tiny.contains("below the smallest rate"), "{tiny}");
        let huge = Rate::per_second(1e13).unwrap_err().to_string();
        assert!(huge.contains("above the largest rate"), "{huge}");
    }
}
