//! docs/kernels.md, written by `cargo xtask vm-test` from what ran: each
//! kernel's `memwatch doctor --json` (captured where the tests ran) and
//! its test counts. Nothing in it is typed by hand.

use serde_json::Value;

use crate::vm::Outcome;

// Long, on purpose: the text of docs/kernels.md, top to bottom.
pub(crate) fn render(outcomes: &[Outcome], accel: &str) -> String {
    let mut out = String::from(
        "# Kernels memwatch is tested on\n\
         \n\
         <!-- Written by `cargo xtask vm-test`; do not edit by hand. -->\n\
         \n\
         Each row is one kernel of the last `cargo xtask vm-test` run: Debian's own\n\
         kernel packages booted in QEMU with pure cgroup v2 (the memory controller\n\
         enabled at the root), and this host's kernel (`host`) with its own cgroups.\n\
         The feature columns are `memwatch doctor --json` as it ran there; the last\n\
         column is the kernel tests (tests/kernel: OOM kills with a hard limit,\n\
         nested limit attribution, `memory.high`/soft caps, kernel growth figures\n\
         within 5% of the cgroup's counter, the polling fallback) run there.\n\
         \n\
         | kernel | package | cgroup | BTF | tp_btf | OOM hook | cgroup hooks | growth source | OOM source | source | boot s | test s | tests |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let doctor = o.doctor.as_ref();
        let get = |key: &str| -> String {
            doctor
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let row = |name: &str| -> Option<(String, String)> {
            doctor?
                .get("rows")?
                .as_array()?
                .iter()
                .find(|r| r["name"] == name)
                .map(|r| {
                    (
                        r["state"].as_str().unwrap_or("?").to_string(),
                        r["detail"].as_str().unwrap_or("").to_string(),
                    )
                })
        };
        let btf = row("BTF").map_or("?".into(), |(state, _)| yes_no(&state));
        let cgroup = row("memory controller").map_or("?".into(), |(_, detail)| {
            detail.split_whitespace().nth(1).unwrap_or("?").to_string()
        });
        let hooks = doctor
            .and_then(|d| d.get("hooks"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let hook = |role: &str| -> String {
            let found: Vec<String> = hooks
                .iter()
                .filter(|h| h["role"] == role)
                .map(|h| {
                    format!(
                        "`{}` ({})",
                        h["tracepoint"].as_str().unwrap_or("?"),
                        h["attach"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            if found.is_empty() {
                "-".into()
            } else {
                found.join(" + ")
            }
        };
        let tp_btf = if hooks.is_empty() {
            "?".to_string()
        } else if hooks.iter().all(|h| h["attach"] == "tp_btf") {
            "yes".to_string()
        } else {
            "partly".to_string()
        };
        let boot = o
            .boot
            .map_or_else(|| "-".to_string(), |b| format!("{:.1}", b.as_secs_f64()));
        let tests = if o.ok() {
            format!("{} passed", o.passed)
        } else {
            format!(
                "**FAILED**: {} passed, {} failed{}",
                o.passed,
                o.failed,
                o.problem
                    .as_deref()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            )
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |\n",
            if o.release.is_empty() {
                &o.spec
            } else {
                &o.release
            },
            o.package,
            cgroup,
            btf,
            tp_btf,
            hook("oom"),
            hook("cgroup"),
            get("growth"),
            get("oom"),
            get("source"),
            boot,
            o.tests.as_secs_f64(),
            tests,
        ));
    }
    out.push_str(&format!(
        "\nVMs: {accel}, 2 vCPUs, 2 GiB, kernel command line `console=ttyS0 panic=-1 \
         loglevel=4 cgroup_no_v1=all`. Boot time is QEMU start to the init script's first\n\
         line; test time is the rest (the kernel test binaries and the doctor).\n\
         Under TCG the tests' latency bounds (tens of milliseconds) are multiplied by\n\
         `MEMWATCH_TEST_TIME_SCALE` (4): emulated user space runs some ten times slower.\n\
         Run it with `cargo xtask vm-test` (all of the above) or\n\
         `cargo xtask vm-test --kernel 6.1 --kernel host`; see the README.\n"
    ));
    out
}

fn yes_no(state: &str) -> String {
    match state {
        "ok" => "yes".into(),
        "fail" => "no".into(),
        other => other.into(),
    }
}
