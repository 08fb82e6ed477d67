//! Milliseconds printed as the seed's seconds, and read back exactly.
//!
//! The seed's JSON and text show whole seconds (`1719234405`). tranche keeps
//! milliseconds, so a time with a millisecond part prints as seconds with up to three
//! decimals and no trailing zeros (`1719234405.12`). Whole-second data is therefore
//! byte-for-byte the seed's format, and nothing is ever rounded.

use std::fmt::Write;

/// Why a seconds text does not denote a `u64` of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SecondsError {
    /// Well formed, but finer than a millisecond.
    Inexact,
    /// Not a number, negative, or beyond `u64::MAX` milliseconds.
    Invalid,
}

/// Appends `ms` as seconds: `1719234405`, `1719234405.12`, `0.005`.
pub(crate) fn write_seconds(out: &mut String, ms: u64) {
    let (secs, frac) = (ms / 1000, ms % 1000);
    // Writing to a String cannot fail.
    let _ = write!(out, "{secs}");
    if frac != 0 {
        let mut digits = [
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ];
        let mut len = 3;
        while digits[len - 1] == b'0' {
            len -= 1;
        }
        out.push('.');
        for d in &mut digits[..len] {
            out.push(char::from(*d));
        }
    }
}

/// Reads the canonical form [`write_seconds`] produces, and nothing else: no sign, no
/// leading zero, one to three decimals without a trailing zero. Text v1 is only ever
/// written by tranche, so accepting a single spelling keeps decode-then-encode exact.
pub(crate) fn parse_canonical_seconds(text: &str) -> Result<u64, SecondsError> {
    let (int, frac) = match text.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (text, None),
    };
    let secs = parse_canonical_u64(int).ok_or(SecondsError::Invalid)?;
    let frac_ms = match frac {
        None => 0,
        Some(frac) => {
            if frac.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return Err(SecondsError::Invalid);
            }
            if frac.len() > 3 {
                return Err(if frac.bytes().skip(3).all(|b| b == b'0') {
                    SecondsError::Invalid // exact, but a trailing zero is not canonical
                } else {
                    SecondsError::Inexact
                });
            }
            if frac.ends_with('0') {
                return Err(SecondsError::Invalid);
            }
            let digits = frac
                .bytes()
                .fold(0u64, |acc, b| acc * 10 + u64::from(b - b'0'));
            digits * 10u64.pow(3 - frac.len() as u32)
        }
    };
    secs.checked_mul(1000)
        .and_then(|ms| ms.checked_add(frac_ms))
        .ok_or(SecondsError::Invalid)
}

/// Reads any JSON number that denotes a whole number of milliseconds when taken as
/// seconds: `1719234405`, `1719234405.120`, `1.719234405e9`. Other producers of the
/// seed's JSON may spell numbers differently; exactness is what matters.
pub(crate) fn parse_json_seconds(text: &str) -> Result<u64, SecondsError> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let take_digits = |i: &mut usize| {
        let start = *i;
        while bytes.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        &bytes[start..*i]
    };
    let int = take_digits(&mut i);
    // JSON forbids leading zeros; serde_json already enforced the rest of the grammar,
    // but this function does not rely on it.
    if int.is_empty() || (int.len() > 1 && int[0] == b'0') {
        return Err(SecondsError::Invalid);
    }
    let mut frac: &[u8] = &[];
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        frac = take_digits(&mut i);
        if frac.is_empty() {
            return Err(SecondsError::Invalid);
        }
    }
    let mut exp: i64 = 0;
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        let negative = match bytes.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let digits = take_digits(&mut i);
        if digits.is_empty() {
            return Err(SecondsError::Invalid);
        }
        // Clamped: any exponent this large is out of range or inexact either way.
        let magnitude = digits
            .iter()
            .fold(0i64, |acc, d| (acc * 10 + i64::from(d - b'0')).min(1 << 20));
        exp = if negative { -magnitude } else { magnitude };
    }
    if i != bytes.len() {
        return Err(SecondsError::Invalid);
    }

    // value = digits * 10^scale milliseconds, with digits = int ++ frac.
    let mut scale = exp + 3 - frac.len() as i64;
    let all = int.iter().chain(frac).copied();
    let mut digits: Vec<u8> = all.skip_while(|&d| d == b'0').collect();
    while digits.last() == Some(&b'0') {
        digits.pop();
        scale += 1;
    }
    if digits.is_empty() {
        return Ok(0);
    }
    if scale < 0 {
        // The last digit is non-zero and lies below a millisecond.
        return Err(SecondsError::Inexact);
    }
    // The value is at least 10^(len - 1 + scale) ms, and u64::MAX < 10^20.
    if digits.len() as i64 + scale > 20 {
        return Err(SecondsError::Invalid);
    }
    let mantissa = digits
        .iter()
        .fold(0u128, |acc, d| acc * 10 + u128::from(d - b'0'));
    let ms = mantissa * 10u128.pow(scale as u32);
    u64::try_from(ms).map_err(|_| SecondsError::Invalid)
}

/// Reads a decimal `u64` with no sign and no leading zero.
pub(crate) fn parse_canonical_u64(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    let canonical = match bytes {
        [] => false,
        [b'0'] => true,
        [first, ..] => *first != b'0',
    };
    if !canonical || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // `parse` accepts a leading `+`, excluded above; it catches overflow.
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(ms: u64) -> String {
        let mut s = String::new();
        write_seconds(&mut s, ms);
        s
    }

    #[test]
    fn writes_seconds() {
        for (ms, text) in [
            (0, "0"),
            (5, "0.005"),
            (1_719_234_405_000, "1719234405"),
            (1_719_234_405_120, "1719234405.12"),
            (1_719_234_405_100, "1719234405.1"),
            (1_719_234_405_001, "1719234405.001"),
            (u64::MAX, "18446744073709551.615"),
        ] {
            assert_eq!(show(ms), text);
            assert_eq!(parse_canonical_seconds(text), Ok(ms), "{text}");
            assert_eq!(parse_json_seconds(text), Ok(ms), "{text}");
        }
    }

    #[test]
    fn canonical_seconds_reject_other_spellings() {
        use SecondsError::*;
        for (text, expect) in [
            ("", Invalid),
            ("01", Invalid),
            ("+1", Invalid),
            ("-1", Invalid),
            ("1.", Invalid),
            (".5", Invalid),
            ("1.50", Invalid),
            ("1.5000", Invalid),
            ("1.0001", Inexact),
            ("1e3", Invalid),
            ("18446744073709551.616", Invalid),
            ("18446744073709552", Invalid),
        ] {
            assert_eq!(parse_canonical_seconds(text), Err(expect), "{text}");
        }
    }

    #[test]
    fn json_seconds_accept_any_exact_spelling() {
        for (text, expect) in [
            ("1719234405.120", Ok(1_719_234_405_120)),
            ("1.719234405e9", Ok(1_719_234_405_000)),
            ("1.7192344051E+9", Ok(1_719_234_405_100)),
            ("17192344051e-1", Ok(1_719_234_405_100)),
            ("0.0000", Ok(0)),
            ("0e999999999999", Ok(0)),
            ("5e-3", Ok(5)),
            ("5e-4", Err(SecondsError::Inexact)),
            ("1719234405.1234", Err(SecondsError::Inexact)),
            ("1e17", Err(SecondsError::Invalid)),
            ("-0", Err(SecondsError::Invalid)),
            ("-1", Err(SecondsError::Invalid)),
            ("01", Err(SecondsError::Invalid)),
            ("\"1\"", Err(SecondsError::Invalid)),
            ("null", Err(SecondsError::Invalid)),
            ("1e", Err(SecondsError::Invalid)),
        ] {
            assert_eq!(parse_json_seconds(text), expect, "{text}");
        }
    }
}
