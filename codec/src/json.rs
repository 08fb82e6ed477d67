//! The seed's simple-archive JSON, one object per completed partition.

use std::fmt::Write;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::seconds::{SecondsError, parse_json_seconds, write_seconds};
use crate::{CompletedRecord, Error};

/// Encodes `record` as the seed's JSON, fields in the seed's order:
/// `{"pid":4970,"min_id":4969001,"max_id":4970000,"worker_id":"worker1","completed_at":1719234405,"duration":295}`.
///
/// `completed_at` and `duration` are seconds; a millisecond part is written as up to
/// three decimals (`1719234405.12`), so whole-second records match the seed byte for
/// byte and no record loses precision. The worker is the full id: JSON needs no
/// dictionary. Encoding cannot fail.
pub fn encode_json(record: &CompletedRecord) -> String {
    let mut out = String::with_capacity(128 + record.worker.len());
    let CompletedRecord {
        pid,
        min_id,
        max_id,
        ..
    } = record;
    // Neither writing to a String nor serializing a str can fail.
    let _ = write!(
        out,
        r#"{{"pid":{pid},"min_id":{min_id},"max_id":{max_id},"worker_id":"#
    );
    out.push_str(&serde_json::to_string(&*record.worker).unwrap_or_default());
    out.push_str(",\"completed_at\":");
    write_seconds(&mut out, record.completed_at_ms);
    out.push_str(",\"duration\":");
    write_seconds(&mut out, record.duration_ms);
    out.push('}');
    out
}

/// The seed's object as it arrives; the two times are kept as their exact text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw<'a> {
    pid: u64,
    min_id: u64,
    max_id: u64,
    worker_id: String,
    #[serde(borrow)]
    completed_at: &'a RawValue,
    #[serde(borrow)]
    duration: &'a RawValue,
}

/// Decodes one record of the seed's JSON.
///
/// Fields may come in any order, but every field must be present exactly once and no
/// other may appear. The times may be spelt any way JSON allows (`295`, `295.000`,
/// `2.95e2`) as long as they denote whole milliseconds: `1719234405.1234` is an
/// [`Error::InexactTime`], never silently rounded.
pub fn decode_json(input: &str) -> Result<CompletedRecord, Error> {
    let raw: Raw<'_> = serde_json::from_str(input)?;
    Ok(CompletedRecord {
        pid: raw.pid,
        min_id: raw.min_id,
        max_id: raw.max_id,
        worker: raw.worker_id.into(),
        completed_at_ms: millis("completed_at", raw.completed_at)?,
        duration_ms: millis("duration", raw.duration)?,
    })
}

fn millis(field: &'static str, raw: &RawValue) -> Result<u64, Error> {
    let text = raw.get();
    parse_json_seconds(text).map_err(|e| {
        let text = text.to_owned();
        match e {
            SecondsError::Inexact => Error::InexactTime { field, text },
            SecondsError::Invalid => Error::InvalidTime { field, text },
        }
    })
}
