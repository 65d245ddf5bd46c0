//! The NATS JetStream sink: each event is published as its JSON on the
//! configured subject with the header `Nats-Msg-Id: <event id>`, and the
//! cursor moves only once JetStream has acknowledged (stored) it.
//!
//! JetStream drops a message whose id it has seen within the stream's
//! duplicate window, so an event sent again after a lost acknowledgement is
//! stored once. The stream is created (file storage, the server's default
//! duplicate window of 2 minutes) when it does not exist.

mod config;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use tracing::info;

pub use self::config::NatsConfig;
use crate::{
    model::event::Event,
    sinks::{
        SinkContext, Start, Started,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
    },
};

impl Start for NatsConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        info!(sink = %self.name, url = %self.url, stream = %self.stream, subject = %self.subject, "NATS JetStream sink");
        Ok(Started::tasks(vec![
            ctx.spawn_delivery(NatsSink::new(self.clone())),
        ]))
    }
}

pub struct NatsSink {
    config: NatsConfig,
    /// Connected lazily, and again after a failure to connect; once
    /// connected, the client reconnects by itself.
    jetstream: Option<jetstream::Context>,
}

impl NatsSink {
    pub fn new(config: NatsConfig) -> Self {
        Self {
            config,
            jetstream: None,
        }
    }

    async fn connect(&mut self) -> Result<jetstream::Context, SendError> {
        if let Some(js) = &self.jetstream {
            return Ok(js.clone());
        }
        let d = &self.config.delivery;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(d.connect_timeout)
            .request_timeout(Some(d.timeout))
            .name(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
            .connect(self.config.url.as_str())
            .await
            .map_err(|e| {
                SendError::new(
                    FailureClass::Connect,
                    format!("connecting to {}: {e}", self.config.url),
                )
            })?;
        let mut js = jetstream::new(client);
        js.set_timeout(d.timeout);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: self.config.stream.clone(),
                subjects: vec![self.config.subject.clone()],
                ..Default::default()
            })
            .await
            .map_err(|e| {
                SendError::new(
                    FailureClass::Status,
                    format!("stream {}: {e}", self.config.stream),
                )
            })?;
        info!(
            sink = %self.config.name,
            url = %self.config.url,
            stream = %stream.cached_info().config.name,
            subject = %self.config.subject,
            "connected to NATS JetStream"
        );
        self.jetstream = Some(js.clone());
        Ok(js)
    }
}

impl Sink for NatsSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        let js = self.connect().await?;
        // Publish the whole batch, then wait for the acknowledgements in order.
        let mut acks = Vec::with_capacity(batch.len());
        for event in batch {
            let payload = serde_json::to_vec(event)
                .map_err(|e| SendError::new(FailureClass::Other, format!("encoding: {e}")))?;
            let publish = PublishMessage::build()
                .payload(payload.into())
                .message_id(event.id.as_str());
            let ack = js
                .send_publish(self.config.subject.clone(), publish)
                .await
                .map_err(|e| publish_error(&e))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await.map_err(|e| publish_error(&e))?;
        }
        Ok(())
    }
}

fn publish_error(error: &jetstream::context::PublishError) -> SendError {
    use jetstream::context::PublishErrorKind as Kind;
    let class = match error.kind() {
        Kind::TimedOut => FailureClass::Timeout,
        Kind::BrokenPipe => FailureClass::Connect,
        Kind::StreamNotFound | Kind::WrongLastMessageId | Kind::WrongLastSequence => {
            FailureClass::Status
        }
        _ => FailureClass::Other,
    };
    SendError::new(class, format!("publish: {error}"))
}
