//! Splitting on Redis (`lua/split.lua`, `split_request.lua` and the piece scripts): one
//! script call per shard involved, as for the lease lifecycle.

use tranche_codec::Status;

use super::*;
use crate::model::FailPolicy;
use crate::split::{Beat, Part, PartBeat, Piece, PieceDone, Running, SplitAnswer, Splits};

/// A beat reply code (`heartbeat.lua`, `piece_beat.lua`): renewed (with the part's
/// end, or `1` for a record that names none: the lease's own), lost, or cut.
fn beat_code(code: &str, lease: &Lease) -> Result<Beat> {
    match code {
        "1" => Ok(Beat::Renewed { last: lease.max_id }),
        "-1" => Err(lost(lease)),
        // The lease's record does not decode, `ERR corrupt record KEY PID: DETAIL`, or
        // the run holding it, `ERR corrupt run KEY TOKEN: DETAIL`.
        corrupt if corrupt.starts_with('!') => {
            let message = &corrupt[1..];
            if let Some((key, detail)) = message
                .strip_prefix("ERR corrupt run ")
                .and_then(|m| m.split_once(": "))
            {
                return Err(corrupt_run(key.to_owned(), lease.pid, Some(detail)));
            }
            let named = message.strip_prefix("ERR corrupt record ");
            Err(match named.and_then(|m| m.split_once(": ")) {
                Some((key, detail)) => Error::Corrupt {
                    key: key.to_owned(),
                    detail: detail.to_owned(),
                },
                None => Error::Corrupt {
                    key: "beat reply".into(),
                    detail: message.to_owned(),
                },
            })
        }
        other => {
            let end = |prefix: char| other.strip_prefix(prefix).and_then(|v| v.parse().ok());
            match (end('='), end('>')) {
                (Some(last), _) => Ok(Beat::Cut { last }),
                (_, Some(last)) => Ok(Beat::Renewed { last }),
                _ => Err(Error::Corrupt {
                    key: "beat reply".into(),
                    detail: format!("`{other}` is no beat outcome"),
                }),
            }
        }
    }
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        pid: lease.pid,
        token: lease.token,
    }
}

/// A piece's field in its shard's `pieces` hash.
fn piece_field(pid: u64, start: u64) -> String {
    format!("{pid}:{start}")
}

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Renews partitions' leases (`heartbeat.lua`), each with its checkpoint and, when
    /// it splits, the first ID its holder has not handed out: one call per shard.
    pub(super) async fn beat_owners(
        &self,
        beats: &[(&Lease, u64, Option<u64>)],
    ) -> Result<Vec<Result<Beat>>> {
        self.beat_with(&HEARTBEAT, false, beats).await
    }

    async fn beat_with(
        &self,
        script: &Script,
        pieces: bool,
        beats: &[(&Lease, u64, Option<u64>)],
    ) -> Result<Vec<Result<Beat>>> {
        let now = self.now();
        let deadline = self.deadline(now).to_string();
        let now = now.to_string();
        let groups = self.by_shard(beats.iter().map(|(lease, ..)| lease.pid));
        let (now, deadline) = (&now, &deadline);
        let calls = groups.iter().map(|(shard, chunk)| async move {
            let keys = &self.keys[*shard];
            let mut args = Vec::with_capacity(2 + chunk.len() * 4);
            args.push(now.clone());
            args.push(deadline.clone());
            for &i in chunk {
                let (lease, progress, next) = beats[i];
                args.push(if pieces {
                    piece_field(lease.pid, lease.min_id)
                } else {
                    lease.pid.to_string()
                });
                args.push(lease.token.to_string());
                args.push(progress.to_string());
                args.push(next.map(|n| n.to_string()).unwrap_or_default());
            }
            // Bytes, not strings: a `!` reply quotes a corrupt record, which may not be
            // UTF-8, and must not fail the shard's other leases with it.
            let reply: Result<Vec<Vec<u8>>> = if pieces {
                self.invoke(
                    script,
                    &[
                        &keys.pieces,
                        &keys.piece_pending,
                        &keys.piece_leases,
                        &keys.splits,
                    ],
                    &args,
                )
                .await
            } else {
                self.invoke(
                    script,
                    &[
                        &keys.active,
                        &keys.leases,
                        &keys.counts,
                        &keys.splits,
                        &keys.pieces,
                        &keys.piece_pending,
                        &keys.runs,
                    ],
                    &args,
                )
                .await
            };
            (chunk, reply)
        });
        let mut out: Vec<Option<Result<Beat>>> = (0..beats.len()).map(|_| None).collect();
        for (chunk, reply) in join_all(calls).await {
            match reply {
                Ok(codes) => {
                    for (&i, code) in chunk.iter().zip(codes) {
                        out[i] = Some(beat_code(&String::from_utf8_lossy(&code), beats[i].0));
                    }
                }
                // A failed call fails its own leases only: the other shards' renewed.
                Err(err) => {
                    let err = Arc::new(err);
                    for &i in chunk {
                        out[i] = Some(Err(Error::Shared(err.clone())));
                    }
                }
            }
        }
        out.into_iter()
            .zip(beats)
            .map(|(o, (lease, ..))| {
                o.ok_or_else(|| Error::Corrupt {
                    key: self.keys_of(lease.pid).active.clone(),
                    detail: "beat script replied for fewer leases than sent".into(),
                })
            })
            .collect()
    }

    /// Every split entry and piece of every shard, as read: (pid, entry) and
    /// (`pid:start`, record) pairs.
    async fn split_state(&self) -> Result<Vec<(Pairs, Pairs)>> {
        let reads = self.keys.iter().map(|keys| async move {
            let entries: Pairs = retry(&self.conn, |mut conn| async move {
                conn.hgetall(&keys.splits).await
            })
            .await?;
            let pieces: Pairs = retry(&self.conn, |mut conn| async move {
                conn.hgetall(&keys.pieces).await
            })
            .await?;
            Ok::<_, Error>((entries, pieces))
        });
        join_all(reads).await.into_iter().collect()
    }
}

/// A split entry's fields this side reads: the request's part, the planned range, the
/// owner (from its completed-record prefix).
struct EntryRead {
    min_id: u64,
    max_id: u64,
    owner: String,
}

fn read_entry(pid: &str, s: &str) -> Result<EntryRead> {
    let corrupt = || Error::Corrupt {
        key: format!("splits {pid}"),
        detail: format!("split entry `{s}`"),
    };
    let f: Vec<&str> = s.splitn(11, '|').collect();
    if f.len() != 11 {
        return Err(corrupt());
    }
    let record = format!("{},\"completed_at\":0,\"duration\":0}}", f[10]);
    let owner = tranche_codec::decode_json(&record)
        .map(|r| r.worker.to_string())
        .map_err(|_| corrupt())?;
    Ok(EntryRead {
        min_id: f[8].parse().map_err(|_| corrupt())?,
        max_id: f[9].parse().map_err(|_| corrupt())?,
        owner,
    })
}

#[async_trait]
impl<C> Splits for RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn split_candidates(&self) -> Result<Vec<Running>> {
        let snapshot = self.all_active().await?;
        let state = self.split_state().await?;
        let mut entries = std::collections::HashMap::new();
        let mut out = Vec::new();
        for (shard_entries, pieces) in &state {
            for (pid, e) in shard_entries {
                let pid_n: u64 = parse_u64(pid, "splits pid")?;
                entries.insert(pid_n, read_entry(pid, e)?);
            }
            for (field, rec) in pieces {
                let (pid, start) = field
                    .split_once(':')
                    .and_then(|(p, s)| Some((p.parse::<u64>().ok()?, s.parse::<u64>().ok()?)))
                    .ok_or_else(|| Error::Corrupt {
                        key: "pieces".into(),
                        detail: format!("piece field `{field}`"),
                    })?;
                let p = record::parse(pid, rec, |_| None).ok_or_else(|| Error::Corrupt {
                    key: format!("pieces {field}"),
                    detail: format!("not a record `{rec}`"),
                })?;
                let (Status::Running, Some(token)) = (p.status, p.lease_token) else {
                    continue;
                };
                let Some(e) = entries.get(&pid) else { continue };
                out.push(Running {
                    pid,
                    part: Part::Piece(start),
                    token,
                    worker: p.worker.clone().unwrap_or_default(),
                    max_id: p.max_id,
                    progress: p.progress,
                    partition_min: e.min_id,
                    partition_max: e.max_id,
                    owner: e.owner.clone(),
                    claimed_ms: p.claimed_at_ms,
                });
            }
        }
        for p in snapshot.partitions {
            let (Status::Running, Some(token)) = (p.status, p.lease_token) else {
                continue;
            };
            let worker = p.worker.clone().unwrap_or_default();
            let (partition_min, partition_max, owner) = match entries.get(&p.pid) {
                Some(e) => (e.min_id, e.max_id, e.owner.clone()),
                None => (p.min_id, p.max_id, worker.clone()),
            };
            out.push(Running {
                pid: p.pid,
                part: Part::Owner,
                token,
                worker,
                max_id: p.max_id,
                progress: p.progress,
                partition_min,
                partition_max,
                owner,
                claimed_ms: p.claimed_at_ms,
            });
        }
        out.sort_by_key(|r| (r.pid, r.part));
        Ok(out)
    }

    async fn request_pieces(
        &self,
        part: &Running,
        worker: &str,
        cuts: &[(u64, u64)],
    ) -> Result<SplitAnswer> {
        plans::check_worker(worker)?;
        crate::split::check_cuts(cuts)?;
        let Some(&(point, _)) = cuts.first() else {
            return Ok(SplitAnswer::TooSmall);
        };
        let list = |f: fn(&(u64, u64)) -> u64| {
            cuts.iter()
                .map(|c| f(c).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        // A split partition's record is its own: out of its run (if the owner part is
        // still held in one) before the request.
        if part.part == Part::Owner {
            self.carve_pids(&[part.pid]).await?;
        }
        let keys = self.keys_of(part.pid);
        // The completed record up to its completion time, which the last part adds.
        let record = tranche_codec::CompletedRecord {
            pid: part.pid,
            min_id: part.partition_min,
            max_id: part.partition_max,
            worker: part.owner.as_str().into(),
            completed_at_ms: 0,
            duration_ms: 0,
        };
        let json = tranche_codec::encode_json(&record);
        let prefix = json
            .rsplit_once(",\"completed_at\":")
            .map(|(head, _)| head.to_owned())
            .expect("the record names its completion time");
        let args = [
            part.pid.to_string(),
            match part.part {
                Part::Owner => "o".to_owned(),
                Part::Piece(start) => start.to_string(),
            },
            part.token.to_string(),
            list(|c| c.0),
            list(|c| c.1),
            worker.to_owned(),
            self.now().to_string(),
            self.config.lease.as_millis().to_string(),
            part.partition_min.to_string(),
            part.partition_max.to_string(),
            prefix,
        ];
        let reply: i64 = self
            .invoke(
                &SPLIT_REQUEST,
                &[&keys.active, &keys.splits, &keys.pieces],
                &args,
            )
            .await?;
        Ok(match reply {
            1 => SplitAnswer::Requested { point },
            -3 => SplitAnswer::Busy,
            -4 => SplitAnswer::TooSmall,
            _ => SplitAnswer::NotRunning,
        })
    }

    async fn beat_parts(&self, beats: &[PartBeat]) -> Result<Vec<Result<Beat>>> {
        let owners: Vec<usize> = (0..beats.len()).filter(|&i| !beats[i].piece).collect();
        let pieces: Vec<usize> = (0..beats.len()).filter(|&i| beats[i].piece).collect();
        let args = |of: &[usize]| -> Vec<(&Lease, u64, Option<u64>)> {
            of.iter()
                .map(|&i| (&beats[i].lease, beats[i].progress, beats[i].next))
                .collect()
        };
        let mut out: Vec<Option<Result<Beat>>> = (0..beats.len()).map(|_| None).collect();
        if !owners.is_empty() {
            let replies = self.beat_with(&HEARTBEAT, false, &args(&owners)).await?;
            for (&i, r) in owners.iter().zip(replies) {
                out[i] = Some(r);
            }
        }
        if !pieces.is_empty() {
            let replies = self.beat_with(&PIECE_BEAT, true, &args(&pieces)).await?;
            for (&i, r) in pieces.iter().zip(replies) {
                out[i] = Some(r);
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.expect("every beat answered"))
            .collect())
    }

    async fn claim_pieces(&self, worker: &str, n: usize) -> Result<Vec<Lease>> {
        plans::check_worker(worker)?;
        let now = self.now();
        let deadline = self.deadline(now);
        let mut out = Vec::new();
        for shard in self.layout.claim_order(worker, now) {
            if out.len() >= n {
                break;
            }
            let keys = &self.keys[shard as usize];
            let want = (n - out.len()).min(MAX_SCRIPT_BATCH);
            let args = [
                worker.to_owned(),
                want.to_string(),
                now.to_string(),
                deadline.to_string(),
            ];
            let reply: Vec<String> = self
                .invoke(
                    &PIECE_CLAIM,
                    &[
                        &keys.pieces,
                        &keys.piece_pending,
                        &keys.piece_leases,
                        &keys.seq,
                    ],
                    &args,
                )
                .await?;
            for f in reply.chunks(6) {
                let [pid, start, token, attempts, max, progress] = f else {
                    return Err(Error::Corrupt {
                        key: "piece claim reply".into(),
                        detail: "not six values a piece".into(),
                    });
                };
                let start = parse_u64(start, "piece start")?;
                let max_id = parse_u64(max, "piece max")?;
                if max_id < start {
                    return Err(Error::Corrupt {
                        key: format!("{} field {pid}:{start}", keys.pieces),
                        detail: format!("range {start}..={max_id} runs backwards"),
                    });
                }
                out.push(Lease {
                    pid: parse_u64(pid, "piece pid")?,
                    token: parse_u64(token, "piece token")?,
                    worker: worker.to_owned(),
                    min_id: start,
                    max_id,
                    attempt: parse_u64(attempts, "piece attempts")? as u32,
                    progress: parse_u64(progress, "piece progress")?,
                    deadline_ms: deadline,
                });
            }
        }
        Ok(out)
    }

    async fn complete_piece(&self, lease: &Lease) -> Result<PieceDone> {
        let keys = self.keys_of(lease.pid);
        let args = [
            self.now().to_string(),
            piece_field(lease.pid, lease.min_id),
            lease.token.to_string(),
            self.bit(lease.pid).to_string(),
        ];
        let reply: Vec<i64> = self
            .invoke(
                &PIECE_COMPLETE,
                &[
                    &keys.active,
                    &keys.index,
                    &keys.inbox,
                    &keys.counts,
                    &keys.splits,
                    &keys.pieces,
                    &keys.piece_leases,
                ],
                &args,
            )
            .await?;
        match reply.as_slice() {
            [1] => Ok(PieceDone::Done),
            [2] => {
                self.mark_dirty(&[self.layout.shard_of(lease.pid) as usize])
                    .await;
                Ok(PieceDone::Completed)
            }
            _ => Err(lost(lease)),
        }
    }

    async fn release_piece(&self, lease: &Lease, progress: u64) -> Result<()> {
        let keys = self.keys_of(lease.pid);
        let args = [
            self.now().to_string(),
            piece_field(lease.pid, lease.min_id),
            lease.token.to_string(),
            progress.to_string(),
        ];
        let reply: Vec<String> = self
            .invoke(
                &PIECE_RELEASE,
                &[&keys.pieces, &keys.piece_pending, &keys.piece_leases],
                &args,
            )
            .await?;
        if reply.is_empty() {
            return Err(lost(lease));
        }
        Ok(())
    }

    async fn fail_piece(
        &self,
        lease: &Lease,
        progress: u64,
        error: &str,
        policy: FailPolicy,
    ) -> Result<FailOutcome> {
        let mut args = vec![
            "fail".to_owned(),
            piece_field(lease.pid, lease.min_id),
            lease.token.to_string(),
            progress.to_string(),
            error.to_owned(),
            self.config.backoff_base.as_millis().to_string(),
            self.config.backoff_max.as_millis().to_string(),
        ];
        args.push(policy_arg(policy));
        let reply: Vec<i64> = self.piece_fail(self.keys_of(lease.pid), args).await?;
        match reply.as_slice() {
            [OK, -1] => Ok(FailOutcome::Failed),
            [OK, ready] => Ok(FailOutcome::Retry {
                ready_at_ms: *ready as u64,
            }),
            _ => Err(lost(lease)),
        }
    }

    async fn pieces(&self, pid: u64) -> Result<Vec<Piece>> {
        let keys = self.keys_of(pid);
        let all: Pairs = retry(&self.conn, |mut conn| async move {
            conn.hgetall(&keys.pieces).await
        })
        .await?;
        let prefix = format!("{pid}:");
        let mut out = Vec::new();
        for (field, rec) in all {
            let Some(start) = field.strip_prefix(&prefix) else {
                continue;
            };
            let start = parse_u64(start, "piece start")?;
            let p = record::parse(pid, &rec, |_| None).ok_or_else(|| Error::Corrupt {
                key: format!("{} field {field}", keys.pieces),
                detail: format!("not a record `{rec}`"),
            })?;
            out.push(Piece {
                pid,
                start,
                max_id: p.max_id,
                status: p.status,
                worker: p.worker,
                progress: p.progress,
                attempts: p.attempts,
            });
        }
        out.sort_by_key(|p| p.start);
        Ok(out)
    }
}

impl<C> RedisActiveStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `piece_fail.lua` on `keys`' shard, in `mode` with its arguments (`rest`, the
    /// mode first): the time and the attempts allowed go before them.
    async fn piece_fail<T: redis::FromRedisValue>(
        &self,
        keys: &ShardKeys,
        rest: Vec<String>,
    ) -> Result<T> {
        let mut args = vec![self.now().to_string(), self.config.max_attempts.to_string()];
        args.extend(rest);
        self.invoke(
            &PIECE_FAIL,
            &[
                &keys.pieces,
                &keys.piece_pending,
                &keys.piece_leases,
                &keys.splits,
                &keys.active,
                &keys.leases,
                &keys.pending,
                &keys.counts,
            ],
            &args,
        )
        .await
    }

    /// Piece leases of every shard whose holder is gone (`piece_fail.lua`): every one
    /// expired by now (`worker` `None`), or every one `worker` holds. Each is pending
    /// again from its checkpoint, its attempt counted, or fails its partition on its
    /// last attempt. Returns the pids of the pieces pending again, once each.
    pub(super) async fn expire_pieces(&self, worker: Option<&str>) -> Result<Vec<u64>> {
        let rest = match worker {
            None => vec!["reap".to_owned()],
            Some(worker) => vec!["worker".to_owned(), worker.to_owned()],
        };
        let calls = self
            .keys
            .iter()
            .map(|keys| self.piece_fail::<Vec<String>>(keys, rest.clone()));
        let mut out = Vec::new();
        for reply in join_all(calls).await {
            for field in reply? {
                let pid = field.split_once(':').map_or(field.as_str(), |(pid, _)| pid);
                out.push(parse_u64(pid, "piece pid")?);
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// A failure's policy as the fail scripts take it: empty is the ordinary backoff.
pub(super) fn policy_arg(policy: FailPolicy) -> String {
    if policy.permanent {
        "permanent".to_owned()
    } else if let Some(after) = policy.retry_after {
        after.as_millis().min(MAX_DELAY_MS).to_string()
    } else {
        String::new()
    }
}

/// The longest retry delay sent to a fail script, ms (ten years): well within what a
/// Lua number holds exactly, whatever a caller asks for.
const MAX_DELAY_MS: u128 = 10 * 365 * 24 * 3600 * 1000;
