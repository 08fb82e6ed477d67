//! `check`, `health` and `dead-letters`: what is wrong, and what was done about it.

use super::*;

/// `dead-letters`: one JSON object per line, or a table.
pub(crate) fn dead_letters(dead: &[DeadLetter], json: bool) -> String {
    if json {
        // One array, like every other list: `[]` says "none" in JSON too.
        return line(json!(dead));
    }
    if dead.is_empty() {
        return "no dead letters: every completed record was archived\n".to_owned();
    }
    let mut out = format!("{:>5}  {:<17}  {}\n", "shard", "entry", "reason / record");
    for d in dead {
        out.push_str(&format!(
            "{:>5}  {:<17}  {}\n{:>26}{}\n",
            d.shard,
            d.id,
            shown(&d.reason),
            "",
            shown(&d.record)
        ));
    }
    out
}

/// `check`.
pub(crate) fn check(
    differences: &[Difference],
    records: u64,
    dead: &DeadLetters,
    damaged: &Damaged,
    repaired: bool,
    json: bool,
) -> String {
    if json {
        let list: Vec<Value> = differences
            .iter()
            .map(|d| json!({"path": d.path, "expected": d.expected, "found": d.found}))
            .collect();
        let rebuilt: Vec<Value> = damaged
            .repaired
            .iter()
            .map(|r| {
                json!({
                    "shard": r.shard,
                    "quarantined": r.quarantined.len(),
                    "whole": r.whole,
                    "unreadable": r.unreadable,
                })
            })
            .collect();
        let mut letters = json!({"found": dead.found});
        if let Some(r) = &dead.redriven {
            letters["archived"] = json!(r.archived);
            letters["duplicates"] = json!(r.duplicates);
            letters["kept"] = json!(r.kept.len());
            letters["kept_letters"] = json!(r.kept);
        }
        return line(json!({
            "records": records,
            "differences": list,
            "repaired": repaired && !(differences.is_empty() && damaged.found.is_empty()),
            "dead_letters": letters,
            "damaged": damaged.found,
            "rebuilt": rebuilt,
        }));
    }
    let mut out = String::new();
    for d in &damaged.found {
        let _ = writeln!(out, "damaged: {}", shown(&d.to_string()));
    }
    for r in &damaged.repaired {
        let _ = writeln!(
            out,
            "shard {}: {} damaged value(s) quarantined in stats:quarantine, {}{}",
            r.shard,
            r.quarantined.len(),
            if r.whole {
                "the shard rebuilt from the archive"
            } else {
                "those values rebuilt from the archive"
            },
            match r.unreadable {
                0 => String::new(),
                n => format!(" ({n} archived record(s) could not be read and are missing)"),
            }
        );
    }
    if !damaged.found.is_empty() && damaged.repaired.is_empty() {
        let _ = writeln!(
            out,
            "{} damaged statistics value(s): the statistics of {} cannot be compared; `tranche check --repair` quarantines them and rebuilds from the archive",
            damaged.found.len(),
            shards_named(&damaged.found)
        );
    }
    match &dead.redriven {
        None if dead.found > 0 => {
            let _ = writeln!(
                out,
                "{} dead letter(s); `tranche check --repair` re-drives those archivable now",
                dead.found
            );
        }
        None => {}
        Some(r) => {
            let _ = writeln!(
                out,
                "dead letters: {} found, {} archived now, {} duplicate(s) dropped, {} kept",
                dead.found,
                r.archived,
                r.duplicates,
                r.kept.len()
            );
            for k in &r.kept {
                let _ = writeln!(
                    out,
                    "  kept shard {} {}: {}",
                    k.shard,
                    k.id,
                    shown(&k.reason)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "checked the statistics against {records} archived record(s), and the active counts against the active records"
    );
    if differences.is_empty() {
        if damaged.found.is_empty() || !damaged.repaired.is_empty() {
            out.push_str("consistent\n");
        }
        return out;
    }
    for d in differences {
        let _ = writeln!(
            out,
            "  {}: expected {}, found {}",
            d.path,
            d.expected.as_deref().unwrap_or("nothing"),
            d.found.as_deref().unwrap_or("nothing")
        );
    }
    let _ = writeln!(
        out,
        "{} difference(s){}",
        differences.len(),
        if repaired { "; repaired" } else { "" }
    );
    out
}

/// "shard 0" or "shards 0, 3": the shards `damage` names, each once.
pub(crate) fn shards_named(damage: &[tranche_stats::Damage]) -> String {
    let mut shards: Vec<u32> = damage.iter().map(|d| d.shard).collect();
    shards.sort_unstable();
    shards.dedup();
    let list: Vec<String> = shards.iter().map(u32::to_string).collect();
    format!(
        "shard{} {}",
        if list.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// `health`.
pub(crate) fn health(rules: &[Rule], json: bool) -> String {
    if json {
        let list: Vec<Value> = rules
            .iter()
            .map(|r| {
                let mut v = json!({"rule": r.name, "value": r.value, "threshold": r.threshold, "firing": r.firing()});
                if let Some(d) = &r.detail {
                    v["detail"] = json!(d);
                }
                v
            })
            .collect();
        return line(Value::Array(list));
    }
    let mut out = format!(
        "{:<24} {:>14} {:>14}  state\n",
        "rule", "value", "threshold"
    );
    for r in rules {
        let _ = writeln!(
            out,
            "{:<24} {:>14} {:>14}  {}",
            r.name,
            number(r.value),
            number(r.threshold),
            if r.firing() { "FIRING" } else { "ok" }
        );
        if let Some(d) = &r.detail {
            let _ = writeln!(out, "  {}", shown(d));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn damage(shard: u32) -> tranche_stats::Damage {
        tranche_stats::Damage {
            shard,
            hash: "ranges".into(),
            field: "0".into(),
            detail: "truncated at byte 1".into(),
        }
    }

    #[test]
    fn check_says_what_is_damaged_and_what_the_repair_did() {
        let none = DeadLetters::default();
        let found = Damaged {
            found: vec![damage(3), damage(0), damage(3)],
            repaired: Vec::new(),
        };
        let out = check(&[], 7, &none, &found, false, false);
        assert!(
            out.starts_with("damaged: shard 3 stats:ranges field \"0\": truncated at byte 1\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "3 damaged statistics value(s): the statistics of shards 0, 3 cannot be compared"
            ),
            "{out}"
        );
        assert!(!out.contains("consistent"), "{out}");
        let v: Value = serde_json::from_str(&check(&[], 7, &none, &found, false, true)).unwrap();
        assert_eq!(v["damaged"][1]["shard"], 0, "{v}");
        assert_eq!(v["repaired"], false, "{v}");

        let repaired = Damaged {
            found: vec![damage(0)],
            repaired: vec![tranche_stats::Repaired {
                shard: 0,
                quarantined: vec![damage(0)],
                whole: false,
                unreadable: 2,
            }],
        };
        let out = check(&[], 7, &none, &repaired, true, false);
        assert!(out.contains("shard 0: 1 damaged value(s) quarantined in stats:quarantine, those values rebuilt from the archive (2 archived record(s) could not be read and are missing)"), "{out}");
        assert!(out.ends_with("consistent\n"), "{out}");
        let v: Value = serde_json::from_str(&check(&[], 7, &none, &repaired, true, true)).unwrap();
        assert_eq!(
            v["rebuilt"][0],
            json!({"shard": 0, "quarantined": 1, "whole": false, "unreadable": 2})
        );
        assert_eq!(v["repaired"], true, "{v}");
    }

    #[test]
    fn a_firing_rule_says_what_it_points_at() {
        let rules = [
            Rule::new("archive_stalled_shards", 1.0, 0.0).detail(|| "shard 0\u{1b}".into()),
            Rule::new("statistics_damaged", 0.0, 0.0).detail(|| "never said".into()),
        ];
        assert!(rules[1].detail.is_none());
        let out = health(&rules, false);
        assert!(out.contains("FIRING\n  shard 0\\u{1b}\n"), "{out}");
        let v: Value = serde_json::from_str(&health(&rules, true)).unwrap();
        assert_eq!(v[0]["detail"], "shard 0\u{1b}");
        assert!(v[1].get("detail").is_none(), "{v}");
    }
}
