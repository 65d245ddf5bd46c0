//! `heartbeat` events: every `heartbeat_interval`, the agent's full state,
//! so a scheduler knows the agent is alive and can reconcile what it holds.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use crate::{
    model::event::{EventBody, EventKind},
    outbox::Outbox,
    status::StateFn,
};

/// Appends a heartbeat every `interval` (the first one after one interval)
/// until `shutdown` turns true.
pub async fn run(
    outbox: Outbox,
    interval: Duration,
    state: StateFn,
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
        body.state = Some(state());
        let event = outbox.append(body, None);
        debug!(seq = event.seq, "heartbeat");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::telemetry::Metrics;

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_every_interval_carries_the_state() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h", 100, metrics);
        let state: StateFn = Arc::new(|| serde_json::json!({"workers": [], "source": "ebpf"}));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(outbox.clone(), Duration::from_secs(30), state, stopped));
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert!(
            outbox.read(0, 10).is_empty(),
            "none before the first interval"
        );
        tokio::time::sleep(Duration::from_secs(62)).await;
        let events = outbox.read(0, 10);
        assert_eq!(events.len(), 3);
        assert!(events.iter().all(|e| e.body.kind == EventKind::Heartbeat));
        assert_eq!(
            events[0].body.state,
            Some(serde_json::json!({"workers": [], "source": "ebpf"}))
        );
        let json = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(json["state"]["source"], "ebpf");
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}
