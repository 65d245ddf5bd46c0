//! The webhook sink: `POST` of a batch of events, oldest first.
//!
//! The body is a JSON array of memwatch events (`format = "memwatch"`,
//! `Content-Type: application/json`) or of CloudEvents 1.0 in structured
//! mode (`format = "cloudevents"`, `Content-Type:
//! application/cloudevents-batch+json`; each CloudEvent's `data` is the
//! memwatch event). Headers, the Standard Webhooks way
//! (standardwebhooks.com): [`WEBHOOK_ID_HEADER`], the batch's id (the same
//! on every attempt to send the same batch), [`WEBHOOK_TIMESTAMP_HEADER`]
//! (unix seconds when sent) and, with a secret,
//! [`WEBHOOK_SIGNATURE_HEADER`] `v1,<base64 HMAC-SHA256 of
//! "{id}.{timestamp}.{body}">`. For one release more, also
//! [`EVENT_ID_HEADER`] (the first event's id) and, with a secret, the old
//! [`SIGNATURE_HEADER`] `sha256=<hex HMAC-SHA256 of the body>`. Any 2xx
//! acknowledges the whole batch.

mod config;

use anyhow::Context as _;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit as _, Mac as _};
use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use sha2::Sha256;
use tracing::info;

pub use self::config::{WebhookConfig, WebhookFormat};
use crate::{
    model::event::Event,
    sinks::{
        SinkContext, Start, Started,
        config::{Delivery, Secret},
        delivery::{FailureClass, SendError, Sink},
    },
};

/// The batch's id: `<first event id>` alone, or `<first>_<last>` (event
/// ids are unique, and a batch is sent again as it was until taken).
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
/// Unix seconds when the request was made (each attempt anew).
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// `v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">`.
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";
/// Id of the first event of the batch. Deprecated: [`WEBHOOK_ID_HEADER`];
/// sent for one release more.
pub const EVENT_ID_HEADER: &str = "X-Memwatch-Event-Id";
/// `sha256=<hex>`: HMAC-SHA256 of the exact body bytes. Deprecated:
/// [`WEBHOOK_SIGNATURE_HEADER`]; sent for one release more.
pub const SIGNATURE_HEADER: &str = "X-Memwatch-Signature";
/// The prefix of a Standard Webhooks secret: `whsec_<base64 of the key>`.
pub const SECRET_PREFIX: &str = "whsec_";

const CLOUDEVENTS_BATCH: &str = "application/cloudevents-batch+json";

pub struct WebhookSink {
    config: WebhookConfig,
    client: reqwest::Client,
    /// The HMAC key, from the secret.
    key: Option<Vec<u8>>,
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
        // The config checked a `whsec_` secret; one made in code that does
        // not decode is taken as its own bytes.
        let key = config
            .secret
            .as_ref()
            .map(|s| signing_key(s).unwrap_or_else(|_| s.0.as_bytes().to_vec()));
        Ok(Self {
            config,
            client,
            key,
        })
    }
}

impl Start for WebhookConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        info!(sink = %self.name, url = %self.url, signed = self.secret.is_some(), format = ?self.format, "webhook sink");
        let sink = WebhookSink::new(self.clone())
            .with_context(|| format!("webhook sink {}", self.name))?;
        Ok(Started::tasks(vec![ctx.spawn_delivery(sink)]))
    }
}

/// The HMAC key of `secret`: the base64-decoded bytes after `whsec_`
/// (padding optional), else the string's own bytes.
pub(crate) fn signing_key(secret: &Secret) -> Result<Vec<u8>, String> {
    let Some(encoded) = secret.0.strip_prefix(SECRET_PREFIX) else {
        return Ok(secret.0.as_bytes().to_vec());
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match engine.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        Ok(_) => Err(format!("is `{SECRET_PREFIX}` with an empty key")),
        Err(e) => Err(format!(
            "starts with `{SECRET_PREFIX}` but the rest is not base64 ({e})"
        )),
    }
}

/// The value of [`SIGNATURE_HEADER`] for `body` (deprecated).
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The value of [`WEBHOOK_SIGNATURE_HEADER`]: `v1,<base64 HMAC-SHA256 of
/// "{id}.{timestamp}.{body}">`.
pub(crate) fn standard_signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let mac = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    )
}

/// The value of [`WEBHOOK_ID_HEADER`] for `batch`.
pub(crate) fn batch_id(batch: &[Event]) -> String {
    match batch {
        [] => String::new(),
        [only] => only.id.clone(),
        [first, .., last] => format!("{}_{}", first.id, last.id),
    }
}

/// One event as a CloudEvent 1.0 (structured mode).
#[derive(Serialize)]
struct CloudEvent<'a> {
    specversion: &'static str,
    id: &'a str,
    source: String,
    #[serde(rename = "type")]
    kind: String,
    time: &'a DateTime<Utc>,
    datacontenttype: &'static str,
    data: &'a Event,
}

impl<'a> CloudEvent<'a> {
    fn of(event: &'a Event) -> Self {
        Self {
            specversion: "1.0",
            id: &event.id,
            source: format!("memwatch://{}", event.host),
            kind: format!("io.memwatch.{}", event.body.kind.as_str()),
            time: &event.time,
            datacontenttype: "application/json",
            data: event,
        }
    }
}

/// The body and its content type.
pub(crate) fn encode(
    format: WebhookFormat,
    batch: &[Event],
) -> serde_json::Result<(Vec<u8>, &'static str)> {
    match format {
        WebhookFormat::Memwatch => Ok((serde_json::to_vec(batch)?, "application/json")),
        WebhookFormat::CloudEvents => {
            let events: Vec<CloudEvent<'_>> = batch.iter().map(CloudEvent::of).collect();
            Ok((serde_json::to_vec(&events)?, CLOUDEVENTS_BATCH))
        }
    }
}

impl Sink for WebhookSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        let (body, content_type) = encode(self.config.format, batch)
            .map_err(|e| SendError::new(FailureClass::Other, format!("encoding events: {e}")))?;
        let id = batch_id(batch);
        let timestamp = Utc::now().timestamp();
        let mut request = self
            .client
            .post(self.config.url.clone())
            .header(CONTENT_TYPE, content_type)
            .header(WEBHOOK_ID_HEADER, &id)
            .header(WEBHOOK_TIMESTAMP_HEADER, timestamp.to_string());
        if let Some(first) = batch.first() {
            request = request.header(EVENT_ID_HEADER, &first.id);
        }
        if let Some(key) = &self.key {
            request = request
                .header(
                    WEBHOOK_SIGNATURE_HEADER,
                    standard_signature(key, &id, timestamp, &body),
                )
                .header(SIGNATURE_HEADER, signature(key, &body));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(SendError::from_reqwest)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{EventBody, EventKind};

    /// The example of the Standard Webhooks specification (its README and
    /// reference libraries): this secret, id, timestamp and payload sign to
    /// this signature.
    #[test]
    fn standard_signature_matches_the_specifications_example() {
        let key = signing_key(&Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into())).unwrap();
        assert_eq!(
            standard_signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// Independent of the example: the HMAC computed by hand over
    /// "{id}.{timestamp}.{body}" with a raw (not `whsec_`) secret.
    #[test]
    fn standard_signature_is_the_hmac_of_id_timestamp_and_body() {
        let key = signing_key(&Secret("plain secret".into())).unwrap();
        assert_eq!(key, b"plain secret");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"plain secret").unwrap();
        mac.update(b"a_b.1700000000.[1,2]");
        let expected =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        assert_eq!(
            standard_signature(&key, "a_b", 1_700_000_000, b"[1,2]"),
            format!("v1,{expected}")
        );
    }

    #[test]
    fn whsec_secrets_are_base64_with_or_without_padding() {
        // "key!" in base64 is "a2V5IQ==".
        for text in ["whsec_a2V5IQ==", "whsec_a2V5IQ"] {
            assert_eq!(signing_key(&Secret(text.into())).unwrap(), b"key!");
        }
        assert!(signing_key(&Secret("whsec_not base64!".into())).is_err());
        assert!(signing_key(&Secret("whsec_".into())).is_err());
    }

    fn event(seq: u64) -> Event {
        Event {
            id: format!("id{seq}"),
            seq,
            time: "2026-01-02T03:04:05.123Z".parse().unwrap(),
            host: "node-1".into(),
            epoch: None,
            body: EventBody::new(EventKind::OomKill),
        }
    }

    #[test]
    fn the_batch_id_names_its_first_and_last_events() {
        assert_eq!(batch_id(&[event(1)]), "id1");
        assert_eq!(batch_id(&[event(1), event(2), event(3)]), "id1_id3");
    }

    #[test]
    fn cloudevents_carry_the_event_as_data() {
        let (body, content_type) = encode(WebhookFormat::CloudEvents, &[event(7)]).unwrap();
        assert_eq!(content_type, "application/cloudevents-batch+json");
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let ce = &value[0];
        assert_eq!(ce["specversion"], "1.0");
        assert_eq!(ce["id"], "id7");
        assert_eq!(ce["source"], "memwatch://node-1");
        assert_eq!(ce["type"], "io.memwatch.oom_kill");
        assert_eq!(ce["time"], "2026-01-02T03:04:05.123Z");
        assert_eq!(ce["datacontenttype"], "application/json");
        assert_eq!(ce["data"], serde_json::to_value(event(7)).unwrap());
        let (body, content_type) = encode(WebhookFormat::Memwatch, &[event(7)]).unwrap();
        assert_eq!(content_type, "application/json");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            serde_json::json!([serde_json::to_value(event(7)).unwrap()])
        );
    }

    #[test]
    fn signature_matches_rfc_4231_test_case_2() {
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
