//! The API's local socket: made at start (its directory 0755 when missing,
//! a stale socket file removed, mode 0666 so that any local user may
//! register tasks), removed at the end. Callers on it are known by their
//! uid (auth.rs), so they need no token.

use std::{
    fs, io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;
use tracing::warn;

/// The socket file this agent made: removed on drop, unless another
/// process has put its own there since.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    inode: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.inode);
        if ours && let Err(error) = fs::remove_file(&self.path) {
            warn!(%error, path = %self.path.display(), "cannot remove the API socket");
        }
    }
}

/// Listens on `path`. An error names why not: a live agent already serves
/// it, something that is not a socket is there, or the directory or the
/// socket cannot be made.
pub(crate) fn bind(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    let context = |what: &str, error: io::Error| {
        io::Error::new(error.kind(), format!("{what} {}: {error}", path.display()))
    };
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        fs::create_dir_all(dir).map_err(|e| context("cannot make the directory of", e))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(|e| context("cannot open the directory of", e))?;
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is served by another process", path.display()),
                ));
            }
            // Nobody answers: left by an agent that did not stop cleanly.
            fs::remove_file(path).map_err(|e| context("cannot remove the stale socket", e))?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket: left alone", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(context("cannot look at", e)),
    }
    let listener = UnixListener::bind(path).map_err(|e| context("cannot listen on", e))?;
    let meta = fs::symlink_metadata(path).map_err(|e| context("cannot look at", e))?;
    let file = SocketFile {
        path: path.to_path_buf(),
        inode: (meta.dev(), meta.ino()),
    };
    fs::set_permissions(path, fs::Permissions::from_mode(0o666))
        .map_err(|e| context("cannot open up", e))?;
    Ok((listener, file))
}
