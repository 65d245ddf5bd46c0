//! Where the agent's share of an event's delay goes, from its own
//! `memwatch_event_delay_seconds` histograms (read off `/metrics` at the
//! end of a run): kernel stamp → record read → stored and synced → sent.

use memwatch_test_support::metrics::{histogram_quantile, metric};

const NAME: &str = "memwatch_event_delay_seconds";
/// The name the agent gives the sink of its first `--webhook`.
const WEBHOOK: &str = "webhook-1";
const SEGMENTS: [(&str, &str); 4] = [
    ("kernel_to_read", ""),
    ("read_to_stored", ""),
    ("stored_to_sent", WEBHOOK),
    ("read_to_sent", WEBHOOK),
];

/// One row per event kind and segment: observations, p50 and p99 in ms.
pub(super) fn table(metrics: &str) -> String {
    let mut out =
        String::from("| event | segment | events | p50 ms | p99 ms |\n|---|---|---|---|---|\n");
    for kind in ["oom_kill", "soft_cap_exceeded"] {
        for (segment, sink) in SEGMENTS {
            let labels = format!("kind=\"{kind}\",segment=\"{segment}\",sink=\"{sink}\"");
            let Some(count) = metric(metrics, &format!("{NAME}_count{{{labels}}}")) else {
                continue;
            };
            let ms = |q| {
                histogram_quantile(metrics, NAME, &labels, q)
                    .map_or("-".to_string(), |s| format!("{:.2}", s * 1000.0))
            };
            let name = if sink.is_empty() {
                segment.to_string()
            } else {
                format!("{segment} ({sink})")
            };
            out += &format!(
                "| {kind} | {name} | {count} | {} | {} |\n",
                ms(0.5),
                ms(0.99)
            );
        }
    }
    out
}

/// `segment`'s `q` quantile for `kind` in ms (the webhook's, for the
/// sinks' segments); NaN without observations.
pub(super) fn quantile_ms(metrics: &str, kind: &str, segment: &str, q: f64) -> f64 {
    let sink = SEGMENTS
        .iter()
        .find(|(s, _)| *s == segment)
        .map_or("", |(_, sink)| sink);
    let labels = format!("kind=\"{kind}\",segment=\"{segment}\",sink=\"{sink}\"");
    histogram_quantile(metrics, NAME, &labels, q).map_or(f64::NAN, |s| s * 1000.0)
}

/// The delay histograms of several runs as one: each `_bucket`, `_count`
/// and `_sum` series summed over `texts` (in the order first seen).
pub(super) fn merge(texts: &[&str]) -> String {
    let mut sums: Vec<(String, f64)> = Vec::new();
    for line in texts.iter().flat_map(|t| t.lines()) {
        if !line.starts_with(NAME) {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match sums.iter_mut().find(|(s, _)| s == series) {
            Some((_, sum)) => *sum += value,
            None => sums.push((series.to_string(), value)),
        }
    }
    sums.iter().map(|(s, v)| format!("{s} {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "# HELP memwatch_event_delay_seconds x\n\
        memwatch_event_delay_seconds_bucket{kind=\"oom_kill\",segment=\"read_to_sent\",sink=\"webhook-1\",le=\"0.001\"} 1\n\
        memwatch_event_delay_seconds_bucket{kind=\"oom_kill\",segment=\"read_to_sent\",sink=\"webhook-1\",le=\"0.002\"} 2\n\
        memwatch_event_delay_seconds_bucket{kind=\"oom_kill\",segment=\"read_to_sent\",sink=\"webhook-1\",le=\"+Inf\"} 2\n\
        memwatch_event_delay_seconds_count{kind=\"oom_kill\",segment=\"read_to_sent\",sink=\"webhook-1\"} 2\n\
        memwatch_other 7\n";

    #[test]
    fn runs_merge_by_summing_each_series() {
        let slow = RUN.replace("le=\"0.001\"} 1", "le=\"0.001\"} 0");
        let merged = merge(&[RUN, &slow]);
        assert!(merged.contains("le=\"0.001\"} 1\n"), "{merged}");
        assert!(merged.contains("le=\"0.002\"} 4\n"), "{merged}");
        assert!(merged.contains("sink=\"webhook-1\"} 4\n"), "{merged}");
        assert!(!merged.contains("memwatch_other"));
        // 4 observations: 1 under 1 ms, 3 in (1, 2] ms; the median is in the second.
        let p50 = quantile_ms(&merged, "oom_kill", "read_to_sent", 0.5);
        assert!((p50 - (1.0 + 1.0 / 3.0)).abs() < 1e-9, "{p50}");
        assert!(quantile_ms(&merged, "soft_cap_exceeded", "read_to_sent", 0.5).is_nan());
    }
}
