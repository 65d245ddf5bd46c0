//! Reading the agent's Prometheus text (`GET /metrics`).

/// The value of one series, written as the agent exposes it: a name
/// (`memwatch_oom_kills_total`) or a name with its labels
/// (`memwatch_oom_kills_total{constraint="cgroup"}`). `None` when no
/// line holds exactly that series.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    crate::line_value(text, series)
}

/// The `q` quantile of a histogram series, as Prometheus's
/// `histogram_quantile` estimates it: linear within the bucket it falls
/// in. `labels` are the series' own labels before `le`, as exposed
/// (`kind="oom_kill",segment="read_to_sent",sink="webhook"`). `None`
/// without observations.
pub fn histogram_quantile(text: &str, name: &str, labels: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{{labels},le=\"");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let within = count - below;
            let share = if within > 0.0 {
                (rank - below) / within
            } else {
                1.0
            };
            return Some(lower + (le - lower) * share);
        }
        (lower, below) = (le, count);
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::{histogram_quantile, metric};

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let text = "h_bucket{k=\"a\",le=\"0.001\"} 50\nh_bucket{k=\"a\",le=\"0.002\"} 90\n\
                    h_bucket{k=\"a\",le=\"0.004\"} 100\nh_bucket{k=\"a\",le=\"+Inf\"} 100\n\
                    h_bucket{k=\"b\",le=\"+Inf\"} 0\n";
        let q = |q| histogram_quantile(text, "h", "k=\"a\"", q).unwrap();
        assert!((q(0.5) - 0.001).abs() < 1e-9);
        assert!((q(0.7) - 0.0015).abs() < 1e-9);
        assert!((q(0.99) - 0.0038).abs() < 1e-9);
        assert_eq!(histogram_quantile(text, "h", "k=\"b\"", 0.5), None);
        assert_eq!(histogram_quantile(text, "h", "k=\"c\"", 0.5), None);
    }

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
