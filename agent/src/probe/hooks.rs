//! Which kernel hooks the probe attaches, chosen from the running kernel's
//! BTF (never from its version number): the OOM path takes the victim's
//! `task_struct` from `oom/mark_victim` where the tracepoint passes it
//! (Linux 6.2 and later), and otherwise pairs the pid-only `mark_victim`
//! with `signal/signal_generate` (the SIGKILL the OOM killer sends its
//! victim just before marking it).

use agent_common::programs::{self, AttachPoint};
use btf_rs::Btf;
use serde::Serialize;

use super::btf::{self, BtfError};

/// What a hook is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Role {
    /// Cgroups made and removed (id → path).
    Cgroup,
    /// OOM victims.
    Oom,
    /// Memory growth (`sched_stat_runtime`: the running task's cgroup).
    Growth,
}

/// One tracepoint to attach, and what for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hook {
    pub point: AttachPoint,
    /// `category/name`, as in tracefs (`oom/mark_victim`).
    pub label: &'static str,
    pub role: Role,
}

/// How the kernel's `mark_victim` tracepoint names its victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VictimForm {
    /// `struct task_struct *` (Linux 6.2 and later).
    Task,
    /// `int pid` only (before 6.2).
    Pid,
    /// Tests only: the kernel passes the task, but the probe takes only its
    /// pid and finds the victim the [`VictimForm::Pid`] way.
    TaskAsPid,
}

impl VictimForm {
    pub(crate) fn of(btf: &Btf) -> Result<VictimForm, BtfError> {
        Ok(if btf::mark_victim_passes_task(btf)? {
            VictimForm::Task
        } else {
            VictimForm::Pid
        })
    }
}

/// The growth program to attach, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Growth {
    Off,
    Program,
    /// Benchmarks: an empty program on the same hook.
    Floor,
}

/// The hooks for this kernel, in attach order: the cgroup lifecycle first
/// (a cgroup made between two attaches is then never missed by the OOM
/// path's resolver), the SIGKILL memory before the `mark_victim` that
/// reads it, the growth program last.
pub(crate) fn plan(form: VictimForm, growth: Growth) -> Vec<Hook> {
    let hook = |point, label, role| Hook { point, label, role };
    let mut hooks = vec![
        hook(programs::CGROUP_MKDIR, "cgroup/cgroup_mkdir", Role::Cgroup),
        hook(programs::CGROUP_RMDIR, "cgroup/cgroup_rmdir", Role::Cgroup),
    ];
    match form {
        VictimForm::Task => hooks.push(hook(
            programs::OOM_MARK_VICTIM,
            "oom/mark_victim",
            Role::Oom,
        )),
        VictimForm::Pid | VictimForm::TaskAsPid => {
            hooks.push(hook(
                programs::SIGNAL_GENERATE,
                "signal/signal_generate",
                Role::Oom,
            ));
            let mark = if form == VictimForm::Pid {
                programs::OOM_MARK_VICTIM_PID
            } else {
                programs::OOM_MARK_VICTIM_AS_PID
            };
            hooks.push(hook(mark, "oom/mark_victim", Role::Oom));
        }
    }
    match growth {
        Growth::Off => {}
        Growth::Program => hooks.push(hook(
            programs::GROWTH,
            "sched/sched_stat_runtime",
            Role::Growth,
        )),
        Growth::Floor => hooks.push(hook(
            programs::GROWTH_FLOOR,
            "sched/sched_stat_runtime",
            Role::Growth,
        )),
    }
    hooks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_only_kernels_remember_sigkills_before_marking() {
        let labels = |hooks: Vec<Hook>| hooks.iter().map(|h| h.point.btf).collect::<Vec<_>>();
        assert_eq!(
            labels(plan(VictimForm::Pid, Growth::Program)),
            [
                "cgroup_mkdir_btf",
                "cgroup_rmdir_btf",
                "signal_generate_btf",
                "oom_mark_victim_pid_btf",
                "growth_btf"
            ]
        );
        assert_eq!(
            labels(plan(VictimForm::Task, Growth::Off)),
            [
                "cgroup_mkdir_btf",
                "cgroup_rmdir_btf",
                "oom_mark_victim_btf"
            ]
        );
        assert_eq!(
            labels(plan(VictimForm::TaskAsPid, Growth::Floor)),
            [
                "cgroup_mkdir_btf",
                "cgroup_rmdir_btf",
                "signal_generate_btf",
                "oom_mark_victim_as_pid_btf",
                "growth_floor_btf"
            ]
        );
    }
}
