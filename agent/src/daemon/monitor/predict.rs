//! Feeding the kill predictor: every followed cgroup on the sampler's tick,
//! and those within half of a limit ten times a second in between.

use std::{path::PathBuf, time::Duration};

use tokio::time::Instant;

use super::Monitor;
use crate::watchdog::{
    imminent::Reading,
    policy::Sample,
    predict::{Limit, LimitOwner, near_a_limit},
};

/// How often a cgroup within half of a limit is sampled.
pub(crate) const FAST_INTERVAL: Duration = Duration::from_millis(100);

impl Monitor {
    /// Readings of `targets` (cgroup, worker, task); remembers which are near
    /// a limit when `all` (a full tick), for [`Monitor::fast_tick`].
    fn readings(&self, targets: Vec<(PathBuf, String, Option<String>)>, all: bool) -> Vec<Reading> {
        let root = self.cgroup_root();
        let mut near = Vec::new();
        let readings: Vec<Reading> = targets
            .into_iter()
            .filter_map(|(cgroup, worker, task_id)| {
                let f = self.reader.predict_figures(&cgroup, &root)?;
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
        let mut kept = self.near.lock().unwrap_or_else(|e| e.into_inner());
        if all {
            *kept = near.into_iter().collect();
        } else {
            kept.retain(|c| near.contains(c));
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
}
