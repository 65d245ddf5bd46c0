//! Which Dask worker is which memwatch worker.
//!
//! The rule: a Dask worker whose address is on this host belongs to the
//! memwatch worker whose processes own the socket listening on that
//! address: a process in the worker's cgroup (or a child cgroup of it), the
//! configured `pid` or a descendant, or a process whose command line
//! matches `process` or a descendant. The whole host (no `[[worker]]`) owns
//! every Dask worker listening on it. A Dask worker matched by none of
//! these belongs to the memwatch worker named like the Dask worker's `name`
//! (`dask worker --name`, unique in a cluster), if there is one and the
//! Dask worker's address is on this host; else to none. Neither a port nor
//! a name alone ever matches: a worker on another host with the same port,
//! or named like one of ours, is not ours (its host's agent maps it).

use std::{
    collections::{HashMap, HashSet},
    io,
    net::{IpAddr, ToSocketAddrs as _, UdpSocket},
    path::Path,
    sync::{Arc, Mutex},
};

use procfs::process::FDTarget;
use serde::Deserialize;

use crate::{
    cgroup,
    model::{
        event::{Enrich, EventBody, EventKind},
        spec::{MemorySource, WorkerSpec},
    },
};

/// One worker as the scheduler lists it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct DaskWorker {
    pub address: String,
    /// `dask worker --name`; a number or a string.
    #[serde(default)]
    pub name: serde_json::Value,
    /// The scheduler's status of the worker: `running`, `paused`,
    /// `closing_gracefully` (being retired, by anyone), `closing`, `closed`.
    #[serde(default)]
    pub status: Option<String>,
}

/// The answer of `GET /json/identity.json`: every worker by address, with
/// the status the scheduler holds (`/api/v1/get_workers` has no status).
#[derive(Debug, Deserialize)]
pub(crate) struct Identity {
    #[serde(default)]
    workers: std::collections::BTreeMap<String, IdentityWorker>,
}

#[derive(Debug, Deserialize)]
struct IdentityWorker {
    #[serde(default)]
    name: serde_json::Value,
    #[serde(default)]
    status: Option<String>,
}

impl Identity {
    pub(crate) fn workers(self) -> Vec<DaskWorker> {
        self.workers
            .into_iter()
            .map(|(address, w)| DaskWorker {
                address,
                name: w.name,
                status: w.status,
            })
            .collect()
    }
}

/// A Dask worker and the memwatch worker it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub address: String,
    pub worker: Option<String>,
    /// The process listening on the Dask address, when it is on this host.
    pub pid: Option<u32>,
    /// The scheduler's status of the worker (see [`DaskWorker::status`]).
    pub status: Option<String>,
}

impl Mapped {
    /// On its way out, whoever retired it.
    pub(crate) fn leaving(&self) -> bool {
        matches!(
            self.status.as_deref(),
            Some("closing_gracefully" | "closing" | "closed" | "failed")
        )
    }

    /// Running work (a paused worker runs none; an unknown status counts
    /// as running, the cautious side).
    pub(crate) fn running(&self) -> bool {
        !self.leaving() && self.status.as_deref() != Some("paused")
    }
}

/// Dask addresses of the processes on this host, for `oom_kill` events
/// (the victim is gone by then, so the map is kept from before).
#[derive(Clone, Debug, Default)]
pub(crate) struct SchedulerNames(Arc<Mutex<HashMap<u32, String>>>);

impl SchedulerNames {
    pub(crate) fn get(&self, pid: u32) -> Option<String> {
        self.lock().get(&pid).cloned()
    }

    /// Adds what `mapped` says; entries of processes that ended stay until
    /// the next refresh after their pid is reused, so a kill reported a
    /// moment late still resolves.
    pub(crate) fn update(&self, mapped: &[Mapped]) {
        let mut names = self.lock();
        for m in mapped {
            if let Some(pid) = m.pid {
                names.insert(pid, m.address.clone());
            }
        }
        // Bounded: forget processes that no longer exist once it grows.
        if names.len() > 4096 {
            names.retain(|pid, _| Path::new(&format!("/proc/{pid}")).exists());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Lent by the Dask sink: an `oom_kill` names the Dask worker the killed
/// process was (`scheduler_worker`).
impl Enrich for SchedulerNames {
    fn enrich(&self, body: &mut EventBody) {
        if body.kind != EventKind::OomKill || body.scheduler_worker.is_some() {
            return;
        }
        if let Some(pid) = body.pid {
            body.scheduler_worker = self.get(pid);
        }
    }
}

/// The IP and port of a Dask address such as `tcp://127.0.0.1:40123` or
/// `tls://[::1]:8786` (a host name is resolved), when that IP is one of
/// this host's: a worker elsewhere is never matched by its port alone.
fn local_endpoint(address: &str) -> Option<(IpAddr, u16)> {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let rest = rest.trim_end_matches('/');
    let addr = rest.to_socket_addrs().ok()?.next()?;
    // Binding works only to an address this host has.
    let local = addr.ip().is_loopback() || UdpSocket::bind((addr.ip(), 0)).is_ok();
    local.then_some((addr.ip(), addr.port()))
}

/// Maps each Dask worker to a memwatch worker (the rule in the module docs).
/// Reads /proc: call it off the async runtime.
pub(crate) fn map_workers(specs: &[WorkerSpec], dask: &[DaskWorker]) -> Vec<Mapped> {
    let listening = listening_sockets().unwrap_or_default();
    let socket_of = |address: &str| {
        let (ip, port) = local_endpoint(address)?;
        listening
            .get(&port)?
            .iter()
            .find(|(bound, _)| bound.is_unspecified() || *bound == ip)
            .map(|(_, inode)| *inode)
    };
    let members: Vec<(&WorkerSpec, HashSet<u32>)> =
        specs.iter().map(|s| (s, member_pids(&s.source))).collect();
    dask.iter()
        .map(|d| {
            let local = local_endpoint(&d.address).is_some();
            let inode = socket_of(&d.address);
            let owner = inode.and_then(|inode| {
                members.iter().find_map(|(spec, pids)| {
                    pids.iter()
                        .find(|pid| owns_socket(**pid, inode))
                        .map(|pid| (spec.name.clone(), *pid))
                })
            });
            // Never for a worker on another host: a name is only a name.
            let by_name = || {
                if !local {
                    return None;
                }
                let name = match &d.name {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                specs
                    .iter()
                    .find(|s| s.name == name)
                    .map(|s| s.name.clone())
            };
            let host = || {
                (inode.is_some() && specs.len() == 1 && specs[0].source == MemorySource::Host)
                    .then(|| specs[0].name.clone())
            };
            let pid = owner
                .as_ref()
                .map(|(_, pid)| *pid)
                .or_else(|| inode.and_then(socket_owner));
            Mapped {
                address: d.address.clone(),
                worker: owner.map(|(name, _)| name).or_else(by_name).or_else(host),
                pid,
                status: d.status.clone(),
            }
        })
        .collect()
}

/// Listening TCP ports on this host → the addresses bound and socket inodes.
fn listening_sockets() -> io::Result<HashMap<u16, Vec<(IpAddr, u64)>>> {
    let mut map: HashMap<u16, Vec<(IpAddr, u64)>> = HashMap::new();
    let v4 = procfs::net::tcp().map_err(io::Error::other)?;
    let v6 = procfs::net::tcp6().unwrap_or_default();
    for entry in v4.into_iter().chain(v6) {
        if entry.state == procfs::net::TcpState::Listen {
            map.entry(entry.local_address.port())
                .or_default()
                .push((entry.local_address.ip(), entry.inode));
        }
    }
    Ok(map)
}

fn owns_socket(pid: u32, inode: u64) -> bool {
    let Ok(process) = procfs::process::Process::new(pid as i32) else {
        return false;
    };
    let Ok(fds) = process.fd() else { return false };
    fds.flatten()
        .any(|fd| matches!(fd.target, FDTarget::Socket(i) if i == inode))
}

/// Any process on this host owning the socket (for the pid of a Dask
/// worker no memwatch worker owns).
fn socket_owner(inode: u64) -> Option<u32> {
    procfs::process::all_processes()
        .ok()?
        .flatten()
        .find(|p| owns_socket(p.pid as u32, inode))
        .map(|p| p.pid as u32)
}

/// The processes of a worker: its cgroup's (and child cgroups'), or the
/// matching processes and their descendants.
pub(crate) fn member_pids(source: &MemorySource) -> HashSet<u32> {
    match source {
        MemorySource::Cgroup(path) => cgroup::pids_below(path),
        MemorySource::Pid(pid) => with_descendants(|p, _| p == *pid),
        MemorySource::Process(text) => with_descendants(|_, cmdline| cmdline.contains(text)),
        // The whole host: checked by `map_workers` without listing processes.
        MemorySource::Host => HashSet::new(),
    }
}

fn with_descendants(root: impl Fn(u32, &str) -> bool) -> HashSet<u32> {
    let Ok(all) = procfs::process::all_processes() else {
        return HashSet::new();
    };
    let procs: Vec<(u32, u32, String)> = all
        .flatten()
        .filter_map(|p| {
            let stat = p.stat().ok()?;
            let cmdline = p.cmdline().map(|c| c.join(" ")).unwrap_or_default();
            Some((stat.pid as u32, stat.ppid as u32, cmdline))
        })
        .collect();
    let mut members: HashSet<u32> = procs
        .iter()
        .filter(|(pid, _, cmd)| root(*pid, cmd))
        .map(|(pid, _, _)| *pid)
        .collect();
    // Add children until nothing changes (bounded by the process count).
    for _ in 0..procs.len() {
        let before = members.len();
        let children: Vec<u32> = procs
            .iter()
            .filter(|(_, ppid, _)| members.contains(ppid))
            .map(|(pid, _, _)| *pid)
            .collect();
        members.extend(children);
        if members.len() == before {
            break;
        }
    }
    members
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, time::Duration};

    use super::*;

    fn spec(name: &str, source: MemorySource) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            source,
            soft_cap: None,
            unhealthy_after: Duration::from_secs(1),
            recover_after: Duration::from_secs(1),
            pressure: None,
        }
    }

    #[test]
    fn lent_to_the_recorder_an_oom_kill_names_the_dask_worker_it_killed() {
        let metrics = crate::telemetry::Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = crate::outbox::Outbox::new("names", 100, metrics.clone());
        let recorder = crate::record::Recorder::new(outbox, metrics);
        let names = SchedulerNames::default();
        recorder.enrich_with(vec![Arc::new(names.clone())]);
        names.update(&[Mapped {
            address: "tcp://127.0.0.1:40123".into(),
            worker: Some("w1".into()),
            pid: Some(4242),
            status: None,
        }]);
        let event = |kind, pid| {
            let mut body = EventBody::new(kind);
            body.pid = pid;
            recorder.record(body, None).body.scheduler_worker
        };
        assert_eq!(
            event(EventKind::OomKill, Some(4242)).as_deref(),
            Some("tcp://127.0.0.1:40123")
        );
        assert_eq!(event(EventKind::OomKill, Some(4243)), None, "another pid");
        assert_eq!(
            event(EventKind::TaskStarted, Some(4242)),
            None,
            "not a kill"
        );
    }

    #[test]
    fn a_dask_worker_belongs_to_the_worker_owning_its_listening_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let specs = [
            spec("other", MemorySource::Pid(u32::MAX - 1)),
            spec("mine", MemorySource::Pid(me)),
        ];
        let dask = [
            DaskWorker {
                address: format!("tcp://127.0.0.1:{port}"),
                name: serde_json::json!("tcp://ignored"),
                status: None,
            },
            // Same port, another host: not ours, whatever listens here.
            DaskWorker {
                address: format!("tcp://192.0.2.7:{port}"),
                name: serde_json::json!("w9"),
                status: None,
            },
            DaskWorker {
                address: "tcp://127.0.0.1:1".into(),
                name: serde_json::json!("other"),
                status: None,
            },
            DaskWorker {
                address: "tcp://10.0.0.9:2".into(),
                name: serde_json::json!(7),
                status: None,
            },
            DaskWorker {
                address: "tcp://192.0.2.8:1".into(),
                name: serde_json::json!("other"),
                status: None,
            },
            DaskWorker {
                address: format!("tcp://192.0.2.8:{port}"),
                name: serde_json::json!("mine"),
                status: None,
            },
        ];
        let mapped = map_workers(&specs, &dask);
        assert_eq!(mapped[0].worker.as_deref(), Some("mine"));
        assert_eq!(mapped[0].pid, Some(me));
        assert_eq!((mapped[1].worker.as_deref(), mapped[1].pid), (None, None));
        assert_eq!(mapped[2].worker.as_deref(), Some("other"), "by name");
        assert_eq!(mapped[3].worker, None);
        // Named like one of ours, on another host: never ours by name.
        assert_eq!((mapped[4].worker.as_deref(), mapped[4].pid), (None, None));
        assert_eq!((mapped[5].worker.as_deref(), mapped[5].pid), (None, None));

        let names = SchedulerNames::default();
        names.update(&mapped);
        assert_eq!(names.get(me), Some(format!("tcp://127.0.0.1:{port}")));
    }

    #[test]
    fn local_endpoints_of_dask_addresses() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(local_endpoint("tcp://127.0.0.1:40123"), Some((lo, 40123)));
        assert_eq!(
            local_endpoint("tls://[::1]:8786"),
            Some((IpAddr::from(std::net::Ipv6Addr::LOCALHOST), 8786))
        );
        assert_eq!(
            local_endpoint("tcp://192.0.2.7:8786"),
            None,
            "TEST-NET-1 is not ours"
        );
        assert_eq!(local_endpoint("inproc://x"), None);
    }
}
