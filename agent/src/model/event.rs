//! The events memwatch emits: the contract of docs/design.md and docs/events.md.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Adds what one part of the agent knows to every event before it is
/// stored (a pod's names, the scheduler's name of a killed process). A sink
/// lends one through its start (sinks/mod.rs `Lent`); the recorder asks
/// each in turn. Cheap and non-blocking: it runs for every event.
pub(crate) trait Enrich: Send + Sync {
    fn enrich(&self, body: &mut EventBody);
}

/// What happened. Serialized in snake_case (`oom_kill`, `agent_started`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    AgentStarted,
    TaskStarted,
    TaskRejected,
    TaskFinished,
    SoftCapExceeded,
    OomKill,
    WorkerUnhealthy,
    WorkerRecovered,
    Heartbeat,
    /// A scheduler sink did not act on an unhealthy worker because the
    /// cluster guard forbade it (too few workers would remain).
    GuardBlocked,
    /// A scheduler refused an action a sink asked for (Dask retired none of
    /// the workers named); the sink tries again later.
    ActionRefused,
    /// A sink did not act on an event the present contradicts (the worker
    /// is healthy again; a kill recovered after the fact): nothing done.
    ActionSkipped,
    /// A stored event that does not parse was set aside (the outbox's
    /// quarantine table), so that it stalls no sink.
    EventQuarantined,
    /// A watched worker started being throttled at `memory.high` (its
    /// `memory.events` `high` counter grew after having been still).
    MemoryHighThrottled,
    /// A cgroup's unreclaimable memory grows toward a limit it will reach
    /// within the worker's `predict_horizon` (`eta_seconds`).
    OomImminent,
    /// A predicted kill is no longer coming: the growth stopped or the ETA
    /// left the horizon, for the hold time.
    OomAverted,
}

impl EventKind {
    pub const ALL: [EventKind; 16] = [
        Self::AgentStarted,
        Self::TaskStarted,
        Self::TaskRejected,
        Self::TaskFinished,
        Self::SoftCapExceeded,
        Self::OomKill,
        Self::WorkerUnhealthy,
        Self::WorkerRecovered,
        Self::Heartbeat,
        Self::GuardBlocked,
        Self::ActionRefused,
        Self::ActionSkipped,
        Self::EventQuarantined,
        Self::MemoryHighThrottled,
        Self::OomImminent,
        Self::OomAverted,
    ];

    /// How much the kind matters when the outbox is full: lower is dropped
    /// first (policy `drop_low_priority_first`, see the outbox).
    pub fn priority(self) -> Priority {
        match self {
            Self::Heartbeat => Priority::Heartbeat,
            Self::OomKill
            | Self::WorkerUnhealthy
            | Self::TaskRejected
            | Self::GuardBlocked
            | Self::ActionRefused
            | Self::OomImminent => Priority::Critical,
            Self::AgentStarted
            | Self::ActionSkipped
            | Self::EventQuarantined
            | Self::TaskStarted
            | Self::TaskFinished
            | Self::SoftCapExceeded
            | Self::MemoryHighThrottled
            | Self::OomAverted
            | Self::WorkerRecovered => Priority::Normal,
        }
    }

    /// The wire name, also used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentStarted => "agent_started",
            Self::TaskStarted => "task_started",
            Self::TaskRejected => "task_rejected",
            Self::TaskFinished => "task_finished",
            Self::SoftCapExceeded => "soft_cap_exceeded",
            Self::OomKill => "oom_kill",
            Self::WorkerUnhealthy => "worker_unhealthy",
            Self::WorkerRecovered => "worker_recovered",
            Self::Heartbeat => "heartbeat",
            Self::GuardBlocked => "guard_blocked",
            Self::ActionRefused => "action_refused",
            Self::ActionSkipped => "action_skipped",
            Self::EventQuarantined => "event_quarantined",
            Self::MemoryHighThrottled => "memory_high_throttled",
            Self::OomImminent => "oom_imminent",
            Self::OomAverted => "oom_averted",
        }
    }
}

/// Drop order when the outbox is full: heartbeats first, then normal
/// events; critical ones only when nothing else is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Heartbeats: the next one says the same, newer.
    Heartbeat = 0,
    /// Task and worker life-cycle events a scheduler can rebuild from state.
    Normal = 1,
    /// `oom_kill`, `worker_unhealthy`, `task_rejected`: a scheduler must act on them.
    Critical = 2,
}

/// Which limit an OOM kill hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OomConstraint {
    /// A memory cgroup's limit.
    Cgroup,
    /// The whole host ran out of memory.
    Global,
}

/// One event as stored and shipped. `id`, `seq`, `time` and `host` are set
/// by the outbox when the event is appended; the rest is [`EventBody`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Unique, assigned once: the same on every delivery attempt.
    pub id: String,
    /// Strictly increasing within an epoch, never reused; gaps possible.
    pub seq: u64,
    /// When it happened (the kernel's time stamp for kernel events).
    pub time: DateTime<Utc>,
    pub host: String,
    /// The outbox database the event is of (a UUIDv7): seqs are comparable
    /// only within one epoch. Absent in events of builds before epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    #[serde(flatten)]
    pub body: EventBody,
}

/// What an event says; fields that do not apply are left out of the JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventBody {
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Path of the memory cgroup (full filesystem path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Process id (the kernel's tgid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Thread id, when it differs from `pid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_cap_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<OomConstraint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The scheduler's own name for the worker (a Dask worker address),
    /// when a scheduler sink knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_worker: Option<String>,
    /// `soft_cap_exceeded`: how fast memory grew just before the crossing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_bytes_per_sec: Option<i64>,
    /// OOM kills: the breakdown behind `rss_bytes` and the process that
    /// triggered the kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomDetails>,
    /// Heartbeats: the agent's state (the same JSON as `GET /v1/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<serde_json::Value>,
    /// Kubernetes pod UID, when `cgroup` is a kubelet pod's (see kube.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Container runtime id, when `cgroup` is a pod container's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The pod's namespace, name, and the container's name, with `pod_uid`
    /// when the agent watches the node's pods (`[kubernetes] api = true`)
    /// and knows the pod (sinks/kubernetes/names.rs `PodNames`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// The pod's QoS class: `guaranteed`, `burstable`, `besteffort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<crate::model::pod::QosClass>,
    /// `oom_kill`: `true` when the kill was found after the fact in the
    /// kernel's counters, not seen live (no victim named; it may be old).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    /// `memory_high_throttled`: how much the kernel's `high` counter grew
    /// since the previous sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// `oom_imminent`: seconds until the limit is reached at the present rate
    /// (`growth_bytes_per_sec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<f64>,
    /// `oom_imminent`: 0–1, the share of the trend's pairwise slopes that
    /// agree the memory grows (scaled down while few samples are in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// `oom_imminent`: the cgroup is above its `memory.high` and the rate
    /// is the throttled one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled: Option<bool>,
    /// `oom_kill` that was predicted: seconds from the first `oom_imminent`
    /// to the kill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_lead_seconds: Option<f64>,
    /// `oom_kill` that was predicted: the kill's time minus the time the last
    /// `oom_imminent` said (positive: later than said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_error_seconds: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomDetails {
    pub anon_rss_bytes: u64,
    pub file_rss_bytes: u64,
    pub shmem_rss_bytes: u64,
    pub total_vm_bytes: u64,
    /// The process whose allocation made the kernel pick a victim.
    pub trigger_pid: u32,
    /// kernfs id of the victim's memory cgroup (its directory's inode).
    pub memcg_id: u64,
}

impl EventBody {
    /// A body of `kind` with nothing else set.
    pub fn new(kind: EventKind) -> Self {
        Self {
            kind,
            worker: None,
            task_id: None,
            cgroup: None,
            pid: None,
            tid: None,
            comm: None,
            rss_bytes: None,
            soft_cap_bytes: None,
            limit_bytes: None,
            constraint: None,
            limit_cgroup: None,
            reason: None,
            scheduler_worker: None,
            growth_bytes_per_sec: None,
            oom: None,
            state: None,
            pod_uid: None,
            container_id: None,
            pod_namespace: None,
            pod_name: None,
            container_name: None,
            qos_class: None,
            recovered: None,
            count: None,
            eta_seconds: None,
            confidence: None,
            throttled: None,
            predicted_lead_seconds: None,
            eta_error_seconds: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_contract_fields_and_omits_absent_ones() {
        let mut body = EventBody::new(EventKind::OomKill);
        body.pid = Some(42);
        body.comm = Some("memhog".into());
        body.cgroup = Some("/sys/fs/cgroup/memory/t".into());
        body.rss_bytes = Some(4096);
        let event = Event {
            id: "0192-abc".into(),
            seq: 7,
            time: DateTime::parse_from_rfc3339("2026-11-30T07:00:00.123Z")
                .unwrap()
                .into(),
            host: "node-1".into(),
            epoch: None,
            body,
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "id": "0192-abc", "seq": 7, "time": "2026-11-30T07:00:00.123Z",
                "host": "node-1", "kind": "oom_kill", "pid": 42, "comm": "memhog",
                "cgroup": "/sys/fs/cgroup/memory/t", "rss_bytes": 4096
            })
        );
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn kind_names_match_serde() {
        for kind in EventKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
    }
}
