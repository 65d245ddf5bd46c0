//! The kernel side's counters, moved into the metrics once a second: the
//! probe's own counters (records lost to a full ring buffer among them) and,
//! with `bpf_stats`, each program's run count and run time.

use std::collections::HashMap;

use agent_common::ProbeCounter;

use super::ebpf::EbpfProbe;
use crate::telemetry::Metrics;

/// The last values published, to add only the growth.
#[derive(Debug)]
pub(crate) struct CounterPublisher {
    last: [u64; ProbeCounter::COUNT as usize],
    last_runs: HashMap<String, (u64, u64)>,
    program_stats: bool,
}

impl CounterPublisher {
    /// `program_stats`: the kernel keeps run counts and times (`bpf_stats`).
    pub(crate) fn new(program_stats: bool) -> Self {
        Self {
            last: [0; ProbeCounter::COUNT as usize],
            last_runs: HashMap::new(),
            program_stats,
        }
    }

    /// Publishes what grew since the last call; returns the running total
    /// of records lost to a full ring buffer (0 without a probe).
    pub(crate) fn publish(&mut self, probe: Option<&EbpfProbe>, metrics: &Metrics) -> u64 {
        let now = probe.map(EbpfProbe::kernel_counters).unwrap_or_default();
        if self.program_stats
            && let Some(probe) = probe
        {
            self.publish_program_stats(metrics, probe.program_stats());
        }
        publish_counters(metrics, &self.last, &now);
        self.last = now;
        now[ProbeCounter::RingbufFull as usize]
    }

    fn publish_program_stats(&mut self, metrics: &Metrics, now: Vec<(String, u64, u64)>) {
        for (name, runs, nanos) in now {
            let (runs_before, nanos_before) =
                self.last_runs.get(&name).copied().unwrap_or_default();
            metrics
                .program_runs
                .with_label_values(&[name.as_str()])
                .inc_by(runs.saturating_sub(runs_before));
            metrics
                .program_run_seconds
                .with_label_values(&[name.as_str()])
                .inc_by(nanos.saturating_sub(nanos_before) as f64 / 1e9);
            self.last_runs.insert(name, (runs, nanos));
        }
    }
}

/// Moves the kernel counters' growth into the Prometheus counters.
fn publish_counters(metrics: &Metrics, last: &[u64], now: &[u64]) {
    let counters = ProbeCounter::ALL.iter().zip(&metrics.probe_counters);
    for (((counter, metric), before), after) in counters.zip(last).zip(now) {
        let delta = after.saturating_sub(*before);
        if delta == 0 {
            continue;
        }
        if *counter == ProbeCounter::RingbufFull {
            metrics
                .events_dropped
                .with_label_values(&["ringbuf_full"])
                .inc_by(delta);
        }
        metric.inc_by(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_growth_is_published_and_losses_are_counted_as_drops() {
        let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
        let mut last = [0u64; ProbeCounter::COUNT as usize];
        let mut now = last;
        now[ProbeCounter::RingbufFull as usize] = 3;
        publish_counters(&metrics, &last, &now);
        last = now;
        now[ProbeCounter::RingbufFull as usize] = 5;
        publish_counters(&metrics, &last, &now);
        let lost = &metrics.probe_counters[ProbeCounter::RingbufFull as usize];
        assert_eq!(lost.get(), 5);
        assert_eq!(
            metrics
                .events_dropped
                .with_label_values(&["ringbuf_full"])
                .get(),
            5
        );
    }
}
