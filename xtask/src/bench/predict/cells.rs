//! The scenarios of `bench predict`: the workload's shape, its limit, and
//! whether it ends in a kill; on cgroup v2 also which limits its cgroup
//! has (`memory.high`, a parent's).

/// One scenario.
#[derive(Clone, Copy)]
pub(super) struct Cell {
    pub(super) name: &'static str,
    /// memshape's SHAPE.
    pub(super) shape: &'static str,
    pub(super) limit_mib: u64,
    /// Whether it ends in a kill (else it must survive).
    pub(super) kills: bool,
    pub(super) limits: Limits,
}

/// Which limits a run's cgroup has.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Limits {
    /// `limit_mib`, its own.
    Own,
    /// `limit_mib` and, at 0.9 × it, v2's `memory.high`.
    High,
    /// `limit_mib` on its parent; its own, 1 GiB, is never reached.
    Parent,
}

pub(super) const KILLING: [Cell; 5] = [
    Cell {
        name: "leak 2 MiB/s",
        shape: "leak:2",
        limit_mib: 128,
        kills: true,
        limits: Limits::Own,
    },
    Cell {
        name: "leak 10 MiB/s",
        shape: "leak:10",
        limit_mib: 384,
        kills: true,
        limits: Limits::Own,
    },
    Cell {
        name: "leak 40 MiB/s",
        shape: "leak:40",
        limit_mib: 1024,
        kills: true,
        limits: Limits::Own,
    },
    Cell {
        name: "steps of 64 MiB every 10 s",
        shape: "steps",
        limit_mib: 224,
        kills: true,
        limits: Limits::Own,
    },
    Cell {
        name: "sawtooth, troughs rising",
        shape: "rising",
        limit_mib: 256,
        kills: true,
        limits: Limits::Own,
    },
];

pub(super) const SURVIVING: [Cell; 3] = [
    Cell {
        name: "sawtooth 50-90 %",
        shape: "sawtooth",
        limit_mib: 256,
        kills: false,
        limits: Limits::Own,
    },
    Cell {
        name: "93 % anon + page cache 2x the limit",
        shape: "pagecache",
        limit_mib: 256,
        kills: false,
        limits: Limits::Own,
    },
    Cell {
        name: "spikes to 85-97 %",
        shape: "spikes",
        limit_mib: 256,
        kills: false,
        limits: Limits::Own,
    },
];

/// The cells of a cgroup v2 kernel (`bench predict-v2`, in the VMs): the
/// 10 MiB/s leak again, then what needs v2 or a parent. Limits of 256 MiB:
/// five runs at once fit the VM's memory.
pub(super) const V2_KILLING: [Cell; 3] = [
    Cell {
        name: "v2: leak 10 MiB/s",
        shape: "leak:10",
        limit_mib: 256,
        kills: true,
        limits: Limits::Own,
    },
    Cell {
        name: "v2: memory.high at 0.9 × memory.max, leak 10 MiB/s",
        shape: "leak:10",
        limit_mib: 256,
        kills: true,
        limits: Limits::High,
    },
    Cell {
        name: "v2: the parent's 256 MiB before the child's 1 GiB, leak 10 MiB/s",
        shape: "leak:10",
        limit_mib: 256,
        kills: true,
        limits: Limits::Parent,
    },
];
