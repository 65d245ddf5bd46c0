//! The webhook sink: `POST` of a JSON array of events, oldest first.
//!
//! Headers: `Content-Type: application/json`; [`EVENT_ID_HEADER`] with the
//! id of the batch's first event (a receiver that takes one event per
//! request can dedupe on it alone); and, when a secret is configured,
//! [`SIGNATURE_HEADER`] `sha256=<hex HMAC-SHA256 of the body, keyed by the
//! secret>`. Any 2xx acknowledges the whole batch.

mod config;

use anyhow::Context as _;
use hmac::{Hmac, KeyInit as _, Mac as _};
use reqwest::header::CONTENT_TYPE;
use sha2::Sha256;
use tokio::task::JoinHandle;
use tracing::info;

pub use self::config::WebhookConfig;
use crate::{
    model::event::Event,
    sinks::{
        SinkContext, Start,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
    },
};

/// Id of the first event of the batch.
pub const EVENT_ID_HEADER: &str = "X-Memwatch-Event-Id";
/// `sha256=<hex>`: HMAC-SHA256 of the exact body bytes.
pub const SIGNATURE_HEADER: &str = "X-Memwatch-Signature";

pub struct WebhookSink {
    config: WebhookConfig,
    client: reqwest::Client,
}

impl WebhookSink {
    pub fn new(config: WebhookConfig) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.delivery.connect_timeout)
            .timeout(config.delivery.timeout)
            // A redirect is not an acknowledgement (and would turn the POST into a GET).
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { config, client })
    }
}

impl Start for WebhookConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Vec<JoinHandle<()>>> {
        info!(sink = %self.name, url = %self.url, signed = self.secret.is_some(), "webhook sink");
        let sink = WebhookSink::new(self.clone())
            .with_context(|| format!("webhook sink {}", self.name))?;
        Ok(vec![ctx.spawn_delivery(sink)])
    }
}

/// The value of [`SIGNATURE_HEADER`] for `body`.
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

impl Sink for WebhookSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        let body = serde_json::to_vec(batch)
            .map_err(|e| SendError::new(FailureClass::Other, format!("encoding events: {e}")))?;
        let mut request = self
            .client
            .post(self.config.url.clone())
            .header(CONTENT_TYPE, "application/json");
        if let Some(first) = batch.first() {
            request = request.header(EVENT_ID_HEADER, &first.id);
        }
        if let Some(secret) = &self.config.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret.0.as_bytes(), &body));
        }
        let response = request.body(body).send().await.map_err(classify)?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        // 4xx but 408 (timeout) and 429 (slow down): this request will
        // never be taken (too large, malformed); sending it again is no use.
        let refused = status.is_client_error()
            && status != reqwest::StatusCode::REQUEST_TIMEOUT
            && status != reqwest::StatusCode::TOO_MANY_REQUESTS;
        let class = if refused {
            FailureClass::Refused
        } else {
            FailureClass::Status
        };
        Err(SendError::new(
            class,
            format!("{} answered {status}", self.config.url),
        ))
    }
}

pub(super) fn classify(error: reqwest::Error) -> SendError {
    let class = if error.is_timeout() {
        FailureClass::Timeout
    } else if error.is_connect() {
        FailureClass::Connect
    } else {
        FailureClass::Other
    };
    // The source chain says why (refused, reset, …); Display alone does not.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    SendError::new(class, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_rfc_4231_test_case_2() {
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
