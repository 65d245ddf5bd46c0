//! Maps and load-time globals shared by every program.

use agent_common::{
    EVENTS_RING_BYTES, FastPath, GrowthSettings, KernelOffsets, OOM_RING_BYTES, ProbeCounter,
    WatchedCgroup, result,
};
use aya_ebpf::{
    Global,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
};

/// Struct offsets of the running kernel; set by the agent before load.
#[unsafe(no_mangle)]
pub static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_comm: 0,
    task_mm: 0,
    task_cgroups: 0,
    css_set_subsys: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    cgroup_level: 0,
    kernfs_node_id: 0,
    mm_total_vm: 0,
    mm_rss_base: 0,
    mm_rss_stride: 0,
    mm_rss_value: 0,
    memory_cgrp_id: 0,
    mm_filepages: 0,
    mm_anonpages: 0,
    mm_shmempages: 0,
    valid: 0,
    mm_owner: 0,
    css_parent: 0,
    memcg_usage: 0,
});

/// How the growth program looks; set by the agent before load.
#[unsafe(no_mangle)]
pub static GROWTH: Global<GrowthSettings> = Global::new(GrowthSettings::DEFAULT);

/// Cgroup and growth records.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// OOM victims only: a ring of their own, so that cgroup churn filling
/// `EVENTS` cannot crowd a kill out.
#[map(name = "OOM_EVENTS")]
pub static OOM_EVENTS: RingBuf = RingBuf::with_byte_size(OOM_RING_BYTES, 0);

#[map(name = "PROBE_COUNTERS")]
pub static PROBE_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ProbeCounter::COUNT, 0);

/// Memory cgroups user space watches, by id: their soft caps.
#[map(name = "WATCHED")]
pub static WATCHED: HashMap<u64, WatchedCgroup> = HashMap::with_max_entries(65536, 0);

/// What the growth program knows of each memory cgroup it has looked at,
/// keyed by the `mem_cgroup` pointer (stable while the cgroup lives; an
/// LRU map, so dead ones age out).
#[map(name = "MEMCG_STATE")]
pub static MEMCG_STATE: LruHashMap<u64, MemcgState> = LruHashMap::with_max_entries(65536, 0);

/// pid → `task_struct *` of the latest SIGKILL targets (only on kernels
/// whose `mark_victim` passes just a pid; see `signal_generate`). The OOM
/// killer holds a reference on its victim until it is marked, so the
/// pointer is live when `mark_victim` looks it up.
#[map(name = "SIGKILLED")]
pub static SIGKILLED: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1024, 0);

/// Per CPU: the mm seen last and how many more of its RSS changes to skip.
#[map(name = "FAST_PATH")]
pub static FAST_PATH: PerCpuArray<FastPath> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemcgState {
    pub id: u64,
    pub cap_pages: u64,
    /// `WatchedCgroup::generation` the cap was read at (0: not watched).
    pub generation: u64,
    /// The next growth step, in pages.
    pub next_step: u64,
    /// 1 while above the cap (re-armed below the hysteresis line).
    pub above: u64,
    /// The usage (pages) at the last sample, or at the first look.
    pub sampled_usage: u64,
    /// When the last sample was sent (`bpf_ktime_get_ns`; 0: never).
    pub sampled_ns: u64,
}

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
pub fn read<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    // SAFETY: bpf_probe_read_kernel validates the address; a bad one yields
    // an error, never a fault.
    unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(base.wrapping_add(offset as usize) as *const T)
    }
}

/// Adds one to a probe counter on this CPU (per-CPU: no atomics needed).
#[inline(always)]
pub fn count(counter: ProbeCounter) {
    if let Some(slot) = PROBE_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is this CPU's slot of a live map element, and a
        // BPF program is not preempted by itself on the same CPU.
        unsafe { *slot += 1 };
    }
}

/// A program's return value: 0, or the code of what went wrong (the kernel
/// ignores it for tracepoints; it marks the failing step when debugging).
#[inline(always)]
pub fn ret(result: Result<(), i32>) -> i32 {
    match result {
        Ok(()) => result::OK,
        Err(code) => code,
    }
}
