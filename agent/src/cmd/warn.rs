//! `memwatch exec --warn-signal SIGNAL`: exec follows the agent's events
//! for its own task and signals its child when the task's kill is
//! imminent, once per imminent episode.
//!
//! The policy ([`WarnPolicy`]) is pure; the follower ([`follow`]) polls an
//! [`EventSource`] with a bounded interval, a bounded wait per request and
//! backoff while the agent does not answer. The agent being down never
//! stops or kills the child: the follower only ever sends the one signal.

use std::{convert::Infallible, future::Future, time::Duration};

use crate::model::event::{Event, EventKind};

/// Between polls while the agent answers.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// The longest pause between attempts while the agent does not answer.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Bound on one request for events.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Events asked for per request.
pub(crate) const PAGE: u64 = 500;

pub(crate) use crate::model::signal::Signal as WarnSignal;
pub(crate) use crate::model::signal::parse_signal;

/// When to warn: on the first `oom_imminent` of the task, and again only
/// after an `oom_averted` of it.
#[derive(Debug)]
pub(crate) struct WarnPolicy {
    task_id: String,
    warned: bool,
}

impl WarnPolicy {
    pub(crate) fn new(task_id: impl Into<String>) -> Self {
        Self {
            task_id: task_id.into(),
            warned: false,
        }
    }

    /// The ETA to warn with (seconds; NaN when the event carries none)
    /// when this event calls for the signal.
    pub(crate) fn on_event(&mut self, event: &Event) -> Option<f64> {
        if event.body.task_id.as_deref() != Some(self.task_id.as_str()) {
            return None;
        }
        match event.body.kind {
            EventKind::OomImminent if !self.warned => {
                self.warned = true;
                Some(event.body.eta_seconds.unwrap_or(f64::NAN))
            }
            EventKind::OomAverted => {
                self.warned = false;
                None
            }
            _ => None,
        }
    }
}

/// Where the follower reads events from (the agent's `GET /v1/events`, and
/// its outbox's epoch on `GET /v1/status`).
pub(crate) trait EventSource {
    fn events(&self, after: u64, limit: u64) -> impl Future<Output = anyhow::Result<Vec<Event>>>;
    /// The outbox's epoch: seqs are comparable only within one.
    fn epoch(&self) -> impl Future<Output = anyhow::Result<String>>;
}

impl EventSource for super::client::AgentClient {
    fn events(&self, after: u64, limit: u64) -> impl Future<Output = anyhow::Result<Vec<Event>>> {
        super::client::AgentClient::events(self, after, limit)
    }

    async fn epoch(&self) -> anyhow::Result<String> {
        Ok(self.status().await?.outbox.epoch)
    }
}

/// Where the follower is in the agent's outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub epoch: String,
    /// The last seq seen (at the start: the outbox's last before the task
    /// was registered).
    pub after: u64,
}

/// `fut`, or an error once [`REQUEST_TIMEOUT`] has passed.
async fn bounded<T>(fut: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(REQUEST_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}")))
}

/// Follows the events after `cursor` for ever, calling `warn(eta)` when
/// the policy says so. Polls every [`POLL_INTERVAL`] (at once again when a
/// page came back full); while the agent does not answer, says so once on
/// stderr and retries with a doubling pause up to [`MAX_BACKOFF`]. Back,
/// the agent may have a new outbox (a corrupt one set aside): its epoch is
/// checked first, and in a new one every event is new.
pub(crate) async fn follow(
    source: &impl EventSource,
    mut policy: WarnPolicy,
    mut cursor: Cursor,
    mut warn: impl FnMut(f64),
) -> Infallible {
    let mut backoff = POLL_INTERVAL;
    let mut down = false;
    loop {
        let answer = async {
            if down {
                let epoch = bounded(source.epoch()).await?;
                if epoch != cursor.epoch {
                    cursor = Cursor { epoch, after: 0 };
                }
            }
            bounded(source.events(cursor.after, PAGE)).await
        }
        .await;
        let pause = match answer {
            Ok(page) => {
                if down {
                    eprintln!("memwatch: following the agent's events again");
                    down = false;
                }
                backoff = POLL_INTERVAL;
                let full = page.len() as u64 >= PAGE;
                for event in &page {
                    cursor.after = cursor.after.max(event.seq);
                    if let Some(eta) = policy.on_event(event) {
                        warn(eta);
                    }
                }
                if full { Duration::ZERO } else { POLL_INTERVAL }
            }
            Err(error) => {
                if !down {
                    eprintln!(
                        "memwatch: cannot follow the agent's events ({error:#}); the task runs \
                         on, retrying"
                    );
                    down = true;
                }
                let pause = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                pause
            }
        };
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests;
