//! The OpenTelemetry sink: every event as an OTLP log record (records.rs
//! says how), exported to a receiver (an OpenTelemetry Collector) over
//! OTLP/gRPC (`LogsService/Export`) or OTLP/HTTP (`POST /v1/logs`, a
//! protobuf body), oldest first, the next batch only once the receiver took
//! the previous one (the delivery loop's guarantees).
//!
//! A batch is taken when the receiver answers OK (gRPC) or 2xx (HTTP). A
//! `partial_success` naming rejected records is taken too (the receiver
//! will not take those records again): logged and counted in
//! `memwatch_events_dropped_total{reason="rejected"}`. Retried with backoff,
//! the cursor held: no connection, gRPC UNAVAILABLE, RESOURCE_EXHAUSTED,
//! DEADLINE_EXCEEDED and every code but INVALID_ARGUMENT, HTTP 429, 5xx and
//! every 4xx but 400 and 413 (an authentication failure is fixed by an
//! operator; the events wait for it). Refused for good: INVALID_ARGUMENT,
//! 400 and 413: the batch is split down to the one event refused, which is
//! parked (as the webhook sink parks one).

mod config;
mod records;

use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse, logs_service_client::LogsServiceClient,
};
use prost::Message as _;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tonic::{
    Code,
    metadata::{MetadataKey, MetadataMap, MetadataValue},
    transport::{Channel, ClientTlsConfig, Endpoint},
};
use tracing::{info, warn};

pub use self::config::{OtlpConfig, OtlpProtocol};
use self::records::AgentResource;
use crate::{
    model::event::Event,
    sinks::{
        SinkContext, Start, Started,
        config::Delivery,
        delivery::{FailureClass, SendError, Sink},
    },
    telemetry::Metrics,
};

/// The content type of an OTLP/HTTP protobuf body.
const PROTOBUF: &str = "application/x-protobuf";
/// `memwatch_events_dropped_total`'s reason for records a receiver
/// rejected in a partial success.
const REJECTED: &str = "rejected";

impl Start for OtlpConfig {
    fn name(&self) -> &str {
        &self.name
    }

    fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started> {
        // Every pod is given this variable: the agent runs on Kubernetes,
        // and its node name is the node's.
        let on_kubernetes = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        info!(
            sink = %self.name,
            endpoint = %self.endpoint,
            protocol = ?self.protocol,
            headers = self.headers.len(),
            on_kubernetes,
            "OpenTelemetry (OTLP logs) sink"
        );
        let node = on_kubernetes.then(|| ctx.node_name.clone());
        let sink = OtlpSink::new(self.clone(), ctx.metrics.clone(), node)
            .map_err(|e| anyhow::anyhow!("OTLP sink {}: {e}", self.name))?;
        Ok(Started::tasks(vec![ctx.spawn_delivery(sink)]))
    }
}

pub struct OtlpSink {
    config: OtlpConfig,
    agent: AgentResource,
    metrics: Metrics,
    transport: Transport,
}

enum Transport {
    Grpc {
        /// Made at the first send (it needs the runtime); it reconnects
        /// by itself after a failure.
        client: Option<LogsServiceClient<Channel>>,
        metadata: MetadataMap,
    },
    Http {
        client: reqwest::Client,
        headers: HeaderMap,
    },
}

impl OtlpSink {
    /// The sink of `config`; `k8s_node_name`: the node's name when the
    /// agent runs on Kubernetes. An error when a header does not fit the
    /// protocol or the HTTP client cannot be made.
    pub fn new(
        config: OtlpConfig,
        metrics: Metrics,
        k8s_node_name: Option<String>,
    ) -> Result<Self, String> {
        let transport = match config.protocol {
            OtlpProtocol::Grpc => Transport::Grpc {
                client: None,
                metadata: metadata(&config)?,
            },
            OtlpProtocol::Http => Transport::Http {
                client: reqwest::Client::builder()
                    .connect_timeout(config.delivery.connect_timeout)
                    .timeout(config.delivery.timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .user_agent(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| format!("HTTP client: {e}"))?,
                headers: http_headers(&config)?,
            },
        };
        Ok(Self {
            agent: AgentResource {
                k8s_node_name,
                extra: config.resource.clone(),
            },
            config,
            metrics,
            transport,
        })
    }

    /// Takes a receiver's answer: OK, or OK but some records rejected.
    fn taken(&self, response: &ExportLogsServiceResponse, batch: &[Event]) {
        let Some(partial) = &response.partial_success else {
            return;
        };
        if partial.rejected_log_records <= 0 {
            return;
        }
        let rejected = u64::try_from(partial.rejected_log_records).unwrap_or(0);
        warn!(
            sink = %self.config.name,
            first_seq = batch[0].seq,
            last_seq = batch[batch.len() - 1].seq,
            rejected,
            message = %partial.error_message,
            "the OTLP receiver rejected records of a batch it took"
        );
        self.metrics
            .events_dropped
            .with_label_values(&[REJECTED])
            .inc_by(rejected);
    }
}

/// The configured headers as gRPC metadata.
fn metadata(config: &OtlpConfig) -> Result<MetadataMap, String> {
    let mut metadata = MetadataMap::new();
    for (name, value) in &config.headers {
        let key = MetadataKey::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name} is not a gRPC metadata key"))?;
        let value = MetadataValue::try_from(value.0.as_str())
            .map_err(|_| format!("the value of header {name} is not valid metadata"))?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// The configured headers as HTTP headers (marked sensitive).
fn http_headers(config: &OtlpConfig) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in &config.headers {
        let key = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name} is not an HTTP header name"))?;
        let mut value = HeaderValue::from_str(&value.0)
            .map_err(|_| format!("the value of header {name} is not a valid HTTP header value"))?;
        value.set_sensitive(true);
        headers.insert(key, value);
    }
    Ok(headers)
}

/// A channel to the gRPC endpoint: connected lazily, TLS (rustls, the
/// webpki roots) for https.
fn grpc_client(config: &OtlpConfig) -> Result<LogsServiceClient<Channel>, SendError> {
    let d = &config.delivery;
    let invalid = |e: tonic::transport::Error| {
        SendError::new(
            FailureClass::Other,
            format!("gRPC endpoint {}: {e}", config.endpoint),
        )
    };
    let mut endpoint = Endpoint::from_shared(config.endpoint.to_string())
        .map_err(invalid)?
        .connect_timeout(d.connect_timeout)
        .timeout(d.timeout)
        .user_agent(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
        .map_err(invalid)?;
    if config.endpoint.scheme() == "https" {
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().with_webpki_roots())
            .map_err(invalid)?;
    }
    Ok(LogsServiceClient::new(endpoint.connect_lazy()))
}

impl Sink for OtlpSink {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn delivery(&self) -> &Delivery {
        &self.config.delivery
    }

    async fn send(&mut self, batch: &[Event]) -> Result<(), SendError> {
        let request = records::request(batch, &self.agent);
        let response = match &mut self.transport {
            Transport::Grpc { client, metadata } => {
                let client = match client {
                    Some(client) => client,
                    None => client.insert(grpc_client(&self.config)?),
                };
                export_grpc(client, metadata, request, &self.config).await?
            }
            Transport::Http { client, headers } => {
                export_http(client, headers, &request, &self.config).await?
            }
        };
        self.taken(&response, batch);
        Ok(())
    }
}

async fn export_grpc(
    client: &mut LogsServiceClient<Channel>,
    metadata: &MetadataMap,
    request: ExportLogsServiceRequest,
    config: &OtlpConfig,
) -> Result<ExportLogsServiceResponse, SendError> {
    let mut request = tonic::Request::new(request);
    *request.metadata_mut() = metadata.clone();
    request.set_timeout(config.delivery.timeout);
    match client.export(request).await {
        Ok(response) => Ok(response.into_inner()),
        Err(status) => Err(grpc_error(&status, config)),
    }
}

/// A gRPC error status, classified: INVALID_ARGUMENT is refused for good;
/// the rest are retried (a connection that failed says so by its source).
pub(crate) fn grpc_error(status: &tonic::Status, config: &OtlpConfig) -> SendError {
    let connection_failed = std::error::Error::source(status).is_some();
    let class = match status.code() {
        Code::InvalidArgument => FailureClass::Refused,
        Code::DeadlineExceeded => FailureClass::Timeout,
        Code::Unavailable if connection_failed => FailureClass::Connect,
        _ => FailureClass::Status,
    };
    let mut message = format!(
        "{} answered {:?}: {}",
        config.endpoint,
        status.code(),
        status.message()
    );
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    SendError::new(class, message)
}

async fn export_http(
    client: &reqwest::Client,
    headers: &HeaderMap,
    request: &ExportLogsServiceRequest,
    config: &OtlpConfig,
) -> Result<ExportLogsServiceResponse, SendError> {
    let response = client
        .post(config.endpoint.clone())
        .headers(headers.clone())
        .header(CONTENT_TYPE, PROTOBUF)
        .body(request.encode_to_vec())
        .send()
        .await
        .map_err(SendError::from_reqwest)?;
    let status = response.status();
    if !status.is_success() {
        return Err(SendError::new(
            http_status_class(status),
            format!("{} answered {status}", config.endpoint),
        ));
    }
    let protobuf = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(PROTOBUF.as_bytes()));
    let body = response.bytes().await.map_err(SendError::from_reqwest)?;
    // A 2xx is the acknowledgement; its body only says what was rejected.
    Ok(if protobuf {
        ExportLogsServiceResponse::decode(body).unwrap_or_default()
    } else {
        ExportLogsServiceResponse::default()
    })
}

/// OTLP/HTTP's answers: 400 (bad data) and 413 (too large) refused for
/// good; 429, 5xx and the other 4xx retried.
pub(crate) fn http_status_class(status: reqwest::StatusCode) -> FailureClass {
    match status.as_u16() {
        400 | 413 => FailureClass::Refused,
        _ => FailureClass::Status,
    }
}

#[cfg(test)]
mod tests;
