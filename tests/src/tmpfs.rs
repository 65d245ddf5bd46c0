//! A small tmpfs, mounted for one test and unmounted on drop (root only),
//! to run the agent on a disk that fills up.

use std::{
    fs::{self, OpenOptions},
    io::{ErrorKind, Write as _},
    path::{Path, PathBuf},
    process::Command,
};

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `1m`).
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount tmpfs on {}: {status}",
            dir.path().display()
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes to `name` until the file system is full; returns its path.
    /// Called again, it takes whatever space was given back since.
    pub fn fill(&self, name: &str) -> PathBuf {
        let path = self.path().join(name);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open filler");
        for chunk in [64 * 1024, 4096, 512, 64, 1] {
            let buf = vec![0u8; chunk];
            // Bounded: a 1 MiB file system takes at most 16 Ki chunks of 64 bytes.
            for _ in 0..100_000 {
                match file.write(&buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::StorageFull => break,
                    Err(e) => panic!("filling {}: {e}", path.display()),
                }
            }
        }
        path
    }

    /// Frees what `fill` took.
    pub fn free(&self, name: &str) {
        fs::remove_file(self.path().join(name)).expect("remove filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(self.dir.path()).status();
        if !status.is_ok_and(|s| s.success()) {
            // Busy (an agent still exiting): detach it all the same.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}
