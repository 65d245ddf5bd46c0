//! An OOM storm at the `cargo xtask bench storm` rate (6,000 kills a
//! minute, 12 workers forking hogs into 48 small memory cgroups) while
//! other cgroups are made and removed without pause: afterwards every
//! kill the kernel counted in each cgroup is reported, live or recovered
//! from the counters, and none twice. Root only; never skipped in CI.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use memwatch::EventKind;
use memwatch_test_support::{
    metrics::metric,
    storm::{self, Pace},
};
use memwatch_tests::{agent::Agent, cgroup::TestCgroup, kernel_tests_enabled, kills_reported};

const WORKERS: usize = 12;
const CGROUPS_PER_WORKER: usize = 4;
const PACE: Pace = Pace {
    per_minute: 6_000,
    workers: WORKERS,
    duration: Duration::from_secs(20),
    hog_mib: 64,
};
/// The storm cgroups' hard limit: a hog is killed a few pages in.
const LIMIT: u64 = 4 << 20;
/// How long the agent may take to account for every kill after the storm.
const SETTLE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_storm_amid_cgroup_churn_reports_every_kill_once() {
    const TEST: &str = "an_oom_storm_amid_cgroup_churn_reports_every_kill_once";
    if !kernel_tests_enabled(TEST) {
        return;
    }
    let agent = Agent::start(&[]).await;
    let cgroups: Vec<TestCgroup> = (0..WORKERS * CGROUPS_PER_WORKER)
        .map(|i| {
            let cgroup = TestCgroup::create(&format!("storm-{i}"));
            cgroup.limit(LIMIT);
            cgroup
        })
        .collect();
    let churn = TestCgroup::create("storm-churn");
    let dirs: Vec<PathBuf> = cgroups.iter().map(|c| c.path().to_path_buf()).collect();
    let churn_dir = churn.path().to_path_buf();

    let (children, churned) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let stop = AtomicBool::new(false);
        thread::scope(|scope| {
            let churn = scope.spawn(|| {
                // Bounded: stops with the storm.
                let mut made = 0u64;
                while started.elapsed() < PACE.duration && !stop.load(Ordering::Relaxed) {
                    let child = churn_dir.join(format!("c{}", made % 8));
                    std::fs::create_dir(&child).expect("mkdir a churn cgroup");
                    std::fs::remove_dir(&child).expect("rmdir a churn cgroup");
                    made += 1;
                }
                made
            });
            let workers: Vec<_> = dirs
                .chunks(CGROUPS_PER_WORKER)
                .map(|dirs| {
                    let stop = &stop;
                    scope.spawn(move || storm::worker(dirs, started, PACE, stop))
                })
                .collect();
            let mut children = Vec::new();
            for worker in workers {
                match worker.join().expect("a storm worker panicked") {
                    Ok(made) => children.extend(made),
                    Err(error) => {
                        stop.store(true, Ordering::Relaxed);
                        panic!("a storm worker: {error}");
                    }
                }
            }
            (children, churn.join().expect("the churn thread"))
        })
    })
    .await
    .expect("the storm");

    let killed = children.iter().filter(|c| c.killed).count() as u64;
    let counted: Vec<u64> = cgroups.iter().map(TestCgroup::oom_kills).collect();
    let total: u64 = counted.iter().sum();
    assert!(
        total >= 1_000,
        "a storm: {total} kills counted by the kernel, {killed} children killed"
    );
    assert!(churned > 100, "the cgroups churned: {churned}");

    // Bounded wait until each cgroup's reported kills reach the kernel's count.
    let settle = Instant::now();
    let reported = loop {
        let events = agent.all_events().await;
        let reported: Vec<(u64, u64)> = cgroups
            .iter()
            .map(|c| kills_reported(&events, c.path_str()))
            .collect();
        let done = reported
            .iter()
            .zip(&counted)
            .all(|((live, recovered), kernel)| live + recovered >= *kernel);
        if done || settle.elapsed() > SETTLE {
            break (events, reported);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let took = settle.elapsed();
    let (events, reported) = reported;
    for ((cgroup, (live, recovered)), kernel) in cgroups.iter().zip(&reported).zip(&counted) {
        assert_eq!(
            live + recovered,
            *kernel,
            "{}: {live} live + {recovered} recovered against the kernel's {kernel}; log:\n{}",
            cgroup.path_str(),
            agent.log_text()
        );
    }
    // Never twice: a victim is reported live at most once.
    let ours: BTreeSet<&str> = cgroups.iter().map(TestCgroup::path_str).collect();
    let live_pids: Vec<u32> = events
        .iter()
        .filter(|e| {
            e.body.kind == EventKind::OomKill
                && e.body.recovered != Some(true)
                && e.body.cgroup.as_deref().is_some_and(|c| ours.contains(c))
        })
        .filter_map(|e| e.body.pid)
        .collect();
    let unique: BTreeSet<u32> = live_pids.iter().copied().collect();
    assert_eq!(unique.len(), live_pids.len(), "a victim reported twice");
    let live: u64 = reported.iter().map(|r| r.0).sum();
    let recovered: u64 = reported.iter().map(|r| r.1).sum();
    let (_, metrics) = agent.get("/metrics").await;
    let lost = metric(&metrics, "memwatch_probe_records_lost_total").unwrap_or(0.0);
    println!(
        "storm: {total} kills in {:?} ({killed} children SIGKILLed) amid {churned} cgroups made and \
         removed; {live} reported live, {recovered} recovered from the counters, {lost} ring records lost; \
         all accounted for {took:?} after the storm",
        PACE.duration
    );
}
