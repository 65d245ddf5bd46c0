//! Many tasks starting and ending at once against a real agent: every
//! task_started has its task_finished, no 5xx, seq strictly increasing, and
//! nothing left running. Root only (BPF); never skipped in CI.

use std::{collections::BTreeMap, time::Duration};

use memwatch::EventKind;
use memwatch_tests::{agent::Agent, assert_seq_increasing_and_ids_unique, kernel_tests_enabled};

/// Tasks started and ended concurrently.
const TASKS: usize = 200;
/// The whole burst must finish within this.
const BURST_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_start_and_end_at_once() {
    if !kernel_tests_enabled("two_hundred_tasks_start_and_end_at_once") {
        return;
    }
    let agent = Agent::start(&[]).await;
    let client = agent.client();
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..TASKS {
        let (client, base) = (client.clone(), agent.base_url.clone());
        burst.spawn(async move {
            let id = format!("chaos-{i}");
            let started = client
                .post(format!("{base}/v1/tasks"))
                .json(&serde_json::json!({ "task_id": id }))
                .send()
                .await
                .expect("POST /v1/tasks");
            let start = started.status().as_u16();
            let ended = client
                .delete(format!("{base}/v1/tasks/{id}?exit_code=0"))
                .send()
                .await
                .expect("DELETE /v1/tasks");
            (id, start, ended.status().as_u16())
        });
    }
    let answers = tokio::time::timeout(BURST_TIMEOUT, burst.join_all())
        .await
        .expect("the burst ends in time");
    for (id, start, end) in &answers {
        assert_eq!(
            (*start, *end),
            (201, 200),
            "{id}: POST {start}, DELETE {end}"
        );
    }

    let events = agent.all_events().await;
    assert_seq_increasing_and_ids_unique(&events);

    // Per task: exactly one start, then exactly one finish after it.
    let mut seen: BTreeMap<&str, Vec<(EventKind, u64)>> = BTreeMap::new();
    for e in &events {
        if let Some(task) = e.body.task_id.as_deref() {
            seen.entry(task).or_default().push((e.body.kind, e.seq));
        }
    }
    assert_eq!(seen.len(), TASKS, "tasks with events");
    for (task, kinds) in &seen {
        let kinds: Vec<EventKind> = kinds.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [EventKind::TaskStarted, EventKind::TaskFinished],
            "{task}"
        );
    }

    let (code, body) = agent.get("/v1/status").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["tasks"], serde_json::json!([]), "{status}");
    let (code, body) = agent.get("/health").await;
    assert_eq!(code, 200, "{body}");
}
