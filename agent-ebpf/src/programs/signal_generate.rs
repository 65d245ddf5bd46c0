//! `signal/signal_generate`, attached only where `oom/mark_victim` passes
//! just a pid (Linux < 6.2): the OOM killer sends the victim SIGKILL right
//! before it marks it, so remembering each SIGKILL's target task by pid
//! lets the pid-only `mark_victim` program find the victim's `task_struct`.
//!
//! `TP_PROTO(int sig, struct kernel_siginfo *info, struct task_struct
//! *task, int group, int result)`.

use agent_common::result;
use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};

use crate::maps::{OFFSETS, SIGKILLED, read, ret};

const SIGKILL: u64 = 9;

#[btf_tracepoint(function = "signal_generate")]
pub fn signal_generate_btf(ctx: BtfTracePointContext) -> i32 {
    let sig: u64 = ctx.arg(0);
    ret(try_remember(sig, ctx.arg(2)))
}

#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate_raw(ctx: RawTracePointContext) -> i32 {
    let sig: u64 = ctx.arg(0);
    ret(try_remember(sig, ctx.arg(2)))
}

fn try_remember(sig: u64, task: *const u8) -> Result<(), i32> {
    // `int sig`: only the low 32 bits are the argument.
    if sig & 0xffff_ffff != SIGKILL || task.is_null() {
        return Ok(());
    }
    let off = OFFSETS.load();
    if off.valid == 0 {
        return Err(result::NO_INPUT);
    }
    let pid: i32 = read(task, off.task_pid)?;
    SIGKILLED.insert(pid as u32, task as u64, 0).map_err(|_| 2)
}
