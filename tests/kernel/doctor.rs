//! `memwatch doctor` on this kernel, with and without privileges.

use std::process::Command;

use memwatch_test_support::agent::UNPRIVILEGED;
use memwatch_tests::{kernel_tests_enabled, workspace_bin};

#[test]
fn doctor_as_root_finds_the_ebpf_source() {
    if !kernel_tests_enabled("doctor_as_root_finds_the_ebpf_source") {
        return;
    }
    let out = Command::new(workspace_bin("memwatch"))
        .arg("doctor")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    for row in [
        "BTF ",
        "oom/mark_victim",
        "cgroup/cgroup_mkdir",
        "memory controller",
        "CAP_BPF",
    ] {
        assert!(
            table.lines().any(|l| l.starts_with(row)),
            "row {row:?} in\n{table}"
        );
    }
    let verdict = table.lines().last().unwrap();
    assert!(verdict.contains("ok    ebpf (tp_btf)"), "{verdict}");
}

#[test]
fn doctor_without_privileges_names_the_poll_fallback_and_why() {
    if !kernel_tests_enabled("doctor_without_privileges_names_the_poll_fallback_and_why") {
        return;
    }
    let out = Command::new(UNPRIVILEGED[0])
        .args(&UNPRIVILEGED[1..])
        .arg(workspace_bin("memwatch"))
        .arg("doctor")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "polling is still a source: {table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("CAP_BPF") && l.contains("not held")),
        "{table}"
    );
    let verdict = table.lines().last().unwrap();
    assert!(verdict.contains("warn  poll"), "{verdict}");
    assert!(verdict.contains("missing capability CAP_BPF"), "{verdict}");
}
