//! Field debugging of the programs (`memwatch run --probe-log`): aya-log
//! records, read by the agent and written to its log (target
//! `agent_ebpf`). The programs that log are twins of the plain ones
//! (`_log` appended, a `const LOG: bool` of the same entry code), and the
//! agent loads them only when asked: off, the kernel holds no logging code
//! at all. tests/kernel/probe_log.rs shows it by the programs' instruction
//! counts after the verifier, against a build without the `log` feature.

#[cfg(feature = "log")]
use aya_ebpf::EbpfContext;

/// An OOM victim recorded (info, its pid) or not (warn, the code).
#[cfg(feature = "log")]
#[inline(always)]
pub fn oom_victim<C: EbpfContext>(ctx: &C, result: &Result<u32, i32>) {
    match result {
        Ok(pid) => aya_log_ebpf::info!(ctx, "mark_victim: OOM victim pid {} recorded", *pid),
        Err(code) => aya_log_ebpf::warn!(ctx, "mark_victim: victim not recorded (code {})", *code),
    }
}

/// An OOM victim known by pid only (Linux < 6.2) recorded or not.
#[cfg(feature = "log")]
#[inline(always)]
pub fn oom_victim_pid<C: EbpfContext>(ctx: &C, pid: u32, result: &Result<(), i32>) {
    match result {
        Ok(()) => aya_log_ebpf::info!(ctx, "mark_victim: OOM victim pid {} recorded", pid),
        Err(code) => aya_log_ebpf::warn!(
            ctx,
            "mark_victim: victim pid {} not recorded (code {})",
            pid,
            *code
        ),
    }
}

/// A cgroup record that could not be made (warn, the code).
#[cfg(feature = "log")]
#[inline(always)]
pub fn cgroup_record<C: EbpfContext>(ctx: &C, result: &Result<(), i32>) {
    if let Err(code) = result {
        aya_log_ebpf::warn!(ctx, "cgroup record not made (code {})", *code);
    }
}

// Without the feature: the same calls, no code.
#[cfg(not(feature = "log"))]
#[inline(always)]
pub fn oom_victim<C>(_: &C, _: &Result<u32, i32>) {}

#[cfg(not(feature = "log"))]
#[inline(always)]
pub fn oom_victim_pid<C>(_: &C, _: u32, _: &Result<(), i32>) {}

#[cfg(not(feature = "log"))]
#[inline(always)]
pub fn cgroup_record<C>(_: &C, _: &Result<(), i32>) {}
