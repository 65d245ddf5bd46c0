//! Builds the eBPF programs (agent-ebpf) for the bpf target with nightly and
//! bpf-linker, into OUT_DIR, where `probe::ebpf` embeds them.
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
    aya_build::build_ebpf([package], Toolchain::default()).context(
        "building the eBPF programs failed; `cargo xtask setup` installs nightly rust-src and bpf-linker",
    )
}
