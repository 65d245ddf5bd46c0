//! Kernel tests of what the kernel says of memory pressure: a worker held
//! at its limit in `memory.events` and PSI, the pressure rule, the PSI
//! trigger that wakes the sampler, and the NPD plugin mode reporting an
//! unhealthy worker. Real cgroups, real memory, the real agent. Root only;
//! never skipped in CI.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use memwatch::EventKind;
use memwatch_test_support::metrics::metric;
use memwatch_tests::{
    agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, memhog_in, process::Guarded,
    time_scale, workspace_bin,
};

const MIB: u64 = 1 << 20;

/// The value of `series` in the agent's `/metrics` once it is above 0,
/// polled until `timeout`; `None` if it never was.
async fn positive_metric(agent: &Agent, series: &str, timeout: Duration) -> Option<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let (_, text) = agent.get("/metrics").await;
        if let Some(value) = metric(&text, series).filter(|v| *v > 0.0) {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker held at its memory limit, as the kernel says it: on cgroup v2
/// (the kernel matrix's VMs) throttled at `memory.high`, it says
/// `memory_high_throttled`, its `memory.events` and PSI are metrics, and
/// the pressure rule (PSI `some avg10` over `pressure_limit`) turns it
/// unhealthy, end to end; on v1 (this host) the `memory.failcnt` of a
/// hard limit is its `max` count, and only the host's PSI exists.
#[tokio::test]
async fn a_worker_held_at_its_limit_shows_in_memory_events_and_pressure() {
    if !kernel_tests_enabled("a_worker_held_at_its_limit_shows_in_memory_events_and_pressure") {
        return;
    }
    let scale = time_scale();
    let worker = TestCgroup::create("held");
    let v2 = worker.path().join("memory.high").exists();
    if v2 {
        std::fs::write(worker.path().join("memory.high"), (32 * MIB).to_string())
            .expect("memory.high");
    } else {
        // The memory limit alone: with memory+swap limited as well, a
        // refused charge fails on that counter first, and this kernel
        // (6.x) counts no failcnt for it.
        std::fs::write(
            worker.path().join("memory.limit_in_bytes"),
            (32 * MIB).to_string(),
        )
        .expect("memory.limit_in_bytes");
    }
    // The soft cap far away: only the kernel's figures speak here.
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"100ms\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n\
         soft_cap = \"1GiB\"\npressure_limit = 0.01\npressure_after = \"1s\"\n",
        worker.path_str()
    ))
    .await;
    // Wants more than the limit: throttled for as long as it runs (v2), or
    // refused and OOM-killed (v1).
    let _hog = Guarded(
        memhog_in(worker.path(), 64, 120)
            .spawn()
            .expect("spawn memhog"),
    );
    let wait = Duration::from_secs_f64(30.0 * scale);
    if v2 {
        let throttled = agent
            .wait_for_event(wait, "memory_high_throttled", |e| {
                e.body.kind == EventKind::MemoryHighThrottled
                    && e.body.worker.as_deref() == Some("w1")
            })
            .await;
        assert!(throttled.body.count.unwrap_or(0) > 0, "{throttled:?}");
        let high = positive_metric(
            &agent,
            "memwatch_memory_events_total{event=\"high\",worker=\"w1\"}",
            wait,
        )
        .await;
        assert!(high.is_some(), "memory.events high as a metric");
        let stalled = positive_metric(
            &agent,
            "memwatch_memory_pressure_stall_seconds_total{kind=\"some\",scope=\"worker\",worker=\"w1\"}",
            wait,
        )
        .await;
        assert!(stalled.is_some(), "the worker's PSI total as a metric");
        let unhealthy = agent
            .wait_for_event(
                Duration::from_secs_f64(60.0 * scale),
                "worker_unhealthy",
                |e| {
                    e.body.kind == EventKind::WorkerUnhealthy
                        && e.body.worker.as_deref() == Some("w1")
                },
            )
            .await;
        let reason = unhealthy.body.reason.clone().unwrap_or_default();
        assert!(reason.contains("memory pressure"), "{unhealthy:?}");
        let (code, health) = agent.get("/health?worker=w1").await;
        assert_eq!(code, 503, "{health}");
        println!(
            "v2: throttled at memory.high (count {:?}), {} s stalled, unhealthy by PSI: {reason}",
            throttled.body.count,
            stalled.unwrap_or(0.0)
        );
    } else {
        let failed = positive_metric(
            &agent,
            "memwatch_memory_events_total{event=\"max\",worker=\"w1\"}",
            wait,
        )
        .await;
        let (_, text) = agent.get("/metrics").await;
        assert!(
            failed.is_some(),
            "v1 memory.failcnt as the max count: {}\nlog:\n{}",
            text.lines()
                .filter(|l| l.starts_with("memwatch_memory_"))
                .collect::<Vec<_>>()
                .join("\n"),
            agent.log_text()
        );
        assert!(
            !text.contains("memwatch_memory_pressure_ratio{kind=\"some\",scope=\"worker\""),
            "no per-cgroup PSI on v1"
        );
        let host_psi = std::fs::read_to_string("/proc/pressure/memory").is_ok();
        if host_psi {
            assert!(
                metric(
                    &text,
                    "memwatch_memory_pressure_ratio{kind=\"some\",scope=\"host\",window=\"10s\",worker=\"\"}"
                )
                .is_some(),
                "the host's PSI as a metric: {text}"
            );
        }
        println!("v1: failcnt {failed:?} as memory events max; host PSI shown: {host_psi}");
    }
}

/// `memwatch status --npd` run as node-problem-detector runs a custom
/// plugin (deploy/npd/memwatch-monitor.json): its args, its timeout, its
/// output limit; exit 0 while no worker is unhealthy, 1 once one is, with
/// the reason on one line within `max_output_length`, 2 when the agent is
/// gone.
#[tokio::test]
async fn npd_plugin_mode_reports_an_unhealthy_worker_within_npds_limits() {
    if !kernel_tests_enabled("npd_plugin_mode_reports_an_unhealthy_worker_within_npds_limits") {
        return;
    }
    // Built in: the kernel matrix's VMs hold the test binaries, not the tree.
    let monitor: serde_json::Value =
        serde_json::from_str(include_str!("../../deploy/npd/memwatch-monitor.json"))
            .expect("NPD config JSON");
    let rule = &monitor["rules"][0];
    assert_eq!(rule["condition"], monitor["conditions"][0]["type"]);
    let max = monitor["pluginConfig"]["max_output_length"]
        .as_u64()
        .unwrap() as usize;
    let args: Vec<String> = rule["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    // As NPD invokes it, the socket path swapped for this agent's.
    let at = args.iter().position(|a| a == "--socket").unwrap();
    let worker = TestCgroup::create("npd");
    let mut agent = Agent::start_with_config(&format!(
        "sample_interval = \"100ms\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\nsoft_cap = \"40MiB\"\n\
         unhealthy_after = \"1s\"\nrecover_after = \"1s\"\n",
        worker.path_str()
    ))
    .await;
    let mut invoke_args = args.clone();
    invoke_args[at + 1] = agent.socket().to_str().unwrap().to_string();
    let plugin = || {
        let out = memwatch_tests::process::run_bounded(
            "memwatch status --npd",
            Command::new(workspace_bin("memwatch")).args(&invoke_args),
            Duration::from_secs(10),
        );
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(line.lines().count(), 1, "one line: {line:?}");
        assert!(line.trim_end().len() <= max, "{} bytes: {line}", line.len());
        (out.status.code(), line.trim_end().to_string())
    };
    assert_eq!(plugin(), (Some(0), "memwatch: healthy".to_string()));

    let _hog = worker.hog(80);
    agent
        .wait_for_event(Duration::from_secs(20), "worker_unhealthy", |e| {
            e.body.kind == EventKind::WorkerUnhealthy && e.body.worker.as_deref() == Some("w1")
        })
        .await;
    let (code, unhealthy) = plugin();
    assert_eq!(code, Some(1), "{unhealthy}");
    assert!(unhealthy.starts_with("memwatch unhealthy: "), "{unhealthy}");
    assert!(unhealthy.contains("w1"), "{unhealthy}");

    let _ = agent.stop();
    let (code, gone) = plugin();
    assert_eq!(code, Some(2), "{gone}");
    assert!(gone.starts_with("memwatch unreachable"), "{gone}");
    println!("NPD plugin: healthy → 0; unhealthy → 1 {unhealthy:?}; agent gone → 2 {gone:?}");
}

/// PSI triggers wake the sampler between its ticks: with sampling every
/// 10 minutes, a worker held at `memory.high` (v2) still turns unhealthy by
/// the pressure rule within seconds, as the kernel's trigger on its
/// `memory.pressure` asks for each sample. On v1 (no per-cgroup PSI) the
/// agent says the worker is read on the tick.
#[tokio::test]
async fn a_psi_trigger_wakes_the_sampler_between_ticks() {
    if !kernel_tests_enabled("a_psi_trigger_wakes_the_sampler_between_ticks") {
        return;
    }
    let worker = TestCgroup::create("psi-trigger");
    let v2 = worker.path().join("memory.high").exists();
    let agent = Agent::start_with_config(&format!(
        "sample_interval = \"600s\"\n[[worker]]\nname = \"w1\"\ncgroup = \"{}\"\n\
         soft_cap = \"1GiB\"\npressure_limit = 0.01\npressure_after = \"1s\"\n",
        worker.path_str()
    ))
    .await;
    // The agent logs either line as the sampler starts; its log is read
    // as it comes, so wait (bounded) for one.
    let deadline = Instant::now() + Duration::from_secs_f64(10.0 * time_scale());
    let armed = loop {
        let log = agent.log_text();
        if log.contains("PSI trigger armed") {
            break true;
        }
        if log.contains("PSI trigger unavailable") {
            break false;
        }
        assert!(Instant::now() < deadline, "no PSI trigger line:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if !v2 {
        assert!(!armed, "no per-cgroup PSI on v1:\n{}", agent.log_text());
        println!("v1: no per-cgroup PSI; the worker is read on the tick (logged)");
        return;
    }
    assert!(
        armed,
        "a writable v2 cgroup takes a trigger:\n{}",
        agent.log_text()
    );
    std::fs::write(worker.path().join("memory.high"), (32 * MIB).to_string()).expect("memory.high");
    let started = Instant::now();
    let _hog = Guarded(
        memhog_in(worker.path(), 64, 120)
            .spawn()
            .expect("spawn memhog"),
    );
    // Far below the 600 s tick, even scaled for an emulated VM.
    let unhealthy = agent
        .wait_for_event(
            Duration::from_secs_f64(30.0 * time_scale()),
            "worker_unhealthy",
            |e| e.body.kind == EventKind::WorkerUnhealthy && e.body.worker.as_deref() == Some("w1"),
        )
        .await;
    let reason = unhealthy.body.reason.clone().unwrap_or_default();
    assert!(reason.contains("memory pressure"), "{unhealthy:?}");
    println!(
        "v2: unhealthy by PSI {:?} after the stall began, with the sampler ticking every 600 s: {reason}",
        started.elapsed()
    );
}
