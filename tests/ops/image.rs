//! The container image: deploy/docker/build-oci.sh builds an OCI archive
//! with buildah (FROM scratch, no registry, no daemon); the image's root
//! filesystem then runs memwatch by itself (chroot: every library it needs
//! is inside), with the entrypoint, user and port the docs give, and the
//! agent started from it, with the host's /sys and /proc as the DaemonSet
//! mounts them, attaches its probe (`/ready` 200). Root only
//! (buildah, chroot); buildah is installed from Debian when missing; never
//! skipped in CI.

use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use memwatch_test_support::{
    agent::{Agent, Options},
    http::http_get,
};
use memwatch_tests::{kernel_tests_enabled, ops::repo, process::combined_output, workspace_bin};
use serde_json::Value;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        combined_output(&out)
    );
    out
}

fn ensure_buildah() {
    if which::which("buildah").is_ok() {
        return;
    }
    let _one_at_a_time = memwatch_tests::process::install_lock();
    if which::which("buildah").is_ok() {
        return;
    }
    eprintln!("installing buildah (Debian)");
    run(Command::new("apt-get").args(["update", "-qq"]));
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends", "buildah"])
        .env("DEBIAN_FRONTEND", "noninteractive"));
}

/// A blob of the unpacked OCI layout, as JSON.
fn blob(layout: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let text = fs::read_to_string(layout.join("blobs/sha256").join(hex)).expect("blob");
    serde_json::from_str(&text).expect("blob JSON")
}

#[tokio::test]
async fn oci_image_builds_without_a_registry_and_runs_memwatch() {
    if !kernel_tests_enabled("oci_image_builds_without_a_registry_and_runs_memwatch") {
        return;
    }
    ensure_buildah();
    let work = tempfile::tempdir().unwrap();
    // The test build's binary without its debug info (the release image is
    // `cargo xtask image`): what matters here is the packaging.
    let bin = work.path().join("memwatch");
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(workspace_bin("memwatch"))
        .arg(&bin));
    let archive = work.path().join("memwatch.oci.tar");
    run(Command::new(repo().join("deploy/docker/build-oci.sh"))
        .arg(&bin)
        .arg(&archive)
        .arg("0.1.0-test"));

    let layout = work.path().join("layout");
    fs::create_dir(&layout).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout));
    let index: Value =
        serde_json::from_str(&fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "memwatch:0.1.0-test"
    );
    let manifest = blob(&layout, entry["digest"].as_str().unwrap());
    let config = blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/memwatch"])
    );
    assert_eq!(config["config"]["User"], "0:0");
    assert!(config["config"]["ExposedPorts"].get("9750/tcp").is_some());
    // Loopback unless a config with a token says otherwise.
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["run"]));

    let rootfs = work.path().join("rootfs");
    fs::create_dir(&rootfs).unwrap();
    let mut size = 0;
    for layer in manifest["layers"].as_array().unwrap() {
        let hex = layer["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let path = layout.join("blobs/sha256").join(hex);
        size += fs::metadata(&path).unwrap().len();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(&rootfs));
    }
    eprintln!("image layers: {:.1} MiB", size as f64 / (1 << 20) as f64);
    assert!(
        !rootfs.join("bin/sh").exists(),
        "FROM scratch: no shell in the image"
    );
    // Runs inside the image's filesystem alone: nothing from the host.
    let out = run(Command::new("chroot")
        .arg(&rootfs)
        .args(["/usr/local/bin/memwatch", "--version"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "memwatch 0.1.0"
    );
    let out =
        run(Command::new("chroot")
            .arg(&rootfs)
            .args(["/usr/local/bin/memwatch", "run", "--help"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--state-dir"));

    // The agent from the image, as in the pod: the host's /sys and /proc
    // mounted (in a mount namespace of its own, gone when it exits).
    fs::create_dir_all(rootfs.join("var/lib/memwatch")).unwrap();
    for dir in ["proc", "sys"] {
        fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    let root = rootfs.display();
    let mounted_chroot = format!(
        "mount --rbind /sys {root}/sys && mount -t proc proc {root}/proc && \
         exec chroot {root} \"$0\" \"$@\""
    );
    let options = Options {
        wrapper: ["unshare", "--mount", "--propagation", "private", "--"]
            .into_iter()
            .map(String::from)
            .chain(["sh".into(), "-c".into(), mounted_chroot])
            .collect(),
        state_dir: Some("/var/lib/memwatch".into()),
        node_name: Some("image-test".into()),
        log: true,
        ..Options::default()
    };
    // `memwatch run` inside the image, through unshare, sh and chroot, each
    // exec'ing the next: the pid is the agent's.
    let mut agent = Agent::start(Path::new("/usr/local/bin/memwatch"), &options)
        .unwrap_or_else(|e| panic!("the agent from the image never got ready: {e}"));
    let health = http_get(agent.port, "/health").expect("GET /health");
    assert!(health.contains("\"source\":\"ebpf\""), "{health}");
    let code = agent.stop().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        code,
        Some(0),
        "clean exit on SIGTERM:\n{}",
        agent.log_text()
    );
}
