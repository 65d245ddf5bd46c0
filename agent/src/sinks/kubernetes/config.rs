//! `[kubernetes] api = true`: what the Kubernetes sink is told. The keys
//! live in the one `[kubernetes]` table with the pod-task keys
//! (config/kubernetes.rs takes those out and hands the rest here, through
//! the registry's `SinkConfig::from_single`).

use std::path::PathBuf;

use serde::Deserialize;

use crate::sinks::{
    config::{Delivery, InvalidKey, SinkTable, parse_url},
    guard::Guard,
};

/// The in-cluster service-account token (kubelet rotates it; kube-rs reads
/// the file again before it expires).
pub(crate) const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The in-cluster CA of the API server.
pub(crate) const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The Kubernetes sink's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesSinkConfig {
    /// `https://…` of the API server; `None`: in the pod, from
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    pub api_server: Option<String>,
    pub token_file: PathBuf,
    /// `None` with a plain-http loopback `api_server` (tests).
    pub ca_file: Option<PathBuf>,
    /// The `MemwatchUnhealthy` NodeCondition.
    pub condition: bool,
    /// The `memwatch.io/unhealthy:NoSchedule` taint, under `guard`.
    pub taint: bool,
    /// events.k8s.io/v1 Events.
    pub events: bool,
    /// Watch the node's pods to name them on events.
    pub pod_names: bool,
    /// Nodes that must stay schedulable (for `taint`).
    pub guard: Guard,
    pub delivery: Delivery,
}

/// The sink's keys of `[kubernetes]` besides the delivery keys (the
/// pod-task keys are taken out before: config/kubernetes.rs).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiKeys {
    /// Turns the sink on.
    pub api: Option<bool>,
    pub api_server: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub condition: Option<bool>,
    pub taint: Option<bool>,
    pub events: Option<bool>,
    pub pod_names: Option<bool>,
    pub min_remaining: Option<usize>,
    pub min_remaining_fraction: Option<f64>,
}

impl ApiKeys {
    /// The keys written, as the file names them (`api` aside).
    pub(crate) fn written(&self) -> Vec<&'static str> {
        [
            ("api_server", self.api_server.is_some()),
            ("token_file", self.token_file.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("condition", self.condition.is_some()),
            ("taint", self.taint.is_some()),
            ("events", self.events.is_some()),
            ("pod_names", self.pod_names.is_some()),
            ("min_remaining", self.min_remaining.is_some()),
            (
                "min_remaining_fraction",
                self.min_remaining_fraction.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(key, written)| written.then_some(key))
        .collect()
    }
}

impl KubernetesSinkConfig {
    /// The sink of `[kubernetes]` when `api = true`, `None` when it is not.
    /// A key of the API (or a delivery key) written while `api` is off is
    /// an error naming it: it would do nothing.
    pub(crate) fn from_single(mut table: SinkTable) -> Result<Option<Self>, InvalidKey> {
        let delivery = table.delivery(Delivery::default(), true)?;
        let written_delivery = delivery != Delivery::default();
        let keys: ApiKeys = table.rest()?;
        if !keys.api.unwrap_or(false) {
            return match keys
                .written()
                .first()
                .copied()
                .or(written_delivery.then_some("timeout"))
            {
                Some(key) => Err(table.invalid(
                    key,
                    "needs `api = true` (the agent talks to the Kubernetes API only then)",
                )),
                None => Ok(None),
            };
        }
        Self::from_keys(&table, delivery, keys).map(Some)
    }

    /// The sink of `[kubernetes]`, from its keys (`table` has had its
    /// delivery keys read already: `delivery`).
    fn from_keys(table: &SinkTable, delivery: Delivery, keys: ApiKeys) -> Result<Self, InvalidKey> {
        let guard = Guard::from_keys(table, keys.min_remaining, keys.min_remaining_fraction)?;
        let api_server = match keys.api_server {
            Some(text) => {
                let url = parse_url(&table.key("api_server"), &text)?;
                let loopback = url
                    .host_str()
                    .is_some_and(|h| h == "localhost" || h == "[::1]" || h.starts_with("127."));
                if url.scheme() == "http" && !loopback {
                    return Err(table.invalid(
                        "api_server",
                        format!("must be https:// (plain http only to loopback), got {text:?}"),
                    ));
                }
                Some(text.trim_end_matches('/').to_string())
            }
            None => None,
        };
        let plain = api_server
            .as_deref()
            .is_some_and(|u| u.starts_with("http:"));
        let ca_file = match keys.ca_file {
            Some(path) => Some(path),
            None if plain => None,
            None => Some(PathBuf::from(DEFAULT_CA_FILE)),
        };
        Ok(Self {
            api_server,
            token_file: keys
                .token_file
                .unwrap_or_else(|| PathBuf::from(DEFAULT_TOKEN_FILE)),
            ca_file,
            condition: keys.condition.unwrap_or(true),
            taint: keys.taint.unwrap_or(false),
            events: keys.events.unwrap_or(true),
            pod_names: keys.pod_names.unwrap_or(true),
            guard,
            delivery,
        })
    }
}
