//! `memwatch doctor`: what this kernel and these privileges allow, and
//! which source `memwatch run` would use.

use std::{fmt::Write as _, fs, path::Path};

use agent_common::programs;
use caps::{CapSet, Capability};

use btf_rs::Btf;

use crate::{
    cgroup::{
        CgroupError, CgroupVersion, MemoryHierarchy,
        pressure::{self, HOST_PRESSURE, PressureError},
    },
    model::pressure::Pressure,
    probe::{
        btf,
        ebpf::{AttachedHook, EbpfProbe, ProbeOptions, ProgramSize},
        hooks::VictimForm,
    },
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    Ok,
    /// Works, with a caveat.
    Warn,
    /// Missing or refused.
    Fail,
}

#[derive(Debug, serde::Serialize)]
pub(crate) struct Check {
    pub name: String,
    pub state: State,
    pub detail: String,
}

fn check(name: impl Into<String>, state: State, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        state,
        detail: detail.into(),
    }
}

/// Everything the doctor found, for `memwatch doctor --json` (what
/// `cargo xtask vm-test` writes docs/kernels.md from).
#[derive(Debug, serde::Serialize)]
pub(crate) struct Report {
    /// `uname -r`.
    pub kernel: String,
    /// Whether `memwatch run` would find a usable source.
    pub usable: bool,
    /// `ebpf`, `poll` or `none`.
    pub source: &'static str,
    /// Every hook the probe attached (empty without eBPF).
    pub hooks: Vec<AttachedHook>,
    /// How memory growth is followed.
    pub growth: String,
    /// How OOM victims are found.
    pub oom: String,
    /// Each program loaded, with its size as the kernel holds it (empty
    /// without eBPF).
    pub programs: Vec<ProgramSize>,
    /// The table; the last row is the verdict.
    pub rows: Vec<Check>,
}

/// Runs every check, and loads and attaches the probe as `run` would.
pub(crate) fn report(btf_path: &Path, options: &ProbeOptions) -> Report {
    let mut rows = Vec::new();
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    rows.push(check("kernel", State::Ok, release.trim()));
    let victim_form = match btf::load(btf_path) {
        Ok(b) => {
            rows.push(check("BTF", State::Ok, btf_path.display().to_string()));
            btf_checks(&b, &mut rows)
        }
        Err(e) => {
            rows.push(check("BTF", State::Fail, e.to_string()));
            None
        }
    };
    let hierarchy = MemoryHierarchy::discover();
    host_checks(&hierarchy, &mut rows);
    let found = probe_checks(btf_path, options, victim_form, &hierarchy, &mut rows);
    Report {
        kernel: release.trim().to_string(),
        usable: hierarchy.is_ok(),
        source: found.source,
        hooks: found.hooks,
        growth: found.growth,
        oom: found.oom,
        programs: found.programs,
        rows,
    }
}

/// What `run` would follow memory and OOM kills with.
struct Sources {
    source: &'static str,
    hooks: Vec<AttachedHook>,
    growth: String,
    oom: String,
    programs: Vec<ProgramSize>,
}

/// The checks that read the kernel's BTF: struct offsets, the OOM
/// tracepoint's form, the growth offsets, the tracepoints the programs
/// attach to. Returns the OOM tracepoint's form when it resolves.
fn btf_checks(b: &Btf, rows: &mut Vec<Check>) -> Option<VictimForm> {
    let offsets = btf::kernel_offsets(b);
    rows.push(match &offsets {
        Ok(_) => check(
            "struct offsets",
            State::Ok,
            "every field the programs read resolves",
        ),
        Err(e) => check("struct offsets", State::Fail, e.to_string()),
    });
    let victim_form = VictimForm::of(b).ok();
    rows.push(match VictimForm::of(b) {
        Ok(VictimForm::Task) => check(
            "oom/mark_victim",
            State::Ok,
            "passes the victim's task_struct",
        ),
        Ok(VictimForm::Pid | VictimForm::TaskAsPid) => check(
            "oom/mark_victim",
            State::Ok,
            "passes only a pid (Linux < 6.2): the victim's task comes from \
             signal/signal_generate (the OOM killer's SIGKILL)",
        ),
        Err(e) => check("oom/mark_victim", State::Fail, e.to_string()),
    });
    // Resolving offsets walks every BTF type once: reuse the result.
    let mut growth = offsets.unwrap_or_default();
    rows.push(match btf::growth_offsets(b, &mut growth) {
        Ok(()) => check(
            "growth offsets",
            State::Ok,
            "mm->owner, css parent, memcg usage resolve",
        ),
        Err(e) => check(
            "growth offsets",
            State::Warn,
            format!("{e}: growth sampled only"),
        ),
    });
    for point in [
        programs::CGROUP_MKDIR,
        programs::CGROUP_RMDIR,
        programs::GROWTH,
    ] {
        let category = if point.tracepoint == programs::GROWTH.tracepoint {
            "sched"
        } else {
            "cgroup"
        };
        let name = format!("{category}/{}", point.tracepoint);
        let typedef = format!("btf_trace_{}", point.tracepoint);
        rows.push(match b.resolve_types_by_name(&typedef) {
            Ok(found) if !found.is_empty() => check(name, State::Ok, "present"),
            _ => check(name, State::Fail, "absent"),
        });
    }
    victim_form
}

/// The host's side: the memory controller, bpffs, capabilities, lockdown,
/// program statistics.
fn host_checks(hierarchy: &Result<MemoryHierarchy, CgroupError>, rows: &mut Vec<Check>) {
    rows.push(match hierarchy {
        Ok(h) => check(
            "memory controller",
            State::Ok,
            format!("cgroup {} at {}", h.version, h.root.display()),
        ),
        Err(e) => check("memory controller", State::Fail, e.to_string()),
    });
    rows.push(check(
        "bpffs",
        if is_mounted("/sys/fs/bpf", "bpf") {
            State::Ok
        } else {
            State::Warn
        },
        if is_mounted("/sys/fs/bpf", "bpf") {
            "mounted at /sys/fs/bpf"
        } else {
            "not mounted at /sys/fs/bpf (not needed yet: nothing is pinned)"
        },
    ));
    for (cap, why) in [
        (Capability::CAP_BPF, "load programs, make maps"),
        (
            Capability::CAP_PERFMON,
            "tracing programs, read kernel memory",
        ),
        (Capability::CAP_SYS_ADMIN, "covers both above"),
    ] {
        let has = caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false);
        rows.push(check(
            cap.to_string(),
            if has { State::Ok } else { State::Warn },
            format!("{} ({why})", if has { "held" } else { "not held" }),
        ));
    }
    rows.push(psi_check(
        pressure::host(),
        hierarchy.as_ref().ok().map(|h| h.version),
    ));
    if let Ok(lockdown) = fs::read_to_string("/sys/kernel/security/lockdown") {
        rows.push(check("lockdown", State::Ok, lockdown.trim()));
    }
    if let Ok(stats) = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled") {
        rows.push(check(
            "bpf_stats_enabled",
            State::Ok,
            format!(
                "{} (1 lets the agent report program run time)",
                stats.trim()
            ),
        ));
    }
}

/// Memory pressure stall information: the host's file, and whether
/// workers' cgroups have theirs (cgroup v2 only).
fn psi_check(host: Result<Pressure, PressureError>, version: Option<CgroupVersion>) -> Check {
    let workers = match version {
        Some(CgroupVersion::V2) => "workers' memory.pressure read on cgroup v2",
        _ => {
            "no per-worker PSI: memory is on cgroup v1 here (memory.pressure is v2 only), \
             so `pressure_limit` never fires"
        }
    };
    match host {
        Ok(p) => check(
            "memory PSI",
            if version == Some(CgroupVersion::V2) {
                State::Ok
            } else {
                State::Warn
            },
            format!(
                "{HOST_PRESSURE}: some avg10 {:.2}%{}; {workers}",
                p.some.avg10 * 100.0,
                if p.full.is_some() {
                    ""
                } else {
                    " (no `full` line: Linux before 5.13)"
                }
            ),
        ),
        Err(PressureError::Unsupported(e)) => check(
            "memory PSI",
            State::Warn,
            format!(
                "{HOST_PRESSURE}: {e}: this kernel has no PSI (CONFIG_PSI) or it is off (psi=0); \
                 the memwatch_memory_pressure_* metrics are absent and `pressure_limit` never fires"
            ),
        ),
        Err(e) => check("memory PSI", State::Warn, format!("{HOST_PRESSURE}: {e}")),
    }
}

/// What `run` would use, found the real way: load and attach the probe,
/// then detach.
fn probe_checks(
    btf_path: &Path,
    options: &ProbeOptions,
    victim_form: Option<VictimForm>,
    hierarchy: &Result<MemoryHierarchy, CgroupError>,
    rows: &mut Vec<Check>,
) -> Sources {
    // The real test: load and attach the probe as `run` would, then detach.
    // Without it, `run` polls the cgroup files (when there are any).
    let probe = EbpfProbe::load(btf_path, options);
    let usable = hierarchy.is_ok();
    let (source, hooks, growth, oom, programs) = match &probe {
        Ok(p) => {
            for hook in p.hooks() {
                rows.push(check(
                    format!("hook {}", hook.tracepoint),
                    State::Ok,
                    format!("{} ({:?})", hook.attach.as_str(), hook.role).to_lowercase(),
                ));
            }
            let growth = match p.growth_unavailable() {
                None => "kernel (sched/sched_stat_runtime)".to_string(),
                Some(_) => "sampling (cgroup files)".to_string(),
            };
            let oom = match victim_form {
                Some(VictimForm::Pid) => "mark_victim (pid) + signal_generate (task)",
                _ => "mark_victim (task)",
            };
            let programs = p.program_sizes();
            let insns: u32 = programs.iter().map(|p| p.translated_insns).sum();
            rows.push(check(
                "programs",
                State::Ok,
                format!(
                    "{} loaded, {insns} instructions after the verifier",
                    programs.len()
                ),
            ));
            (
                "ebpf",
                p.hooks().to_vec(),
                growth,
                oom.to_string(),
                programs,
            )
        }
        Err(_) if usable => (
            "poll",
            Vec::new(),
            "sampling (cgroup files)".to_string(),
            "poll (oom_kill counters)".to_string(),
            Vec::new(),
        ),
        Err(_) => (
            "none",
            Vec::new(),
            "none".to_string(),
            "none".to_string(),
            Vec::new(),
        ),
    };
    rows.push(match (probe, hierarchy) {
        (Err(e), Ok(_)) => check(
            "source for `run`",
            State::Warn,
            format!(
                "poll (the cgroup files, every second; victims unnamed): eBPF unavailable: {e}"
            ),
        ),
        (Err(e), Err(_)) => check(
            "source for `run`",
            State::Fail,
            format!("none: {e}; no memory cgroup files to poll"),
        ),
        (Ok(p), _) => check(
            "source for `run`",
            State::Ok,
            format!(
                "ebpf ({}): programs load and attach",
                p.attach_kind().as_str()
            ),
        ),
    });
    Sources {
        source,
        hooks,
        growth,
        oom,
        programs,
    }
}

/// `memwatch doctor`: the table (or `--json`); exit 1 when no source is usable.
pub(crate) fn run(args: &super::DoctorArgs) -> std::process::ExitCode {
    let options = ProbeOptions {
        log: args.probe_log,
        object: args.probe_object.clone(),
        ..ProbeOptions::default()
    };
    let report = report(&args.btf_path, &options);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(error) => eprintln!("memwatch: doctor: {error}"),
        }
    } else {
        print!("{}", render(&report.rows));
    }
    if report.usable {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

pub(crate) fn render(rows: &[Check]) -> String {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for row in rows {
        let state = match row.state {
            State::Ok => "ok",
            State::Warn => "warn",
            State::Fail => "FAIL",
        };
        let _ = writeln!(out, "{:<width$}  {:<4}  {}", row.name, state, row.detail);
    }
    out
}

fn is_mounted(point: &str, fs_type: &str) -> bool {
    fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let mut fields = l.split_whitespace();
            let (_, mount, kind) = (fields.next(), fields.next(), fields.next());
            mount == Some(point) && kind == Some(fs_type)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_names_and_shouts_failures() {
        let rows = vec![
            check("BTF", State::Ok, "/sys/kernel/btf/vmlinux"),
            check(
                "source for `run`",
                State::Fail,
                "none: missing capability CAP_BPF",
            ),
        ];
        assert_eq!(
            render(&rows),
            "BTF               ok    /sys/kernel/btf/vmlinux\n\
             source for `run`  FAIL  none: missing capability CAP_BPF\n"
        );
    }

    #[test]
    fn the_psi_row_says_when_the_kernel_has_none() {
        let missing = io_error(std::io::ErrorKind::NotFound);
        let row = psi_check(
            Err(PressureError::Unsupported(missing)),
            Some(CgroupVersion::V2),
        );
        assert_eq!(row.state, State::Warn);
        assert!(row.detail.contains("no PSI"), "{}", row.detail);
        let eopnotsupp = std::io::Error::from_raw_os_error(libc::EOPNOTSUPP);
        assert!(
            psi_check(Err(PressureError::Unsupported(eopnotsupp)), None)
                .detail
                .contains("psi=0")
        );
        let some_only = pressure::parse("some avg10=1.00 avg60=0 avg300=0 total=5\n")
            .pressure
            .unwrap();
        let row = psi_check(Ok(some_only), Some(CgroupVersion::V1));
        assert_eq!(row.state, State::Warn, "{}", row.detail);
        assert!(row.detail.contains("some avg10 1.00%"), "{}", row.detail);
        assert!(row.detail.contains("cgroup v1"), "{}", row.detail);
        assert!(row.detail.contains("no `full` line"), "{}", row.detail);
        let row = psi_check(Ok(some_only), Some(CgroupVersion::V2));
        assert_eq!(row.state, State::Ok);
        // This host, for real: it has the file.
        let here = report_psi_row();
        assert!(here.detail.contains(HOST_PRESSURE), "{}", here.detail);
    }

    fn io_error(kind: std::io::ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, "fixture")
    }

    fn report_psi_row() -> Check {
        psi_check(
            pressure::host(),
            MemoryHierarchy::discover().ok().map(|h| h.version),
        )
    }

    #[test]
    fn a_missing_btf_file_is_a_named_failure_and_polling_is_left() {
        let Report { rows, usable, .. } =
            report(Path::new("/nonexistent/vmlinux"), &ProbeOptions::default());
        let btf = rows.iter().find(|r| r.name == "BTF").unwrap();
        assert_eq!(btf.state, State::Fail);
        assert!(
            btf.detail.contains("/nonexistent/vmlinux"),
            "{}",
            btf.detail
        );
        // No eBPF: polling the cgroup files is what is left, where there are any.
        let verdict = rows.last().unwrap();
        assert_eq!(usable, MemoryHierarchy::discover().is_ok());
        if usable {
            assert!(verdict.detail.starts_with("poll"), "{}", verdict.detail);
        } else {
            assert_eq!(verdict.state, State::Fail);
        }
    }
}
