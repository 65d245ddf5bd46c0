//! Builds the eBPF programs (agent-ebpf) for the bpf target with nightly and
//! bpf-linker, into OUT_DIR, where `probe::ebpf` embeds them.
//!
//! aya-build gives the inner cargo a target directory inside OUT_DIR, and
//! every build of this package has an OUT_DIR of its own (clippy's check,
//! the tests' build, the binaries'): each would compile the programs and
//! `core` for the bpf target again, about a minute on two cores. That
//! directory is made a link to one shared per profile directory
//! (`target/<profile>/ebpf`), so the inner cargo finds its work done.
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use aya_build::Toolchain;

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "agent-ebpf")
        .ok_or_else(|| anyhow!("agent-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    share_inner_target_dir(ebpf.name.as_str())?;
    aya_build::build_ebpf([package], Toolchain::default()).context(
        "building the eBPF programs failed; `cargo xtask setup` installs nightly rust-src and bpf-linker",
    )
}

/// Links `OUT_DIR/aya-build/target/<package>` (where aya-build points the
/// inner cargo) to `<target>/<profile>/ebpf/<package>`, made once and shared
/// by every build of this profile. OUT_DIR is
/// `<target or build-dir>/<profile>/build/<package-hash>/out`.
fn share_inner_target_dir(package: &str) -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        return Ok(()); // An unusual layout: aya-build's own directory it is.
    };
    let shared = profile_dir.join("ebpf").join(package);
    let link = out_dir.join("aya-build").join("target").join(package);
    if is_link_to(&link, &shared) {
        return Ok(());
    }
    std::fs::create_dir_all(&shared).with_context(|| format!("mkdir {}", shared.display()))?;
    let parent = link.parent().context("aya-build's target directory")?;
    std::fs::create_dir_all(parent).with_context(|| format!("mkdir {}", parent.display()))?;
    if link.exists() || link.is_symlink() {
        // A directory of a build before this scheme (or a stale link).
        let _ = std::fs::remove_file(&link).or_else(|_| std::fs::remove_dir_all(&link));
    }
    std::os::unix::fs::symlink(&shared, &link)
        .with_context(|| format!("ln -s {} {}", shared.display(), link.display()))
}

fn is_link_to(link: &Path, target: &Path) -> bool {
    std::fs::read_link(link).is_ok_and(|to| to == target)
}
