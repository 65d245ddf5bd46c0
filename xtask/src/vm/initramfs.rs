//! The initramfs `cargo xtask vm-test` boots: busybox, the debug
//! binaries and the kernel test binaries at the same absolute paths as on
//! the host (so their baked-in paths work), every shared library `ldd`
//! names, and an init script that sets up pure cgroup v2, runs the tests
//! and prints their results on the serial console.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::shell;

/// Lines the init script prints and vm-test looks for.
pub(super) const BOOTED: &str = "MEMWATCH-VM-BOOTED";
pub(super) const DOCTOR_BEGIN: &str = "MEMWATCH-DOCTOR-BEGIN";
pub(super) const DOCTOR_END: &str = "MEMWATCH-DOCTOR-END";
pub(super) const TEST_END: &str = "MEMWATCH-VM-TEST-END";
pub(super) const EXIT: &str = "MEMWATCH-VM-EXIT=";

/// Host programs the tests run besides the workspace's own (`setpriv` of
/// util-linux: busybox's lacks `--reuid`).
const HOST_PROGRAMS: [&str; 1] = ["/usr/bin/setpriv"];

pub(super) struct Contents<'a> {
    /// `memwatch`, `memhog`, … (target/debug/*).
    pub binaries: &'a [PathBuf],
    /// The kernel test executables, run in this order.
    pub tests: &'a [PathBuf],
    /// The tests' working directory (the tests crate, as under cargo).
    pub workdir: &'a Path,
    pub memwatch: &'a Path,
    /// `MEMWATCH_TEST_TIME_SCALE` for the tests' latency bounds: above 1
    /// only under software emulation.
    pub time_scale: u32,
    /// Runs of the whole list.
    pub repeat: u32,
    /// Passed to each test executable.
    pub test_args: &'a [String],
    /// A shell line the init runs instead of the tests (in `workdir`),
    /// its exit status the run's.
    pub command: Option<&'a str>,
}

/// Writes `<dir>/initramfs.cpio` (uncompressed newc: the kernel unpacks it
/// faster than it would gunzip it) and returns its path.
pub(super) fn build(dir: &Path, contents: &Contents<'_>) -> anyhow::Result<PathBuf> {
    let root = dir.join("root");
    let _ = fs::remove_dir_all(&root);
    for sub in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "root", "etc",
    ] {
        fs::create_dir_all(root.join(sub))?;
    }
    let busybox = Path::new("/bin/busybox");
    if !is_static(busybox) {
        bail!("/bin/busybox is not static: install busybox-static");
    }
    fs::copy(busybox, root.join("bin/busybox"))?;
    let mut elves: Vec<PathBuf> = contents.binaries.to_vec();
    elves.extend(contents.tests.iter().cloned());
    elves.extend(HOST_PROGRAMS.iter().map(PathBuf::from));
    let mut libraries = BTreeSet::new();
    for elf in &elves {
        copy_stripped(&root, elf)?;
        libraries.extend(shared_libraries(elf)?);
    }
    for lib in &libraries {
        copy_at_same_path(&root, lib)?;
    }
    fs::create_dir_all(root.join(contents.workdir.strip_prefix("/")?))?;
    fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost\n",
    )?;
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    let init = root.join("init");
    fs::write(&init, init_script(contents))?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;

    let cpio = dir.join("initramfs.cpio");
    let script = format!(
        "cd '{}' && find . -print | cpio --quiet -o -H newc > '{}'",
        root.display(),
        cpio.display()
    );
    shell::run("sh", &["-c", &script])?;
    Ok(cpio)
}

/// The tests of a binary run one at a time in the VM: its emulated CPUs
/// are one host thread, and agents of tests running side by side there
/// would measure each other's load, not the latency the bounds are about.
fn init_script(contents: &Contents<'_>) -> String {
    let mut tests = String::new();
    let extra: String = contents
        .test_args
        .iter()
        .map(|a| format!(" '{}'", a.replace('\'', "'\\''")))
        .collect();
    let runs = (0..contents.repeat.max(1)).flat_map(|_| contents.tests.iter());
    for test in runs {
        let name = test_name(test);
        tests.push_str(&format!(
            "echo \"MEMWATCH-VM-TEST-BEGIN {name}\"\n\
             (cd '{workdir}' && '{exe}' --show-output --test-threads=1{extra} 2>&1)\n\
             r=$?\n\
             echo \"{TEST_END} {name} rc=$r\"\n\
             [ $r -eq 0 ] || rc=1\n",
            workdir = contents.workdir.display(),
            exe = test.display(),
        ));
    }
    if let Some(command) = contents.command {
        tests = format!(
            "echo \"MEMWATCH-VM-TEST-BEGIN command\"\n\
             (cd '{workdir}' && {command} 2>&1)\n\
             r=$?\n\
             echo \"{TEST_END} command rc=$r\"\n\
             [ $r -eq 0 ] || rc=1\n",
            workdir = contents.workdir.display(),
        );
    }
    format!(
        r#"#!/bin/busybox sh
# Written by `cargo xtask vm-test`: pure cgroup v2, then the kernel tests.
/bin/busybox --install -s
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CI=true RUST_BACKTRACE=1 MEMWATCH_TEST_TIME_SCALE={time_scale}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up
exec < /dev/console > /dev/console 2>&1
echo "{BOOTED} uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) controllers=$(cat /sys/fs/cgroup/cgroup.subtree_control)"
echo {DOCTOR_BEGIN}
'{memwatch}' doctor --json
echo {DOCTOR_END}
rc=0
{tests}echo "{EXIT}$rc"
sync
poweroff -f
"#,
        memwatch = contents.memwatch.display(),
        time_scale = contents.time_scale,
    )
}

/// `kernels-0123abcd` → `kernels`.
pub(super) fn test_name(exe: &Path) -> String {
    let file = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match file.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => file,
    }
}

fn copy_at_same_path(root: &Path, file: &Path) -> anyhow::Result<()> {
    let target = root.join(file.strip_prefix("/").context("absolute paths only")?);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    // Follow symlinks (libc.so.6 → libc-2.36.so): the copy is the file itself.
    fs::copy(file, &target).with_context(|| format!("copying {}", file.display()))?;
    Ok(())
}

/// An executable at its own path without its line tables (the guest's RAM
/// holds the whole initramfs; a panic still names its file and line in its
/// message). A plain copy where objcopy is missing or fails.
fn copy_stripped(root: &Path, file: &Path) -> anyhow::Result<()> {
    let target = root.join(file.strip_prefix("/").context("absolute paths only")?);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    let stripped = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(file)
        .arg(&target)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        copy_at_same_path(root, file)?;
    }
    Ok(())
}

fn is_static(elf: &Path) -> bool {
    Command::new("ldd").arg(elf).output().is_ok_and(|o| {
        !o.status.success() || String::from_utf8_lossy(&o.stdout).contains("not a dynamic")
    })
}

/// Every file `ldd` resolves for `elf`, the loader included.
fn shared_libraries(elf: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(elf)
        .output()
        .with_context(|| format!("ldd {}", elf.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic") {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for line in text.lines() {
        if line.contains("not found") {
            bail!("{}: a library is missing: {}", elf.display(), line.trim());
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`.
        let path = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|p| p.starts_with('/'));
        if let Some(path) = path {
            found.push(PathBuf::from(path));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_drop_the_cargo_hash() {
        assert_eq!(
            test_name(Path::new("/t/release/deps/kernels-0123abcdef")),
            "kernels"
        );
        assert_eq!(test_name(Path::new("/t/memhog")), "memhog");
    }

    #[test]
    fn a_command_runs_instead_of_the_tests_and_gives_the_exit_line() {
        let (bins, tests) = (
            [PathBuf::from("/w/target/release/memwatch")],
            [PathBuf::from("/w/target/debug/deps/kernels-0123")],
        );
        let contents = |command| Contents {
            binaries: &bins,
            tests: &tests,
            workdir: Path::new("/w"),
            memwatch: &bins[0],
            time_scale: 4,
            repeat: 1,
            test_args: &[],
            command,
        };
        let tests_run = init_script(&contents(None));
        assert!(tests_run.contains("'/w/target/debug/deps/kernels-0123' --show-output"));
        let script = init_script(&contents(Some("'/w/xtask' bench-in-vm")));
        assert!(!script.contains("kernels-0123"), "{script}");
        assert!(
            script.contains("(cd '/w' && '/w/xtask' bench-in-vm 2>&1)"),
            "{script}"
        );
        let end = script.find(TEST_END).expect("the end line");
        let exit = script.find(EXIT).expect("the exit line");
        assert!(
            end < exit && script.contains("[ $r -eq 0 ] || rc=1"),
            "{script}"
        );
    }
}
