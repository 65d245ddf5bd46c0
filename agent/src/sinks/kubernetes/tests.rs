//! The Kubernetes sink against a FAKE API server (memwatch-test-support's
//! kube_api.rs: not
//! Kubernetes; none can run on the build machines). What the sink sends is
//! checked against the real schemas offline in tests/ops/kube_api.rs.
//!
//! Longer than 600 lines: every object the sink writes, each compared with
//! what the fake API server received; they share the server and the sink's
//! fixture.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::Utc;
use serde_json::json;
use tokio::sync::watch;

use memwatch_test_support::kube_api::{Call, FakeApi};

use super::{API_USES, KubernetesSink, KubernetesSinkConfig, names::PodNames, objects, pods};
use crate::{
    model::{
        event::{Event, EventBody, EventKind},
        health::Health,
    },
    outbox::Outbox,
    record::Recorder,
    sinks::{
        WorkerHealth,
        config::Delivery,
        delivery::{self, FailureClass, Sink},
        guard::Guard,
    },
    telemetry::Metrics,
};
use memwatch_test_support::wait::wait_until_async;

const NODE: &str = "n1";
const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";
const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct Harness {
    fake: FakeApi,
    recorder: Recorder,
    /// The sink's pod names, lent to the recorder as the daemon does.
    pods: PodNames,
    health: Arc<Mutex<HashMap<String, Health>>>,
    _token: tempfile::NamedTempFile,
    config: KubernetesSinkConfig,
    seq: u64,
}

impl Harness {
    async fn new(nodes: &[&str]) -> Self {
        let fake = FakeApi::start().await;
        for n in nodes {
            fake.cluster().add_node(n);
        }
        let token = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(token.path(), "fake-token").unwrap();
        let config = KubernetesSinkConfig {
            api_server: Some(fake.url()),
            token_file: token.path().to_path_buf(),
            ca_file: None,
            condition: true,
            taint: true,
            events: true,
            pod_names: true,
            guard: Guard::default(),
            delivery: Delivery {
                timeout: Duration::from_secs(5),
                retry_initial: Duration::from_millis(50),
                retry_max: Duration::from_millis(500),
                ..Delivery::default()
            },
        };
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let recorder = Recorder::new(Outbox::new("h", 1000, metrics.clone()), metrics);
        let pods = PodNames::default();
        recorder.enrich_with(vec![Arc::new(pods.clone())]);
        Self {
            fake,
            recorder,
            pods,
            health: Arc::default(),
            _token: token,
            config,
            seq: 0,
        }
    }

    fn set(&self, worker: &str, health: Health) {
        self.health.lock().unwrap().insert(worker.into(), health);
    }

    fn sink(&self) -> KubernetesSink {
        let health = self.health.clone();
        let health: WorkerHealth = Arc::new(move |w| health.lock().unwrap().get(w).copied());
        let client = super::client(&self.config).unwrap();
        let mut sink = KubernetesSink::with(
            self.config.clone(),
            client,
            NODE.into(),
            self.recorder.clone(),
            self.pods.clone(),
            health,
            vec!["w1".into(), "w2".into()],
        );
        sink.actions.set_settle(Duration::from_millis(20));
        sink
    }

    fn event(&mut self, kind: EventKind, f: impl FnOnce(&mut EventBody)) -> Event {
        self.seq += 1;
        let mut body = EventBody::new(kind);
        f(&mut body);
        Event {
            id: format!("0193a0b4-0000-7000-8000-{:012}", self.seq),
            seq: self.seq,
            time: Utc::now(),
            host: NODE.into(),
            epoch: None,
            body,
        }
    }

    fn worker_event(&mut self, kind: EventKind, worker: &str) -> Event {
        self.event(kind, |b| {
            b.worker = Some(worker.into());
            b.reason = Some("memory 3.0 GiB over the soft cap 2.0 GiB".into());
        })
    }

    fn oom(&mut self, pod: Option<(&str, &str)>) -> Event {
        self.event(EventKind::OomKill, |b| {
            b.worker = Some("w1".into());
            b.pid = Some(4242);
            b.comm = Some("python3".into());
            b.cgroup = Some(format!(
                "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
                UID.replace('-', "_")
            ));
            crate::model::pod::annotate(b);
            if let Some((ns, name)) = pod {
                b.pod_namespace = Some(ns.into());
                b.pod_name = Some(name.into());
            }
        })
    }

    /// The events the sink recorded itself (`guard_blocked`, …).
    fn reported(&self, kind: EventKind) -> Vec<Event> {
        self.recorder
            .outbox()
            .read(0, 1000)
            .into_iter()
            .filter(|e| e.body.kind == kind)
            .collect()
    }

    fn actions(&self, action: &str) -> u64 {
        self.recorder
            .metrics()
            .scheduler_actions
            .with_label_values(&["kubernetes", action])
            .get()
    }
}

#[tokio::test]
async fn the_condition_says_the_present_and_keeps_other_conditions() {
    let mut h = Harness::new(&[NODE]).await;
    h.config.taint = false;
    let mut sink = h.sink();
    let started = h.event(EventKind::AgentStarted, |_| {});
    sink.send(&[started]).await.unwrap();
    let (status, message) = h.fake.cluster().condition(NODE).expect("asserted at start");
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("False", "memwatch: every worker is healthy")
    );

    h.set("w1", Health::Unhealthy);
    let sick = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    sink.send(&[sick]).await.unwrap();
    let (status, message) = h.fake.cluster().condition(NODE).unwrap();
    assert_eq!(status, "True");
    assert!(
        message.contains("w1 (memory 3.0 GiB over the soft cap 2.0 GiB)"),
        "{message}"
    );
    let node = h.fake.cluster().nodes[NODE].clone();
    let conditions = node["status"]["conditions"].as_array().unwrap();
    assert_eq!(
        conditions.len(),
        2,
        "Ready kept, one memwatch condition: {conditions:?}"
    );
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    );
    let events = h.fake.cluster().events_of("WorkerUnhealthy");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["regarding"]["kind"], "Node");
    assert_eq!(events[0]["regarding"]["name"], NODE);
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["metadata"]["namespace"], "default");

    // An unhealthy event replayed after recovery sets nothing: the present.
    h.set("w1", Health::Healthy);
    let replayed = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    let recovered = h.worker_event(EventKind::WorkerRecovered, "w1");
    sink.send(&[replayed, recovered]).await.unwrap();
    assert_eq!(h.fake.cluster().condition(NODE).unwrap().0, "False");
    assert_eq!(
        h.fake.cluster().events_of("WorkerRecovered")[0]["type"],
        "Normal"
    );
    assert_eq!(h.actions("condition"), 3, "False, True, False");
}

#[tokio::test]
async fn the_taint_waits_for_the_cluster_guard_and_goes_with_recovery() {
    let mut h = Harness::new(&[NODE, "n2", "n3"]).await;
    // n2 cordoned, n3 tainted NoSchedule by someone else: 3 listed, 2 gone;
    // tainting n1 would leave none (floor 2 of 3).
    h.fake
        .cluster()
        .set_spec("n2", "unschedulable", json!(true));
    h.fake.cluster().set_spec(
        "n3",
        "taints",
        json!([{"key": "example.com/maintenance", "effect": "NoSchedule"}]),
    );
    let mut sink = h.sink();
    h.set("w1", Health::Unhealthy);
    let sick = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    sink.send(&[sick]).await.unwrap();
    assert!(!h.fake.cluster().tainted(NODE), "the guard refuses");
    let blocked = h.reported(EventKind::GuardBlocked);
    assert_eq!(blocked.len(), 1, "said once");
    let reason = blocked[0].body.reason.clone().unwrap();
    assert!(reason.contains("would leave 0 of 3"), "{reason}");
    assert_eq!(h.actions("guard_blocked"), 1);
    // A heartbeat while still refused says nothing more.
    let beat = h.event(EventKind::Heartbeat, |_| {});
    sink.send(&[beat]).await.unwrap();
    assert_eq!(h.reported(EventKind::GuardBlocked).len(), 1);

    // The operator uncordons n2 and clears n3: the next heartbeat taints.
    h.fake
        .cluster()
        .set_spec("n2", "unschedulable", json!(false));
    h.fake.cluster().set_spec("n3", "taints", json!([]));
    let beat = h.event(EventKind::Heartbeat, |_| {});
    sink.send(&[beat]).await.unwrap();
    assert!(h.fake.cluster().tainted(NODE));
    assert_eq!(h.actions("taint"), 1);

    h.set("w1", Health::Healthy);
    let back = h.worker_event(EventKind::WorkerRecovered, "w1");
    sink.send(&[back]).await.unwrap();
    assert!(!h.fake.cluster().tainted(NODE));
    assert_eq!(h.actions("untaint"), 1);
}

#[tokio::test]
async fn a_conflict_reads_the_node_again_and_keeps_the_other_taint() {
    let mut h = Harness::new(&[NODE, "n2"]).await;
    h.fake.cluster().set_spec(
        NODE,
        "taints",
        json!([{"key": "example.com/gpu", "value": "true", "effect": "PreferNoSchedule"}]),
    );
    h.fake.cluster().conflicts = 2;
    let mut sink = h.sink();
    h.set("w1", Health::Unhealthy);
    let sick = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    sink.send(&[sick]).await.unwrap();
    let c = h.fake.cluster();
    assert!(c.tainted(NODE));
    let taints = c.nodes[NODE]["spec"]["taints"].as_array().unwrap().clone();
    assert_eq!(
        taints.len(),
        2,
        "the other controller's taint kept: {taints:?}"
    );
    let conflicts = c
        .calls
        .iter()
        .filter(|call| call.resource == "nodes" && call.status == 409)
        .count();
    assert_eq!(conflicts, 2);
}

#[tokio::test]
async fn taints_set_in_the_same_moment_keep_the_lowest_name() {
    // This agent is on n1? No: on NODE; the racing agent is on "a0", which
    // sorts first and keeps its taint.
    let mut h = Harness::new(&[NODE, "a0"]).await;
    h.fake.cluster().race = Some("a0".into());
    let mut sink = h.sink();
    h.set("w1", Health::Unhealthy);
    let sick = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    sink.send(&[sick]).await.unwrap();
    {
        let c = h.fake.cluster();
        assert!(
            c.tainted("a0") && !c.tainted(NODE),
            "the lowest name keeps its taint"
        );
    }
    assert_eq!(h.actions("undo"), 1);
    let reason = h.reported(EventKind::GuardBlocked)[0]
        .body
        .reason
        .clone()
        .unwrap();
    assert!(reason.contains("a0 keeps its taint"), "{reason}");
}

#[tokio::test]
async fn a_restart_makes_the_node_say_the_present() {
    let mut h = Harness::new(&[NODE, "n2"]).await;
    // The last run left the node tainted and the condition True; the
    // worker recovered while the agent was down.
    h.set("w1", Health::Unhealthy);
    let sick = h.worker_event(EventKind::WorkerUnhealthy, "w1");
    h.sink().send(&[sick]).await.unwrap();
    assert!(h.fake.cluster().tainted(NODE));
    h.set("w1", Health::Healthy);
    let mut restarted = h.sink();
    let started = h.event(EventKind::AgentStarted, |_| {});
    restarted.send(&[started]).await.unwrap();
    assert!(
        !h.fake.cluster().tainted(NODE),
        "the taint of the past is taken off"
    );
    assert_eq!(h.fake.cluster().condition(NODE).unwrap().0, "False");
    // And the other way: unhealthy at start, the node says so at once.
    h.set("w2", Health::Unhealthy);
    let mut restarted = h.sink();
    let beat = h.event(EventKind::Heartbeat, |b| {
        b.state = Some(json!({"workers": [{"name": "w2", "status": "unhealthy", "reasons": ["42 OOM kills in 60s"]}]}));
    });
    restarted.send(&[beat]).await.unwrap();
    let (status, message) = h.fake.cluster().condition(NODE).unwrap();
    assert_eq!(status, "True");
    assert!(message.contains("w2 (42 OOM kills in 60s)"), "{message}");
    assert!(h.fake.cluster().tainted(NODE));
}

#[tokio::test]
async fn oom_kills_are_events_on_their_pod_deduplicated_and_rate_limited() {
    let mut h = Harness::new(&[NODE]).await;
    let mut sink = h.sink();
    let first = h.oom(Some(("shop", "cart-7d9f")));
    let second = h.oom(Some(("shop", "cart-7d9f")));
    let unnamed = h.oom(None);
    sink.send(&[first.clone(), second, unnamed]).await.unwrap();
    {
        let c = h.fake.cluster();
        let on_pod: Vec<_> = c
            .events_of("OOMKilling")
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == "Pod")
            .collect();
        assert_eq!(on_pod.len(), 1, "the second kill is the first one's series");
        let e = &on_pod[0];
        assert_eq!(e["metadata"]["namespace"], "shop");
        assert_eq!(e["metadata"]["name"], objects::event_name(NODE, &first.id));
        assert_eq!(e["regarding"]["name"], "cart-7d9f");
        assert_eq!(e["regarding"]["uid"], UID);
        assert_eq!(e["series"]["count"], 2);
        assert!(
            e["note"]
                .as_str()
                .unwrap()
                .contains("process 4242 (python3)"),
            "{e}"
        );
        let on_node: Vec<_> = c
            .events_of("OOMKilling")
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == "Node")
            .collect();
        assert_eq!(
            on_node.len(),
            1,
            "a pod the agent cannot name: the node, with the UID in the note"
        );
    }
    // 30 more kills of one pod: 25 Events (one and its series) at most.
    let kills: Vec<Event> = (0..30).map(|_| h.oom(Some(("shop", "hog")))).collect();
    sink.send(&kills).await.unwrap();
    assert_eq!(h.actions("event_rate_limited"), 5);
    let hog = h
        .fake
        .cluster()
        .events_of("OOMKilling")
        .into_iter()
        .find(|e| e["regarding"]["name"] == "hog")
        .unwrap();
    assert_eq!(hog["series"]["count"], 25);
}

#[tokio::test]
async fn a_predicted_kill_is_a_warning_on_its_pod_and_its_end_a_normal_one() {
    let mut h = Harness::new(&[NODE]).await;
    let mut sink = h.sink();
    let pod = |h: &mut Harness, kind: EventKind| {
        let mut e = h.oom(Some(("shop", "cart-7d9f")));
        e.body.kind = kind;
        e.body.pid = None;
        e.body.comm = None;
        e.body.eta_seconds = Some(12.4);
        e.body.limit_bytes = Some(512 << 20);
        e
    };
    let imminent = pod(&mut h, EventKind::OomImminent);
    let averted = pod(&mut h, EventKind::OomAverted);
    sink.send(&[imminent, averted]).await.unwrap();
    let c = h.fake.cluster();
    let warned = c.events_of("OOMImminent");
    assert_eq!(warned.len(), 1, "{warned:?}");
    let e = &warned[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["name"], "cart-7d9f");
    let note = e["note"].as_str().unwrap();
    assert!(
        note.contains("oom imminent")
            && note.contains("kill in 12 s")
            && note.contains("limit 512 MiB"),
        "{note}"
    );
    let ended = c.events_of("OOMAverted");
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["type"], "Normal");
}

#[tokio::test]
async fn pods_are_named_from_the_watch_and_by_uid_alone_without_it() {
    let h = Harness::new(&[NODE]).await;
    h.fake
        .cluster()
        .add_pod(NODE, "shop", "cart-7d9f", UID, &[("app", CID)]);
    h.fake
        .cluster()
        .add_pod("elsewhere", "shop", "other", "uid-other", &[]);
    let client = super::client(&h.config).unwrap();
    let names = h.pods.clone();
    let (stop_tx, stop) = watch::channel(false);
    let watch = tokio::spawn(pods::watch_pods(client, NODE.into(), names.clone(), stop));
    wait_until_async("the pod list", Duration::from_secs(10), || {
        let n = names.clone();
        async move { n.get(UID).is_some() }
    })
    .await;
    assert!(names.get("uid-other").is_none(), "only this node's pods");
    // A pod started later arrives through the watch.
    h.fake
        .cluster()
        .add_pod(NODE, "batch", "job-1", "uid-job", &[]);
    wait_until_async("the watched pod", Duration::from_secs(10), || {
        let n = names.clone();
        async move { n.get("uid-job").is_some() }
    })
    .await;
    let mut body = EventBody::new(EventKind::OomKill);
    body.cgroup = Some(format!(
        "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
        UID.replace('-', "_")
    ));
    let event = h.recorder.record(body.clone(), None);
    let json = serde_json::to_value(&event.body).unwrap();
    assert_eq!(json["pod_uid"], UID);
    assert_eq!(json["pod_namespace"], "shop");
    assert_eq!(json["pod_name"], "cart-7d9f");
    assert_eq!(json["container_name"], "app");
    // A pod the watch never saw: the UID alone.
    body.cgroup = Some(body.cgroup.unwrap().replace("6f1c2a3b", "00000000"));
    let event = h.recorder.record(body, None);
    assert!(event.body.pod_uid.is_some() && event.body.pod_name.is_none());
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .unwrap()
        .unwrap();
}

/// Retries with backoff from the cursor through 429, 500, 503, a conflict
/// and the API down for a minute: every Event arrives, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_an_api_down_for_a_minute_lose_nothing() {
    let mut h = Harness::new(&[NODE]).await;
    h.config.taint = false;
    let sink = h.sink();
    let outbox = h.recorder.outbox().clone();
    let metrics = h.recorder.metrics().clone();
    let (stop_tx, stop) = watch::channel(false);
    let run = tokio::spawn(delivery::run(sink, outbox.clone(), metrics.clone(), stop));
    let oom = |i: usize| {
        let mut b = EventBody::new(EventKind::OomKill);
        b.worker = Some("w1".into());
        b.pod_uid = Some(format!("uid-{i}"));
        b.pod_namespace = Some("shop".into());
        b.pod_name = Some(format!("pod-{i}"));
        b
    };
    h.fake.cluster().fail.extend([429, 500, 503, 409]);
    let mut recorded = Vec::new();
    for i in 0..5 {
        recorded.push(h.recorder.record(oom(i), None));
    }
    let arrived = |fake: &FakeApi, n: usize| fake.cluster().events_of("OOMKilling").len() >= n;
    wait_until_async(
        "the first five through the injected errors",
        Duration::from_secs(30),
        || {
            let ok = arrived(&h.fake, 5);
            async move { ok }
        },
    )
    .await;
    h.fake.stop().await;
    let down = std::time::Instant::now();
    for i in 5..20 {
        recorded.push(h.recorder.record(oom(i), None));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(down.elapsed())).await;
    assert!(!arrived(&h.fake, 6));
    h.fake.restart().await;
    wait_until_async(
        "every Event after the outage",
        Duration::from_secs(30),
        || {
            let ok = arrived(&h.fake, 20);
            async move { ok }
        },
    )
    .await;
    {
        let c = h.fake.cluster();
        let names: BTreeSet<String> = c.events.keys().map(|(_, n)| n.clone()).collect();
        for e in &recorded {
            assert!(
                names.contains(&objects::event_name(NODE, &e.id)),
                "{} lost",
                e.id
            );
        }
        assert_eq!(c.events_of("OOMKilling").len(), 20, "each once");
    }
    let failures = |class: FailureClass| {
        metrics
            .sink_failures
            .with_label_values(&["kubernetes", class.as_str()])
            .get()
    };
    assert!(
        failures(FailureClass::Status) >= 4,
        "429, 500, 503, 409 retried"
    );
    assert!(failures(FailureClass::Connect) >= 1, "the outage retried");
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn an_invalid_object_fails_for_good_and_forbidden_is_retried() {
    // 422 (the API finds the object invalid) would fail again: the class
    // that parks the event (delivery.rs) instead of retrying it forever.
    let mut h = Harness::new(&[NODE]).await;
    let mut sink = h.sink();
    let started = h.event(EventKind::AgentStarted, |_| {});
    sink.send(&[started]).await.unwrap();
    h.fake.cluster().fail.push_back(422);
    let oom = h.oom(Some(("shop", "cart")));
    let e = sink.send(&[oom]).await.unwrap_err();
    assert_eq!(e.class, FailureClass::Refused, "{e}");
    h.fake.cluster().fail.push_back(403);
    let oom = h.oom(Some(("shop", "cart-2")));
    let e = sink.send(&[oom]).await.unwrap_err();
    assert_eq!(
        e.class,
        FailureClass::Status,
        "RBAC is fixed by an operator: retried, {e}"
    );
}

#[tokio::test]
async fn the_code_calls_exactly_what_rbac_grants() {
    // Every path: condition, taint under the guard (list, get, patch), the
    // tie-break, Events and their series, the pod watch.
    let mut h = Harness::new(&[NODE, "a0", "n3", "n4"]).await;
    h.fake
        .cluster()
        .add_pod(NODE, "shop", "cart", UID, &[("app", CID)]);
    h.fake.cluster().race = Some("a0".into());
    let client = super::client(&h.config).unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let names = h.pods.clone();
    let watch = tokio::spawn(pods::watch_pods(client, NODE.into(), names.clone(), stop));
    wait_until_async("the pod list", Duration::from_secs(10), || {
        let n = names.clone();
        async move { n.get(UID).is_some() }
    })
    .await;
    let mut sink = h.sink();
    h.set("w1", Health::Unhealthy);
    let events = [
        h.worker_event(EventKind::WorkerUnhealthy, "w1"),
        h.oom(Some(("shop", "cart"))),
        h.oom(Some(("shop", "cart"))),
    ];
    sink.send(&events).await.unwrap();
    h.set("w1", Health::Healthy);
    let back = h.worker_event(EventKind::WorkerRecovered, "w1");
    sink.send(&[back]).await.unwrap();
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .unwrap()
        .unwrap();
    let calls: Vec<Call> = h.fake.cluster().calls.clone();
    let made: BTreeSet<(String, String, String)> = calls
        .iter()
        .map(|c| (c.group.clone(), c.resource.clone(), c.verb.clone()))
        .collect();
    let granted: BTreeSet<(String, String, String)> = API_USES
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    assert_eq!(made, granted, "calls made vs API_USES (what RBAC grants)");
}
