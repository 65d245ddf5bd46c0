//! `[[webhook]]`: POST batches of events to a URL, optionally signed.

use serde::Deserialize;

use crate::sinks::config::{Delivery, InvalidKey, Secret, SinkTable, parse_url};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Label on metrics and key of the sink's cursor: keep it stable.
    pub name: String,
    pub url: reqwest::Url,
    /// Signs each body: `X-Memwatch-Signature: sha256=<hex HMAC-SHA256>`.
    pub secret: Option<Secret>,
    pub delivery: Delivery,
}

/// The keys of `[[webhook]]` besides the delivery keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookFile {
    url: String,
    name: Option<String>,
    secret: Option<Secret>,
}

impl WebhookConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let delivery = table.delivery(Delivery::default(), true)?;
        let file: WebhookFile = table.rest()?;
        if file.secret.as_ref().is_some_and(|s| s.0.is_empty()) {
            return Err(table.invalid("secret", "must not be empty"));
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            url: table.url("url", &file.url)?,
            secret: file.secret,
            delivery,
        })
    }

    /// A webhook with the default settings (the `--webhook URL` flag).
    pub fn from_flag(index: usize, url: &str) -> Result<Self, InvalidKey> {
        Ok(Self {
            name: format!("webhook-{}", index + 1),
            url: parse_url("--webhook", url)?,
            secret: None,
            delivery: Delivery::default(),
        })
    }
}
