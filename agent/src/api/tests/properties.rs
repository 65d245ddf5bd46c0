//! POST /v1/tasks with arbitrary bodies: never a 5xx, and a 4xx changes nothing.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

/// JSON of any shape, small.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Task requests with the real keys (and one unknown) holding any JSON.
fn task_like() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec![
        "task_id",
        "worker",
        "pid",
        "cgroup",
        "soft_cap_bytes",
        "colour",
    ]);
    let value = prop_oneof![
        any_json(),
        Just(json!("w1")),
        Just(json!("/cg/w1")),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(0)),
        "[a-z0-9/._-]{0,300}".prop_map(Value::from),
    ];
    prop::collection::btree_map(key, value, 0..5)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        task_like().prop_map(|v| v.to_string().into_bytes()),
        any_json().prop_map(|v| v.to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..64),
        // Valid JSON cut short or with a stray byte.
        (task_like(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(v, at, b)| {
            let mut text = v.to_string().into_bytes();
            let at = at.index(text.len());
            text.truncate(at);
            text.push(b);
            text
        }),
    ]
}

fn content_type() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![
        Some(JSON),
        Some(JSON),
        Some(JSON),
        Some("application/json; charset=utf-8"),
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ])
}

/// What a request could change: running tasks, finished tasks, events.
fn footprint(state: &AppState) -> (Vec<String>, usize, u64) {
    let tasks = state
        .monitor
        .tasks()
        .into_iter()
        .map(|t| t.task_id)
        .collect();
    (
        tasks,
        state.monitor.finished().0.len(),
        state.outbox.status().last_seq,
    )
}

async fn post(state: &AppState, content_type: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
    let mut req = as_operator(Request::post("/v1/tasks"));
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let response = router(state.clone())
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_task_bodies_never_5xx_and_4xx_change_nothing(
        requests in prop::collection::vec((content_type(), body()), 1..6),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let state = state_with(reader(50 * MIB), None);
            attach(&state);
            for (content_type, body) in requests {
                let before = footprint(&state);
                let shown = String::from_utf8_lossy(&body).into_owned();
                let (code, json) = post(&state, content_type, body).await;
                prop_assert!(!code.is_server_error(), "{code} for {shown:?}: {json}");
                prop_assert!(
                    code == StatusCode::CREATED || code.is_client_error(),
                    "{code} for {shown:?}"
                );
                if code.is_client_error() {
                    prop_assert_eq!(footprint(&state), before, "{} for {:?}", code, shown);
                    if content_type.is_some_and(|ct| ct.starts_with(JSON)) {
                        prop_assert!(json["error"].as_str().is_some_and(|m| !m.is_empty())
                            || json["verdict"] == "rejected", "{code}: {json}");
                    }
                } else {
                    let id = json["task_id"].as_str().map(str::to_owned)
                        .or_else(|| state.monitor.tasks().last().map(|t| t.task_id.clone()))
                        .expect("an accepted task has an id");
                    prop_assert!(state.monitor.tasks().iter().any(|t| t.task_id == id));
                    prop_assert_eq!(state.outbox.status().last_seq, before.2 + 1);
                    let uri = format!("/v1/tasks/{}", urlencode(&id));
                    let (code, json) = send(&state, "DELETE", &uri, None, By::Operator).await;
                    prop_assert_eq!(code, StatusCode::OK, "{}: {}", uri, json);
                    prop_assert!(state.monitor.tasks().is_empty());
                }
            }
            Ok(())
        })?;
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
