//! `heartbeat` events: every `heartbeat_interval`, the agent's full state,
//! so a scheduler knows the agent is alive and can reconcile what it holds.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use crate::{
    daemon::status::StatusFn,
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
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let mut body = EventBody::new(EventKind::Heartbeat);
        body.state = match serde_json::to_value(status()) {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        daemon::status::AgentStatus,
        model::{health::Verdict, source::SourceKind},
        outbox::{Outbox, OutboxStatus},
        telemetry::Metrics,
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
}
