//! Cgroups the mkdir probe reported but the resolver could not check: the
//! directory was gone by the time the record was read (a cgroup removed
//! right after its OOM kill, on a busy agent).
//!
//! The probe's record does not say which hierarchy it is of, and on hybrid
//! hosts every v1 hierarchy numbers its cgroups on its own, so such a record
//! may be another hierarchy's. It is kept, bounded, as a candidate only:
//! [`super::CgroupResolver::resolve`] answers with it only when neither its
//! cache nor a walk of the memory hierarchy knows the id, so it can never
//! hide a checked path. An id claimed by two different paths is ambiguous
//! and answers nothing, and a record whose parent is not a directory of the
//! memory hierarchy (nor itself a candidate) is not kept.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
};

/// Candidates kept; the oldest go first. A kill is read within moments of
/// its cgroup's mkdir, so only the latest few records ever matter.
pub(super) const MAX_UNVERIFIED: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Unverified {
    /// id → its path, or `None` when records of two paths claimed it.
    by_id: HashMap<u64, Option<PathBuf>>,
    /// Insertion order, for the bound.
    order: VecDeque<u64>,
}

impl Unverified {
    /// Keeps `path` as what `id` may be.
    pub(super) fn keep(&mut self, id: u64, path: PathBuf) {
        let plausible = path
            .parent()
            .is_some_and(|parent| parent.is_dir() || self.has_path(parent));
        if !plausible {
            return;
        }
        if let Some(known) = self.by_id.get(&id) {
            if known.as_ref().is_some_and(|known| *known != path) {
                self.by_id.insert(id, None);
            }
            return;
        }
        if self.order.len() >= MAX_UNVERIFIED
            && let Some(oldest) = self.order.pop_front()
        {
            self.by_id.remove(&oldest);
        }
        self.by_id.insert(id, Some(path));
        self.order.push_back(id);
    }

    /// The candidate path of `id`, if exactly one was reported.
    pub(super) fn get(&self, id: u64) -> Option<&Path> {
        self.by_id.get(&id)?.as_deref()
    }

    /// Forgets `id` (it was checked after all).
    pub(super) fn forget(&mut self, id: u64) {
        if self.by_id.remove(&id).is_some() {
            self.order.retain(|k| *k != id);
        }
    }

    fn has_path(&self, path: &Path) -> bool {
        self.by_id.values().flatten().any(|p| p == path)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.by_id.len(), self.order.len());
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt as _};

    use super::*;
    use crate::cgroup::{CgroupResolver, CgroupVersion, MemoryHierarchy};

    fn resolver(root: &Path) -> CgroupResolver {
        CgroupResolver::new(MemoryHierarchy {
            root: root.into(),
            version: CgroupVersion::V1,
        })
    }

    fn ino(path: &Path) -> u64 {
        fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_mkdir_read_after_the_cgroup_was_removed_still_resolves() {
        let root = tempfile::tempdir().unwrap();
        let gone = root.path().join("shortlived");
        let (parent, child) = (root.path().join("p"), root.path().join("p/c"));
        fs::create_dir(&gone).unwrap();
        fs::create_dir_all(&child).unwrap();
        // All made before any is removed: no inode is reused among them.
        let (id, parent_id, child_id) = (ino(&gone), ino(&parent), ino(&child));
        fs::remove_dir(&gone).unwrap();
        fs::remove_dir(&child).unwrap();
        fs::remove_dir(&parent).unwrap();
        let mut r = resolver(root.path());
        // Not checkable, so not learned as a fact...
        assert_eq!(r.learn(id, "/shortlived"), None);
        assert_eq!(r.known_path(id), None);
        // ...but the last resort of resolve().
        assert_eq!(r.resolve(id), Some(gone.clone()));
        // Nested, both levels gone: the child's parent is a candidate.
        assert_eq!(r.learn(parent_id, "/p"), None);
        assert_eq!(r.learn(child_id, "/p/c"), None);
        assert_eq!(r.resolve(child_id), Some(child));
    }

    #[test]
    fn other_hierarchies_records_are_still_rejected_or_never_win() {
        let root = tempfile::tempdir().unwrap();
        let live = root.path().join("live");
        fs::create_dir(&live).unwrap();
        let live_id = ino(&live);
        let mut r = resolver(root.path());
        // A path that exists with another inode: another hierarchy's cgroup
        // of the same name, rejected and not kept at all.
        assert_eq!(r.learn(live_id + 1000, "/live"), None);
        assert_eq!(r.resolve(live_id + 1000), None);
        // A gone path claiming an id the memory hierarchy has: the walk wins.
        assert_eq!(r.learn(live_id, "/elsewhere"), None);
        assert_eq!(r.resolve(live_id), Some(live.clone()));
        // Checked later on: the candidate is dropped for the fact.
        let late = root.path().join("late");
        fs::create_dir(&late).unwrap();
        let late_id = ino(&late);
        r.unverified.keep(late_id, root.path().join("other"));
        assert_eq!(r.learn(late_id, "/late"), Some(late.clone()));
        assert_eq!(r.unverified.get(late_id), None);
        // One id, two gone paths (two hierarchies): ambiguous, no answer.
        let id = u64::MAX - 1;
        assert_eq!(r.learn(id, "/a"), None);
        assert_eq!(r.learn(id, "/b"), None);
        assert_eq!(r.resolve(id), None);
        // A parent the memory hierarchy does not have: not one of its cgroups.
        assert_eq!(r.learn(u64::MAX - 2, "/no/such/parent"), None);
        assert_eq!(r.resolve(u64::MAX - 2), None);
    }

    #[test]
    fn candidates_are_bounded_oldest_first() {
        let root = tempfile::tempdir().unwrap();
        let mut u = Unverified::default();
        let n = MAX_UNVERIFIED as u64 + 10;
        for id in 0..n {
            u.keep(id, root.path().join(format!("c{id}")));
            assert!(u.len() <= MAX_UNVERIFIED);
        }
        assert_eq!(u.get(0), None);
        assert_eq!(
            u.get(n - 1),
            Some(root.path().join(format!("c{}", n - 1)).as_path())
        );
        u.forget(n - 1);
        assert_eq!((u.get(n - 1), u.len()), (None, MAX_UNVERIFIED - 1));
    }
}
