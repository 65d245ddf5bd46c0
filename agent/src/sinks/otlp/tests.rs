//! The sink's answers classified, and OTLP/HTTP against a fake receiver
//! (axum on 127.0.0.1): the body, the headers, a partial success.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap as Headers, routing::post};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess;

use super::*;
use crate::{
    model::event::{EventBody, EventKind},
    sinks::config::Secret,
};

fn config(endpoint: &str, protocol: OtlpProtocol) -> OtlpConfig {
    OtlpConfig {
        name: "test-otlp".into(),
        endpoint: endpoint.parse().unwrap(),
        protocol,
        headers: vec![("authorization".into(), Secret("Bearer t0ken".into()))],
        resource: BTreeMap::new(),
        delivery: Delivery {
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_secs(2),
            ..Delivery::default()
        },
    }
}

fn event(seq: u64) -> Event {
    Event {
        id: format!("id-{seq}"),
        seq,
        time: "2026-01-02T03:04:05Z".parse().unwrap(),
        host: "node-1".into(),
        epoch: None,
        body: EventBody::new(EventKind::TaskStarted),
    }
}

#[test]
fn grpc_codes_are_classified() {
    let c = config("http://127.0.0.1:4317", OtlpProtocol::Grpc);
    let class = |code| grpc_error(&tonic::Status::new(code, "x"), &c).class;
    assert_eq!(class(Code::InvalidArgument), FailureClass::Refused);
    assert_eq!(class(Code::DeadlineExceeded), FailureClass::Timeout);
    for code in [
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Unauthenticated,
        Code::Internal,
    ] {
        assert_eq!(class(code), FailureClass::Status, "{code:?}");
    }
    let e = grpc_error(&tonic::Status::unavailable("down"), &c);
    assert!(e.message.contains("Unavailable: down"), "{}", e.message);
}

#[test]
fn http_statuses_are_classified() {
    let class = |n: u16| http_status_class(reqwest::StatusCode::from_u16(n).unwrap());
    assert_eq!(class(400), FailureClass::Refused);
    assert_eq!(class(413), FailureClass::Refused);
    for n in [401, 403, 404, 408, 429, 500, 502, 503, 504] {
        assert_eq!(class(n), FailureClass::Status, "{n}");
    }
}

#[test]
fn headers_that_fit_no_protocol_are_refused_at_start() {
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let mut c = config("http://127.0.0.1:4318/v1/logs", OtlpProtocol::Http);
    c.headers = vec![("bad header".into(), Secret("x".into()))];
    assert!(OtlpSink::new(c.clone(), metrics.clone(), None).is_err());
    c.protocol = OtlpProtocol::Grpc;
    assert!(OtlpSink::new(c, metrics, None).is_err());
}

/// What the fake receiver got, and the answer it gives.
#[derive(Default)]
struct Fake {
    requests: Vec<(Headers, ExportLogsServiceRequest)>,
    /// HTTP status, and the records it says it rejected.
    answer: (u16, i64),
}

type Shared = Arc<Mutex<Fake>>;

async fn receive(
    State(fake): State<Shared>,
    headers: Headers,
    body: Bytes,
) -> (axum::http::StatusCode, HeaderMap, Vec<u8>) {
    let request = ExportLogsServiceRequest::decode(body).expect("a protobuf export request");
    let mut fake = fake.lock().unwrap();
    fake.requests.push((headers, request));
    let (status, rejected) = fake.answer;
    let response = ExportLogsServiceResponse {
        partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
            rejected_log_records: rejected,
            error_message: "too old".into(),
        }),
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROTOBUF));
    let status = axum::http::StatusCode::from_u16(status).expect("a status code");
    (status, headers, response.encode_to_vec())
}

async fn fake_receiver() -> (String, Shared) {
    let fake: Shared = Arc::new(Mutex::new(Fake {
        answer: (200, 0),
        ..Fake::default()
    }));
    let app = Router::new()
        .route("/v1/logs", post(receive))
        .with_state(Arc::clone(&fake));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/logs"), fake)
}

#[tokio::test]
async fn http_posts_protobuf_with_the_headers_and_counts_rejected_records() {
    let (url, fake) = fake_receiver().await;
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let mut sink = OtlpSink::new(
        config(&url, OtlpProtocol::Http),
        metrics.clone(),
        Some("node-1".into()),
    )
    .unwrap();
    sink.send(&[event(1), event(2)]).await.unwrap();
    {
        let fake = fake.lock().unwrap();
        let (headers, request) = &fake.requests[0];
        assert_eq!(headers["content-type"], PROTOBUF);
        assert_eq!(headers["authorization"], "Bearer t0ken");
        let records = &request.resource_logs[0].scope_logs[0].log_records;
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].event_name, "memwatch.task_started");
    }
    let dropped = || metrics.events_dropped.with_label_values(&[REJECTED]).get();
    assert_eq!(dropped(), 0);

    fake.lock().unwrap().answer = (200, 1);
    sink.send(&[event(3)])
        .await
        .expect("a partial success is taken");
    assert_eq!(dropped(), 1, "the rejected record counted");

    for (status, class) in [(400, FailureClass::Refused), (503, FailureClass::Status)] {
        fake.lock().unwrap().answer = (status, 0);
        let e = sink.send(&[event(4)]).await.unwrap_err();
        assert_eq!(e.class, class, "{status}: {e}");
        assert!(e.message.contains(&status.to_string()), "{e}");
    }
}

#[tokio::test]
async fn nothing_listening_is_a_connect_failure_on_both_protocols() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    for protocol in [OtlpProtocol::Http, OtlpProtocol::Grpc] {
        let c = config(&format!("http://127.0.0.1:{port}/v1/logs"), protocol);
        let mut sink = OtlpSink::new(c, metrics.clone(), None).unwrap();
        let e = sink.send(&[event(1)]).await.unwrap_err();
        assert_eq!(e.class, FailureClass::Connect, "{protocol:?}: {e}");
    }
}
