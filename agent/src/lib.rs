//! memwatch: a per-host memory watchdog. docs/design.md holds the words
//! (worker, task, soft cap, residual memory) and the contract;
//! docs/architecture.md the layers these modules form.

mod api;
mod cgroup;
mod cmd;
mod config;
mod daemon;
mod model;
mod outbox;
mod probe;
mod record;
mod sinks;
mod telemetry;
mod watchdog;

// The public surface: what tests/, agent/tests and agent/examples use. Every
// other item is `pub(crate)` (the `unreachable_pub` lint keeps it so), which
// lets the compiler find dead code.

/// Cgroups, for tests that make and watch their own.
pub use cgroup::{
    CgroupVersion, MemoryHierarchy, OwnedCgroup, kill_and_remove, memory::working_set,
};
/// The command line, for `main.rs`.
pub use cmd::{Cli, dispatch};
/// The configuration, for tests of what files and flags the agent accepts.
pub use config::{Config, ConfigError, DEFAULT_SOCKET, Overrides};
/// Events as the agent stores and ships them.
pub use model::{
    event::{Event, EventBody, EventKind, OomConstraint},
    pod::QosClass,
    units::{Size, Span},
};
/// The outbox and one sink's delivery loop, for delivery tests and benches.
pub use outbox::{Limits as OutboxLimits, Outbox};
/// Kernel records as the probe decodes them, for property tests.
pub use probe::{
    ProbeEvent,
    btf::{ParsedBtf, parsed as parsed_btf},
    decode::{ClockPair, record as decode_record},
};
/// A configured sink, as `Config::sinks` holds it.
pub use sinks::SinkConfig;
#[cfg(feature = "kubernetes")]
pub use sinks::kubernetes::{
    API_USES as KUBERNETES_API_USES, KubernetesSinkConfig, objects as kubernetes_objects,
};
#[cfg(feature = "nats")]
pub use sinks::nats::{NatsConfig, NatsSink};
#[cfg(feature = "otlp")]
pub use sinks::otlp::{OtlpConfig, OtlpProtocol, OtlpSink};
pub use sinks::{
    config::{Delivery, Secret},
    delivery::run as deliver,
    slurm::scontrol::fields as scontrol_fields,
    webhook::{
        EVENT_ID_HEADER, SECRET_PREFIX, SIGNATURE_HEADER, WEBHOOK_ID_HEADER,
        WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER, WebhookConfig, WebhookFormat,
        WebhookSink,
    },
};
/// The heap's kept free memory (for the agent's own tests).
#[doc(hidden)]
pub use telemetry::heap;
pub use telemetry::{Metrics, heap::limit_arenas as limit_malloc_arenas};
