//! A FAKE Kubernetes API server for the sink's tests, on 127.0.0.1: not
//! Kubernetes. No API server can run on the build machines (no image
//! registry, no kube-apiserver to install), so the sink's behaviour
//! (retries, conflicts, an API down for a while, restarts, the taint
//! budget, the pod watch) is tested against this, and the objects it sends
//! are checked against the real schemas and kubectl's strategic merge
//! offline (tests/ops/kube_api.rs). Used by the sink's unit tests and by
//! the end-to-end test of the agent binary (tests/ops/kube_pods.rs).
//!
//! It serves what the sink calls: nodes (get, list, strategic-merge patch
//! of `spec.taints` with a `resourceVersion` precondition, of
//! `status.conditions` merged by `type`), events.k8s.io Events (create,
//! merge patch), pods (list, watch by `spec.nodeName`). It logs every
//! request, can answer the next ones with a status, and can stop (the port
//! refuses connections) and start again on the same port.

use std::{
    collections::{BTreeMap, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{Method, StatusCode, Uri, header},
    response::Response,
};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::mpsc, task::JoinSet};

/// The node condition and taint memwatch sets (as memwatch's
/// `kubernetes_objects` names them; this crate does not depend on it).
pub const CONDITION_TYPE: &str = "MemwatchUnhealthy";
pub const TAINT_KEY: &str = "memwatch.io/unhealthy";

/// One request as the fake saw it, as RBAC names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Call {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
    /// What it was answered.
    pub status: u16,
}

#[derive(Default)]
pub struct Cluster {
    pub nodes: BTreeMap<String, Value>,
    pub events: BTreeMap<(String, String), Value>,
    pub pods: Vec<Value>,
    pub calls: Vec<Call>,
    /// Answers for the next requests, in order, whatever they ask.
    pub fail: VecDeque<u16>,
    /// Node patches of `spec` answered 409 before applying (someone else
    /// changed the node: its resourceVersion moves too).
    pub conflicts: usize,
    /// A node tainted by memwatch when the agent's taint lands: another
    /// agent tainting in the same moment.
    pub race: Option<String>,
    /// Event creates that found the name taken.
    pub already_exists: usize,
    rv: u64,
    watchers: Vec<mpsc::UnboundedSender<Value>>,
}

impl Cluster {
    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Adds a node named `name`, schedulable, with kubelet's `Ready`.
    pub fn add_node(&mut self, name: &str) {
        let rv = self.bump();
        self.nodes.insert(
            name.into(),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "resourceVersion": rv, "uid": format!("uid-{name}")},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "lastHeartbeatTime": "2026-12-02T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
            }),
        );
    }

    /// Sets a field of a node's spec (`unschedulable`, `taints`) as another
    /// actor would.
    pub fn set_spec(&mut self, node: &str, key: &str, value: Value) {
        let rv = self.bump();
        let n = self.nodes.get_mut(node).expect("a node of the fake");
        n["spec"][key] = value;
        n["metadata"]["resourceVersion"] = rv.into();
    }

    /// A pod on `node`, announced to open watches.
    pub fn add_pod(
        &mut self,
        node: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        containers: &[(&str, &str)],
    ) {
        let rv = self.bump();
        let statuses: Vec<Value> = containers
            .iter()
            .map(|(name, id)| json!({"name": name, "containerID": format!("containerd://{id}"), "image": "i", "imageID": "", "ready": true, "restartCount": 0}))
            .collect();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": rv},
            "spec": {"nodeName": node, "containers": containers.iter().map(|(n, _)| json!({"name": n})).collect::<Vec<_>>()},
            "status": {"containerStatuses": statuses}
        });
        self.pods.push(pod.clone());
        self.watchers
            .retain(|w| w.send(json!({"type": "ADDED", "object": pod})).is_ok());
    }

    /// The memwatch condition of `node`: (status, message).
    pub fn condition(&self, node: &str) -> Option<(String, String)> {
        self.nodes[node]["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == CONDITION_TYPE)
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().into(),
                    c["message"].as_str().unwrap_or_default().into(),
                )
            })
    }

    /// Whether `node` carries memwatch's taint.
    pub fn tainted(&self, node: &str) -> bool {
        self.nodes[node]["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT_KEY))
    }

    /// Events by reason.
    pub fn events_of(&self, reason: &str) -> Vec<Value> {
        self.events
            .values()
            .filter(|e| e["reason"] == reason)
            .cloned()
            .collect()
    }
}

type Shared = Arc<Mutex<Cluster>>;

pub fn lock(c: &Shared) -> MutexGuard<'_, Cluster> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fake, serving until dropped or stopped.
pub struct FakeApi {
    pub addr: SocketAddr,
    pub cluster: Shared,
    server: Option<tokio::task::JoinHandle<()>>,
    connections: Arc<Mutex<JoinSet<()>>>,
}

impl FakeApi {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut fake = Self {
            addr: listener.local_addr().unwrap(),
            cluster: Shared::default(),
            server: None,
            connections: Arc::default(),
        };
        fake.serve(listener);
        fake
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn cluster(&self) -> MutexGuard<'_, Cluster> {
        lock(&self.cluster)
    }

    /// Closes the port and every open connection, and returns once they are
    /// all gone: the API is unreachable, and no request on a kept-alive
    /// connection can still be answered after this returns (an abort alone
    /// only asks the runtime, and a worker thread could be mid-request).
    pub async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        let mut connections =
            std::mem::take(&mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()));
        connections.shutdown().await;
        lock(&self.cluster).watchers.clear();
    }

    /// Serves again on the same port, with the same objects.
    pub async fn restart(&mut self) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("fake API server: rebinding {}: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let app = Router::new()
            .fallback(handle)
            .with_state(self.cluster.clone());
        let connections = self.connections.clone();
        self.server = Some(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                let mut connections = connections.lock().unwrap_or_else(|e| e.into_inner());
                // Finished connections leave the set as new ones come.
                while connections.try_join_next().is_some() {}
                connections.spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        }));
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        // Dropping the set aborts every connection.
        if let Some(server) = self.server.take() {
            server.abort();
        }
        drop(std::mem::take(
            &mut *self.connections.lock().unwrap_or_else(|e| e.into_inner()),
        ));
        lock(&self.cluster).watchers.clear();
    }
}

fn answer(status: u16, body: Value) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    answer(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// (group, resource, name, subresource) of a path.
fn route(path: &str) -> Option<(String, String, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", resource] => Some((String::new(), resource.to_string(), None)),
        ["api", "v1", resource, name] => {
            Some((String::new(), resource.to_string(), Some(name.to_string())))
        }
        ["api", "v1", resource, name, sub] => Some((
            String::new(),
            format!("{resource}/{sub}"),
            Some(name.to_string()),
        )),
        ["apis", group, _, "namespaces", ns, resource] => Some((
            group.to_string(),
            resource.to_string(),
            Some(format!("{ns}/")),
        )),
        ["apis", group, _, "namespaces", ns, resource, name] => Some((
            group.to_string(),
            resource.to_string(),
            Some(format!("{ns}/{name}")),
        )),
        _ => None,
    }
}

async fn handle(State(cluster): State<Shared>, method: Method, uri: Uri, body: Bytes) -> Response {
    let Some((group, resource, name)) = route(uri.path()) else {
        return status(
            404,
            "NotFound",
            &format!("fake API server: no route {}", uri.path()),
        );
    };
    let query = uri.query().unwrap_or_default();
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (&method, name.as_deref()) {
        (&Method::GET, Some(n)) if !n.ends_with('/') => "get",
        (&Method::GET, _) if watch => "watch",
        (&Method::GET, _) => "list",
        (&Method::PATCH, _) => "patch",
        (&Method::POST, _) => "create",
        _ => "other",
    };
    let mut c = lock(&cluster);
    let response = match c.fail.pop_front() {
        Some(code) => status(
            code,
            "Injected",
            "fake API server: answered as the test asked",
        ),
        None => serve(&mut c, verb, &resource, name.as_deref(), query, &body),
    };
    c.calls.push(Call {
        group,
        resource,
        verb: verb.into(),
        name: name.filter(|n| !n.ends_with('/')),
        status: response.status().as_u16(),
    });
    response
}

fn serve(
    c: &mut Cluster,
    verb: &str,
    resource: &str,
    name: Option<&str>,
    query: &str,
    body: &[u8],
) -> Response {
    let patch: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match (verb, resource) {
        ("get", "nodes") => match c.nodes.get(name.unwrap()) {
            Some(n) => answer(200, n.clone()),
            None => status(404, "NotFound", "node not found"),
        },
        ("list", "nodes") => {
            let rv = c.rv.to_string();
            answer(
                200,
                json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": rv},
                               "items": c.nodes.values().cloned().collect::<Vec<_>>()}),
            )
        }
        ("patch", "nodes/status") => {
            let name = name.unwrap().to_string();
            let rv = c.bump();
            let Some(node) = c.nodes.get_mut(&name) else {
                return status(404, "NotFound", "node not found");
            };
            let conditions = node["status"]["conditions"].as_array_mut().unwrap();
            for new in patch["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
            {
                match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
                    Some(old) => *old = new.clone(),
                    None => conditions.push(new.clone()),
                }
            }
            node["metadata"]["resourceVersion"] = rv.into();
            answer(200, node.clone())
        }
        ("patch", "nodes") => patch_node(c, name.unwrap(), &patch),
        ("create", "events") => {
            let ns = name.unwrap().trim_end_matches('/').to_string();
            let ename = patch["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if c.events.contains_key(&(ns.clone(), ename.clone())) {
                c.already_exists += 1;
                return status(409, "AlreadyExists", "event already exists");
            }
            c.events.insert((ns, ename), patch.clone());
            answer(201, patch)
        }
        ("patch", "events") => {
            let (ns, ename) = name.unwrap().split_once('/').unwrap();
            match c.events.get_mut(&(ns.to_string(), ename.to_string())) {
                Some(e) => {
                    for (k, v) in patch.as_object().into_iter().flatten() {
                        e[k] = v.clone();
                    }
                    answer(200, e.clone())
                }
                None => status(404, "NotFound", "event not found"),
            }
        }
        ("list", "pods") | ("watch", "pods") => pods(c, verb, query),
        _ => status(405, "MethodNotAllowed", "fake API server: not served"),
    }
}

fn patch_node(c: &mut Cluster, name: &str, patch: &Value) -> Response {
    if c.conflicts > 0 {
        c.conflicts -= 1;
        c.set_spec(name, "unschedulable", Value::Bool(false));
        return status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    let Some(node) = c.nodes.get(name) else {
        return status(404, "NotFound", "node not found");
    };
    let want = &patch["metadata"]["resourceVersion"];
    if !want.is_null() && *want != node["metadata"]["resourceVersion"] {
        return status(409, "Conflict", "the object has been modified");
    }
    if let Some(taints) = patch["spec"].get("taints") {
        let tainting = taints
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT_KEY));
        c.set_spec(name, "taints", taints.clone());
        if let (true, Some(other)) = (tainting, c.race.take()) {
            c.set_spec(
                &other,
                "taints",
                json!([{"key": TAINT_KEY, "effect": "NoSchedule", "value": "true"}]),
            );
        }
    }
    answer(200, c.nodes[name].clone())
}

fn pods(c: &mut Cluster, verb: &str, query: &str) -> Response {
    let node = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("fieldSelector="))
        .map(|s| s.replace("%3D", "=").replace("%3d", "="))
        .and_then(|s| s.strip_prefix("spec.nodeName=").map(str::to_string));
    let Some(node) = node else {
        return status(
            400,
            "BadRequest",
            "fake API server: pods only by spec.nodeName",
        );
    };
    let mine: Vec<Value> = c
        .pods
        .iter()
        .filter(|p| p["spec"]["nodeName"] == node.as_str())
        .cloned()
        .collect();
    let rv = c.rv.to_string();
    if verb == "list" {
        return answer(
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": rv}, "items": mine}),
        );
    }
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    c.watchers.push(tx);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let event = rx.recv().await?;
        Some((
            Ok::<_, std::io::Error>(Bytes::from(format!("{event}\n"))),
            rx,
        ))
    });
    let _ = StatusCode::OK;
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}
