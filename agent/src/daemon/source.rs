//! The event source the configuration asks for: eBPF, the poll fallback,
//! or eBPF falling back to polling when it cannot load; and the tasks that
//! consume it, stopped together.

use anyhow::Context as _;
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::{info, warn};

use super::SHUTDOWN_GRACE;
use crate::{
    cgroup::MemoryHierarchy,
    config::{Config, SourceChoice},
    model::source::SourceKind,
    probe::{
        ProbeEvent,
        ebpf::{EbpfProbe, ProbeOptions},
        poll,
    },
    telemetry::liveness::{IDLE_BEAT, Liveness},
};

pub(super) struct Source {
    /// `None` when polling.
    probe: Option<EbpfProbe>,
    /// Reads the ring buffers (or polls) into the pipeline's queue.
    reader: JoinHandle<()>,
    /// Why the eBPF source could not load, when the agent fell back to polling.
    pub(super) ebpf_unavailable: Option<String>,
    pub(super) pipeline: Option<JoinHandle<()>>,
    pub(super) sampling: Option<JoinHandle<()>>,
}

impl Source {
    pub(super) async fn start(
        config: &Config,
        hierarchy: &MemoryHierarchy,
        tx: mpsc::Sender<ProbeEvent>,
        liveness: &Liveness,
    ) -> anyhow::Result<Self> {
        let beat = || liveness.register("reader", poll::DEFAULT_INTERVAL.max(IDLE_BEAT));
        let polling = |reader, ebpf_unavailable| Self {
            probe: None,
            reader,
            ebpf_unavailable,
            pipeline: None,
            sampling: None,
        };
        if config.source == SourceChoice::Poll {
            info!("source poll (configured)");
            let reader = poll::spawn(hierarchy.clone(), poll::DEFAULT_INTERVAL, tx, beat());
            return Ok(polling(reader, None));
        }
        let btf_path = config.btf_path.clone();
        let options = ProbeOptions {
            growth: config.growth_settings(),
            floor: config.probe_floor,
            oom_by_pid: config.probe_oom_by_pid,
            oom_ring_bytes: config.probe_oom_ring_bytes,
            stats: config.bpf_stats,
            log: config.probe_log,
            object: None,
        };
        let loaded = tokio::task::spawn_blocking(move || EbpfProbe::load(&btf_path, &options))
            .await
            .context("probe loader panicked")?;
        match (loaded, config.source) {
            (Ok(mut probe), _) => {
                let reader = probe.spawn_reader(tx, beat())?;
                Ok(Self {
                    probe: Some(probe),
                    reader,
                    ebpf_unavailable: None,
                    pipeline: None,
                    sampling: None,
                })
            }
            (Err(error), SourceChoice::Auto) => {
                warn!(%error, "eBPF unavailable: falling back to polling the cgroup files");
                let reader = poll::spawn(hierarchy.clone(), poll::DEFAULT_INTERVAL, tx, beat());
                Ok(polling(reader, Some(error.to_string())))
            }
            (Err(error), _) => Err(error.into()),
        }
    }

    pub(super) fn probe(&self) -> Option<&EbpfProbe> {
        self.probe.as_ref()
    }

    /// Which source runs, and how it is attached (for humans).
    pub(super) fn describe(&self) -> (SourceKind, &'static str) {
        match &self.probe {
            Some(p) => (SourceKind::Ebpf, p.attach_kind().as_str()),
            None => (SourceKind::Poll, "cgroup files"),
        }
    }

    /// Why memory growth is sampled only (no kernel program), when it is.
    pub(super) fn growth_unavailable(&self) -> Option<String> {
        self.probe
            .as_ref()
            .and_then(EbpfProbe::growth_unavailable)
            .map(str::to_string)
    }

    /// Detaches (nothing new arrives), then lets the pipeline drain what
    /// is queued.
    pub(super) async fn stop(self) {
        if let Some(sampling) = self.sampling {
            sampling.abort();
        }
        self.reader.abort();
        drop(self.probe);
        if let Some(pipeline) = self.pipeline {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, pipeline).await;
        }
    }
}
