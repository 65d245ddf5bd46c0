//! Where the memory controller lives, and cgroup id → path.
//!
//! The probe reports a memory cgroup by its kernfs id, which is the inode
//! number of the cgroup's directory on the hierarchy that holds the memory
//! controller: cgroup v1 `memory` on hybrid hosts like this one, the unified
//! cgroup2 tree where memory is v2.

use std::{
    collections::{HashMap, HashSet},
    fmt, fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use procfs::process::MountInfo;

pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod oom;
pub(crate) mod pressure;
pub(crate) mod safe;
mod unverified;

/// Which cgroup version carries the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        })
    }
}

/// The mounted hierarchy that holds the memory controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryHierarchy {
    /// Mount point, e.g. `/sys/fs/cgroup/memory` (v1) or `/sys/fs/cgroup` (v2).
    pub root: PathBuf,
    pub version: CgroupVersion,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "no mounted cgroup hierarchy has the memory controller (looked for a cgroup v1 \
         mount with the `memory` option and a cgroup2 mount listing `memory` in cgroup.controllers)"
    )]
    NoMemoryController,
}

impl MemoryHierarchy {
    /// Finds the memory hierarchy from this process's mount table.
    pub fn discover() -> Result<Self, CgroupError> {
        let path = "/proc/self/mountinfo";
        let text = fs::read_to_string(path).map_err(|source| CgroupError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_mountinfo(&text, |root| {
            fs::read_to_string(root.join("cgroup.controllers")).ok()
        })
        .ok_or(CgroupError::NoMemoryController)
    }

    /// Picks the memory hierarchy from mountinfo text. A v1 `memory` mount
    /// wins: where both exist the kernel charges memory to v1.
    /// `controllers` reads a cgroup2 root's `cgroup.controllers`.
    pub fn from_mountinfo(
        mountinfo: &str,
        controllers: impl Fn(&Path) -> Option<String>,
    ) -> Option<Self> {
        let mounts: Vec<MountInfo> = mountinfo
            .lines()
            .filter_map(|line| MountInfo::from_line(line).ok())
            .collect();
        let v1 = mounts.iter().find(|m| {
            m.fs_type == "cgroup" && m.root == "/" && m.super_options.contains_key("memory")
        });
        if let Some(m) = v1 {
            return Some(Self {
                root: m.mount_point.clone(),
                version: CgroupVersion::V1,
            });
        }
        mounts
            .iter()
            .filter(|m| m.fs_type == "cgroup2" && m.root == "/")
            .find(|m| {
                controllers(&m.mount_point)
                    .is_some_and(|c| c.split_whitespace().any(|name| name == "memory"))
            })
            .map(|m| Self {
                root: m.mount_point.clone(),
                version: CgroupVersion::V2,
            })
    }
}

/// Resolves memory cgroup ids (directory inodes) to paths, caching what it
/// has seen. A miss walks the hierarchy once.
///
/// Entries outlive their cgroup: kernfs ids are 64-bit and never reused, so
/// a cgroup removed right after an OOM kill still resolves to the path it
/// had, as long as it was seen (by a walk, or by [`CgroupResolver::remember`]
/// when a task registers it). The cache is bounded on every path that adds
/// to it: past [`CgroupResolver::MAX_ENTRIES`] it forgets cgroups that are
/// gone, then, if still past three quarters of it, live ones (a walk finds
/// those again), so that a sweep comes at most every quarter of the bound.
#[derive(Debug)]
pub(crate) struct CgroupResolver {
    hierarchy: MemoryHierarchy,
    by_id: HashMap<u64, PathBuf>,
    max_entries: usize,
    /// mkdir records that could not be checked (see [`unverified`]).
    unverified: unverified::Unverified,
}

impl CgroupResolver {
    pub(crate) const MAX_ENTRIES: usize = 100_000;

    pub(crate) fn new(hierarchy: MemoryHierarchy) -> Self {
        Self {
            hierarchy,
            by_id: HashMap::new(),
            max_entries: Self::MAX_ENTRIES,
            unverified: unverified::Unverified::default(),
        }
    }

    /// Adds an entry, keeping the bound.
    fn insert(&mut self, id: u64, path: PathBuf) {
        self.by_id.insert(id, path);
        self.trim(id);
    }

    /// Keeps the bound, and `id`.
    fn trim(&mut self, id: u64) {
        if self.by_id.len() > self.max_entries {
            self.by_id.retain(|_, path| path.exists());
            let keep = self.max_entries / 4 * 3;
            if self.by_id.len() > keep {
                let extra: Vec<u64> = self
                    .by_id
                    .keys()
                    .copied()
                    .filter(|k| *k != id)
                    .take(self.by_id.len() - keep)
                    .collect();
                for k in extra {
                    self.by_id.remove(&k);
                }
            }
        }
    }

    pub(crate) fn hierarchy(&self) -> &MemoryHierarchy {
        &self.hierarchy
    }

    /// The cgroup's directory, or `None` when it was never seen and does
    /// not exist now. Last resort: an unchecked mkdir record of the id.
    pub(crate) fn resolve(&mut self, id: u64) -> Option<PathBuf> {
        if let Some(path) = self.by_id.get(&id) {
            return Some(path.clone());
        }
        self.rescan();
        let found = self.by_id.get(&id).cloned();
        self.trim(id);
        found.or_else(|| self.unverified.get(id).map(Path::to_path_buf))
    }

    /// Learns a cgroup the kernel just made (from the cgroup_mkdir probe):
    /// `relative` is its path below the hierarchy's root. Kept only when
    /// that directory of the memory hierarchy has this id (the same name
    /// may exist in other hierarchies). Returns its full path then. A
    /// directory already gone cannot be checked: it is kept as a candidate
    /// for [`CgroupResolver::resolve`]'s last resort only.
    pub(crate) fn learn(&mut self, id: u64, relative: &str) -> Option<PathBuf> {
        let path = self.hierarchy.root.join(relative.trim_start_matches('/'));
        match inode(&path) {
            Some(found) if found == id => {
                self.unverified.forget(id);
                self.insert(id, path.clone());
                Some(path)
            }
            Some(_) => None,
            None => {
                self.unverified.keep(id, path);
                None
            }
        }
    }

    /// The path an id had, without walking (for removed cgroups).
    pub(crate) fn known_path(&self, id: u64) -> Option<&Path> {
        self.by_id.get(&id).map(PathBuf::as_path)
    }

    /// Records a cgroup the agent was told about (a task's), so it resolves
    /// even if it is removed before the next walk.
    pub(crate) fn remember(&mut self, path: &Path) {
        if let Some(id) = inode(path) {
            self.insert(id, path.to_path_buf());
        }
    }

    fn rescan(&mut self) {
        let mut stack = vec![self.hierarchy.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            self.by_id.insert(meta.ino(), dir.clone());
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
}

fn inode(path: &Path) -> Option<u64> {
    fs::metadata(path).ok().map(|m| m.ino())
}

/// A memory cgroup memwatch made (for `memwatch exec`, or a test): killed
/// and removed by [`OwnedCgroup::remove`] or on drop, whatever happens.
#[derive(Debug)]
pub struct OwnedCgroup {
    path: PathBuf,
}

impl OwnedCgroup {
    /// Creates the directory (its parents too).
    pub fn create(path: PathBuf) -> io::Result<Self> {
        fs::create_dir_all(&path)?;
        enable_memory_controller_above(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The kernel's hard limit: v1 `memory.limit_in_bytes` (and the
    /// memory+swap limit where swap accounting exists, so the cap cannot
    /// be dodged by swapping), v2 `memory.max` with `memory.swap.max` 0.
    pub fn set_hard_limit(&self, bytes: u64) -> io::Result<()> {
        let value = bytes.to_string();
        if self.path.join("memory.limit_in_bytes").exists() {
            self.write("memory.limit_in_bytes", &value)?;
            if self.path.join("memory.memsw.limit_in_bytes").exists() {
                self.write("memory.memsw.limit_in_bytes", &value)?;
            }
        } else if self.path.join("memory.max").exists() {
            self.write("memory.max", &value)?;
            if self.path.join("memory.swap.max").exists() {
                self.write("memory.swap.max", "0")?;
            }
        } else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} has no memory controller of its own (cgroup v2: its parent has \
                     processes of its own), so it cannot have a hard limit",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Writes a control file, with the file named in the error.
    pub fn write(&self, file: &str, value: &str) -> io::Result<()> {
        fs::write(self.path.join(file), value).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing {value} to {}: {e}", self.path.join(file).display()),
            )
        })
    }

    /// The file a process writes its pid (or `0`, itself) to, to move in.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// OOM kills the kernel counted in this cgroup.
    pub fn oom_kills(&self) -> Option<u64> {
        oom::oom_kill_count(&self.path)
    }

    /// Kills every process left in it and removes it.
    pub fn remove(self) -> io::Result<()> {
        let result = kill_and_remove(&self.path);
        std::mem::forget(self);
        result
    }
}

impl Drop for OwnedCgroup {
    fn drop(&mut self) {
        if let Err(error) = kill_and_remove(&self.path) {
            tracing::warn!(cgroup = %self.path.display(), %error, "could not remove cgroup");
        }
    }
}

/// On cgroup v2 a cgroup has a memory controller of its own only when
/// every ancestor lists `memory` in `cgroup.subtree_control`; without it
/// its memory is charged to (and limited by) the nearest ancestor that has
/// one, and `memory.max` does not exist. Enables it top-down from the
/// hierarchy's root to `path`'s parent, where missing. On v1 (no
/// `cgroup.subtree_control`) there is nothing to do.
///
/// A v2 cgroup with processes of its own cannot enable it (the kernel's
/// "no internal processes" rule, EBUSY): the new cgroup then shares its
/// parent's memory controller, which is said in a warning; setting a hard
/// limit on it fails with a reason.
fn enable_memory_controller_above(path: &Path) -> io::Result<()> {
    let mut ancestors: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .take_while(|dir| dir.join("cgroup.subtree_control").exists())
        .collect();
    ancestors.reverse();
    for dir in ancestors {
        let control = dir.join("cgroup.subtree_control");
        let enabled = fs::read_to_string(&control)?;
        if enabled.split_whitespace().any(|c| c == "memory") {
            continue;
        }
        match fs::write(&control, "+memory") {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(
                    parent = %dir.display(),
                    cgroup = %path.display(),
                    "the parent cgroup has processes of its own, so (cgroup v2) its children \
                     cannot have a memory controller: the new cgroup's memory counts as its parent's"
                );
                return Ok(());
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "enabling the memory controller in {}: {e}",
                        control.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `path` as a cgroup of the memory hierarchy at `root`: resolved (no
/// `..`, no symlink out), under `root`, and a cgroup (it has
/// `cgroup.procs`). The resolved path, or why not.
pub(crate) fn cgroup_under(root: &Path, path: &Path) -> Result<PathBuf, String> {
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot be resolved ({e})"))?;
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if !real.starts_with(&root) {
        return Err(format!(
            "is not under the memory cgroup hierarchy {}",
            root.display()
        ));
    }
    // Any cgroup of the hierarchy, with or without its own memory
    // controller (on v2 a parent with processes of its own gives its
    // children none: their memory counts as the parent's).
    if !real.join("cgroup.procs").is_file() {
        return Err("is not a cgroup (no cgroup.procs)".into());
    }
    Ok(real)
}

/// An empty hierarchy of `version` in a temporary directory (tests).
#[cfg(test)]
pub(crate) fn temp_hierarchy(version: CgroupVersion) -> (tempfile::TempDir, MemoryHierarchy) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let hierarchy = MemoryHierarchy {
        root: dir.path().to_path_buf(),
        version,
    };
    (dir, hierarchy)
}

/// The processes in the cgroup `dir` itself (`cgroup.procs`); none when it
/// cannot be read.
fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Nesting this deep is not a worker layout; it bounds the walk.
const MAX_PIDS_DEPTH: usize = 16;

/// The processes in `dir` and every cgroup below it (down to
/// [`MAX_PIDS_DEPTH`] levels).
pub(crate) fn pids_below(dir: &Path) -> HashSet<u32> {
    fn walk(dir: &Path, pids: &mut HashSet<u32>, depth: usize) {
        if depth > MAX_PIDS_DEPTH {
            return;
        }
        pids.extend(procs(dir));
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&entry.path(), pids, depth + 1);
            }
        }
    }
    let mut pids = HashSet::new();
    walk(dir, &mut pids, 0);
    pids
}

/// SIGKILLs whatever is in the cgroup until it is empty, then removes it.
/// Bounded: gives up after 5 s with the error.
pub fn kill_and_remove(path: &Path) -> io::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        for pid in procs(path) {
            // SAFETY: kill(2) with a pid the kernel listed in this cgroup.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod containment_tests {
    use std::fs;

    use super::*;

    #[test]
    fn a_task_cgroup_must_be_a_memory_cgroup_of_the_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        let job = root.path().join("job");
        fs::create_dir(&job).unwrap();
        assert!(
            cgroup_under(root.path(), &job)
                .unwrap_err()
                .contains("not a cgroup")
        );
        fs::write(job.join("cgroup.procs"), "").unwrap();
        assert_eq!(
            cgroup_under(root.path(), &job).unwrap(),
            job.canonicalize().unwrap()
        );
        // Outside, by path or by a way out.
        let elsewhere = tempfile::tempdir().unwrap();
        fs::write(elsewhere.path().join("cgroup.procs"), "").unwrap();
        assert!(
            cgroup_under(root.path(), elsewhere.path())
                .unwrap_err()
                .contains("not under")
        );
        let dotdot = job
            .join("..")
            .join("..")
            .join(elsewhere.path().file_name().unwrap());
        assert!(cgroup_under(root.path(), &dotdot).is_err());
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("link")).unwrap();
        assert!(
            cgroup_under(root.path(), &root.path().join("link"))
                .unwrap_err()
                .contains("not under")
        );
    }
}

#[cfg(test)]
mod tests;
