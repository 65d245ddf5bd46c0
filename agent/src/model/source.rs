//! Which event source the agent runs.

use std::fmt;

/// Which source produces the event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SourceKind {
    /// eBPF programs in the kernel.
    Ebpf,
    /// Polling the cgroup files (no eBPF).
    Poll,
}

impl SourceKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Poll => "poll",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
