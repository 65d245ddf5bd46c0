//! `oom/mark_victim`: the kernel has chosen a task to kill for lack of memory.
//!
//! The tracepoint runs in the context of the task whose allocation triggered
//! the OOM, not the victim's: everything here is read from the victim's
//! `task_struct`, the tracepoint's first argument (`TP_PROTO(struct
//! task_struct *task, uid_t uid)` since Linux 6.2). Before 6.2 it passes
//! only `int pid`: the `_pid` programs then take the victim's task from
//! what `signal_generate` remembered of the SIGKILL the OOM killer sent it.

use agent_common::{COMM_LEN, KernelOffsets, OomVictimEvent, ProbeCounter, RecordKind, result};
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns},
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use crate::{
    log,
    maps::{OFFSETS, OOM_EVENTS, SIGKILLED, count, read, ret},
};

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_btf(ctx: BtfTracePointContext) -> i32 {
    mark_victim::<false, _>(&ctx, ctx.arg(0))
}

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim_raw(ctx: RawTracePointContext) -> i32 {
    mark_victim::<false, _>(&ctx, ctx.arg(0))
}

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_btf_log(ctx: BtfTracePointContext) -> i32 {
    mark_victim::<true, _>(&ctx, ctx.arg(0))
}

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim_raw_log(ctx: RawTracePointContext) -> i32 {
    mark_victim::<true, _>(&ctx, ctx.arg(0))
}

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_pid_btf(ctx: BtfTracePointContext) -> i32 {
    let pid: u64 = ctx.arg(0);
    mark_victim_pid::<false, _>(&ctx, pid as u32)
}

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim_pid_raw(ctx: RawTracePointContext) -> i32 {
    let pid: u64 = ctx.arg(0);
    mark_victim_pid::<false, _>(&ctx, pid as u32)
}

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_pid_btf_log(ctx: BtfTracePointContext) -> i32 {
    let pid: u64 = ctx.arg(0);
    mark_victim_pid::<true, _>(&ctx, pid as u32)
}

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim_pid_raw_log(ctx: RawTracePointContext) -> i32 {
    let pid: u64 = ctx.arg(0);
    mark_victim_pid::<true, _>(&ctx, pid as u32)
}

/// Tests only (`memwatch run --probe-oom-by-pid`): this kernel passes the
/// victim's task, but only its pid is taken, and the victim is found as on
/// kernels that pass nothing else (< 6.2), so that path runs for real here.
#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_as_pid_btf(ctx: BtfTracePointContext) -> i32 {
    mark_victim_as_pid::<false, _>(&ctx, ctx.arg(0))
}

#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim_as_pid_btf_log(ctx: BtfTracePointContext) -> i32 {
    mark_victim_as_pid::<true, _>(&ctx, ctx.arg(0))
}

/// The tests' path: only the task's pid is taken, then as
/// [`mark_victim_pid`].
#[inline(always)]
fn mark_victim_as_pid<const LOG: bool, C: EbpfContext>(ctx: &C, task: *const u8) -> i32 {
    match read::<i32>(task, OFFSETS.load().task_pid) {
        Ok(pid) => mark_victim_pid::<LOG, C>(ctx, pid as u32),
        Err(code) => code,
    }
}

/// A run on the victim's task; with `LOG` (the `_log` twins, loaded under
/// `--probe-log`) what became of it in the log. Without `LOG` no logging
/// code is compiled in at all.
#[inline(always)]
fn mark_victim<const LOG: bool, C: EbpfContext>(ctx: &C, task: *const u8) -> i32 {
    let result = try_mark_victim(task);
    if LOG {
        log::oom_victim(ctx, &result);
    }
    ret(result.map(|_| ()))
}

/// A run on the victim's pid (Linux < 6.2), logged as [`mark_victim`].
#[inline(always)]
fn mark_victim_pid<const LOG: bool, C: EbpfContext>(ctx: &C, pid: u32) -> i32 {
    let result = try_mark_victim_pid(pid);
    if LOG {
        log::oom_victim_pid(ctx, pid, &result);
    }
    ret(result)
}

/// Linux < 6.2: the victim's task from the SIGKILL sent to this pid, when
/// it is still that pid's (a recycled pid's stale entry is not).
fn try_mark_victim_pid(pid: u32) -> Result<(), i32> {
    let off = OFFSETS.load();
    if off.valid == 0 {
        return Err(result::NO_INPUT);
    }
    // SAFETY: a read-only copy of a map value.
    let task = unsafe { SIGKILLED.get(pid) }.copied().unwrap_or(0) as *const u8;
    let current = !task.is_null() && read::<i32>(task, off.task_pid).is_ok_and(|p| p as u32 == pid);
    if current {
        let done = try_mark_victim(task).map(|_| ());
        let _ = SIGKILLED.remove(pid);
        return done;
    }
    mark_victim_unknown(pid)
}

/// A victim whose task was not found: its pid, flagged partial, so the
/// OOM kill is still reported (user space reads the rest from /proc).
fn mark_victim_unknown(pid: u32) -> Result<(), i32> {
    count(ProbeCounter::OomSeen);
    count(ProbeCounter::ReadErrors);
    let Some(mut entry) = OOM_EVENTS.reserve::<OomVictimEvent>(0) else {
        count(ProbeCounter::RingbufFull);
        return Err(result::RINGBUF_FULL);
    };
    let mut event = blank_event();
    event.flags =
        OomVictimEvent::FLAG_PARTIAL | OomVictimEvent::FLAG_NO_MEMCG | OomVictimEvent::FLAG_NO_MM;
    event.pid = pid;
    event.tgid = pid;
    entry.write(event);
    entry.submit(0);
    Ok(())
}

/// Records the victim `task`; its pid when recorded.
fn try_mark_victim(task: *const u8) -> Result<u32, i32> {
    let off = OFFSETS.load();
    if off.valid == 0 || task.is_null() {
        return Err(result::NO_INPUT);
    }
    count(ProbeCounter::OomSeen);

    let Some(mut entry) = OOM_EVENTS.reserve::<OomVictimEvent>(0) else {
        count(ProbeCounter::RingbufFull);
        return Err(result::RINGBUF_FULL);
    };
    let mut event = blank_event();
    fill_identity(task, &off, &mut event);
    fill_memcg(task, &off, &mut event);
    fill_rss(task, &off, &mut event);
    if event.flags != 0 {
        count(ProbeCounter::ReadErrors);
    }
    let pid = event.pid;
    entry.write(event);
    entry.submit(0);
    Ok(pid)
}

fn fill_identity(task: *const u8, off: &KernelOffsets, event: &mut OomVictimEvent) {
    match (
        read::<i32>(task, off.task_pid),
        read::<i32>(task, off.task_tgid),
        read::<[u8; COMM_LEN]>(task, off.task_comm),
    ) {
        (Ok(pid), Ok(tgid), Ok(comm)) => {
            event.pid = pid as u32;
            event.tgid = tgid as u32;
            event.comm = comm;
        }
        _ => event.flags |= OomVictimEvent::FLAG_PARTIAL,
    }
}

/// task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id: the kernfs id of
/// the victim's memory cgroup, which is its directory's inode number on the
/// hierarchy that holds the memory controller (v1 or v2).
fn fill_memcg(task: *const u8, off: &KernelOffsets, event: &mut OomVictimEvent) {
    let id = (|| -> Result<u64, i32> {
        let css_set: *const u8 = read(task, off.task_cgroups)?;
        let slot = off.css_set_subsys + off.memory_cgrp_id * 8;
        let css: *const u8 = read(css_set, slot)?;
        let cgroup: *const u8 = read(css, off.css_cgroup)?;
        let kn: *const u8 = read(cgroup, off.cgroup_kn)?;
        read::<u64>(kn, off.kernfs_node_id)
    })();
    match id {
        Ok(id) => event.memcg_id = id,
        Err(_) => event.flags |= OomVictimEvent::FLAG_NO_MEMCG,
    }
}

/// mm->total_vm and the approximate per-mm RSS counters (what the kernel's
/// own OOM report prints).
fn fill_rss(task: *const u8, off: &KernelOffsets, event: &mut OomVictimEvent) {
    let mm = match read::<*const u8>(task, off.task_mm) {
        Ok(mm) if !mm.is_null() => mm,
        _ => {
            event.flags |= OomVictimEvent::FLAG_NO_MM;
            return;
        }
    };
    let counter = |index: u32| -> i64 {
        read::<i64>(
            mm,
            off.mm_rss_base + index * off.mm_rss_stride + off.mm_rss_value,
        )
        .unwrap_or(0)
    };
    event.total_vm_pages = read::<u64>(mm, off.mm_total_vm).unwrap_or(0);
    event.anon_rss_pages = counter(off.mm_anonpages);
    event.file_rss_pages = counter(off.mm_filepages);
    event.shmem_rss_pages = counter(off.mm_shmempages);
}

/// A record stamped now, in the triggering task's name, every victim field zero.
#[inline(always)]
fn blank_event() -> OomVictimEvent {
    OomVictimEvent {
        kind: RecordKind::OomVictim as u32,
        flags: 0,
        boot_time_ns: unsafe { bpf_ktime_get_boot_ns() },
        memcg_id: 0,
        total_vm_pages: 0,
        anon_rss_pages: 0,
        file_rss_pages: 0,
        shmem_rss_pages: 0,
        pid: 0,
        tgid: 0,
        trigger_tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        _reserved: 0,
        comm: [0; COMM_LEN],
    }
}
