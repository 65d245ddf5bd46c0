//! Health verdicts of workers and of the agent itself.

use serde::{Deserialize, Serialize};

/// The health of a worker, or of the agent itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Health {
    Healthy,
    /// Something is off, not yet enough to stop sending work.
    Degraded,
    /// Stop sending work; fail over.
    Unhealthy,
}

/// A health with every reason behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Verdict {
    pub status: Health,
    pub reasons: Vec<String>,
}

impl Verdict {
    pub(crate) fn healthy() -> Self {
        Self {
            status: Health::Healthy,
            reasons: Vec::new(),
        }
    }

    /// Adds a reason and raises the status to at least `status`.
    pub(crate) fn add(&mut self, status: Health, reason: impl Into<String>) {
        self.status = self.status.max(status);
        self.reasons.push(reason.into());
    }
}
