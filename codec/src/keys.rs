//! The Redis key schema, so every crate agrees on names, shards and bit offsets.

use std::sync::Arc;

use crate::Error;

/// The largest shard count a job may have.
pub const MAX_SHARDS: u32 = 1024;
/// The batch size of the key schema and of binary v2 unless configured otherwise.
pub const DEFAULT_BATCH_SIZE: u64 = 100;
/// The largest batch size binary v2 and the key schema accept.
pub const MAX_BATCH_SIZE: u64 = 65_536;
/// Redis Cluster's slot count.
const SLOTS: u64 = 16_384;
/// The largest suffix [`KeyLayout::Spread`] tries for one shard. A try lands in a
/// shard's target slots with probability about `1 / (8 · num_shards)` (at least
/// 1/8192), so the search ends within some tens of thousands of tries at worst; the
/// bound only makes it total.
const MAX_SUFFIX: u32 = 1 << 20;

/// How the shards' hash tags of a namespace are named: fixed when the namespace is
/// planned (`layout` in `{ns}:meta` on Redis) and never changed, since every shard key's
/// name depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeyLayout {
    /// Version 1: shard `s` is tagged `{ns:s}`, so which master holds a shard is a
    /// hash of the namespace name, and 16 shards may land 3/6/7 on three masters. Kept
    /// for namespaces planned before layouts were recorded (a `{ns}:meta` with no
    /// `layout` field).
    Plain,
    /// Version 2, for every new namespace: shard `s` of `N` is tagged `{ns:s~k}` for the
    /// smallest `k` (`k = 0` written `{ns:s}`) whose slot falls in the middle eighth of
    /// the `s`-th of `N` equal intervals of the 16384 slots (`slot_interval`). A
    /// cluster whose masters own contiguous equal slot ranges (what `redis-cli
    /// --cluster create` makes) then holds on each master the shards whose interval
    /// centre it owns: `N / masters` rounded down or up, unless a range boundary falls
    /// within a sixteenth of an interval of its centre.
    #[default]
    Spread,
}

impl KeyLayout {
    /// The layout's version number, as stored in `{ns}:meta`: 1 or 2.
    pub const fn version(self) -> u32 {
        match self {
            KeyLayout::Plain => 1,
            KeyLayout::Spread => 2,
        }
    }

    /// The layout of version `version`, if this build knows it.
    pub const fn from_version(version: u32) -> Option<Self> {
        match version {
            1 => Some(KeyLayout::Plain),
            2 => Some(KeyLayout::Spread),
            _ => None,
        }
    }
}

/// The key names of one job: a namespace cut into `num_shards` shards.
///
/// Every key of shard `s` carries the shard's hash tag (`{ns:s}`, or `{ns:s~k}` under
/// [`KeyLayout::Spread`]), so all of a shard's keys live in one Redis Cluster slot and
/// one Lua script can touch them together. Pids map to shards by batch
/// (`batch = pid / batch_size`, `shard = batch % num_shards`), so a batch, its
/// completed-index bits and its statistics share that slot. Keys without a shard
/// (`{ns}:workers`, `{ns}:plans`, `{ns}:meta`, `{ns}:dict`) carry the tag `{ns}`.
///
/// The tags are computed once, when the schema is made (a search of at most a few
/// thousand CRC16s per shard under the spread layout), and shared by its clones.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeySchema {
    namespace: String,
    num_shards: u32,
    batch_size: u64,
    layout: KeyLayout,
    /// The hash tag of each shard, `{ns:s}` or `{ns:s~k}`, in shard order.
    tags: Arc<[String]>,
}

impl KeySchema {
    /// The schema of namespace `namespace` (1 to 64 characters of `[A-Za-z0-9_.-]`, so
    /// it can neither break a hash tag nor be confused with a key separator) with
    /// `num_shards` shards (`1..=1024`), batches of [`DEFAULT_BATCH_SIZE`] and the
    /// layout of new namespaces, [`KeyLayout::Spread`].
    pub fn new(namespace: &str, num_shards: u32) -> Result<Self, Error> {
        let valid = (1..=64).contains(&namespace.len())
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid {
            return Err(Error::InvalidNamespace(namespace.to_owned()));
        }
        if !(1..=MAX_SHARDS).contains(&num_shards) {
            return Err(Error::InvalidShardCount(num_shards));
        }
        let layout = KeyLayout::default();
        Ok(KeySchema {
            tags: tags(namespace, num_shards, layout),
            namespace: namespace.to_owned(),
            num_shards,
            batch_size: DEFAULT_BATCH_SIZE,
            layout,
        })
    }

    /// The same schema with the shard tags of `layout`: the one recorded for the
    /// namespace when it was planned.
    pub fn with_layout(mut self, layout: KeyLayout) -> Self {
        if layout != self.layout {
            self.tags = tags(&self.namespace, self.num_shards, layout);
            self.layout = layout;
        }
        self
    }

    /// How the shard tags are named.
    pub const fn layout(&self) -> KeyLayout {
        self.layout
    }

    /// The same schema with `batch_size` pids per batch (`1..=65536`).
    pub fn with_batch_size(mut self, batch_size: u64) -> Result<Self, Error> {
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            return Err(Error::InvalidBatchSize(batch_size));
        }
        self.batch_size = batch_size;
        Ok(self)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// How many shards the job has.
    pub const fn num_shards(&self) -> u32 {
        self.num_shards
    }

    /// Pids per batch.
    pub const fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// The shards, `0..num_shards`.
    pub fn shards(&self) -> std::ops::Range<u32> {
        0..self.num_shards
    }

    /// The batch holding `pid`.
    pub const fn batch_of(&self, pid: u64) -> u64 {
        pid / self.batch_size
    }

    /// The shard holding `batch`.
    pub const fn shard_of_batch(&self, batch: u64) -> u32 {
        // Less than num_shards <= 1024, so the cast is exact.
        (batch % self.num_shards as u64) as u32
    }

    /// The shard holding `pid`.
    pub const fn shard_of(&self, pid: u64) -> u32 {
        self.shard_of_batch(self.batch_of(pid))
    }

    /// The offset of `pid`'s bit in its shard's dense bitmaps (`{ns:s}:completed:index`).
    ///
    /// A shard holds every `num_shards`-th batch, so offsets count shard-local batches
    /// (`batch / num_shards`) rather than raw pids: with 16 shards a bitmap is 16 times
    /// shorter than if it were indexed by pid. Redis caps offsets at 2^32 - 1, which
    /// this does not check: 2^32 pids per shard is far beyond any plan tranche expects.
    pub const fn bit_offset(&self, pid: u64) -> u64 {
        let local_batch = self.batch_of(pid) / self.num_shards as u64;
        // Never overflows: local_batch * batch_size <= batch * batch_size <= pid.
        local_batch * self.batch_size + pid % self.batch_size
    }

    /// The hash tag of `shard`: `{elk:3}` (plain layout) or `{elk:3~41}` (spread).
    ///
    /// # Panics
    ///
    /// If `shard` is not below [`KeySchema::num_shards`].
    pub fn shard_tag(&self, shard: u32) -> &str {
        &self.tags[shard as usize]
    }

    /// A key of `shard`: `{elk:3}:{suffix}`.
    pub fn shard_key(&self, shard: u32, suffix: &str) -> String {
        format!("{}:{suffix}", self.shard_tag(shard))
    }

    /// `{ns:s}:active`: the shard's unfinished partitions.
    pub fn active(&self, shard: u32) -> String {
        self.shard_key(shard, "active")
    }

    /// `{ns:s}:pending`: partitions waiting to be claimed, scored by ready time.
    pub fn pending(&self, shard: u32) -> String {
        self.shard_key(shard, "pending")
    }

    /// `{ns:s}:runs`: runs of fresh partitions claimed as one lease each, by token.
    pub fn runs(&self, shard: u32) -> String {
        self.shard_key(shard, "runs")
    }

    /// `{ns:s}:leases`: lease deadlines, scored by deadline.
    pub fn leases(&self, shard: u32) -> String {
        self.shard_key(shard, "leases")
    }

    /// `{ns:s}:inbox`: the stream of completed records waiting to be archived.
    pub fn inbox(&self, shard: u32) -> String {
        self.shard_key(shard, "inbox")
    }

    /// `{ns:s}:completed`: the simple tier, pid -> JSON.
    pub fn completed(&self, shard: u32) -> String {
        self.shard_key(shard, "completed")
    }

    /// `{ns:s}:completed:index`: one bit per completed pid, at [`KeySchema::bit_offset`].
    pub fn completed_index(&self, shard: u32) -> String {
        self.shard_key(shard, "completed:index")
    }

    /// `{ns:s}:completed:batch:{batch}` in the shard that holds `batch`.
    pub fn completed_batch(&self, batch: u64) -> String {
        self.shard_key(
            self.shard_of_batch(batch),
            &format!("completed:batch:{batch}"),
        )
    }

    /// `{ns:s}:stats:{suffix}`: a statistics key of `shard`.
    pub fn stats(&self, shard: u32, suffix: &str) -> String {
        self.shard_key(shard, &format!("stats:{suffix}"))
    }

    /// The namespace's own hash tag, for keys without a shard: `{elk}`.
    pub fn global_tag(&self) -> String {
        format!("{{{}}}", self.namespace)
    }

    /// `{ns}:workers`: worker id -> worker info.
    pub fn workers(&self) -> String {
        format!("{}:workers", self.global_tag())
    }

    /// `{ns}:plans`: the job's plans.
    pub fn plans(&self) -> String {
        format!("{}:plans", self.global_tag())
    }

    /// `{ns}:meta`: job settings such as `num_shards`, fixed when the job is created.
    pub fn meta(&self) -> String {
        format!("{}:meta", self.global_tag())
    }

    /// `{ns}:dirty`: a set of shard numbers whose inbox received completions that no
    /// archiver has looked at yet. Completing clients add their shard after the
    /// completion script returns; archivers pop from it, so they visit only shards with
    /// work and the cost of an idle poll does not grow with the shard count. A mark is
    /// a hint: one lost in a crash is covered by the archiver's periodic sweep.
    pub fn dirty(&self) -> String {
        format!("{}:dirty", self.global_tag())
    }

    /// `{ns}:dict`: the worker dictionary every archive decode needs.
    pub fn dict(&self) -> String {
        format!("{}:dict", self.global_tag())
    }
}

/// The hash tags of `num_shards` shards of `namespace` under `layout`.
fn tags(namespace: &str, num_shards: u32, layout: KeyLayout) -> Arc<[String]> {
    (0..num_shards)
        .map(|shard| match layout {
            KeyLayout::Plain => format!("{{{namespace}:{shard}}}"),
            KeyLayout::Spread => spread_tag(namespace, shard, num_shards),
        })
        .collect()
}

/// The slots `lo..hi` of the `shard`-th of `num_shards` equal intervals of 0..16384.
pub(crate) fn slot_interval(shard: u32, num_shards: u32) -> std::ops::Range<u16> {
    let bound = |s: u32| (u64::from(s) * SLOTS / u64::from(num_shards.max(1))) as u16;
    bound(shard)..bound(shard + 1)
}

/// The slots a spread tag of `shard` aims at: the middle eighth of its interval (at
/// least two slots), so that a master range boundary falling inside the interval sends
/// the shard where the interval's centre lies, and masters hold as many shards as
/// interval centres; the whole slot space for a single shard, whose plain tag
/// `{ns:0}` always fits.
fn target_slots(shard: u32, num_shards: u32) -> std::ops::Range<u16> {
    let interval = slot_interval(shard, num_shards);
    if num_shards == 1 {
        return interval;
    }
    let width = interval.end - interval.start;
    let half = (width / 16).max(1);
    let mid = interval.start + width / 2;
    mid - half..mid + half
}

/// The spread tag of `shard`: `{ns:s}` if its slot is in the shard's target slots,
/// else `{ns:s~k}` for the smallest `k >= 1` whose is. The CRC of `ns:s~` is computed
/// once and carried on over the digits of each `k`.
fn spread_tag(namespace: &str, shard: u32, num_shards: u32) -> String {
    let wanted = target_slots(shard, num_shards);
    let plain = format!("{namespace}:{shard}");
    let crc = crc16_update(0, plain.as_bytes());
    if wanted.contains(&(crc % SLOTS as u16)) {
        return format!("{{{plain}}}");
    }
    let stem = crc16_update(crc, b"~");
    let mut digits = [0u8; 10];
    for k in 1..=MAX_SUFFIX {
        // `k` in decimal, at the end of `digits`.
        let (mut n, mut at) = (k, digits.len());
        while n > 0 {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        if wanted.contains(&(crc16_update(stem, &digits[at..]) % SLOTS as u16)) {
            return format!("{{{plain}~{k}}}");
        }
    }
    // Never reached for a valid schema (a miss over a million tries has probability
    // below e^-1000); a plain tag is still a valid tag.
    format!("{{{plain}}}")
}

/// The Redis Cluster slot of `key`, exactly as Redis computes it: CRC16 (XMODEM) of the
/// hash tag (the bytes between the first `{` and the first `}` after it, if non-empty)
/// or else of the whole key, modulo 16384.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let close = rest.iter().position(|&b| b == b'}')?;
            rest.get(..close).filter(|tag| !tag.is_empty())
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % 16384
}

/// CRC16-CCITT in its XMODEM form (polynomial 0x1021, initial value 0), which Redis
/// Cluster uses for key slots.
pub(crate) fn crc16_xmodem(bytes: &[u8]) -> u16 {
    crc16_update(0, bytes)
}

/// The CRC16 (XMODEM) of the bytes hashed into `crc` so far followed by `bytes`.
fn crc16_update(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

/// CRC16 (XMODEM) of each byte value, one table look-up per byte.
static CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        // Vectors from the Redis documentation of CLUSTER KEYSLOT and the cluster spec.
        for (key, slot) in [
            ("foo", 12182),
            ("somekey", 11058),
            ("foo{hash_tag}", 2515),
            ("bar{hash_tag}", 2515),
        ] {
            assert_eq!(key_slot(key), slot, "{key}");
        }
        let same = |a: &str, b: &str| assert_eq!(key_slot(a), key_slot(b), "{a} vs {b}");
        same("{user1000}.following", "{user1000}.followers");
        same("{user1000}.following", "user1000");
        // The tag ends at the first `}` after the first `{`.
        same("foo{{bar}}zap", "{bar");
        same("foo{bar}{zap}", "bar");
        // An empty or unclosed tag hashes the whole key.
        assert_eq!(key_slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot("foo{bar"), crc16_xmodem(b"foo{bar") % 16384);
        assert_eq!(key_slot(""), 0);
    }

    #[test]
    fn key_names() {
        let k = KeySchema::new("elk", 16).expect("valid");
        assert_eq!(k.layout(), KeyLayout::Spread);
        assert_eq!(k.batch_of(4970), 49);
        assert_eq!(k.shard_of(4970), 1);
        assert_eq!(k.shard_tag(0), "{elk:0~42}");
        assert_eq!(k.shard_tag(3), "{elk:3~6}");
        assert_eq!(k.active(3), "{elk:3~6}:active");
        assert_eq!(k.pending(3), "{elk:3~6}:pending");
        assert_eq!(k.leases(3), "{elk:3~6}:leases");
        assert_eq!(k.runs(3), "{elk:3~6}:runs");
        assert_eq!(k.inbox(3), "{elk:3~6}:inbox");
        assert_eq!(k.completed(3), "{elk:3~6}:completed");
        assert_eq!(k.completed_index(3), "{elk:3~6}:completed:index");
        assert_eq!(k.completed_batch(497), "{elk:1~49}:completed:batch:497");
        assert_eq!(k.stats(3, "global"), "{elk:3~6}:stats:global");
        assert_eq!(k.workers(), "{elk}:workers");
        assert_eq!(k.plans(), "{elk}:plans");
        assert_eq!(k.meta(), "{elk}:meta");
        assert_eq!(k.dirty(), "{elk}:dirty");
        assert_eq!(k.dict(), "{elk}:dict");
        // One shard owns every slot, so its plain tag is always in its interval.
        assert_eq!(
            KeySchema::new("elk", 1).unwrap().active(0),
            "{elk:0}:active"
        );
    }

    #[test]
    fn plain_layout_keeps_the_version_1_names() {
        let k = KeySchema::new("elk", 16)
            .expect("valid")
            .with_layout(KeyLayout::Plain);
        assert_eq!(k.layout(), KeyLayout::Plain);
        assert_eq!(k.shard_tag(3), "{elk:3}");
        assert_eq!(k.active(3), "{elk:3}:active");
        assert_eq!(k.completed_batch(497), "{elk:1}:completed:batch:497");
        assert_eq!(k.meta(), "{elk}:meta");
        let back = k.with_layout(KeyLayout::Spread);
        assert_eq!(back, KeySchema::new("elk", 16).unwrap());
        for layout in [KeyLayout::Plain, KeyLayout::Spread] {
            assert_eq!(KeyLayout::from_version(layout.version()), Some(layout));
        }
        assert_eq!(KeyLayout::from_version(3), None);
    }

    #[test]
    fn spread_tags_fall_in_their_slot_interval() {
        // Deterministic pseudo-random names (xorshift), every length and character.
        let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut names: Vec<String> = ["tranche", "scale", "reindex", "down", "elk", "e2e"]
            .map(String::from)
            .to_vec();
        for _ in 0..60 {
            let len = 1 + next() % 64;
            names.push(
                (0..len)
                    .map(|_| char::from(alphabet[(next() % 64) as usize]))
                    .collect(),
            );
        }
        for name in &names {
            for shards in 1..=64 {
                let k = KeySchema::new(name, shards).expect("valid");
                for shard in k.shards() {
                    let tag = k.shard_tag(shard);
                    let slot = key_slot(tag);
                    assert!(
                        slot_interval(shard, shards).contains(&slot)
                            && target_slots(shard, shards).contains(&slot),
                        "{tag}: slot {slot} of shard {shard}/{shards}"
                    );
                    assert!(tag.starts_with(&format!("{{{name}:{shard}")), "{tag}");
                    assert_eq!(key_slot(k.active(shard)), slot, "{tag}");
                }
            }
        }
        // The largest shard count, where each interval is 16 slots wide.
        let k = KeySchema::new("tranche", MAX_SHARDS).expect("valid");
        for shard in k.shards() {
            let slot = key_slot(k.shard_tag(shard));
            assert!(slot_interval(shard, MAX_SHARDS).contains(&slot));
        }
    }

    /// The slot ranges `redis-cli --cluster create` gives `masters` masters: the last
    /// slot of each, as its `clusterManagerCommandCreate` rounds them.
    fn default_ranges(masters: u32) -> Vec<u16> {
        let per = SLOTS as f64 / f64::from(masters);
        (0..masters)
            .map(|j| {
                if j == masters - 1 {
                    (SLOTS - 1) as u16
                } else {
                    (f64::from(j) * per + per - 1.0).round() as u16
                }
            })
            .collect()
    }

    #[test]
    fn masters_hold_the_shards_whose_interval_centre_they_own() {
        let mut checked = 0;
        for ns in ["tranche", "scale", "reindex", "down", "elk", "e2e"] {
            for masters in 2..=10u32 {
                let lasts = default_ranges(masters);
                let master_of = |slot: u16| lasts.iter().position(|&l| slot <= l).unwrap();
                for shards in [16, 32, 48, 64] {
                    let k = KeySchema::new(ns, shards).unwrap();
                    let mut by_tag = vec![0; masters as usize];
                    let mut by_centre = vec![0; masters as usize];
                    let mut near = false;
                    for shard in k.shards() {
                        by_tag[master_of(key_slot(k.shard_tag(shard)))] += 1;
                        let target = target_slots(shard, shards);
                        let centre = (target.start + target.end) / 2;
                        by_centre[master_of(centre)] += 1;
                        // A boundary among the target slots may send the shard either way.
                        near |= lasts.iter().any(|&l| target.contains(&l));
                    }
                    if near {
                        continue;
                    }
                    checked += 1;
                    assert_eq!(by_tag, by_centre, "{ns}: {shards} shards on {masters}");
                    let (max, min) = (by_tag.iter().max(), by_tag.iter().min());
                    assert!(
                        max.unwrap() - min.unwrap() <= 1,
                        "{ns} {shards}/{masters}: {by_tag:?}"
                    );
                }
            }
        }
        assert!(checked > 150, "{checked} combinations checked");
        let sixteen_on_three = |ns: &str| {
            let k = KeySchema::new(ns, 16).unwrap();
            let mut per = [0; 3];
            for shard in k.shards() {
                per[match key_slot(k.shard_tag(shard)) {
                    0..=5460 => 0,
                    5461..=10922 => 1,
                    _ => 2,
                }] += 1;
            }
            per
        };
        for ns in ["tranche", "scale", "reindex", "elk"] {
            assert_eq!(sixteen_on_three(ns), [5, 6, 5], "{ns}");
        }
    }

    #[test]
    fn slot_intervals_tile_the_slot_space() {
        for shards in [1, 3, 16, 1000, 1024] {
            let mut end = 0;
            for shard in 0..shards {
                let range = slot_interval(shard, shards);
                assert_eq!(range.start, end, "shard {shard} of {shards}");
                assert!(range.end > range.start);
                end = range.end;
            }
            assert_eq!(u64::from(end), SLOTS);
        }
    }

    #[test]
    fn dense_bit_offsets() {
        for shards in [1, 3, 16] {
            let k = KeySchema::new("elk", shards).expect("valid");
            // Within each shard, offsets of consecutive pids are 0, 1, 2, ... with no gaps.
            let mut next = vec![0u64; shards as usize];
            for pid in 0..100 * 50 {
                let shard = k.shard_of(pid) as usize;
                assert_eq!(k.bit_offset(pid), next[shard], "pid {pid} shards {shards}");
                next[shard] += 1;
            }
        }
        let k = KeySchema::new("elk", 1024).expect("valid");
        assert_eq!(
            k.bit_offset(u64::MAX),
            u64::MAX / 100 / 1024 * 100 + u64::MAX % 100
        );
    }

    #[test]
    fn invalid_schemas() {
        let check = |ns: &str, shards: u32, batch: u64, expect: &str| {
            let got = KeySchema::new(ns, shards).and_then(|k| k.with_batch_size(batch));
            assert_eq!(
                format!("{:?}", got.map(|k| k.shard_tag(0).to_owned())),
                expect
            );
        };
        check("elk", 1, 100, r#"Ok("{elk:0}")"#);
        check("a.b-c_9", 1024, 65_536, r#"Ok("{a.b-c_9:0~5598}")"#);
        check("", 1, 100, r#"Err(InvalidNamespace(""))"#);
        check("e{k", 1, 100, r#"Err(InvalidNamespace("e{k"))"#);
        check("e:k", 1, 100, r#"Err(InvalidNamespace("e:k"))"#);
        check("elk", 0, 100, "Err(InvalidShardCount(0))");
        check("elk", 1025, 100, "Err(InvalidShardCount(1025))");
        check("elk", 1, 0, "Err(InvalidBatchSize(0))");
        check("elk", 1, 65_537, "Err(InvalidBatchSize(65537))");
    }
}
