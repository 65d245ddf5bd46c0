//! memwatch's seccomp profile (deploy/seccomp/memwatch.json) against the
//! runtimes' defaults, as data: containers-common's seccomp.json (CRI-O,
//! podman) and containerd's DefaultProfile, compiled from its Go source and
//! run for memwatch's capabilities on each architecture
//! (deploy/seccomp/derive.py). The shipped profile is derive.py's output,
//! and for every call and argument rule it allows no more than each default
//! (bar bpf and perf_event_open); a profile widened by one call fails the
//! same check. The defaults come from Debian's packages (containers-common,
//! containerd's -dev sources, Go), installed when missing: root in CI.

use std::{fs, path::Path, process::Command};

use memwatch_tests::{
    ops::repo,
    process::{apt_install, combined_output},
};
use serde_json::Value;

/// containers-common's default (CRI-O, podman).
const CONTAINERS_COMMON: &str = "/usr/share/containers/seccomp.json";
/// containerd's default profile, Go source (contrib/seccomp).
const CONTAINERD: &str = "/usr/share/gocode/src/github.com/containerd/containerd/contrib/seccomp";

fn ensure_defaults() {
    apt_install(
        &[
            "golang-github-containers-common",
            "golang-github-containerd-containerd-dev",
            "golang-github-opencontainers-specs-dev",
            "golang-golang-x-sys-dev",
            "golang-go",
        ],
        || {
            Path::new(CONTAINERS_COMMON).exists()
                && Path::new(CONTAINERD).join("seccomp_default.go").exists()
                && Path::new("/usr/share/gocode/src/github.com/opencontainers/runtime-spec")
                    .exists()
                && which::which("go").is_ok()
        },
    );
}

fn derive(args: &[&Path]) -> std::process::Output {
    Command::new("python3")
        .arg(repo().join("deploy/seccomp/derive.py"))
        .args(args)
        .output()
        .expect("run derive.py")
}

#[test]
fn the_shipped_profile_is_the_runtimes_defaults_intersected() {
    ensure_defaults();
    let out = derive(&[
        Path::new("derive"),
        Path::new(CONTAINERS_COMMON),
        Path::new(CONTAINERD),
    ]);
    assert!(out.status.success(), "{}", combined_output(&out));
    let shipped = fs::read_to_string(repo().join("deploy/seccomp/memwatch.json")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        shipped,
        "deploy/seccomp/memwatch.json is derive.py's output"
    );
    // Read as containerd reads it (runtime-spec JSON): no rule that holds
    // only for some capabilities or arches, which it would apply to all.
    let profile: Value = serde_json::from_str(&shipped).unwrap();
    let rules = profile["syscalls"].as_array().unwrap();
    assert!(rules.len() > 5);
    for rule in rules {
        assert!(
            rule.get("includes").is_none() && rule.get("excludes").is_none(),
            "{rule}"
        );
    }
    let allowed = |name: &str| {
        rules.iter().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                && r["names"].as_array().unwrap().iter().any(|n| n == name)
        })
    };
    // What containers-common allows and containerd refuses without
    // CAP_SYS_ADMIN stays refused; the two additions are there.
    for call in [
        "mount",
        "umount2",
        "unshare",
        "setns",
        "pivot_root",
        "keyctl",
    ] {
        assert!(!allowed(call), "{call} allowed");
    }
    for call in ["bpf", "perf_event_open", "read", "mmap", "clone"] {
        assert!(allowed(call), "{call} refused");
    }
}

#[test]
fn the_shipped_profile_allows_no_more_than_each_runtime_default() {
    ensure_defaults();
    let shipped = repo().join("deploy/seccomp/memwatch.json");
    let check = |profile: &Path| {
        derive(&[
            Path::new("verify"),
            profile,
            Path::new(CONTAINERS_COMMON),
            Path::new(CONTAINERD),
        ])
    };
    let out = check(&shipped);
    let text = combined_output(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 rules wider"), "{text}");

    // The check fails where the profile is wider: one call containerd
    // refuses, one argument rule dropped (clone with any flags), one rule
    // held to a capability (applied to all by containerd).
    let mut profile: Value = serde_json::from_str(&fs::read_to_string(&shipped).unwrap()).unwrap();
    let rules = profile["syscalls"].as_array_mut().unwrap();
    for rule in rules.iter_mut() {
        if rule["names"] == serde_json::json!(["clone"]) {
            rule["args"] = serde_json::json!([]);
        }
    }
    rules.push(serde_json::json!({"names": ["mount"], "action": "SCMP_ACT_ALLOW", "args": []}));
    rules.push(serde_json::json!({
        "names": ["reboot"], "action": "SCMP_ACT_ALLOW", "args": [],
        "includes": {"caps": ["CAP_SYS_BOOT"]}
    }));
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.json");
    fs::write(&wide, profile.to_string()).unwrap();
    let out = check(&wide);
    let text = combined_output(&out);
    assert!(!out.status.success(), "{text}");
    for why in [
        "amd64 containerd: mount allowed, the default refuses it",
        "amd64 containerd: clone allowed for any arguments",
        "reboot']: includes/excludes",
        "amd64 containerd: reboot allowed, the default refuses it",
    ] {
        assert!(text.contains(why), "{why}:\n{text}");
    }
}
