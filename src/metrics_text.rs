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

#[cfg(test)]
mod tests {
    use super::value;

    #[test]
    fn finds_plain_and_labelled_samples_only_by_exact_name() {
        let text = "# HELP x y\n# TYPE a gauge\na_total 3\na 7\nb{l=\"1\"} 2.5\n";
        assert_eq!(value(text, "a"), Some(7.0));
        assert_eq!(value(text, "a_total"), Some(3.0));
        assert_eq!(value(text, "b"), Some(2.5));
        assert_eq!(value(text, "c"), None);
    }
}
