//! Figures over samples (benchmark rounds, event delays).

/// Nearest-rank quantile (`q` in 0..=1) of `samples`, which it sorts; NaN
/// when there are none.
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

/// The nearest-rank median of `samples` (which it sorts); NaN when empty.
pub fn median(samples: &mut [f64]) -> f64 {
    quantile(samples, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut five = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(median(&mut five), 3.0);
        assert_eq!(quantile(&mut five, 0.99), 5.0);
        assert_eq!(quantile(&mut five, 0.0), 1.0);
        let mut hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut hundred, 0.5), 50.0);
        assert_eq!(quantile(&mut hundred, 0.99), 99.0);
        assert!(median(&mut []).is_nan());
    }
}
