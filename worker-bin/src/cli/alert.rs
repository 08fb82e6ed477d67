//! The seed's alert rules as `health` reads them: a value against a threshold. Which
//! rules there are and how their values are read is `health`'s; how they print is
//! `render`'s.

/// One alert rule of the seed and its reading.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) name: &'static str,
    pub(crate) value: f64,
    pub(crate) threshold: f64,
}

impl Rule {
    pub(crate) fn new(name: &'static str, value: f64, threshold: f64) -> Self {
        Self {
            name,
            value,
            threshold,
        }
    }

    /// A rule fires when its reading is above its threshold.
    pub(crate) fn firing(&self) -> bool {
        self.value > self.threshold
    }
}
