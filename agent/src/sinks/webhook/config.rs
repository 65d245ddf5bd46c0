//! `[[webhook]]`: POST batches of events to a URL, optionally signed.

use serde::Deserialize;

use crate::sinks::config::{Delivery, InvalidKey, Secret, SinkTable, parse_url};

/// What a `POST` body is (`format = "memwatch" | "cloudevents"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WebhookFormat {
    /// A JSON array of memwatch events, `Content-Type: application/json`.
    #[default]
    Memwatch,
    /// CloudEvents 1.0, structured mode, batched: a JSON array of
    /// CloudEvents whose `data` is the memwatch event,
    /// `Content-Type: application/cloudevents-batch+json`.
    CloudEvents,
}

impl WebhookFormat {
    /// The values the `format` key takes.
    pub(crate) const NAMES: [&str; 2] = ["memwatch", "cloudevents"];

    fn parse(text: &str) -> Option<Self> {
        match text {
            "memwatch" => Some(Self::Memwatch),
            "cloudevents" => Some(Self::CloudEvents),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookConfig {
    /// Label on metrics and key of the sink's cursor: keep it stable.
    pub name: String,
    pub url: reqwest::Url,
    /// Signs each request the Standard Webhooks way (`webhook-signature:
    /// v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`). A
    /// `whsec_<base64>` secret is the base64-decoded bytes; any other
    /// string is its own bytes.
    pub secret: Option<Secret>,
    pub format: WebhookFormat,
    pub delivery: Delivery,
}

/// The keys of `[[webhook]]` besides the delivery keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookFile {
    url: String,
    name: Option<String>,
    secret: Option<Secret>,
    format: Option<String>,
}

impl WebhookConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let delivery = table.delivery(Delivery::default(), true)?;
        let file: WebhookFile = table.rest()?;
        if let Some(secret) = &file.secret {
            if secret.0.is_empty() {
                return Err(table.invalid("secret", "must not be empty"));
            }
            super::signing_key(secret).map_err(|problem| table.invalid("secret", problem))?;
        }
        let format = match file.format.as_deref() {
            None => WebhookFormat::default(),
            Some(text) => WebhookFormat::parse(text).ok_or_else(|| {
                table.invalid(
                    "format",
                    format!(
                        "is `{text}`: must be one of {}",
                        WebhookFormat::NAMES.map(|n| format!("\"{n}\"")).join(", ")
                    ),
                )
            })?,
        };
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            url: table.url("url", &file.url)?,
            secret: file.secret,
            format,
            delivery,
        })
    }

    /// A webhook with the default settings (the `--webhook URL` flag).
    pub fn from_flag(index: usize, url: &str) -> Result<Self, InvalidKey> {
        Ok(Self {
            name: format!("webhook-{}", index + 1),
            url: parse_url("--webhook", url)?,
            secret: None,
            format: WebhookFormat::default(),
            delivery: Delivery::default(),
        })
    }
}
