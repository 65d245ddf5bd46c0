//! Helpers for the packaging tests: the repository's files, and the Python
//! tools that validate manifests offline (installed from PyPI when missing).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::process::combined_output;

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// A file of the repository, as text.
pub fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Pinned: kubernetes-validate ships the Kubernetes JSON schemas (offline);
/// helm-python-sdk ships Helm's Go SDK as a library (render and lint, no
/// helm binary, no network); cel-python evaluates CEL (the admission
/// policy's, deploy/check/admission_policy.py).
pub const PYTHON_TOOLS: [&str; 3] = [
    "kubernetes-validate==1.37.0",
    "helm-python-sdk==0.2.2",
    "cel-python==0.5.0",
];

/// Makes sure the validation tools import, installing them with pip when
/// they do not. Never a skip: a test that needs them fails when they cannot
/// be had.
pub fn python_tools() {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        let imports = || {
            Command::new("python3")
                .args(["-c", "import kubernetes_validate, helm_python, yaml, celpy"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if imports() {
            return;
        }
        // Other test binaries may be installing them too: wait, look again.
        let _one_at_a_time = crate::process::install_lock();
        if imports() {
            return;
        }
        eprintln!("installing {PYTHON_TOOLS:?} with pip");
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PYTHON_TOOLS)
            .output()
            .expect("python3 -m pip (python3 is needed to validate manifests)");
        assert!(
            out.status.success() && imports(),
            "cannot install {PYTHON_TOOLS:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// `kubernetes-validate --strict` on `files`: (success, combined output).
pub fn kubernetes_validate(files: &[PathBuf]) -> (bool, String) {
    python_tools();
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(files)
        .output()
        .expect("run kubernetes-validate");
    (out.status.success(), combined_output(&out))
}

/// Renders and lints the Helm chart into `out` (manifests.yaml,
/// manifests.json, memwatch.toml), with render_chart.py's `options`
/// (`--api-versions ...`, `--cluster SECRETS.json`): (success, combined
/// output).
pub fn try_render_chart_with(
    out: &Path,
    values: Option<&Path>,
    options: &[&str],
) -> (bool, String) {
    python_tools();
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("deploy/check/render_chart.py"))
        .args(options)
        .arg(repo().join("deploy/helm/memwatch"))
        .arg(out);
    if let Some(values) = values {
        cmd.arg(values);
    }
    let result = cmd.output().expect("run render_chart.py");
    (result.status.success(), combined_output(&result))
}

/// [`try_render_chart_with`] offline, as `helm template` renders.
pub fn try_render_chart(out: &Path, values: Option<&Path>) -> (bool, String) {
    try_render_chart_with(out, values, &[])
}

/// Renders the Helm chart into `out` (manifests.yaml, manifests.json,
/// memwatch.toml); lint or render errors fail the test.
pub fn render_chart(out: &Path, values: Option<&Path>) {
    render_chart_with(out, values, &[]);
}

/// [`render_chart`] with render_chart.py's `options`.
pub fn render_chart_with(out: &Path, values: Option<&Path>, options: &[&str]) {
    let (ok, output) = try_render_chart_with(out, values, options);
    assert!(ok, "helm render/lint failed:\n{output}");
}

/// The capabilities the docs claim the agent needs, as written in the
/// systemd unit's `AmbientCapabilities=` (`CAP_BPF`, `CAP_PERFMON`).
pub fn documented_capabilities() -> Vec<String> {
    let unit = read("deploy/systemd/memwatch.service");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities= in memwatch.service");
    line.split_whitespace().map(str::to_string).collect()
}

/// Each case's verdict under the admission policy in `policy`
/// (`deploy/check/admission_policy.py`, cel-python): `{name, matched,
/// allowed, message}` per case, in order.
pub fn admission_policy(policy: &Path, cases: &[serde_json::Value]) -> Vec<serde_json::Value> {
    python_tools();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("cases.json");
    std::fs::write(&path, serde_json::to_string(cases).expect("cases as JSON"))
        .expect("write the cases");
    let out = Command::new("python3")
        .arg(repo().join("deploy/check/admission_policy.py"))
        .arg(policy)
        .arg(&path)
        .output()
        .expect("python3 admission_policy.py");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("admission_policy.py prints JSON")
}
