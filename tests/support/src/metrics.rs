//! Reading the agent's Prometheus text (`GET /metrics`).

/// The value of one series, written as the agent exposes it: a name
/// (`memwatch_oom_kills_total`) or a name with its labels
/// (`memwatch_oom_kills_total{constraint="cgroup"}`). `None` when no
/// line holds exactly that series.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    crate::line_value(text, series)
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn exact_series_only() {
        let text = "# HELP x\nmemwatch_a_total 3\nmemwatch_a_total_more 9\n\
                    memwatch_b{counter=\"ringbuf_full\"} 2.5\n";
        assert_eq!(metric(text, "memwatch_a_total"), Some(3.0));
        assert_eq!(metric(text, "memwatch_a_total_more"), Some(9.0));
        assert_eq!(
            metric(text, "memwatch_b{counter=\"ringbuf_full\"}"),
            Some(2.5)
        );
        assert_eq!(metric(text, "memwatch_a"), None);
        assert_eq!(metric(text, "memwatch_b"), None);
    }
}
