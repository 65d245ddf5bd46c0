//! The kernel's pressure and memory event figures as metrics: PSI
//! averages as gauges, and the kernel's running totals (PSI stall time,
//! `memory.events` counters) as Prometheus counters, advanced by how much
//! the kernel's total grew since the last sample.

use std::collections::{BTreeMap, HashMap};

use crate::{
    cgroup::pressure::UNDER_OOM,
    model::pressure::{MemoryEvents, Pressure},
    telemetry::Metrics,
};

/// The last totals seen, to turn them into counter increments.
#[derive(Debug, Default)]
pub(crate) struct KernelFigures {
    /// PSI `total` (µs), by (scope, worker, kind).
    stall_us: HashMap<(&'static str, String, &'static str), u64>,
    /// memory.events counters (and v1's `under_oom` state), by (worker, name).
    events: HashMap<(String, &'static str), u64>,
    /// Workers whose PSI gauges are set (removed when it goes unreadable).
    pressure_shown: BTreeMap<String, ()>,
}

/// How much a counter grew: all of it the first time (the counter starts
/// at the kernel's total), and all of it again when it went down (a new
/// cgroup, or a reboot of the figures).
fn growth(last: Option<u64>, now: u64) -> u64 {
    match last {
        Some(last) if now >= last => now - last,
        _ => now,
    }
}

impl KernelFigures {
    /// Publishes the host's PSI (`None`: no PSI, nothing shown) and the
    /// workers' PSI and memory events of one sample.
    pub(crate) fn publish(
        &mut self,
        metrics: &Metrics,
        host: Option<&Pressure>,
        workers: &HashMap<String, Pressure>,
        events: &HashMap<String, MemoryEvents>,
    ) {
        if let Some(host) = host {
            self.pressure(metrics, "host", "", host);
        }
        for (worker, pressure) in workers {
            self.pressure(metrics, "worker", worker, pressure);
            self.pressure_shown.insert(worker.clone(), ());
        }
        let gone: Vec<String> = self
            .pressure_shown
            .keys()
            .filter(|w| !workers.contains_key(*w))
            .cloned()
            .collect();
        for worker in gone {
            self.pressure_shown.remove(&worker);
            for kind in ["some", "full"] {
                for window in ["10s", "60s", "300s"] {
                    let _ = metrics
                        .memory_pressure
                        .remove_label_values(&["worker", &worker, kind, window]);
                }
            }
        }
        for (worker, counts) in events {
            self.memory_events(metrics, worker, counts);
        }
    }

    fn pressure(&mut self, metrics: &Metrics, scope: &'static str, worker: &str, p: &Pressure) {
        for (kind, line) in
            std::iter::once(("some", &p.some)).chain(p.full.as_ref().map(|f| ("full", f)))
        {
            for (window, share) in line.windows() {
                metrics
                    .memory_pressure
                    .with_label_values(&[scope, worker, kind, window])
                    .set(share);
            }
            let key = (scope, worker.to_string(), kind);
            let grew = growth(self.stall_us.get(&key).copied(), line.total_us);
            self.stall_us.insert(key, line.total_us);
            if grew > 0 {
                metrics
                    .memory_pressure_stall
                    .with_label_values(&[scope, worker, kind])
                    .inc_by(grew as f64 / 1e6);
            }
        }
    }

    fn memory_events(&mut self, metrics: &Metrics, worker: &str, counts: &MemoryEvents) {
        for (&name, &value) in counts {
            let key = (worker.to_string(), name);
            let last = self.events.insert(key, value);
            if name == UNDER_OOM {
                // v1: a state, not a counter. Newly in OOM counts one `oom`.
                if value > 0 && last.unwrap_or(0) == 0 {
                    metrics
                        .memory_events
                        .with_label_values(&[worker, "oom"])
                        .inc();
                }
                continue;
            }
            let counter = metrics.memory_events.with_label_values(&[worker, name]);
            counter.inc_by(growth(last, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::pressure::{parse, parse_memory_events};

    fn metrics() -> Metrics {
        Metrics::new(&prometheus::Registry::new()).unwrap()
    }

    #[test]
    fn psi_totals_become_seconds_and_averages_fractions() {
        let m = metrics();
        let mut k = KernelFigures::default();
        let host = parse("some avg10=1.50 avg60=0.50 avg300=0.10 total=2000000\n")
            .pressure
            .unwrap();
        k.publish(&m, Some(&host), &HashMap::new(), &HashMap::new());
        let ratio = |scope, worker, kind, window| {
            m.memory_pressure
                .with_label_values(&[scope, worker, kind, window])
                .get()
        };
        assert!((ratio("host", "", "some", "10s") - 0.015).abs() < 1e-12);
        assert!((ratio("host", "", "some", "300s") - 0.001).abs() < 1e-12);
        let stall = |scope, worker, kind| {
            m.memory_pressure_stall
                .with_label_values(&[scope, worker, kind])
                .get()
        };
        assert!(
            (stall("host", "", "some") - 2.0).abs() < 1e-9,
            "the kernel's total"
        );
        let host = parse(
            "some avg10=0 avg60=0 avg300=0 total=2500000\nfull avg10=0 avg60=0 avg300=0 total=7\n",
        )
        .pressure
        .unwrap();
        let w = parse("some avg10=20.00 avg60=5 avg300=1 total=300\n")
            .pressure
            .unwrap();
        let workers = HashMap::from([("w1".to_string(), w)]);
        k.publish(&m, Some(&host), &workers, &HashMap::new());
        assert!(
            (stall("host", "", "some") - 2.5).abs() < 1e-9,
            "grew by 0.5 s"
        );
        assert!((stall("host", "", "full") - 7e-6).abs() < 1e-12);
        assert!((ratio("worker", "w1", "some", "10s") - 0.2).abs() < 1e-12);
        // The worker's PSI goes unreadable: its averages are no longer shown.
        k.publish(&m, Some(&host), &HashMap::new(), &HashMap::new());
        assert!(
            m.memory_pressure
                .remove_label_values(&["worker", "w1", "some", "10s"])
                .is_err(),
            "removed already"
        );
    }

    #[test]
    fn memory_events_deltas_become_counter_increments() {
        let m = metrics();
        let mut k = KernelFigures::default();
        let get = |event| m.memory_events.with_label_values(&["w1", event]).get();
        let mut sample = |text: &str| {
            let events = HashMap::from([("w1".to_string(), parse_memory_events(text))]);
            k.publish(&m, None, &HashMap::new(), &events);
        };
        sample("low 0\nhigh 10\nmax 2\noom 0\noom_kill 0\noom_group_kill 0\n");
        assert_eq!((get("high"), get("max"), get("oom_kill")), (10, 2, 0));
        sample("low 0\nhigh 15\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n");
        assert_eq!((get("high"), get("oom"), get("oom_kill")), (15, 1, 1));
        // The cgroup was made again: its counters start over, ours go on.
        sample("low 0\nhigh 3\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n");
        assert_eq!(get("high"), 18);

        // v1: failcnt as `max`; `under_oom` newly set counts one `oom`.
        let v1 = |max: u64, under: u64, kills: u64| {
            HashMap::from([(
                "w1".to_string(),
                MemoryEvents::from([("max", max), (UNDER_OOM, under), ("oom_kill", kills)]),
            )])
        };
        let m = metrics();
        let mut k = KernelFigures::default();
        for (max, under, kills) in [(4, 0, 0), (6, 1, 0), (6, 1, 1), (6, 0, 1), (7, 1, 1)] {
            k.publish(&m, None, &HashMap::new(), &v1(max, under, kills));
        }
        let get = |event| m.memory_events.with_label_values(&["w1", event]).get();
        assert_eq!((get("max"), get("oom"), get("oom_kill")), (7, 2, 1));
    }
}
