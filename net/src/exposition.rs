//! The `/metrics` text every twopc server gives: the Prometheus text format (version 0.0.4),
//! written by the Prometheus project's `prometheus-client` crate from a registry filled at each
//! scrape (docs/operations.md, "The metrics text").
//!
//! Why 0.0.4 and not OpenMetrics, which the crate also writes: `promtool check metrics` lints
//! only 0.0.4 (it reads an OpenMetrics counter as an untyped family without help), Prometheus
//! 2 keeps a histogram's `le="1"` apart from OpenMetrics' `le="1.0"` (dashboards would lose
//! their series), and the coordinator exports a counter family and a gauge family that share
//! one OpenMetrics name (`twopc_coordinator_transactions_total` and
//! `twopc_coordinator_transactions`). Every Prometheus scrapes 0.0.4.
//!
//! A registry per scrape: most values are read at the scrape (engine gauges, the log's size,
//! the counters the services keep as plain atomics), so each scrape writes what it read and
//! two concurrent scrapes cannot see each other's values.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The content type of every `/metrics` answer.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Bucket upper bounds in seconds of every latency histogram: from half a millisecond (one
/// fsync on a fast disk) to 5 s (past every default timeout and lock-wait cap).
const BUCKETS_S: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// A latency histogram with the fixed buckets above, kept in atomics (an observation takes no
/// lock) and encoded by the crate.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket, each in the first bucket that holds it (not cumulative: the
    /// encoder sums them); those over the last bound are only in `count`.
    buckets: [AtomicU64; BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(micros, Ordering::Relaxed);
        // The count first, and the bucket with Release: a scrape that sees the bucket's
        // increment (Acquire) sees this one too, so `+Inf` is never below a finite bucket.
        self.count.fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        if let Some(bucket) = BUCKETS_S.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Release);
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Mean of the observations in milliseconds (0 when empty).
    pub fn mean_ms(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            count => self.sum_us.load(Ordering::Relaxed) as f64 / 1000.0 / count as f64,
        }
    }
}

/// What one scrape encodes of a [`Histogram`]: its numbers, read once.
#[derive(Debug)]
struct HistogramSample {
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum_s: f64,
}

impl HistogramSample {
    fn of(histogram: &Histogram) -> HistogramSample {
        let buckets = BUCKETS_S
            .iter()
            .zip(&histogram.buckets)
            .map(|(bound, n)| (*bound, n.load(Ordering::Acquire)))
            .collect();
        HistogramSample {
            buckets,
            count: histogram.count(),
            sum_s: histogram.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

impl EncodeMetric for HistogramSample {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_s, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The families of one scrape, in the order added. Each is named here as it is exported
/// (a counter with its `_total`), so the names in code are the ones docs/alerts.yml queries.
/// The crate ends every help text with a full stop, so the texts given here have none.
#[derive(Debug, Default)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.registry
            .register(counter_family(name), help, ConstCounter::new(value));
    }

    /// A counter kept as a plain atomic by its service.
    pub fn counter_of(&mut self, name: &str, help: &str, value: &AtomicU64) {
        self.counter(name, help, value.load(Ordering::Relaxed));
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    pub fn gauge_f64(&mut self, name: &str, help: &str, value: f64) {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    /// One counter family whose samples differ in `label`, in the order given.
    pub fn counters_by<'a>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        samples: impl IntoIterator<Item = (&'a str, u64)>,
    ) {
        let family = ByLabel::new(Kind::Counter, label, samples);
        self.registry.register(counter_family(name), help, family);
    }

    /// One counter family whose samples differ in two labels (`target` and `result`, say), in
    /// the order given.
    pub fn counters_by_pair<'a>(
        &mut self,
        name: &str,
        help: &str,
        labels: [&'static str; 2],
        samples: impl IntoIterator<Item = ([&'a str; 2], u64)>,
    ) {
        let family = ByLabel {
            kind: Kind::Counter,
            labels: labels.to_vec(),
            samples: samples
                .into_iter()
                .map(|(values, sample)| (values.map(str::to_string).to_vec(), sample))
                .collect(),
        };
        self.registry.register(counter_family(name), help, family);
    }

    /// One gauge family whose samples differ in `label`, in the order given (with none, the
    /// family is still described, so a dashboard knows it before its first sample).
    pub fn gauges_by<'a>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        samples: impl IntoIterator<Item = (&'a str, u64)>,
    ) {
        let family = ByLabel::new(Kind::Gauge, label, samples);
        self.registry.register(name, help, family);
    }

    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.registry
            .register(name, help, HistogramSample::of(histogram));
    }

    /// The text of everything added.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // Only the writer can fail, and a String never does: nothing is left to handle.
        if let Err(error) = prometheus_text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "the metrics text could not be written");
        }
        out
    }
}

/// The family a counter named `name` on the wire is registered under: the crate appends
/// `_total` to a counter's samples (and its help and type lines in this format) itself.
fn counter_family(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// A family whose samples differ in one label (or a few), encoded in the order given: the
/// crate's own `Family` keeps its label sets in a hash map, so its order would change from
/// scrape to scrape.
#[derive(Debug)]
struct ByLabel {
    kind: Kind,
    labels: Vec<&'static str>,
    /// Each sample's label values, one per label.
    samples: Vec<(Vec<String>, u64)>,
}

impl ByLabel {
    fn new<'a>(
        kind: Kind,
        label: &'static str,
        samples: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> ByLabel {
        let samples = samples
            .into_iter()
            .map(|(value, sample)| (vec![value.to_string()], sample))
            .collect();
        ByLabel {
            kind,
            labels: vec![label],
            samples,
        }
    }
}

impl EncodeMetric for ByLabel {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (values, sample) in &self.samples {
            let labels: Vec<(&str, &str)> = self
                .labels
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str))
                .collect();
            let sample_encoder = encoder.encode_family(&labels)?;
            match self.kind {
                Kind::Counter => ConstCounter::new(*sample).encode(sample_encoder)?,
                Kind::Gauge => ConstGauge::new(*sample).encode(sample_encoder)?,
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        match self.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_their_total_and_gauges_their_name() {
        let mut out = Exposition::default();
        out.counter("a_total", "Counted", 3);
        out.gauge("b", "Measured", 7);
        out.counters_by("c_total", "By kind", "kind", [("x", 1), ("y", 2)]);
        out.gauges_by("d", "By state", "state", []);
        assert_eq!(
            out.text(),
            "# HELP a_total Counted.\n# TYPE a_total counter\na_total 3\n\
             # HELP b Measured.\n# TYPE b gauge\nb 7\n\
             # HELP c_total By kind.\n# TYPE c_total counter\n\
             c_total{kind=\"x\"} 1\nc_total{kind=\"y\"} 2\n\
             # HELP d By state.\n# TYPE d gauge\n"
        );
    }

    #[test]
    fn a_counter_family_may_differ_in_two_labels() {
        let mut out = Exposition::default();
        out.counters_by_pair(
            "r_total",
            "By two",
            ["target", "result"],
            [(["p", "ok"], 2)],
        );
        assert_eq!(
            out.text(),
            "# HELP r_total By two.\n# TYPE r_total counter\nr_total{target=\"p\",result=\"ok\"} 2\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.gauges_by("g", "Help", "name", [("a\"b\\c\nd", 1)]);
        assert!(
            out.text().contains("g{name=\"a\\\"b\\\\c\\nd\"} 1\n"),
            "{}",
            out.text()
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_the_bounds_go_clients_write() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        let mut out = Exposition::default();
        out.histogram("x", "Help", &h);
        let text = out.text();
        for line in [
            "x_bucket{le=\"0.0005\"} 1\n",
            "x_bucket{le=\"0.005\"} 2\n",
            // `1` as Go writes it, not `1.0`: the series of today's dashboards.
            "x_bucket{le=\"1\"} 2\n",
            "x_bucket{le=\"5\"} 2\n",
            "x_bucket{le=\"+Inf\"} 2\n",
            "x_count 2\n",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert_eq!(text.matches("_bucket{").count(), BUCKETS_S.len() + 1);
        assert_eq!(h.count(), 2);
        assert!((h.mean_ms() - 1.65).abs() < 1e-9, "{}", h.mean_ms());
    }
}
