//! The agent's own health: a watchdog whose eyes are shut must say so
//! (Dask's and node-problem-detector's `/healthz` always answer ok).

use std::time::Duration;

use tokio::time::Instant;

use crate::model::{
    health::{Health, Verdict},
    source::SourceKind,
};

/// How long a kernel-side event loss keeps the agent `degraded`.
pub(crate) const LOSS_MEMORY: Duration = Duration::from_secs(300);

/// What the agent knows about its event source.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProbeState {
    /// The source in use, once it runs.
    pub source: Option<SourceKind>,
    /// How it is attached (`tp_btf`, `raw_tracepoint`, …), for humans.
    pub attach: Option<&'static str>,
    /// Why the source is not running, when it is not.
    pub failure: Option<String>,
    /// Kernel records lost because the ring buffer was full, since start.
    pub ringbuf_drops: u64,
    /// When the last loss was noticed.
    pub last_drop: Option<Instant>,
    /// Why memory growth is followed by sampling only (no kernel program).
    pub growth_unavailable: Option<String>,
    /// Why the eBPF source could not load, when the agent fell back to polling.
    pub ebpf_unavailable: Option<String>,
}

impl ProbeState {
    pub(crate) fn ready(&self) -> bool {
        self.source.is_some()
    }

    /// Records the kernel's running total of ring-buffer losses.
    /// Records the kernel's running total of ring-buffer losses; true when
    /// it grew (records were lost since the last call).
    pub(crate) fn observe_ringbuf_drops(&mut self, total: u64, now: Instant) -> bool {
        if total > self.ringbuf_drops {
            self.ringbuf_drops = total;
            self.last_drop = Some(now);
            return true;
        }
        false
    }
}

/// The agent's own verdict at `now`.
pub(crate) fn assess(probe: &ProbeState, now: Instant) -> Verdict {
    let mut verdict = Verdict::healthy();
    match (&probe.source, &probe.failure) {
        (Some(_), _) => {}
        (None, Some(failure)) => verdict.add(Health::Degraded, format!("probe failed: {failure}")),
        (None, None) => verdict.add(Health::Degraded, "probe not attached yet"),
    }
    if let Some(reason) = &probe.ebpf_unavailable {
        // Still watching, but slower and without victims' names: degraded.
        verdict.add(
            Health::Degraded,
            format!("source poll: eBPF unavailable ({reason}); OOM kills are seen within a second, victims unnamed"),
        );
    }
    if let Some(reason) = &probe.growth_unavailable {
        // Not degraded: the sampling loop still sees every crossing, later.
        verdict.add(
            Health::Healthy,
            format!("memory growth is sampled, not followed in the kernel ({reason})"),
        );
    }
    if let Some(at) = probe.last_drop
        && now.duration_since(at) < LOSS_MEMORY
    {
        verdict.add(
            Health::Degraded,
            format!(
                "kernel events lost: ring buffer full ({} since start, last {}s ago)",
                probe.ringbuf_drops,
                now.duration_since(at).as_secs()
            ),
        );
    }
    verdict
}

/// Adds the outbox's part: a state directory that cannot be written
/// (`persist_error`) makes the agent `degraded`: `pending` events wait in
/// memory and die with the process. A corrupt database set aside at start
/// (`set_aside`, saying what and where) keeps it `degraded` until the
/// agent restarts: the last run's events and kept state are lost to it,
/// which an operator should see, not miss between two scrapes.
pub(crate) fn assess_outbox(
    persist_error: Option<&str>,
    pending: u64,
    set_aside: Option<&str>,
    verdict: &mut Verdict,
) {
    if let Some(what) = set_aside {
        verdict.add(Health::Degraded, format!("state lost: {what}"));
    }
    if let Some(error) = persist_error {
        verdict.add(
            Health::Degraded,
            format!("state directory not writable ({error}): {pending} events held in memory only"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritable_state_directory_is_degraded_with_reason() {
        let mut verdict = Verdict::healthy();
        assess_outbox(None, 3, None, &mut verdict);
        assert_eq!(verdict, Verdict::healthy());
        assess_outbox(Some("database or disk is full"), 7, None, &mut verdict);
        assert_eq!(verdict.status, Health::Degraded);
        assert_eq!(
            verdict.reasons,
            [
                "state directory not writable (database or disk is full): 7 events held in memory only"
            ]
        );
    }

    #[test]
    fn a_database_set_aside_is_degraded_naming_it() {
        let mut verdict = Verdict::healthy();
        assess_outbox(
            None,
            0,
            Some(
                "the outbox database /s/outbox.sqlite was corrupt (…): set aside as /s/outbox.sqlite.corrupt-1",
            ),
            &mut verdict,
        );
        assert_eq!(verdict.status, Health::Degraded);
        assert!(
            verdict.reasons[0].starts_with("state lost: the outbox database")
                && verdict.reasons[0].contains("outbox.sqlite.corrupt-1"),
            "{verdict:?}"
        );
    }

    fn running() -> ProbeState {
        ProbeState {
            source: Some(SourceKind::Ebpf),
            attach: Some("tp_btf"),
            ..ProbeState::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn not_attached_is_degraded_with_reason() {
        let v = assess(&ProbeState::default(), Instant::now());
        assert_eq!(v.status, Health::Degraded);
        assert_eq!(v.reasons, ["probe not attached yet"]);
        let failed = ProbeState {
            failure: Some("missing capability CAP_BPF".into()),
            ..ProbeState::default()
        };
        assert_eq!(
            assess(&failed, Instant::now()).reasons,
            ["probe failed: missing capability CAP_BPF"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn attached_probe_is_healthy() {
        assert_eq!(assess(&running(), Instant::now()), Verdict::healthy());
    }

    #[tokio::test(start_paused = true)]
    async fn ring_buffer_loss_degrades_for_a_while_then_clears() {
        let mut probe = running();
        probe.observe_ringbuf_drops(0, Instant::now());
        assert_eq!(assess(&probe, Instant::now()).status, Health::Healthy);

        probe.observe_ringbuf_drops(3, Instant::now());
        let v = assess(&probe, Instant::now());
        assert_eq!(v.status, Health::Degraded);
        assert!(v.reasons[0].contains("3 since start"), "{:?}", v.reasons);

        tokio::time::advance(LOSS_MEMORY - Duration::from_secs(1)).await;
        assert_eq!(assess(&probe, Instant::now()).status, Health::Degraded);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(assess(&probe, Instant::now()).status, Health::Healthy);

        // The same total again is no new loss.
        probe.observe_ringbuf_drops(3, Instant::now());
        assert_eq!(assess(&probe, Instant::now()).status, Health::Healthy);
    }
}
