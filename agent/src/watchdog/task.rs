//! One task's memory over time: is it growing, did it cross its cap.

use std::collections::VecDeque;

use serde::Serialize;
use tokio::time::Instant;

use crate::model::spec::{MemorySource, Settings, TaskOutcome};

#[derive(Debug)]
pub(crate) struct TaskState {
    pub id: String,
    pub worker: String,
    pub source: Option<MemorySource>,
    pub soft_cap: Option<u64>,
    pub started: Instant,
    /// Set when the task was accepted despite an unhealthy worker.
    pub flagged: Option<String>,
    /// Who registered it (see [`crate::model::spec::TaskRequest::owner`]).
    pub owner: String,
    /// (time, bytes), oldest first, no older than the growth window.
    samples: VecDeque<(Instant, u64)>,
    /// Above the soft cap since the last crossing (re-armed when clearly below).
    over_cap: bool,
}

/// A task as shown on `/v1/status`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub(crate) struct TaskView {
    pub task_id: String,
    pub worker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<MemorySource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_cap_bytes: Option<u64>,
    pub running_secs: u64,
    pub growing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flagged: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<TaskOutcome>,
    /// Who registered it: only it or an admin may end it.
    #[serde(default)]
    pub owner: String,
    /// The kernel's own usage of the task's cgroup at its last reported line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_usage_bytes: Option<u64>,
    /// Seconds left by the last `oom_imminent`, while the task's kill is
    /// predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    /// The limit nearest to its cgroup (least headroom), whose it is.
    #[serde(flatten)]
    pub limit: crate::watchdog::predict::LimitFields,
}

/// A soft-cap crossing found by [`TaskState::observe`].
#[derive(Debug, PartialEq)]
pub(crate) struct Crossing {
    pub memory: u64,
    pub cap: u64,
    /// Bytes per second over the samples kept.
    pub growth_rate: i64,
}

impl TaskState {
    pub(crate) fn new(
        id: String,
        worker: String,
        source: Option<MemorySource>,
        soft_cap: Option<u64>,
        now: Instant,
    ) -> Self {
        Self {
            id,
            worker,
            source,
            soft_cap,
            started: now,
            flagged: None,
            owner: crate::model::spec::ANONYMOUS.into(),
            samples: VecDeque::new(),
            over_cap: false,
        }
    }

    pub(crate) fn memory(&self) -> Option<u64> {
        self.samples.back().map(|&(_, bytes)| bytes)
    }

    /// When the task was last read, and its memory then.
    pub(crate) fn last_sample(&self) -> Option<(Instant, u64)> {
        self.samples.back().copied()
    }

    /// Records a sample; returns a crossing when the task just went over its cap.
    pub(crate) fn observe(
        &mut self,
        bytes: u64,
        now: Instant,
        settings: &Settings,
    ) -> Option<Crossing> {
        self.samples.push_back((now, bytes));
        // Keep one sample at or before the window's start, so growth is
        // measured over the whole window.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(t, _)| now.duration_since(t) >= settings.growth_window)
        {
            self.samples.pop_front();
        }
        let cap = self.soft_cap?;
        if bytes > cap && !self.over_cap {
            self.over_cap = true;
            return Some(Crossing {
                memory: bytes,
                cap,
                growth_rate: self.growth_rate(),
            });
        }
        if (bytes as f64) < cap as f64 * (1.0 - settings.hysteresis) {
            self.over_cap = false;
        }
        None
    }

    /// A crossing the kernel reported (its usage then, page cache
    /// included) that no read of the task judged: the task freed its
    /// memory or ended first. A crossing when it is over the cap and the
    /// task is not over it already; the next read re-arms as usual.
    pub(crate) fn kernel_crossing(&mut self, usage: u64) -> Option<Crossing> {
        let cap = self.soft_cap?;
        if usage <= cap || self.over_cap {
            return None;
        }
        self.over_cap = true;
        Some(Crossing {
            memory: usage,
            cap,
            growth_rate: self.growth_rate(),
        })
    }

    /// Bytes per second between the oldest and newest sample kept.
    pub(crate) fn growth_rate(&self) -> i64 {
        growth_rate(&self.samples)
    }

    /// Whether memory rose by more than the threshold over the window.
    pub(crate) fn growing(&self, settings: &Settings) -> bool {
        match (self.samples.front(), self.samples.back()) {
            (Some(&(_, first)), Some(&(_, last))) => {
                last.saturating_sub(first) > settings.growth_min_bytes
            }
            _ => false,
        }
    }

    pub(crate) fn view(
        &self,
        now: Instant,
        settings: &Settings,
        outcome: Option<TaskOutcome>,
    ) -> TaskView {
        TaskView {
            task_id: self.id.clone(),
            worker: self.worker.clone(),
            source: self.source.clone(),
            memory_bytes: self.memory(),
            soft_cap_bytes: self.soft_cap,
            running_secs: now.duration_since(self.started).as_secs(),
            growing: self.growing(settings),
            flagged: self.flagged.clone(),
            outcome,
            owner: self.owner.clone(),
            kernel_usage_bytes: None,
            eta_seconds: None,
            limit: Default::default(),
        }
    }
}

/// Bytes per second from the first to the last sample (0 with fewer than two).
pub(crate) fn growth_rate(samples: &VecDeque<(Instant, u64)>) -> i64 {
    match (samples.front(), samples.back()) {
        (Some(&(t0, b0)), Some(&(t1, b1))) if t1 > t0 => {
            let secs = t1.duration_since(t0).as_secs_f64();
            ((b1 as f64 - b0 as f64) / secs) as i64
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn task(cap: Option<u64>) -> TaskState {
        TaskState::new("t1".into(), "w1".into(), None, cap, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn crossing_fires_once_and_rearms_only_clearly_below() {
        let s = Settings::default();
        let mut t = task(Some(100 * MIB));
        assert_eq!(t.observe(50 * MIB, Instant::now(), &s), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        let c = t.observe(110 * MIB, Instant::now(), &s).expect("crossing");
        assert_eq!((c.memory, c.cap), (110 * MIB, 100 * MIB));
        assert_eq!(c.growth_rate, (60 * MIB) as i64);
        // Flapping just under the cap does not re-arm.
        assert_eq!(t.observe(99 * MIB, Instant::now(), &s), None);
        assert_eq!(t.observe(101 * MIB, Instant::now(), &s), None);
        // Clearly below (under 95 %) re-arms; the next crossing fires again.
        assert_eq!(t.observe(90 * MIB, Instant::now(), &s), None);
        assert!(t.observe(101 * MIB, Instant::now(), &s).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn growth_is_measured_over_the_window() {
        let s = Settings::default();
        let mut t = task(None);
        for i in 0..30u64 {
            // 2 MiB/s for 15 s, then flat.
            let bytes = (i.min(15)) * 2 * MIB;
            t.observe(bytes, Instant::now(), &s);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The last 10 s were flat: not growing any more.
        assert!(!t.growing(&s));
        assert_eq!(t.growth_rate(), 0);

        let mut t = task(None);
        for i in 0..5u64 {
            t.observe(i * 2 * MIB, Instant::now(), &s);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(t.growing(&s));
        assert_eq!(t.growth_rate(), (2 * MIB) as i64);
    }
}
