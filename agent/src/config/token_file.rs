//! Token files: read once at start, and refused, as ssh refuses a private
//! key, when another user could read or replace them.

use std::{fs::File, io::Read as _, os::unix::fs::MetadataExt as _, path::Path};

use super::{ConfigError, invalid};

/// The token in `path` (surrounding whitespace trimmed): the file named by
/// `key`. An error naming `key` and the file when it cannot be read, is
/// empty, has a mode that lets group or others at it, or is owned by a
/// user other than root and the agent's own.
pub(super) fn token_file(key: &str, path: &Path) -> Result<String, ConfigError> {
    let unreadable =
        |e: std::io::Error| invalid(key, format!("cannot be read ({}): {e}", path.display()));
    // The checks are of the file opened (fstat): no swap between them and
    // the read.
    let mut file = File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if let Some(problem) = exposed(meta.mode(), meta.uid(), me) {
        return Err(invalid(key, format!("{}: {problem}", path.display())));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(invalid(key, format!("{} is empty", path.display())));
    }
    Ok(token.to_string())
}

/// Why a token file of this `mode` and `owner` is refused to an agent
/// running as uid `me`; `None` when it is private to root or `me`.
fn exposed(mode: u32, owner: u32, me: u32) -> Option<String> {
    let permissions = mode & 0o7777;
    if permissions & 0o077 != 0 {
        return Some(format!(
            "is mode {permissions:04o}, open to group or others: a token must be readable by \
             its owner only (chmod 600; a Kubernetes Secret volume: defaultMode 0400)"
        ));
    }
    if owner != 0 && owner != me {
        return Some(format!(
            "is owned by uid {owner}, neither root nor the agent's uid {me}: that user could \
             replace the token (chown it to root or to the agent's user)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::exposed;

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
        assert!(problem.contains("agent's uid 999"), "{problem}");
    }
}
