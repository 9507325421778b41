//! Latency quantiles for the demo's summary and the bench's table.

use std::time::Duration;

/// The `q` quantile (0..=1) of sorted durations, by nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let sorted: Vec<_> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&sorted, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&sorted, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&sorted, 0.999), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(
            quantile(&[Duration::from_millis(3)], 0.99),
            Some(Duration::from_millis(3))
        );
    }
}
