//! The kernel side, seen from user space: loading and attaching the eBPF
//! programs, reading their ring buffer, and turning records into
//! [`ProbeEvent`]s. Everything past the channel of `ProbeEvent`s (the
//! pipeline, the watchdog, the tests' fakes) never touches the kernel.

pub(crate) mod btf;
pub(crate) mod counters;
pub(crate) mod decode;
pub(crate) mod ebpf;
pub(crate) mod hooks;
pub(crate) mod poll;
pub(crate) mod privilege;

use chrono::{DateTime, Utc};

/// Where user space tells the kernel side which cgroups to watch, their
/// soft caps and the samples wanted of them (the eBPF probe's WATCHED map;
/// nothing for sampling-only runs).
pub(crate) trait KernelWatch: Send + Sync {
    /// Sets (`Some`) or clears (`None`) what the kernel watches of a memory
    /// cgroup, by id.
    fn set(&self, cgroup_id: u64, watch: Option<Watch>);
}

/// What the kernel side watches of one memory cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Watch {
    /// The soft cap (`None`: none).
    pub cap_bytes: Option<u64>,
    /// Changes each time the cap is handed again: the kernel re-reads it
    /// and says again that the cgroup is above it.
    pub generation: u64,
    /// A [`Line::Sample`] each time the usage moved by this much (`None`:
    /// no samples; the kill predictor does not follow it).
    pub sample_bytes: Option<u64>,
}

/// What a source reports.
#[derive(Clone, Debug, PartialEq)]
pub enum ProbeEvent {
    OomVictim(OomVictim),
    /// A cgroup was made (`removed: false`) or removed, in some hierarchy.
    Cgroup(CgroupChange),
    /// A memory cgroup's usage crossed a line (its soft cap, back below it,
    /// a growth step).
    Growth(GrowthLine),
    /// The poll source saw a cgroup's kernel OOM-kill counter grow: kills
    /// without a known victim.
    OomCounted(OomCount),
}

#[derive(Clone, Debug, PartialEq)]
pub struct OomCount {
    /// When the poll noticed (the kills happened since the last reading).
    pub time: DateTime<Utc>,
    pub cgroup: std::path::PathBuf,
    pub before: u64,
    pub after: u64,
}

/// Which line a memory cgroup's usage crossed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    AboveCap,
    BelowCap,
    Step,
    /// The usage moved by the cgroup's sample size (see [`Watch`]).
    Sample,
}

impl Line {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AboveCap => "above_cap",
            Self::BelowCap => "below_cap",
            Self::Step => "step",
            Self::Sample => "sample",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GrowthLine {
    pub time: DateTime<Utc>,
    pub memcg_id: u64,
    pub line: Line,
    /// The kernel's usage of the cgroup (memory.usage_in_bytes / memory.current).
    pub usage_bytes: u64,
    pub cap_bytes: Option<u64>,
}

/// A cgroup made or removed. `path` is relative to its hierarchy's root
/// (`/a/b`); the hierarchy is not said, so the receiver checks `id`
/// against the memory hierarchy's directory inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupChange {
    pub id: u64,
    pub path: String,
    pub level: u32,
    pub removed: bool,
}

/// A task the kernel chose to kill for lack of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct OomVictim {
    /// When the kernel marked the victim.
    pub time: DateTime<Utc>,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid) of the marked task.
    pub tid: u32,
    pub comm: String,
    /// kernfs id of the victim's memory cgroup; `None` when unreadable.
    pub memcg_id: Option<u64>,
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    pub total_vm_bytes: u64,
    /// The process whose allocation triggered the OOM.
    pub trigger_pid: u32,
    /// When the agent read the record off the ring buffer.
    pub read_at: std::time::Instant,
}

impl OomVictim {
    /// Resident memory: anonymous + file + shared memory pages, as the
    /// kernel's own OOM report counts it.
    pub fn rss_bytes(&self) -> u64 {
        self.anon_rss_bytes + self.file_rss_bytes + self.shmem_rss_bytes
    }
}
