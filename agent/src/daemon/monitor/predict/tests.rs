//! The predictor's feed: what is read, when, and why.

use std::{path::Path, sync::Arc};

use super::*;
use crate::daemon::monitor::tests::{Watched, ino};
use crate::{
    cgroup::{CgroupVersion, limits::ChainLimit},
    daemon::sampler::{PredictFigures, fake::FakeReader},
    model::{
        event::EventKind,
        spec::{ANONYMOUS, MemorySource, TaskRequest},
    },
    outbox::Outbox,
    telemetry::Metrics,
};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 256 * MIB;

fn monitor(root: &Path, reader: Arc<FakeReader>) -> (Monitor, Metrics) {
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::new("h", 1000, metrics.clone());
    let worker = super::super::tests::w1(MemorySource::Pid(1), None);
    let m = super::super::tests::monitor_of(
        worker,
        Vec::new(),
        (root, CgroupVersion::V1),
        reader,
        outbox,
        metrics.clone(),
    );
    (m, metrics)
}

/// A task cgroup leaking 10 MiB/s toward a 256 MiB limit, the sampler
/// loop played by hand: a full tick every second, a fast one every
/// 100 ms while something is near a limit.
#[tokio::test(start_paused = true)]
async fn near_a_limit_ten_samples_a_second_and_the_kill_is_said_ahead() {
    let root = tempfile::tempdir().unwrap();
    let job = root.path().join("job");
    let reader = Arc::new(FakeReader::default());
    let (m, metrics) = monitor(root.path(), reader.clone());
    m.register(TaskRequest {
        task_id: "job".into(),
        worker: None,
        source: Some(MemorySource::Cgroup(job.clone())),
        soft_cap: None,
        owner: ANONYMOUS.into(),
    })
    .unwrap();
    let start = Instant::now();
    let leak = |t: f64| 16 * MIB + (10.0 * MIB as f64 * t) as u64;
    let mut reads_per_second = Vec::new();
    let mut eta_in_status = None;
    for step in 0..230u64 {
        let t = step as f64 / 10.0;
        let used = leak(t);
        reader.predict.lock().unwrap().insert(
            job.clone(),
            PredictFigures {
                unreclaimable: used,
                limits: vec![ChainLimit {
                    cgroup: job.clone(),
                    bytes: LIMIT,
                    used,
                }],
                high: None,
                host: None,
            },
        );
        if step % 10 == 0 {
            let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
            reads_per_second.push((t, used, reads.len()));
            m.tick();
        } else if m.any_near_a_limit() {
            m.fast_tick();
        }
        if let Some(eta) = m.tasks().iter().find_map(|t| t.eta_seconds) {
            eta_in_status.get_or_insert((t, eta));
        }
        tokio::time::advance(FAST_INTERVAL).await;
    }
    for &(t, used, reads) in &reads_per_second[1..] {
        // The second before `t`: its first sample was at used − 10 MiB.
        if used - 10 * MIB < LIMIT / 2 {
            assert!(reads <= 1, "far from the limit at {t}s: {reads} reads");
        } else if used - 10 * MIB >= LIMIT / 2 + 10 * MIB {
            assert!(reads >= 10, "near the limit at {t}s: {reads} reads");
        }
    }
    let said: Vec<_> = m
        .recorder
        .outbox()
        .read(0, 1000)
        .into_iter()
        .filter(|e| e.body.kind == EventKind::OomImminent)
        .collect();
    assert!(!said.is_empty(), "no oom_imminent");
    let first = &said[0].body;
    assert_eq!(first.task_id.as_deref(), Some("job"));
    assert!(first.eta_seconds.unwrap() >= 3.0, "{first:?}");
    // /v1/status names the limit: the task's own.
    let shown = &m.tasks()[0].limit;
    assert_eq!(shown.limit_bytes, Some(LIMIT));
    assert_eq!(shown.limit_owner.as_deref(), Some("own"));
    assert_eq!(shown.limit_cgroup, Some(job.display().to_string()));
    let (t, eta) = eta_in_status.expect("/v1/status shows the ETA");
    assert!(
        (eta - (24.0 - t)).abs() <= 0.25 * (24.0 - t),
        "eta {eta} at {t}"
    );

    // The worker's soonest ETA, for the sinks and on /metrics.
    m.tick();
    let soonest = m.worker_eta("w1").expect("w1's task is about to be killed");
    assert!(soonest > 0.0 && soonest <= 3.0, "{soonest}");
    let gauge = metrics.worker_oom_eta.with_label_values(&["w1"]).get();
    assert!(
        (gauge - soonest).abs() < 0.5,
        "gauge {gauge}, eta {soonest}"
    );

    // The kill at 24 s: lead from the first warning, histograms count it.
    tokio::time::advance((start + Duration::from_secs(24)).duration_since(Instant::now())).await;
    let (lead, error) = m.predicted_kill(&job).expect("predicted");
    assert!(lead >= 3.0, "lead {lead}");
    assert!(error.abs() <= 0.25 * lead, "error {error}, lead {lead}");
    assert_eq!(metrics.predict_lead.get_sample_count(), 1);
    assert_eq!(metrics.predict_eta_error.get_sample_count(), 1);
}

/// 50 idle task cgroups far from their limits: each read in full on
/// its first tick and every REREAD_EVERY ticks after, not every tick;
/// one whose usage moves is read in full at the next tick, and the
/// others are not.
#[tokio::test(start_paused = true)]
async fn idle_far_cgroups_are_read_in_full_only_every_tenth_tick_unless_they_move() {
    let root = tempfile::tempdir().unwrap();
    let reader = Arc::new(FakeReader::default());
    let (m, _) = monitor(root.path(), reader.clone());
    let figures = |cgroup: &Path, used: u64| PredictFigures {
        unreclaimable: used,
        limits: vec![ChainLimit {
            cgroup: cgroup.to_path_buf(),
            bytes: LIMIT,
            used,
        }],
        high: None,
        host: None,
    };
    let cgroups: Vec<std::path::PathBuf> =
        (0..50).map(|i| root.path().join(format!("t{i}"))).collect();
    for (i, cgroup) in cgroups.iter().enumerate() {
        m.register(TaskRequest {
            task_id: format!("t{i}"),
            worker: None,
            source: Some(MemorySource::Cgroup(cgroup.clone())),
            soft_cap: None,
            owner: ANONYMOUS.into(),
        })
        .unwrap();
        reader
            .predict
            .lock()
            .unwrap()
            .insert(cgroup.clone(), figures(cgroup, 10 * MIB));
    }
    // Read in full at rounds 1, 11, 21 and 31.
    let ticks = 3 * REREAD_EVERY + 1;
    for _ in 0..ticks {
        m.tick();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
    for cgroup in &cgroups {
        let n = reads.iter().filter(|c| *c == cgroup).count() as u64;
        assert_eq!(n, 4, "{} read {n} times in {ticks} ticks", cgroup.display());
    }
    // t0 grows by 4 MiB (more than a drop's 1 MiB): read at once.
    let t0 = &cgroups[0];
    reader
        .predict
        .lock()
        .unwrap()
        .insert(t0.clone(), figures(t0, 14 * MIB));
    m.tick();
    let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
    assert_eq!(
        reads,
        vec![t0.clone()],
        "only the cgroup that moved is read again"
    );
    let status = m.tasks();
    assert!(status.iter().any(|t| t.task_id == "t0"), "{status:?}");
}

/// What the growth program sends when `cgroup`'s usage moved.
fn sample(m: &Monitor, cgroup: &Path, usage: u64) {
    m.growth_line(&crate::probe::GrowthLine {
        time: chrono::Utc::now(),
        memcg_id: ino(cgroup),
        line: crate::probe::Line::Sample,
        usage_bytes: usage,
        cap_bytes: None,
    });
}

fn reads_why(metrics: &Metrics, why: ReadWhy) -> u64 {
    metrics
        .predict_reads
        .with_label_values(&[why.as_str()])
        .get()
}

/// With the probe, 50 idle far cgroups cost no read at all after their
/// first: the kernel follows each with a drop-sized sample, and one it
/// says moved is read at the next tick, alone. Every REREAD_FOLLOWED
/// ticks their limit files alone are read, and a cgroup whose limit was
/// written meanwhile is read in full.
#[tokio::test(start_paused = true)]
async fn with_the_kernel_following_idle_far_cgroups_cost_no_reads() {
    let root = tempfile::tempdir().unwrap();
    let reader = Arc::new(FakeReader::default());
    let (m, metrics) = monitor(root.path(), reader.clone());
    let map = Arc::new(Watched::default());
    m.attach_kernel_watch(map.clone());
    let cgroups: Vec<std::path::PathBuf> =
        (0..50).map(|i| root.path().join(format!("t{i}"))).collect();
    for (i, cgroup) in cgroups.iter().enumerate() {
        std::fs::create_dir(cgroup).unwrap();
        m.register(TaskRequest {
            task_id: format!("t{i}"),
            worker: None,
            source: Some(MemorySource::Cgroup(cgroup.clone())),
            soft_cap: None,
            owner: ANONYMOUS.into(),
        })
        .unwrap();
        reader.predict.lock().unwrap().insert(
            cgroup.clone(),
            PredictFigures {
                unreclaimable: 10 * MIB,
                limits: vec![ChainLimit {
                    cgroup: cgroup.clone(),
                    bytes: LIMIT,
                    used: 10 * MIB,
                }],
                high: None,
                host: None,
            },
        );
    }
    let ticks = REREAD_FOLLOWED + 1;
    for _ in 0..ticks {
        m.tick();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
    let limit_reads = std::mem::take(&mut *reader.limit_reads.lock().unwrap());
    for cgroup in &cgroups {
        let n = reads.iter().filter(|c| *c == cgroup).count();
        assert_eq!(n, 1, "{} read {n} times in {ticks} ticks", cgroup.display());
        let n = limit_reads.iter().filter(|c| *c == cgroup).count();
        assert_eq!(n, 1, "{}: its limits read {n} times", cgroup.display());
        let held = map.0.lock().unwrap().get(&ino(cgroup)).copied();
        let held = held.expect("the kernel follows it");
        assert_eq!(held.sample_bytes, Some(MIB), "a drop's size, 1 MiB");
        assert_eq!(held.cap_bytes, None);
    }
    assert!(
        reader.usage_reads.lock().unwrap().is_empty(),
        "no usage read while the kernel follows them"
    );
    assert_eq!(reads_why(&metrics, ReadWhy::New), 50);
    assert_eq!(reads_why(&metrics, ReadWhy::Reread), 0);

    // A limit written on t5: read in full at the next look at the limits,
    // and only it; the others' limits are read again then.
    reader
        .predict
        .lock()
        .unwrap()
        .get_mut(&cgroups[5])
        .unwrap()
        .limits[0]
        .bytes = LIMIT / 2;
    for _ in 0..REREAD_FOLLOWED {
        m.tick();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
    assert_eq!(reads, vec![cgroups[5].clone()]);
    assert_eq!(reads_why(&metrics, ReadWhy::Reread), 1);
    assert_eq!(
        std::mem::take(&mut *reader.limit_reads.lock().unwrap()).len(),
        50
    );

    // The kernel says t7 moved: read at the next tick, and only it.
    let t7 = &cgroups[7];
    sample(&m, t7, 12 * MIB);
    tokio::time::advance(Duration::from_millis(1)).await;
    m.tick();
    let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
    assert_eq!(reads, vec![t7.clone()]);
    assert_eq!(reads_why(&metrics, ReadWhy::Kernel), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    m.tick();
    assert!(reader.predict_reads.lock().unwrap().is_empty(), "read once");

    // A task gone: the kernel follows its cgroup no more.
    m.finish(
        "t3",
        crate::model::spec::TaskOutcome::Ended { exit_code: Some(0) },
    )
    .unwrap();
    m.tick();
    assert!(!map.0.lock().unwrap().contains_key(&ino(&cgroups[3])));
}

/// A cgroup leaking 10 MiB/s from 130 MiB (near: over half of 256 MiB)
/// for 4 s, standing still for 4 s, then leaking again into the limit
/// (reached at 8 + 8.6 = 16.6 s); the sampler loop played by hand, with
/// or without the probe (whose growth program sends a sample when the
/// usage moved by 64 pages, at most every 90 ms). Returns the reads in
/// each second, the task's ETA at 13 s, and the metrics.
async fn leak_stop_leak(kernel: bool) -> (Vec<(f64, usize)>, Option<f64>, Metrics) {
    let root = tempfile::tempdir().unwrap();
    let job = root.path().join("job");
    std::fs::create_dir(&job).unwrap();
    let reader = Arc::new(FakeReader::default());
    let (m, metrics) = monitor(root.path(), reader.clone());
    let map = Arc::new(Watched::default());
    if kernel {
        m.attach_kernel_watch(map.clone());
    }
    m.register(TaskRequest {
        task_id: "job".into(),
        worker: None,
        source: Some(MemorySource::Cgroup(job.clone())),
        soft_cap: None,
        owner: ANONYMOUS.into(),
    })
    .unwrap();
    let used_at = |t: f64| {
        let leaked = t.min(4.0) + (t - 8.0).max(0.0);
        130 * MIB + (10.0 * MIB as f64 * leaked) as u64
    };
    let mut last = used_at(0.0);
    let mut per_second = Vec::new();
    let mut eta_at_13 = None;
    for step in 0..166u64 {
        let t = step as f64 / 10.0;
        let used = used_at(t);
        reader.predict.lock().unwrap().insert(
            job.clone(),
            PredictFigures {
                unreclaimable: used,
                limits: vec![ChainLimit {
                    cgroup: job.clone(),
                    bytes: LIMIT,
                    used,
                }],
                high: None,
                host: None,
            },
        );
        if kernel && used.abs_diff(last) >= 64 * 4096 {
            sample(&m, &job, used);
            last = used;
        }
        if step % 10 == 0 {
            let reads = std::mem::take(&mut *reader.predict_reads.lock().unwrap());
            per_second.push((t, reads.len()));
            m.tick();
        } else if m.any_near_a_limit() {
            m.fast_tick();
        }
        if step == 130 {
            eta_at_13 = m.tasks()[0].eta_seconds;
        }
        tokio::time::advance(FAST_INTERVAL).await;
    }
    if kernel {
        let held = map.0.lock().unwrap().get(&ino(&job)).copied().unwrap();
        assert_eq!(held.sample_bytes, Some(1), "near: every move it checks");
        assert!(reader.usage_reads.lock().unwrap().is_empty());
    }
    (per_second, eta_at_13, metrics)
}

/// With the probe, a cgroup near its limit is read on a fast tick only
/// when the kernel sent a sample since its last read: while it leaks,
/// ten a second; standing still, no sample and no read but the one of
/// each full tick. Its ETA is the one polling gives, to the bit.
#[tokio::test(start_paused = true)]
async fn near_a_limit_the_kernel_samples_drive_the_reads() {
    let (kernel, eta, metrics) = leak_stop_leak(true).await;
    for &(t, reads) in &kernel[1..] {
        // The second before `t`.
        if (1.0..=4.0).contains(&t) || t >= 9.0 {
            assert!(reads >= 10, "leaking at {t}s: {reads} reads");
        } else if (6.0..=8.0).contains(&t) {
            assert_eq!(reads, 1, "standing still at {t}s: {reads} reads");
        }
    }
    assert!(reads_why(&metrics, ReadWhy::Kernel) >= 100);
    assert_eq!(reads_why(&metrics, ReadWhy::Poll), 0);

    let (polled, polled_eta, metrics) = leak_stop_leak(false).await;
    for &(t, reads) in &polled[1..] {
        assert!(reads >= 10, "polling near the limit at {t}s: {reads} reads");
    }
    assert!(reads_why(&metrics, ReadWhy::Poll) >= 100);
    assert_eq!(reads_why(&metrics, ReadWhy::Kernel), 0);
    let eta = eta.expect("an ETA at 13 s");
    assert_eq!(Some(eta), polled_eta, "the kernel's samples, polling's");
    assert!(eta > 0.0 && eta < 16.6, "{eta}");
}
