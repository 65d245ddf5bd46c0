//! `[[dask]]`: retire the Dask worker of an unhealthy memwatch worker, within
//! the cluster guard.

use std::time::Duration;

use serde::Deserialize;

use crate::sinks::{
    config::{Delivery, InvalidKey, SinkTable},
    guard::Guard,
};

/// How often the Dask worker ↔ memwatch worker map is refreshed.
pub(super) const DEFAULT_DASK_REFRESH: Duration = Duration::from_secs(2);
/// `retire_workers` moves a worker's data before answering: give it time.
pub(super) const DEFAULT_DASK_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq)]
pub struct DaskConfig {
    pub name: String,
    /// The scheduler's HTTP address (its dashboard port), e.g. `http://127.0.0.1:8787`.
    pub url: reqwest::Url,
    /// The cluster guard: workers that must stay (`min_remaining`,
    /// `min_remaining_fraction`).
    pub guard: Guard,
    /// Period of the worker map refresh (it names Dask addresses in `oom_kill` events).
    pub refresh_interval: Duration,
    /// Retire a worker's Dask workers when its OOM kill is predicted
    /// (`oom_imminent`), so their data move while they still can; on by
    /// default.
    pub retire_imminent: bool,
    pub delivery: Delivery,
}

/// The keys of `[[dask]]` besides the delivery keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaskFile {
    url: String,
    name: Option<String>,
    #[serde(alias = "min_workers")]
    min_remaining: Option<usize>,
    #[serde(alias = "min_fraction")]
    min_remaining_fraction: Option<f64>,
    refresh_interval: Option<String>,
    retire_imminent: Option<bool>,
}

impl DaskConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let defaults = Delivery {
            timeout: DEFAULT_DASK_TIMEOUT,
            ..Delivery::default()
        };
        let delivery = table.delivery(defaults, true)?;
        let file: DaskFile = table.rest()?;
        let guard = Guard::from_keys(&table, file.min_remaining, file.min_remaining_fraction)?;
        let refresh_interval = match file.refresh_interval {
            Some(text) => table.duration("refresh_interval", &text)?,
            None => DEFAULT_DASK_REFRESH,
        };
        if refresh_interval < Duration::from_millis(100) {
            return Err(table.invalid("refresh_interval", "must be at least 100ms"));
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            url: table.url("url", &file.url)?,
            guard,
            refresh_interval,
            retire_imminent: file.retire_imminent.unwrap_or(true),
            delivery,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::config::table;

    fn dask(text: &str) -> Result<DaskConfig, InvalidKey> {
        DaskConfig::from_table(table("dask", text))
    }

    #[test]
    fn dask_defaults_and_bad_values_name_the_key() {
        let d = dask("url = \"http://127.0.0.1:8787\"").unwrap();
        assert_eq!(d.name, "dask-1");
        assert_eq!(d.guard, Guard::default());
        assert_eq!(d.delivery.timeout, DEFAULT_DASK_TIMEOUT);
        let e = dask("url = \"http://x\"\nmin_remaining_fraction = 1.5").unwrap_err();
        assert!(
            e.to_string().contains("dask[0].min_remaining_fraction"),
            "{e}"
        );
        // The names from before the guard was shared still work.
        let d = dask("url = \"http://x\"\nmin_workers = 2\nmin_fraction = 0.25").unwrap();
        assert_eq!(
            (d.guard.min_remaining, d.guard.min_remaining_fraction),
            (2, 0.25)
        );
        let e = dask("url = \"tcp://x:8786\"").unwrap_err();
        assert!(e.to_string().contains("dask[0].url"), "{e}");
        let e = dask("url = \"http://x\"\nrefresh_interval = \"1ms\"").unwrap_err();
        assert!(e.to_string().contains("dask[0].refresh_interval"), "{e}");
    }
}
