//! Making a task's cgroup under a directory someone else named (the agent
//! tells `memwatch exec` its worker's cgroup): the directory is reached
//! one component at a time without following a symlink (`openat` with
//! `O_NOFOLLOW`), must be on a cgroup file system (`fstatfs`), and the new
//! cgroup is made in it by `mkdirat`, failing when it exists, so exec never
//! writes its hard cap or its child's pid into a directory it did not make.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Component, Path, PathBuf},
};

use super::{OwnedCgroup, enable_memory_controller_above};

/// `CGROUP_SUPER_MAGIC` and `CGROUP2_SUPER_MAGIC` (linux/magic.h).
const CGROUP_MAGICS: [i64; 2] = [0x0027_e0eb, 0x6367_7270];

/// Why a parent directory is not one to make a cgroup in.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnsafeParent {
    #[error("{0} is not an absolute path without `..`")]
    NotPlain(PathBuf),
    #[error("{path}: component {component:?} is a symlink (not followed)")]
    Symlink { path: PathBuf, component: String },
    #[error("{path}: cannot open component {component:?}: {source}")]
    Open {
        path: PathBuf,
        component: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not on a cgroup file system (statfs type {kind:#x})")]
    NotCgroupFs { path: PathBuf, kind: i64 },
}

/// Why a task's cgroup could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CreateError {
    #[error(transparent)]
    Parent(#[from] UnsafeParent),
    /// Another cgroup of that name is there: never taken over.
    #[error("{0} already exists (another task's cgroup, or one not made by memwatch)")]
    Exists(PathBuf),
    #[error("{name:?} is not a single path component")]
    BadName { name: String },
    #[error("cannot make {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Opens `path` (`O_PATH`), each component without following a symlink,
/// and checks that it is a directory on a cgroup file system.
pub(crate) fn open_cgroup_dir(path: &Path) -> Result<OwnedFd, UnsafeParent> {
    let dir = open_plain_dir(path)?;
    let kind = fs_type(&dir).map_err(|source| UnsafeParent::Open {
        path: path.to_path_buf(),
        component: ".".into(),
        source,
    })?;
    if !CGROUP_MAGICS.contains(&kind) {
        return Err(UnsafeParent::NotCgroupFs {
            path: path.to_path_buf(),
            kind,
        });
    }
    Ok(dir)
}

/// Makes cgroup `name` in `parent` (checked by [`open_cgroup_dir`]); an
/// existing one is [`CreateError::Exists`].
pub(crate) fn create_in(parent: &Path, name: &str) -> Result<OwnedCgroup, CreateError> {
    let dir = open_cgroup_dir(parent)?;
    let path = parent.join(name);
    match mkdir_at(&dir, name) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(CreateError::Exists(path));
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            return Err(CreateError::BadName { name: name.into() });
        }
        Err(source) => return Err(CreateError::Io { path, source }),
    }
    // Made: from here on it is ours, removed on drop.
    let cgroup = OwnedCgroup { path };
    enable_memory_controller_above(cgroup.path()).map_err(|source| CreateError::Io {
        path: cgroup.path().to_path_buf(),
        source,
    })?;
    Ok(cgroup)
}

/// Makes directory `name` in checked cgroup `parent` unless it is there
/// (the shared `<memory root>/memwatch` parent), and checks it in turn.
pub(crate) fn ensure_dir_in(parent: &Path, name: &str) -> Result<PathBuf, CreateError> {
    let dir = open_cgroup_dir(parent)?;
    let path = parent.join(name);
    match mkdir_at(&dir, name) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CreateError::Io { path, source }),
    }
    open_cgroup_dir(&path)?;
    Ok(path)
}

fn open_plain_dir(path: &Path) -> Result<OwnedFd, UnsafeParent> {
    let not_plain = || UnsafeParent::NotPlain(path.to_path_buf());
    if !path.is_absolute() {
        return Err(not_plain());
    }
    let mut dir = open_at(None, c"/").map_err(|source| UnsafeParent::Open {
        path: path.to_path_buf(),
        component: "/".into(),
        source,
    })?;
    for component in path.components() {
        let name = match component {
            Component::RootDir => continue,
            Component::Normal(name) => name,
            _ => return Err(not_plain()),
        };
        let shown = name.to_string_lossy().into_owned();
        let c_name = CString::new(name.as_bytes()).map_err(|_| not_plain())?;
        dir = match open_at(Some(&dir), &c_name) {
            Ok(next) => next,
            Err(source) if is_symlink_at(&dir, &c_name) => {
                drop(source);
                return Err(UnsafeParent::Symlink {
                    path: path.to_path_buf(),
                    component: shown,
                });
            }
            Err(source) => {
                return Err(UnsafeParent::Open {
                    path: path.to_path_buf(),
                    component: shown,
                    source,
                });
            }
        };
    }
    Ok(dir)
}

/// `openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW)`: a symlink fails.
fn open_at(dir: Option<&OwnedFd>, name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid C string and a directory fd we own (or AT_FDCWD).
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn is_symlink_at(dir: &OwnedFd, name: &std::ffi::CStr) -> bool {
    // SAFETY: zeroed stat is a valid out buffer; valid fd and C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    rc == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFLNK
}

fn fs_type(dir: &OwnedFd) -> io::Result<i64> {
    // SAFETY: zeroed statfs is a valid out buffer; a valid fd.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets.
    Ok(st.f_type as i64)
}

fn mkdir_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let c_name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid directory fd and C string.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c_name.as_ptr(), 0o755) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_off_cgroup_fs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = open_cgroup_dir(dir.path()).unwrap_err();
        assert!(matches!(e, UnsafeParent::NotCgroupFs { .. }), "{e}");
        assert!(e.to_string().contains("not on a cgroup file system"), "{e}");
        let e = create_in(dir.path(), "task-x").unwrap_err();
        assert!(matches!(e, CreateError::Parent(_)), "{e}");
        assert!(!dir.path().join("task-x").exists(), "nothing was made");
    }

    #[test]
    fn a_symlink_on_the_way_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let e = open_cgroup_dir(&dir.path().join("link")).unwrap_err();
        assert!(
            matches!(&e, UnsafeParent::Symlink { component, .. } if component == "link"),
            "{e}"
        );
        // Also a symlink in the middle, to a real cgroup file system.
        if let Ok(h) = crate::cgroup::MemoryHierarchy::discover() {
            std::os::unix::fs::symlink(&h.root, dir.path().join("cg")).unwrap();
            let e = open_cgroup_dir(&dir.path().join("cg")).unwrap_err();
            assert!(matches!(e, UnsafeParent::Symlink { .. }), "{e}");
            assert!(open_cgroup_dir(&h.root).is_ok(), "the real one is accepted");
        }
    }

    #[test]
    fn relative_and_dotdot_paths_are_refused() {
        for path in ["sys/fs/cgroup", "/sys/fs/cgroup/../cgroup"] {
            let e = open_cgroup_dir(Path::new(path)).unwrap_err();
            assert!(matches!(e, UnsafeParent::NotPlain(_)), "{path}: {e}");
        }
    }

    #[test]
    fn names_are_single_components() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_plain_dir(dir.path()).unwrap();
        for name in ["", ".", "..", "a/b"] {
            assert_eq!(
                mkdir_at(&fd, name).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{name:?}"
            );
        }
        mkdir_at(&fd, "t").unwrap();
        assert_eq!(
            mkdir_at(&fd, "t").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }
}

/// On the host's real memory hierarchy (root only, as in CI): the task's
/// cgroup is made once; a second make of the same name fails, and the
/// first is left as it was.
#[cfg(test)]
mod host_tests {
    use super::*;

    #[test]
    fn an_existing_cgroup_is_never_taken_over() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: making a cgroup needs root");
            return;
        }
        let h = crate::cgroup::MemoryHierarchy::discover().expect("a memory hierarchy");
        let name = format!("memwatch-safe-test-{}", std::process::id());
        let first = create_in(&h.root, &name).expect("made");
        first.set_hard_limit(64 << 20).unwrap();
        let e = create_in(&h.root, &name).unwrap_err();
        assert!(matches!(e, CreateError::Exists(_)), "{e}");
        assert!(e.to_string().contains("already exists"), "{e}");
        assert!(first.path().is_dir(), "the first is still there");
        first.remove().unwrap();
        assert!(!h.root.join(&name).exists());
    }
}
