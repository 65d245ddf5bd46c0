//! Files that hold secrets (API tokens, OTLP header values): read whole,
//! and refused, as ssh refuses a private key, when another user could read
//! or replace them. One rule for the agent's token files, the OTLP sink's
//! headers file and the client commands' `--token-file`.

use std::{fs::File, io::Read as _, os::unix::fs::MetadataExt as _, path::Path};

/// The text of the file at `path`, when it is private to root or to this
/// process's user; else why not, naming the file.
pub(crate) fn read_private(path: &Path) -> Result<String, String> {
    let unreadable = |e: std::io::Error| format!("cannot be read ({}): {e}", path.display());
    // The checks are of the file opened (fstat): no swap between them and
    // the read.
    let mut file = File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if let Some(problem) = exposed(meta.mode(), meta.uid(), me) {
        return Err(format!("{}: {problem}", path.display()));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    Ok(text)
}

/// Why a secrets file of this `mode` and `owner` is refused to a process
/// running as uid `me`; `None` when it is private to root or `me`.
fn exposed(mode: u32, owner: u32, me: u32) -> Option<String> {
    let permissions = mode & 0o7777;
    if permissions & 0o077 != 0 {
        return Some(format!(
            "is mode {permissions:04o}, open to group or others: a secret must be readable by \
             its owner only (chmod 600; a Kubernetes Secret volume: defaultMode 0400)"
        ));
    }
    if owner != 0 && owner != me {
        return Some(format!(
            "is owned by uid {owner}, neither root nor this process's uid {me} (the agent's, \
             or yours for a client command): that user could replace it (chown it to root or \
             to this user)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _};

    use super::*;

    #[test]
    fn only_a_file_private_to_root_or_the_agent_passes() {
        for (mode, owner, me) in [
            (0o100600, 0, 0),
            (0o100400, 0, 999),
            (0o100400, 999, 999),
            (0o100700, 999, 999),
        ] {
            assert_eq!(exposed(mode, owner, me), None, "{mode:o} {owner} {me}");
        }
        for (mode, needle) in [
            (0o100644, "mode 0644"),
            (0o100640, "mode 0640"),
            (0o100604, "mode 0604"),
            (0o100620, "mode 0620"),
            (0o100602, "mode 0602"),
        ] {
            let problem = exposed(mode, 0, 0).expect("refused");
            assert!(problem.contains(needle), "{problem}");
            assert!(problem.contains("chmod 600"), "{problem}");
        }
        let problem = exposed(0o100600, 1000, 999).expect("another user's file");
        assert!(problem.contains("owned by uid 1000"), "{problem}");
        assert!(problem.contains("uid 999"), "{problem}");
    }

    #[test]
    fn a_private_file_is_read_and_an_open_one_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        fs::write(&path, "s3cret\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_private(&path).unwrap(), "s3cret\n");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let error = read_private(&path).unwrap_err();
        assert!(error.starts_with(&path.display().to_string()), "{error}");
        assert!(error.contains("mode 0644"), "{error}");
        let missing = read_private(&dir.path().join("none")).unwrap_err();
        assert!(missing.starts_with("cannot be read"), "{missing}");
    }
}
