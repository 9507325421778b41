//! Reading one value out of a Prometheus text exposition, for the demo and the bench.

/// The value of the first sample named exactly `name` (with or without labels).
pub fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let rest = if let Some(labelled) = rest.strip_prefix('{') {
                labelled.split_once('}')?.1
            } else {
                rest
            };
            if !rest.starts_with(' ') {
                return None; // a longer metric name that merely starts with `name`
            }
            rest.split_whitespace().next()?.parse().ok()
        })
}

/// The cumulative buckets `(le, count)` of histogram `name`, in the order exposed (`+Inf`
/// last, as infinity).
pub fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix.as_str())?;
            let (le, rest) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of cumulative buckets, as the upper bound of the bucket it falls in (an
/// over-estimate by at most one bucket); `None` with no observations.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = (q * total).ceil().max(1.0);
    buckets
        .iter()
        .find(|(_, count)| *count >= rank)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::{bucket_quantile, buckets, value};

    #[test]
    fn reads_histogram_buckets_and_their_quantiles() {
        let text = "h_bucket{le=\"0.01\"} 90\nh_bucket{le=\"0.1\"} 99\nh_bucket{le=\"1\"} 100\n\
                    h_bucket{le=\"+Inf\"} 100\nh_sum 3\nh_count 100\n";
        let b = buckets(text, "h");
        assert_eq!(b.len(), 4);
        assert_eq!(bucket_quantile(&b, 0.5), Some(0.01));
        assert_eq!(bucket_quantile(&b, 0.99), Some(0.1));
        assert_eq!(bucket_quantile(&b, 1.0), Some(1.0));
        assert_eq!(bucket_quantile(&buckets("", "h"), 0.99), None);
    }

    #[test]
    fn finds_plain_and_labelled_samples_only_by_exact_name() {
        let text = "# HELP x y\n# TYPE a gauge\na_total 3\na 7\nb{l=\"1\"} 2.5\n";
        assert_eq!(value(text, "a"), Some(7.0));
        assert_eq!(value(text, "a_total"), Some(3.0));
        assert_eq!(value(text, "b"), Some(2.5));
        assert_eq!(value(text, "c"), None);
    }
}
