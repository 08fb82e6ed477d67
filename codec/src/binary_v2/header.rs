//! Headless batches: a sealed batch without the header fields a container that knows
//! its batch id and size can put back (archive segments of layout 2).

use super::{FLAG_ZSTD, MAGIC, VERSION};
use crate::Error;
use crate::wire::{Reader, put_varint};

/// Splits a sealed batch into its batch id, its batch size and the rest of its bytes
/// without the fields a container that knows both can rebuild ("headless"): the magic,
/// the version, the batch id, the batch size and the payload length.
///
/// ```text
/// headless   flags | count | [raw_len, if zstd] | payload | CRC32 (as in the batch)
/// ```
///
/// `None` when `bytes` is not laid out as binary v2 (the checksum is not verified:
/// [`restore_binary_v2_header`] gives back exactly `bytes`, whose decode checks it).
/// Every varint must be canonical, so that the restored bytes are the same.
/// `archive-store`'s `join.lua` does the same in Lua; both must agree.
pub fn strip_binary_v2_header(bytes: &[u8]) -> Option<(u64, u64, Vec<u8>)> {
    let mut r = Reader::new(bytes);
    r.header(MAGIC, VERSION).ok()?;
    let flags = r.u8().ok()?;
    let batch_id = r.varint().ok()?;
    let batch_size = r.varint().ok()?;
    let kept_from = bytes.len() - r.remaining();
    r.varint().ok()?;
    if flags & FLAG_ZSTD != 0 {
        r.varint().ok()?;
    }
    let kept_to = bytes.len() - r.remaining();
    let payload_len = usize::try_from(r.varint().ok()?).ok()?;
    let payload_at = bytes.len() - r.remaining();
    if r.remaining() != payload_len.checked_add(4)? {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    out.push(flags);
    out.extend_from_slice(&bytes[kept_from..kept_to]);
    out.extend_from_slice(&bytes[payload_at..]);
    Some((batch_id, batch_size, out))
}

/// The sealed batch `batch_id` of `batch_size` pids whose headless bytes (see
/// [`strip_binary_v2_header`]) are `headless`: the exact bytes that were stripped.
/// `Err` when `headless` is too short to hold its fields; whether the result decodes
/// (its checksum, its payload) is [`decode_binary_v2`](crate::decode_binary_v2)'s to say.
pub fn restore_binary_v2_header(
    batch_id: u64,
    batch_size: u64,
    headless: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut r = Reader::new(headless);
    let flags = r.u8()?;
    r.varint()?;
    if flags & FLAG_ZSTD != 0 {
        r.varint()?;
    }
    let fields = &headless[1..headless.len() - r.remaining()];
    let payload_len = r.remaining().checked_sub(4).ok_or(Error::Truncated)?;
    let rest = &headless[headless.len() - r.remaining()..];
    let mut out = Vec::with_capacity(headless.len() + 24);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(flags);
    put_varint(&mut out, batch_id);
    put_varint(&mut out, batch_size);
    out.extend_from_slice(fields);
    put_varint(&mut out, payload_len as u64);
    out.extend_from_slice(rest);
    Ok(out)
}
