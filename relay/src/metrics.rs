//! The relay's counters and their `/metrics` text (docs/operations.md, "The relay").

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a delivery ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The receiver answered.
    Delivered,
    /// No answer known (timeout, connection error, 408/429/5xx): it will be asked again.
    Unknown,
    /// Refused for good.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Unknown => "unknown",
            Outcome::Failed => "failed",
        }
    }

    const ALL: [Outcome; 3] = [Outcome::Delivered, Outcome::Unknown, Outcome::Failed];
}

/// Counters the shell keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    deliveries: Mutex<BTreeMap<(String, Outcome), u64>>,
    pub in_flight: AtomicU64,
    pub reports_refused: AtomicU64,
}

impl Metrics {
    pub fn delivery(&self, target: &str, outcome: Outcome) {
        let mut deliveries = self
            .deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *deliveries.entry((target.to_string(), outcome)).or_insert(0) += 1;
    }

    /// The Prometheus text of every counter (net's exposition, as every twopc server). Each
    /// configured target shows every result, at 0 until it happens, so a rate over it is
    /// defined from the first scrape.
    pub fn text(&self, targets: &[String]) -> String {
        let deliveries = self
            .deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut names: Vec<&String> = targets.iter().collect();
        for (target, _) in deliveries.keys() {
            if !names.contains(&target) {
                names.push(target);
            }
        }
        let samples: Vec<([&str; 2], u64)> = names
            .iter()
            .flat_map(|target| {
                Outcome::ALL.map(|outcome| {
                    let value = deliveries
                        .get(&((*target).clone(), outcome))
                        .copied()
                        .unwrap_or(0);
                    ([target.as_str(), outcome.as_str()], value)
                })
            })
            .collect();
        let mut out = net::exposition::Exposition::default();
        out.counters_by_pair(
            "twopc_relay_deliveries_total",
            "Delivery attempts by target and result (delivered, unknown, failed)",
            ["target", "result"],
            samples,
        );
        out.gauge(
            "twopc_relay_in_flight",
            "Deliveries in flight now",
            self.in_flight.load(Ordering::Relaxed),
        );
        out.counter_of(
            "twopc_relay_reports_refused_total",
            "Reports a participant refused (409 or 404); the relay listed its outbox again",
            &self.reports_refused,
        );
        out.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_shows_every_result() {
        let metrics = Metrics::default();
        metrics.delivery("payments", Outcome::Delivered);
        metrics.delivery("payments", Outcome::Delivered);
        metrics.delivery("odd\"one", Outcome::Unknown);
        let text = metrics.text(&["payments".into(), "shipping".into()]);
        assert!(text.contains(
            "twopc_relay_deliveries_total{target=\"payments\",result=\"delivered\"} 2\n"
        ));
        assert!(
            text.contains(
                "twopc_relay_deliveries_total{target=\"shipping\",result=\"failed\"} 0\n"
            )
        );
        assert!(text.contains("target=\"odd\\\"one\",result=\"unknown\"} 1\n"));
        assert!(text.contains("twopc_relay_in_flight 0\n"));
        assert!(text.contains("twopc_relay_reports_refused_total 0\n"));
    }
}
