//! Kubernetes attribution on real memory cgroups named as the kubelet names
//! them (both cgroup drivers): with `[kubernetes] pod_tasks = true`, a pod
//! cgroup becomes a task of the node's worker, and an OOM kill in one of its
//! containers carries pod_uid, container_id and qos_class and is attributed
//! to the pod's task. Root only; never skipped in CI.

use std::{path::PathBuf, time::Duration};

use memwatch::{EventKind, MemoryHierarchy, OwnedCgroup, QosClass};
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

async fn pod_oom_is_attributed(levels: Vec<String>, uid: &str, cid: &str, qos: QosClass) {
    let agent = Agent::start_with_config("[kubernetes]\npod_tasks = true\n").await;
    let pod = PodCgroups::create(&levels, levels.len() - 1);
    pod.limit_container(64 * MIB);
    let pod_path = pod.pod.to_str().unwrap().to_string();

    // The pod is a task of the node's worker at once.
    let started = agent
        .wait_for_event(Duration::from_secs(10), "pod task_started", |e| {
            e.body.kind == EventKind::TaskStarted && e.body.cgroup.as_deref() == Some(&pod_path)
        })
        .await;
    assert_eq!(started.body.worker.as_deref(), Some("host"));
    assert_eq!(started.body.pod_uid.as_deref(), Some(uid));
    assert_eq!(started.body.qos_class, Some(qos));
    assert_eq!(started.body.container_id, None, "the pod, not a container");
    let task_id = started.body.task_id.clone().expect("task id");

    let container = pod.container.display().to_string();
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
