//! The summary the demo prints at the end: outcomes, abort reasons, recovery, throughput,
//! latency, and each invariant's verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::audit::{AuditReport, ClientOutcome};

use cluster::workload::OrderResult;

use super::reasons::abort_category;
use crate::latency::quantile;
use crate::metrics_text::bucket_quantile;

fn ms(duration: Option<Duration>) -> String {
    duration.map_or("-".into(), |d| format!("{:.2} ms", d.as_secs_f64() * 1e3))
}

/// What happened around the coordinator crash.
#[derive(Debug, Clone, Default)]
pub struct CrashNote {
    pub killed_after_orders: u64,
    pub downtime: Duration,
    /// Transactions the restarted coordinator found decided but unacknowledged, or undecided.
    pub recovered: Option<u64>,
}

/// What happened around the leader's kill in a coordinator group (`--ha`).
#[derive(Debug, Clone, Default)]
pub struct FailoverNote {
    pub killed: String,
    pub killed_after_orders: u64,
    /// The node that leads after the kill.
    pub successor: String,
    /// From the kill to the successor saying it leads.
    pub elected: Duration,
    /// From the kill to the first order committed through the successor.
    pub unavailable: Duration,
    /// Transactions the successor found unfinished in the replicated log.
    pub recovered: Option<u64>,
    /// From the old leader's restart to its being in the successor's sync set.
    pub rejoined: Duration,
    /// Orders committed through each node.
    pub committed_by_node: Vec<(String, u64)>,
}

/// The participants' lock waits during the run (summed over all three).
#[derive(Debug, Clone, Default)]
pub struct LockStats {
    pub waits: u64,
    pub timeouts: u64,
    pub conflicts: u64,
    /// Cumulative wait-duration buckets `(le seconds, count)`.
    pub buckets: Vec<(f64, f64)>,
}

pub struct Summary<'a> {
    pub results: &'a [OrderResult],
    pub elapsed: Duration,
    pub concurrency: usize,
    pub crash: Option<CrashNote>,
    /// Set by `--ha`, instead of `crash`.
    pub failover: Option<FailoverNote>,
    pub resent: u64,
    pub locks: Option<LockStats>,
    pub audit: &'a AuditReport,
}

impl Summary<'_> {
    pub fn print(&self) {
        let count = |o: ClientOutcome| self.results.iter().filter(|r| r.outcome == o).count();
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for r in self.results {
            if r.outcome == ClientOutcome::Aborted
                && let Some(answer) = &r.answer
            {
                *reasons.entry(abort_category(answer)).or_default() += 1;
            }
        }
        let mut latencies: Vec<Duration> = self.results.iter().filter_map(|r| r.latency).collect();
        latencies.sort();
        let rate = self.results.len() as f64 / self.elapsed.as_secs_f64().max(1e-9);

        println!();
        println!(
            "twopc demo: {} orders at concurrency {}",
            self.results.len(),
            self.concurrency
        );
        println!("{}", "-".repeat(64));
        row("committed", count(ClientOutcome::Committed).to_string());
        row("aborted", count(ClientOutcome::Aborted).to_string());
        for (reason, n) in &reasons {
            row(&format!("  {reason}"), n.to_string());
        }
        row(
            "no answer (outcome unknown to client)",
            count(ClientOutcome::Unknown).to_string(),
        );
        for r in self
            .results
            .iter()
            .filter(|r| r.outcome == ClientOutcome::Unknown)
            .take(3)
        {
            row(
                &format!("  {}", r.order.id),
                r.error.clone().unwrap_or_default(),
            );
        }
        row(
            "resent with the same id after no answer",
            self.resent.to_string(),
        );
        match (&self.crash, &self.failover) {
            (_, Some(failover)) => failover.print(),
            (Some(crash), None) => {
                row(
                    "coordinator SIGKILLed after",
                    format!("{} orders", crash.killed_after_orders),
                );
                row(
                    "coordinator back (restart + recovery)",
                    format!("{:.0} ms", crash.downtime.as_secs_f64() * 1e3),
                );
                row(
                    "transactions recovered after the crash",
                    crash
                        .recovered
                        .map_or("not reported".into(), |n| n.to_string()),
                );
            }
            (None, None) => row("coordinator crash", "none by the demo".into()),
        }
        row(
            "throughput",
            format!(
                "{rate:.0} orders/s over {:.1} s",
                self.elapsed.as_secs_f64()
            ),
        );
        row(
            "latency p50 / p99 (first-try answers)",
            format!(
                "{} / {}",
                ms(quantile(&latencies, 0.50)),
                ms(quantile(&latencies, 0.99))
            ),
        );
        match &self.locks {
            Some(locks) => {
                let p99 = bucket_quantile(&locks.buckets, 0.99)
                    .map_or("-".into(), |s| format!("<= {:.0} ms", s * 1e3));
                row(
                    "prepares that waited for a lock / p99 wait",
                    format!("{} / {p99}", locks.waits),
                );
                row(
                    "lock waits timed out / immediate lock conflicts",
                    format!("{} / {}", locks.timeouts, locks.conflicts),
                );
            }
            None => row("lock waits", "not reported by the participants".into()),
        }
        println!("{}", "-".repeat(64));
        println!(
            "invariants ({} orders applied everywhere, {} nowhere):",
            self.audit.applied, self.audit.absent
        );
        print_checks(self.audit);
    }
}

impl FailoverNote {
    fn print(&self) {
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        row(
            "leader SIGKILLed",
            format!("{} after {} orders", self.killed, self.killed_after_orders),
        );
        row(
            "new leader (elected through etcd)",
            format!("{} after {}", self.successor, ms(self.elected)),
        );
        row(
            "unavailable (kill to first commit after)",
            ms(self.unavailable),
        );
        row(
            "transactions recovered by the new leader",
            self.recovered
                .map_or("not reported".into(), |n| n.to_string()),
        );
        row(
            "old leader back as a follower, in sync",
            format!("{} after {}", self.killed, ms(self.rejoined)),
        );
        row(
            "orders committed through each node",
            self.committed_by_node
                .iter()
                .map(|(node, n)| format!("{node} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
}

/// Each invariant's verdict, one per line with its detail below.
pub fn print_checks(audit: &AuditReport) {
    for check in &audit.checks {
        let mark = if check.ok { "ok  " } else { "FAIL" };
        println!("  [{mark}] {}", check.name);
        println!("         {}", check.detail);
    }
}

fn row(label: &str, value: String) {
    println!("  {label:<42} {value}");
}
