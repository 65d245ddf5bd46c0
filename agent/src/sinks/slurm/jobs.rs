//! Which Slurm job a task belongs to, as Slurm itself says it: the proof
//! a requeue needs. A task id such as `slurm-<N>-0` is only a name, which
//! any API caller (or a spoofed `SLURM_JOB_ID`) sets; a process's job is
//! what `scontrol pidinfo <pid>` answers, asked of this node's slurmd.
//!
//! When a task is registered over the local socket, the agent knows the
//! caller's pid from the kernel (SO_PEERCRED): `memwatch exec` inside a
//! job step is a process of that job. [`JobProofs::check`] asks Slurm then
//! and keeps the answer by task id; the Slurm sink requeues a job from a
//! task's OOM kill only when the answer named that job. A registration
//! without a pid (HTTP) or one Slurm does not place in a job leaves the
//! task without proof (and overwrites any proof an earlier task of the
//! same id had). The pid is bound to when the connection was accepted: a
//! process at that pid that started later (the caller gone, its pid
//! reused) proves nothing, checked before and after Slurm is asked.
//! Proofs live in memory: a task taken back after a restart
//! has none, so its kill requeues nothing (the conservative side).

use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tracing::{debug, info};

use futures_util::future::BoxFuture;

use super::{RequeuePolicy, SlurmConfig, scontrol};
use crate::{model::process::SeenProcess, sinks::OnRegister};

/// Proofs kept at most (the oldest go first).
const MAX_PROOFS: usize = 4096;

/// Asks Slurm which job a registering process belongs to, and keeps the
/// answers for the Slurm sink. Cheap to clone.
#[derive(Clone)]
pub(crate) struct JobProofs {
    scontrol: PathBuf,
    /// Worker → Slurm node (the sink's `nodes`), for `SLURMD_NODENAME`
    /// (which slurmd answers, where one host runs several).
    nodes: BTreeMap<String, String>,
    default_node: String,
    timeout: Duration,
    proven: Arc<Mutex<Proven>>,
    /// Where `<pid>/stat` is read (`/proc`; a directory of fakes in tests).
    proc_root: PathBuf,
}

/// Lent to the API: every registration asks Slurm (module docs).
impl OnRegister for JobProofs {
    fn registered<'a>(
        &'a self,
        task_id: &'a str,
        worker: Option<&'a str>,
        peer: Option<SeenProcess>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.check(task_id, worker, peer))
    }
}

#[derive(Default)]
struct Proven {
    by_task: BTreeMap<String, u64>,
    /// Task ids in the order their proofs came, to bound the map.
    order: VecDeque<String>,
}

impl JobProofs {
    /// For a Slurm sink that requeues or signals a predicted kill; `None`
    /// when it does neither (it needs no proof, and nothing is asked).
    pub(crate) fn for_sink(config: &SlurmConfig, node_name: &str) -> Option<Self> {
        if config.requeue == RequeuePolicy::Never && config.imminent.signal.is_none() {
            return None;
        }
        Some(Self {
            scontrol: config.scontrol.clone(),
            nodes: config.nodes.clone(),
            default_node: node_name.to_string(),
            timeout: config.delivery.timeout,
            proven: Arc::default(),
            proc_root: "/proc".into(),
        })
    }

    /// Reads processes' `stat` under `root` instead of `/proc`.
    #[cfg(test)]
    pub(crate) fn with_proc_root(mut self, root: PathBuf) -> Self {
        self.proc_root = root;
        self
    }

    /// Asks Slurm (bounded by the sink's timeout) which job process `pid`
    /// of `worker`'s node belongs to, and keeps the answer as `task_id`'s
    /// proof; without `pid`, forgets any proof `task_id` had.
    pub(crate) async fn check(
        &self,
        task_id: &str,
        worker: Option<&str>,
        peer: Option<SeenProcess>,
    ) {
        let job = match peer {
            Some(peer) => self.job_of(peer, worker).await,
            None => None,
        };
        let pid = peer.map(|p| p.pid);
        let mut proven = self.proven.lock().unwrap_or_else(|e| e.into_inner());
        match job {
            Some(job) => {
                info!(
                    task_id,
                    pid, job, "Slurm says the task's process belongs to this job"
                );
                if proven.by_task.insert(task_id.to_string(), job).is_none() {
                    proven.order.push_back(task_id.to_string());
                }
                while proven.order.len() > MAX_PROOFS {
                    if let Some(old) = proven.order.pop_front() {
                        proven.by_task.remove(&old);
                    }
                }
            }
            None => {
                if proven.by_task.remove(task_id).is_some() {
                    proven.order.retain(|t| t != task_id);
                }
            }
        }
    }

    /// The job Slurm placed `task_id`'s registering process in, if it did.
    pub(crate) fn job_of_task(&self, task_id: &str) -> Option<u64> {
        let proven = self.proven.lock().unwrap_or_else(|e| e.into_inner());
        proven.by_task.get(task_id).copied()
    }

    /// Whether the process at `peer`'s pid is still the one seen.
    async fn still_there(&self, peer: SeenProcess) -> bool {
        let stat = self.proc_root.join(peer.pid.to_string()).join("stat");
        let same = tokio::fs::read_to_string(&stat)
            .await
            .is_ok_and(|line| peer.same_as(&line));
        if !same {
            info!(
                pid = peer.pid,
                "the registering process is gone (its pid may be another process's now): no job proof"
            );
        }
        same
    }

    async fn job_of(&self, peer: SeenProcess, worker: Option<&str>) -> Option<u64> {
        if !self.still_there(peer).await {
            return None;
        }
        let pid = peer.pid;
        // The slurmd of the node memwatch acts on for this worker (its
        // `nodes` entry, else the agent's node name) answers, not whichever
        // slurmd scontrol would find first where one host runs several.
        let node = worker
            .and_then(|w| self.nodes.get(w))
            .unwrap_or(&self.default_node);
        let args = ["pidinfo".to_string(), pid.to_string()];
        let env = [("SLURMD_NODENAME", node.as_str())];
        let job = match scontrol::run_with_env(&self.scontrol, &args, &env, self.timeout).await {
            Ok(out) => job_in(&out)?,
            Err(error) => {
                // Not a process of any job (or no slurmd here): no proof.
                debug!(pid, %node, %error, "scontrol pidinfo: no job");
                return None;
            }
        };
        // Slurm answered of whichever process had the pid when it was
        // asked: the caller's only if that one is still there.
        self.still_there(peer).await.then_some(job)
    }
}

/// The job id of `scontrol pidinfo`'s answer (`Slurm JobId=12 ends at …`).
fn job_in(out: &str) -> Option<u64> {
    out.split_whitespace()
        .find_map(|word| word.strip_prefix("JobId=")?.parse().ok())
}

/// A `/proc` stand-in under `dir` holding `pid`'s `stat`, a process that
/// started one clock tick after boot (so before any instant a test takes).
#[cfg(test)]
pub(crate) fn fake_proc(dir: &std::path::Path, pid: i32) -> PathBuf {
    let root = dir.join("proc");
    std::fs::create_dir_all(root.join(pid.to_string())).unwrap();
    // Fields 3..21 of a real line, then the start time (field 22) = 1.
    let stat =
        format!("{pid} (memwatch exec) S 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n");
    std::fs::write(root.join(pid.to_string()).join("stat"), stat).unwrap();
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_read_from_pidinfo() {
        assert_eq!(
            job_in(
                "Slurm JobId=12 ends at Tue Dec 01 13:00:00 2026\nJob remaining time is 3540 seconds\n"
            ),
            Some(12)
        );
        assert_eq!(job_in("Failed to locate job for requested pid\n"), None);
    }

    #[tokio::test]
    async fn a_proof_comes_from_slurm_and_a_registration_without_one_erases_it() {
        let dir = tempfile::tempdir().unwrap();
        // A stand-in scontrol that places pid 4242 (on node n2) in job 7.
        let fake = dir.path().join("scontrol");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho \"$1 $2 $SLURMD_NODENAME\" >> \"$(dirname \"$0\")/asked\"\n\
             [ \"$1 $2 $SLURMD_NODENAME\" = 'pidinfo 4242 n2' ] && \
             echo 'Slurm JobId=7 ends at Unknown' && exit 0\n\
             echo 'slurm_pid2jobid: Process not managed by Slurm' >&2; exit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let proofs = JobProofs {
            scontrol: fake,
            nodes: [("w2".to_string(), "n2".to_string())].into(),
            default_node: "n1".into(),
            timeout: Duration::from_secs(10),
            proven: Arc::default(),
            proc_root: fake_proc(dir.path(), 4242),
        };
        let caller = Some(SeenProcess::now(4242));
        proofs.check("slurm-7-0", Some("w2"), caller).await;
        assert_eq!(proofs.job_of_task("slurm-7-0"), Some(7));
        // The same pid asked of another node's slurmd (an unmapped
        // worker's node is the agent's, n1): no proof.
        proofs.check("slurm-7-1", Some("w1"), caller).await;
        assert_eq!(proofs.job_of_task("slurm-7-1"), None);
        let asked = std::fs::read_to_string(dir.path().join("asked")).unwrap();
        assert_eq!(
            asked, "pidinfo 4242 n2\npidinfo 4242 n1\n",
            "SLURMD_NODENAME each time"
        );
        // Re-registered under the same id without a pid (HTTP): erased.
        proofs.check("slurm-7-0", Some("w2"), None).await;
        assert_eq!(proofs.job_of_task("slurm-7-0"), None);

        // The caller seen before the process now at 4242 started: its pid
        // was reused, and Slurm's answer is of another process.
        proofs.check("slurm-7-0", Some("w2"), caller).await;
        assert_eq!(proofs.job_of_task("slurm-7-0"), Some(7));
        let before = SeenProcess {
            pid: 4242,
            seen_boot_ns: 0,
        };
        proofs.check("slurm-7-0", Some("w2"), Some(before)).await;
        assert_eq!(
            proofs.job_of_task("slurm-7-0"),
            None,
            "a reused pid proves nothing"
        );
        // Gone altogether: no proof, and Slurm is not asked.
        let asked = std::fs::read_to_string(dir.path().join("asked"))
            .unwrap()
            .lines()
            .count();
        proofs
            .check("slurm-7-2", Some("w2"), Some(SeenProcess::now(4343)))
            .await;
        assert_eq!(proofs.job_of_task("slurm-7-2"), None);
        let now_asked = std::fs::read_to_string(dir.path().join("asked"))
            .unwrap()
            .lines()
            .count();
        assert_eq!(now_asked, asked, "no pidinfo for a pid with no process");
    }
}
