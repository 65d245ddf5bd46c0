//! Token files: read once at start, and refused, as ssh refuses a private
//! key, when another user could read or replace them.

use std::path::Path;

use super::{ConfigError, invalid};
use crate::model::secret_file::read_private;

/// The token in `path` (surrounding whitespace trimmed): the file named by
/// `key`. An error naming `key` and the file when it cannot be read, is
/// empty, has a mode that lets group or others at it, or is owned by a
/// user other than root and the agent's own (`model::secret_file`).
pub(super) fn token_file(key: &str, path: &Path) -> Result<String, ConfigError> {
    let text = read_private(path).map_err(|problem| invalid(key, problem))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(invalid(key, format!("{} is empty", path.display())));
    }
    Ok(token.to_string())
}
