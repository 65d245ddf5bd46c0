//! `cgroup/cgroup_mkdir` and `cgroup/cgroup_rmdir`: every cgroup made or
//! removed, in every hierarchy, with its id and path. User space keeps a
//! map id → path from these, so a cgroup resolves even after it is gone,
//! and a new task cgroup is noticed the moment it appears.
//!
//! `TP_PROTO(struct cgroup *cgrp, const char *path)`; rare events, so one
//! record each.

use agent_common::{CgroupRecord, ProbeCounter, RecordKind, result};
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_ktime_get_boot_ns, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use crate::{
    log,
    maps::{EVENTS, OFFSETS, count, read, ret},
};

#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir_btf(ctx: BtfTracePointContext) -> i32 {
    record::<false, _>(&ctx, RecordKind::CgroupMkdir, ctx.arg(0), ctx.arg(1))
}

#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir_btf_log(ctx: BtfTracePointContext) -> i32 {
    record::<true, _>(&ctx, RecordKind::CgroupMkdir, ctx.arg(0), ctx.arg(1))
}

#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn cgroup_mkdir_raw(ctx: RawTracePointContext) -> i32 {
    record::<false, _>(&ctx, RecordKind::CgroupMkdir, ctx.arg(0), ctx.arg(1))
}

#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn cgroup_mkdir_raw_log(ctx: RawTracePointContext) -> i32 {
    record::<true, _>(&ctx, RecordKind::CgroupMkdir, ctx.arg(0), ctx.arg(1))
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir_btf(ctx: BtfTracePointContext) -> i32 {
    record::<false, _>(&ctx, RecordKind::CgroupRmdir, ctx.arg(0), ctx.arg(1))
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir_btf_log(ctx: BtfTracePointContext) -> i32 {
    record::<true, _>(&ctx, RecordKind::CgroupRmdir, ctx.arg(0), ctx.arg(1))
}

#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn cgroup_rmdir_raw(ctx: RawTracePointContext) -> i32 {
    record::<false, _>(&ctx, RecordKind::CgroupRmdir, ctx.arg(0), ctx.arg(1))
}

#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn cgroup_rmdir_raw_log(ctx: RawTracePointContext) -> i32 {
    record::<true, _>(&ctx, RecordKind::CgroupRmdir, ctx.arg(0), ctx.arg(1))
}

/// A program's run: the record, and with `LOG` (the `_log` twins, loaded
/// under `--probe-log`) what became of it in the log. Without `LOG` no
/// logging code is compiled in at all.
#[inline(always)]
fn record<const LOG: bool, C: EbpfContext>(
    ctx: &C,
    kind: RecordKind,
    cgroup: *const u8,
    path: *const u8,
) -> i32 {
    let result = try_record(kind, cgroup, path);
    if LOG {
        log::cgroup_record(ctx, &result);
    }
    ret(result)
}

fn try_record(kind: RecordKind, cgroup: *const u8, path: *const u8) -> Result<(), i32> {
    let off = OFFSETS.load();
    if off.valid == 0 || cgroup.is_null() {
        return Err(result::NO_INPUT);
    }
    let Some(mut entry) = EVENTS.reserve::<CgroupRecord>(0) else {
        count(ProbeCounter::RingbufFull);
        return Err(result::RINGBUF_FULL);
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points at the reserved, exclusively owned entry; the
    // fields are written in place (the path is too big for the BPF stack).
    unsafe {
        (*record).kind = kind as u32;
        (*record).boot_time_ns = bpf_ktime_get_boot_ns();
        let kn: Result<*const u8, i32> = read(cgroup, off.cgroup_kn);
        let id = kn.and_then(|kn| read::<u64>(kn, off.kernfs_node_id));
        let level = read::<i32>(cgroup, off.cgroup_level);
        if id.is_err() || level.is_err() {
            count(ProbeCounter::ReadErrors);
        }
        (*record).id = id.unwrap_or(0);
        (*record).level = level.unwrap_or(0) as u32;
        let buf = &mut (*record).path;
        if bpf_probe_read_kernel_str_bytes(path, buf).is_err() {
            buf[0] = 0;
            count(ProbeCounter::ReadErrors);
        }
    }
    entry.submit(0);
    Ok(())
}
