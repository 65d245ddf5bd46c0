//! `heartbeat` events: every `heartbeat_interval`, the agent's full state,
//! so a scheduler knows the agent is alive and can reconcile what it holds.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use crate::{
    daemon::status::{AgentStatus, StatusFn},
    model::event::{EventBody, EventKind},
    record::Recorder,
};

/// Appends a heartbeat every `interval` (the first one after one interval)
/// until `shutdown` turns true.
pub(crate) async fn run(
    recorder: Recorder,
    interval: Duration,
    status: StatusFn,
    mut shutdown: watch::Receiver<bool>,
) {
    // Tasks finished as of the previous heartbeat: each heartbeat carries
    // only those finished since (a delta; `finished_total` counts them all).
    let mut finished_seen = 0;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let mut body = EventBody::new(EventKind::Heartbeat);
        let mut state = status();
        finished_seen = keep_finished_since(&mut state, finished_seen);
        body.state = match serde_json::to_value(state) {
            Ok(state) => Some(state),
            Err(error) => {
                tracing::warn!(%error, "heartbeat without its state");
                None
            }
        };
        let event = recorder.record(body, None);
        debug!(seq = event.seq, "heartbeat");
    }
}

/// Keeps in `state` only the tasks finished after the first `seen` ones;
/// returns the new mark.
fn keep_finished_since(state: &mut AgentStatus, seen: u64) -> u64 {
    let new = state.finished_total.saturating_sub(seen);
    let kept = state.finished_tasks.len();
    let from = kept.saturating_sub(usize::try_from(new).unwrap_or(usize::MAX));
    state.finished_tasks.drain(..from);
    state.finished_total
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        model::{health::Verdict, source::SourceKind},
        outbox::{Outbox, OutboxStatus},
        telemetry::Metrics,
        watchdog::task::TaskView,
    };

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_every_interval_carries_the_state() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics.clone());
        let status: StatusFn = Arc::new(|| AgentStatus {
            version: "0.1.0".into(),
            host: "h".into(),
            source: Some(SourceKind::Ebpf),
            attach: Some("tp_btf".into()),
            health: Verdict::healthy(),
            workers: Vec::new(),
            tasks: Vec::new(),
            finished_tasks: Vec::new(),
            finished_total: 0,
            outbox: OutboxStatus::default(),
            socket: None,
        });
        let (stop, stopped) = watch::channel(false);
        let recorder = Recorder::new(outbox.clone(), metrics);
        let task = tokio::spawn(run(recorder, Duration::from_secs(30), status, stopped));
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(
            outbox.read(0, 10).is_empty(),
            "none before the first interval"
        );
        tokio::time::sleep(Duration::from_secs(62)).await;
        let events = outbox.read(0, 10);
        assert_eq!(events.len(), 3);
        assert!(events.iter().all(|e| e.body.kind == EventKind::Heartbeat));
        let state = events[0].body.state.as_ref().unwrap();
        assert_eq!(state["workers"], serde_json::json!([]));
        assert_eq!(state["health"]["status"], "healthy");
        let json = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(json["state"]["source"], "ebpf");
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    fn finished(id: u64) -> TaskView {
        TaskView {
            task_id: format!("t{id}"),
            worker: "w".into(),
            source: None,
            memory_bytes: None,
            soft_cap_bytes: None,
            running_secs: 1,
            growing: false,
            flagged: None,
            outcome: None,
            owner: String::new(),
            kernel_usage_bytes: None,
            eta_seconds: None,
            limit: Default::default(),
        }
    }

    fn status_with(total: u64, kept: u64) -> AgentStatus {
        AgentStatus {
            version: String::new(),
            host: "h".into(),
            source: None,
            attach: None,
            health: Verdict::healthy(),
            workers: Vec::new(),
            tasks: Vec::new(),
            finished_tasks: (total.saturating_sub(kept)..total).map(finished).collect(),
            finished_total: total,
            outbox: OutboxStatus::default(),
            socket: None,
        }
    }

    #[test]
    fn a_heartbeat_carries_only_the_tasks_finished_since_the_last() {
        let ids = |s: &AgentStatus| -> Vec<String> {
            s.finished_tasks.iter().map(|t| t.task_id.clone()).collect()
        };
        // First: every task kept (3 finished).
        let mut s = status_with(3, 3);
        let seen = keep_finished_since(&mut s, 0);
        assert_eq!(
            (ids(&s), seen),
            (vec!["t0".into(), "t1".into(), "t2".into()], 3)
        );
        // Two more since.
        let mut s = status_with(5, 5);
        let seen = keep_finished_since(&mut s, seen);
        assert_eq!((ids(&s), seen), (vec!["t3".into(), "t4".into()], 5));
        // None since.
        let mut s = status_with(5, 5);
        assert_eq!(
            (keep_finished_since(&mut s, seen), s.finished_tasks.len()),
            (5, 0)
        );
        // More finished than kept (1000 kept, 1500 new): the kept ones, and
        // finished_total says 500 went unsent.
        let mut s = status_with(2005, 1000);
        assert_eq!(keep_finished_since(&mut s, 5), 2005);
        assert_eq!(s.finished_tasks.len(), 1000);
    }
}
