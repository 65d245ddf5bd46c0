//! Scopes and task ownership, against the router in memory: each caller
//! (a token of a scope, a socket peer's uid, anonymous over TCP) gets what
//! its scope allows, and ends only its own tasks unless it is admin.

use super::*;
use crate::api::auth::{Peer, Tokens};

const ADMIN: &str = "admin-s3cret";
const TASK: &str = "task-s3cret";
const READ: &str = "read-s3cret";

fn scoped() -> AppState {
    state_with_tokens(
        reader(50 * MIB),
        Tokens::new(Some(ADMIN), Some(TASK), Some(READ)),
    )
}

fn open() -> AppState {
    state_with(reader(50 * MIB), None)
}

/// Who calls: a bearer token over TCP, a socket peer, or nobody (TCP, no
/// token).
#[derive(Clone, Copy)]
enum Who {
    Token(&'static str),
    Uid(u32),
    Nobody,
}

fn tcp() -> Peer {
    Peer::Tcp(([127, 0, 0, 1], 40000).into())
}

async fn call(
    state: &AppState,
    who: Who,
    method: &str,
    uri: &str,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    match who {
        Who::Token(token) => {
            req = req
                .header("authorization", format!("Bearer {token}"))
                .extension(tcp())
        }
        Who::Uid(uid) => {
            req = req.extension(Peer::Unix {
                uid,
                pid: Some(crate::model::process::SeenProcess::now(4242)),
            })
        }
        Who::Nobody => req = req.extension(tcp()),
    }
    respond(state, req.body(Body::empty()).unwrap()).await
}

async fn register(state: &AppState, who: Who, task_id: &str) -> (StatusCode, serde_json::Value) {
    let mut req = Request::post("/v1/tasks").header("content-type", JSON);
    match who {
        Who::Token(token) => {
            req = req
                .header("authorization", format!("Bearer {token}"))
                .extension(tcp())
        }
        Who::Uid(uid) => req = req.extension(Peer::Unix { uid, pid: None }),
        Who::Nobody => req = req.extension(tcp()),
    }
    let body = format!(r#"{{"task_id":"{task_id}"}}"#);
    respond(state, req.body(Body::from(body)).unwrap()).await
}

async fn respond(state: &AppState, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let response = router(state.clone()).oneshot(req).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// The owner `/v1/status` shows for each running task, by id.
async fn owners(state: &AppState, who: Who) -> Vec<(String, String)> {
    let (code, status) = call(state, who, "GET", "/v1/status").await;
    assert_eq!(code, StatusCode::OK, "{status}");
    let mut owners: Vec<(String, String)> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["task_id"].as_str().unwrap().to_string(),
                t["owner"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    owners.sort();
    owners
}

fn assert_forbidden(answer: &(StatusCode, serde_json::Value), scope: &str) {
    assert_eq!(answer.0, StatusCode::FORBIDDEN, "{}", answer.1);
    assert_eq!(answer.1["scope"], scope, "{}", answer.1);
    let error = answer.1["error"].as_str().unwrap();
    assert!(error.contains(&format!("`{scope}` scope")), "{error}");
}

#[tokio::test]
async fn a_read_token_reads_but_cannot_register_end_or_reset() {
    let state = scoped();
    let reader = Who::Token(READ);
    assert_eq!(
        call(&state, reader, "GET", "/v1/status").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&state, reader, "GET", "/v1/events").await.0,
        StatusCode::OK
    );
    assert_forbidden(&register(&state, reader, "t1").await, "task");
    assert!(state.monitor.tasks().is_empty(), "nothing registered");
    assert_eq!(
        register(&state, Who::Token(TASK), "t1").await.0,
        StatusCode::CREATED
    );
    assert_forbidden(
        &call(&state, reader, "DELETE", "/v1/tasks/t1").await,
        "task",
    );
    assert_forbidden(
        &call(&state, reader, "POST", "/v1/workers/w1/reset").await,
        "admin",
    );
    assert_eq!(state.monitor.tasks().len(), 1, "t1 still runs");
}

#[tokio::test]
async fn a_task_token_ends_its_own_tasks_only_and_cannot_reset() {
    let state = scoped();
    let task = Who::Token(TASK);
    let admin = Who::Token(ADMIN);
    assert_eq!(register(&state, task, "mine").await.0, StatusCode::CREATED);
    assert_eq!(
        register(&state, admin, "theirs").await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        register(&state, Who::Uid(1000), "a-users").await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        owners(&state, task).await,
        [
            ("a-users".to_string(), "uid:1000".to_string()),
            ("mine".into(), "token:task".into()),
            ("theirs".into(), "token:admin".into()),
        ]
    );

    for other in ["theirs", "a-users"] {
        let (code, json) = call(&state, task, "DELETE", &format!("/v1/tasks/{other}")).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "{json}");
        assert!(
            json["error"].as_str().unwrap().contains("registered by"),
            "{json}"
        );
    }
    assert_eq!(state.monitor.tasks().len(), 3, "a refused end ends nothing");
    assert_forbidden(
        &call(&state, task, "POST", "/v1/workers/w1/reset").await,
        "admin",
    );

    let (code, json) = call(&state, task, "DELETE", "/v1/tasks/mine?exit_code=0").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["owner"], "token:task");
    // Ended already: the same answer again, to its owner only.
    assert_eq!(
        call(&state, task, "DELETE", "/v1/tasks/mine").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&state, Who::Uid(1000), "DELETE", "/v1/tasks/mine")
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let finished = state.outbox.read(0, 100);
    assert_eq!(
        finished
            .iter()
            .filter(|e| e.body.kind == EventKind::TaskFinished)
            .count(),
        1,
        "one task ended"
    );
}

#[tokio::test]
async fn an_admin_token_does_everything() {
    let state = scoped();
    let admin = Who::Token(ADMIN);
    assert_eq!(
        register(&state, Who::Token(TASK), "t1").await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        register(&state, Who::Uid(1000), "t2").await.0,
        StatusCode::CREATED
    );
    assert_eq!(register(&state, admin, "t3").await.0, StatusCode::CREATED);
    for id in ["t1", "t2", "t3"] {
        let (code, json) = call(&state, admin, "DELETE", &format!("/v1/tasks/{id}")).await;
        assert_eq!(code, StatusCode::OK, "{id}: {json}");
    }
    assert_eq!(
        call(&state, admin, "POST", "/v1/workers/w1/reset").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&state, admin, "GET", "/v1/events").await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn with_tokens_the_probes_and_metrics_stay_open_and_the_rest_needs_one() {
    let state = scoped();
    for uri in ["/health", "/ready", "/live", "/metrics"] {
        let (code, _) = call(&state, Who::Nobody, "GET", uri).await;
        assert!(
            code != StatusCode::UNAUTHORIZED && code != StatusCode::FORBIDDEN,
            "{uri}: {code}"
        );
    }
    for who in [Who::Nobody, Who::Token("wrong")] {
        for (method, uri) in [
            ("GET", "/v1/status"),
            ("GET", "/v1/events"),
            ("DELETE", "/v1/tasks/t1"),
            ("POST", "/v1/workers/w1/reset"),
        ] {
            let response = router(state.clone())
                .oneshot({
                    let req = Request::builder().method(method).uri(uri);
                    let req = match who {
                        Who::Token(t) => req.header("authorization", format!("Bearer {t}")),
                        _ => req,
                    };
                    req.body(Body::empty()).unwrap()
                })
                .await
                .unwrap();
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {uri}"
            );
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
        }
        assert_eq!(
            register(&state, who, "t1").await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert!(state.monitor.tasks().is_empty());
}

/// With no token configured, a TCP caller (any local user can reach
/// 127.0.0.1) reads and changes nothing; the socket's callers change what
/// their uid may.
#[tokio::test]
async fn with_no_token_tcp_only_reads_and_changes_go_through_the_socket() {
    let state = open();
    for uri in ["/v1/status", "/v1/events"] {
        assert_eq!(
            call(&state, Who::Nobody, "GET", uri).await.0,
            StatusCode::OK
        );
    }
    let refused = register(&state, Who::Nobody, "anon").await;
    assert_forbidden(&refused, "task");
    let error = refused.1["error"].as_str().unwrap();
    assert!(
        error.contains("anonymous has `read`") && error.contains("local socket"),
        "says who it is and what to do: {error}"
    );
    // A token sent to an agent without tokens changes nothing either.
    assert_forbidden(
        &register(&state, Who::Token("anything"), "t9").await,
        "task",
    );
    assert_eq!(
        register(&state, Who::Uid(1000), "users").await.0,
        StatusCode::CREATED
    );
    assert_forbidden(
        &call(&state, Who::Nobody, "POST", "/v1/workers/w1/reset").await,
        "admin",
    );
    assert_forbidden(
        &call(&state, Who::Nobody, "DELETE", "/v1/tasks/users").await,
        "task",
    );
    assert_eq!(
        owners(&state, Who::Nobody).await,
        [("users".to_string(), "uid:1000".to_string())],
        "the refused calls registered and ended nothing"
    );
    let kinds: Vec<EventKind> = state
        .outbox
        .read(0, 100)
        .iter()
        .map(|e| e.body.kind)
        .collect();
    assert_eq!(kinds, [EventKind::TaskStarted], "only the socket's task");

    // On the socket: a user ends its own task but resets nothing; root
    // and the agent's own uid are admin.
    assert_eq!(
        call(&state, Who::Uid(1001), "DELETE", "/v1/tasks/users")
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_forbidden(
        &call(&state, Who::Uid(1000), "POST", "/v1/workers/w1/reset").await,
        "admin",
    );
    for admin in [Who::Uid(0), Who::Uid(AGENT_UID)] {
        assert_eq!(
            call(&state, admin, "POST", "/v1/workers/w1/reset").await.0,
            StatusCode::OK
        );
    }
    let (code, json) = call(&state, Who::Uid(AGENT_UID), "DELETE", "/v1/tasks/users").await;
    assert_eq!(
        code,
        StatusCode::OK,
        "the agent's uid ends anyone's: {json}"
    );
}

#[tokio::test]
async fn socket_callers_need_no_token_root_is_admin_others_have_task() {
    let state = scoped();
    let user = Who::Uid(1000);
    let root = Who::Uid(0);
    assert_eq!(
        call(&state, user, "GET", "/v1/status").await.0,
        StatusCode::OK
    );
    assert_eq!(register(&state, user, "u1").await.0, StatusCode::CREATED);
    assert_eq!(
        register(&state, Who::Uid(1001), "u2").await.0,
        StatusCode::CREATED
    );
    assert_forbidden(
        &call(&state, user, "POST", "/v1/workers/w1/reset").await,
        "admin",
    );
    assert_eq!(
        call(&state, user, "DELETE", "/v1/tasks/u2").await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&state, user, "DELETE", "/v1/tasks/u1").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&state, root, "DELETE", "/v1/tasks/u2").await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&state, root, "POST", "/v1/workers/w1/reset").await.0,
        StatusCode::OK
    );
    assert_eq!(register(&state, root, "r1").await.0, StatusCode::CREATED);
    assert_eq!(
        owners(&state, root).await,
        [("r1".to_string(), "uid:0".to_string())]
    );
    // On the socket too, a token sent decides, and a wrong one is refused.
    let mut req = Request::get("/v1/status")
        .header("authorization", "Bearer wrong")
        .extension(Peer::Unix { uid: 0, pid: None });
    let (code, _) = respond(&state, req.body(Body::empty()).unwrap()).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    req = Request::post("/v1/workers/w1/reset")
        .header("authorization", format!("Bearer {READ}"))
        .extension(Peer::Unix { uid: 0, pid: None });
    let answer = respond(&state, req.body(Body::empty()).unwrap()).await;
    assert_forbidden(&answer, "admin");
}

/// A task id belongs to the principal that registered it first: another
/// caller (even an admin) gets 409 and changes nothing, neither the task,
/// nor its kept row, nor the events; the owner's retry answers the same.
#[tokio::test]
async fn a_running_task_id_belongs_to_its_first_caller() {
    let state = scoped();
    let cap_of = |state: &AppState| {
        state
            .outbox
            .saved_tasks()
            .into_iter()
            .map(|t| (t.task_id, t.owner, t.soft_cap))
            .collect::<Vec<_>>()
    };
    let post = |who: Who, cap: u64| {
        let req = Request::post("/v1/tasks").header("content-type", JSON);
        let req = match who {
            Who::Uid(uid) => req.extension(Peer::Unix { uid, pid: None }),
            Who::Token(token) => req.header("authorization", format!("Bearer {token}")),
            Who::Nobody => req,
        };
        req.body(Body::from(format!(
            r#"{{"task_id":"job-7","soft_cap_bytes":{cap}}}"#
        )))
        .unwrap()
    };
    let (code, first) = respond(&state, post(Who::Uid(1000), 100 * MIB)).await;
    assert_eq!(code, StatusCode::CREATED, "{first}");
    let kept = cap_of(&state);
    assert_eq!(
        kept,
        [("job-7".to_string(), "uid:1000".to_string(), Some(100 * MIB))]
    );

    for thief in [Who::Uid(1001), Who::Token(TASK), Who::Token(ADMIN)] {
        let (code, json) = respond(&state, post(thief, 5 * MIB)).await;
        assert_eq!(code, StatusCode::CONFLICT, "{json}");
        let error = json["error"].as_str().unwrap();
        assert!(
            error.contains("job-7") && error.contains("registered by `uid:1000`"),
            "{error}"
        );
    }
    assert_eq!(cap_of(&state), kept, "the kept row is the first caller's");
    assert_eq!(
        owners(&state, Who::Uid(0)).await,
        [("job-7".to_string(), "uid:1000".to_string())]
    );
    let (_, status) = call(&state, Who::Uid(0), "GET", "/v1/status").await;
    assert_eq!(status["tasks"][0]["soft_cap_bytes"], 100 * MIB, "{status}");

    // The owner's retry: the same answer, no new event, the row as it was.
    let (code, again) = respond(&state, post(Who::Uid(1000), 100 * MIB)).await;
    assert_eq!(code, StatusCode::CREATED);
    assert_eq!(again, first);
    assert_eq!(cap_of(&state), kept);
    let started = state
        .outbox
        .read(0, 100)
        .iter()
        .filter(|e| e.body.kind == EventKind::TaskStarted)
        .count();
    assert_eq!(started, 1, "one task_started, the first caller's");
}

/// A user on the socket registers only a process it owns (never pid 1);
/// root keeps today's rights. A refusal is 403 with the reason, and
/// registers nothing.
#[tokio::test]
async fn a_user_registers_only_its_own_processes() {
    let mut state = scoped();
    state.owners = Arc::new(crate::api::owned::tests::FakeOwners {
        processes: [(1, 0), (100, 1000), (200, 1001)].into(),
        ..Default::default()
    });
    let post = |uid: u32, task: &str, pid: u32| {
        Request::post("/v1/tasks")
            .header("content-type", JSON)
            .extension(Peer::Unix { uid, pid: None })
            .body(Body::from(format!(r#"{{"task_id":"{task}","pid":{pid}}}"#)))
            .unwrap()
    };
    for (pid, needle) in [
        (1, "pid 1"),
        (200, "uid 1001's"),
        (999, "cannot be looked at"),
    ] {
        let (code, json) = respond(&state, post(1000, "t", pid)).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "{json}");
        let error = json["error"].as_str().unwrap();
        assert!(error.contains(needle), "pid {pid}: {error}");
    }
    assert!(state.monitor.tasks().is_empty(), "nothing registered");
    assert!(state.outbox.read(0, 10).is_empty(), "no event");
    assert_eq!(
        respond(&state, post(1000, "mine", 100)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        respond(&state, post(0, "roots", 200)).await.0,
        StatusCode::CREATED,
        "root registers any process"
    );
}
