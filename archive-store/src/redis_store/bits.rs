//! Reading many bits of one bitmap: the bytes around them, one `GETRANGE` per cluster of
//! nearby offsets, all in one round trip.
//!
//! An archiving pass checks the completed-index bit of every record it read (thousands,
//! mostly of consecutive pids): one `BITFIELD_RO` of a `GET u1` each cost Redis a
//! parsed operation per bit, a few percent of the whole pipeline's server time, where
//! the few hundred bytes that hold them cost one copy.

use redis::aio::ConnectionLike;
use tranche_codec::retry::retry;

use crate::Result;

/// Offsets whose bytes are at most this far apart share one read: a byte read for
/// nothing costs far less than a command.
const GAP_BYTES: u64 = 64;

/// The byte spans to read for `offsets` (sorted, distinct): each `(first byte, last
/// byte)` inclusive, in order, every offset's byte in exactly one.
fn spans(offsets: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &o in offsets {
        let byte = o / 8;
        match out.last_mut() {
            Some((_, last)) if byte <= *last + GAP_BYTES => *last = (*last).max(byte),
            _ => out.push((byte, byte)),
        }
    }
    out
}

/// The bits at `offsets` (any order, repeats allowed) of the bitmap `key`, in that
/// order. Bits past the string's end, or of a missing key, read as clear, as Redis reads
/// them; a key of another type is Redis's `WRONGTYPE` error.
pub(super) async fn read_bits<C>(conn: &C, key: &str, offsets: &[u64]) -> Result<Vec<bool>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if offsets.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted = offsets.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let spans = spans(&sorted);
    let bytes: Vec<Vec<u8>> = retry(conn, |mut c| {
        let mut pipe = redis::pipe();
        for &(first, last) in &spans {
            pipe.cmd("GETRANGE").arg(key).arg(first).arg(last);
        }
        async move { pipe.query_async(&mut c).await }
    })
    .await?;
    Ok(offsets
        .iter()
        .map(|&o| {
            let byte = o / 8;
            // The span holding `byte`: the last one starting at or before it.
            let at = spans.partition_point(|&(first, _)| first <= byte) - 1;
            let got = &bytes[at];
            let b = got.get((byte - spans[at].0) as usize).copied().unwrap_or(0);
            // Bit 0 of a Redis bitmap is the most significant bit of its first byte.
            b & (0x80 >> (o % 8)) != 0
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_every_offset_once_and_merge_near_ones() {
        assert_eq!(spans(&[0, 7, 8, 100 * 8]), vec![(0, 1), (100, 100)]);
        assert_eq!(spans(&[0, 64 * 8 + 7]), vec![(0, 64)]);
        assert_eq!(spans(&[0, 65 * 8]), vec![(0, 0), (65, 65)]);
        assert_eq!(
            spans(&[u64::from(u32::MAX)]),
            vec![(536_870_911, 536_870_911)]
        );
    }

    /// Against a real bitmap: random bits set with SETBIT, every offset read back as
    /// GETBIT answers it, near ones and far ones, past the end, repeated, unsorted.
    #[tokio::test]
    async fn bits_read_back_as_getbit_answers() {
        use rand::{Rng, SeedableRng};
        let server = tranche_testkit::TestRedis::start();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut set = Vec::new();
        for _ in 0..300 {
            let o = if rng.random_bool(0.8) {
                rng.random_range(0..20_000u64)
            } else {
                rng.random_range(0..4_000_000u64)
            };
            let _: () = server.query(redis::cmd("SETBIT").arg("b").arg(o).arg(1));
            set.push(o);
        }
        let mut offsets: Vec<u64> = (0..2_000).map(|_| rng.random_range(0..20_000)).collect();
        offsets.extend(&set);
        offsets.extend([4_000_000_000, set[0], 0, set[1]]);
        let got = read_bits(&conn, "b", &offsets).await.unwrap();
        for (&o, &bit) in offsets.iter().zip(&got) {
            let want: u8 = server.query(redis::cmd("GETBIT").arg("b").arg(o));
            assert_eq!(bit, want == 1, "offset {o}");
        }
        assert!(got.iter().filter(|&&b| b).count() >= set.len());
        assert_eq!(
            read_bits(&conn, "none", &[5, 9]).await.unwrap(),
            [false, false]
        );
        let _: () = server.query(redis::cmd("HSET").arg("h").arg("f").arg("v"));
        assert!(read_bits(&conn, "h", &[1]).await.is_err());
    }
}
