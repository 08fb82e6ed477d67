//! The report's derived figures (recovery times, health reaction) and the SVG timeline.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::faults::{self, Fault};
use super::json::Json;

/// The first seconds of a run, never part of a baseline: every slot starts on a short
/// chunk, so the fleet runs well above its steady rate until the rare long chunks have
/// taken their share of the slots (in the classic profile about 35 % of slot time, in
/// 25 s or so). A fault measured against that burst "never recovers".
pub(crate) const WARM_UP_S: usize = 25;

/// Per fault: seconds from its heal until a 3-second mean of the throughput is back to
/// 80 % of the median second of the 30 before it, the warm-up left out (None: never, or
/// no work before it to compare). The median, not the mean: the catch-up burst after an
/// earlier fault or a dip of a busy machine would move a mean.
pub(crate) fn recovery(faults: &mut [Fault], tput: &[f64]) {
    let mean = |a: usize, b: usize| -> f64 {
        let b = b.min(tput.len());
        if a >= b {
            return 0.0;
        }
        tput[a..b].iter().sum::<f64>() / (b - a) as f64
    };
    for f in faults.iter_mut() {
        let at = (f.at as usize).min(tput.len());
        let from = at.saturating_sub(30).max(WARM_UP_S.min(at));
        let mut before = tput[from..at].to_vec();
        if before.is_empty() {
            continue;
        }
        before.sort_by(f64::total_cmp);
        let baseline = before[before.len() / 2];
        if baseline <= 0.0 {
            continue;
        }
        let healed = f.healed.unwrap_or(f.at);
        let from = healed.floor() as usize;
        f.recovery_s = (from..tput.len().saturating_sub(2))
            .find(|&s| mean(s, s + 3) >= 0.8 * baseline)
            .map(|s| (s as f64 - healed).max(0.0));
    }
}

/// Per damage fault that took effect: seconds until the first health sample, within a
/// minute, in which a rule naming that damage fires ([`faults::rules`]: any other rule
/// says nothing of it); and whether such a rule was already firing in the last sample
/// before it (then a firing afterwards proves nothing about this fault: masked).
pub(crate) fn health_after(faults: &mut [Fault], samples: &[(f64, Option<Vec<String>>)]) {
    for f in faults
        .iter_mut()
        .filter(|f| faults::damage(&f.kind) && f.missed.is_none())
    {
        let rules = faults::rules(&f.kind);
        let names = |firing: &Option<Vec<String>>| {
            firing
                .as_ref()
                .is_some_and(|r| r.iter().any(|n| rules.contains(&n.as_str())))
        };
        f.health_masked = samples
            .iter()
            .rev()
            .find(|(t, firing)| *t < f.at && firing.is_some())
            .is_some_and(|(_, firing)| names(firing));
        f.health_fired_after_s = samples
            .iter()
            .find(|(t, firing)| *t >= f.at && *t <= f.at + 60.0 && names(firing))
            .map(|(t, _)| t - f.at);
    }
}

/// The health samples in short: how many answered, and per rule that fired, in how
/// many samples, first and last (seconds).
pub(crate) fn health_rules(samples: &[(f64, Option<Vec<String>>)]) -> Json {
    let mut rules: Vec<(String, u64, f64, f64)> = Vec::new();
    for (t, firing) in samples {
        for rule in firing.iter().flatten() {
            match rules.iter_mut().find(|r| r.0 == *rule) {
                Some(r) => {
                    r.1 += 1;
                    r.3 = *t;
                }
                None => rules.push((rule.clone(), 1, *t, *t)),
            }
        }
    }
    Json::obj([
        ("samples", Json::from(samples.len() as u64)),
        (
            "unanswered",
            Json::from(samples.iter().filter(|(_, f)| f.is_none()).count() as u64),
        ),
        (
            "firing",
            Json::obj(rules.into_iter().map(|(rule, n, first, last)| {
                (
                    rule,
                    Json::from(format!("{n} samples, {first:.0} s to {last:.0} s")),
                )
            })),
        ),
    ])
}

/// Faults counted by kind.
pub(crate) fn by_kind(faults: &[Fault]) -> Json {
    let mut kinds: Vec<(String, u64)> = Vec::new();
    for f in faults {
        match kinds.iter_mut().find(|(k, _)| *k == f.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((f.kind.clone(), 1)),
        }
    }
    kinds.sort();
    Json::obj(kinds.into_iter().map(|(k, n)| (k, Json::from(n))))
}

/// The `q` quantile (nearest rank), null when empty.
pub(crate) fn pct(values: &[f64], q: f64) -> Json {
    if values.is_empty() {
        return Json::Null;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Json::from(v[rank - 1])
}

/// One fault as the report lists it.
pub(crate) fn fault(f: &Fault) -> Json {
    let opt = |v: Option<f64>| v.map_or(Json::Null, Json::from);
    Json::obj([
        ("kind", Json::from(f.kind.clone())),
        ("at_s", Json::from(f.at)),
        ("healed_s", opt(f.healed)),
        ("target", Json::from(f.target.clone())),
        ("note", Json::from(f.note.clone())),
        ("recovery_s", opt(f.recovery_s)),
        ("health_fired_after_s", opt(f.health_fired_after_s)),
        (
            "corruption_persisted",
            f.persisted.map_or(Json::Null, Json::from),
        ),
        ("health_already_firing", Json::from(f.health_masked)),
        (
            "not_taken_effect",
            f.missed.clone().map_or(Json::Null, Json::from),
        ),
    ])
}

/// Throughput per second as a line, each fault a marked vertical line with its name.
pub(crate) fn svg(
    path: &Path,
    tput: &[f64],
    faults: &[Fault],
    fleet_end: f64,
    seed: u64,
) -> Result<()> {
    let (w, h, left, top, bottom) = (1200.0, 420.0, 70.0, 40.0, 60.0);
    let plot_w = w - left - 20.0;
    let plot_h = h - top - bottom;
    let n = tput.len().max(2) as f64;
    let max = tput.iter().copied().fold(1.0, f64::max) * 1.1;
    let x = |s: f64| left + s / (n - 1.0) * plot_w;
    let y = |v: f64| top + plot_h - v / max * plot_h;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="{left}" y="20" font-size="14">tranche soak, seed {seed}: IDs processed per second (END lines), faults marked</text>
"#
    );
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            left + plot_w,
            left - 5.0,
            y(v) + 4.0,
            y = y(v)
        );
    }
    let step = if n > 600.0 {
        120
    } else if n > 120.0 {
        30
    } else {
        10
    };
    for t in (0..tput.len()).step_by(step) {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t} s</text>"#,
            x(t as f64),
            top + plot_h + 16.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{x:.1}" x2="{x:.1}" y1="{top}" y2="{}" stroke="#888" stroke-dasharray="2,3"/><text x="{:.1}" y="{}" fill="#888">drain</text>"##,
        top + plot_h,
        x(fleet_end) + 3.0,
        top + 12.0,
        x = x(fleet_end)
    );
    for f in faults {
        let color = if faults::damage(&f.kind) {
            "#c00"
        } else if faults::transient(&f.kind) {
            "#d80"
        } else {
            "#06c"
        };
        let (x0, x1) = (x(f.at), x(f.healed.unwrap_or(f.at)));
        if x1 - x0 > 1.0 {
            let _ = writeln!(
                s,
                r#"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{plot_h}" fill="{color}" opacity="0.12"/>"#,
                x1 - x0
            );
        }
        let _ = writeln!(
            s,
            r#"<line x1="{x0:.1}" x2="{x0:.1}" y1="{top}" y2="{}" stroke="{color}"/><text transform="translate({:.1},{}) rotate(-90)" fill="{color}">{}</text>"#,
            top + plot_h,
            x0 - 3.0,
            top + plot_h - 4.0,
            f.kind
        );
    }
    let points: Vec<String> = tput
        .iter()
        .enumerate()
        .map(|(i, &v)| format!("{:.1},{:.1}", x(i as f64), y(v)))
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline fill="none" stroke="#222" stroke-width="1.5" points="{}"/>"##,
        points.join(" ")
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="{}">blue: worker faults, orange: transient (Redis, network), red: damage; shaded: until healed</text>
</svg>"##,
        h - 12.0
    );
    std::fs::write(path, s)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(at: f64, healed: f64) -> Fault {
        Fault {
            healed: Some(healed),
            ..Fault::new("redis-pause", at)
        }
    }

    /// Only the rule that names the damage counts, and only that rule masks it.
    #[test]
    fn health_reacts_by_the_rule_that_names_the_damage() {
        let sample =
            |t: f64, rules: &[&str]| (t, Some(rules.iter().map(|r| r.to_string()).collect()));
        let samples = [
            sample(8.0, &["archive_stalled_shards"]),
            sample(12.0, &["archive_stalled_shards"]),
            sample(14.0, &["statistics_damaged"]),
        ];
        let mut f = [
            Fault::new("corrupt-stats", 10.0),
            Fault::new("corrupt-active", 10.0),
        ];
        health_after(&mut f, &samples);
        assert_eq!(
            (f[0].health_fired_after_s, f[0].health_masked),
            (Some(4.0), false)
        );
        assert_eq!(
            (f[1].health_fired_after_s, f[1].health_masked),
            (None, false)
        );
        let mut late = [Fault::new("corrupt-stats", 13.0)];
        health_after(&mut late, &samples[..]);
        assert_eq!(late[0].health_fired_after_s, Some(1.0));
        let mut masked = [Fault::new("corrupt-stats", 15.0)];
        health_after(&mut masked, &samples);
        assert!(masked[0].health_masked);
        // A fault that never took effect is not judged at all.
        let mut missed = [Fault::new("corrupt-stats", 10.0)];
        missed[0].missed = Some("no key".into());
        health_after(&mut missed, &samples);
        assert_eq!(missed[0].health_fired_after_s, None);
    }

    #[test]
    fn recovery_counts_from_the_heal_to_the_baseline() {
        // 100/s, nothing from 30 to 45 s, 50/s until 48 s, then 100/s again; one burst
        // second before the fault does not move the median baseline.
        let mut tput = vec![100.0; 80];
        tput[25] = 1000.0;
        tput[30..45].fill(0.0);
        tput[45..48].fill(50.0);
        let mut faults = [fault(30.0, 45.0)];
        recovery(&mut faults, &tput);
        // The first 3 s mean at or above 80: 47..50 is (50 + 100 + 100) / 3.
        assert_eq!(faults[0].recovery_s, Some(2.0));
    }

    #[test]
    fn the_warm_up_burst_is_no_baseline() {
        // 300/s for the first 25 s, then 100/s; a fault at 35 s that takes nothing away
        // has recovered at once, measured against the 10 s after the warm-up only.
        let mut tput = vec![100.0; 80];
        tput[..WARM_UP_S].fill(300.0);
        let mut faults = [fault(35.0, 35.0)];
        recovery(&mut faults, &tput);
        assert_eq!(faults[0].recovery_s, Some(0.0));
    }
}
