//! A small ext4 file system on a loop device, mounted for one test and
//! unmounted on drop (root only), that can be frozen (`fsfreeze`): every
//! write to it then blocks until it is thawed, as on a hung disk or during
//! a storage snapshot. tmpfs cannot be frozen; ext4 can.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub struct Ext4 {
    mount: tempfile::TempDir,
    /// Holds the image file.
    _image_dir: tempfile::TempDir,
    frozen: bool,
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(status.success(), "{program} {args:?}: {status}");
}

impl Ext4 {
    /// Makes and mounts an ext4 file system of `mib` MiB.
    pub fn mount(mib: u64) -> Ext4 {
        let image_dir = tempfile::tempdir().expect("image dir");
        let image = image_dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .expect("image file");
        let image = image.to_str().expect("UTF-8 path").to_string();
        run("mkfs.ext4", &["-q", "-F", &image]);
        let mount = tempfile::tempdir().expect("mount point");
        run(
            "mount",
            &["-o", "loop", &image, mount.path().to_str().expect("UTF-8")],
        );
        Ext4 {
            mount,
            _image_dir: image_dir,
            frozen: false,
        }
    }

    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// A directory on it (made now).
    pub fn dir(&self, name: &str) -> PathBuf {
        let dir = self.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir on the ext4 mount");
        dir
    }

    /// Freezes it: writes block from now on until [`Ext4::thaw`].
    pub fn freeze(&mut self) {
        run(
            "fsfreeze",
            &["--freeze", self.path().to_str().expect("UTF-8")],
        );
        self.frozen = true;
    }

    pub fn thaw(&mut self) {
        run(
            "fsfreeze",
            &["--unfreeze", self.path().to_str().expect("UTF-8")],
        );
        self.frozen = false;
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let path = self.path().to_path_buf();
        if self.frozen {
            let _ = Command::new("fsfreeze")
                .arg("--unfreeze")
                .arg(&path)
                .status();
        }
        // Lazily: a process still holding a file there (the agent being
        // killed) must not leave the mount behind.
        let _ = Command::new("umount").arg("-l").arg(&path).status();
    }
}

/// Thaws the file system when dropped. Declared after the agent that writes
/// there, it is dropped before it: a test that fails while the file system
/// is frozen then does not wait for ever on an agent whose writer thread is
/// stuck in it (the agent cannot exit until the thaw).
pub struct ThawOnDrop(PathBuf);

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze")
            .arg("--unfreeze")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Ext4 {
    /// A [`ThawOnDrop`] for this file system.
    pub fn thaw_on_drop(&self) -> ThawOnDrop {
        ThawOnDrop(self.path().to_path_buf())
    }
}
