//! What a caller on the socket that is neither root nor the agent may
//! register: a process whose real uid is its own (never pid 1), or a
//! cgroup directory it owns (a delegated one), never the hierarchy's root,
//! a worker's cgroup or one of its ancestors. A task's memory is taken out
//! of its worker's residual, so a source that is not the caller's would
//! let it mask the worker's leftover memory, recover it (and resume or
//! untaint its node) or take the attribution of another user's OOM kill.
//! Who owns what comes through [`Owners`]: `/proc` and the file system on
//! a host, a fake in tests.

use std::{fs, io, os::unix::fs::MetadataExt as _, path::Path};

use crate::model::spec::MemorySource;

/// Who owns a process or a directory.
pub(crate) trait Owners: Send + Sync {
    /// The real uid of process `pid`.
    fn process_uid(&self, pid: u32) -> io::Result<u32>;
    /// The owner of directory `path`.
    fn dir_uid(&self, path: &Path) -> io::Result<u32>;
}

/// The host's: `/proc/<pid>/status` and the directory's inode.
pub(crate) struct HostOwners;

impl Owners for HostOwners {
    fn process_uid(&self, pid: u32) -> io::Result<u32> {
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        real_uid(&status)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Uid line in its status"))
    }

    fn dir_uid(&self, path: &Path) -> io::Result<u32> {
        Ok(fs::symlink_metadata(path)?.uid())
    }
}

/// The real uid of a `/proc/<pid>/status` text (`Uid:\treal\teffective…`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether `uid` may register `source`; the refusal says why. `root` is
/// the memory hierarchy's root, `workers` the workers' cgroups (resolved,
/// as `source` is).
pub(crate) fn may_register(
    owners: &dyn Owners,
    uid: u32,
    source: &MemorySource,
    root: &Path,
    workers: &[&Path],
) -> Result<(), String> {
    match source {
        MemorySource::Pid(1) => Err("pid 1 is not a task: it is the host's init".into()),
        MemorySource::Pid(pid) => match owners.process_uid(*pid) {
            Ok(owner) if owner == uid => Ok(()),
            Ok(owner) => Err(format!(
                "process {pid} is uid {owner}'s, not yours (uid {uid}): register your own"
            )),
            Err(error) => Err(format!("process {pid} cannot be looked at: {error}")),
        },
        MemorySource::Cgroup(path) => {
            if path == root {
                return Err("the hierarchy's root is not a task".into());
            }
            if let Some(worker) = workers.iter().find(|w| w.starts_with(path)) {
                return Err(format!(
                    "{} is the cgroup of a worker ({}) or one of its ancestors",
                    path.display(),
                    worker.display()
                ));
            }
            match owners.dir_uid(path) {
                Ok(owner) if owner == uid => Ok(()),
                Ok(owner) => Err(format!(
                    "{} is owned by uid {owner}, not by you (uid {uid}): register a cgroup \
                     delegated to you",
                    path.display()
                )),
                Err(error) => Err(format!("{} cannot be looked at: {error}", path.display())),
            }
        }
        MemorySource::Process(_) | MemorySource::Host => {
            Err("only a pid or a cgroup may be registered".into())
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::HashMap, path::PathBuf};

    use super::*;

    /// Owners from two maps; anything else is not found.
    #[derive(Default)]
    pub(crate) struct FakeOwners {
        pub processes: HashMap<u32, u32>,
        pub dirs: HashMap<PathBuf, u32>,
    }

    impl Owners for FakeOwners {
        fn process_uid(&self, pid: u32) -> io::Result<u32> {
            self.processes
                .get(&pid)
                .copied()
                .ok_or_else(|| io::ErrorKind::NotFound.into())
        }

        fn dir_uid(&self, path: &Path) -> io::Result<u32> {
            self.dirs
                .get(path)
                .copied()
                .ok_or_else(|| io::ErrorKind::NotFound.into())
        }
    }

    #[test]
    fn the_real_uid_is_the_first_of_the_uid_line() {
        let status = "Name:\tsleep\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(real_uid(status), Some(1000));
        assert_eq!(real_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_user_registers_only_its_own_processes_and_delegated_cgroups() {
        let root = Path::new("/cg");
        let worker = Path::new("/cg/slurm/node");
        let owners = FakeOwners {
            processes: [(1, 0), (100, 1000), (200, 1001)].into(),
            dirs: [
                ("/cg/user/1000/job".into(), 1000),
                ("/cg/user/1001/job".into(), 1001),
                ("/cg/slurm/node/mine".into(), 1000),
                ("/cg/slurm".into(), 1000),
                ("/cg/slurm/node".into(), 1000),
            ]
            .into(),
        };
        let check = |source: MemorySource| may_register(&owners, 1000, &source, root, &[worker]);
        assert_eq!(check(MemorySource::Pid(100)), Ok(()));
        assert_eq!(
            check(MemorySource::Cgroup("/cg/user/1000/job".into())),
            Ok(())
        );
        assert_eq!(
            check(MemorySource::Cgroup("/cg/slurm/node/mine".into())),
            Ok(())
        );
        for (source, needle) in [
            (MemorySource::Pid(1), "pid 1"),
            (MemorySource::Pid(200), "uid 1001's"),
            (MemorySource::Pid(300), "cannot be looked at"),
            (MemorySource::Cgroup("/cg".into()), "root"),
            // Owned by the caller, but a worker's cgroup or its ancestor.
            (MemorySource::Cgroup("/cg/slurm/node".into()), "of a worker"),
            (MemorySource::Cgroup("/cg/slurm".into()), "ancestors"),
            (
                MemorySource::Cgroup("/cg/user/1001/job".into()),
                "owned by uid 1001",
            ),
        ] {
            let refusal = check(source.clone()).expect_err("refused");
            assert!(refusal.contains(needle), "{source:?}: {refusal}");
        }
    }
}
