//! The NATS JetStream sink against a real nats-server on 127.0.0.1, killed
//! and restarted while events are being shipped.

use std::{collections::HashSet, time::Duration};

use async_nats::jetstream::{self, message::PublishMessage};
use memwatch::{Delivery, Event, EventBody, EventKind, Metrics, NatsConfig, NatsSink, Outbox};
use memwatch_test_support::{http::free_port, wait::wait_until_async};
use memwatch_tests::nats::{NatsServer, nats_server_binary};
use tokio::sync::watch;

const SUBJECT: &str = "memwatch.test.events";
const STREAM: &str = "MEMWATCH_TEST";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_land_in_the_stream_exactly_once_across_a_nats_restart() {
    let test = "events_land_in_the_stream_exactly_once_across_a_nats_restart";
    let Some(binary) = nats_server_binary(test) else {
        return;
    };
    let store = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = NatsServer::start(&binary, port, store.path());

    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::open(state.path(), "h1", Default::default(), metrics.clone()).unwrap();
    let sink = NatsSink::new(NatsConfig {
        name: "test-nats".into(),
        url: server.url(),
        subject: SUBJECT.into(),
        stream: STREAM.into(),
        delivery: Delivery {
            batch_size: 3,
            batch_bytes: 64 << 10,
            connect_timeout: Duration::from_millis(500),
            timeout: Duration::from_millis(800),
            retry_initial: Duration::from_millis(50),
            retry_max: Duration::from_millis(400),
        },
    });
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(memwatch::deliver(
        sink,
        outbox.clone(),
        metrics.clone(),
        stopped,
    ));
    let append = |n: usize| {
        for i in 0..n {
            let kind = if i % 2 == 0 {
                EventKind::OomKill
            } else {
                EventKind::Heartbeat
            };
            outbox.append(EventBody::new(kind), None);
        }
    };
    let drained = || outbox.backlog("test-nats") == 0;

    append(5);
    wait_until_async("the first events", Duration::from_secs(20), async || {
        drained()
    })
    .await;

    // The server dies; events keep coming and cannot be acknowledged.
    server.kill();
    append(5);
    let failures = || {
        ["connect", "timeout", "status", "other"]
            .iter()
            .map(|c| {
                metrics
                    .sink_failures
                    .with_label_values(&["test-nats", c])
                    .get()
            })
            .sum::<u64>()
    };
    wait_until_async(
        "failed attempts while NATS is down",
        Duration::from_secs(20),
        async || failures() >= 2,
    )
    .await;
    assert!(outbox.backlog("test-nats") > 0);

    // Back on the same port and store: delivery resumes by itself.
    let server = NatsServer::start(&binary, port, store.path());
    wait_until_async(
        "delivery after the restart",
        Duration::from_secs(30),
        async || drained(),
    )
    .await;
    append(2);
    wait_until_async("the last events", Duration::from_secs(20), async || {
        drained()
    })
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();

    let expected: Vec<Event> = outbox.read(0, 100);
    assert_eq!(expected.len(), 12);

    // What the stream holds: each event once, in seq order, with its id as Nats-Msg-Id.
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    let mut stream = js.get_stream(STREAM).await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 12, "exactly one message per event");
    let mut stored = Vec::new();
    for seq in info.state.first_sequence..=info.state.last_sequence {
        let message = stream.get_raw_message(seq).await.unwrap();
        let event: Event = serde_json::from_slice(&message.payload).unwrap();
        let msg_id = message
            .headers
            .get("Nats-Msg-Id")
            .expect("Nats-Msg-Id header")
            .to_string();
        assert_eq!(msg_id, event.id);
        stored.push(event);
    }
    assert_eq!(stored, expected);
    let ids: HashSet<&str> = stored.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 12);

    // Sent again (as after a lost acknowledgement), an event is not stored twice.
    let again = js
        .send_publish(
            SUBJECT,
            PublishMessage::build()
                .payload(serde_json::to_vec(&expected[0]).unwrap().into())
                .message_id(expected[0].id.as_str()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(again.duplicate, "JetStream dedupes on Nats-Msg-Id");
    assert_eq!(stream.info().await.unwrap().state.messages, 12);
    assert_eq!(
        metrics
            .sink_delivered
            .with_label_values(&["test-nats"])
            .get(),
        12
    );
}
