//! `[[webhook]]` and `[[nats]]`: where events are shipped, and how hard to try.

use std::{fmt, time::Duration};

use serde::Deserialize;

use super::{ConfigError, duration, invalid};

/// Events per webhook POST (a JSON array) or per NATS round.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// The largest batch accepted.
pub const MAX_BATCH_SIZE: usize = 1000;
/// Time allowed to open a connection to a sink.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for a whole request (webhook) or a publish acknowledgement (NATS).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause after a failed attempt; doubled (with jitter) up to `retry_max`.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(60);
/// JetStream subject and stream used when none is configured.
pub const DEFAULT_NATS_SUBJECT: &str = "memwatch.events";
pub const DEFAULT_NATS_STREAM: &str = "MEMWATCH";

/// A shared secret: never printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Timeouts and backoff of one sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub batch_size: usize,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            retry_initial: DEFAULT_RETRY_INITIAL,
            retry_max: DEFAULT_RETRY_MAX,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Label on metrics and key of the sink's cursor: keep it stable.
    pub name: String,
    pub url: reqwest::Url,
    /// Signs each body: `X-Memwatch-Signature: sha256=<hex HMAC-SHA256>`.
    pub secret: Option<Secret>,
    pub delivery: Delivery,
}

impl WebhookConfig {
    /// A webhook with the default settings (the `--webhook URL` flag).
    pub fn from_flag(index: usize, url: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            name: default_name("webhook", index),
            url: parse_url("--webhook", url)?,
            secret: None,
            delivery: Delivery::default(),
        })
    }
}

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

/// Keys shared by every sink table (serde's `flatten` would lose
/// `deny_unknown_fields`, so each table repeats them).
#[derive(Debug, Default)]
pub(super) struct DeliveryFile {
    pub batch_size: Option<usize>,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub retry_initial: Option<String>,
    pub retry_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFile {
    pub url: String,
    pub name: Option<String>,
    pub secret: Option<Secret>,
    pub batch_size: Option<usize>,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub retry_initial: Option<String>,
    pub retry_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsFile {
    pub url: String,
    pub name: Option<String>,
    pub subject: Option<String>,
    pub stream: Option<String>,
    pub batch_size: Option<usize>,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub retry_initial: Option<String>,
    pub retry_max: Option<String>,
}

macro_rules! delivery_file {
    ($file:expr) => {
        DeliveryFile {
            batch_size: $file.batch_size,
            connect_timeout: $file.connect_timeout,
            timeout: $file.timeout,
            retry_initial: $file.retry_initial,
            retry_max: $file.retry_max,
        }
    };
}

impl WebhookFile {
    pub fn resolve(self, index: usize) -> Result<WebhookConfig, ConfigError> {
        let key = |k: &str| format!("webhook[{index}].{k}");
        if self.secret.as_ref().is_some_and(|s| s.0.is_empty()) {
            return Err(invalid(key("secret"), "must not be empty"));
        }
        let delivery = delivery_file!(self).resolve(&key(""))?;
        Ok(WebhookConfig {
            name: self.name.unwrap_or_else(|| default_name("webhook", index)),
            url: parse_url(&key("url"), &self.url)?,
            secret: self.secret,
            delivery,
        })
    }
}

impl NatsFile {
    pub fn resolve(self, index: usize) -> Result<NatsConfig, ConfigError> {
        let key = |k: &str| format!("nats[{index}].{k}");
        if self.url.trim().is_empty() {
            return Err(invalid(key("url"), "must not be empty"));
        }
        let subject = self.subject.unwrap_or_else(|| DEFAULT_NATS_SUBJECT.into());
        if subject.is_empty() || subject.contains(['*', '>', ' ']) {
            return Err(invalid(
                key("subject"),
                format!("must be a plain subject without wildcards, got {subject:?}"),
            ));
        }
        let stream = self.stream.unwrap_or_else(|| DEFAULT_NATS_STREAM.into());
        if stream.is_empty() || stream.contains(['.', '*', '>', ' ', '/', '\\']) {
            return Err(invalid(
                key("stream"),
                format!("is not a valid stream name: {stream:?}"),
            ));
        }
        let delivery = delivery_file!(self).resolve(&key(""))?;
        Ok(NatsConfig {
            name: self.name.unwrap_or_else(|| default_name("nats", index)),
            url: self.url,
            subject,
            stream,
            delivery,
        })
    }
}

impl DeliveryFile {
    /// `prefix` is e.g. `webhook[0].`, to name the key in errors.
    pub(super) fn resolve(self, prefix: &str) -> Result<Delivery, ConfigError> {
        let d = Delivery::default();
        let dur = |name: &str, v: Option<String>, default| -> Result<Duration, ConfigError> {
            match v {
                Some(text) => {
                    let value = duration(format!("{prefix}{name}"), &text)?;
                    if value.is_zero() {
                        return Err(invalid(format!("{prefix}{name}"), "must be more than 0"));
                    }
                    Ok(value)
                }
                None => Ok(default),
            }
        };
        let delivery = Delivery {
            batch_size: self.batch_size.unwrap_or(d.batch_size),
            connect_timeout: dur("connect_timeout", self.connect_timeout, d.connect_timeout)?,
            timeout: dur("timeout", self.timeout, d.timeout)?,
            retry_initial: dur("retry_initial", self.retry_initial, d.retry_initial)?,
            retry_max: dur("retry_max", self.retry_max, d.retry_max)?,
        };
        if !(1..=MAX_BATCH_SIZE).contains(&delivery.batch_size) {
            return Err(invalid(
                format!("{prefix}batch_size"),
                format!(
                    "must be between 1 and {MAX_BATCH_SIZE}, got {}",
                    delivery.batch_size
                ),
            ));
        }
        if delivery.retry_max < delivery.retry_initial {
            return Err(invalid(
                format!("{prefix}retry_max"),
                "must not be less than retry_initial",
            ));
        }
        Ok(delivery)
    }
}

pub(super) fn default_name(kind: &str, index: usize) -> String {
    format!("{kind}-{}", index + 1)
}

pub(super) fn parse_url(key: &str, text: &str) -> Result<reqwest::Url, ConfigError> {
    let url = reqwest::Url::parse(text).map_err(|e| {
        invalid(
            key.to_string(),
            format!("is not a valid URL ({e}): {text:?}"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(
            key.to_string(),
            format!("must be an http or https URL, got {text:?}"),
        ));
    }
    Ok(url)
}
