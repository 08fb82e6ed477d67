//! The worker dictionary: full worker ids to short codes and dense indices.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::wire::{Reader, put_varint};

/// Maps each worker id to a dense index (what binary v2 stores) and a short code (what
/// text v1 stores), and back.
///
/// `worker1` and `worker-1` get the seed's `w1` when it is free; any other id (unicode
/// included) gets a generated code such as `x1f`. The mapping is assigned in insertion
/// order and then frozen: a code is never derived again from an id, only looked up, so
/// an archive stays decodable whatever workers are called. Keep the dictionary with the
/// data (`{ns}:dict` in Redis, a section of every export) and pass it to every decode.
///
/// It only ever grows: an entry, once written, keeps its index and code, so a newer
/// dictionary decodes everything an older one did. Where several processes add workers,
/// one atomic step must append each entry (for example a script over `{ns}:dict`), so
/// that they all agree on the indices.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<WorkerEntry>", into = "Vec<WorkerEntry>")]
pub struct WorkerDict {
    /// Entry `i` is the worker with index `i`.
    entries: Vec<WorkerEntry>,
    by_id: HashMap<String, u32>,
    by_code: HashMap<String, u32>,
}

/// One worker of a [`WorkerDict`]: its full id and its short code.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerEntry {
    /// The worker's full id, as workers report it.
    pub id: String,
    /// The short code text v1 writes in its place.
    pub code: String,
}

const MAGIC: [u8; 4] = *b"TRWD";
const VERSION: u8 = 1;
const MAX_CODE_LEN: usize = 32;

impl WorkerDict {
    /// An empty dictionary.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many workers the dictionary holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the dictionary holds no worker.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The index of `id`, adding it (with a fresh short code) if it is new.
    pub fn insert(&mut self, id: &str) -> Result<u32, Error> {
        if let Some(&index) = self.by_id.get(id) {
            return Ok(index);
        }
        let index = u32::try_from(self.entries.len())
            .ok()
            .filter(|&i| i < u32::MAX)
            .ok_or(Error::DictFull)?;
        let code = self.fresh_code(id, index);
        self.push(WorkerEntry {
            id: id.to_owned(),
            code,
        });
        Ok(index)
    }

    /// The code a new worker gets: the seed's `w{n}` for `worker{n}` or `worker-{n}`,
    /// else `x` and a base-36 number, the first such code that is free.
    fn fresh_code(&self, id: &str, index: u32) -> String {
        let digits = id
            .strip_prefix("worker")
            .map(|rest| rest.strip_prefix('-').unwrap_or(rest))
            .filter(|d| (1..=9).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()));
        if let Some(digits) = digits {
            let code = format!("w{digits}");
            if !self.by_code.contains_key(&code) {
                return code;
            }
        }
        // Codes from an imported dictionary may occupy `x{index}`: probe upwards.
        (u64::from(index)..)
            .map(|n| format!("x{}", base36(n)))
            .find(|code| !self.by_code.contains_key(code))
            .unwrap_or_default()
    }

    fn push(&mut self, entry: WorkerEntry) {
        // Callers guarantee the index fits u32 and neither key is present.
        let index = self.entries.len() as u32;
        self.by_id.insert(entry.id.clone(), index);
        self.by_code.insert(entry.code.clone(), index);
        self.entries.push(entry);
    }

    /// A dictionary with exactly these entries, entry `i` getting index `i`.
    ///
    /// Fails on a repeated id or code, or a code outside `[a-z0-9_-]{1,32}`: the text
    /// form separates fields with `:` and records with `,`, so a code must hold neither.
    pub fn from_entries(entries: impl IntoIterator<Item = WorkerEntry>) -> Result<Self, Error> {
        let mut dict = WorkerDict::new();
        for entry in entries {
            if !valid_code(&entry.code) {
                return Err(Error::InvalidWorkerCode(entry.code));
            }
            if dict.by_id.contains_key(&entry.id) {
                return Err(Error::DuplicateWorkerId(entry.id));
            }
            if dict.by_code.contains_key(&entry.code) {
                return Err(Error::DuplicateWorkerCode(entry.code));
            }
            if dict.entries.len() >= u32::MAX as usize {
                return Err(Error::DictFull);
            }
            dict.push(entry);
        }
        Ok(dict)
    }

    /// The entries, in index order.
    pub fn entries(&self) -> &[WorkerEntry] {
        &self.entries
    }

    /// The index of worker `id`.
    pub fn index_of(&self, id: &str) -> Option<u32> {
        self.by_id.get(id).copied()
    }

    /// The index of the worker with short code `code`.
    pub fn index_of_code(&self, code: &str) -> Option<u32> {
        self.by_code.get(code).copied()
    }

    /// The entry with index `index`.
    pub fn get(&self, index: u32) -> Option<&WorkerEntry> {
        self.entries.get(index as usize)
    }

    /// The short code of worker `id`.
    pub fn code_of(&self, id: &str) -> Option<&str> {
        let index = self.index_of(id)?;
        self.get(index).map(|e| e.code.as_str())
    }

    /// The full id of the worker with short code `code`.
    pub fn id_of_code(&self, code: &str) -> Option<&str> {
        let index = self.index_of_code(code)?;
        self.get(index).map(|e| e.id.as_str())
    }

    /// The compact, stable binary form: magic `TRWD`, version 1, the entry count, each
    /// entry's id and code as length-prefixed UTF-8 (varint lengths), and a CRC32 of
    /// everything before it (little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 16 * self.entries.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        put_varint(&mut out, self.entries.len() as u64);
        for e in &self.entries {
            put_varint(&mut out, e.id.len() as u64);
            out.extend_from_slice(e.id.as_bytes());
            put_varint(&mut out, e.code.len() as u64);
            out.extend_from_slice(e.code.as_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads [`WorkerDict::to_bytes`], validating every field.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new(bytes);
        r.header(MAGIC, VERSION)?;
        // Check the whole value first, so corruption reads as corruption, not as
        // whatever field it happened to hit.
        let (body, crc) = bytes.split_last_chunk::<4>().ok_or(Error::Truncated)?;
        if body.len() < 5 {
            return Err(Error::Truncated);
        }
        let (stored, computed) = (u32::from_le_bytes(*crc), crc32fast::hash(body));
        if stored != computed {
            return Err(Error::ChecksumMismatch { stored, computed });
        }
        let mut r = Reader::new(body.get(5..).unwrap_or_default());
        // An entry takes at least two bytes, which bounds the allocation below.
        let count = r.len(body.len() / 2, "dictionary entry count")?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let id = read_str(&mut r, body.len())?;
            let code = read_str(&mut r, MAX_CODE_LEN)?;
            entries.push(WorkerEntry { id, code });
        }
        if r.remaining() > 0 {
            return Err(Error::TrailingBytes(r.remaining()));
        }
        WorkerDict::from_entries(entries)
    }
}

fn read_str(r: &mut Reader<'_>, max: usize) -> Result<String, Error> {
    let len = r.len(max, "dictionary string length")?;
    let bytes = r.bytes(len)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::NotUtf8)
}

fn valid_code(code: &str) -> bool {
    (1..=MAX_CODE_LEN).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

impl TryFrom<Vec<WorkerEntry>> for WorkerDict {
    type Error = Error;
    fn try_from(entries: Vec<WorkerEntry>) -> Result<Self, Error> {
        WorkerDict::from_entries(entries)
    }
}

impl From<WorkerDict> for Vec<WorkerEntry> {
    fn from(dict: WorkerDict) -> Self {
        dict.entries
    }
}

impl fmt::Debug for WorkerDict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().map(|e| (&e.id, &e.code)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(ids: &[&str]) -> Vec<String> {
        let mut dict = WorkerDict::new();
        for id in ids {
            dict.insert(id).expect("room");
        }
        dict.entries().iter().map(|e| e.code.clone()).collect()
    }

    #[test]
    fn short_codes() {
        assert_eq!(
            codes(&[
                "worker1",
                "worker-2",
                "worker-1",
                "worker1",
                "alice",
                "работник-7",
                "worker0123",
                "worker",
                "worker-",
                "worker1234567890"
            ]),
            ["w1", "w2", "x2", "x3", "x4", "w0123", "x6", "x7", "x8"]
        );
    }

    #[test]
    fn generated_codes_probe_past_imported_ones() {
        let mut dict = WorkerDict::from_entries([WorkerEntry {
            id: "imported".into(),
            code: "x1".into(),
        }])
        .expect("valid");
        assert_eq!(dict.insert("bob").ok(), Some(1));
        assert_eq!(dict.code_of("bob"), Some("x2"));
        assert_eq!(dict.id_of_code("x1"), Some("imported"));
    }

    #[test]
    fn bytes_and_serde_round_trip() {
        let mut dict = WorkerDict::new();
        for id in ["worker1", "ワーカー", "", "worker-1"] {
            dict.insert(id).expect("room");
        }
        let bytes = dict.to_bytes();
        assert_eq!(WorkerDict::from_bytes(&bytes).ok().as_ref(), Some(&dict));
        let json = serde_json::to_string(&dict).expect("serializes");
        assert_eq!(
            json,
            r#"[{"id":"worker1","code":"w1"},{"id":"ワーカー","code":"x1"},{"id":"","code":"x2"},{"id":"worker-1","code":"x3"}]"#
        );
        assert_eq!(
            serde_json::from_str::<WorkerDict>(&json).ok().as_ref(),
            Some(&dict)
        );
        let dup = r#"[{"id":"a","code":"w1"},{"id":"b","code":"w1"}]"#;
        assert!(serde_json::from_str::<WorkerDict>(dup).is_err());
    }

    #[test]
    fn invalid_entries() {
        let entry = |id: &str, code: &str| WorkerEntry {
            id: id.into(),
            code: code.into(),
        };
        let check = |entries: Vec<WorkerEntry>, expect: &str| {
            let got = format!("{:?}", WorkerDict::from_entries(entries).map(|d| d.len()));
            assert_eq!(got, expect);
        };
        check(vec![entry("a", "w1"), entry("b", "w2")], "Ok(2)");
        check(
            vec![entry("a", "w1"), entry("a", "w2")],
            r#"Err(DuplicateWorkerId("a"))"#,
        );
        check(
            vec![entry("a", "w1"), entry("b", "w1")],
            r#"Err(DuplicateWorkerCode("w1"))"#,
        );
        check(vec![entry("a", "W1")], r#"Err(InvalidWorkerCode("W1"))"#);
        check(vec![entry("a", "w:1")], r#"Err(InvalidWorkerCode("w:1"))"#);
        check(vec![entry("a", "")], r#"Err(InvalidWorkerCode(""))"#);
    }
}
