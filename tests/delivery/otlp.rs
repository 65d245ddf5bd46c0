//! The OpenTelemetry sink (`[[otlp]]`) of a real agent against an
//! independent OTLP receiver (Python: PyPI's opentelemetry-proto with
//! grpcio; tests/src/otlp_receiver.py), over gRPC and over HTTP: the
//! agent's events arrive as log records with the right resource and
//! attributes; the receiver is killed, events are made during the outage,
//! it comes back answering UNAVAILABLE / 503 for a while, then takes them:
//! every event arrives, once, in seq order.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    time::{Duration, Instant},
};

use memwatch::Event;
use memwatch_test_support::wait::wait_until_async;
use memwatch_tests::{
    agent::Agent,
    otlp::{OtlpReceiver, python_with_otlp},
};
use serde_json::{Value, json};

const SINK: &str = "collector";
const TOKEN: &str = "Bearer otlp-test-token";
/// Bounds every wait for delivery: generous on a loaded 2-core machine.
const DELIVERY: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_records_arrive_once_in_order_across_a_receiver_outage() {
    round_trip(
        "grpc_records_arrive_once_in_order_across_a_receiver_outage",
        "grpc",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_records_arrive_once_in_order_across_a_receiver_outage() {
    round_trip(
        "http_records_arrive_once_in_order_across_a_receiver_outage",
        "http",
    )
    .await;
}

async fn round_trip(test: &str, protocol: &str) {
    let Some(python) = python_with_otlp(test) else {
        return;
    };
    let mut receiver = OtlpReceiver::start(python);
    let (agent, config) = start_agent(&receiver, protocol).await;
    let started = Instant::now();

    // 1. Delivered as they come.
    for task in ["a1", "a2", "a3"] {
        register(&agent, task).await;
    }
    end(&agent, "a1").await;
    wait_delivered(&agent, &receiver, "the first events").await;

    // 2. The receiver dies; events keep coming and wait in the outbox.
    receiver.kill();
    let taken = receiver.records().len();
    for task in ["b1", "b2"] {
        register(&agent, task).await;
    }
    end(&agent, "a2").await;
    wait_until_async(
        "failed attempts while the receiver is down",
        DELIVERY,
        async || failures(&agent).await >= 2,
    )
    .await;
    end(&agent, "b1").await;

    // 3. Back on the same ports, answering UNAVAILABLE / 503 for a while.
    receiver.unavailable(true);
    receiver.restart();
    wait_until_async(
        "UNAVAILABLE / 503 answered and retried",
        DELIVERY,
        async || receiver.refused() >= 2,
    )
    .await;
    assert_eq!(
        receiver.records().len(),
        taken,
        "nothing taken while unavailable"
    );
    receiver.unavailable(false);
    register(&agent, "c1").await;
    let expected = wait_delivered(&agent, &receiver, "every event after the outage").await;
    println!(
        "{protocol}: {} events delivered through the outage in {:?}, {} UNAVAILABLE/503 answers",
        expected.len(),
        started.elapsed(),
        receiver.refused()
    );

    let records = receiver.records();
    assert_once_in_order(&records, &expected);
    let by_id: BTreeMap<&str, &Value> = records
        .iter()
        .map(|r| {
            (
                r["record"]["attributes"]["log.record.uid"]
                    .as_str()
                    .unwrap(),
                r,
            )
        })
        .collect();
    for event in &expected {
        assert_record(by_id[event.id.as_str()], event, protocol);
    }
    let _ = fs::remove_file(config);
}

/// The agent (poll source, node `test-node`) with one `[[otlp]]` sink to
/// `receiver` over `protocol`; for gRPC as in a pod (so `k8s.node.name`
/// is on the resource). Returns it and its config file.
async fn start_agent(receiver: &OtlpReceiver, protocol: &str) -> (Agent, std::path::PathBuf) {
    let headers = receiver.dir().join("headers");
    fs::write(
        &headers,
        format!("# the collector's token\nAuthorization: {TOKEN}\n"),
    )
    .unwrap();
    fs::set_permissions(&headers, fs::Permissions::from_mode(0o600)).unwrap();
    let port = match protocol {
        "grpc" => receiver.grpc_port,
        _ => receiver.http_port,
    };
    let config = receiver.dir().join("memwatch.toml");
    fs::write(
        &config,
        format!(
            r#"
[[otlp]]
name = "{SINK}"
endpoint = "http://127.0.0.1:{port}"
protocol = "{protocol}"
headers_file = "{}"
batch_size = 3
connect_timeout = "1s"
timeout = "5s"
retry_initial = "50ms"
retry_max = "400ms"

[otlp.resource_attributes]
"deployment.environment.name" = "test"
"#,
            headers.display()
        ),
    )
    .unwrap();
    let path = config.to_str().unwrap();
    let flags = ["--config", path, "--source", "poll"];
    let agent = match protocol {
        "grpc" => Agent::start_with_env(&[("KUBERNETES_SERVICE_HOST", "127.0.0.1")], &flags).await,
        _ => Agent::start(&flags).await,
    };
    (agent, config)
}

async fn register(agent: &Agent, task: &str) {
    let (code, body) = agent
        .post("/v1/tasks", Some(json!({ "task_id": task })))
        .await;
    assert_eq!(code, 201, "register {task}: {body}");
}

async fn end(agent: &Agent, task: &str) {
    let url = format!("{}/v1/tasks/{task}?exit_code=0", agent.base_url);
    let r = agent.client().delete(url).send().await.unwrap();
    assert!(r.status().is_success(), "end {task}: {}", r.status());
}

/// The sink's failed attempts so far, from `/metrics`.
async fn failures(agent: &Agent) -> u64 {
    let (_, text) = agent.get("/metrics").await;
    text.lines()
        .filter(|l| {
            l.starts_with("memwatch_sink_failures_total{")
                && l.contains(&format!("sink=\"{SINK}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits until every event the agent holds now is among the receiver's
/// records; returns those events.
async fn wait_delivered(agent: &Agent, receiver: &OtlpReceiver, what: &str) -> Vec<Event> {
    let expected = agent.all_events().await;
    assert!(!expected.is_empty());
    let deadline = Instant::now() + DELIVERY;
    loop {
        let got: Vec<String> = receiver
            .records()
            .iter()
            .filter_map(|r| {
                r["record"]["attributes"]["log.record.uid"]
                    .as_str()
                    .map(String::from)
            })
            .collect();
        if expected.iter().all(|e| got.contains(&e.id)) {
            return expected;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not delivered within {DELIVERY:?}; {} of {} records; receiver stderr:\n{}\nagent log:\n{}",
            got.len(),
            expected.len(),
            receiver.stderr(),
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every expected event once among the records, and the records in
/// strictly increasing seq order with no uid twice.
fn assert_once_in_order(records: &[Value], expected: &[Event]) {
    let seqs: Vec<i64> = records
        .iter()
        .map(|r| r["record"]["attributes"]["memwatch.seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "records out of seq order or twice: {seqs:?}"
    );
    for event in expected {
        let n = records
            .iter()
            .filter(|r| r["record"]["attributes"]["log.record.uid"] == event.id.as_str())
            .count();
        assert_eq!(
            n, 1,
            "event {} (seq {}) arrived {n} times",
            event.id, event.seq
        );
    }
}

/// One record as the receiver got it, against the event it stands for.
fn assert_record(got: &Value, event: &Event, protocol: &str) {
    let kind = event.body.kind.as_str();
    assert_eq!(got["protocol"], protocol);
    assert_eq!(got["authorization"], TOKEN, "the header from headers_file");
    let resource = &got["resource"];
    assert_eq!(resource["service.name"], "memwatch");
    assert_eq!(resource["service.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(resource["host.name"], "test-node");
    assert_eq!(resource["deployment.environment.name"], "test");
    match protocol {
        "grpc" => assert_eq!(resource["k8s.node.name"], "test-node", "{resource}"),
        _ => assert!(resource.get("k8s.node.name").is_none(), "{resource}"),
    }
    assert_eq!(got["scope"]["name"], "memwatch");
    let record = &got["record"];
    assert_eq!(record["body"], kind);
    assert_eq!(record["event_name"], format!("memwatch.{kind}"));
    let nanos = event.time.timestamp_nanos_opt().unwrap();
    assert_eq!(record["time_unix_nano"].as_i64(), Some(nanos), "{record}");
    // docs/otlp.md's table. Any kind can arrive: the poll source also
    // reports the host's OOM kills, and other tests make some.
    let (number, text) = match kind {
        "oom_kill" => (17, "ERROR"),
        "oom_imminent"
        | "worker_unhealthy"
        | "task_rejected"
        | "soft_cap_exceeded"
        | "memory_high_throttled"
        | "guard_blocked"
        | "action_refused"
        | "event_quarantined" => (13, "WARN"),
        "heartbeat" => (5, "DEBUG"),
        _ => (9, "INFO"),
    };
    assert_eq!(record["severity_number"], number, "{kind}");
    assert_eq!(record["severity_text"], text, "{kind}");
    let attributes = &record["attributes"];
    assert_eq!(attributes["event.name"], format!("memwatch.{kind}"));
    assert_eq!(attributes["memwatch.seq"].as_u64(), Some(event.seq));
    if let Some(epoch) = &event.epoch {
        assert_eq!(attributes["memwatch.epoch"], epoch.as_str());
    }
    if let Some(task) = &event.body.task_id {
        assert_eq!(attributes["memwatch.task_id"], task.as_str(), "{record}");
    }
    if let Some(worker) = &event.body.worker {
        assert_eq!(attributes["memwatch.worker"], worker.as_str(), "{record}");
    }
    if let Some(pid) = event.body.pid {
        assert_eq!(attributes["process.pid"], pid, "{record}");
    }
}
