//! `oom_imminent` / `oom_averted` through the watchdog, on a paused clock.

use tokio::time::advance;

use super::*;
use crate::model::spec::PredictSettings;
use crate::watchdog::predict::{LimitFields, WINDOW};
use crate::{
    model::spec::{MemorySource, PredictRule, Settings, WorkerSpec},
    watchdog::policy::{Sample, Watchdog},
};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 256 * MIB;
const TICK: Duration = Duration::from_millis(100);

fn watchdog(rule: Option<PredictRule>) -> Watchdog {
    let mut settings = Settings::default();
    if let Some(rule) = rule {
        settings.predict.workers.insert("w1".into(), rule);
    }
    let spec = WorkerSpec {
        name: "w1".into(),
        source: MemorySource::Cgroup("/sys/fs/cgroup/memory/w1".into()),
        soft_cap: None,
        unhealthy_after: Duration::from_secs(60),
        recover_after: Duration::from_secs(30),
        pressure: None,
    };
    Watchdog::new(vec![spec], settings)
}

fn reading(bytes: u64) -> Sample {
    Sample {
        readings: vec![Reading {
            cgroup: Path::new("/sys/fs/cgroup/memory/w1").into(),
            worker: "w1".into(),
            task_id: Some("t1".into()),
            unreclaimable: bytes,
            limits: vec![Limit {
                owner: LimitOwner::Own,
                bytes: LIMIT,
                used: bytes,
            }],
            high: None,
        }],
        ..Sample::default()
    }
}

/// Feeds `shape(t)` every [`TICK`] for `secs`; every event with its time.
async fn feed(w: &mut Watchdog, secs: f64, shape: impl Fn(f64) -> u64) -> Vec<(f64, EventBody)> {
    let start = Instant::now();
    let mut events = Vec::new();
    while Instant::now().duration_since(start).as_secs_f64() <= secs {
        let t = Instant::now().duration_since(start).as_secs_f64();
        for e in w.observe(&reading(shape(t)), Instant::now()) {
            events.push((t, e));
        }
        advance(TICK).await;
    }
    events
}

fn of(events: &[(f64, EventBody)], kind: EventKind) -> Vec<(f64, EventBody)> {
    events
        .iter()
        .filter(|(_, e)| e.kind == kind)
        .cloned()
        .collect()
}

/// 10 MiB/s from 16 MiB: the limit is reached at t = 24 s.
fn leak(t: f64) -> u64 {
    16 * MIB + (10.0 * MIB as f64 * t) as u64
}

#[tokio::test(start_paused = true)]
async fn a_steady_leak_is_said_once_with_its_eta_and_the_kill_measures_it() {
    let mut w = watchdog(None);
    let start = Instant::now();
    let events = feed(&mut w, 20.0, leak).await;
    let imminent = of(&events, EventKind::OomImminent);
    assert_eq!(imminent.len(), 1, "steady: said once, {imminent:?}");
    let (t, e) = &imminent[0];
    let eta = e.eta_seconds.unwrap();
    assert!(
        (eta - (24.0 - t)).abs() <= 0.2 * (24.0 - t),
        "eta {eta} at {t}"
    );
    assert_eq!(e.task_id.as_deref(), Some("t1"));
    assert_eq!(e.worker.as_deref(), Some("w1"));
    assert_eq!(e.limit_bytes, Some(LIMIT));
    assert_eq!(e.limit_cgroup.as_deref(), Some("/sys/fs/cgroup/memory/w1"));
    assert_eq!(e.constraint, Some(OomConstraint::Cgroup));
    assert_eq!(e.throttled, Some(false));
    let rate = e.growth_bytes_per_sec.unwrap() as f64 / (10 * MIB) as f64;
    assert!((rate - 1.0).abs() < 0.2, "rate {rate}");
    assert!(e.confidence.unwrap() >= 0.5);
    assert!(of(&events, EventKind::OomAverted).is_empty());

    // The kill comes at the limit: lead from the first warning, small error.
    let kill = start + Duration::from_secs(24);
    advance(kill.duration_since(Instant::now())).await;
    let report = w
        .predicted_kill(Path::new("/sys/fs/cgroup/memory/w1"), Instant::now())
        .expect("it was predicted");
    assert!((report.lead.as_secs_f64() - (24.0 - t)).abs() < 0.2);
    assert!(report.eta_error_seconds.abs() <= 0.2 * (24.0 - t));
    assert_eq!(
        w.predicted_kill(Path::new("/sys/fs/cgroup/memory/w1"), Instant::now()),
        None,
        "the episode ended with the kill"
    );
}

#[tokio::test(start_paused = true)]
async fn growth_that_stops_is_averted_once_after_the_hold() {
    let mut w = watchdog(None);
    // The leak stops at 12 s, 136 MiB: nothing more, for a minute.
    let events = feed(&mut w, 72.0, |t| leak(t.min(12.0))).await;
    let imminent = of(&events, EventKind::OomImminent);
    let averted = of(&events, EventKind::OomAverted);
    assert!(imminent[0].0 <= 12.0, "{imminent:?}");
    // Until the trend sees the plateau (a few seconds), the ETA recedes:
    // said again at most once, later, never sooner.
    assert!(imminent.len() <= 2, "{imminent:?}");
    if let [(t0, first), (t1, again)] = &imminent[..] {
        assert!(again.eta_seconds.unwrap() > first.eta_seconds.unwrap() - (t1 - t0));
    }
    assert_eq!(averted.len(), 1, "{averted:?}");
    let at = averted[0].0;
    assert!(at >= 12.0 + AVERT_HOLD.as_secs_f64(), "averted at {at}");
    // The trend sees a plateau within half its window, then the hold.
    let bound = 12.0 + WINDOW.as_secs_f64() / 2.0 + AVERT_HOLD.as_secs_f64();
    assert!(at <= bound, "averted at {at}, after {bound}");
    assert_eq!(averted[0].1.task_id.as_deref(), Some("t1"));
    assert_eq!(
        w.predicted_kill(Path::new("/sys/fs/cgroup/memory/w1"), Instant::now()),
        None,
        "after oom_averted a kill was not predicted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_material_change_of_eta_is_said_again() {
    let mut w = watchdog(None);
    // 2 MiB/s, then 20 MiB/s from 10 s: the kill comes much sooner.
    let shape = |t: f64| {
        let slow = 100 * MIB + (2.0 * MIB as f64 * t.min(10.0)) as u64;
        slow + (20.0 * MIB as f64 * (t - 10.0).max(0.0)) as u64
    };
    let events = feed(&mut w, 15.0, shape).await;
    let imminent = of(&events, EventKind::OomImminent);
    assert!(imminent.len() >= 2, "{imminent:?}");
    let first = imminent[0].1.eta_seconds.unwrap();
    let last = imminent.last().unwrap().1.eta_seconds.unwrap();
    assert!(last < first * 0.5, "first {first} last {last}");
    assert!(
        imminent.len() <= 8,
        "said on every move: {}",
        imminent.len()
    );
}

#[tokio::test(start_paused = true)]
async fn beyond_the_horizon_or_switched_off_nothing_is_said() {
    let short = PredictRule {
        enabled: true,
        horizon: Duration::from_secs(3),
    };
    let mut w = watchdog(Some(short));
    let events = feed(&mut w, 20.0, leak).await;
    let imminent = of(&events, EventKind::OomImminent);
    assert!(
        imminent.iter().all(|(t, _)| *t >= 24.0 - 3.0 - 1.0),
        "said beyond a 3 s horizon: {imminent:?}"
    );

    let off = PredictRule {
        enabled: false,
        ..PredictRule::default()
    };
    let mut w = watchdog(Some(off));
    let events = feed(&mut w, 23.0, leak).await;
    assert!(of(&events, EventKind::OomImminent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn followed_cgroups_are_bounded_and_forgotten() {
    let mut p = Predictions::default();
    let read = |i: usize| Reading {
        cgroup: PathBuf::from(format!("/c{i}")).into(),
        worker: "w".into(),
        task_id: None,
        unreclaimable: 1,
        limits: Vec::new(),
        high: None,
    };
    let readings: Vec<_> = (0..MAX_CGROUPS + 5).map(read).collect();
    p.observe(&readings, Instant::now());
    assert_eq!(p.cgroups.len(), MAX_CGROUPS);
    advance(FORGET_AFTER).await;
    p.observe(&[read(0)], Instant::now());
    assert_eq!(p.cgroups.len(), 1, "unread for FORGET_AFTER: forgotten");
}

#[test]
fn the_limit_shown_is_the_one_with_least_headroom_even_with_prediction_off() {
    let mut rules = PredictSettings::default();
    rules.workers.insert(
        "w".into(),
        PredictRule {
            enabled: false,
            ..PredictRule::default()
        },
    );
    let mut p = Predictions::new(rules);
    let own: PathBuf = "/sys/fs/cgroup/job/step".into();
    let parent: PathBuf = "/sys/fs/cgroup/job".into();
    let reading = |parent_used: u64| Reading {
        cgroup: own.clone().into(),
        worker: "w".into(),
        task_id: Some("t".into()),
        unreclaimable: 100 * MIB,
        limits: vec![
            // 412 MiB left in its own limit...
            Limit {
                owner: LimitOwner::Own,
                bytes: 512 * MIB,
                used: 100 * MIB,
            },
            // ...and in its parent's, 1 GiB − parent_used.
            Limit {
                owner: LimitOwner::Ancestor(parent.clone()),
                bytes: 1024 * MIB,
                used: parent_used,
            },
            Limit {
                owner: LimitOwner::Host,
                bytes: 16 * 1024 * MIB,
                used: 2 * 1024 * MIB,
            },
        ],
        high: None,
    };
    assert!(p.observe(&[reading(800 * MIB)], Instant::now()).is_empty());
    assert_eq!(
        p.nearest_limit(&own),
        LimitFields {
            limit_bytes: Some(1024 * MIB),
            limit_owner: Some("ancestor".into()),
            limit_cgroup: Some("/sys/fs/cgroup/job".into()),
        },
        "224 MiB left in the parent's, 412 in its own"
    );
    p.observe(&[reading(200 * MIB)], Instant::now());
    assert_eq!(
        p.nearest_limit(&own),
        LimitFields {
            limit_bytes: Some(512 * MIB),
            limit_owner: Some("own".into()),
            limit_cgroup: Some("/sys/fs/cgroup/job/step".into()),
        }
    );
    assert_eq!(
        p.nearest_limit(std::path::Path::new("/not/followed")),
        LimitFields::default()
    );
    let host_only = Reading {
        limits: vec![Limit {
            owner: LimitOwner::Host,
            bytes: 16 * 1024 * MIB,
            used: 2 * 1024 * MIB,
        }],
        ..reading(0)
    };
    p.observe(&[host_only], Instant::now());
    let shown = serde_json::to_value(p.nearest_limit(&own)).unwrap();
    assert_eq!(
        shown,
        serde_json::json!({"limit_bytes": 16u64 << 30, "limit_owner": "host"})
    );
}
