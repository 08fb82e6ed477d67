//! The alert rules as `health` reads them: a value against a threshold, and for the
//! rules that point at something (a stalled shard, an overdue partition) what it is.
//! Which rules there are and how their values are read is `health`'s; how they print
//! is `render`'s.

/// One alert rule and its reading.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) name: &'static str,
    pub(crate) value: f64,
    pub(crate) threshold: f64,
    /// What the rule points at while it fires (shards, pids, why), for the operator.
    pub(crate) detail: Option<String>,
}

impl Rule {
    pub(crate) fn new(name: &'static str, value: f64, threshold: f64) -> Self {
        Self {
            name,
            value,
            threshold,
            detail: None,
        }
    }

    /// The rule with `detail` said while it fires (nothing when it does not).
    pub(crate) fn detail(mut self, detail: impl FnOnce() -> String) -> Self {
        if self.firing() {
            self.detail = Some(detail());
        }
        self
    }

    /// A rule fires when its reading is above its threshold.
    pub(crate) fn firing(&self) -> bool {
        self.value > self.threshold
    }
}
