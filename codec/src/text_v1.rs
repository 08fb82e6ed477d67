//! The seed's compressed text: `P{pid}:{min_id}-{max_id}:{worker}:{time}:{duration}`,
//! comma-joined per batch.

use std::fmt::Write;

use crate::seconds::{SecondsError, parse_canonical_seconds, parse_canonical_u64, write_seconds};
use crate::{CompletedRecord, Error, WorkerDict};

/// Encodes `records`, in the order given, as the seed's text:
/// `P4970:4969001-4970000:w1:1719234405:295,P4971:4970001-4971000:w2:1719234410:300`.
///
/// The worker is written as its short code from `dict`; a worker the dictionary does
/// not hold is an [`Error::UnknownWorker`] (insert it first). Times are seconds with a
/// millisecond part written as up to three decimals, as in [`encode_json`](crate::encode_json).
/// An empty batch is the empty string.
pub fn encode_text_v1(records: &[CompletedRecord], dict: &WorkerDict) -> Result<String, Error> {
    let mut out = String::with_capacity(records.len() * 48);
    for (i, r) in records.iter().enumerate() {
        let code = dict
            .code_of(&r.worker)
            .ok_or_else(|| Error::UnknownWorker(r.worker.to_string()))?;
        if i > 0 {
            out.push(',');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "P{}:{}-{}:{code}:", r.pid, r.min_id, r.max_id);
        write_seconds(&mut out, r.completed_at_ms);
        out.push(':');
        write_seconds(&mut out, r.duration_ms);
    }
    Ok(out)
}

/// Decodes a batch written by [`encode_text_v1`], resolving short codes through `dict`.
///
/// Only the canonical spelling is accepted (no leading zeros, no trailing decimal
/// zeros, no spaces), so a text that decodes re-encodes to itself. The empty string
/// is the empty batch; records keep their order.
pub fn decode_text_v1(input: &str, dict: &WorkerDict) -> Result<Vec<CompletedRecord>, Error> {
    if input.is_empty() {
        return Ok(Vec::new());
    }
    input
        .split(',')
        .enumerate()
        .map(|(i, text)| decode_record(i, text, dict))
        .collect()
}

fn decode_record(record: usize, text: &str, dict: &WorkerDict) -> Result<CompletedRecord, Error> {
    let syntax = |expected| Error::TextSyntax { record, expected };
    let body = text
        .strip_prefix('P')
        .ok_or_else(|| syntax("'P' and a pid"))?;
    let mut fields = body.split(':');
    let mut field = |expected| fields.next().ok_or_else(|| syntax(expected));
    let pid = field("pid")?;
    let range = field("min_id-max_id")?;
    let code = field("worker short code")?;
    let completed_at = field("completed_at")?;
    let duration = field("duration")?;
    if fields.next().is_some() {
        return Err(syntax("end of record after duration"));
    }
    let (min_id, max_id) = range
        .split_once('-')
        .ok_or_else(|| syntax("min_id-max_id"))?;

    let number = |field, text: &str| {
        parse_canonical_u64(text).ok_or_else(|| Error::TextNumber {
            record,
            field,
            text: text.to_owned(),
        })
    };
    let time = |field, text: &str| {
        parse_canonical_seconds(text).map_err(|e| {
            let text = text.to_owned();
            match e {
                SecondsError::Inexact => Error::InexactTime { field, text },
                SecondsError::Invalid => Error::InvalidTime { field, text },
            }
        })
    };
    // Fields are checked in the order they are written.
    Ok(CompletedRecord {
        pid: number("pid", pid)?,
        min_id: number("min_id", min_id)?,
        max_id: number("max_id", max_id)?,
        worker: dict
            .id_of_code(code)
            .ok_or_else(|| Error::UnknownWorkerCode(code.to_owned()))?
            .into(),
        completed_at_ms: time("completed_at", completed_at)?,
        duration_ms: time("duration", duration)?,
    })
}
