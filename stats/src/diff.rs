//! The consistency check: every difference between two sets of statistics.

use std::fmt;

use serde_json::Value;

use crate::Stats;

/// One field whose value differs, or an entry present on one side only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// Where, as a path: `worker_stats.worker1.completed_count`,
    /// `time_series_stats.2024-06-24.hourly_completion[13]`.
    pub path: String,
    /// The expected value as JSON, or `None` if the entry should not exist.
    pub expected: Option<String>,
    /// The value found as JSON, or `None` if the entry is missing.
    pub found: Option<String>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "nothing".to_owned());
        write!(
            f,
            "{}: expected {}, found {}",
            self.path,
            show(&self.expected),
            show(&self.found)
        )
    }
}

/// Every difference between `expected` (recomputed from the archive with
/// [`Stats::from_records`]) and `actual` (as kept), in path order; empty when they
/// agree. `global_stats.last_updated` is not compared: it records when statistics were
/// written, not anything about the records.
pub fn diff(expected: &Stats, actual: &Stats) -> Vec<Difference> {
    let mut out = Vec::new();
    let (Ok(e), Ok(a)) = (serde_json::to_value(expected), serde_json::to_value(actual)) else {
        // Stats holds only maps with string keys and finite numbers: always serialisable.
        return out;
    };
    walk("", &e, &a, &mut out);
    out
}

fn walk(path: &str, e: &Value, a: &Value, out: &mut Vec<Difference>) {
    if path == "global_stats.last_updated" {
        return;
    }
    match (e, a) {
        (Value::Object(eo), Value::Object(ao)) => {
            let mut keys: Vec<&String> = eo.keys().chain(ao.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (eo.get(k), ao.get(k)) {
                    (Some(ev), Some(av)) => walk(&p, ev, av, out),
                    (ev, av) => out.push(Difference {
                        path: p,
                        expected: ev.map(Value::to_string),
                        found: av.map(Value::to_string),
                    }),
                }
            }
        }
        (Value::Array(ea), Value::Array(aa)) if ea.len() == aa.len() => {
            for (i, (ev, av)) in ea.iter().zip(aa).enumerate() {
                walk(&format!("{path}[{i}]"), ev, av, out);
            }
        }
        _ if e != a => out.push(Difference {
            path: path.to_owned(),
            expected: Some(e.to_string()),
            found: Some(a.to_string()),
        }),
        _ => {}
    }
}
