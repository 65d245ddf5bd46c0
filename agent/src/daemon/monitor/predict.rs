//! Feeding the kill predictor: every followed cgroup on the sampler's tick,
//! and those within half of a limit ten times a second in between.
//!
//! Far from its limits a cgroup costs one small read a tick (its usage):
//! its full figures (`memory.stat`, every limit above it) are read again
//! when that usage moved by a drop's size (1 MiB, 2 %), when it comes
//! within a tenth of a limit (page cache may hide anonymous growth at a
//! pinned usage), and every [`REREAD_EVERY`] ticks; in between the last
//! figures stand. A worker's thousands of idle task cgroups so cost what
//! the sampler's own reads cost, not a `memory.stat` and a walk up the
//! hierarchy each a second.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    time::Duration,
};

use tokio::time::Instant;

use super::Monitor;
use crate::{
    daemon::sampler::PredictFigures,
    watchdog::{
        imminent::Reading,
        policy::Sample,
        predict::{DROP_MIN_BYTES, Limit, LimitOwner, drop_size, near_a_limit},
    },
};

/// How often a cgroup within half of a limit is sampled.
pub(crate) const FAST_INTERVAL: Duration = Duration::from_millis(100);
/// A far cgroup whose usage stays put is read in full this often (ticks).
pub(crate) const REREAD_EVERY: u64 = 10;
/// The same, for a cgroup the kernel follows: it says when one moved.
pub(crate) const REREAD_FOLLOWED: u64 = 60;

/// Why the predictor read a cgroup in full (`memwatch_predict_reads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadWhy {
    /// Nothing kept of it yet.
    New,
    /// The kernel sent a sample of it (or records were lost).
    Kernel,
    /// Its usage, read because the kernel does not follow it, moved.
    Usage,
    /// Within a tenth of a limit with page cache beside its anonymous
    /// memory: read at every sample.
    NearLimit,
    /// Near a limit (or on a fast tick) while the kernel does not follow
    /// it: read at every sample.
    Poll,
    /// The periodic full read.
    Reread,
}

impl ReadWhy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Kernel => "kernel",
            Self::Usage => "usage",
            Self::NearLimit => "near_limit",
            Self::Poll => "poll",
            Self::Reread => "reread",
        }
    }
}

/// A cgroup's last full reading: its figures, its usage then (read only
/// when the kernel does not follow it), the tick it was made in and when.
#[derive(Clone, Debug)]
pub(crate) struct Kept {
    figures: PredictFigures,
    usage: Option<u64>,
    round: u64,
    at: Instant,
    /// Within half of none of its limits.
    far: bool,
}

impl Kept {
    /// Within a tenth of a limit at `usage` (page cache may hide anonymous
    /// growth at a pinned usage).
    fn near_limit(&self, usage: u64) -> bool {
        self.figures
            .limits
            .iter()
            .any(|l| usage.saturating_mul(10) >= l.bytes.saturating_mul(9))
    }

    /// Whether `usage` (read now) may mean other figures: it moved by a
    /// drop's size, or sits within a tenth of a limit.
    fn moved(&self, usage: u64) -> bool {
        let Some(then) = self.usage else {
            return true;
        };
        usage.abs_diff(then) as f64 >= drop_size(then as f64) || self.near_limit(usage)
    }

    /// The usage its limits say it had (its own, else the nearest).
    fn used(&self) -> u64 {
        self.figures.limits.first().map_or(0, |l| l.used)
    }

    /// Within a tenth of a limit with a drop's worth of reclaimable memory
    /// (page cache) beside the rest: the kernel's usage may stand still
    /// while anonymous memory replaces page cache, so a sample of the
    /// usage says nothing; it is read at every sample.
    fn pinned(&self) -> bool {
        let reclaimable = self.used().saturating_sub(self.figures.unreclaimable);
        reclaimable >= DROP_MIN_BYTES
            && self
                .figures
                .limits
                .iter()
                .any(|l| l.used.saturating_mul(10) >= l.bytes.saturating_mul(9))
    }
}

/// The sample size the kernel is asked for: near a limit, every move it
/// checks (a page: at most one sample per `sample_ns`); far, a drop's size
/// rounded up to a power of two (so it is handed again only when the
/// usage changed by half or more).
fn sample_bytes(kept: &Kept) -> u64 {
    if kept.far {
        (drop_size(kept.used() as f64) as u64).next_power_of_two()
    } else {
        1
    }
}

impl Monitor {
    /// Each target's figures, read in full or kept from the last read.
    ///
    /// Read: a cgroup new here or within a tenth of a limit; one the kernel
    /// said moved since its last read; far ones every [`REREAD_FOLLOWED`]
    /// ticks and near ones every tick. Where the kernel does not follow a
    /// cgroup (no probe), a fast tick reads all (all are near a limit), and
    /// a full tick a far one whose usage moved or that was last read
    /// [`REREAD_EVERY`] ticks ago.
    fn figures(&self, targets: &[&Path], all: bool) -> Vec<Option<PredictFigures>> {
        let round = self.rounds.load(Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = |c: &Path| -> Result<PredictFigures, ReadWhy> {
            let k = kept.get(c).ok_or(ReadWhy::New)?;
            let age = round.saturating_sub(k.round);
            match self.kernel.moved_since(c, k.at) {
                Some(true) => Err(ReadWhy::Kernel),
                Some(false) if k.pinned() => Err(ReadWhy::NearLimit),
                Some(false) if all && age >= if k.far { REREAD_FOLLOWED } else { 1 } => {
                    Err(ReadWhy::Reread)
                }
                Some(false) => Ok(k.figures.clone()),
                None if !all || !k.far => Err(ReadWhy::Poll),
                None if age >= REREAD_EVERY => Err(ReadWhy::Reread),
                None => {
                    let usage = self.reader.cgroup_usage(c).ok_or(ReadWhy::New)?;
                    if k.moved(usage) {
                        Err(ReadWhy::Usage)
                    } else {
                        Ok(k.figures.clone())
                    }
                }
            }
        };
        let mut figures: Vec<Result<Option<PredictFigures>, ReadWhy>> =
            targets.iter().map(|c| fresh(c).map(Some)).collect();
        let metrics = self.recorder.metrics();
        let stale: Vec<&Path> = targets
            .iter()
            .zip(&figures)
            .filter_map(|(c, f)| f.as_ref().err().map(|why| (*c, *why)))
            .map(|(c, why)| {
                metrics
                    .predict_reads
                    .with_label_values(&[why.as_str()])
                    .inc();
                c
            })
            .collect();
        let mut read = self
            .reader
            .predict_figures_all(&stale, &self.cgroup_root())
            .into_iter();
        for (c, f) in targets.iter().zip(figures.iter_mut()) {
            if f.is_ok() {
                continue;
            }
            let got = read.next().flatten();
            let Some(g) = got.as_ref() else {
                kept.remove(*c);
                self.kernel.unfollow(c);
                *f = Ok(None);
                continue;
            };
            let far = !g.limits.iter().any(|l| l.used.saturating_mul(2) >= l.bytes);
            let mut k = Kept {
                figures: g.clone(),
                usage: None,
                round,
                at: Instant::now(),
                far,
            };
            if !self.kernel.follow(c, sample_bytes(&k)) && far {
                k.usage = self.reader.cgroup_usage(c);
            }
            // After the kernel has the sample size: a new one says nothing
            // of the time before, and this read covers it.
            k.at = Instant::now();
            kept.insert(c.to_path_buf(), k);
            *f = Ok(got);
        }
        if all {
            let followed: HashSet<&Path> = targets.iter().copied().collect();
            kept.retain(|c, _| {
                let keep = followed.contains(c.as_path());
                if !keep {
                    self.kernel.unfollow(c);
                }
                keep
            });
        }
        figures.into_iter().map(|f| f.ok().flatten()).collect()
    }

    /// Readings of `targets` (cgroup, worker, task); remembers which are near
    /// a limit when `all` (a full tick), for [`Monitor::fast_tick`].
    fn readings(&self, targets: Vec<(PathBuf, String, Option<String>)>, all: bool) -> Vec<Reading> {
        let mut near = Vec::new();
        let paths: Vec<&Path> = targets.iter().map(|(c, _, _)| c.as_path()).collect();
        let figures = self.figures(&paths, all);
        let readings: Vec<Reading> = targets
            .into_iter()
            .zip(figures)
            .filter_map(|((cgroup, worker, task_id), f)| {
                let f = f?;
                let host = f.host.map(|(bytes, used)| Limit {
                    owner: LimitOwner::Host,
                    bytes,
                    used,
                });
                let cgroups = f.limits.into_iter().map(|l| Limit {
                    owner: if l.cgroup == cgroup {
                        LimitOwner::Own
                    } else {
                        LimitOwner::Ancestor(l.cgroup)
                    },
                    bytes: l.bytes,
                    used: l.used,
                });
                let limits: Vec<Limit> = cgroups.chain(host).collect();
                if near_a_limit(&limits) {
                    near.push(cgroup.clone());
                }
                Some(Reading {
                    cgroup,
                    worker,
                    task_id,
                    unreclaimable: f.unreclaimable,
                    limits,
                    high: f.high,
                })
            })
            .collect();
        let mut fast = self.near.lock().unwrap_or_else(|e| e.into_inner());
        if all {
            *fast = near.into_iter().collect();
        } else {
            fast.retain(|c| near.contains(c));
        }
        readings
    }

    /// Every followed cgroup's readings, for a full tick.
    pub(super) fn all_readings(&self) -> Vec<Reading> {
        let targets = self.lock().prediction_targets();
        self.readings(targets, true)
    }

    /// Whether any cgroup is within half of a limit (worth a fast tick).
    pub(crate) fn any_near_a_limit(&self) -> bool {
        !self
            .near
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Samples only the cgroups within half of a limit and runs the
    /// predictor on them: far from every limit, nothing is read.
    pub(crate) fn fast_tick(&self) {
        let near = self.near.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if near.is_empty() {
            return;
        }
        let targets: Vec<_> = self
            .lock()
            .prediction_targets()
            .into_iter()
            .filter(|(c, _, _)| near.contains(c))
            .collect();
        let sample = Sample {
            readings: self.readings(targets, false),
            ..Sample::default()
        };
        let mut watchdog = self.lock();
        let now = Instant::now();
        let events = watchdog.observe(&sample, now);
        let health = super::health_changes(&watchdog, &events);
        let _writes = self.unlock_for_writes(watchdog);
        self.decided(health, events, now);
    }

    /// A kill in `cgroup` now: (lead seconds, ETA error seconds) when it was
    /// predicted; the histograms count both.
    pub(crate) fn predicted_kill(&self, cgroup: &std::path::Path) -> Option<(f64, f64)> {
        let report = self.lock().predicted_kill(cgroup, Instant::now())?;
        let lead = report.lead.as_secs_f64();
        let metrics = self.recorder.metrics();
        metrics.predict_lead.observe(lead);
        metrics
            .predict_eta_error
            .observe(report.eta_error_seconds.abs());
        Some((lead, report.eta_error_seconds))
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, sync::Arc};

    use super::*;
    use crate::{
        cgroup::{CgroupVersion, MemoryHierarchy, limits::ChainLimit},
        daemon::sampler::{PredictFigures, fake::FakeReader},
        model::{
            event::EventKind,
            spec::{ANONYMOUS, MemorySource, Settings, TaskRequest, WorkerSpec},
        },
        outbox::Outbox,
        record::Recorder,
        telemetry::Metrics,
    };

    const MIB: u64 = 1 << 20;
    const LIMIT: u64 = 256 * MIB;

    fn monitor(root: &Path, reader: Arc<FakeReader>) -> (Monitor, Metrics) {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 1000, metrics.clone());
        let worker = WorkerSpec {
            name: "w1".into(),
            source: MemorySource::Pid(1),
            soft_cap: None,
            unhealthy_after: Duration::from_secs(60),
            recover_after: Duration::from_secs(30),
            pressure: None,
        };
        let hierarchy = MemoryHierarchy {
            root: root.into(),
            version: CgroupVersion::V1,
        };
        let m = Monitor::new(
            vec![worker],
            Settings::default(),
            Vec::new(),
            hierarchy,
            reader,
            Recorder::new(outbox, metrics.clone()),
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
        tokio::time::advance((start + Duration::from_secs(24)).duration_since(Instant::now()))
            .await;
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
        let cgroups: Vec<PathBuf> = (0..50).map(|i| root.path().join(format!("t{i}"))).collect();
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

    /// The kernel's WATCHED map, as far as the predictor cares.
    #[derive(Default)]
    struct Watched(std::sync::Mutex<std::collections::HashMap<u64, crate::probe::Watch>>);

    impl crate::probe::KernelWatch for Watched {
        fn set(&self, id: u64, watch: Option<crate::probe::Watch>) {
            let mut map = self.0.lock().unwrap();
            match watch {
                Some(w) => map.insert(id, w),
                None => map.remove(&id),
            };
        }
    }

    fn ino(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).unwrap().ino()
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

    /// With the probe, 50 idle far cgroups cost no read at all between
    /// their full reads (first tick, then every REREAD_FOLLOWED): the
    /// kernel follows each with a drop-sized sample, and one it says moved
    /// is read at the next tick, alone.
    #[tokio::test(start_paused = true)]
    async fn with_the_kernel_following_idle_far_cgroups_cost_no_reads() {
        let root = tempfile::tempdir().unwrap();
        let reader = Arc::new(FakeReader::default());
        let (m, metrics) = monitor(root.path(), reader.clone());
        let map = Arc::new(Watched::default());
        m.attach_kernel_watch(map.clone());
        let cgroups: Vec<PathBuf> = (0..50).map(|i| root.path().join(format!("t{i}"))).collect();
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
        for cgroup in &cgroups {
            let n = reads.iter().filter(|c| *c == cgroup).count();
            assert_eq!(n, 2, "{} read {n} times in {ticks} ticks", cgroup.display());
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
        assert_eq!(reads_why(&metrics, ReadWhy::Reread), 50);

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
}
