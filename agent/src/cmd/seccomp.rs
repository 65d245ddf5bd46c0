//! `memwatch seccomp-profile`: the seccomp profile the agent's container
//! needs (deploy/seccomp/memwatch.json, built in), printed or written where
//! the kubelet looks for `Localhost` profiles. The Helm chart's init
//! container runs this: the image has no shell to copy a file with.

use std::{fs, io::Write as _, path::Path};

use anyhow::Context as _;

use super::SeccompArgs;

/// The runtimes' defaults intersected, plus bpf(2) and perf_event_open(2),
/// with no conditional rule (deploy/seccomp/derive.py says how it is made
/// and proves it no wider than containerd's or containers-common's).
pub(crate) const PROFILE: &str = include_str!("../../../deploy/seccomp/memwatch.json");

pub(crate) fn run(args: &SeccompArgs) -> anyhow::Result<()> {
    match &args.output {
        None => {
            std::io::stdout()
                .write_all(PROFILE.as_bytes())
                .context("writing the profile to stdout")?;
            Ok(())
        }
        Some(path) => write(path),
    }
}

/// Writes the profile to `path` whole or not at all (a temporary file in
/// the same directory, synced, then renamed over it): a runtime reading it
/// meanwhile never sees half a profile. Makes the directory when missing.
fn write(path: &Path) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let temporary = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let mut file = fs::File::create(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    file.write_all(PROFILE.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", temporary.display()))?;
    fs::rename(&temporary, path)
        .with_context(|| format!("renaming {} to {}", temporary.display(), path.display()))?;
    eprintln!("memwatch: seccomp profile written to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_has_no_conditional_rule_allows_bpf_and_is_written_whole() {
        let profile: serde_json::Value = serde_json::from_str(PROFILE).unwrap();
        let rules = profile["syscalls"].as_array().unwrap();
        // No rule carries `includes`/`excludes`: containerd reads a
        // Localhost profile as runtime-spec JSON, which has neither, and
        // would apply a capability-held rule to everyone
        // (deploy/seccomp/derive.py). bpf and perf_event_open are allowed
        // as the profile's two additions; the capabilities still gate them
        // in the kernel.
        assert!(
            rules
                .iter()
                .all(|r| r.get("includes").is_none() && r.get("excludes").is_none()),
            "a conditional rule"
        );
        let allows = |call: &str| {
            rules.iter().any(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r["names"].as_array().unwrap().iter().any(|n| n == call)
            })
        };
        assert!(allows("bpf"));
        assert!(allows("perf_event_open"));
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memwatch/memwatch.json");
        let args = SeccompArgs {
            output: Some(path.clone()),
        };
        run(&args).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), PROFILE);
        // Again over it: replaced, no temporary left.
        run(&args).unwrap();
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["memwatch.json"]);
    }
}
