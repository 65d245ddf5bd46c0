//! The webhook sink against a real HTTP receiver on 127.0.0.1 that refuses
//! connections, then answers 500, then hangs, then recovers. No privilege.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use hmac::{Hmac, KeyInit as _, Mac as _};
use memwatch::{
    Delivery, EVENT_ID_HEADER, Event, EventBody, EventKind, Metrics, Outbox, SIGNATURE_HEADER,
    Secret, WebhookConfig, WebhookSink,
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
        requests
            .iter()
            .all(|r| r.header(SIGNATURE_HEADER).is_none())
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
