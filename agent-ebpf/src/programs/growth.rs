//! `sched/sched_stat_runtime`: the scheduler charged run time to a task.
//!
//! Memory only grows while a task of the cgroup runs, and this tracepoint
//! fires in a running task's name at every scheduler tick (CONFIG_HZ) and
//! when it stops running: so looking at the task's memory cgroup here sees
//! every line crossed within one tick, at a cost that does not grow with
//! page faults (`kmem/rss_stat`, once per page, costs 5-10% of a
//! fault-heavy program on its own; see docs/benchmarks.md).
//!
//! Per CPU, a few recently seen tasks keep their memory cgroup: for those,
//! the fast path is one read of the cgroup's `page_counter` usage, and the
//! lines are checked only when it moved. A check reads the kernel's own
//! usage of the cgroup and of each ancestor, and sends a record only when
//! one crosses a line: its soft cap (from the WATCHED map), back below it
//! (hysteresis), or another growth step. The kernel keeps the figures; user
//! space hears of lines crossed, never of pages. For the cgroups the kill
//! predictor follows, a sample too each time the usage moved by the
//! cgroup's `sample_pages` (at most one per `sample_ns`): the predictor
//! reads a cgroup when the kernel says it moved, not every cgroup at
//! every tick.

use agent_common::{
    FAST_SLOTS, FastSlot, GrowthRecord, KernelOffsets, ProbeCounter, RecordKind, WatchedCgroup,
};
use aya_ebpf::{
    helpers::{bpf_ktime_get_boot_ns, bpf_ktime_get_ns},
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use crate::maps::{
    EVENTS, FAST_PATH, GROWTH, MEMCG_STATE, MemcgState, OFFSETS, WATCHED, count, read, ret,
};

/// Ancestors looked at above the task's own memory cgroup (kubepods nest 4 deep).
const MAX_DEPTH: usize = 6;

#[btf_tracepoint(function = "sched_stat_runtime")]
pub fn growth_btf(ctx: BtfTracePointContext) -> i32 {
    on_runtime(ctx.arg(0))
}

#[raw_tracepoint(tracepoint = "sched_stat_runtime")]
pub fn growth_raw(ctx: RawTracePointContext) -> i32 {
    on_runtime(ctx.arg(0))
}

/// The benchmark floor: the same hook, doing nothing. Attached instead of
/// `growth_btf` only by `memwatch run --probe-floor` (see `cargo xtask
/// bench overhead`), to tell the hook's own cost from the program's.
#[btf_tracepoint(function = "sched_stat_runtime")]
pub fn growth_floor_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[inline(always)]
fn on_runtime(task: *const u8) -> i32 {
    let Some(fast) = FAST_PATH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot of a live per-CPU array; not re-entered.
    let fast = unsafe { &mut *fast };
    fast.events += 1;
    if task.is_null() {
        return 0;
    }
    let settings = GROWTH.load();
    let now = unsafe { bpf_ktime_get_ns() };
    let off = OFFSETS.load();
    if off.valid == 0 {
        return 1;
    }
    // A task looked at lately: one read, and a check only if usage moved.
    let mut found = FAST_SLOTS;
    for i in 0..FAST_SLOTS {
        if fast.slots[i].task == task as u64 {
            found = i;
        }
    }
    if found < FAST_SLOTS {
        let slot = &mut fast.slots[found];
        if now.wrapping_sub(slot.resolved_ns) < settings.resolve_ns {
            let memcg = slot.memcg as *const u8;
            let Ok(usage) = read::<u64>(memcg, off.memcg_usage) else {
                return 1;
            };
            if usage.abs_diff(slot.usage) < settings.check_pages as u64 {
                return 0;
            }
            slot.usage = usage;
            return ret(walk(memcg, &off));
        }
    }
    // New here, or its cgroup is due to be resolved again: resolve it, in
    // its own slot when it has one (else the next one, round robin).
    let Ok(memcg) = task_memcg(task, &off) else {
        return 1;
    };
    if memcg.is_null() {
        return 0;
    }
    let Ok(usage) = read::<u64>(memcg, off.memcg_usage) else {
        return 1;
    };
    let victim = if found < FAST_SLOTS {
        found
    } else {
        let next = (fast.next as usize) % FAST_SLOTS;
        fast.next = fast.next.wrapping_add(1);
        next
    };
    // Indexed by a constant in each arm: the verifier sees every access bounded.
    for i in 0..FAST_SLOTS {
        if i == victim {
            fast.slots[i] = FastSlot {
                task: task as u64,
                memcg: memcg as u64,
                usage,
                resolved_ns: now,
            };
        }
    }
    ret(walk(memcg, &off))
}

/// The memory cgroup memory growth of `task` is charged to: its mm owner's
/// (threads share the mm; the kernel charges faults to the owner's cgroup),
/// or the task's own when it has no mm (exiting: its memory is being freed).
#[inline(always)]
fn task_memcg(task: *const u8, off: &KernelOffsets) -> Result<*const u8, i32> {
    let mm: *const u8 = read(task, off.task_mm)?;
    let owner: *const u8 = if mm.is_null() {
        task
    } else {
        let owner: *const u8 = read(mm, off.mm_owner)?;
        if owner.is_null() { task } else { owner }
    };
    let css_set: *const u8 = read(owner, off.task_cgroups)?;
    read(css_set, off.css_set_subsys + off.memory_cgrp_id * 8)
}

/// Checks the lines of `memcg` and its ancestors.
fn walk(mut memcg: *const u8, off: &KernelOffsets) -> Result<(), i32> {
    count(ProbeCounter::GrowthChecks);
    for _ in 0..MAX_DEPTH {
        if memcg.is_null() {
            break;
        }
        let parent: *const u8 = read(memcg, off.css_parent)?;
        // The root memory cgroup (no parent) is the whole host: not a line.
        if parent.is_null() {
            break;
        }
        check(memcg, off)?;
        memcg = parent;
    }
    Ok(())
}

fn check(memcg: *const u8, off: &KernelOffsets) -> Result<(), i32> {
    let usage: u64 = read(memcg, off.memcg_usage)?;
    let id = memcg_id(memcg, off)?;
    let settings = GROWTH.load();
    let key = memcg as u64;
    // A freed mem_cgroup's memory is soon another cgroup's: an entry whose
    // id is not this cgroup's is a stale one left at a reused address.
    let state = match MEMCG_STATE.get_ptr_mut(key) {
        // SAFETY: reading a field of a live LRU map element.
        Some(state) if unsafe { (*state).id } == id => state,
        _ => {
            let fresh = first_look(id, usage, settings.step_pages, now_ns());
            MEMCG_STATE.insert(key, fresh, 0).map_err(|_| 3)?;
            return Ok(());
        }
    };
    // SAFETY: a live element of the LRU map; concurrent updates from other
    // CPUs race only on these plain counters, and a lost update at worst
    // repeats or skips one record.
    let state = unsafe { &mut *state };
    let sample_pages = refresh_cap(state);
    if sample_pages > 0 && usage.abs_diff(state.sampled_usage) >= sample_pages {
        let now = now_ns();
        if now.wrapping_sub(state.sampled_ns) >= settings.sample_ns {
            state.sampled_usage = usage;
            state.sampled_ns = now;
            send(state, GrowthRecord::SAMPLE, usage);
        }
    }
    if state.cap_pages > 0 {
        let cap = state.cap_pages;
        let rearm = cap * (1000 - settings.hysteresis_permille as u64) / 1000;
        if state.above == 0 && usage > cap {
            state.above = 1;
            send(state, GrowthRecord::ABOVE_CAP, usage);
        } else if state.above == 1 && usage < rearm {
            state.above = 0;
            send(state, GrowthRecord::BELOW_CAP, usage);
        }
    }
    let step = settings.step_pages;
    if let Some(next) = next_step(usage, step) {
        if usage >= state.next_step {
            state.next_step = next;
            send(state, GrowthRecord::STEP, usage);
        } else if usage + 2 * step < state.next_step {
            // It shrank: the next growth past a step is news again.
            state.next_step = next;
        }
    }
    Ok(())
}

/// The first multiple of `step` above `usage` (`None` without steps).
#[inline(always)]
fn next_step(usage: u64, step: u64) -> Option<u64> {
    usage.checked_div(step).map(|n| (n + 1) * step)
}

/// The kernfs id of a memory cgroup: css->cgroup->kn->id.
#[inline(always)]
fn memcg_id(memcg: *const u8, off: &KernelOffsets) -> Result<u64, i32> {
    let cgroup: *const u8 = read(memcg, off.css_cgroup)?;
    let kn: *const u8 = read(cgroup, off.cgroup_kn)?;
    read(kn, off.kernfs_node_id)
}

/// A cgroup seen for the first time: its cap and where it stands. A
/// watched cgroup already over its cap says so at once.
/// Its usage now is where its samples start from (user space reads a
/// cgroup in full when it starts following it).
fn first_look(id: u64, usage: u64, step: u64, now: u64) -> MemcgState {
    let mut state = MemcgState {
        id,
        cap_pages: 0,
        generation: 0,
        next_step: next_step(usage, step).unwrap_or(u64::MAX),
        above: 0,
        sampled_usage: usage,
        sampled_ns: now,
    };
    refresh_cap(&mut state);
    if state.cap_pages > 0 && usage > state.cap_pages {
        state.above = 1;
        send(&state, GrowthRecord::ABOVE_CAP, usage);
    }
    state
}

/// Re-reads the cap when user space handed it again (or removed the
/// entry), and returns the entry's sample size (0: not sampled).
#[inline(always)]
fn refresh_cap(state: &mut MemcgState) -> u64 {
    // SAFETY: a read-only look at a map value.
    let watched: Option<&WatchedCgroup> = unsafe { WATCHED.get(state.id) };
    let (cap, generation, sample) = watched.map_or((0, 0, 0), |w| {
        (w.soft_cap_pages, w.generation, w.sample_pages)
    });
    if generation != state.generation {
        state.generation = generation;
        state.cap_pages = cap;
        state.above = 0;
    }
    sample
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

fn send(state: &MemcgState, line: u32, usage: u64) {
    let Some(mut entry) = EVENTS.reserve::<GrowthRecord>(0) else {
        count(ProbeCounter::RingbufFull);
        return;
    };
    entry.write(GrowthRecord {
        kind: RecordKind::Growth as u32,
        line,
        memcg_id: state.id,
        usage_pages: usage,
        cap_pages: state.cap_pages,
        boot_time_ns: unsafe { bpf_ktime_get_boot_ns() },
    });
    entry.submit(0);
    count(ProbeCounter::GrowthRecords);
}
