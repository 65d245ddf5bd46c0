//! Loading and attaching the eBPF programs, and reading their ring buffer.
//!
//! Longer than 600 lines: loading, attaching (with each hook's fallback) and
//! reading the ring buffer share the one `Ebpf` object and its maps; the
//! decoding is decode.rs, the BTF btf.rs.

use crate::telemetry::liveness::{Beat, IDLE_BEAT};
use std::{
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use std::sync::Mutex;

use agent_common::{
    FastPath, GROWTH_GLOBAL, GrowthSettings, KernelOffsets, OFFSETS_GLOBAL, ProbeCounter,
    WatchedCgroup, maps, programs::AttachPoint,
};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, ProgramError, RawTracePoint},
};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use super::{
    KernelWatch, ProbeEvent, Watch,
    btf::{self, BtfError},
    decode::{self, ClockPair},
    hooks::{self, Growth, Role, VictimForm},
    privilege,
};

/// The compiled programs, built by build.rs with aya-build.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf"));

/// Cgroup records read in a row before the OOM ring is looked at again.
const CHURN_BATCH: usize = 64;

/// A ring buffer the reader can wait on.
type Ring = AsyncFd<RingBuf<MapData>>;

/// Registers a ring buffer (the probe's, or aya-log's) with the runtime.
fn watch_ring<T: AsRawFd>(ring: T) -> Result<AsyncFd<T>, ProbeError> {
    // SAFETY: the ring owns its map fd, which stays open and the same
    // until the ring (moved into the AsyncFd) is dropped with it.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| ProbeError::Poll(e.into()))
}

/// aya-log's ring of the programs' log records (`--probe-log`).
const LOG_RING: &str = "AYA_LOGS";

/// Sends up to `max` records of `ring` to `tx`; how many were read, or
/// `None` when `tx` is closed. Readiness was cleared before: a record
/// committed meanwhile wakes the next wait. A record borrows the ring:
/// it is decoded (a copy) before awaiting.
async fn drain(
    ring: &mut Ring,
    max: usize,
    tx: &mpsc::Sender<ProbeEvent>,
    page_size: u64,
    clock: &ClockPair,
) -> Option<usize> {
    let mut read = 0;
    while read < max {
        let Some(decoded) = ring
            .get_mut()
            .next()
            .map(|item| decode::record(&item, page_size, clock))
        else {
            break;
        };
        read += 1;
        match decoded {
            Ok(event) => tx.send(event).await.ok()?,
            Err(error) => warn!(%error, "undecodable ring buffer record"),
        }
    }
    Some(read)
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error(
        "missing capability {missing}: loading the eBPF probe needs CAP_BPF and CAP_PERFMON \
         (or CAP_SYS_ADMIN); run as root or grant them (e.g. `setcap cap_bpf,cap_perfmon+ep`)"
    )]
    Privilege { missing: String },
    #[error("kernel BTF: {0}")]
    Btf(#[from] BtfError),
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// The capabilities are there, a seccomp filter refuses bpf(2).
    #[error("seccomp blocks bpf(): {why} (the error: {source})")]
    Seccomp {
        why: String,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("eBPF object: `{name}` {detail}")]
    Object { name: &'static str, detail: String },
    #[error("attaching to `{tracepoint}` (tp_btf: {btf}; raw tracepoint: {source})")]
    Attach {
        tracepoint: &'static str,
        btf: String,
        #[source]
        source: ProgramError,
    },
    #[error("watching the ring buffer: {0}")]
    Poll(#[source] io::Error),
    #[error("reading the probe's log records (--probe-log): {0}")]
    Log(String),
}

/// How the OOM program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttachKind {
    BtfTracePoint,
    RawTracePoint,
}

impl AttachKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BtfTracePoint => "tp_btf",
            Self::RawTracePoint => "raw_tracepoint",
        }
    }
}

/// A hook as attached: what for, and how.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub(crate) struct AttachedHook {
    /// `category/name` in tracefs.
    pub tracepoint: &'static str,
    pub role: Role,
    #[serde(serialize_with = "attach_str")]
    pub attach: AttachKind,
}

fn attach_str<S: serde::Serializer>(kind: &AttachKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.as_str())
}

/// How to load the probe.
#[derive(Clone, Debug)]
pub(crate) struct ProbeOptions {
    pub growth: GrowthSettings,
    /// Benchmarks only: an empty program on the growth hook instead of the
    /// growth program, to measure the hook's own cost.
    pub floor: bool,
    /// Turn on the kernel's run-time statistics (`kernel.bpf_stats_enabled`)
    /// while the probe runs: each program's run count and time become
    /// metrics, at ~20 ns per run.
    pub stats: bool,
    /// Tests only: find OOM victims the way kernels whose `mark_victim`
    /// passes only a pid must (through `signal_generate`), on this kernel.
    pub oom_by_pid: bool,
    /// Tests only: the OOM ring's size in bytes instead of
    /// [`agent_common::OOM_RING_BYTES`] (a power of two, whole pages), small
    /// enough for a test to overflow it.
    pub oom_ring_bytes: Option<u32>,
    /// The programs' aya-log records in the agent's log (`--probe-log`):
    /// the `_log` twins are loaded. Off, the plain programs, which hold no
    /// logging code.
    pub log: bool,
    /// Tests only (`doctor --probe-object`): load this object file instead
    /// of the programs built in (a build without the `log` feature, to
    /// compare sizes).
    pub object: Option<PathBuf>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            growth: GrowthSettings::DEFAULT,
            floor: false,
            stats: false,
            oom_by_pid: false,
            oom_ring_bytes: None,
            log: false,
            object: None,
        }
    }
}

/// The loaded, attached probe. Dropping it detaches every program.
pub(crate) struct EbpfProbe {
    ebpf: Ebpf,
    attach: AttachKind,
    hooks: Vec<AttachedHook>,
    counters: PerCpuArray<MapData, u64>,
    /// The growth program's per-CPU fast path (its event count); `None`
    /// when the growth program is not attached.
    fast_path: Option<PerCpuArray<MapData, FastPath>>,
    watched: Option<std::sync::Arc<WatchedMap>>,
    /// Why the growth program is not attached, when it is not.
    growth_unavailable: Option<String>,
    /// Holds the kernel's run-time statistics on while it lives.
    _stats: Option<std::os::fd::OwnedFd>,
    /// Whether the programs' log records are read (`--probe-log`).
    log: bool,
}

/// One loaded program's size, as the kernel holds it.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ProgramSize {
    pub name: String,
    /// Instructions after the verifier (dead code removed, rewrites
    /// applied): what runs, before the JIT.
    pub translated_insns: u32,
    /// Instructions the verifier walked (Linux 5.16+), when known.
    pub verified_insns: Option<u32>,
}

/// The WATCHED map: soft caps and sample sizes of the cgroups user space
/// watches.
pub(crate) struct WatchedMap {
    map: Mutex<BpfHashMap<MapData, u64, WatchedCgroup>>,
    page_size: u64,
}

impl KernelWatch for WatchedMap {
    fn set(&self, cgroup_id: u64, watch: Option<Watch>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let pages = |bytes: Option<u64>| bytes.map_or(0, |b| b.div_ceil(self.page_size));
        let result = match watch {
            Some(watch) => {
                let value = WatchedCgroup {
                    soft_cap_pages: pages(watch.cap_bytes),
                    generation: watch.generation,
                    // Some: at least a page (0 is "no samples").
                    sample_pages: watch.sample_bytes.map_or(0, |b| pages(Some(b)).max(1)),
                };
                map.insert(cgroup_id, value, 0)
            }
            None => map.remove(&cgroup_id).or(Ok(())),
        };
        if let Err(error) = result {
            warn!(cgroup_id, %error, "cannot update the kernel's watched cgroups (WATCHED map)");
        }
    }
}

impl EbpfProbe {
    /// Checks privileges, resolves offsets from the kernel's BTF, loads the
    /// programs and attaches them (tp_btf first, raw tracepoint otherwise).
    pub(crate) fn load(btf_path: &Path, options: &ProbeOptions) -> Result<Self, ProbeError> {
        let growth = options.growth;
        let missing = privilege::missing_for_tracing();
        if !missing.is_empty() {
            return Err(ProbeError::Privilege {
                missing: privilege::names(&missing),
            });
        }
        raise_memlock_limit();

        let kernel_btf = btf::load(btf_path)?;
        let victim_form = match VictimForm::of(&kernel_btf)? {
            VictimForm::Task if options.oom_by_pid => VictimForm::TaskAsPid,
            form => form,
        };
        let stats = options
            .stats
            .then(|| aya::sys::enable_stats(aya::sys::Stats::RunTime))
            .and_then(|r| {
                r.map_err(|e| warn!(error = %e, "cannot turn on BPF run-time statistics"))
                    .ok()
            });
        let mut offsets: KernelOffsets = btf::kernel_offsets(&kernel_btf)?;
        let growth_unavailable = btf::growth_offsets(&kernel_btf, &mut offsets)
            .err()
            .map(|e| format!("growth tracking off: {e}"));
        // Everything needed from it is read: freed before the load peaks.
        drop(kernel_btf);
        debug!(?offsets, "kernel offsets from BTF");

        let mut loader = EbpfLoader::new();
        loader
            .override_global(OFFSETS_GLOBAL, &offsets, true)
            .override_global(GROWTH_GLOBAL, &growth, true);
        if let Some(bytes) = options.oom_ring_bytes {
            loader.map_max_entries(maps::OOM_EVENTS, bytes);
        }
        if !options.log {
            // The plain programs are loaded (no logging code in them): the
            // records' ring, never written, shrinks to one page.
            loader.map_max_entries(LOG_RING, procfs::page_size() as u32);
        }
        let loaded = match &options.object {
            Some(path) => loader.load_file(path),
            None => loader.load(PROGRAMS),
        };
        let mut ebpf = loaded.map_err(|e| match privilege::seccomp_refusal(&e) {
            Some(why) => ProbeError::Seccomp {
                why,
                source: Box::new(e),
            },
            None => ProbeError::Load(Box::new(e)),
        })?;
        let aya_btf = aya::Btf::parse_file(btf_path, aya::Endianness::default())
            .map(btf::Parsed::new)
            .map_err(|e| e.to_string());
        let growth_hook = match &growth_unavailable {
            None if options.floor => Growth::Floor,
            None => Growth::Program,
            Some(reason) => {
                warn!(%reason, "memory growth is followed by sampling only");
                Growth::Off
            }
        };
        let (attach, attached) =
            attach_all(&mut ebpf, &aya_btf, victim_form, growth_hook, options.log)?;
        let counters = take_map(&mut ebpf, maps::PROBE_COUNTERS, PerCpuArray::try_from)?;
        let (fast_path, watched) = if growth_unavailable.is_none() {
            let fast = take_map(&mut ebpf, maps::FAST_PATH, PerCpuArray::try_from)?;
            let map = take_map(&mut ebpf, maps::WATCHED, BpfHashMap::try_from)?;
            let watched = WatchedMap {
                map: Mutex::new(map),
                page_size: procfs::page_size(),
            };
            (Some(fast), Some(std::sync::Arc::new(watched)))
        } else {
            (None, None)
        };
        Ok(Self {
            ebpf,
            attach,
            hooks: attached,
            counters,
            fast_path,
            watched,
            growth_unavailable,
            _stats: stats,
            log: options.log,
        })
    }

    /// `tp_btf` when every program attached that way, else `raw_tracepoint`.
    pub(crate) fn attach_kind(&self) -> AttachKind {
        self.attach
    }

    /// Every hook attached, in attach order.
    pub(crate) fn hooks(&self) -> &[AttachedHook] {
        &self.hooks
    }

    /// Starts the task that reads both ring buffers into `tx`, the OOM ring
    /// first. When `tx` is full the reader waits, a ring fills, and the
    /// kernel counts what it cannot store ([`ProbeCounter::RingbufFull`]):
    /// the queue is bounded at both ends and every loss is counted. Beats
    /// `beat` at every wake and every [`IDLE_BEAT`] while the rings are empty.
    pub(crate) fn spawn_reader(
        &mut self,
        tx: mpsc::Sender<ProbeEvent>,
        beat: Beat,
    ) -> Result<JoinHandle<()>, ProbeError> {
        let mut oom = watch_ring(take_map(
            &mut self.ebpf,
            maps::OOM_EVENTS,
            RingBuf::try_from,
        )?)?;
        let mut events = watch_ring(take_map(&mut self.ebpf, maps::EVENTS, RingBuf::try_from)?)?;
        // The programs' log records, written to this log as they come.
        let mut log = match self.log {
            true => Some(watch_ring(
                aya_log::EbpfLogger::init(&mut self.ebpf).map_err(|e| {
                    ProbeError::Log(format!("{e} (a probe built without the `log` feature?)"))
                })?,
            )?),
            false => None,
        };
        let page_size = procfs::page_size();
        Ok(tokio::spawn(async move {
            loop {
                beat.beat();
                // No wakeup for a while: read anyway. The kernel wakes a
                // reader only when it had caught up, so a wakeup that came
                // between the last read and clear_ready() is lost for good;
                // the timeout bounds that to one IDLE_BEAT.
                let logged = async {
                    match log.as_mut() {
                        Some(log) => log.readable_mut().await.map(|mut g| {
                            g.get_inner_mut().flush();
                            g.clear_ready();
                        }),
                        None => std::future::pending().await,
                    }
                };
                let woke = tokio::select! {
                    ready = oom.readable_mut() => ready.map(|mut g| g.clear_ready()),
                    ready = events.readable_mut() => ready.map(|mut g| g.clear_ready()),
                    ready = logged => ready,
                    _ = tokio::time::sleep(IDLE_BEAT) => Ok(()),
                };
                if let Err(error) = woke {
                    warn!(%error, "ring buffer poll failed; reader stops");
                    return;
                }
                let clock = ClockPair::now();
                // Every OOM record, then cgroup records a batch at a time,
                // looking at the OOM ring again between batches: a kill never
                // waits behind a backlog of churn.
                loop {
                    let Some(_) = drain(&mut oom, usize::MAX, &tx, page_size, &clock).await else {
                        return; // the pipeline is gone: shutting down
                    };
                    let Some(read) = drain(&mut events, CHURN_BATCH, &tx, page_size, &clock).await
                    else {
                        return;
                    };
                    if read < CHURN_BATCH {
                        break;
                    }
                }
            }
        }))
    }

    /// The programs' counters, summed over CPUs, in [`ProbeCounter::ALL`] order.
    pub(crate) fn kernel_counters(&self) -> [u64; ProbeCounter::COUNT as usize] {
        ProbeCounter::ALL.map(|c| match (c, &self.fast_path) {
            (ProbeCounter::GrowthRuns, Some(fast)) => fast
                .get(&0, 0)
                .map(|per_cpu| per_cpu.iter().map(|f| f.events).sum())
                .unwrap_or(0),
            _ => self
                .counters
                .get(&(c as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0),
        })
    }

    /// Each attached program's run count and total run time (nanoseconds);
    /// zeros unless run-time statistics are on.
    pub(crate) fn program_stats(&self) -> Vec<(String, u64, u64)> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some((
                    name.to_string(),
                    info.run_count(),
                    info.run_time().as_nanos() as u64,
                ))
            })
            .collect()
    }

    /// Every loaded program's size as the kernel holds it, by name.
    pub(crate) fn program_sizes(&self) -> Vec<ProgramSize> {
        let mut sizes: Vec<ProgramSize> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgramSize {
                    name: name.to_string(),
                    translated_insns: info.size_translated()? / 8,
                    verified_insns: info.verified_instruction_count(),
                })
            })
            .collect();
        sizes.sort_by(|a, b| a.name.cmp(&b.name));
        sizes
    }

    /// The kernel's soft-cap map, when the growth program runs.
    pub(crate) fn kernel_watch(&self) -> Option<std::sync::Arc<WatchedMap>> {
        self.watched.clone()
    }

    /// Why memory growth is not followed in the kernel, when it is not.
    pub(crate) fn growth_unavailable(&self) -> Option<&str> {
        self.growth_unavailable.as_deref()
    }
}

/// Attaches one tracepoint: its `tp_btf` program, or its raw twin when the
/// kernel refuses `tp_btf`.
fn attach_point(
    ebpf: &mut Ebpf,
    btf: &Result<btf::Parsed<aya::Btf>, String>,
    point: AttachPoint,
) -> Result<AttachKind, ProbeError> {
    let btf_error = match attach_btf(ebpf, btf, point) {
        Ok(()) => return Ok(AttachKind::BtfTracePoint),
        Err(error) => {
            warn!(tracepoint = point.tracepoint, %error, "tp_btf refused; trying a raw tracepoint");
            error.to_string()
        }
    };
    let program: &mut RawTracePoint = program_mut(ebpf, point.raw)?;
    program
        .load()
        .and_then(|()| program.attach(point.tracepoint))
        .map(|_| AttachKind::RawTracePoint)
        .map_err(|source| ProbeError::Attach {
            tracepoint: point.tracepoint,
            btf: btf_error,
            source,
        })
}

fn attach_btf(
    ebpf: &mut Ebpf,
    btf: &Result<btf::Parsed<aya::Btf>, String>,
    point: AttachPoint,
) -> anyhow::Result<()> {
    let btf = btf
        .as_ref()
        .map_err(|e| anyhow::anyhow!("kernel BTF: {e}"))?;
    let program: &mut BtfTracePoint = program_mut(ebpf, point.btf)?;
    program.load(point.tracepoint, btf)?;
    program.attach()?;
    Ok(())
}

fn program_mut<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, ProbeError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(ProbeError::Object {
        name,
        detail: "program not in the object".into(),
    })?;
    program
        .try_into()
        .map_err(|e: ProgramError| ProbeError::Object {
            name,
            detail: e.to_string(),
        })
}

fn take_map<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<M, aya::maps::MapError>,
) -> Result<M, ProbeError> {
    let map = ebpf.take_map(name).ok_or(ProbeError::Object {
        name,
        detail: "not in the object".into(),
    })?;
    convert(map).map_err(|e| ProbeError::Object {
        name,
        detail: e.to_string(),
    })
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones use
/// memcg accounting and ignore it.
/// Attaches every hook of the plan; the attach kind is `raw_tracepoint`
/// when any hook fell back to it.
fn attach_all(
    ebpf: &mut aya::Ebpf,
    aya_btf: &Result<btf::Parsed<aya::Btf>, String>,
    victim_form: VictimForm,
    growth: Growth,
    log: bool,
) -> Result<(AttachKind, Vec<AttachedHook>), ProbeError> {
    let mut attach = AttachKind::BtfTracePoint;
    let mut attached = Vec::new();
    for hook in hooks::plan(victim_form, growth) {
        // `--probe-log`: the twin that logs; else the plain program.
        let point = match log {
            true => agent_common::programs::logged(hook.point),
            false => hook.point,
        };
        let kind = attach_point(ebpf, aya_btf, point)?;
        info!(
            tracepoint = hook.label,
            attach = kind.as_str(),
            "probe attached"
        );
        if kind == AttachKind::RawTracePoint {
            attach = kind;
        }
        attached.push(AttachedHook {
            tracepoint: hook.label,
            role: hook.role,
            attach: kind,
        });
    }
    Ok((attach, attached))
}

fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit struct for a valid resource.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        debug!(error = %io::Error::last_os_error(), "could not raise RLIMIT_MEMLOCK");
    }
}
