//! memwatch with a real Dask cluster (scheduler + 2 nanny workers on
//! 127.0.0.1, each worker in a memory cgroup of its own): an unhealthy
//! worker is retired and the work fails over; the cluster guard keeps the
//! last worker; an OOM-killed worker is reported with its Dask address and
//! the job still completes. Root only; never skipped in CI.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use memwatch::{Event, EventKind};
use memwatch_test_support::wait::wait_until_async;
use memwatch_tests::{
    agent::Agent,
    dask::{DaskCluster, python_with_dask},
    kernel_tests_enabled,
};

const MIB: u64 = 1 << 20;
/// Sum of x² for x in 0..100: what the computations must return.
const SQUARES: u64 = 328_350;
/// How much the leak task holds on to, over the cap set 150 MiB above the
/// worker's own memory.
const LEAK_MIB: u64 = 250;

/// Clusters are run one at a time: the machine has two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn setup(test: &str) -> Option<PathBuf> {
    if !kernel_tests_enabled(test) {
        return None;
    }
    python_with_dask(test)
}

/// A soft cap 150 MiB above the larger of the workers' memory at rest.
fn cap_above_rest(cluster: &DaskCluster) -> u64 {
    let rest = cluster
        .workers
        .iter()
        .map(|w| w.cgroup.usage())
        .max()
        .unwrap_or(0);
    rest + 150 * MIB
}

fn config(cluster: &DaskCluster, soft_cap: Option<u64>) -> String {
    config_of(cluster, &[0, 1], soft_cap)
}

/// The agent's config watching the cluster's workers `which` (by index).
fn config_of(cluster: &DaskCluster, which: &[usize], soft_cap: Option<u64>) -> String {
    let mut text = String::from("heartbeat_interval = \"2s\"\nsample_interval = \"200ms\"\n");
    for w in which.iter().map(|i| &cluster.workers[*i]) {
        text.push_str(&format!(
            "[[worker]]\nname = \"{}\"\ncgroup = \"{}\"\nunhealthy_after = \"3s\"\nrecover_after = \"60s\"\n",
            w.name,
            w.cgroup.path_str()
        ));
        if let Some(cap) = soft_cap {
            text.push_str(&format!("soft_cap = {cap}\n"));
        }
    }
    text.push_str(&format!(
        "[[dask]]\nurl = \"{}\"\nmin_remaining = 1\nmin_remaining_fraction = 0.5\nrefresh_interval = \"500ms\"\nretry_initial = \"200ms\"\nretry_max = \"2s\"\n",
        cluster.http_url()
    ));
    text
}

fn of_kind(events: &[Event], kind: EventKind) -> Vec<&Event> {
    events.iter().filter(|e| e.body.kind == kind).collect()
}

#[tokio::test]
async fn dask_unhealthy_worker_is_retired_and_work_fails_over() {
    const TEST: &str = "dask_unhealthy_worker_is_retired_and_work_fails_over";
    let Some(python) = setup(TEST) else { return };
    let _serial = SERIAL.lock().await;
    let cluster = DaskCluster::start(python, &["w1", "w2"], &[None, None]).await;
    let (a1, a2) = (
        cluster.workers[0].address.clone(),
        cluster.workers[1].address.clone(),
    );
    let cap = cap_above_rest(&cluster);
    let leak = LEAK_MIB.to_string();

    // Without memwatch: the leaking worker stays in the cluster, dead weight.
    cluster.client(&["leak", &a1, &leak]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let held = cluster.workers[0].cgroup.usage();
    assert!(held > cap, "the leak did not take w1 over {cap}: {held}");
    assert!(cluster.listed().await.iter().any(|(_, a)| *a == a1));
    println!(
        "without memwatch: w1 holds {} MiB (cap {} MiB) and is still in the cluster after 8 s",
        held / MIB,
        cap / MIB
    );
    cluster.client(&["free", &a1]);
    wait_until_async("w1 frees its leak", Duration::from_secs(20), async || {
        cluster.workers[0].cgroup.usage() < cap
    })
    .await;

    // With memwatch: the same leak gets w1 retired, and work goes to w2.
    let agent = Agent::start_with_config(&config(&cluster, Some(cap))).await;
    let _leak = cluster.client_background(&["leak", &a1, &leak]);
    wait_until_async(
        "the leak crosses the cap",
        Duration::from_secs(60),
        async || cluster.workers[0].cgroup.usage() > cap,
    )
    .await;
    let crossed = Instant::now();
    let retired = wait_until_async("w1 is retired", Duration::from_secs(60), async || {
        !cluster.listed().await.iter().any(|(_, a)| *a == a1)
    })
    .await;
    println!(
        "with memwatch: w1 retired {retired:?} after its leak crossed the soft cap (unhealthy_after = 3s)"
    );
    let events = agent.events(0).await;
    let unhealthy = of_kind(&events, EventKind::WorkerUnhealthy);
    assert_eq!(unhealthy.len(), 1, "{events:#?}");
    assert_eq!(unhealthy[0].body.worker.as_deref(), Some("w1"));
    assert!(
        of_kind(&events, EventKind::GuardBlocked).is_empty(),
        "{events:#?}"
    );
    assert!(crossed.elapsed() >= retired);

    let listed = cluster.listed().await;
    assert_eq!(listed, [("w2".to_string(), a2.clone())], "only w2 is left");
    // Pull model: polling /health gives the same verdicts as the events.
    let (code, health) = agent.get("/health?worker=w1").await;
    assert_eq!(code, 503, "{health}");
    assert!(health.contains("unmanaged memory"), "{health}");
    assert_eq!(agent.get("/health?worker=w2").await.0, 200);
    let answer = cluster.client(&["compute"]);
    assert_eq!(answer["total"], SQUARES, "{answer}");
    assert_eq!(answer["workers"], serde_json::json!([a2]), "{answer}");
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("memwatch_scheduler_actions_total{action=\"retire\",sink=\"dask-1\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn dask_guard_keeps_the_last_worker_when_both_leak() {
    const TEST: &str = "dask_guard_keeps_the_last_worker_when_both_leak";
    let Some(python) = setup(TEST) else { return };
    let _serial = SERIAL.lock().await;
    let cluster = DaskCluster::start(python, &["w1", "w2"], &[None, None]).await;
    let cap = cap_above_rest(&cluster);
    let agent = Agent::start_with_config(&config(&cluster, Some(cap))).await;
    let leak = LEAK_MIB.to_string();
    let _leaks = [
        cluster.client_background(&["leak", &cluster.workers[0].address, &leak]),
        cluster.client_background(&["leak", &cluster.workers[1].address, &leak]),
    ];

    let blocked = agent
        .wait_for_event(Duration::from_secs(90), "guard_blocked", |e| {
            e.body.kind == EventKind::GuardBlocked
        })
        .await;
    let kept = blocked
        .body
        .worker
        .clone()
        .expect("guard_blocked names the worker");
    let kept_at = cluster
        .workers
        .iter()
        .find(|w| w.name == kept)
        .expect("a test worker")
        .address
        .clone();
    assert_eq!(
        blocked.body.scheduler_worker.as_deref(),
        Some(kept_at.as_str())
    );
    let reason = blocked.body.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("cluster guard") && reason.contains("leave 0 of"),
        "{reason}"
    );
    println!("guard_blocked for {kept}: {reason}");

    // Heartbeats retry every 2 s: the guard keeps holding, the cluster keeps running.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let listed = cluster.listed().await;
    assert_eq!(
        listed,
        [(kept.clone(), kept_at.clone())],
        "exactly one retired"
    );
    let answer = cluster.client(&["compute"]);
    assert_eq!(answer["total"], SQUARES, "{answer}");
    let events = agent.events(0).await;
    assert_eq!(
        of_kind(&events, EventKind::WorkerUnhealthy).len(),
        2,
        "{events:#?}"
    );
    assert_eq!(
        of_kind(&events, EventKind::GuardBlocked).len(),
        1,
        "reported once while blocked: {events:#?}"
    );
}

#[tokio::test]
async fn dask_oom_killed_worker_is_reported_with_its_address_and_the_job_completes() {
    const TEST: &str = "dask_oom_killed_worker_is_reported_with_its_address_and_the_job_completes";
    let Some(python) = setup(TEST) else { return };
    let _serial = SERIAL.lock().await;
    let cluster = DaskCluster::start(python, &["w1", "w2"], &[Some(600 * MIB), None]).await;
    let a1 = cluster.workers[0].address.clone();
    let agent = Agent::start_with_config(&config(&cluster, None)).await;
    // The worker map refreshes every 500 ms: let it see both workers.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = Instant::now();
    let answer = cluster.client(&["spike", &a1, "800"]);
    let completed = started.elapsed();
    assert_eq!(answer["spike"], 800, "{answer}");
    assert_eq!(answer["total"], SQUARES, "{answer}");
    let kill = agent
        .wait_for_event(Duration::from_secs(10), "oom_kill of w1", |e| {
            e.body.kind == EventKind::OomKill && e.body.worker.as_deref() == Some("w1")
        })
        .await;
    assert_eq!(
        kill.body.scheduler_worker.as_deref(),
        Some(a1.as_str()),
        "{kill:#?}"
    );
    assert!(
        kill.body
            .cgroup
            .as_deref()
            .is_some_and(|c| c.starts_with(cluster.workers[0].cgroup.path_str())),
        "{kill:#?}"
    );
    // The nanny brought w1 back (a new process, a new address).
    let back = wait_until_async(
        "the nanny restarts w1",
        Duration::from_secs(30),
        async || cluster.address_of("w1").await.is_some_and(|a| a != a1),
    )
    .await;
    println!(
        "OOM kill of {a1} reported as worker w1; the job completed {completed:?} after submission; w1 back (restarted by its nanny) {back:?} later"
    );
}

/// Two hosts (two agents, one worker each) against one Dask cluster whose
/// two workers leak past their caps in the same moment: exactly one is
/// retired, the cluster keeps computing, and the other agent says why its
/// worker stays (`guard_blocked`, or `action_refused` when both asked in
/// the same moment and Dask kept the last worker).
#[tokio::test]
async fn dask_two_hosts_never_retire_every_worker() {
    const TEST: &str = "dask_two_hosts_never_retire_every_worker";
    let Some(python) = setup(TEST) else { return };
    let _serial = SERIAL.lock().await;
    let cluster = DaskCluster::start(python, &["w1", "w2"], &[None, None]).await;
    let cap = cap_above_rest(&cluster);
    let agents = [
        Agent::start_with_config(&config_of(&cluster, &[0], Some(cap))).await,
        Agent::start_with_config(&config_of(&cluster, &[1], Some(cap))).await,
    ];
    let leak = LEAK_MIB.to_string();
    let _leaks = [
        cluster.client_background(&["leak", &cluster.workers[0].address, &leak]),
        cluster.client_background(&["leak", &cluster.workers[1].address, &leak]),
    ];
    let held = |e: &Event| {
        matches!(
            e.body.kind,
            EventKind::GuardBlocked | EventKind::ActionRefused
        )
    };
    let started = Instant::now();
    let mut said = None;
    // The fewest workers the scheduler listed at any look: the floor is 1.
    let mut fewest = usize::MAX;
    while said.is_none() && started.elapsed() < Duration::from_secs(90) {
        fewest = fewest.min(cluster.listed().await.len());
        for (i, agent) in agents.iter().enumerate() {
            if let Some(e) = agent.events(0).await.into_iter().find(|e| held(e)) {
                said = Some((i, e, started.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some((said_by, event, said_after)) = said else {
        panic!(
            "no agent reported why its worker stays; listed now: {:?}\nagent 1:\n{}\nagent 2:\n{}",
            cluster.listed().await,
            agents[0].log_text(),
            agents[1].log_text()
        );
    };
    // When both asked in the same moment Dask kept both (each refused):
    // heartbeats retry every 2 s, each after its own random pause, until
    // one is retired. Then the guard holds the other: one worker stays, and runs.
    let one_left = wait_until_async(
        "one of the two workers retired",
        Duration::from_secs(60),
        async || {
            let listed = cluster.listed().await.len();
            fewest = fewest.min(listed);
            listed == 1
        },
    )
    .await;
    let holding = Instant::now();
    while holding.elapsed() < Duration::from_secs(6) {
        fewest = fewest.min(cluster.listed().await.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fewest, 1, "the cluster never went below its floor of 1");
    let listed = cluster.listed().await;
    assert_eq!(listed.len(), 1, "exactly one retired: {listed:?}");
    let kept = &listed[0].0;
    let kept_by = cluster
        .workers
        .iter()
        .position(|w| &w.name == kept)
        .expect("a test worker");
    let why = agents[kept_by]
        .events(0)
        .await
        .into_iter()
        .find(|e| held(e));
    assert!(
        why.is_some(),
        "the agent of the kept worker {kept} says why it stays\n{}",
        agents[kept_by].log_text()
    );
    let answer = cluster.client(&["compute"]);
    assert_eq!(answer["total"], SQUARES, "{answer}");
    println!(
        "two hosts, both workers leaking: {kept} kept; fewest listed: {fewest}; first said {said_after:?} by agent {}: {} {}; one left {:?} after that",
        said_by + 1,
        event.body.kind.as_str(),
        event.body.reason.unwrap_or_default(),
        one_left
    );
}

/// Results kept on w1 by the job of [`predicted_kill_job`].
const PARTS: usize = 20;
/// Headroom left above w1's memory at rest, and how far (and how fast) the
/// job's growing task goes: past the limit, in 15 s.
const HEADROOM_MIB: u64 = 240;
const GROW_MIB: u64 = 400;
const GROW_RATE_MIB: u64 = 16;

/// What one run of the job did: its time, how many times its results were
/// computed, and the agent's events.
struct JobRun {
    seconds: f64,
    computed: usize,
    events: Vec<Event>,
    w1_listed: bool,
}

/// A fresh cluster whose w1 gets a hard limit [`HEADROOM_MIB`] above its
/// memory at rest, an agent (`retire_imminent` as given), and the job: 20
/// results computed and kept on w1, then a task on w1 that grows past its
/// limit; the job sums the results once that task is done.
async fn predicted_kill_job(python: PathBuf, retire_imminent: bool) -> JobRun {
    let cluster = DaskCluster::start(python, &["w1", "w2"], &[None, None]).await;
    let w1 = &cluster.workers[0];
    w1.cgroup.limit(w1.cgroup.usage() + HEADROOM_MIB * MIB);
    let config = config(&cluster, None).replace(
        "[[dask]]\n",
        &format!("[[dask]]\nretire_imminent = {retire_imminent}\n"),
    );
    let agent = Agent::start_with_config(&config).await;
    // The worker map refreshes every 500 ms: let it see both workers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runs = dir.path().join("runs");
    let answer = cluster.client(&[
        "job",
        &w1.address,
        &PARTS.to_string(),
        "0.25",
        &GROW_MIB.to_string(),
        &GROW_RATE_MIB.to_string(),
        &runs.to_string_lossy(),
    ]);
    assert_eq!(
        answer["total"],
        PARTS * (PARTS - 1) / 2,
        "the job's sum: {answer}"
    );
    let computed = std::fs::read_to_string(&runs)
        .expect("the runs file")
        .lines()
        .count();
    let w1_listed = cluster.listed().await.iter().any(|(n, _)| n == "w1");
    JobRun {
        seconds: answer["seconds"].as_f64().expect("the job's seconds"),
        computed,
        events: agent.events(0).await,
        w1_listed,
    }
}

/// Issue 24's end-to-end proof on a real Dask cluster: a worker whose
/// memory grows toward its cgroup limit is retired before the kill (its
/// OOM kill predicted), so the results it holds move to the other worker
/// and survive; the same job with `retire_imminent = false` loses them to
/// the kill and computes them again. Both jobs' times are printed.
#[tokio::test]
async fn dask_worker_whose_kill_is_predicted_is_retired_and_its_results_survive() {
    const TEST: &str = "dask_worker_whose_kill_is_predicted_is_retired_and_its_results_survive";
    let Some(python) = setup(TEST) else { return };
    let _serial = SERIAL.lock().await;
    let w1 = |e: &&Event| e.body.worker.as_deref() == Some("w1");

    let without = predicted_kill_job(python.clone(), false).await;
    let kills: Vec<_> = of_kind(&without.events, EventKind::OomKill)
        .into_iter()
        .filter(w1)
        .collect();
    assert!(
        !kills.is_empty(),
        "no kill without prediction: {:#?}",
        without.events
    );
    // Those computed on w1 are computed again (a few may have been stolen
    // by the idle w2 before the kill and survive).
    assert!(
        without.computed > PARTS,
        "the kill lost w1's results, yet they were computed {} times for {PARTS}",
        without.computed
    );

    let with = predicted_kill_job(python, true).await;
    let imminent: Vec<_> = of_kind(&with.events, EventKind::OomImminent)
        .into_iter()
        .filter(w1)
        .collect();
    assert!(
        !imminent.is_empty(),
        "no oom_imminent for w1: {:#?}",
        with.events
    );
    assert!(
        !of_kind(&with.events, EventKind::OomKill).iter().any(w1),
        "w1 was killed all the same: {:#?}",
        with.events
    );
    assert!(!with.w1_listed, "w1 was not retired");
    assert_eq!(
        with.computed, PARTS,
        "w1's results were computed again after its retirement"
    );
    println!(
        "the job (20 results on w1, then a task growing past w1's limit): \
         without prediction {:.1} s, w1 OOM-killed, results computed {} times; \
         with prediction {:.1} s, w1 retired after oom_imminent (ETA {:?} s), \
         no kill, results computed {} times",
        without.seconds,
        without.computed,
        with.seconds,
        imminent[0].body.eta_seconds,
        with.computed
    );
}
