//! Predicted kills (imminent.rs) with the fake `scontrol` and a fake
//! `scancel` (real processes: a paused clock would run out their timeouts
//! at once while they run).

use std::sync::Mutex;

use super::*;
use crate::{model::signal::parse_signal, sinks::action::Actions};

/// Logs `scancel <args>` beside the fake scontrol's calls; a job with a
/// file `gone-<job>` is ending, as scancel says it.
const FAKE_SCANCEL: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "scancel $*" >> "$dir/calls"
for job; do :; done
if [ -f "$dir/gone-$job" ]; then
    echo "scancel: error: Kill job error on job id $job: Job/step already completing or completed" >&2; exit 1
fi
"#;

const TASK: &str = "slurm-42-977-1700000000000";
const SIGNAL: &str = "scancel --signal=10 42";

/// The kill predicted now, as the predictor says it: changed by the test.
type Eta = Arc<Mutex<Option<f64>>>;

/// A sink that signals SIGUSR1 (and drains when `drain`) on a predicted
/// kill, whose worker w1 is healthy, and whose task [`TASK`] is proven in
/// job 42.
async fn imminent_sink(fx: &Fixture, guard: Guard, drain: bool) -> (SlurmSink, Eta) {
    let scancel = fx.dir.path().join("scancel");
    fs::write(&scancel, FAKE_SCANCEL).unwrap();
    fs::set_permissions(&scancel, fs::Permissions::from_mode(0o755)).unwrap();
    let mut sink = fx.sink_seeing(guard, Arc::new(|_| Some(Health::Healthy)));
    sink.config.imminent = ImminentConfig {
        signal: Some(parse_signal("USR1").unwrap()),
        drain,
        scancel: Some(scancel),
    };
    sink.actions = Actions::new(guard, Duration::from_millis(1)).with_predictions(drain);
    let eta: Eta = Arc::new(Mutex::new(Some(16.0)));
    let now = Arc::clone(&eta);
    sink.eta = Arc::new(move |_| *now.lock().unwrap());
    let proofs = fx.proofs();
    proofs
        .check(
            TASK,
            Some("w1"),
            Some(crate::model::process::SeenProcess::now(PID_IN_JOB_42)),
        )
        .await;
    sink.proofs = Some(proofs);
    (sink, eta)
}

fn of_task(fx: &mut Fixture, kind: EventKind, task: &str) -> Event {
    fx.event(kind, "w1", |b| {
        b.task_id = Some(task.into());
        b.eta_seconds = (kind == EventKind::OomImminent).then_some(16.0);
    })
}

fn counted(sink: &SlurmSink, action: &str) -> u64 {
    sink.recorder
        .metrics()
        .scheduler_actions
        .with_label_values(&["slurm-1", action])
        .get()
}

fn reasons(sink: &SlurmSink, kind: EventKind) -> Vec<String> {
    of_kind(sink, kind)
        .into_iter()
        .filter_map(|e| e.body.reason)
        .collect()
}

#[tokio::test]
async fn a_predicted_kill_signals_the_jobs_steps_once_per_episode() {
    let mut fx = Fixture::new();
    let (mut sink, _eta) = imminent_sink(&fx, Guard::default(), false).await;
    // The ETA moved: said again by the predictor, signalled once.
    let batch = [
        of_task(&mut fx, EventKind::OomImminent, TASK),
        of_task(&mut fx, EventKind::OomImminent, TASK),
    ];
    sink.send(&batch).await.unwrap();
    assert_eq!(fx.calls(), [SIGNAL]);
    assert_eq!(counted(&sink, "signal"), 1);

    // Averted: the next prediction is a new episode.
    let averted = of_task(&mut fx, EventKind::OomAverted, TASK);
    let again = of_task(&mut fx, EventKind::OomImminent, TASK);
    sink.send(&[averted, again]).await.unwrap();
    assert_eq!(fx.calls(), [SIGNAL, SIGNAL]);

    // Killed anyway: requeued as before, and the kill ends the episode.
    let kill = of_task(&mut fx, EventKind::OomKill, TASK);
    let after = of_task(&mut fx, EventKind::OomImminent, TASK);
    sink.send(&[kill, after]).await.unwrap();
    let calls = fx.calls();
    assert_eq!(calls[2], "show job 42 -o");
    assert!(calls.contains(&"requeue 42".to_string()), "{calls:?}");
    assert_eq!(calls.last().map(String::as_str), Some(SIGNAL), "{calls:?}");
    assert_eq!(counted(&sink, "signal"), 3);
    assert_eq!(counted(&sink, "requeue"), 1);
    assert!(of_kind(&sink, EventKind::ActionSkipped).is_empty());
}

#[tokio::test]
async fn no_signal_when_the_prediction_is_gone_or_slurm_never_vouched_for_the_job() {
    let mut fx = Fixture::new();
    let (mut sink, eta) = imminent_sink(&fx, Guard::default(), false).await;
    // Replayed after the leak stopped: no kill is predicted now.
    *eta.lock().unwrap() = None;
    let stale = [
        of_task(&mut fx, EventKind::OomImminent, TASK),
        of_task(&mut fx, EventKind::OomImminent, TASK),
    ];
    sink.send(&stale).await.unwrap();
    // Only named after job 7 (a spoofed SLURM_JOB_ID), and no job at all.
    *eta.lock().unwrap() = Some(9.0);
    let named = [
        of_task(&mut fx, EventKind::OomImminent, "slurm-7-1-2"),
        of_task(&mut fx, EventKind::OomImminent, "slurm-7-1-2"),
        of_task(&mut fx, EventKind::OomImminent, "exec-1-2"),
    ];
    sink.send(&named).await.unwrap();
    assert!(fx.calls().is_empty(), "{:?}", fx.calls());
    let skipped = reasons(&sink, EventKind::ActionSkipped);
    assert_eq!(skipped.len(), 2, "each said once: {skipped:?}");
    assert!(
        skipped[0].contains("job 42 not sent SIGUSR1: no OOM kill is predicted"),
        "{skipped:?}"
    );
    assert!(skipped[1].contains("Slurm never said"), "{skipped:?}");
    assert_eq!(counted(&sink, "skipped"), 2);

    // The prediction is present now: job 42 is signalled.
    let present = of_task(&mut fx, EventKind::OomImminent, TASK);
    sink.send(&[present]).await.unwrap();
    assert_eq!(fx.calls(), [SIGNAL]);
}

#[tokio::test]
async fn a_job_already_ending_is_said_once_not_retried() {
    let mut fx = Fixture::new();
    let (mut sink, _eta) = imminent_sink(&fx, Guard::default(), false).await;
    fx.touch("gone-42", "");
    let batch = [
        of_task(&mut fx, EventKind::OomImminent, TASK),
        of_task(&mut fx, EventKind::OomImminent, TASK),
    ];
    // Not an error for the delivery loop: retrying would not help.
    sink.send(&batch).await.unwrap();
    assert_eq!(fx.calls(), [SIGNAL]);
    let refused = reasons(&sink, EventKind::ActionRefused);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("already completing"), "{refused:?}");
    assert_eq!(counted(&sink, "refused"), 1);
    assert_eq!(counted(&sink, "signal"), 0);
}

#[tokio::test]
async fn a_predicted_kill_drains_behind_the_guard_and_its_end_resumes() {
    let mut fx = Fixture::new();
    // Half of the partition must stay open: with n2 drained by an operator,
    // draining n1 would leave 1 of 3.
    let (mut sink, _eta) = imminent_sink(&fx, Guard::default(), true).await;
    let batch = [
        of_task(&mut fx, EventKind::OomImminent, TASK),
        of_task(&mut fx, EventKind::OomImminent, TASK),
    ];
    sink.send(&batch).await.unwrap();
    assert_eq!(fx.calls(), [SIGNAL, "show node -o", "show node -o"]);
    let blocked = reasons(&sink, EventKind::GuardBlocked);
    assert_eq!(blocked.len(), 1, "said once: {blocked:?}");
    assert!(blocked[0].contains("would leave 1 of 3"), "{blocked:?}");
    assert_eq!(counted(&sink, "guard_blocked"), 1);

    // The operator resumed n2: the next look drains n1, naming the kill.
    fs::remove_file(fx.dir.path().join("maint-n2")).unwrap();
    let beat = fx.heartbeat(&[]);
    sink.send(&[beat]).await.unwrap();
    let reason = fs::read_to_string(fx.dir.path().join("drained-n1")).unwrap();
    assert_eq!(
        reason.trim(),
        "memwatch: worker w1: its OOM kill is predicted in 16 s"
    );
    assert_eq!(counted(&sink, "drain"), 1);
    assert_eq!(counted(&sink, "signal"), 1, "one signal in the episode");

    // A heartbeat while the kill is still predicted keeps the drain; the
    // averted episode lets it go.
    let beat = fx.heartbeat(&[]);
    sink.send(&[beat]).await.unwrap();
    assert!(fx.dir.path().join("drained-n1").exists());
    let averted = of_task(&mut fx, EventKind::OomAverted, TASK);
    sink.send(&[averted]).await.unwrap();
    assert!(!fx.dir.path().join("drained-n1").exists());
    assert_eq!(
        fx.calls().last().map(String::as_str),
        Some("update NodeName=n1 State=RESUME")
    );
    assert_eq!(counted(&sink, "resume"), 1);
}
