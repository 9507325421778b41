//! The verdict of `twopc bench --outbox`: every intent whose write was answered was applied
//! exactly once at the receiver, and the outbox holds nothing open and counts as delivered
//! exactly what the receiver applied. Pure, so its failures are tested without a cluster.

use std::collections::HashMap;

use serde::Serialize;

use super::outbox_receiver::Applied;

/// The participant's outbox counters at the end (`None`: not readable).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub written: Option<u64>,
    pub delivered: Option<u64>,
    pub pending: Option<u64>,
    pub failed: Option<u64>,
}

/// The end-of-run check: exactly once in effect, nothing left open.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxCheck {
    /// Intents whose write was answered 200.
    pub intents_written: u64,
    /// Of those, applied exactly once at the receiver.
    pub delivered_once: u64,
    /// Of those, never applied.
    pub missing: u64,
    /// Events applied more than once (a receiver that deduplicates never does).
    pub applied_twice: u64,
    /// Requests the receiver got beyond the first of each event (redeliveries: allowed).
    pub redeliveries: u64,
    /// The participant's counters at the end.
    pub outbox_written: Option<u64>,
    pub outbox_delivered: Option<u64>,
    pub outbox_pending: Option<u64>,
    pub outbox_failed: Option<u64>,
    pub ok: bool,
}

/// Judges the intents the client saw written (`acked`, event ids) against what the receiver
/// applied and what the outbox counts.
pub fn judge(acked: &[&str], applied: &HashMap<String, Applied>, outbox: Counters) -> OutboxCheck {
    let mut delivered_once = 0;
    let mut missing = 0;
    for id in acked {
        match applied.get(*id).map(|a| a.effects) {
            Some(1) => delivered_once += 1,
            Some(_) => {}
            None => missing += 1,
        }
    }
    let applied_twice = applied.values().filter(|a| a.effects > 1).count() as u64;
    let redeliveries = applied
        .values()
        .map(|a| u64::from(a.requests.saturating_sub(1)))
        .sum();
    let written = acked.len() as u64;
    // A write that timed out at the client may still have been recorded: the outbox may hold
    // more than the client saw answered, never fewer, and must deliver all it holds.
    let ok = delivered_once == written
        && missing == 0
        && applied_twice == 0
        && outbox.pending == Some(0)
        && outbox.failed == Some(0)
        && outbox.written.is_some_and(|w| w >= written)
        && outbox.delivered == outbox.written
        && outbox.delivered == Some(applied.len() as u64);
    OutboxCheck {
        intents_written: written,
        delivered_once,
        missing,
        applied_twice,
        redeliveries,
        outbox_written: outbox.written,
        outbox_delivered: outbox.delivered,
        outbox_pending: outbox.pending,
        outbox_failed: outbox.failed,
        ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn applied(events: &[(&str, u32, u32)]) -> HashMap<String, Applied> {
        events
            .iter()
            .map(|(id, effects, requests)| {
                let seen = Applied {
                    effects: *effects,
                    requests: *requests,
                    at: Instant::now(),
                };
                (id.to_string(), seen)
            })
            .collect()
    }

    fn settled(n: u64) -> Counters {
        Counters {
            written: Some(n),
            delivered: Some(n),
            pending: Some(0),
            failed: Some(0),
        }
    }

    #[test]
    fn every_intent_once_and_nothing_open_passes_with_redeliveries_counted() {
        let check = judge(
            &["a", "b"],
            &applied(&[("a", 1, 1), ("b", 1, 3)]),
            settled(2),
        );
        assert!(check.ok, "{check:?}");
        assert_eq!((check.delivered_once, check.redeliveries), (2, 2));
    }

    #[test]
    fn a_missing_intent_fails() {
        let check = judge(&["a", "b"], &applied(&[("a", 1, 1)]), settled(1));
        assert!(!check.ok);
        assert_eq!(check.missing, 1);
    }

    #[test]
    fn a_second_effect_fails() {
        let check = judge(&["a"], &applied(&[("a", 2, 2)]), settled(1));
        assert!(!check.ok);
        assert_eq!(check.applied_twice, 1);
    }

    #[test]
    fn an_open_intent_or_unreadable_counters_fail() {
        let events = applied(&[("a", 1, 1)]);
        let pending = Counters {
            pending: Some(1),
            ..settled(1)
        };
        assert!(!judge(&["a"], &events, pending).ok);
        let failed = Counters {
            failed: Some(1),
            ..settled(1)
        };
        assert!(!judge(&["a"], &events, failed).ok);
        assert!(!judge(&["a"], &events, Counters::default()).ok);
        // The outbox counting more delivered than the receiver applied is a false report.
        assert!(!judge(&["a"], &events, settled(2)).ok);
    }

    #[test]
    fn an_intent_recorded_for_a_write_the_client_never_saw_answered_may_be_delivered() {
        let check = judge(&["a"], &applied(&[("a", 1, 1), ("t", 1, 1)]), settled(2));
        assert!(check.ok, "{check:?}");
    }
}
