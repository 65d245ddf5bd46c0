//! Kubernetes attribution on real memory cgroups named as the kubelet names
//! them (both cgroup drivers): with `[kubernetes] pod_tasks = true`, a pod
//! cgroup becomes a task of the node's worker, and an OOM kill in one of its
//! containers carries pod_uid, container_id and qos_class and is attributed
//! to the pod's task. With `[kubernetes] api = true` against a FAKE API
//! server (memwatch-test-support's kube_api.rs: not Kubernetes, none can run
//! here), the same kill also names the pod from the agent's pod watch and is
//! an `OOMKilling` Event on the pod, and the node says the present. Root
//! only; never skipped in CI.

use std::{path::PathBuf, time::Duration};

use memwatch::{EventKind, MemoryHierarchy, OwnedCgroup, QosClass};
use memwatch_test_support::{kube_api::FakeApi, wait::wait_until_async};
use memwatch_tests::{agent::Agent, kernel_tests_enabled, memhog_in};

const MIB: u64 = 1 << 20;

/// The cgroups of one pod, removed (innermost first) when dropped; a
/// directory that existed before the test is left alone.
struct PodCgroups {
    levels: Vec<Option<OwnedCgroup>>,
    pod: PathBuf,
    container: PathBuf,
}

impl PodCgroups {
    fn create(relative_levels: &[String], pod_depth: usize) -> PodCgroups {
        let root = MemoryHierarchy::discover()
            .expect("a memory cgroup hierarchy")
            .root;
        let mut path = root.clone();
        let mut levels = Vec::new();
        for level in relative_levels {
            path.push(level);
            let owned = (!path.exists())
                .then(|| OwnedCgroup::create(path.clone()).expect("create a pod cgroup"));
            levels.push(owned);
        }
        let pod = relative_levels[..pod_depth]
            .iter()
            .fold(root, |p, l| p.join(l));
        PodCgroups {
            levels,
            pod,
            container: path,
        }
    }

    fn limit_container(&self, bytes: u64) {
        self.levels
            .last()
            .and_then(Option::as_ref)
            .expect("the container cgroup is ours")
            .set_hard_limit(bytes)
            .expect("memory limit");
    }
}

impl Drop for PodCgroups {
    fn drop(&mut self) {
        while let Some(level) = self.levels.pop() {
            drop(level);
        }
    }
}

fn uid() -> String {
    // A UUID-shaped UID unique to this run.
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{pid:08x}-{:04x}-4{:03x}-8abc-{nanos:012x}",
        pid & 0xffff,
        nanos & 0xfff
    )
}

/// What one pod's OOM kill gave: its `task_started`, the `oom_kill`, the
/// victim's pid, and the pod's cgroups (removed when dropped).
struct PodOom {
    started: memwatch::Event,
    kill: memwatch::Event,
    pid: u32,
    pod: PodCgroups,
}

/// Makes the pod's cgroups (`levels`, the container last, limited to
/// 64 MiB), waits for the pod's task, then OOM-kills a memhog in the
/// container and waits for the agent's `oom_kill`.
async fn pod_oom(agent: &Agent, levels: &[String]) -> PodOom {
    let pod = PodCgroups::create(levels, levels.len() - 1);
    pod.limit_container(64 * MIB);
    let pod_path = pod.pod.to_str().unwrap().to_string();
    // The pod is a task of the node's worker at once.
    let started = agent
        .wait_for_event(Duration::from_secs(10), "pod task_started", |e| {
            e.body.kind == EventKind::TaskStarted && e.body.cgroup.as_deref() == Some(&pod_path)
        })
        .await;
    let mut child = memhog_in(&pod.container, 200, 30)
        .spawn()
        .expect("spawn memhog");
    let pid = child.id();
    let kill = agent
        .wait_for_event(Duration::from_secs(30), "pod oom_kill", |e| {
            e.body.kind == EventKind::OomKill && e.body.pid == Some(pid)
        })
        .await;
    let _ = child.wait();
    PodOom {
        started,
        kill,
        pid,
        pod,
    }
}

async fn pod_oom_is_attributed(levels: Vec<String>, uid: &str, cid: &str, qos: QosClass) {
    let agent = Agent::start_with_config("[kubernetes]\npod_tasks = true\n").await;
    let PodOom {
        started, kill, pod, ..
    } = pod_oom(&agent, &levels).await;
    assert_eq!(started.body.worker.as_deref(), Some("host"));
    assert_eq!(started.body.pod_uid.as_deref(), Some(uid));
    assert_eq!(started.body.qos_class, Some(qos));
    assert_eq!(started.body.container_id, None, "the pod, not a container");
    let task_id = started.body.task_id.clone().expect("task id");

    let container = pod.container.display().to_string();
    assert_eq!(kill.body.cgroup.as_deref(), Some(container.as_str()));
    assert_eq!(kill.body.pod_uid.as_deref(), Some(uid));
    assert_eq!(kill.body.container_id.as_deref(), Some(cid));
    assert_eq!(kill.body.qos_class, Some(qos));
    assert_eq!(kill.body.task_id.as_deref(), Some(task_id.as_str()));
    // And on the wire, as a scheduler reads it.
    let (_, raw) = agent
        .get(&format!("/v1/events?after={}&limit=1", kill.seq - 1))
        .await;
    assert!(raw.contains(&format!("\"pod_uid\":\"{uid}\"")), "{raw}");
    drop(pod);
}

#[tokio::test]
async fn systemd_driver_pod_oom_carries_pod_container_and_qos() {
    if !kernel_tests_enabled("systemd_driver_pod_oom_carries_pod_container_and_qos") {
        return;
    }
    let uid = uid();
    let cid = format!("{:064x}", u128::from(std::process::id()) << 3 | 0xc);
    let levels = vec![
        "kubepods.slice".to_string(),
        "kubepods-burstable.slice".to_string(),
        format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
        format!("cri-containerd-{cid}.scope"),
    ];
    pod_oom_is_attributed(levels, &uid, &cid, QosClass::Burstable).await;
}

#[tokio::test]
async fn cgroupfs_driver_guaranteed_pod_oom_carries_pod_container_and_qos() {
    if !kernel_tests_enabled("cgroupfs_driver_guaranteed_pod_oom_carries_pod_container_and_qos") {
        return;
    }
    let uid = uid();
    let cid = format!("{:064x}", u128::from(std::process::id()) << 5 | 0xf);
    let levels = vec!["kubepods".to_string(), format!("pod{uid}"), cid.clone()];
    pod_oom_is_attributed(levels, &uid, &cid, QosClass::Guaranteed).await;
}

#[tokio::test]
async fn with_the_api_a_pod_oom_names_the_pod_and_is_an_event_on_it() {
    if !kernel_tests_enabled("with_the_api_a_pod_oom_names_the_pod_and_is_an_event_on_it") {
        return;
    }
    let uid = uid();
    let cid = format!("{:064x}", u128::from(std::process::id()) << 7 | 0xa);
    // The node name the test agent is given (`--node-name`).
    let node = "test-node";
    let fake = FakeApi::start().await;
    fake.cluster().add_node(node);
    fake.cluster()
        .add_pod(node, "shop", "cart-7d9f", &uid, &[("app", cid.as_str())]);
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "fake-token").unwrap();
    let agent = Agent::start_with_config(&format!(
        "[kubernetes]\npod_tasks = true\napi = true\n\
         api_server = \"{}\"\ntoken_file = \"{}\"\nretry_max = \"1s\"\n",
        fake.url(),
        token.path().display()
    ))
    .await;
    // The node says the present from the start.
    wait_until_async("the node condition", Duration::from_secs(30), || {
        let said = fake.cluster().condition(node).map(|(status, _)| status);
        async move { said.as_deref() == Some("False") }
    })
    .await;
    // The pod watch has listed the node's pods.
    let levels = vec![
        "kubepods.slice".to_string(),
        "kubepods-burstable.slice".to_string(),
        format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
        format!("cri-containerd-{cid}.scope"),
    ];
    let PodOom {
        started,
        kill,
        pid,
        pod,
    } = pod_oom(&agent, &levels).await;
    let json = serde_json::to_value(&kill.body).unwrap();
    assert_eq!(json["pod_uid"], uid.as_str());
    assert_eq!(json["pod_namespace"], "shop", "{json}");
    assert_eq!(json["pod_name"], "cart-7d9f", "{json}");
    assert_eq!(json["container_name"], "app", "{json}");
    assert_eq!(
        started.body.pod_name.as_deref(),
        Some("cart-7d9f"),
        "the task too"
    );
    // And Kubernetes hears it: an OOMKilling Event on the pod.
    let name = memwatch::kubernetes_objects::event_name(node, &kill.id);
    wait_until_async("the OOMKilling Event", Duration::from_secs(30), || {
        let there = fake
            .cluster()
            .events
            .contains_key(&("shop".to_string(), name.clone()));
        async move { there }
    })
    .await;
    let event = fake.cluster().events[&("shop".to_string(), name)].clone();
    assert_eq!(event["reason"], "OOMKilling");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "cart-7d9f");
    assert_eq!(event["regarding"]["uid"], uid.as_str());
    let note = event["note"].as_str().unwrap();
    assert!(
        note.contains(&format!("process {pid}")) && note.contains("container app"),
        "{note}"
    );
    drop(pod);
}
