//! When a cgroup path proves a Slurm job. Anyone who may make a cgroup
//! (a delegated subtree, a container's own) can name one `job_<N>`; only
//! Slurm's cgroup plugins make them where Slurm keeps its jobs, as root.
//! So a `job_<N>` component counts only as Slurm lays it out under one of
//! `cgroup_roots` (v1 `<root>/uid_<U>/job_<N>`, v2 `<root>/job_<N>`), and
//! only when every directory from the root down to `job_<N>` is a real
//! directory (not a symlink: looked at with lstat) owned by root.

use std::{
    io,
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
    sync::Arc,
};

/// Where Slurm's cgroup plugins keep jobs: cgroup v1's memory hierarchy
/// and cgroup v2's slurmstepd scope.
pub(crate) const DEFAULT_CGROUP_ROOTS: [&str; 2] = [
    "/sys/fs/cgroup/memory/slurm",
    "/sys/fs/cgroup/system.slice/slurmstepd.scope",
];

/// What lstat says of a directory on the way to a job's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DirInfo {
    pub uid: u32,
    /// A directory itself (a symlink to one is not).
    pub is_dir: bool,
}

/// lstat, behind a trait: the host's, or a fake in tests.
pub(crate) trait DirStat: Send + Sync {
    fn lstat(&self, path: &Path) -> io::Result<DirInfo>;
}

/// The host's file system.
pub(crate) struct HostDirs;

impl DirStat for HostDirs {
    fn lstat(&self, path: &Path) -> io::Result<DirInfo> {
        let meta = std::fs::symlink_metadata(path)?;
        Ok(DirInfo {
            uid: meta.uid(),
            is_dir: meta.file_type().is_dir(),
        })
    }
}

/// What a cgroup path says of a Slurm job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CgroupJob {
    /// No `job_<N>` component.
    None,
    /// Slurm's own cgroup of job N.
    Proven(u64),
    /// A `job_<N>` component that proves nothing, and why.
    Unproven { job: u64, why: String },
}

/// Slurm's cgroup roots (`[[slurm]] cgroup_roots`) and how to look at them.
#[derive(Clone)]
pub(crate) struct CgroupRoots {
    roots: Vec<PathBuf>,
    dirs: Arc<dyn DirStat>,
}

impl CgroupRoots {
    pub(crate) fn new(roots: Vec<PathBuf>, dirs: Arc<dyn DirStat>) -> Self {
        Self { roots, dirs }
    }

    /// The job `cgroup` is Slurm's cgroup of (or below), if it is.
    pub(crate) fn job_of(&self, cgroup: &Path) -> CgroupJob {
        let Some(job) = job_component(cgroup) else {
            return CgroupJob::None;
        };
        let unproven = |why: String| CgroupJob::Unproven { job, why };
        if cgroup
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
        {
            return unproven(format!(
                "its cgroup {} is not a plain path",
                cgroup.display()
            ));
        }
        let Some((root, dirs)) = self.layout(cgroup, job) else {
            return unproven(format!(
                "its cgroup {} is not where Slurm keeps job {job} (cgroup_roots: {})",
                cgroup.display(),
                self.shown_roots()
            ));
        };
        for dir in std::iter::once(root.to_path_buf()).chain(dirs) {
            if let Err(why) = self.root_owned(&dir) {
                return unproven(format!("its cgroup {} {why}", cgroup.display()));
            }
        }
        CgroupJob::Proven(job)
    }

    /// The root holding `cgroup` as Slurm lays out `job_<job>` in it, with
    /// the directories below the root down to the job's.
    fn layout(&self, cgroup: &Path, job: u64) -> Option<(&Path, Vec<PathBuf>)> {
        let job_name = format!("job_{job}");
        self.roots.iter().find_map(|root| {
            let rest: Vec<&str> = cgroup
                .strip_prefix(root)
                .ok()?
                .iter()
                .map(|c| c.to_str())
                .collect::<Option<_>>()?;
            let depth = match rest.as_slice() {
                [first, ..] if *first == job_name => 1,
                [user, second, ..] if is_uid_dir(user) && *second == job_name => 2,
                _ => return None,
            };
            let mut dir = root.clone();
            let dirs = rest[..depth]
                .iter()
                .map(|part| {
                    dir.push(part);
                    dir.clone()
                })
                .collect();
            Some((root.as_path(), dirs))
        })
    }

    fn root_owned(&self, dir: &Path) -> Result<(), String> {
        match self.dirs.lstat(dir) {
            Ok(DirInfo { is_dir: false, .. }) => Err(format!(
                "passes through {}, which is not a directory (a symlink?)",
                dir.display()
            )),
            Ok(DirInfo { uid, .. }) if uid != 0 => Err(format!(
                "passes through {}, owned by uid {uid}, not root as Slurm's are",
                dir.display()
            )),
            Ok(_) => Ok(()),
            Err(error) => Err(format!("cannot be looked at ({}: {error})", dir.display())),
        }
    }

    fn shown_roots(&self) -> String {
        if self.roots.is_empty() {
            return "none".into();
        }
        let shown: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        shown.join(", ")
    }
}

/// The last `job_<N>` component of a path.
fn job_component(path: &Path) -> Option<u64> {
    path.iter()
        .rev()
        .find_map(|part| part.to_str()?.strip_prefix("job_")?.parse().ok())
}

fn is_uid_dir(part: &str) -> bool {
    part.strip_prefix("uid_")
        .is_some_and(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit()))
}

/// A `cgroup_roots` entry: absolute, plain (no `.` or `..`), not `/`.
pub(crate) fn check_root(root: &Path) -> Result<(), String> {
    let plain = root
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !root.is_absolute() || !plain {
        return Err(format!(
            "must be absolute paths without `.` or `..`, got {}",
            root.display()
        ));
    }
    if root.parent().is_none() {
        return Err("must not hold `/`: every job_<N> anywhere would count".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::BTreeMap, sync::Mutex};

    use super::*;

    /// Directories and what lstat says of them; any other path is missing.
    #[derive(Default)]
    pub(crate) struct FakeDirs(pub Mutex<BTreeMap<PathBuf, DirInfo>>);

    impl FakeDirs {
        /// `path` and its ancestors, root-owned directories.
        pub(crate) fn root_owned(self, path: &str) -> Self {
            for dir in Path::new(path).ancestors() {
                self.set(dir, 0, true);
            }
            self
        }

        pub(crate) fn set(&self, path: &Path, uid: u32, is_dir: bool) {
            let mut dirs = self.0.lock().unwrap();
            dirs.insert(path.to_path_buf(), DirInfo { uid, is_dir });
        }
    }

    impl DirStat for FakeDirs {
        fn lstat(&self, path: &Path) -> io::Result<DirInfo> {
            let dirs = self.0.lock().unwrap();
            dirs.get(path)
                .copied()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    pub(crate) fn default_roots(dirs: FakeDirs) -> CgroupRoots {
        let roots = DEFAULT_CGROUP_ROOTS.iter().map(PathBuf::from).collect();
        CgroupRoots::new(roots, Arc::new(dirs))
    }

    const V1_JOB: &str = "/sys/fs/cgroup/memory/slurm/uid_1000/job_17";
    const V2_JOB: &str = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_18";

    fn why(job: CgroupJob) -> String {
        match job {
            CgroupJob::Unproven { why, .. } => why,
            other => panic!("proven or none: {other:?}"),
        }
    }

    #[test]
    fn slurms_own_cgroups_prove_their_job_v1_and_v2() {
        let roots = default_roots(FakeDirs::default().root_owned(V1_JOB).root_owned(V2_JOB));
        let step = Path::new(V1_JOB).join("step_batch/task_0");
        assert_eq!(roots.job_of(&step), CgroupJob::Proven(17));
        assert_eq!(roots.job_of(Path::new(V1_JOB)), CgroupJob::Proven(17));
        let step = Path::new(V2_JOB).join("step_0/user/task_0");
        assert_eq!(roots.job_of(&step), CgroupJob::Proven(18));
        assert_eq!(
            roots.job_of(Path::new("/sys/fs/cgroup/memory/memwatch/w1")),
            CgroupJob::None
        );
    }

    #[test]
    fn a_job_cgroup_outside_the_roots_proves_nothing() {
        let made = "/sys/fs/cgroup/memory/user/job_17";
        let roots = default_roots(FakeDirs::default().root_owned(made));
        let why = why(roots.job_of(Path::new(made)));
        assert!(why.contains("not where Slurm keeps job 17"), "{why}");
        assert!(why.contains("/sys/fs/cgroup/memory/slurm"), "{why}");
        // Under a root, but not as Slurm lays jobs out.
        let deep = "/sys/fs/cgroup/memory/slurm/mine/job_17";
        let roots = default_roots(FakeDirs::default().root_owned(deep));
        assert!(matches!(
            roots.job_of(Path::new(deep)),
            CgroupJob::Unproven { job: 17, .. }
        ));
        // No roots at all: no cgroup proves a job.
        let none = CgroupRoots::new(Vec::new(), Arc::new(FakeDirs::default().root_owned(V1_JOB)));
        assert!(why_of(&none, V1_JOB).contains("cgroup_roots: none"));
    }

    fn why_of(roots: &CgroupRoots, path: &str) -> String {
        why(roots.job_of(Path::new(path)))
    }

    #[test]
    fn a_job_cgroup_not_owned_by_root_proves_nothing() {
        let dirs = FakeDirs::default().root_owned(V1_JOB);
        dirs.set(Path::new(V1_JOB), 1000, true);
        let roots = default_roots(dirs);
        let why = why_of(&roots, V1_JOB);
        assert!(why.contains("owned by uid 1000"), "{why}");
        // Its user directory too.
        let dirs = FakeDirs::default().root_owned(V1_JOB);
        dirs.set(
            Path::new("/sys/fs/cgroup/memory/slurm/uid_1000"),
            1000,
            true,
        );
        assert!(why_of(&default_roots(dirs), V1_JOB).contains("uid_1000, owned by uid 1000"));
        // Gone (or never there): nothing to look at, no proof.
        let roots = default_roots(FakeDirs::default());
        assert!(why_of(&roots, V1_JOB).contains("cannot be looked at"));
    }

    #[test]
    fn a_symlink_on_the_way_proves_nothing() {
        let dirs = FakeDirs::default().root_owned(V2_JOB);
        dirs.set(Path::new(V2_JOB), 0, false);
        let why = why_of(&default_roots(dirs), V2_JOB);
        assert!(why.contains("not a directory (a symlink?)"), "{why}");
        let roots = default_roots(FakeDirs::default().root_owned(V1_JOB));
        let dotted = "/sys/fs/cgroup/memory/slurm/uid_1/../uid_1000/job_17";
        assert!(why_of(&roots, dotted).contains("not a plain path"));
    }

    #[test]
    fn on_the_host_lstat_sees_owners_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let info = HostDirs.lstat(&real).unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!((info.uid, info.is_dir), (unsafe { libc::geteuid() }, true));
        assert!(!HostDirs.lstat(&dir.path().join("link")).unwrap().is_dir);
    }

    #[test]
    fn roots_are_checked() {
        assert!(check_root(Path::new("/sys/fs/cgroup/memory/slurm")).is_ok());
        for bad in ["slurm", "/sys/../slurm", "/"] {
            assert!(check_root(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
