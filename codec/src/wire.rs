//! Byte-level building blocks of the binary forms: varints, a bounds-checked reader,
//! bit packing, and the adaptive integer column every binary v2 section is made of.

use crate::Error;

/// Appends `v` as an unsigned LEB128 varint (1 to 10 bytes).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes `put_varint` spends on `v`.
#[cfg(test)]
const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Maps signed to unsigned so that small magnitudes stay small: 0, -1, 1, -2 -> 0, 1, 2, 3.
pub(crate) const fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
pub(crate) const fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The zigzagged wrapping difference `a - b`: exact for any pair, since the decoder
/// adds it back with the same wrapping arithmetic.
pub(crate) const fn zigzag_diff(a: u64, b: u64) -> u64 {
    zigzag(a.wrapping_sub(b) as i64)
}

/// Inverse of [`zigzag_diff`]: `b + unzigzag(d)`, wrapping.
pub(crate) const fn add_zigzag(b: u64, d: u64) -> u64 {
    b.wrapping_add(unzigzag(d) as u64)
}

/// Bits needed to write `v` (0 for 0).
pub(crate) const fn bit_len(v: u64) -> u32 {
    64 - v.leading_zeros()
}

/// The low `width` bits set.
pub(crate) const fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1 << width) - 1
    }
}

/// A cursor over untrusted bytes: every read is bounds-checked and fails with
/// [`Error::Truncated`] rather than panicking.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Error> {
        let Some((&b, rest)) = self.buf.split_first() else {
            return Err(Error::Truncated);
        };
        self.buf = rest;
        Ok(b)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let (head, rest) = self.buf.split_at_checked(n).ok_or(Error::Truncated)?;
        self.buf = rest;
        Ok(head)
    }

    /// Reads a format's 4-byte magic and 1-byte version, refusing any other
    /// (`BadMagic`, `UnsupportedVersion`): how every binary format here opens.
    pub(crate) fn header(&mut self, magic: [u8; 4], version: u8) -> Result<(), Error> {
        let found = self.array::<4>()?;
        if found != magic {
            return Err(Error::BadMagic(found));
        }
        let found = self.u8()?;
        if found != version {
            return Err(Error::UnsupportedVersion(found));
        }
        Ok(())
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let (head, rest) = self.buf.split_first_chunk::<N>().ok_or(Error::Truncated)?;
        self.buf = rest;
        Ok(*head)
    }

    /// Reads a canonical varint: at most 10 bytes, no redundant zero high group.
    pub(crate) fn varint(&mut self) -> Result<u64, Error> {
        let mut value = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let group = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                // The tenth byte may only carry bit 63.
                return Err(Error::VarintOverflow);
            }
            value |= group << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err(Error::VarintOverlong);
                }
                return Ok(value);
            }
        }
        // Unreachable: the tenth byte either ended the varint or overflowed.
        Err(Error::VarintOverflow)
    }

    /// A varint that must fit `usize` and be at most `max` (an allocation bound).
    pub(crate) fn len(&mut self, max: usize, what: &'static str) -> Result<usize, Error> {
        let v = self.varint()?;
        usize::try_from(v)
            .ok()
            .filter(|&n| n <= max)
            .ok_or(Error::Corrupt(what))
    }
}

/// Appends `values`, `width` bits each, least significant bit first.
pub(crate) fn pack(out: &mut Vec<u8>, values: impl IntoIterator<Item = u64>, width: u32) {
    if width == 0 {
        return;
    }
    let mut acc: u128 = 0;
    let mut bits = 0u32;
    for v in values {
        acc |= u128::from(v & mask(width)) << bits;
        bits += width;
        if bits >= 64 {
            out.extend_from_slice(&(acc as u64).to_le_bytes());
            acc >>= 64;
            bits -= 64;
        }
    }
    let tail = (acc as u64).to_le_bytes();
    out.extend_from_slice(&tail[..bits.div_ceil(8) as usize]);
}

/// Bytes `pack` spends on `n` values of `width` bits.
pub(crate) fn packed_len(n: usize, width: u32) -> Option<usize> {
    n.checked_mul(width as usize).map(|bits| bits.div_ceil(8))
}

/// Little-endian `u64` at byte `at`, zero-padded past the end of `data`.
#[inline]
fn load_u64(data: &[u8], at: usize) -> u64 {
    let tail = data.get(at..).unwrap_or_default();
    match tail.first_chunk::<8>() {
        Some(chunk) => u64::from_le_bytes(*chunk),
        None => {
            let mut word = [0u8; 8];
            for (w, b) in word.iter_mut().zip(tail) {
                *w = *b;
            }
            u64::from_le_bytes(word)
        }
    }
}

/// Reads value `i` of a packed array of `width`-bit values (`width <= 64`).
#[inline]
fn unpack_at(data: &[u8], width: u32, i: usize) -> u64 {
    let bit = i * width as usize;
    let (at, shift) = (bit / 8, (bit % 8) as u32);
    let lo = load_u64(data, at) >> shift;
    // One word holds shift + width <= 64 bits; wider values spill into a ninth byte.
    let v = if shift + width <= 64 {
        lo
    } else {
        lo | (u64::from(data.get(at + 8).copied().unwrap_or(0)) << (64 - shift))
    };
    v & mask(width)
}

/// Writes `base + value i` of a packed array of `width`-bit values into `out[i]`,
/// for every slot of `out`. The caller has checked that no sum overflows.
fn unpack_into(data: &[u8], width: u32, base: u64, out: &mut [u64]) {
    if width == 0 {
        out.fill(base);
        return;
    }
    if width > 56 {
        // Rare: a value may straddle nine bytes.
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = base + unpack_at(data, width, i);
        }
        return;
    }
    let (w, m) = (width as usize, mask(width));
    // Values whose eight-byte window lies inside `data` need no padding.
    let direct = match data.len().checked_sub(8) {
        Some(last_at) => ((last_at * 8 + 7) / w + 1).min(out.len()),
        None => 0,
    };
    let (head, tail) = out.split_at_mut(direct);
    for (i, slot) in head.iter_mut().enumerate() {
        let bit = i * w;
        let word = data
            .get(bit / 8..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map_or(0, |c| u64::from_le_bytes(*c));
        *slot = base + ((word >> (bit % 8)) & m);
    }
    for (i, slot) in tail.iter_mut().enumerate() {
        let bit = (direct + i) * w;
        *slot = base + ((load_u64(data, bit / 8) >> (bit % 8)) & m);
    }
}

/// An adaptive integer column: frame of reference, bit packing, and patched exceptions.
///
/// Layout: `base` (varint), `width` (one byte, at most 64), exception count (varint),
/// `n` values of `width` bits packed LSB first, then per exception the gap to the
/// previous exception's index and the value's bits above `width` (varints). A value
/// is `base + (low | high << width)`.
///
/// The encoder picks `width` to minimise the size, so a column of equal values costs
/// three bytes, a column of seconds in 200..=400 costs 8 bits a value, and a few
/// outliers (a worker that paused, a first value relative to zero) cost a few bytes
/// each instead of widening every value.
pub(crate) fn put_column(out: &mut Vec<u8>, values: &[u64]) {
    let base = values.iter().copied().min().unwrap_or(0);
    let mut hist = [0usize; 65];
    for &v in values {
        hist[bit_len(v - base) as usize] += 1;
    }
    let width = choose_width(&hist, values.len());
    let exceptions = hist[width as usize + 1..].iter().sum::<usize>();
    put_varint(out, base);
    out.push(width as u8);
    put_varint(out, exceptions as u64);
    pack(out, values.iter().map(|&v| v - base), width);
    let mut last = None;
    for (i, &v) in values.iter().enumerate() {
        let d = v - base;
        if bit_len(d) > width {
            let gap = match last {
                None => i,
                Some(prev) => i - prev - 1,
            };
            put_varint(out, gap as u64);
            put_varint(out, d >> width);
            last = Some(i);
        }
    }
}

/// The width minimising the estimated column size, given how many values need each
/// number of bits.
fn choose_width(hist: &[usize; 65], n: usize) -> u32 {
    let max_bits = hist.iter().rposition(|&c| c > 0).unwrap_or(0) as u32;
    // An exception costs an index gap (about one byte in a small column, two in a
    // large one) plus its high bits as a varint.
    let gap_bits = if n <= 128 { 8 } else { 16 };
    let mut best = (n * max_bits as usize, max_bits);
    for width in 0..max_bits {
        let mut cost = n * width as usize;
        for (bits, &count) in hist.iter().enumerate().skip(width as usize + 1) {
            let high_bits = bits - width as usize;
            cost += count * (gap_bits + 8 * high_bits.div_ceil(7));
        }
        if cost < best.0 {
            best = (cost, width);
        }
    }
    best.1
}

/// Reads a column of exactly `n` values written by [`put_column`] into `out`.
pub(crate) fn get_column(r: &mut Reader<'_>, n: usize, out: &mut Vec<u64>) -> Result<(), Error> {
    let base = r.varint()?;
    let width_byte = r.u8()?;
    if width_byte > 64 {
        return Err(Error::InvalidBitWidth(width_byte));
    }
    let width = u32::from(width_byte);
    let exceptions = r.len(n, "column exception count")?;
    let packed = r.bytes(packed_len(n, width).ok_or(Error::Corrupt("column length"))?)?;

    out.clear();
    out.resize(n, base);
    match base.checked_add(mask(width)) {
        // A constant column (a chain of exact predictions) is the commonest of all.
        _ if width == 0 => {}
        // No packed value can overflow: the common path.
        Some(_) => unpack_into(packed, width, base, out),
        None => {
            for (i, slot) in out.iter_mut().enumerate() {
                let v = base.checked_add(unpack_at(packed, width, i));
                *slot = v.ok_or(Error::Corrupt("column value overflows u64"))?;
            }
        }
    }
    if exceptions > 0 && width == 64 {
        return Err(Error::Corrupt("column exception in a 64-bit column"));
    }
    let mut next = 0usize;
    for _ in 0..exceptions {
        let gap =
            usize::try_from(r.varint()?).map_err(|_| Error::Corrupt("column exception index"))?;
        let i = next
            .checked_add(gap)
            .filter(|&i| i < n)
            .ok_or(Error::Corrupt("column exception index"))?;
        let high = r.varint()?;
        // A zero high part would not be an exception, and bits shifted past 64 would be lost.
        if high == 0 || bit_len(high) > 64 - width {
            return Err(Error::Corrupt("column exception value"));
        }
        let low = unpack_at(packed, width, i);
        let v = base
            .checked_add(low | (high << width))
            .ok_or(Error::Corrupt("column value overflows u64"))?;
        out[i] = v;
        next = i + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v));
            let mut r = Reader::new(&buf);
            assert_eq!(r.varint().ok(), Some(v));
            assert_eq!(r.remaining(), 0);
        }
        let check = |bytes: &[u8], expect: &str| {
            assert_eq!(
                format!("{:?}", Reader::new(bytes).varint()),
                expect,
                "{bytes:02x?}"
            );
        };
        check(&[], "Err(Truncated)");
        check(&[0x80], "Err(Truncated)");
        check(&[0x80, 0x00], "Err(VarintOverlong)");
        check(&[0xff, 0x80, 0x00], "Err(VarintOverlong)");
        check(
            &[0xff; 9].iter().copied().chain([0x01]).collect::<Vec<_>>(),
            "Ok(18446744073709551615)",
        );
        check(
            &[0xff; 9].iter().copied().chain([0x02]).collect::<Vec<_>>(),
            "Err(VarintOverflow)",
        );
        check(&[0x80; 11], "Err(VarintOverflow)");
    }

    #[test]
    fn zigzags() {
        for v in [0i64, -1, 1, -2, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        for (a, b) in [(0u64, u64::MAX), (u64::MAX, 0), (5, 7), (7, 5)] {
            assert_eq!(add_zigzag(b, zigzag_diff(a, b)), a);
        }
    }

    #[test]
    fn columns_round_trip_and_stay_small() {
        let cases: Vec<(Vec<u64>, usize)> = vec![
            (vec![], 3),
            (vec![7; 1000], 3),
            ((0..1000).map(|i| 200 + i % 201).collect(), 4 + 1000),
            // One outlier becomes an exception instead of widening every value.
            (
                (0..1000)
                    .map(|i| if i == 500 { 1 << 40 } else { i % 2 })
                    .collect(),
                4 + 125 + 8,
            ),
            (vec![0, u64::MAX, 1, u64::MAX - 1], 4 + 32),
            (vec![u64::MAX; 3], 12),
        ];
        for (values, max_len) in cases {
            let mut buf = Vec::new();
            put_column(&mut buf, &values);
            assert!(buf.len() <= max_len, "{} > {max_len} bytes", buf.len());
            let mut out = Vec::new();
            let mut r = Reader::new(&buf);
            get_column(&mut r, values.len(), &mut out).expect("decodes");
            assert_eq!(out, values);
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn pack_unpack_every_width() {
        for width in 0..=64 {
            let values: Vec<u64> = (0..37u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) & mask(width).min(u64::MAX - 3))
                .collect();
            let mut buf = Vec::new();
            pack(&mut buf, values.iter().copied(), width);
            assert_eq!(Some(buf.len()), packed_len(values.len(), width));
            for (i, &v) in values.iter().enumerate() {
                assert_eq!(unpack_at(&buf, width, i), v, "width {width} index {i}");
            }
            // Every prefix, so the split between direct and padded loads moves around.
            for n in 0..=values.len() {
                let mut out = vec![0; n];
                unpack_into(
                    &buf[..packed_len(n, width).unwrap_or(0)],
                    width,
                    3,
                    &mut out,
                );
                let expect: Vec<u64> = values[..n].iter().map(|v| v + 3).collect();
                assert_eq!(out, expect, "width {width} n {n}");
            }
        }
    }
}
