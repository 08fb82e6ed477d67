//! The oracles: what the ledgers, the statistics, `check` and the `health` samples say
//! at the end, as one JSON report, beside the timeline.

use super::*;

impl Soak {
    /// The oracles, the report and the timeline.
    pub(super) fn judge(
        &mut self,
        drained: bool,
        fleet_end: f64,
        drain_s: f64,
        strays: Vec<(u32, String)>,
    ) -> Result<Json> {
        let run_end_us = now_us();
        let ledgers = ledger::read(&self.dir.join("ledger"));
        let (runs, bad_lines) = (&ledgers.runs, ledgers.bad);
        let planned_ids: u64 = self.planned.iter().map(|(a, b)| b - a + 1).sum();
        let planned_partitions = planned_ids / PARTITION;
        let (lost, gaps) = ledger::lost(runs, &self.planned);
        // Across a SIGSTOP too: a frozen worker's `--exec` chunks, which run on in
        // their own process groups, are stopped by their guards before its lease can
        // expire. A runner's handlers run nothing while it is frozen and are not polled
        // again after a thaw past their lease: the ledger reads those runs as ended at
        // the freeze (unless they wrote an END after it).
        let lease_s = self.opts.lease.as_secs_f64();
        let frozen: Vec<(String, u64, u64)> = self
            .faults
            .iter()
            .filter(|f| f.kind == "stop" && f.healed.is_some_and(|h| h - f.at >= lease_s))
            .filter(|f| {
                self.incarnations
                    .iter()
                    .any(|i| i.name == f.target && i.kind == Kind::Runner)
            })
            .map(|f| {
                let us = |s: f64| self.t0_us + (s * 1e6) as u64;
                (f.target.clone(), us(f.at), us(f.healed.unwrap_or(f.at)))
            })
            .collect();
        let overlaps = ledger::overlaps(&ledgers, &self.incarnations, &frozen, run_end_us);
        let ended_at_a_freeze = ledger::ended_at_a_freeze(&ledgers, &frozen);
        let outlived = ledger::outlived(&ledgers, &self.incarnations);
        let (pieces, cuts) = self.splits_logged();
        let seconds = (fleet_end + drain_s).ceil() as usize + 1;
        let tput = ledger::throughput(runs, self.t0_us, seconds);
        report::recovery(&mut self.faults, &tput);
        self.panics_taken(&ledgers);
        let samples = self.health.lock().unwrap().clone();
        report::health_after(&mut self.faults, &samples);
        let health_rules = report::health_rules(&samples);

        // What the store says before any repair: judged as it is (a repair rebuilds the
        // statistics from the archive and would overwrite a double count).
        let check_before = self.tranche(&["check", "--json"])?;
        let stats_before = self.tranche(&["stats", "--json"])?.1;
        // What an operator does once `health` named the damage: check, repair, then
        // archive what the damage held back. Only then is everything counted.
        let repair = self.tranche(&["check", "--repair", "--json"])?;
        let _ = self.tranche(&["archive"]);
        let stats = self.tranche(&["stats", "--json"])?.1;
        let count = |stats: &str| {
            let stats = Json::parse(stats).unwrap_or(Json::Null);
            let at = |field| {
                stats
                    .at(&["completed", "global_stats", field])
                    .and_then(Json::as_u64)
            };
            (at("total_completed"), at("total_processed_data"))
        };
        let (counted, counted_ids) = count(&stats);
        let (counted_before, ids_before) = count(&stats_before);
        // The drain's own repair, if it made one, came before the end: what it found
        // then is judged too (a partition counted twice by then was still counted twice).
        let (counted_at_drain, _) = self
            .pre_repair
            .as_ref()
            .map_or((None, None), |(_, stats)| count(stats));
        let harmed = self.harmed_keys();
        let stats_harmed = self
            .faults
            .iter()
            .any(|f| f.kind == "corrupt-stats" && f.missed.is_none());
        let check_after = self.tranche(&["check", "--json"])?;
        let mut health_args = vec!["health"];
        health_args.extend(HEALTH);
        let health_end = self.tranche(&health_args)?;
        let final_status = self.status().unwrap_or(Json::Null);
        // Damage holds its shard's records back until the repair above: what counts is
        // that everything is archived once the operator has done what health asked.
        let drained = drained || {
            let archived = final_status.get("archived").and_then(Json::as_u64);
            let inbox = final_status.get("inbox").and_then(Json::as_u64);
            archived == Some(planned_partitions) && inbox == Some(0)
        };

        let mut oracles: Vec<(String, Json)> = Vec::new();
        let mut oracle = |name: &str, pass: bool, detail: Json| {
            oracles.push((
                name.to_owned(),
                Json::obj([("pass", Json::from(pass)), ("detail", detail)]),
            ));
        };
        let requested: Vec<Json> = self
            .opts
            .faults
            .iter()
            .filter(|k| {
                !self.faults.iter().any(|f| {
                    f.missed.is_none()
                        && (f.kind == **k || (*k == "proxy" && f.kind.starts_with("proxy-")))
                })
            })
            .map(|k| Json::from(k.clone()))
            .collect();
        let not_taken: Vec<Json> = self
            .faults
            .iter()
            .filter_map(|f| {
                let why = f.missed.as_ref()?;
                Some(Json::from(format!("{} at {:.1} s: {why}", f.kind, f.at)))
            })
            .collect();
        oracle(
            "every_fault_injected",
            requested.is_empty() && not_taken.is_empty(),
            Json::obj([
                ("kinds_never_in_effect", Json::Arr(requested)),
                ("faults_not_in_effect", Json::Arr(not_taken)),
            ]),
        );
        oracle(
            "no_worker_exit_uncaused",
            self.unexpected_exits.is_empty(),
            Json::Arr(
                self.unexpected_exits
                    .iter()
                    .cloned()
                    .map(Json::from)
                    .collect(),
            ),
        );
        oracle(
            "ledger_lines_whole",
            bad_lines == 0,
            Json::obj([
                ("torn", Json::from(bad_lines)),
                (
                    "first_torn",
                    Json::Arr(ledgers.torn.iter().cloned().map(Json::from).collect()),
                ),
                // An end line with no START open before it: a chunk's KILL trap after
                // its END, or an orphan's line after its run was closed.
                ("unpaired_end_lines", Json::from(ledgers.unpaired)),
            ]),
        );
        oracle(
            "every_id_processed",
            lost == 0,
            Json::obj([
                ("ids_planned", Json::from(planned_ids)),
                ("ids_lost", Json::from(lost)),
                (
                    "first_gaps",
                    Json::Arr(
                        gaps.iter()
                            .map(|(a, b)| Json::from(format!("{a}..={b}")))
                            .collect(),
                    ),
                ),
            ]),
        );
        oracle(
            "everything_archived_after_the_faults",
            drained,
            Json::obj([
                ("drain_deadline_s", Json::from(self.opts.drain.as_secs())),
                ("drain_s", Json::from(drain_s)),
                ("final_status", final_status.clone()),
            ]),
        );
        if self.opts.profile == Profile::Splits {
            // The profile is there to put faults on split partitions: a run that never
            // split tested nothing of the kind.
            oracle(
                "partitions_were_split",
                pieces > 0 && cuts > 0,
                Json::obj([
                    ("pieces_claimed", Json::from(pieces)),
                    ("cuts_taken_by_holders", Json::from(cuts)),
                ]),
            );
        }
        let same_worker = overlaps.iter().filter(|o| o.a.worker == o.b.worker).count();
        oracle(
            "no_range_run_twice_at_once",
            overlaps.is_empty(),
            Json::obj([
                ("overlaps", Json::from(overlaps.len() as u64)),
                ("of_one_worker", Json::from(same_worker as u64)),
                (
                    "examples",
                    Json::Arr(
                        overlaps
                            .iter()
                            .take(5)
                            .map(|o| describe(&ledgers, o))
                            .collect(),
                    ),
                ),
                (
                    "runner_runs_ended_at_a_freeze",
                    Json::from(ended_at_a_freeze),
                ),
            ]),
        );
        // Each throttle's window, from its grace after `throttle on` to `throttle off`
        // (seconds since the start), and the chunks the ledgers show starting in one.
        let grace = faults::THROTTLE_GRACE.as_secs_f64();
        let windows: Vec<(f64, f64)> = self
            .faults
            .iter()
            .filter(|f| f.kind == "throttle" && f.missed.is_none())
            .filter_map(|f| Some((f.at + grace, f.healed?)))
            .filter(|(from, to)| from < to)
            .collect();
        let secs_of = |us: u64| (us as f64 - self.t0_us as f64) / 1e6;
        let throttled_starts: Vec<&ledger::ChunkRun> = runs
            .iter()
            .filter(|r| {
                let at = secs_of(r.start_us);
                windows.iter().any(|&(from, to)| at >= from && at <= to)
            })
            .collect();
        oracle(
            "no_chunk_starts_while_throttled",
            throttled_starts.is_empty(),
            Json::obj([
                ("grace_s", Json::from(grace)),
                (
                    "windows",
                    Json::Arr(
                        windows
                            .iter()
                            .map(|(a, b)| Json::from(format!("{a:.1}..{b:.1} s")))
                            .collect(),
                    ),
                ),
                ("chunks_started", Json::from(throttled_starts.len() as u64)),
                (
                    "examples",
                    Json::Arr(
                        throttled_starts
                            .iter()
                            .take(5)
                            .map(|r| {
                                Json::from(format!(
                                    "{} ids {}..={} started at {:.2} s",
                                    ledgers.worker(r),
                                    r.from,
                                    r.to,
                                    secs_of(r.start_us)
                                ))
                            })
                            .collect(),
                    ),
                ),
            ]),
        );
        oracle(
            "no_chunk_outlives_its_worker",
            outlived.is_empty() && self.orphans.is_empty(),
            Json::obj([
                (
                    "processes_alive_after_a_kill",
                    Json::Arr(self.orphans.iter().cloned().map(Json::from).collect()),
                ),
                ("chunks", Json::from(outlived.len() as u64)),
                ("examples", Json::Arr(outlived.iter().take(5).map(|(r, dead)| {
                    Json::from(format!(
                        "{} chunk pid {} ids {}..={}: {} {:.0} ms after its worker died",
                        ledgers.worker(r), r.chunk_pid, r.from, r.to, r.end.name(),
                        (r.end_us.unwrap_or(r.start_us) as f64 - *dead as f64) / 1000.0
                    ))
                }).collect())),
            ]),
        );
        // Before the repair: exactly the plan, unless the harness damaged the statistics
        // (then they cannot be read as they are, and only the repaired count is judged)
        // and never more than the plan at the drain's repair.
        let once_before =
            counted_before == Some(planned_partitions) && ids_before == Some(planned_ids);
        let once_after = counted == Some(planned_partitions) && counted_ids == Some(planned_ids);
        let not_over_at_drain = counted_at_drain.is_none_or(|c| c <= planned_partitions);
        oracle(
            "each_partition_counted_once",
            (once_before || (stats_harmed && once_after)) && not_over_at_drain,
            Json::obj([
                ("planned", Json::from(planned_partitions)),
                (
                    "counted_before_repair",
                    counted_before.map_or(Json::Null, Json::from),
                ),
                (
                    "ids_counted_before_repair",
                    ids_before.map_or(Json::Null, Json::from),
                ),
                (
                    "counted_at_the_drains_repair",
                    counted_at_drain.map_or(Json::Null, Json::from),
                ),
                (
                    "statistics_damaged_by_the_harness",
                    Json::from(stats_harmed),
                ),
                (
                    "counted_after_repair",
                    counted.map_or(Json::Null, Json::from),
                ),
                (
                    "ids_counted_after_repair",
                    counted_ids.map_or(Json::Null, Json::from),
                ),
                (
                    "double_counted",
                    Json::from(
                        counted_before
                            .max(counted_at_drain)
                            .unwrap_or(0)
                            .saturating_sub(planned_partitions),
                    ),
                ),
            ]),
        );
        let mut not_ours = unexplained(&check_before.1, &harmed, stats_harmed);
        if let Some((check, _)) = &self.pre_repair {
            not_ours.extend(unexplained(check, &harmed, stats_harmed));
        }
        oracle(
            "check_clean_before_repair",
            not_ours.is_empty(),
            Json::obj([
                (
                    "not_the_harness_damage",
                    Json::Arr(not_ours.into_iter().map(Json::from).collect()),
                ),
                (
                    "harness_damaged",
                    Json::Arr(harmed.iter().map(|k| Json::from(k.clone())).collect()),
                ),
                (
                    "at_the_drains_repair",
                    self.pre_repair.as_ref().map_or(Json::Null, |(c, _)| {
                        Json::parse(c).unwrap_or(Json::from(c.clone()))
                    }),
                ),
            ]),
        );
        oracle(
            "check_clean_after_repair",
            check_after.0 && clean(&check_after.1),
            Json::obj([
                (
                    "before",
                    Json::parse(&check_before.1).unwrap_or(Json::from(check_before.1.clone())),
                ),
                (
                    "repair",
                    Json::parse(&repair.1).unwrap_or(Json::from(repair.1.clone())),
                ),
                (
                    "after",
                    Json::parse(&check_after.1).unwrap_or(Json::from(check_after.1.clone())),
                ),
            ]),
        );
        let damage = || {
            self.faults
                .iter()
                .filter(|f| faults::damage(&f.kind) && f.missed.is_none())
        };
        let name = |f: &Fault| Json::from(format!("{} at {:.1} s", f.kind, f.at));
        // A corrupt value a live writer overwrote before the heal is gone before
        // `health` could see it: dropped, not judged.
        let judged = || damage().filter(|f| !f.health_masked && f.persisted != Some(false));
        let missed: Vec<Json> = judged()
            .filter(|f| f.health_fired_after_s.is_none())
            .map(name)
            .collect();
        let masked: Vec<Json> = damage().filter(|f| f.health_masked).map(name).collect();
        let dropped: Vec<Json> = damage()
            .filter(|f| f.persisted == Some(false))
            .map(name)
            .collect();
        let asked = self.opts.faults.iter().any(|k| faults::damage(k));
        let seen = judged().count();
        oracle(
            "health_fired_on_damage",
            missed.is_empty() && (seen > 0 || !asked),
            Json::obj([
                ("judged", Json::from(seen as u64)),
                ("missed", Json::Arr(missed)),
                ("masked_by_an_earlier_alert_of_its_rule", Json::Arr(masked)),
                ("overwritten_before_the_heal", Json::Arr(dropped)),
            ]),
        );
        let end_firing = firing(&health_end.1);
        oracle(
            "health_true_at_end",
            // Clear when everything is archived; firing when something is stuck.
            match &end_firing {
                Some(rules) => rules.is_empty() == drained && health_end.0 == drained,
                None => false,
            },
            Json::obj([
                ("everything_archived", Json::from(drained)),
                (
                    "firing",
                    end_firing.map_or(Json::from(health_end.1.clone()), |v| {
                        Json::Arr(v.into_iter().map(Json::from).collect())
                    }),
                ),
            ]),
        );
        let slow: Vec<Json> = self
            .faults
            .iter()
            .filter(|f| faults::transient(&f.kind) && f.recovery_s.is_none_or(|r| r > 10.0))
            .map(|f| {
                Json::from(format!(
                    "{} at {:.1} s: {}",
                    f.kind,
                    f.at,
                    f.recovery_s.map_or("never".into(), |r| format!("{r:.1} s"))
                ))
            })
            .collect();
        oracle(
            "throughput_back_within_10s",
            slow.is_empty(),
            Json::obj([("slow", Json::Arr(slow))]),
        );
        oracle(
            "no_stray_processes",
            strays.is_empty(),
            Json::Arr(
                strays
                    .iter()
                    .map(|(p, c)| Json::from(format!("{p}: {c}")))
                    .collect(),
            ),
        );
        let redis_mib = self.max_redis_bytes / (1 << 20);
        let rss_mib = self.max_rss_kib / 1024;
        let runner_mib = self.max_runner_rss_kib / 1024;
        oracle(
            "memory_bounded",
            redis_mib <= self.opts.max_redis_mib
                && rss_mib.max(runner_mib) <= self.opts.max_rss_mib,
            Json::obj([
                ("redis_used_memory_max_mib", Json::from(redis_mib)),
                ("redis_limit_mib", Json::from(self.opts.max_redis_mib)),
                ("tranche_run_rss_max_mib", Json::from(rss_mib)),
                ("runner_rss_max_mib", Json::from(runner_mib)),
                ("worker_limit_mib", Json::from(self.opts.max_rss_mib)),
            ]),
        );

        if self.opts.embedded {
            let (pass, detail) = self.state_damage_survived();
            oracle("state_damage_detected_and_survived", pass, detail);
        }

        report::svg(
            &self.dir.join("timeline.svg"),
            &tput,
            &self.faults,
            fleet_end,
            self.opts.seed,
        )?;
        // While the fleet ran with faults: the drain's work is not in it.
        let during = (fleet_end as usize).min(tput.len());
        let ids_per_s = tput[..during].iter().sum::<f64>() / (during.max(1) as f64);
        let recoveries: Vec<f64> = self.faults.iter().filter_map(|f| f.recovery_s).collect();
        Ok(Json::obj([
            ("seed", Json::from(self.opts.seed)),
            (
                "topology",
                Json::from(if self.opts.embedded {
                    "embedded: one process and its state file"
                } else if self.opts.cluster {
                    "cluster 3+3"
                } else {
                    "one redis behind the proxy"
                }),
            ),
            ("duration_s", Json::from(self.opts.duration.as_secs())),
            ("interval_s", Json::from(self.opts.interval.as_secs())),
            ("drain_s", Json::from(drain_s)),
            ("exec_workers", Json::from(self.opts.workers as u64)),
            ("runners", Json::from(self.opts.runners as u64)),
            (
                "runner_concurrency",
                Json::from(self.opts.runner_concurrency as u64),
            ),
            ("profile", Json::from(self.opts.profile.name())),
            ("partitions_planned", Json::from(planned_partitions)),
            (
                "splits",
                Json::obj([
                    ("pieces_claimed", Json::from(pieces)),
                    ("cuts_taken_by_holders", Json::from(cuts)),
                ]),
            ),
            ("chunk_runs", Json::from(runs.len() as u64)),
            (
                "partitions_per_s_mean",
                Json::from(ids_per_s / PARTITION as f64),
            ),
            ("bad_ledger_lines", Json::from(bad_lines)),
            ("throughput_ids_per_s_mean", Json::from(ids_per_s)),
            ("faults_by_kind", report::by_kind(&self.faults)),
            (
                "recovery_s",
                Json::obj([
                    ("p50", report::pct(&recoveries, 0.5)),
                    ("p99", report::pct(&recoveries, 0.99)),
                ]),
            ),
            (
                "faults",
                Json::Arr(self.faults.iter().map(report::fault).collect()),
            ),
            ("health_samples", health_rules),
            (
                "incarnations",
                Json::Arr(
                    self.incarnations
                        .iter()
                        .map(|i| {
                            Json::from(format!(
                                "{} ({}) pid {} from {:.1} s to {}: {}",
                                i.name,
                                match i.kind {
                                    Kind::Exec => "tranche run --exec",
                                    Kind::Runner => "runner",
                                },
                                i.pid,
                                i.started_us.saturating_sub(self.t0_us) as f64 / 1e6,
                                i.ended_us.map_or("the end".into(), |e| format!(
                                    "{:.1} s",
                                    e.saturating_sub(self.t0_us) as f64 / 1e6
                                )),
                                if i.end.is_empty() {
                                    "ran to the end"
                                } else {
                                    &i.end
                                }
                            ))
                        })
                        .collect(),
                ),
            ),
            (
                "unexpected_exits",
                Json::Arr(
                    self.unexpected_exits
                        .iter()
                        .cloned()
                        .map(Json::from)
                        .collect(),
                ),
            ),
            ("final_status", final_status),
            ("oracles", Json::Obj(oracles)),
        ]))
    }
}

fn describe(ledgers: &ledger::Ledgers, o: &ledger::Overlap) -> Json {
    Json::from(format!(
        "partition {} ids {}..={} by {} (chunk pid {}, {}) and {}..={} by {} (chunk pid {}, {}): {:.0} ms together",
        o.a.partition,
        o.a.from,
        o.a.to,
        ledgers.worker(&o.a),
        o.a.chunk_pid,
        o.a.end.name(),
        o.b.from,
        o.b.to,
        ledgers.worker(&o.b),
        o.b.chunk_pid,
        o.b.end.name(),
        o.both_ms
    ))
}

/// The rules firing in a `health --json` reply (None when it is no such reply).
pub(super) fn firing(out: &str) -> Option<Vec<String>> {
    let Json::Arr(rules) = Json::parse(out)? else {
        return None;
    };
    Some(
        rules
            .iter()
            .filter(|r| r.get("firing") == Some(&Json::Bool(true)))
            .filter_map(|r| match r.get("rule") {
                Some(Json::Str(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
    )
}

impl Soak {
    /// Matches the ledgers' PANIC lines to the `panic` faults that took effect, in
    /// order: a fault with no PANIC line after it (the trigger never taken, or taken
    /// and not written) did not take effect.
    fn panics_taken(&mut self, ledgers: &ledger::Ledgers) {
        let mut panics: Vec<u64> = ledgers
            .runs
            .iter()
            .filter(|r| r.end == ledger::Ending::Panic)
            .filter_map(|r| r.end_us)
            .collect();
        panics.sort_unstable();
        let t0 = self.t0_us;
        let mut next = panics.into_iter().peekable();
        for f in self
            .faults
            .iter_mut()
            .filter(|f| f.kind == "panic" && f.missed.is_none())
        {
            let at = t0 + (f.at * 1e6) as u64;
            while next.next_if(|&t| t < at).is_some() {}
            if next.next().is_none() {
                f.missed = Some("no PANIC line in any ledger after it".into());
            }
        }
    }

    /// The keys (and hash fields) the harness's corruption reached: `key` or
    /// `key field`.
    fn harmed_keys(&self) -> Vec<String> {
        self.faults
            .iter()
            .filter(|f| faults::damage(&f.kind) && f.missed.is_none())
            .map(|f| f.target.clone())
            .collect()
    }
}

/// What a `check --json` reply finds that the harness did not damage: a difference
/// whose path names none of `harmed` (an active record's path names its key), damaged
/// statistics unless the harness damaged them (`stats_harmed`), a dead letter, or no
/// such reply at all.
fn unexplained(out: &str, harmed: &[String], stats_harmed: bool) -> Vec<String> {
    let Some(v) = Json::parse(out) else {
        return vec![format!(
            "not a check reply: {}",
            out.chars().take(300).collect::<String>()
        )];
    };
    let mut found = Vec::new();
    if let Some(Json::Arr(diffs)) = v.get("differences") {
        for d in diffs {
            let path = match d.get("path") {
                Some(Json::Str(p)) => p.clone(),
                _ => String::new(),
            };
            if !harmed
                .iter()
                .any(|k| !k.is_empty() && path.contains(k.as_str()))
            {
                found.push(format!("difference {}", d.pretty().trim()));
            }
        }
    }
    if let Some(Json::Arr(damaged)) = v.get("damaged")
        && !damaged.is_empty()
        && !stats_harmed
    {
        found.push(format!("{} damaged statistics value(s)", damaged.len()));
    }
    if let Some(n) = v.at(&["dead_letters", "found"]).and_then(Json::as_u64)
        && n > 0
    {
        found.push(format!("{n} dead letter(s)"));
    }
    found
}

/// Whether a `check --json` reply reports no difference and no dead letter.
impl Soak {
    /// Pieces of split partitions the exec workers claimed, and cuts their beats took
    /// (a holder giving up the rest of its range), from their logs (the workers log
    /// both at `info` for `tranche_worker::work::split` and `tranche_worker::held`).
    fn splits_logged(&self) -> (u64, u64) {
        let (mut pieces, mut cuts) = (0, 0);
        let Ok(dir) = std::fs::read_dir(self.dir.join("logs")) else {
            return (0, 0);
        };
        for entry in dir.flatten() {
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            pieces += log.matches("claimed a piece of a split partition").count() as u64;
            cuts += log
                .matches("the rest of the range went to another worker")
                .count() as u64;
        }
        (pieces, cuts)
    }
}

fn clean(out: &str) -> bool {
    let Some(v) = Json::parse(out) else {
        return false;
    };
    v.get("differences") == Some(&Json::Arr(vec![]))
        && v.at(&["dead_letters", "found"]).and_then(Json::as_u64) == Some(0)
}

impl Soak {
    /// Per `corrupt-state` fault: the next start of the process said, in one line
    /// naming the file, that the file is corrupt and that it resumed from the previous
    /// generation (the ledger oracles then show that nothing was lost and nothing
    /// counted twice). A start that refused to run would show as an unexpected exit.
    fn state_damage_survived(&self) -> (bool, Json) {
        let mut missed = Vec::new();
        let mut seen = Vec::new();
        for f in self.faults.iter().filter(|f| f.kind == "corrupt-state") {
            let at_us = self.t0_us + (f.at * 1e6) as u64;
            let next = self.incarnations.iter().find(|i| i.started_us > at_us);
            let said = next.and_then(|i| {
                let log =
                    std::fs::read_to_string(self.dir.join("logs").join(format!("{}.log", i.name)))
                        .unwrap_or_default();
                log.lines()
                    .find(|l| l.contains("is corrupt") && l.contains("previous generation"))
                    .map(|l| format!("{}: {}", i.name, l.trim()))
            });
            match said {
                Some(line) => seen.push(Json::from(line)),
                None => missed.push(Json::from(format!(
                    "corrupt-state at {:.1} s ({}): {}",
                    f.at,
                    f.note,
                    next.map_or("no start after it".to_owned(), |i| format!(
                        "{} said nothing of it",
                        i.name
                    ))
                ))),
            }
        }
        (
            missed.is_empty(),
            Json::obj([
                ("missed", Json::Arr(missed)),
                ("fell_back", Json::Arr(seen)),
            ]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before a repair, `check` may name only what the harness damaged.
    #[test]
    fn check_before_repair_excuses_only_the_harness_damage() {
        let reply = |diff: &str, damaged: &str, dead: u64| {
            format!(
                r#"{{"records": 9, "differences": [{diff}], "repaired": false,
                "dead_letters": {{"found": {dead}}}, "damaged": [{damaged}], "rebuilt": []}}"#
            )
        };
        let active = r#"{"path": "active_records.shard0.17 ({soak:0}:active)", "expected": "a record", "found": "x"}"#;
        let harmed = vec!["{soak:0}:active".to_owned()];
        assert!(unexplained(&reply(active, "", 0), &harmed, false).is_empty());
        assert_eq!(unexplained(&reply(active, "", 0), &[], false).len(), 1);
        let count = r#"{"path": "global_stats.total_completed", "expected": "9", "found": "10"}"#;
        assert_eq!(unexplained(&reply(count, "", 0), &harmed, true).len(), 1);
        let stats = r#"{"shard": 0}"#;
        assert!(unexplained(&reply("", stats, 0), &[], true).is_empty());
        assert_eq!(unexplained(&reply("", stats, 0), &[], false).len(), 1);
        assert_eq!(unexplained(&reply("", "", 2), &harmed, true).len(), 1);
        assert_eq!(unexplained("error: no Redis", &harmed, true).len(), 1);
    }
}
