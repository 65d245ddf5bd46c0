//! The webhook sink against a real HTTP receiver on 127.0.0.1 that refuses
//! connections, then answers 500, then hangs, then recovers. No privilege.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use hmac::{Hmac, KeyInit as _, Mac as _};
use memwatch::{
    Delivery, EVENT_ID_HEADER, Event, EventBody, EventKind, Metrics, Outbox, SIGNATURE_HEADER,
    Secret, WEBHOOK_ID_HEADER, WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER, WebhookConfig,
    WebhookFormat, WebhookSink,
};
use memwatch_test_support::{
    http::free_port,
    wait::wait_until_async,
    webhook::{Answer, Receiver},
};
use sha2::Sha256;
use tokio::sync::watch;

/// Far past the sink's timeout; bounded all the same.
const HANG: Answer = Answer::Hang(Duration::from_secs(10));

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn config(addr: SocketAddr, secret: Option<&str>) -> WebhookConfig {
    WebhookConfig {
        name: "test-hook".into(),
        url: format!("http://{addr}/hook").parse().unwrap(),
        secret: secret.map(|s| Secret(s.into())),
        format: WebhookFormat::Memwatch,
        delivery: Delivery {
            batch_size: 4,
            batch_bytes: 64 << 10,
            connect_timeout: Duration::from_millis(300),
            timeout: Duration::from_millis(400),
            retry_initial: Duration::from_millis(20),
            retry_max: Duration::from_millis(150),
        },
    }
}

fn failures(metrics: &Metrics, class: &str) -> u64 {
    metrics
        .sink_failures
        .with_label_values(&["test-hook", class])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_arrives_in_order_through_refusals_errors_and_hangs() {
    let state = tempfile::tempdir().unwrap();
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::open(state.path(), "h1", Default::default(), metrics.clone()).unwrap();
    let addr = free_addr();
    let sink = WebhookSink::new(config(addr, None)).unwrap();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(memwatch::deliver(
        sink,
        outbox.clone(),
        metrics.clone(),
        stopped,
    ));
    let append = |n: usize| {
        for _ in 0..n {
            outbox.append(EventBody::new(EventKind::OomKill), None);
        }
    };

    // 1. Nothing listens: connections are refused.
    append(3);
    wait_until_async("refused connections", Duration::from_secs(10), async || {
        failures(&metrics, "connect") >= 3
    })
    .await;
    append(2);

    // 2. The receiver answers 500.
    let receiver = Receiver::start_on(addr);
    receiver.answer(Answer::Status(500));
    wait_until_async("500 answers", Duration::from_secs(10), async || {
        receiver.count(Answer::Status(500)) >= 3
    })
    .await;
    append(2);

    // 3. It hangs past the sink's timeout.
    receiver.answer(HANG);
    wait_until_async("timeouts", Duration::from_secs(10), async || {
        failures(&metrics, "timeout") >= 2
    })
    .await;
    append(3);

    // 4. It recovers.
    receiver.answer(Answer::Accept);
    append(2);
    wait_until_async(
        "the backlog to drain",
        Duration::from_secs(20),
        async || outbox.backlog("test-hook") == 0,
    )
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();

    let expected: Vec<Event> = outbox.read(0, 100);
    assert_eq!(expected.len(), 12);
    let requests = receiver.requests();
    let mut accepted = Vec::new();
    let mut seen: BTreeMap<String, Event> = BTreeMap::new();
    for request in requests.iter() {
        assert_eq!(request.header("content-type"), Some("application/json"));
        let batch: Vec<Event> = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(
            request.header(EVENT_ID_HEADER),
            Some(batch[0].id.as_str()),
            "the id header names the first event"
        );
        // The batch's id is made of its events': the same on every retry.
        let batch_id = match batch.as_slice() {
            [only] => only.id.clone(),
            [first, .., last] => format!("{}_{}", first.id, last.id),
            [] => panic!("an empty batch"),
        };
        assert_eq!(request.header(WEBHOOK_ID_HEADER), Some(batch_id.as_str()));
        let sent: i64 = request
            .header(WEBHOOK_TIMESTAMP_HEADER)
            .unwrap()
            .parse()
            .unwrap();
        assert!((chrono::Utc::now().timestamp() - sent).abs() < 120);
        assert!(batch.windows(2).all(|w| w[0].seq < w[1].seq), "{batch:?}");
        for event in &batch {
            // A duplicate is the same event: same id, same seq, same content.
            if let Some(before) = seen.insert(event.id.clone(), event.clone()) {
                assert_eq!(before, *event);
            }
        }
        if request.answer == Answer::Accept {
            accepted.extend(batch);
        }
    }
    assert_eq!(
        accepted, expected,
        "acknowledged batches hold every event once, in seq order"
    );
    assert!(
        requests.iter().all(|r| r.header(SIGNATURE_HEADER).is_none()
            && r.header(WEBHOOK_SIGNATURE_HEADER).is_none())
    );
    assert_eq!(
        metrics
            .sink_delivered
            .with_label_values(&["test-hook"])
            .get(),
        12
    );
    assert!(failures(&metrics, "status") >= 3);
    assert!(metrics.sink_retries.with_label_values(&["test-hook"]).get() >= 8);

    // The cursor is durable: a restarted sink has nothing to send again.
    drop(outbox);
    let outbox = Outbox::open(state.path(), "h1", Default::default(), metrics).unwrap();
    assert_eq!(outbox.register_sink("test-hook"), 12);
    assert_eq!(outbox.backlog("test-hook"), 0);
}

#[tokio::test]
async fn signed_batches_verify_with_the_shared_secret() {
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::new("h1", 100, metrics.clone());
    let receiver = Receiver::start();
    let addr = receiver.addr();
    let secret = "s3cret-key";
    let sink = WebhookSink::new(config(addr, Some(secret))).unwrap();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(memwatch::deliver(sink, outbox.clone(), metrics, stopped));
    for _ in 0..6 {
        outbox.append(EventBody::new(EventKind::Heartbeat), None);
    }
    wait_until_async("delivery", Duration::from_secs(10), async || {
        outbox.backlog("test-hook") == 0
    })
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();

    let requests = receiver.requests();
    assert!(requests.len() >= 2, "6 events in batches of 4");
    for request in requests.iter() {
        let header = request
            .header(SIGNATURE_HEADER)
            .expect("a signature header");
        let hex_mac = header.strip_prefix("sha256=").expect("sha256= prefix");
        // Verified as a receiver would: HMAC-SHA256 of the raw body, constant-time compare.
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(&request.body);
        mac.verify_slice(&hex::decode(hex_mac).unwrap())
            .expect("signature verifies with the shared secret");
        let mut wrong = Hmac::<Sha256>::new_from_slice(b"another key").unwrap();
        wrong.update(&request.body);
        assert!(wrong.verify_slice(&hex::decode(hex_mac).unwrap()).is_err());
    }
}

/// A receiver with a body limit (413 to bigger requests) still gets every
/// event, in order: the sink halves its batches until they fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_refuses_big_batches_still_gets_every_event() {
    let state = tempfile::tempdir().unwrap();
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::open(state.path(), "h1", Default::default(), metrics.clone()).unwrap();
    for _ in 0..40 {
        outbox.append(EventBody::new(EventKind::OomKill), None);
    }
    let addr = free_addr();
    let receiver = Receiver::start_on(addr);
    // About four events fit; the sink starts with batches of 32.
    receiver.answer(Answer::LimitBody(1000));
    let mut hook = config(addr, None);
    hook.delivery.batch_size = 32;
    let sink = WebhookSink::new(hook).unwrap();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(memwatch::deliver(
        sink,
        outbox.clone(),
        metrics.clone(),
        stopped,
    ));
    wait_until_async(
        "every event received",
        Duration::from_secs(20),
        async || receiver.events().len() >= 40,
    )
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();
    let seqs: Vec<u64> = receiver
        .events()
        .iter()
        .map(|(_, e)| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=40).collect::<Vec<u64>>());
    assert!(receiver.count(Answer::Status(413)) >= 1, "it did refuse");
    assert_eq!(
        failures(&metrics, "refused"),
        receiver.count(Answer::Status(413)) as u64
    );
    assert_eq!(
        metrics.events_dropped.with_label_values(&["refused"]).get(),
        0,
        "none parked: each fits alone"
    );
}

/// docs/examples/webhook_receiver.py, run with python3: an independent
/// implementation of Standard Webhooks verification, and of both formats.
struct PythonReceiver {
    child: std::process::Child,
    port: u16,
    verdicts: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl PythonReceiver {
    fn start(secret: &str) -> PythonReceiver {
        use std::io::BufRead as _;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/examples/webhook_receiver.py"
        );
        let mut child = std::process::Command::new("python3")
            .args([script, "--port", "0"])
            .env("MEMWATCH_WEBHOOK_SECRET", secret)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the example receiver");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").unwrap();
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("`listening <port>`, not {first:?}"));
        let verdicts: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> =
            std::sync::Arc::default();
        let sink = std::sync::Arc::clone(&verdicts);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let verdict = serde_json::from_str(&line).expect("one JSON verdict per line");
                sink.lock().unwrap().push(verdict);
            }
        });
        PythonReceiver {
            child,
            port,
            verdicts,
        }
    }

    fn verdicts(&self) -> Vec<serde_json::Value> {
        self.verdicts.lock().unwrap().clone()
    }
}

impl Drop for PythonReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sink's signed requests, both formats, verified and parsed by the
/// Python example receiver; forged and stale requests are refused by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_receiver_verifies_both_formats() {
    // A Standard Webhooks secret ("whsec_" + base64) and a raw one.
    for (secret, format, name) in [
        (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            WebhookFormat::CloudEvents,
            "cloudevents",
        ),
        ("a raw secret", WebhookFormat::Memwatch, "memwatch"),
    ] {
        let receiver = PythonReceiver::start(secret);
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let outbox = Outbox::new("h1", 100, metrics.clone());
        let mut hook = config(
            SocketAddr::from(([127, 0, 0, 1], receiver.port)),
            Some(secret),
        );
        hook.format = format;
        hook.delivery.timeout = Duration::from_secs(5);
        let sink = WebhookSink::new(hook).unwrap();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(memwatch::deliver(sink, outbox.clone(), metrics, stopped));
        for kind in [EventKind::OomKill, EventKind::WorkerUnhealthy] {
            for _ in 0..3 {
                outbox.append(EventBody::new(kind), None);
            }
        }
        wait_until_async("delivery", Duration::from_secs(20), async || {
            outbox.backlog("test-hook") == 0
        })
        .await;
        stop.send(true).unwrap();
        task.await.unwrap();
        // The receiver prints its verdict after it answered: the sink may
        // have its 2xx before the reader thread has the line.
        wait_until_async(
            "the receiver's verdicts",
            Duration::from_secs(20),
            async || {
                receiver
                    .verdicts()
                    .iter()
                    .map(|v| v["events"].as_array().map_or(0, Vec::len))
                    .sum::<usize>()
                    >= 6
            },
        )
        .await;

        let verdicts = receiver.verdicts();
        assert!(
            verdicts.len() >= 2,
            "6 events in batches of 4: {verdicts:?}"
        );
        let mut received = Vec::new();
        for v in &verdicts {
            assert_eq!(v["verified"], true, "{name}: {v}");
            assert_eq!(v["format"], name, "{v}");
            let events = v["events"].as_array().unwrap();
            let first = events[0]["id"].as_str().unwrap();
            let last = events[events.len() - 1]["id"].as_str().unwrap();
            let expected_id = if events.len() == 1 {
                first.to_string()
            } else {
                format!("{first}_{last}")
            };
            assert_eq!(v["webhook_id"], expected_id.as_str(), "{v}");
            received.extend(events.iter().cloned());
        }
        let expected: Vec<serde_json::Value> = outbox
            .read(0, 100)
            .iter()
            .map(|e| serde_json::json!({"id": e.id, "seq": e.seq, "kind": e.body.kind.as_str()}))
            .collect();
        assert_eq!(received, expected, "{name}: every event, once, in order");

        // Forged (wrong key) and stale (an hour old) requests are refused.
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/hook", receiver.port);
        let now = chrono::Utc::now().timestamp();
        let body = "[]";
        let sign = |key: &[u8], ts: i64| {
            let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
            mac.update(format!("x.{ts}.{body}").as_bytes());
            use base64::Engine as _;
            format!(
                "v1,{}",
                base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
            )
        };
        for (key, ts) in [(b"wrong".as_slice(), now), (secret.as_bytes(), now - 3600)] {
            let answer = client
                .post(&url)
                .header("content-type", "application/json")
                .header(WEBHOOK_ID_HEADER, "x")
                .header(WEBHOOK_TIMESTAMP_HEADER, ts.to_string())
                .header(WEBHOOK_SIGNATURE_HEADER, sign(key, ts))
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 401);
        }
        // The receiver prints its verdict after it answers: wait for it.
        wait_until_async(
            "the refusals' verdicts",
            Duration::from_secs(10),
            async || {
                receiver
                    .verdicts()
                    .iter()
                    .filter(|v| v["verified"] == false)
                    .count()
                    >= 2
            },
        )
        .await;
        let verdicts = receiver.verdicts();
        let refused: Vec<_> = verdicts.iter().filter(|v| v["verified"] == false).collect();
        assert_eq!(refused.len(), 2, "{verdicts:?}");
        assert!(
            refused[1]["error"].as_str().unwrap().contains("tolerance"),
            "{refused:?}"
        );
    }
}
