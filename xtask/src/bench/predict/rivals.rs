//! The rivals of the predictor, replayed on the trace of each run (the
//! cgroup's files read every 25 ms): each rule as its project documents it,
//! looking at the trace at its own interval, from a phase drawn per run.
//! What they call an alarm is what they act on (Ray kills the task,
//! the kubelet evicts the pod, systemd-oomd kills the cgroup): for the
//! lead time that is their warning.
//!
//! - **Ray** (memory monitor): every 250 ms, working set (usage less
//!   inactive file) at or above 95 % of the limit.
//! - **Two-point ETA**: every 5 s, the usage's slope since the last look;
//!   an alarm when `(limit − usage) / slope` is within the same 60 s
//!   horizon memwatch uses, with that ETA.
//! - **v1 eventfd threshold**: `memory.usage_in_bytes` crossing 95 % of
//!   the limit, notified by the kernel at once (here: at the 25 ms read that
//!   first shows it).
//! - **kubelet eviction**: every 10 s (its housekeeping), `memory.available`
//!   (limit less working set) under 10 % of the limit.
//! - **systemd-oomd**: memory pressure (PSI `some avg10`) above 60 % for
//!   30 s (`ManagedOOMMemoryPressureLimit=60%`, its default duration): on
//!   cgroup v2 the run's own `memory.pressure`, as oomd reads it; on a
//!   cgroup v1 host no cgroup has PSI, and the host's `/proc/pressure/memory`
//!   is replayed instead, which can only be earlier.
//!
//! On cgroup v2 the 95 % threshold is replayed on `memory.current` the
//! same way (v2 has no usage threshold the kernel notifies; the name is
//! kept so the tables line up).

use super::trace::{Sample, Trace, Warnings};

/// The rivals, in the tables' order.
pub(crate) const RIVALS: [&str; 5] = [
    "Ray (95 %, every 250 ms)",
    "two-point ETA (every 5 s)",
    "v1 eventfd threshold (95 %)",
    "kubelet eviction (available < 10 %, every 10 s)",
    "systemd-oomd (PSI > 60 % for 30 s)",
];

/// The horizon of the two-point ETA, memwatch's default `predict_horizon`.
const HORIZON_S: f64 = 60.0;

/// Every rival's warnings on `trace`, [`RIVALS`]' order; `phase` in [0, 1)
/// places each periodic rival's first look.
pub(crate) fn replay(trace: &Trace, phase: f64) -> Vec<Warnings> {
    vec![
        ray(trace, phase),
        two_point(trace, phase),
        threshold(trace),
        kubelet(trace, phase),
        oomd(trace),
    ]
}

/// The last sample at or before each look, every `every` seconds from
/// `phase × every` after the start, until the kill or the end.
fn looks(trace: &Trace, every: f64, phase: f64) -> Vec<Sample> {
    let until = trace.kill.unwrap_or(trace.end);
    let mut out = Vec::new();
    let mut t = trace.start + phase * every;
    let mut i = 0;
    while t < until {
        while i + 1 < trace.samples.len() && trace.samples[i + 1].t <= t {
            i += 1;
        }
        if let Some(s) = trace.samples.get(i).filter(|s| s.t <= t) {
            out.push(Sample { t, ..*s });
        }
        t += every;
    }
    out
}

fn fraction(bytes: u64, limit: u64) -> f64 {
    bytes as f64 / limit.max(1) as f64
}

fn ray(trace: &Trace, phase: f64) -> Warnings {
    Warnings::from_looks(looks(trace, 0.25, phase).into_iter().map(|s| {
        let hit = fraction(s.working_set(), trace.limit) >= 0.95;
        (s.t, hit.then_some(None))
    }))
}

fn two_point(trace: &Trace, phase: f64) -> Warnings {
    let looks = looks(trace, 5.0, phase);
    Warnings::from_looks(looks.windows(2).map(|w| {
        let slope = (w[1].usage as f64 - w[0].usage as f64) / (w[1].t - w[0].t);
        let left = trace.limit as f64 - w[1].usage as f64;
        let eta = (slope > 0.0).then(|| left.max(0.0) / slope);
        (w[1].t, eta.filter(|e| *e <= HORIZON_S).map(Some))
    }))
}

fn threshold(trace: &Trace) -> Warnings {
    let until = trace.kill.unwrap_or(trace.end);
    Warnings::from_looks(trace.samples.iter().filter(|s| s.t < until).map(|s| {
        let hit = fraction(s.usage, trace.limit) >= 0.95;
        (s.t, hit.then_some(None))
    }))
}

fn kubelet(trace: &Trace, phase: f64) -> Warnings {
    Warnings::from_looks(looks(trace, 10.0, phase).into_iter().map(|s| {
        let available = trace.limit.saturating_sub(s.working_set());
        (
            s.t,
            (fraction(available, trace.limit) < 0.10).then_some(None),
        )
    }))
}

fn oomd(trace: &Trace) -> Warnings {
    let until = trace.kill.unwrap_or(trace.end);
    let mut above_since: Option<f64> = None;
    Warnings::from_looks(
        trace
            .psi
            .iter()
            .filter(|(t, _)| *t < until)
            .map(|&(t, some)| {
                above_since = if some > 60.0 {
                    above_since.or(Some(t))
                } else {
                    None
                };
                (t, above_since.filter(|s| t - s >= 30.0).map(|_| None))
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A leak of `rate` MiB/s from 30 MiB into a 100 MiB limit, read every
    /// 25 ms, killed when it reaches the limit (at 70 / rate s).
    fn leak(rate: f64) -> Trace {
        let kill = 70.0 / rate;
        let samples = (0..)
            .map(|i| i as f64 * 0.025)
            .take_while(|t| *t < kill)
            .map(|t| Sample {
                t,
                usage: ((30.0 + rate * t) * MIB as f64) as u64,
                ..Sample::default()
            })
            .collect();
        Trace {
            limit: 100 * MIB,
            start: 0.0,
            end: kill + 1.0,
            samples,
            psi: vec![(0.0, 0.0)],
            held: Vec::new(),
            kill: Some(kill),
            calm_until: None,
        }
    }

    #[test]
    fn thresholds_warn_as_late_as_their_rule_says() {
        let trace = leak(10.0);
        let kill = trace.kill.unwrap();
        let all = replay(&trace, 0.5);
        // 95 % of 100 MiB at 10 MiB/s: 0.5 s before the kill, less the
        // poller's 250 ms at worst.
        let ray = kill - all[0].open_at(kill).unwrap().0;
        assert!((0.25..=0.5).contains(&ray), "{ray}");
        let eventfd = kill - all[2].open_at(kill).unwrap().0;
        assert!((0.45..=0.5).contains(&eventfd), "{eventfd}");
        // 90 %: one second before; the 10 s cycle mostly misses it.
        assert!(all[3].episodes.len() <= 1);
        // No pressure, no oomd.
        assert!(all[4].episodes.is_empty());
    }

    #[test]
    fn the_two_point_eta_is_exact_on_a_straight_line() {
        let trace = leak(2.0);
        let kill = trace.kill.unwrap();
        let w = &replay(&trace, 0.0)[1];
        let (start, _) = w.open_at(kill).expect("warned");
        // 2 MiB/s: 60 s of horizon covers the whole run from its second look.
        assert!(kill - start > 25.0, "{}", kill - start);
        let believed = w.believed(kill, kill - 5.0).unwrap();
        assert!((believed - 5.0).abs() < 0.1, "{believed}");
    }

    #[test]
    fn oomd_needs_thirty_seconds_of_pressure() {
        let mut trace = leak(1.0);
        trace.psi = (0..70).map(|t| (t as f64, 80.0)).collect();
        let w = oomd(&trace);
        assert_eq!(w.episodes[0].0, 30.0);
    }
}
