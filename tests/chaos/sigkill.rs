//! The agent SIGKILLed in the middle of a burst of tasks and restarted on
//! the same state directory, five times: seq strictly increasing across
//! restarts, no event id repeated, nothing acknowledged lost (neither an
//! answered HTTP request nor an event the webhook did not get). Extends
//! agent/tests/webhook.rs (one process, a flaky receiver) and
//! tests/delivery (clean restarts) to unclean deaths. Root only; never
//! skipped in CI.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use memwatch::EventKind;
use memwatch_test_support::webhook::Receiver;
use memwatch_tests::{
    agent::Agent, assert_seq_increasing_and_ids_unique, kernel_tests_enabled, received_events,
};

const ROUNDS: usize = 5;
/// Tasks started (and most ended) per round; the kill lands among them.
const TASKS_PER_ROUND: usize = 60;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// seq → ids the webhook got for it (at least once: repeats allowed, one id).
fn received(receiver: &Receiver) -> BTreeMap<u64, BTreeSet<String>> {
    let mut got: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for e in received_events(receiver) {
        got.entry(e.seq).or_default().insert(e.id);
    }
    got
}

/// What the agent answered 2xx to: (task id, "started" or "finished").
type Acked = Arc<Mutex<Vec<(String, EventKind)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_burst_loses_nothing_acknowledged() {
    if !kernel_tests_enabled("sigkill_mid_burst_loses_nothing_acknowledged") {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let hook = receiver.url();
    let acked: Acked = Arc::default();
    for round in 0..ROUNDS {
        let mut agent = Agent::start_in(state.path(), &["--webhook", &hook]).await;
        let client = agent.client();
        let mut burst = tokio::task::JoinSet::new();
        for i in 0..TASKS_PER_ROUND {
            let (client, base, acked) = (client.clone(), agent.base_url.clone(), acked.clone());
            burst.spawn(async move {
                let id = format!("r{round}-t{i}");
                let Ok(r) = client
                    .post(format!("{base}/v1/tasks"))
                    .json(&serde_json::json!({ "task_id": id }))
                    .send()
                    .await
                else {
                    return; // killed before it answered: not acknowledged
                };
                assert!(!r.status().is_server_error(), "{id}: {}", r.status());
                if r.status().as_u16() != 201 {
                    return;
                }
                acked
                    .lock()
                    .unwrap()
                    .push((id.clone(), EventKind::TaskStarted));
                if let Ok(r) = client.delete(format!("{base}/v1/tasks/{id}")).send().await
                    && r.status().is_success()
                {
                    acked.lock().unwrap().push((id, EventKind::TaskFinished));
                }
            });
        }
        // Kill once some of the burst is answered, never waiting for all of it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while acked.lock().unwrap().len() < (round + 1) * TASKS_PER_ROUND / 2
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        agent.kill();
        tokio::time::timeout(Duration::from_secs(30), burst.join_all())
            .await
            .expect("requests to a dead agent end");
    }

    // One clean run to read and deliver everything.
    let agent = Agent::start_in(state.path(), &["--webhook", &hook]).await;
    let events = agent.all_events().await;
    assert_seq_increasing_and_ids_unique(&events);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let agent_starts: Vec<u64> = events
        .iter()
        .filter(|e| e.body.kind == EventKind::AgentStarted)
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        agent_starts.len(),
        ROUNDS + 1,
        "one agent_started per start"
    );

    let stored: HashSet<(String, EventKind)> = events
        .iter()
        .filter_map(|e| Some((e.body.task_id.clone()?, e.body.kind)))
        .collect();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= ROUNDS * TASKS_PER_ROUND / 2,
        "{} acked",
        acked.len()
    );
    assert!(
        acked.len() < 2 * ROUNDS * TASKS_PER_ROUND,
        "every request was answered: the kills never landed mid-burst"
    );
    eprintln!(
        "{} of {} requests acknowledged",
        acked.len(),
        2 * ROUNDS * TASKS_PER_ROUND
    );
    for answer in &acked {
        assert!(
            stored.contains(answer),
            "acknowledged {answer:?} is not in the outbox"
        );
    }

    // Every stored event reaches the webhook, under its one id.
    let deadline = Instant::now() + DELIVERY_TIMEOUT;
    loop {
        let got = received(&receiver);
        let missing: Vec<u64> = seqs
            .iter()
            .copied()
            .filter(|s| !got.contains_key(s))
            .collect();
        if missing.is_empty() {
            for e in &events {
                assert_eq!(got[&e.seq], BTreeSet::from([e.id.clone()]), "seq {}", e.seq);
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} events never delivered, e.g. {:?}; log:\n{}",
            missing.len(),
            &missing[..missing.len().min(10)],
            agent.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
