//! Saving and restoring: the state file form of every shard and of the whole
//! archive, checked against the invariants every write keeps.

use super::*;

use tranche_codec::state::runs;

/// Shares one `Arc` per worker id among restored records, as decoding does.
fn intern(names: &mut HashSet<Arc<str>>, mut r: CompletedRecord) -> CompletedRecord {
    match names.get(&*r.worker) {
        Some(name) => r.worker = name.clone(),
        None => {
            names.insert(r.worker.clone());
        }
    }
    r
}

/// The most pids one shard's archived set may hold: Redis's bitmap limit.
const MAX_ARCHIVED: u64 = tranche_codec::lua::BITMAP_BITS;

impl Shard {
    /// The saved form, with `now` and `wall` the same instant on both clocks.
    fn state(&self, now: Instant, wall: u64) -> ShardState {
        let mut archived: Vec<u64> = self.archived.iter().copied().collect();
        archived.sort_unstable();
        ShardState {
            archived: runs(&archived),
            simple: self.simple.values().cloned().collect(),
            open: self
                .open
                .iter()
                .map(|(&b, (tier, recs))| (b, *tier, recs.values().cloned().collect()))
                .collect(),
            sealed: self
                .sealed
                .iter()
                .map(|(&batch, b)| SealedState {
                    batch,
                    bytes: b.bytes.clone(),
                    count: b.count,
                    tier: b.tier,
                    expires_at_ms: b.expires.map(|e| {
                        wall.saturating_add(e.saturating_duration_since(now).as_millis() as u64)
                    }),
                })
                .collect(),
            received: self.received.iter().cloned().collect(),
        }
    }

    /// Shard `no` from its saved state, checked against the invariants every write
    /// keeps.
    fn restore(
        schema: &KeySchema,
        no: u32,
        saved: ShardState,
        names: &mut HashSet<Arc<str>>,
        now: Instant,
        wall: u64,
    ) -> Result<Self, String> {
        let mut s = Shard::default();
        let mut prev: Option<u64> = None;
        for (first, last) in saved.archived {
            if first > last || prev.is_some_and(|p| p >= first) {
                return Err(format!("shard {no}: archived runs out of order at {first}"));
            }
            prev = Some(last);
            if (s.archived.len() as u64).saturating_add(last - first) >= MAX_ARCHIVED {
                return Err(format!("shard {no}: more archived pids than a shard holds"));
            }
            for pid in first..=last {
                if schema.shard_of(pid) != no {
                    return Err(format!("shard {no}: archived pid {pid} is not its own"));
                }
                s.archived.insert(pid);
            }
        }
        s.count = s.archived.len() as u64;
        let own = |pid: u64, s: &Shard| -> Result<(), String> {
            if schema.shard_of(pid) != no || !s.archived.contains(&pid) {
                return Err(format!("shard {no}: record {pid} is not archived here"));
            }
            Ok(())
        };
        for r in saved.simple {
            own(r.pid, &s)?;
            s.simple.insert(r.pid, intern(names, r));
        }
        for (batch, tier, recs) in saved.open {
            let mut records = BTreeMap::new();
            for r in recs {
                own(r.pid, &s)?;
                if schema.batch_of(r.pid) != batch {
                    return Err(format!("open batch {batch} holds pid {}", r.pid));
                }
                records.insert(r.pid, intern(names, r));
            }
            s.open.insert(batch, (tier, records));
        }
        for b in saved.sealed {
            if schema.shard_of_batch(b.batch) != no {
                return Err(format!(
                    "shard {no}: sealed batch {} is not its own",
                    b.batch
                ));
            }
            let expires = b
                .expires_at_ms
                .map(|at| now + Duration::from_millis(at.saturating_sub(wall)));
            let sealed = Sealed {
                bytes: b.bytes,
                count: b.count,
                tier: b.tier,
                expires,
            };
            s.sealed.insert(b.batch, sealed);
        }
        for r in saved.received {
            s.push_received(intern(names, r));
        }
        Ok(s)
    }
}

impl MemoryArchive {
    /// Everything the archive holds and the statistics it counts into, taken at one
    /// instant for the embedded state file. Every record waiting in an inbox channel
    /// is moved into the archive's queue of received records first, and saved with it.
    ///
    /// Take it inside `MemoryActiveStore::state_with`, so the active store is held
    /// still meanwhile: a partition completed around the save is then in both states
    /// or in neither. Taken after the active store's state instead, a partition
    /// completed in between would be saved as archived (or received) while the saved
    /// active store still holds it leased; it would be redone, and its second record
    /// dropped as a duplicate.
    pub fn state(&self) -> ArchiveState {
        // Lock order everywhere: the dictionary, then shards in order. With all of them
        // held no archive write, and so no statistics delta, can happen.
        let dict = lock(&self.dict);
        let mut guards: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(lock).collect();
        let (now, wall) = (Instant::now(), self.clock.now_ms());
        let shards = guards
            .iter_mut()
            .zip(&self.inboxes)
            .map(|(s, inbox)| {
                s.receive(inbox);
                s.state(now, wall)
            })
            .collect();
        ArchiveState {
            version: ARCHIVE_STATE_VERSION,
            namespace: self.config.namespace.clone(),
            num_shards: self.schema.num_shards(),
            batch_size: self.schema.batch_size(),
            dict: dict.clone(),
            decode_failures: *lock(&self.decode_failures),
            shards,
            stats: self.stats.state(),
        }
    }

    /// An archive holding exactly what `state` saved, draining `inboxes` from here on,
    /// with statistics restored from the state too ([`MemoryArchive::stats`]).
    /// `config` must have the saved namespace and shard count; tier thresholds, TTL and
    /// pass size may change (they apply from the next pass on). Summary batches keep
    /// their wall-clock expiry.
    ///
    /// [`Error::InvalidArgument`] when the namespace or shard count differ,
    /// [`Error::Corrupt`] for another state version or a state that breaks the
    /// archive's invariants.
    pub fn restore(
        config: Config,
        inboxes: Vec<Receiver<CompletedRecord>>,
        state: ArchiveState,
    ) -> Result<Self> {
        let corrupt = |detail: String| Error::Corrupt {
            key: "archive state".into(),
            detail,
        };
        tranche_codec::state::check_version(state.version, ARCHIVE_STATE_VERSION)
            .map_err(|e| corrupt(e.to_string()))?;
        if (state.namespace.as_str(), state.num_shards)
            != (config.namespace.as_str(), config.num_shards)
        {
            return Err(Error::InvalidArgument(format!(
                "the state is of namespace {:?} with {} shards, not {:?} with {}",
                state.namespace, state.num_shards, config.namespace, config.num_shards
            )));
        }
        let stats = MemoryStats::restore(state.stats).map_err(|e| corrupt(e.to_string()))?;
        let archive = Self::new(config, inboxes, Arc::new(stats))?;
        if state.batch_size != archive.schema.batch_size() {
            return Err(corrupt(format!(
                "batches of {} pids, not {}",
                state.batch_size,
                archive.schema.batch_size()
            )));
        }
        if state.shards.len() != archive.shards.len() {
            return Err(corrupt(format!(
                "{} shards saved for {}",
                state.shards.len(),
                archive.shards.len()
            )));
        }
        let (now, wall) = (Instant::now(), archive.clock.now_ms());
        let mut names = HashSet::new();
        for (no, saved) in state.shards.into_iter().enumerate() {
            let shard = Shard::restore(&archive.schema, no as u32, saved, &mut names, now, wall)
                .map_err(corrupt)?;
            *lock(&archive.shards[no]) = shard;
        }
        *lock(&archive.dict) = state.dict;
        *lock(&archive.decode_failures) = state.decode_failures;
        Ok(archive)
    }
}
