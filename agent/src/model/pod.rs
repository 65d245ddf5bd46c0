//! Kubernetes attribution: the kubelet names pod and container cgroups
//! after the pod's UID, its QoS class and the container runtime's id. This
//! turns such a path back into those names, for both cgroup drivers:
//!
//! - systemd: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`
//!   (UID dashes become `_`; Guaranteed pods sit directly under
//!   `kubepods.slice` as `kubepods-pod<uid>.slice`; runtimes `cri-containerd-`,
//!   `docker-`, `crio-`);
//! - cgroupfs: `kubepods/burstable/pod<uid>/<id>` (Guaranteed: `kubepods/pod<uid>/<id>`).
//!
//! Anything before the kubepods component (the hierarchy's mount point,
//! `kubelet.slice/` on kind nodes) is ignored. Pure: no I/O. The pod's
//! names come from the API instead (the Kubernetes sink's pod names, when
//! it watches the node's pods: sinks/kubernetes/names.rs).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::model::{event::EventBody, spec::Rule};

/// The pod's quality-of-service class, from the kubelet's cgroup layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QosClass {
    Guaranteed,
    Burstable,
    #[serde(rename = "besteffort")]
    BestEffort,
}

/// What a kubelet cgroup path says about the pod (and container) in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodCgroup {
    /// The pod's UID, with dashes (`metadata.uid`).
    pub pod_uid: String,
    /// The runtime's container id, when the path is a container's.
    pub container_id: Option<String>,
    pub qos_class: QosClass,
}

/// Reads the pod, container and QoS class from a cgroup path; `None` when
/// the path is not under a kubelet pod cgroup.
pub(crate) fn parse(path: &str) -> Option<PodCgroup> {
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    parts.find(|p| is_kubepods_root(p))?;
    let mut next = parts.next()?;
    let qos = match qos_component(next) {
        Some(qos) => {
            next = parts.next()?;
            qos
        }
        None => QosClass::Guaranteed,
    };
    let pod_uid = pod_component(next)?;
    let container_id = match parts.next() {
        Some(part) => Some(container_component(part)?),
        None => None,
    };
    Some(PodCgroup {
        pod_uid,
        container_id,
        qos_class: qos,
    })
}

/// Fills `pod_uid`, `container_id` and `qos_class` from the event's
/// `cgroup`, when it is a pod's.
pub(crate) fn annotate(body: &mut EventBody) {
    let Some(pod) = body.cgroup.as_deref().and_then(parse) else {
        return;
    };
    body.pod_uid = Some(pod.pod_uid);
    body.container_id = pod.container_id;
    body.qos_class = Some(pod.qos_class);
}

/// The built-in rules behind `[kubernetes] pod_tasks`: every pod cgroup
/// under the memory hierarchy `root`, of either driver and any QoS class,
/// is a task of `worker` (its containers are not tasks of their own).
pub(crate) fn pod_rules(root: &Path, worker: &str) -> Vec<Rule> {
    [
        "kubepods.slice/kubepods-pod*.slice",
        "kubepods.slice/kubepods-*.slice/kubepods-*-pod*.slice",
        "kubepods/pod*",
        "kubepods/*/pod*",
    ]
    .into_iter()
    .map(|tail| Rule {
        worker: worker.to_string(),
        pattern: glob::Pattern::new(&format!(
            "{}/{tail}",
            glob::Pattern::escape(&root.display().to_string())
        ))
        .expect("built-in pod patterns are valid globs"),
        soft_cap: None,
    })
    .collect()
}

fn is_kubepods_root(part: &str) -> bool {
    // `kubelet-kubepods.slice` is the root on nodes whose kubelet runs in a
    // slice of its own (kind).
    part == "kubepods" || part == "kubepods.slice" || part.ends_with("-kubepods.slice")
}

fn qos_component(part: &str) -> Option<QosClass> {
    let name = part
        .strip_suffix(".slice")
        .and_then(|s| s.rsplit_once('-'))
        .map_or(part, |(_, last)| last);
    match name {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    }
}

/// `pod<uid>` (cgroupfs) or `…-pod<uid_with_underscores>.slice` (systemd).
fn pod_component(part: &str) -> Option<String> {
    let uid = match part.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        None => part.strip_prefix("pod")?.to_string(),
    };
    let valid = !uid.is_empty()
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && uid.chars().any(|c| c.is_ascii_hexdigit());
    valid.then_some(uid)
}

/// `<runtime>-<id>.scope` (systemd) or `<id>` (cgroupfs).
fn container_component(part: &str) -> Option<String> {
    let id = match part.strip_suffix(".scope") {
        Some(scope) => ["cri-containerd-", "docker-", "crio-", "cri-o-"]
            .iter()
            .find_map(|prefix| scope.strip_prefix(prefix))?,
        None => part,
    };
    let valid = !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit());
    valid.then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::event::EventKind;

    const UID: &str = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pod(qos: QosClass, container: bool) -> Option<PodCgroup> {
        Some(PodCgroup {
            pod_uid: UID.into(),
            container_id: container.then(|| CID.into()),
            qos_class: qos,
        })
    }

    #[test]
    fn systemd_driver_paths() {
        let u = UID.replace('-', "_");
        let root = "/sys/fs/cgroup/memory/kubepods.slice";
        for (path, expected) in [
            (
                format!(
                    "{root}/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope"
                ),
                pod(QosClass::Burstable, true),
            ),
            (
                format!(
                    "{root}/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{CID}.scope"
                ),
                pod(QosClass::BestEffort, true),
            ),
            (
                format!("{root}/kubepods-pod{u}.slice/crio-{CID}.scope"),
                pod(QosClass::Guaranteed, true),
            ),
            (
                format!("{root}/kubepods-pod{u}.slice"),
                pod(QosClass::Guaranteed, false),
            ),
            (
                format!("{root}/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"),
                pod(QosClass::Burstable, false),
            ),
            (
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope"
                ),
                pod(QosClass::BestEffort, true),
            ),
        ] {
            assert_eq!(parse(&path), expected, "{path}");
        }
    }

    #[test]
    fn cgroupfs_driver_paths() {
        for (path, expected) in [
            (
                format!("/sys/fs/cgroup/memory/kubepods/burstable/pod{UID}/{CID}"),
                pod(QosClass::Burstable, true),
            ),
            (
                format!("/kubepods/besteffort/pod{UID}"),
                pod(QosClass::BestEffort, false),
            ),
            (
                format!("/sys/fs/cgroup/kubepods/pod{UID}/{CID}"),
                pod(QosClass::Guaranteed, true),
            ),
        ] {
            assert_eq!(parse(&path), expected, "{path}");
        }
    }

    #[test]
    fn other_paths_are_not_pods() {
        for path in [
            "/sys/fs/cgroup/memory/memwatch/task-1",
            "/sys/fs/cgroup/memory/kubepods.slice",
            "/sys/fs/cgroup/memory/kubepods.slice/kubepods-burstable.slice",
            "/kubepods/burstable",
            "/kubepods/podzzz",
            "/system.slice/containerd.service",
            // conmon and other helpers are not containers
            &format!("/kubepods.slice/kubepods-pod{UID}.slice/crio-conmon-{CID}.scope"),
            "",
        ] {
            assert_eq!(parse(path), None, "{path}");
        }
    }

    #[test]
    fn annotate_fills_the_fields_and_serializes_them() {
        let mut body = EventBody::new(EventKind::OomKill);
        body.cgroup = Some(format!("/kubepods/burstable/pod{UID}/{CID}"));
        annotate(&mut body);
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["pod_uid"], UID);
        assert_eq!(json["container_id"], CID);
        assert_eq!(json["qos_class"], "burstable");

        let mut plain = EventBody::new(EventKind::OomKill);
        plain.cgroup = Some("/sys/fs/cgroup/memory/w1".into());
        annotate(&mut plain);
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("pod_uid").is_none() && json.get("qos_class").is_none());
    }

    #[test]
    fn pod_rules_match_pods_of_both_drivers_but_not_their_containers() {
        let rules = pod_rules(Path::new("/sys/fs/cgroup/memory"), "host");
        let matches = |p: &str| rules.iter().any(|r| r.pattern.matches(p));
        let u = UID.replace('-', "_");
        let m = "/sys/fs/cgroup/memory";
        assert!(matches(&format!(
            "{m}/kubepods.slice/kubepods-pod{u}.slice"
        )));
        assert!(matches(&format!(
            "{m}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
        )));
        assert!(matches(&format!("{m}/kubepods/pod{UID}")));
        assert!(matches(&format!("{m}/kubepods/besteffort/pod{UID}")));
        assert!(!matches(&format!(
            "{m}/kubepods.slice/kubepods-burstable.slice"
        )));
        assert!(!matches(&format!(
            "{m}/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{CID}.scope"
        )));
        assert!(rules.iter().all(|r| r.worker == "host"));
    }

    fn qos_strategy() -> impl Strategy<Value = QosClass> {
        prop_oneof![
            Just(QosClass::Guaranteed),
            Just(QosClass::Burstable),
            Just(QosClass::BestEffort)
        ]
    }

    proptest! {
        /// Whatever the UID, container id, QoS, driver, runtime and prefix,
        /// the kubelet's own naming parses back to the same values.
        #[test]
        fn kubelet_names_round_trip(
            uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            cid in proptest::option::of("[0-9a-f]{64}"),
            qos in qos_strategy(),
            systemd in any::<bool>(),
            runtime in prop_oneof![Just("cri-containerd"), Just("docker"), Just("crio")],
            prefix in prop_oneof![Just(""), Just("/sys/fs/cgroup/memory"), Just("/sys/fs/cgroup")],
        ) {
            let qos_name = match qos {
                QosClass::Guaranteed => None,
                QosClass::Burstable => Some("burstable"),
                QosClass::BestEffort => Some("besteffort"),
            };
            let mut path = prefix.to_string();
            if systemd {
                path.push_str("/kubepods.slice");
                let u = uid.replace('-', "_");
                match qos_name {
                    Some(q) => path.push_str(&format!("/kubepods-{q}.slice/kubepods-{q}-pod{u}.slice")),
                    None => path.push_str(&format!("/kubepods-pod{u}.slice")),
                }
                if let Some(c) = &cid {
                    path.push_str(&format!("/{runtime}-{c}.scope"));
                }
            } else {
                path.push_str("/kubepods");
                if let Some(q) = qos_name {
                    path.push_str(&format!("/{q}"));
                }
                path.push_str(&format!("/pod{uid}"));
                if let Some(c) = &cid {
                    path.push_str(&format!("/{c}"));
                }
            }
            let parsed = parse(&path).expect("a pod path");
            prop_assert_eq!(parsed, PodCgroup { pod_uid: uid, container_id: cid, qos_class: qos });
        }

        /// Never panics on arbitrary input.
        #[test]
        fn arbitrary_paths_do_not_panic(path in ".*") {
            let _ = parse(&path);
        }
    }
}
