//! `memwatch exec`: runs a command as a watched task in a fresh memory
//! cgroup, registered with the local agent, and reports how it ended.

use std::{
    convert::Infallible,
    fs::OpenOptions,
    future::pending,
    io,
    os::{fd::AsRawFd as _, unix::process::ExitStatusExt as _},
    path::{Path, PathBuf},
    pin::pin,
    process::ExitStatus,
};

use tokio::signal::unix::{SignalKind, signal};
use tracing::warn;

use crate::{
    cgroup::{
        MemoryHierarchy, OwnedCgroup,
        safe::{self, CreateError},
    },
    cmd::ExecArgs,
    cmd::client::{AgentClient, Registered},
    cmd::warn::{self, Cursor, WarnPolicy, WarnSignal},
    daemon::status::AgentStatus,
};

/// Environment variables exec removes from its child's.
const MEMWATCH_ENV_PREFIX: &str = "MEMWATCH_";
/// The parent of tasks of a worker without a cgroup, in the memory root.
const SHARED_PARENT: &str = "memwatch";

/// The agent rejected the task: its worker is unhealthy (EX_TEMPFAIL: try
/// elsewhere).
pub(crate) const EXIT_REJECTED: u8 = 75;
/// The agent could not be asked, or refused the request (EX_UNAVAILABLE).
pub(crate) const EXIT_AGENT_UNAVAILABLE: u8 = 69;
/// The task's cgroup could not be made (EX_OSERR), or its parent is not a
/// cgroup directory reached without a symlink.
pub(crate) const EXIT_SETUP: u8 = 71;
/// The task's cgroup exists already (EX_CANTCREAT): never taken over.
pub(crate) const EXIT_CGROUP_EXISTS: u8 = 73;
/// As shells do: found but not runnable, and not found.
pub(crate) const EXIT_CANNOT_RUN: u8 = 126;
pub(crate) const EXIT_NOT_FOUND: u8 = 127;

pub(crate) async fn exec(args: &ExecArgs) -> u8 {
    let client = match AgentClient::new(&args.agent) {
        Ok(client) => client,
        Err(error) => return fail(EXIT_AGENT_UNAVAILABLE, error),
    };
    let task_id = args.task_id.clone().unwrap_or_else(default_task_id);
    let status = match client.status().await {
        Ok(status) => status,
        Err(error) => return fail(EXIT_AGENT_UNAVAILABLE, error),
    };
    let parent = match task_parent(&status, args.worker.as_deref()) {
        Ok(parent) => parent,
        Err(error) => return fail(EXIT_AGENT_UNAVAILABLE, error),
    };
    // Events after this seq are the task's own (read before registering,
    // so none of them is missed).
    let cursor = Cursor {
        epoch: status.outbox.epoch.clone(),
        after: status.outbox.last_seq,
    };
    let cgroup = match make_cgroup(&parent, &task_id, args.hard_cap) {
        Ok(cgroup) => cgroup,
        Err(error) => {
            let code = match error {
                CreateError::Exists(_) => EXIT_CGROUP_EXISTS,
                _ => EXIT_SETUP,
            };
            return fail(
                code,
                anyhow::anyhow!("cannot set up the task's cgroup: {error}"),
            );
        }
    };
    let registration = serde_json::json!({
        "task_id": task_id,
        "worker": args.worker,
        "cgroup": cgroup.path(),
        "soft_cap_bytes": args.soft_cap,
    });
    match client.register(&registration).await {
        Ok(Registered::Accepted(answer)) => {
            if let Some(reason) = answer.reason {
                eprintln!("memwatch: task {task_id} accepted, flagged: {reason}");
            }
        }
        Ok(Registered::Rejected(answer)) => {
            eprintln!(
                "memwatch: task {task_id} rejected by worker {}: {}",
                answer.worker,
                answer.reason.unwrap_or_default()
            );
            return EXIT_REJECTED;
        }
        Err(error) => return fail(EXIT_AGENT_UNAVAILABLE, error),
    }

    let warner = args.warn_signal.as_ref().map(|signal| Warner {
        client: &client,
        task_id: &task_id,
        signal,
        cursor,
    });
    let (code, oom_killed) = match run_in(&cgroup, &args.command, warner).await {
        Ok(status) => {
            let oom_killed =
                cgroup.oom_kills().unwrap_or(0) > 0 && status.signal() == Some(libc::SIGKILL);
            (exit_code(status), oom_killed)
        }
        Err(error) => {
            eprintln!("memwatch: cannot run {}: {error}", args.command[0]);
            let code = match error.kind() {
                io::ErrorKind::NotFound => EXIT_NOT_FOUND,
                _ => EXIT_CANNOT_RUN,
            };
            (code, false)
        }
    };
    if let Err(error) = client
        .finish(&task_id, Some(i32::from(code)), oom_killed)
        .await
    {
        warn!(%error, task_id, "could not tell the agent the task ended");
    }
    if let Err(error) = cgroup.remove() {
        warn!(%error, "could not remove the task's cgroup");
    }
    code
}

/// `--warn-signal`: what the child is sent, and whose events say when.
struct Warner<'a> {
    client: &'a AgentClient,
    task_id: &'a str,
    signal: &'a WarnSignal,
    /// The outbox's last seq before the task was registered.
    cursor: Cursor,
}

impl Warner<'_> {
    /// Follows the task's events for ever, signalling `pid` when its kill
    /// is imminent. Only run while the child is not yet reaped, so the pid
    /// is still the child's.
    async fn run(self, pid: i32, program: &str) -> Infallible {
        let policy = WarnPolicy::new(self.task_id);
        warn::follow(self.client, policy, self.cursor, |eta| {
            // SAFETY: kill(2) to our own child, not yet reaped.
            let sent = match unsafe { libc::kill(pid, self.signal.number) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            };
            let eta = if eta.is_finite() {
                format!("ETA {eta:.1} s")
            } else {
                "no ETA".to_string()
            };
            match sent {
                Ok(()) => eprintln!(
                    "memwatch: sent {} to {program} (pid {pid}): its kill is imminent, {eta} \
                     (task {})",
                    self.signal.name, self.task_id
                ),
                Err(error) => eprintln!(
                    "memwatch: could not send {} to {program} (pid {pid}) ({eta}): {error}",
                    self.signal.name
                ),
            }
        })
        .await
    }
}

/// Spawns `command` inside the cgroup (it moves itself in before exec, so
/// not one page is charged elsewhere) and waits, passing on SIGINT,
/// SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2, and with `--warn-signal`
/// signalling it when its kill is imminent. A wrapper must not die of a
/// signal meant for its command: Slurm's `scancel --signal=USR1` reaches
/// every process of the job's step, exec included.
async fn run_in(
    cgroup: &OwnedCgroup,
    command: &[String],
    warner: Option<Warner<'_>>,
) -> io::Result<ExitStatus> {
    let procs = OpenOptions::new().write(true).open(cgroup.procs_file())?;
    let procs_fd = procs.as_raw_fd();
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    // The workload is not memwatch's client: it gets none of exec's
    // settings, the agent's token above all.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(MEMWATCH_ENV_PREFIX) {
            cmd.env_remove(key);
        }
    }
    // SAFETY: between fork and exec only write(2), which is
    // async-signal-safe, on an fd opened before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(procs);
    let pid = child.id().map(|p| p as i32);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let mut warning = pin!(async {
        match (warner, pid) {
            (Some(warner), Some(pid)) => warner.run(pid, &command[0]).await,
            _ => pending().await,
        }
    });
    loop {
        let forward = tokio::select! {
            status = child.wait() => return status,
            never = &mut warning => match never {},
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
            _ = hup.recv() => libc::SIGHUP,
            _ = usr1.recv() => libc::SIGUSR1,
            _ = usr2.recv() => libc::SIGUSR2,
        };
        if let Some(pid) = pid {
            // SAFETY: kill(2) to our own child.
            unsafe { libc::kill(pid, forward) };
        }
    }
}

/// CMD's own status; 128+N for death by signal N (137 for an OOM kill).
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

/// The worker's cgroup when it has one (tasks must be inside it for the
/// residual memory to add up), else `<memory root>/memwatch`.
fn task_parent(status: &AgentStatus, worker: Option<&str>) -> anyhow::Result<PathBuf> {
    let workers = &status.workers;
    let chosen = match worker {
        Some(name) => workers.iter().find(|w| w.name == name),
        None if workers.len() == 1 => workers.first(),
        None => None,
    };
    if let Some(cgroup) = chosen.and_then(|w| w.cgroup.as_deref()) {
        return Ok(PathBuf::from(cgroup));
    }
    let hierarchy = MemoryHierarchy::discover()?;
    Ok(hierarchy.root.join(SHARED_PARENT))
}

/// The task's cgroup, made new in `parent` (checked: a cgroup directory
/// reached without a symlink), with its hard cap.
fn make_cgroup(
    parent: &Path,
    task_id: &str,
    hard_cap: Option<u64>,
) -> Result<OwnedCgroup, CreateError> {
    // The shared parent is made on first use, on the checked root.
    if parent.file_name().is_some_and(|n| n == SHARED_PARENT)
        && let Some(root) = parent.parent()
    {
        safe::ensure_dir_in(root, SHARED_PARENT)?;
    }
    let cgroup = safe::create_in(parent, &cgroup_name(task_id))?;
    if let Some(bytes) = hard_cap {
        cgroup
            .set_hard_limit(bytes)
            .map_err(|source| CreateError::Io {
                path: cgroup.path().to_path_buf(),
                source,
            })?;
    }
    Ok(cgroup)
}

/// A directory name for a task id, one to one: ASCII letters, digits and
/// `-` stay, `_` becomes `__`, any other byte `_XX` (its hex), so no two
/// ids share a name (`a.b` is `task-a_2Eb`, `a_b` is `task-a__b`) and none
/// leaves its parent.
fn cgroup_name(task_id: &str) -> String {
    let mut name = String::with_capacity(task_id.len() + 5);
    name.push_str("task-");
    for byte in task_id.bytes() {
        match byte {
            b'_' => name.push_str("__"),
            b if b.is_ascii_alphanumeric() || b == b'-' => name.push(char::from(b)),
            b => name.push_str(&format!("_{b:02X}")),
        }
    }
    name
}

/// `exec-<pid>-<millis>`; inside a Slurm job `slurm-<job id>-<pid>-<millis>`,
/// so a Slurm sink can requeue the job when the task is OOM-killed.
fn default_task_id() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let job = std::env::var("SLURM_JOB_ID")
        .ok()
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
    match job {
        Some(job) => format!("slurm-{job}-{}-{millis}", std::process::id()),
        None => format!("exec-{}-{millis}", std::process::id()),
    }
}

fn fail(code: u8, error: anyhow::Error) -> u8 {
    eprintln!("memwatch: {error:#}");
    code
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn cgroup_names_cannot_escape_their_parent_and_never_collide() {
        assert_eq!(cgroup_name("../../etc"), "task-_2E_2E_2F_2E_2E_2Fetc");
        assert_eq!(cgroup_name("job-7_a"), "task-job-7__a");
        // These all were `task-a_b` once.
        let ids = [
            "a.b", "a_b", "a/b", "a b", "a__b", "a_2Eb", "a\u{e9}b", "a\u{c3}b",
        ];
        let names: BTreeSet<String> = ids.iter().map(|id| cgroup_name(id)).collect();
        assert_eq!(names.len(), ids.len(), "{names:?}");
        for name in &names {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{name}"
            );
        }
    }

    /// Every id of up to 3 characters from an alphabet holding the escape
    /// characters themselves: no two names are the same.
    #[test]
    fn cgroup_names_are_one_to_one_on_every_short_id() {
        let alphabet = ['a', '_', '2', 'E', '.', '-', '/'];
        let mut ids = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = ids
                .iter()
                .flat_map(|id| alphabet.iter().map(move |c| format!("{id}{c}")))
                .collect();
            ids.extend(longer);
        }
        let ids: BTreeSet<String> = ids.into_iter().collect();
        let names: BTreeSet<String> = ids.iter().map(|id| cgroup_name(id)).collect();
        assert_eq!(names.len(), ids.len());
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
    }
}
