//! `[[nats]]`: publish each event to a JetStream subject.

use serde::Deserialize;

use crate::sinks::config::{Delivery, InvalidKey, SinkTable};

/// JetStream subject and stream used when none is configured.
pub(crate) const DEFAULT_NATS_SUBJECT: &str = "memwatch.events";
pub(crate) const DEFAULT_NATS_STREAM: &str = "MEMWATCH";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsConfig {
    pub name: String,
    /// Server address, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    pub subject: String,
    /// The JetStream stream that takes `subject` (created when missing).
    pub stream: String,
    pub delivery: Delivery,
}

/// The keys of `[[nats]]` besides the delivery keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NatsFile {
    url: String,
    name: Option<String>,
    subject: Option<String>,
    stream: Option<String>,
}

impl NatsConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let delivery = table.delivery(Delivery::default(), true)?;
        let file: NatsFile = table.rest()?;
        if file.url.trim().is_empty() {
            return Err(table.invalid("url", "must not be empty"));
        }
        let subject = file.subject.unwrap_or_else(|| DEFAULT_NATS_SUBJECT.into());
        if subject.is_empty() || subject.contains(['*', '>', ' ']) {
            return Err(table.invalid(
                "subject",
                format!("must be a plain subject without wildcards, got {subject:?}"),
            ));
        }
        let stream = file.stream.unwrap_or_else(|| DEFAULT_NATS_STREAM.into());
        if stream.is_empty() || stream.contains(['.', '*', '>', ' ', '/', '\\']) {
            return Err(table.invalid("stream", format!("is not a valid stream name: {stream:?}")));
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            url: file.url,
            subject,
            stream,
            delivery,
        })
    }
}
