//! Debian kernels for `cargo xtask vm-test`: which package a `--kernel`
//! names, fetched with `apt-get download` and unpacked once into
//! target/vm/kernels (later runs reuse it).
//!
//! The 6.12 line lives in `<codename>-backports`, which this machine's apt
//! sources may lack: a private apt state under target/vm/apt (its own
//! sources.list and lists, the system's keyring) reaches it without
//! touching the system's apt configuration.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, bail};

use crate::shell;

/// The default matrix: the newest Debian 6.1 and 6.12 kernels, then this
/// host's own.
pub(super) const DEFAULT_MATRIX: [&str; 3] = ["6.1", "6.12", "host"];

/// Private package lists are refreshed when older than this.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A kernel image ready to boot.
pub(super) struct Kernel {
    /// The Debian package it came from.
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// Where apt looks: the system's sources, or the private backports state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Source {
    System,
    Backports,
}

pub(super) struct Registry {
    vm_dir: PathBuf,
    backports: bool,
}

impl Registry {
    /// Prepares the private backports state (refreshing its lists when
    /// stale). Without network or a backports suite, only the system's
    /// sources are searched, and a note says so.
    pub(super) fn open(vm_dir: &Path) -> anyhow::Result<Registry> {
        let mut registry = Registry {
            vm_dir: vm_dir.to_path_buf(),
            backports: false,
        };
        let apt = registry.apt_dir();
        fs::create_dir_all(apt.join("lists/partial"))?;
        fs::create_dir_all(apt.join("cache/archives/partial"))?;
        let codename = os_codename().unwrap_or_else(|| "bookworm".into());
        fs::write(
            apt.join("sources.list"),
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 http://deb.debian.org/debian {codename}-backports main\n"
            ),
        )?;
        let stamp = apt.join("lists/.updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if !fresh {
            let mut update = Command::new("apt-get");
            update.args(registry.apt_options(Source::Backports));
            update.arg("update");
            eprintln!("xtask: vm-test: refreshing the {codename}-backports package lists");
            match update.output() {
                Ok(out) if out.status.success() => fs::write(&stamp, "")?,
                Ok(out) => eprintln!(
                    "xtask: vm-test: note: {codename}-backports unreachable ({}); only the \
                     system's apt sources are searched",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => eprintln!("xtask: vm-test: note: cannot run apt-get: {e}"),
            }
        }
        registry.backports = stamp.exists();
        Ok(registry)
    }

    fn apt_dir(&self) -> PathBuf {
        self.vm_dir.join("apt")
    }

    fn apt_options(&self, source: Source) -> Vec<String> {
        let mut options = vec![
            "-q".to_string(),
            "-o".into(),
            "APT::Sandbox::User=root".into(),
        ];
        if source == Source::Backports {
            let apt = self.apt_dir();
            for (key, value) in [
                ("Dir::Etc::SourceList", apt.join("sources.list")),
                ("Dir::Etc::SourceParts", PathBuf::from("/dev/null")),
                ("Dir::State::Lists", apt.join("lists")),
                ("Dir::Cache", apt.join("cache")),
            ] {
                options.push("-o".into());
                options.push(format!("{key}={}", value.display()));
            }
        }
        options
    }

    /// Kernel image packages (`linux-image-<version>-[cloud-]amd64-unsigned`)
    /// each source knows.
    fn packages(&self) -> Vec<(String, Source)> {
        let mut sources = vec![Source::System];
        if self.backports {
            sources.push(Source::Backports);
        }
        let mut found = Vec::new();
        for source in sources {
            let mut cmd = Command::new("apt-cache");
            cmd.args(self.apt_options(source));
            cmd.args(["pkgnames", "linux-image-"]);
            let Ok(out) = cmd.output() else { continue };
            for name in String::from_utf8_lossy(&out.stdout).lines() {
                if version_of(name).is_some() {
                    found.push((name.to_string(), source));
                }
            }
        }
        found
    }

    /// The package a `--kernel` value names: a line (`6.1`, `6.12`: its
    /// newest kernel), a version (`6.1.0-48`), or a package name. The cloud
    /// flavour is preferred (smaller; it has everything a VM needs).
    fn resolve(&self, spec: &str) -> anyhow::Result<(String, Source)> {
        let packages = self.packages();
        if let Some(found) = packages.iter().find(|(name, _)| name == spec) {
            return Ok(found.clone());
        }
        let matches = |version: &str| {
            version == spec
                || version
                    .strip_prefix(spec)
                    .is_some_and(|rest| rest.starts_with(['.', '-', '+']))
        };
        packages
            .into_iter()
            .filter_map(|(name, source)| {
                let (version, cloud) = version_of(&name)?;
                let key = (cloud, version_key(version));
                matches(version).then_some((key, name, source))
            })
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, name, source)| (name, source))
            .with_context(|| {
                format!(
                    "no Debian kernel package matches `{spec}` (searched the system's apt \
                     sources{})",
                    if self.backports { " and backports" } else { "" }
                )
            })
    }

    /// Resolves, downloads (once) and unpacks the kernel `spec` names.
    pub(super) fn fetch(&self, spec: &str) -> anyhow::Result<Kernel> {
        let (package, source) = self.resolve(spec)?;
        let unpacked = self.vm_dir.join("kernels").join(&package);
        if let Some(vmlinuz) = find_vmlinuz(&unpacked) {
            return Ok(Kernel { package, vmlinuz });
        }
        let debs = self.vm_dir.join("debs");
        fs::create_dir_all(&debs)?;
        let deb = match find_deb(&debs, &package) {
            Some(deb) => deb,
            None => {
                eprintln!("xtask: vm-test: downloading {package}");
                let status = Command::new("apt-get")
                    .args(self.apt_options(source))
                    .args(["download", &package])
                    .current_dir(&debs)
                    .status()
                    .context("cannot run apt-get download")?;
                if !status.success() {
                    bail!("`apt-get download {package}` failed ({status})");
                }
                find_deb(&debs, &package).context("apt-get download left no .deb")?
            }
        };
        let partial = self
            .vm_dir
            .join("kernels")
            .join(format!("{package}.partial"));
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial)?;
        shell::run(
            "dpkg-deb",
            &["-x".as_ref(), deb.as_os_str(), partial.as_os_str()],
        )?;
        fs::rename(&partial, &unpacked)?;
        let vmlinuz = find_vmlinuz(&unpacked)
            .with_context(|| format!("{package} holds no boot/vmlinuz-*"))?;
        Ok(Kernel { package, vmlinuz })
    }
}

/// `linux-image-<version>-cloud-amd64-unsigned` → (`<version>`, cloud?).
fn version_of(package: &str) -> Option<(&str, bool)> {
    let rest = package.strip_prefix("linux-image-")?;
    if let Some(v) = rest.strip_suffix("-cloud-amd64-unsigned") {
        return Some((v, true));
    }
    let v = rest.strip_suffix("-amd64-unsigned")?;
    // Not another flavour (rt-amd64) and a version that starts with a digit.
    (!v.ends_with("-rt") && v.starts_with(|c: char| c.is_ascii_digit())).then_some((v, false))
}

/// `6.12.95+deb12` → [6, 12, 95, 12]: compares as Debian's versions do
/// for kernels.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

fn find_vmlinuz(unpacked: &Path) -> Option<PathBuf> {
    find_file(&unpacked.join("boot"), |n| n.starts_with("vmlinuz-"))
}

fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    find_file(dir, |n| n.starts_with(&prefix) && n.ends_with(".deb"))
}

/// The first entry of `dir` whose file name `wanted` accepts.
fn find_file(dir: &Path, wanted: impl Fn(&str) -> bool) -> Option<PathBuf> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&wanted))
}

fn os_codename() -> Option<String> {
    fs::read_to_string("/etc/os-release")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_give_their_version_and_flavour() {
        assert_eq!(
            version_of("linux-image-6.1.0-48-cloud-amd64-unsigned"),
            Some(("6.1.0-48", true))
        );
        assert_eq!(
            version_of("linux-image-6.12.95+deb12-amd64-unsigned"),
            Some(("6.12.95+deb12", false))
        );
        assert_eq!(version_of("linux-image-6.1.0-48-rt-amd64-unsigned"), None);
        assert_eq!(version_of("linux-image-6.1.0-48-cloud-amd64"), None);
        assert!(version_key("6.12.95+deb12") > version_key("6.12.43+deb12"));
        assert!(version_key("6.1.0-48") > version_key("6.1.0-9"));
    }
}
