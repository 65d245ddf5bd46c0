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

use memwatch_tests::{agent::free_port, kernel_tests_enabled, ops::repo, workspace_bin};
use serde_json::Value;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ensure_buildah() {
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
    let port = free_port();
    let root = rootfs.display();
    let log = work.path().join("agent.log");
    let mut agent = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount --rbind /sys {root}/sys && mount -t proc proc {root}/proc && \
             exec chroot {root} /usr/local/bin/memwatch run --listen 127.0.0.1:{port} \
             --state-dir /var/lib/memwatch --node-name image-test"
        ))
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("unshare (util-linux)");
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let ready = loop {
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{port}/ready"))
            .send()
            .await
            && r.status().as_u16() == 200
        {
            break true;
        }
        if std::time::Instant::now() > deadline || agent.try_wait().unwrap().is_some() {
            break false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let health = match ready {
        true => client
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        false => String::new(),
    };
    // SAFETY: kill(2) on our own child (exec'd into the agent).
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let status = agent.wait().unwrap();
    let log = fs::read_to_string(&log).unwrap_or_default();
    assert!(ready, "the agent from the image never got ready:\n{log}");
    assert!(health.contains("\"source\":\"ebpf\""), "{health}");
    assert_eq!(status.code(), Some(0), "clean exit on SIGTERM:\n{log}");
}
