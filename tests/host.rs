//! The integration tests that run on this host only (root, real
//! schedulers, brokers, containers; a few offline). One binary, so the
//! agent is linked once; each file is a module named by its path
//! (`schedulers::slurm::…`). The kernel matrix's tests are in `kernels.rs`.

mod chaos {
    /// The kernel ring buffer overflowed while the agent is stopped (root).
    mod ringbuf;
    /// The agent SIGKILLed mid-burst and restarted on its state directory, 5 times (root).
    mod sigkill;
    /// Fresh exec tasks crossing soft caps one after another, each seen by the kernel (root).
    mod soft_caps;
    /// An OOM storm at the bench's rate while cgroups churn: every kill reported once (root).
    mod storm;
    /// 200 tasks started and ended at once against a real agent (root).
    mod tasks;
}

mod delivery {
    /// The agent on a state directory that fills up (1 MiB tmpfs; root).
    mod disk_full;
    /// The agent on a state directory whose writes block (a frozen ext4; root):
    /// /live names the stalled loops, answers all along, and recovers.
    mod frozen_disk;
    /// Sinks against real servers (nats-server; installed from Debian as root when missing).
    mod nats;
    /// The OpenTelemetry sink against an independent OTLP receiver (Python's
    /// opentelemetry-proto + grpcio; pip-installed as root when missing), over
    /// gRPC and HTTP, through a receiver outage.
    mod otlp;
    /// The state directory of the build before (commit 454dafa, built from a git
    /// worktree) taken over by this one: nothing lost or renumbered.
    mod upgrade;
}

mod kernel {
    /// Start-up data (the parsed kernel BTF) is freed once the probe is attached (root).
    mod footprint;
    /// The eBPF programs' log (--probe-log): no instruction when off, records when on (root).
    mod probe_log;
    /// memwatch top in tmux (80x24) against a live agent and a leaking task (root).
    mod top;
    /// `memwatch exec --warn-signal`: the child's handler runs before the real OOM kill (root).
    mod warn;
}

mod ops {
    /// The admission policy's CEL against allowed and forbidden writes (offline).
    mod admission;
    /// A local user (a real unprivileged uid) against the agent as each shipped form runs it (root).
    mod attacker;
    /// Packaging: the documented capability set, run for real (root).
    mod capabilities;
    /// The image under podman + runc with the DaemonSet's security context and seccomp profiles (root).
    mod container;
    /// Docs, dashboard and alert rules checked against the code.
    mod docs;
    /// The OCI image, built with buildah from scratch and run from its root filesystem (root).
    mod image;
    /// The Kubernetes sink's objects and patches against the 1.37 schemas and
    /// kubectl's strategic merge (offline).
    mod kube_api;
    /// Kubernetes pod attribution on real kubelet-named memory cgroups (root).
    mod kube_pods;
    /// Packaging: Kubernetes manifests and the Helm chart against the schemas (offline).
    mod manifests;
    /// The seccomp profile against the container runtimes' defaults (offline).
    mod seccomp;
    /// `memwatch exec` over the agent's local socket, with no token (root: exec makes a memory cgroup).
    mod socket;
}

mod schedulers {
    /// A real Dask cluster (scheduler + 2 nanny workers; pip-installed as root when missing).
    mod dask;
    /// A real one-host Slurm cluster (slurmctld + 2 slurmd; apt-installed as root when missing).
    mod slurm;
}
