//! What every sink's configuration shares: the delivery keys (batch size,
//! timeouts, backoff), secrets, and reading one `[[<sink>]]` table of the
//! config file so that errors name the key (`webhook[0].timeout`).
//!
//! The delivery keys are read here once for every sink: a sink's own keys
//! are the rest of its table, read into its own type with
//! `deny_unknown_fields` (serde's `flatten` would lose that).

use std::{fmt, time::Duration};

use serde::{Deserialize, de::DeserializeOwned};

/// Events per webhook POST (a JSON array) or per NATS round.
pub(crate) const DEFAULT_BATCH_SIZE: usize = 100;
/// The largest batch accepted.
pub(crate) const MAX_BATCH_SIZE: usize = 1000;
/// Bytes of event JSON per batch: below the common server limits (NATS'
/// default `max_payload` and nginx's `client_max_body_size` are 1 MiB).
pub(crate) const DEFAULT_BATCH_BYTES: usize = 512 << 10;
/// The smallest byte bound accepted (a batch holds one event at least,
/// whatever its size).
pub(crate) const MIN_BATCH_BYTES: usize = 1 << 10;
/// Time allowed to open a connection to a sink.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for a whole request (webhook) or a publish acknowledgement (NATS).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// First pause after a failed attempt; doubled (with jitter) up to `retry_max`.
pub(crate) const DEFAULT_RETRY_INITIAL: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(60);

/// The keys every sink table takes besides its own (`connect_timeout` only
/// where the sink opens a connection). docs/configuration.md lists them
/// under each sink (tests/ops/docs.rs checks it).
pub(crate) const DELIVERY_KEYS: [&str; 6] = [
    "batch_size",
    "batch_bytes",
    "connect_timeout",
    "timeout",
    "retry_initial",
    "retry_max",
];

/// A key of the configuration with a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: `{key}` {problem}")]
pub struct InvalidKey {
    pub key: String,
    pub problem: String,
}

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
    /// Bytes of event JSON per batch (an event larger than this goes alone).
    pub batch_bytes: usize,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            batch_bytes: DEFAULT_BATCH_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            retry_initial: DEFAULT_RETRY_INITIAL,
            retry_max: DEFAULT_RETRY_MAX,
        }
    }
}

/// One `[[<kind>]]` table of the config file (or the one `[<kind>]` table
/// of a sink there is one of: `[kubernetes]`), being read.
#[derive(Debug)]
pub struct SinkTable {
    kind: &'static str,
    /// `None` for a single `[kind]` table.
    index: Option<usize>,
    table: toml::Table,
}

impl SinkTable {
    pub fn new(kind: &'static str, index: usize, table: toml::Table) -> Self {
        Self {
            kind,
            index: Some(index),
            table,
        }
    }

    /// The one `[kind]` table: its keys are named `kind.key`.
    pub fn single(kind: &'static str, table: toml::Table) -> Self {
        Self {
            kind,
            index: None,
            table,
        }
    }

    /// The table as errors name it: `webhook[0]`, `kubernetes`.
    fn path(&self) -> String {
        match self.index {
            Some(index) => format!("{}[{index}]", self.kind),
            None => self.kind.to_string(),
        }
    }

    /// A key of this table as errors name it: `webhook[0].url`.
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.path())
    }

    /// The name a sink gets when its table gives none: `webhook-1`, …
    /// (`kubernetes` for a single table).
    pub fn default_name(&self) -> String {
        match self.index {
            Some(index) => format!("{}-{}", self.kind, index + 1),
            None => self.kind.to_string(),
        }
    }

    pub fn invalid(&self, name: &str, problem: impl Into<String>) -> InvalidKey {
        InvalidKey {
            key: self.key(name),
            problem: problem.into(),
        }
    }

    /// Takes the delivery keys out of the table, `defaults` for those not
    /// written. A sink that opens no connection (`connects` false) has no
    /// `connect_timeout`: the key stays in the table and is unknown there.
    pub fn delivery(&mut self, defaults: Delivery, connects: bool) -> Result<Delivery, InvalidKey> {
        let [
            batch_key,
            bytes_key,
            connect_key,
            timeout_key,
            initial_key,
            max_key,
        ] = DELIVERY_KEYS;
        let batch_size = match self.table.remove(batch_key) {
            Some(value) => value
                .as_integer()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    self.invalid("batch_size", format!("must be a number, got {value}"))
                })?,
            None => defaults.batch_size,
        };
        let batch_bytes = match self.table.remove(bytes_key) {
            Some(value) => {
                let size: crate::model::units::Size =
                    value.clone().try_into().map_err(|e: toml::de::Error| {
                        self.invalid(bytes_key, e.message().to_string())
                    })?;
                usize::try_from(size.0).unwrap_or(usize::MAX)
            }
            None => defaults.batch_bytes,
        };
        if batch_bytes < MIN_BATCH_BYTES {
            return Err(self.invalid(
                bytes_key,
                format!("must be at least {MIN_BATCH_BYTES} bytes, got {batch_bytes}"),
            ));
        }
        let delivery = Delivery {
            batch_size,
            batch_bytes,
            connect_timeout: if connects {
                self.take_duration(connect_key, defaults.connect_timeout)?
            } else {
                defaults.connect_timeout
            },
            timeout: self.take_duration(timeout_key, defaults.timeout)?,
            retry_initial: self.take_duration(initial_key, defaults.retry_initial)?,
            retry_max: self.take_duration(max_key, defaults.retry_max)?,
        };
        if !(1..=MAX_BATCH_SIZE).contains(&delivery.batch_size) {
            return Err(self.invalid(
                batch_key,
                format!(
                    "must be between 1 and {MAX_BATCH_SIZE}, got {}",
                    delivery.batch_size
                ),
            ));
        }
        if delivery.retry_max < delivery.retry_initial {
            return Err(self.invalid(max_key, "must not be less than retry_initial"));
        }
        Ok(delivery)
    }

    fn take_duration(&mut self, name: &str, default: Duration) -> Result<Duration, InvalidKey> {
        let Some(value) = self.table.remove(name) else {
            return Ok(default);
        };
        let text = value.as_str().ok_or_else(|| {
            self.invalid(
                name,
                format!("must be a duration such as \"5s\", got {value}"),
            )
        })?;
        let duration = self.duration(name, text)?;
        if duration.is_zero() {
            return Err(self.invalid(name, "must be more than 0"));
        }
        Ok(duration)
    }

    /// The rest of the table as the sink's own keys (`T` denies unknown
    /// fields: the error names the table).
    pub fn rest<T: DeserializeOwned>(&self) -> Result<T, InvalidKey> {
        T::deserialize(toml::Value::Table(self.table.clone())).map_err(|e| InvalidKey {
            key: self.path(),
            problem: e.to_string().trim_end().to_string(),
        })
    }

    pub fn duration(&self, name: &str, text: &str) -> Result<Duration, InvalidKey> {
        humantime::parse_duration(text).map_err(|e| {
            self.invalid(
                name,
                format!("is not a duration ({e}): {text:?}; write e.g. 500ms, 10s, 2m"),
            )
        })
    }

    /// An http or https URL.
    pub fn url(&self, name: &str, text: &str) -> Result<reqwest::Url, InvalidKey> {
        parse_url(&self.key(name), text)
    }
}

/// An http or https URL; `key` names it in the error.
pub(crate) fn parse_url(key: &str, text: &str) -> Result<reqwest::Url, InvalidKey> {
    let invalid = |problem: String| InvalidKey {
        key: key.to_string(),
        problem,
    };
    let url = reqwest::Url::parse(text)
        .map_err(|e| invalid(format!("is not a valid URL ({e}): {text:?}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "must be an http or https URL, got {text:?}"
        )));
    }
    Ok(url)
}

/// Reads `text` as the `index`th `[[kind]]` table (tests of each sink's config).
#[cfg(test)]
pub(crate) fn table(kind: &'static str, text: &str) -> SinkTable {
    SinkTable::new(kind, 0, toml::from_str(text).expect("a TOML table"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_takes_exactly_the_delivery_keys() {
        let text: String = DELIVERY_KEYS
            .iter()
            .map(|k| match *k {
                "batch_size" => format!("{k} = 10\n"),
                "batch_bytes" => format!("{k} = \"64KiB\"\n"),
                _ => format!("{k} = \"1s\"\n"),
            })
            .collect();
        let mut t = table("x", &text);
        t.delivery(Delivery::default(), true).unwrap();
        assert!(t.table.is_empty(), "left over: {:?}", t.table);
    }

    #[test]
    fn delivery_keys_are_read_once_with_the_sinks_defaults() {
        let mut t = table("x", "batch_size = 7\ntimeout = \"3s\"\nown = 1\n");
        let defaults = Delivery {
            timeout: Duration::from_secs(60),
            ..Delivery::default()
        };
        let d = t.delivery(defaults, true).unwrap();
        assert_eq!(d.batch_size, 7);
        assert_eq!(d.timeout, Duration::from_secs(3));
        assert_eq!(d.retry_max, DEFAULT_RETRY_MAX);
        assert_eq!(t.table.keys().collect::<Vec<_>>(), ["own"], "own keys stay");
        let mut t = table("x", "batch_bytes = \"1MiB\"");
        assert_eq!(
            t.delivery(Delivery::default(), true).unwrap().batch_bytes,
            1 << 20
        );
        let mut t = table("x", "batch_bytes = 100");
        let e = t.delivery(Delivery::default(), true).unwrap_err();
        assert_eq!(e.key, "x[0].batch_bytes");
        let mut t = table("x", "timeout = \"0s\"");
        let e = t.delivery(Delivery::default(), true).unwrap_err();
        assert_eq!(e.key, "x[0].timeout");
        let mut t = table("x", "batch_size = 5000");
        assert_eq!(
            t.delivery(Delivery::default(), true).unwrap_err().key,
            "x[0].batch_size"
        );
        let mut t = table("x", "retry_initial = \"10s\"\nretry_max = \"1s\"");
        assert_eq!(
            t.delivery(Delivery::default(), true).unwrap_err().key,
            "x[0].retry_max"
        );
        let mut t = table("x", "connect_timeout = \"1s\"");
        t.delivery(Delivery::default(), false).unwrap();
        assert!(
            t.table.contains_key("connect_timeout"),
            "left to be unknown"
        );
    }
}
