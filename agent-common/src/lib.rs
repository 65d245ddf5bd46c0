//! The ABI between the memwatch eBPF programs and the agent.
//!
//! Every type here is `#[repr(C)]`, `Copy` and laid out without implicit
//! padding, so the kernel and user space read the same bytes. A layout test
//! at the bottom of this file fails when a field moves.
#![no_std]

/// Map names, shared so the agent never spells them differently.
pub mod maps {
    /// `RingBuf` carrying cgroup and growth records to user space.
    pub const EVENTS: &str = "EVENTS";
    /// `RingBuf` of its own for [`super::OomVictimEvent`] records: cgroup
    /// churn filling [`EVENTS`] cannot crowd an OOM kill out.
    pub const OOM_EVENTS: &str = "OOM_EVENTS";
    /// Per-CPU array of `u64` probe counters, indexed by [`super::ProbeCounter`].
    pub const PROBE_COUNTERS: &str = "PROBE_COUNTERS";
    /// Hash: memory cgroup id → [`super::WatchedCgroup`], set by user space.
    pub const WATCHED: &str = "WATCHED";
    /// Per-CPU [`super::FastPath`] of the growth program (one element).
    pub const FAST_PATH: &str = "FAST_PATH";
    /// LRU: pid → `task_struct *` of recent SIGKILL targets (Linux < 6.2 only).
    pub const SIGKILLED: &str = "SIGKILLED";
}

/// Name of the global holding [`GrowthSettings`].
/// What an eBPF program returns. The kernel ignores it for tracepoints;
/// it names the step that failed when a program is debugged (bpftool,
/// `bpf_prog_test_run`). Kernel helper errors (negative) pass through.
pub mod result {
    pub const OK: i32 = 0;
    /// No input to work on: the loader did not fill the offsets, or the
    /// tracepoint passed a null pointer.
    pub const NO_INPUT: i32 = 1;
    /// The ring buffer was full: the record is lost (and counted).
    pub const RINGBUF_FULL: i32 = 2;
}

pub const GROWTH_GLOBAL: &str = "GROWTH";

/// How the growth program decides when to look, set at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthSettings {
    /// A growth-step record every time a cgroup's usage passes another
    /// multiple of this many pages (0: no steps).
    pub step_pages: u64,
    /// A task looked at again within `resolve_ns` of its last look has its
    /// cgroup's lines checked only when the cgroup's usage moved by at
    /// least this many pages since: the fast path is one kernel read.
    pub check_pages: u32,
    /// Back below the cap means below `cap * (1000 - this) / 1000`.
    pub hysteresis_permille: u32,
    /// How long a task's memory cgroup, once resolved, is trusted on one
    /// CPU before it is resolved again (a task moved to another cgroup is
    /// followed at most this late).
    pub resolve_ns: u64,
    /// At most one [`GrowthRecord::SAMPLE`] per watched cgroup this often.
    pub sample_ns: u64,
}

impl GrowthSettings {
    pub const DEFAULT: GrowthSettings = GrowthSettings {
        // 64 MiB of 4 KiB pages.
        step_pages: 16384,
        // 64 pages (256 KiB): finer than any line worth a record.
        check_pages: 64,
        hysteresis_permille: 50,
        resolve_ns: 10_000_000,
        // Just under the predictor's 100 ms near a limit: each of its
        // intervals sees a sample while the cgroup grows.
        sample_ns: 90_000_000,
    };
}

/// A cgroup user space watches: its soft cap in pages (0: none), and how
/// far its usage moves before the kernel says so in a sample. The
/// `generation` changes whenever user space hands the cap again, so the
/// kernel side re-reads it (and says again that it is above it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchedCgroup {
    pub soft_cap_pages: u64,
    pub generation: u64,
    /// A [`GrowthRecord::SAMPLE`] each time the usage moved (up or down)
    /// by at least this many pages since the last one, at most one per
    /// [`GrowthSettings::sample_ns`] (0: no samples). Read at every check:
    /// changing it needs no new generation.
    pub sample_pages: u64,
}

/// Tasks one CPU's fast path remembers (a task and the one it switches
/// with, and a few more).
pub const FAST_SLOTS: usize = 4;

/// A task the growth program looked at lately on this CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastSlot {
    /// The `task_struct` pointer (0: empty).
    pub task: u64,
    /// Its memory cgroup (`mem_cgroup` pointer) when last resolved.
    pub memcg: u64,
    /// That cgroup's usage (pages) at the last full check.
    pub usage: u64,
    /// When the cgroup was resolved (`bpf_ktime_get_ns`).
    pub resolved_ns: u64,
}

/// Per CPU, the growth program's fast path: the tasks looked at lately and
/// how many times the hook ran on this CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPath {
    /// Every run of the growth hook on this CPU (read as
    /// [`ProbeCounter::GrowthRuns`]).
    pub events: u64,
    /// The slot the next new task takes (round robin).
    pub next: u64,
    pub slots: [FastSlot; FAST_SLOTS],
}

/// A memory cgroup's usage crossed a line.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthRecord {
    /// [`RecordKind::Growth`].
    pub kind: u32,
    /// [`GrowthRecord::ABOVE_CAP`], [`GrowthRecord::BELOW_CAP`],
    /// [`GrowthRecord::STEP`] or [`GrowthRecord::SAMPLE`].
    pub line: u32,
    /// kernfs id of the memory cgroup.
    pub memcg_id: u64,
    /// The cgroup's `page_counter` usage (what `memory.usage_in_bytes` /
    /// `memory.current` report), in pages.
    pub usage_pages: u64,
    /// The soft cap, in pages (0: none).
    pub cap_pages: u64,
    pub boot_time_ns: u64,
}

impl GrowthRecord {
    pub const ABOVE_CAP: u32 = 1;
    pub const BELOW_CAP: u32 = 2;
    pub const STEP: u32 = 3;
    /// The usage moved by the cgroup's `sample_pages` (the kill
    /// predictor follows it).
    pub const SAMPLE: u32 = 4;
}

/// Program names (the Rust function names in agent-ebpf): each attach
/// point has a `tp_btf` program and a raw-tracepoint twin for kernels that
/// refuse `tp_btf`.
pub mod programs {
    /// A tracepoint and its two programs.
    #[derive(Clone, Copy, Debug)]
    pub struct AttachPoint {
        pub tracepoint: &'static str,
        pub btf: &'static str,
        pub raw: &'static str,
    }

    pub const OOM_MARK_VICTIM: AttachPoint = AttachPoint {
        tracepoint: "mark_victim",
        btf: "oom_mark_victim_btf",
        raw: "oom_mark_victim_raw",
    };
    /// `oom/mark_victim` where it passes only `int pid` (Linux < 6.2).
    pub const OOM_MARK_VICTIM_PID: AttachPoint = AttachPoint {
        tracepoint: "mark_victim",
        btf: "oom_mark_victim_pid_btf",
        raw: "oom_mark_victim_pid_raw",
    };
    /// Tests only (`memwatch run --probe-oom-by-pid`): on a kernel whose
    /// `mark_victim` passes the task, only its pid is used and the victim
    /// is found the pid-only kernels' way, through `signal_generate`.
    pub const OOM_MARK_VICTIM_AS_PID: AttachPoint = AttachPoint {
        tracepoint: "mark_victim",
        btf: "oom_mark_victim_as_pid_btf",
        raw: "oom_mark_victim_as_pid_btf",
    };
    /// `signal/signal_generate`: the SIGKILL targets the pid-only
    /// `mark_victim` programs look their victim up in.
    pub const SIGNAL_GENERATE: AttachPoint = AttachPoint {
        tracepoint: "signal_generate",
        btf: "signal_generate_btf",
        raw: "signal_generate_raw",
    };
    pub const CGROUP_MKDIR: AttachPoint = AttachPoint {
        tracepoint: "cgroup_mkdir",
        btf: "cgroup_mkdir_btf",
        raw: "cgroup_mkdir_raw",
    };
    pub const CGROUP_RMDIR: AttachPoint = AttachPoint {
        tracepoint: "cgroup_rmdir",
        btf: "cgroup_rmdir_btf",
        raw: "cgroup_rmdir_raw",
    };
    /// `sched/sched_stat_runtime`: the scheduler charged run time to a task,
    /// at every scheduler tick while it runs and when it stops running (not
    /// once per page, like `kmem/rss_stat`).
    pub const GROWTH: AttachPoint = AttachPoint {
        tracepoint: "sched_stat_runtime",
        btf: "growth_btf",
        raw: "growth_raw",
    };
    /// The benchmark floor: an empty program on the growth hook (no raw twin).
    pub const GROWTH_FLOOR: AttachPoint = AttachPoint {
        tracepoint: "sched_stat_runtime",
        btf: "growth_floor_btf",
        raw: "growth_floor_btf",
    };
    pub const ALL: [AttachPoint; 4] = [OOM_MARK_VICTIM, CGROUP_MKDIR, CGROUP_RMDIR, GROWTH];

    /// The programs that log (`--probe-log`), twins of the ones above with
    /// `_log` appended: the same code plus its aya-log statements. Loading
    /// the plain ones when the switch is off leaves no trace of logging in
    /// the kernel.
    const LOGGED: [(&str, AttachPoint); 5] = [
        (
            OOM_MARK_VICTIM.btf,
            AttachPoint {
                tracepoint: "mark_victim",
                btf: "oom_mark_victim_btf_log",
                raw: "oom_mark_victim_raw_log",
            },
        ),
        (
            OOM_MARK_VICTIM_PID.btf,
            AttachPoint {
                tracepoint: "mark_victim",
                btf: "oom_mark_victim_pid_btf_log",
                raw: "oom_mark_victim_pid_raw_log",
            },
        ),
        (
            OOM_MARK_VICTIM_AS_PID.btf,
            AttachPoint {
                tracepoint: "mark_victim",
                btf: "oom_mark_victim_as_pid_btf_log",
                raw: "oom_mark_victim_as_pid_btf_log",
            },
        ),
        (
            CGROUP_MKDIR.btf,
            AttachPoint {
                tracepoint: "cgroup_mkdir",
                btf: "cgroup_mkdir_btf_log",
                raw: "cgroup_mkdir_raw_log",
            },
        ),
        (
            CGROUP_RMDIR.btf,
            AttachPoint {
                tracepoint: "cgroup_rmdir",
                btf: "cgroup_rmdir_btf_log",
                raw: "cgroup_rmdir_raw_log",
            },
        ),
    ];

    /// `point`'s logging twin, or `point` itself when it does not log.
    pub fn logged(point: AttachPoint) -> AttachPoint {
        LOGGED
            .iter()
            .find(|(plain, _)| *plain == point.btf)
            .map_or(point, |(_, twin)| *twin)
    }
}

/// What a ring-buffer record is: the first `u32` of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    OomVictim = 1,
    CgroupMkdir = 2,
    CgroupRmdir = 3,
    Growth = 4,
}

impl RecordKind {
    pub fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::OomVictim),
            2 => Some(Self::CgroupMkdir),
            3 => Some(Self::CgroupRmdir),
            4 => Some(Self::Growth),
            _ => None,
        }
    }
}

/// Longest cgroup path carried (relative to its hierarchy's root).
pub const CGROUP_PATH_LEN: usize = 256;

/// A cgroup made or removed, in any hierarchy (user space keeps those of
/// the memory hierarchy).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupRecord {
    /// [`RecordKind::CgroupMkdir`] or [`RecordKind::CgroupRmdir`].
    pub kind: u32,
    /// Depth below the hierarchy's root.
    pub level: u32,
    /// kernfs id (= directory inode).
    pub id: u64,
    pub boot_time_ns: u64,
    /// NUL-terminated path relative to the hierarchy's root, e.g. `/a/b`.
    pub path: [u8; CGROUP_PATH_LEN],
}

/// Name of the global holding [`KernelOffsets`] in the eBPF object.
pub const OFFSETS_GLOBAL: &str = "OFFSETS";

/// Size of `task_struct::comm` (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;

/// Ring buffer size in bytes (a power of two, a multiple of the page size).
/// An OOM record is 88 bytes plus an 8-byte header: 256 KiB holds ~2,700
/// of them unread.
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

/// The OOM ring's size in bytes (a power of two, a multiple of the page
/// size): ~680 OOM records unread, more kills than any storm measured.
pub const OOM_RING_BYTES: u32 = 64 * 1024;

/// Counters the programs keep in [`maps::PROBE_COUNTERS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeCounter {
    /// OOM victims seen by the program.
    OomSeen = 0,
    /// Records lost because the ring buffer was full.
    RingbufFull = 1,
    /// Kernel reads that failed (a field left zero in the record).
    ReadErrors = 2,
    /// Runs of the growth program (kept in [`FastPath::events`], not in
    /// this map: the hot path touches one map only).
    GrowthRuns = 3,
    /// Of those, the ones that took the slow path (checked the lines of the
    /// memory cgroup and its ancestors).
    GrowthChecks = 4,
    /// Growth records sent (cap crossings and steps).
    GrowthRecords = 5,
}

impl ProbeCounter {
    /// Number of counters; the map's size.
    pub const COUNT: u32 = 6;
    pub const ALL: [ProbeCounter; 6] = [
        Self::OomSeen,
        Self::RingbufFull,
        Self::ReadErrors,
        Self::GrowthRuns,
        Self::GrowthChecks,
        Self::GrowthRecords,
    ];

    /// The metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OomSeen => "oom_seen",
            Self::RingbufFull => "ringbuf_full",
            Self::ReadErrors => "read_errors",
            Self::GrowthRuns => "growth_runs",
            Self::GrowthChecks => "growth_checks",
            Self::GrowthRecords => "growth_records",
        }
    }
}

/// Struct offsets and enum values of the running kernel, read from its BTF at
/// load time (Rust eBPF has no CO-RE relocations) and set as a global.
///
/// All offsets are in bytes from the start of the named struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_mm: u32,
    pub task_cgroups: u32,
    /// `css_set::subsys`, an array of `struct cgroup_subsys_state *`.
    pub css_set_subsys: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub cgroup_level: u32,
    pub kernfs_node_id: u32,
    pub mm_total_vm: u32,
    /// Start of the per-mm RSS counters (`mm_struct::rss_stat`, and inside it
    /// `count` on kernels where it is a `struct mm_rss_stat`).
    pub mm_rss_base: u32,
    /// Stride between two RSS counters (a `percpu_counter`, or an `atomic_long_t`).
    pub mm_rss_stride: u32,
    /// Offset of the `s64`/`long` value within one RSS counter.
    pub mm_rss_value: u32,
    /// Index of the memory controller in `css_set::subsys` (`memory_cgrp_id`).
    pub memory_cgrp_id: u32,
    pub mm_filepages: u32,
    pub mm_anonpages: u32,
    pub mm_shmempages: u32,
    /// Non-zero once user space has filled this in; the programs do nothing
    /// before, so a mis-loaded object cannot read garbage.
    pub valid: u32,
    /// `mm_struct::owner` (the task whose memory cgroup the mm is charged to).
    pub mm_owner: u32,
    /// `cgroup_subsys_state::parent`; `css` is the first member of
    /// `mem_cgroup`, so a css pointer is its memcg's.
    pub css_parent: u32,
    /// `mem_cgroup::memory` (a `page_counter`) plus `page_counter::usage`.
    pub memcg_usage: u32,
}

/// One OOM victim, as the kernel saw it when `mark_victim` fired.
///
/// Figures are raw: pages, not bytes (user space knows the page size).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomVictimEvent {
    /// [`RecordKind::OomVictim`].
    pub kind: u32,
    /// Bits of [`OomVictimEvent::FLAG_NO_MM`] and friends.
    pub flags: u32,
    /// `bpf_ktime_get_boot_ns()` when the victim was marked.
    pub boot_time_ns: u64,
    /// kernfs id (= directory inode) of the victim's memory cgroup: the v1
    /// memcg where memory is v1, the v2 cgroup where it is v2.
    pub memcg_id: u64,
    /// `mm_struct::total_vm`, pages.
    pub total_vm_pages: u64,
    pub anon_rss_pages: i64,
    pub file_rss_pages: i64,
    pub shmem_rss_pages: i64,
    /// Thread id of the victim (the kernel's `pid`).
    pub pid: u32,
    /// Process id of the victim (the kernel's `tgid`).
    pub tgid: u32,
    /// Process whose allocation triggered the OOM (the current task).
    pub trigger_tgid: u32,
    /// Keeps the layout free of implicit padding.
    pub _reserved: u32,
    pub comm: [u8; COMM_LEN],
}

impl OomVictimEvent {
    /// The victim had no mm: RSS figures are zero.
    pub const FLAG_NO_MM: u32 = 1 << 0;
    /// The memory cgroup could not be read: `memcg_id` is zero.
    pub const FLAG_NO_MEMCG: u32 = 1 << 1;
    /// Some other field could not be read and is zero.
    pub const FLAG_PARTIAL: u32 = 1 << 2;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: both are #[repr(C)], Copy, contain only integers and have no
    // padding (checked by the layout tests below): every bit pattern is valid.
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::OomVictimEvent {}
    unsafe impl aya::Pod for super::CgroupRecord {}
    unsafe impl aya::Pod for super::GrowthRecord {}
    unsafe impl aya::Pod for super::GrowthSettings {}
    unsafe impl aya::Pod for super::WatchedCgroup {}
    unsafe impl aya::Pod for super::FastPath {}
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn oom_victim_event_layout_has_no_padding() {
        assert_eq!(
            size_of::<OomVictimEvent>(),
            2 * 4 + 6 * 8 + 4 * 4 + COMM_LEN
        );
        assert_eq!(offset_of!(OomVictimEvent, boot_time_ns), 8);
        assert_eq!(offset_of!(OomVictimEvent, pid), 56);
        assert_eq!(offset_of!(OomVictimEvent, comm), 72);
    }

    #[test]
    fn cgroup_record_layout_has_no_padding() {
        assert_eq!(size_of::<CgroupRecord>(), 4 + 4 + 8 + 8 + CGROUP_PATH_LEN);
        assert_eq!(offset_of!(CgroupRecord, path), 24);
    }

    #[test]
    fn kernel_offsets_layout_has_no_padding() {
        assert_eq!(size_of::<KernelOffsets>(), 22 * 4);
        assert_eq!(offset_of!(KernelOffsets, valid), 18 * 4);
    }

    #[test]
    fn watched_and_settings_layouts_have_no_padding() {
        assert_eq!(size_of::<WatchedCgroup>(), 3 * 8);
        assert_eq!(offset_of!(WatchedCgroup, sample_pages), 16);
        assert_eq!(size_of::<GrowthSettings>(), 8 + 4 + 4 + 8 + 8);
        assert_eq!(offset_of!(GrowthSettings, sample_ns), 24);
    }

    #[test]
    fn record_kinds_round_trip() {
        for kind in [
            RecordKind::OomVictim,
            RecordKind::CgroupMkdir,
            RecordKind::CgroupRmdir,
        ] {
            assert_eq!(RecordKind::from_u32(kind as u32), Some(kind));
        }
        assert_eq!(RecordKind::from_u32(0), None);
    }
}
