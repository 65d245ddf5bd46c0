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
