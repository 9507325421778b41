//! The outbox table: every intent kept, by write order, with the next seq per aggregate.
//!
//! Seqs are given 1, 2, 3... per aggregate in write (log) order; an aggregate's counter is kept
//! when retention takes its entries, so a seq is never given twice. Retention takes delivered
//! and abandoned entries `retention_ms` after they settled; pending and failed entries are kept
//! whatever their age. Changes are applied by [`Outbox::apply`] alike live and at replay, so the
//! table a log replays to is the table the live engine had.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use protocol::outbox::{IntentRef, IntentState, OUTBOX_LIST_LIMIT_MAX, OutboxEntry, OutboxList};
use serde::{Deserialize, Serialize};

use super::{IntentChange, RecordedIntent};

/// How long settled (delivered, abandoned) entries are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxRetention {
    pub settled_ms: u64,
}

/// Default of `--outbox-retention-ms`: 7 days.
pub const OUTBOX_RETENTION_MS_DEFAULT: u64 = 7 * 24 * 60 * 60 * 1000;

impl Default for OutboxRetention {
    fn default() -> Self {
        OutboxRetention {
            settled_ms: OUTBOX_RETENTION_MS_DEFAULT,
        }
    }
}

/// Which entries a listing wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    One(IntentState),
    /// Pending and failed.
    Open,
    /// The first open intent of each aggregate (its lowest seq): what a relay reads, so that
    /// one aggregate's long blocked backlog never hides the others behind a listing's limit.
    Heads,
    All,
}

impl StateFilter {
    /// `pending|failed|delivered|abandoned|open|heads`.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => StateFilter::One(IntentState::Pending),
            "failed" => StateFilter::One(IntentState::Failed),
            "delivered" => StateFilter::One(IntentState::Delivered),
            "abandoned" => StateFilter::One(IntentState::Abandoned),
            "open" => StateFilter::Open,
            "heads" => StateFilter::Heads,
            _ => return None,
        })
    }

    fn admits(self, state: IntentState) -> bool {
        match self {
            StateFilter::One(wanted) => wanted == state,
            StateFilter::Open | StateFilter::Heads => is_open(state),
            StateFilter::All => true,
        }
    }
}

/// Pending or failed: not settled, holds back the later intents of its aggregate.
pub fn is_open(state: IntentState) -> bool {
    matches!(state, IntentState::Pending | IntentState::Failed)
}

/// Intents written, delivered (by relays' reports) and attempts that failed, since the table
/// was created; carried in checkpoints and counted again by replay, so they are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxCounts {
    pub written: u64,
    pub delivered: u64,
    pub attempts_failed: u64,
}

/// The intents, by write order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outbox {
    /// Every entry kept, by its place in write order.
    entries: BTreeMap<u64, OutboxEntry>,
    /// The last seq given per aggregate (kept when its entries go).
    seqs: BTreeMap<String, u64>,
    next_order: u64,
    /// Settled entries retention took, since the table was created.
    #[serde(default)]
    pruned: u64,
    /// What happened to intents since the table was created (exported as counters).
    #[serde(default)]
    counts: OutboxCounts,
    #[serde(skip)]
    by_event: HashMap<String, u64>,
    /// (aggregate, seq) to write order.
    #[serde(skip)]
    by_aggregate: BTreeMap<(String, u64), u64>,
    /// The write order of every open (pending or failed) entry: what relays list, and what the
    /// gauges count, without a walk over the settled entries a week's retention keeps.
    #[serde(skip)]
    open: BTreeSet<u64>,
}

impl Outbox {
    /// Rebuilds the indexes (after a snapshot is loaded).
    pub fn reindex(&mut self) {
        self.by_event.clear();
        self.by_aggregate.clear();
        self.open.clear();
        for (order, entry) in &self.entries {
            self.by_event.insert(entry.event_id.clone(), *order);
            self.by_aggregate
                .insert((entry.aggregate.clone(), entry.seq), *order);
            if is_open(entry.state) {
                self.open.insert(*order);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.seqs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn pruned(&self) -> u64 {
        self.pruned
    }

    pub fn counts(&self) -> OutboxCounts {
        self.counts
    }

    pub fn get(&self, event_id: &str) -> Option<&OutboxEntry> {
        self.by_event
            .get(event_id)
            .and_then(|order| self.entries.get(order))
    }

    /// The last seq given to `aggregate`.
    pub fn last_seq(&self, aggregate: &str) -> u64 {
        self.seqs.get(aggregate).copied().unwrap_or(0)
    }

    /// The seqs the write's intents would get, in order (nothing is changed).
    pub fn next_refs(&self, next: &[protocol::outbox::Intent]) -> Vec<IntentRef> {
        let mut seqs: BTreeMap<&str, u64> = BTreeMap::new();
        next.iter()
            .map(|intent| {
                let last = seqs
                    .entry(intent.aggregate.as_str())
                    .or_insert_with(|| self.last_seq(&intent.aggregate));
                *last += 1;
                IntentRef {
                    event_id: intent.event_id.clone(),
                    aggregate: intent.aggregate.clone(),
                    seq: *last,
                }
            })
            .collect()
    }

    /// Records a write's intents (seqs as its record holds them), pending, at `at_ms`.
    pub fn insert(&mut self, op_id: &str, intents: &[RecordedIntent], at_ms: u64) {
        for intent in intents {
            self.counts.written += 1;
            let last = self.seqs.entry(intent.aggregate.clone()).or_insert(0);
            *last = (*last).max(intent.seq);
            let order = self.next_order;
            self.next_order += 1;
            if let Some(before) = self.by_event.insert(intent.event_id.clone(), order) {
                // Only a replay of an id reused after retention took its first entry: the
                // later write is the later fact.
                self.remove(before);
                self.by_event.insert(intent.event_id.clone(), order);
            }
            self.by_aggregate
                .insert((intent.aggregate.clone(), intent.seq), order);
            self.open.insert(order);
            self.entries.insert(
                order,
                OutboxEntry {
                    event_id: intent.event_id.clone(),
                    aggregate: intent.aggregate.clone(),
                    seq: intent.seq,
                    target: intent.target.clone(),
                    kind: intent.kind.clone(),
                    body: intent.body.clone(),
                    state: IntentState::Pending,
                    op_id: op_id.to_string(),
                    created_at_ms: at_ms,
                    attempts: 0,
                    last_error: None,
                    last_attempt_at_ms: None,
                    delivered_at_ms: None,
                    answer: None,
                    marks: Vec::new(),
                    age_ms: None,
                },
            );
        }
    }

    fn remove(&mut self, order: u64) {
        self.open.remove(&order);
        if let Some(entry) = self.entries.remove(&order) {
            self.by_aggregate
                .remove(&(entry.aggregate.clone(), entry.seq));
            if self.by_event.get(&entry.event_id) == Some(&order) {
                self.by_event.remove(&entry.event_id);
            }
        }
    }

    /// The earliest intent of `event_id`'s aggregate, before it, that is still open.
    pub fn earlier_open(&self, event_id: &str) -> Option<&OutboxEntry> {
        let entry = self.get(event_id)?;
        self.by_aggregate
            .range((entry.aggregate.clone(), 0)..(entry.aggregate.clone(), entry.seq))
            .filter_map(|(_, order)| self.entries.get(order))
            .find(|e| is_open(e.state))
    }

    /// Applies a change (checked by the engine, or replayed from the log) to `event_id`.
    /// Unknown ids change nothing (a replayed change whose entry retention took).
    pub fn apply(&mut self, event_id: &str, change: &IntentChange, at_ms: u64) {
        let Some((order, entry)) = self
            .by_event
            .get(event_id)
            .and_then(|order| Some((*order, self.entries.get_mut(order)?)))
        else {
            return;
        };
        match change {
            IntentChange::Delivered { answer } => {
                self.counts.delivered += 1;
                entry.state = IntentState::Delivered;
                entry.attempts = entry.attempts.saturating_add(1);
                entry.last_attempt_at_ms = Some(at_ms);
                entry.delivered_at_ms = Some(at_ms);
                entry.answer = Some(answer.clone());
            }
            IntentChange::Attempt { error, permanent } => {
                self.counts.attempts_failed += 1;
                entry.attempts = entry.attempts.saturating_add(1);
                entry.last_attempt_at_ms = Some(at_ms);
                entry.last_error = Some(error.clone());
                if *permanent {
                    entry.state = IntentState::Failed;
                }
            }
            IntentChange::Operator { to, mark } => {
                entry.state = *to;
                if *to == IntentState::Delivered {
                    entry.delivered_at_ms = Some(at_ms);
                }
                entry.marks.push(mark.clone());
            }
        }
        if is_open(entry.state) {
            self.open.insert(order);
        } else {
            self.open.remove(&order);
        }
    }

    /// When a settled entry settled (`None`: open).
    fn settled_at(entry: &OutboxEntry) -> Option<u64> {
        match entry.state {
            IntentState::Pending | IntentState::Failed => None,
            IntentState::Delivered => entry.delivered_at_ms.or(Some(entry.created_at_ms)),
            IntentState::Abandoned => Some(
                entry
                    .marks
                    .last()
                    .map_or(entry.created_at_ms, |mark| mark.at_ms),
            ),
        }
    }

    /// Drops settled entries older than the retention; returns how many went.
    pub fn prune(&mut self, now_ms: u64, retention: &OutboxRetention) -> u64 {
        let cutoff = now_ms.saturating_sub(retention.settled_ms);
        let due: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| Self::settled_at(e).is_some_and(|at| at < cutoff))
            .map(|(order, _)| *order)
            .collect();
        let took = u64::try_from(due.len()).unwrap_or(u64::MAX);
        for order in due {
            self.remove(order);
        }
        self.pruned = self.pruned.saturating_add(took);
        took
    }

    /// Pending and failed counts, and when the oldest pending intent was written.
    pub fn open_numbers(&self) -> (u64, u64, Option<u64>) {
        let (mut pending, mut failed, mut oldest) = (0, 0, None::<u64>);
        for entry in self.open.iter().filter_map(|order| self.entries.get(order)) {
            match entry.state {
                IntentState::Pending => {
                    pending += 1;
                    oldest =
                        Some(oldest.map_or(entry.created_at_ms, |o| o.min(entry.created_at_ms)));
                }
                IntentState::Failed => failed += 1,
                IntentState::Delivered | IntentState::Abandoned => {}
            }
        }
        (pending, failed, oldest)
    }

    /// Entries in write order, with ages as of `now_ms`.
    pub fn list(
        &self,
        filter: StateFilter,
        aggregate: Option<&str>,
        limit: usize,
        now_ms: u64,
    ) -> OutboxList {
        let limit = limit.min(OUTBOX_LIST_LIMIT_MAX);
        // In write order an aggregate's first open entry is its lowest open seq.
        let mut heads_seen = std::collections::HashSet::new();
        let wants_open_only = match filter {
            StateFilter::Open | StateFilter::Heads => true,
            StateFilter::One(state) => is_open(state),
            StateFilter::All => false,
        };
        let candidates: Box<dyn Iterator<Item = &OutboxEntry>> = if wants_open_only {
            Box::new(self.open.iter().filter_map(|order| self.entries.get(order)))
        } else {
            Box::new(self.entries.values())
        };
        let mut matching = candidates
            .filter(|e| filter.admits(e.state))
            .filter(|e| aggregate.is_none_or(|a| a == e.aggregate))
            .filter(|e| filter != StateFilter::Heads || heads_seen.insert(e.aggregate.as_str()));
        let intents: Vec<OutboxEntry> = matching
            .by_ref()
            .take(limit)
            .map(|e| with_age(e, now_ms))
            .collect();
        let truncated = matching.next().is_some();
        let (pending, failed, oldest) = self.open_numbers();
        OutboxList {
            intents,
            pending,
            failed,
            oldest_pending_age_ms: oldest.map(|at| now_ms.saturating_sub(at)),
            truncated,
        }
    }

    /// Every entry in write order (for tests and the simulation).
    pub fn entries(&self) -> impl Iterator<Item = &OutboxEntry> {
        self.entries.values()
    }
}

/// The entry with its age as of `now_ms`.
pub fn with_age(entry: &OutboxEntry, now_ms: u64) -> OutboxEntry {
    OutboxEntry {
        age_ms: Some(now_ms.saturating_sub(entry.created_at_ms)),
        ..entry.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::outbox::IntentMark;
    use serde_json::json;

    fn recorded(event_id: &str, aggregate: &str, seq: u64) -> RecordedIntent {
        RecordedIntent {
            event_id: event_id.into(),
            aggregate: aggregate.into(),
            seq,
            target: "t".into(),
            kind: "k".into(),
            body: json!(null),
        }
    }

    #[test]
    fn seqs_per_aggregate_survive_pruning_and_earlier_open_blocks() {
        let mut outbox = Outbox::default();
        outbox.insert(
            "op-1",
            &[recorded("e-1", "a", 1), recorded("e-2", "b", 1)],
            10,
        );
        outbox.insert("op-2", &[recorded("e-3", "a", 2)], 20);
        assert_eq!(outbox.earlier_open("e-3").map(|e| e.seq), Some(1));
        assert!(outbox.earlier_open("e-1").is_none());
        outbox.apply("e-1", &IntentChange::Delivered { answer: json!(1) }, 30);
        assert!(outbox.earlier_open("e-3").is_none());
        let retention = OutboxRetention { settled_ms: 100 };
        assert_eq!(outbox.prune(129, &retention), 0);
        assert_eq!(outbox.prune(131, &retention), 1);
        assert!(outbox.get("e-1").is_none());
        assert_eq!(outbox.last_seq("a"), 2, "the counter outlives its entries");
        let refs = outbox.next_refs(&[recorded("e-4", "a", 0).intent()]);
        assert_eq!(refs[0].seq, 3);
        // Pending and failed are never pruned, however old.
        outbox.apply(
            "e-2",
            &IntentChange::Attempt {
                error: "no".into(),
                permanent: true,
            },
            40,
        );
        assert_eq!(outbox.prune(u64::MAX, &retention), 0);
        assert_eq!(outbox.open_numbers(), (1, 1, Some(20)));
    }

    #[test]
    fn the_open_index_follows_every_change_and_a_reindex_rebuilds_it() {
        let mut outbox = Outbox::default();
        for i in 1..=4u64 {
            outbox.insert(
                &format!("op-{i}"),
                &[recorded(&format!("e-{i}"), "a", i)],
                i,
            );
        }
        let mark = |action: &str| IntentMark {
            operator: "o".into(),
            reason: "r".into(),
            action: action.into(),
            at_ms: 9,
        };
        outbox.apply("e-1", &IntentChange::Delivered { answer: json!(1) }, 5);
        outbox.apply(
            "e-2",
            &IntentChange::Attempt {
                error: "x".into(),
                permanent: true,
            },
            6,
        );
        outbox.apply(
            "e-3",
            &IntentChange::Operator {
                to: IntentState::Abandoned,
                mark: mark("abandoned"),
            },
            7,
        );
        outbox.apply(
            "e-2",
            &IntentChange::Operator {
                to: IntentState::Pending,
                mark: mark("retry"),
            },
            8,
        );
        let open = |o: &Outbox| -> Vec<String> {
            o.list(StateFilter::Open, None, OUTBOX_LIST_LIMIT_MAX, 10)
                .intents
                .into_iter()
                .map(|e| e.event_id)
                .collect()
        };
        let walked: Vec<String> = outbox
            .entries()
            .filter(|e| is_open(e.state))
            .map(|e| e.event_id.clone())
            .collect();
        assert_eq!(open(&outbox), walked);
        assert_eq!(open(&outbox), ["e-2", "e-4"]);
        assert_eq!(outbox.open_numbers().0, 2);
        let mut copy: Outbox =
            serde_json::from_value(serde_json::to_value(&outbox).unwrap()).unwrap();
        copy.reindex();
        assert_eq!(
            copy, outbox,
            "a snapshot reindexed holds the same open index"
        );
        outbox.prune(1_000_000, &OutboxRetention { settled_ms: 1 });
        assert_eq!(open(&outbox), ["e-2", "e-4"]);
    }

    #[test]
    fn heads_are_the_first_open_intent_of_each_aggregate_in_write_order() {
        let mut outbox = Outbox::default();
        // a-1 a-2 b-1 a-3 b-2 c-1, in write order
        for (i, (event, aggregate)) in [
            ("a-1", "a"),
            ("a-2", "a"),
            ("b-1", "b"),
            ("a-3", "a"),
            ("b-2", "b"),
            ("c-1", "c"),
        ]
        .into_iter()
        .enumerate()
        {
            let i = i as u64 + 1;
            outbox.insert(&format!("op-{i}"), &[recorded(event, aggregate, i)], i * 10);
        }
        outbox.apply(
            "b-1",
            &IntentChange::Delivered {
                answer: serde_json::Value::Null,
            },
            70,
        );
        let heads = outbox.list(StateFilter::Heads, None, OUTBOX_LIST_LIMIT_MAX, 80);
        let ids: Vec<&str> = heads.intents.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["a-1", "b-2", "c-1"]);
        let limited = outbox.list(StateFilter::Heads, None, 2, 80);
        assert!(limited.truncated);
        assert_eq!(limited.intents.len(), 2);
        assert_eq!(StateFilter::parse("heads"), Some(StateFilter::Heads));
    }

    #[test]
    fn listing_filters_in_write_order_and_says_when_cut() {
        let mut outbox = Outbox::default();
        for i in 1..=5 {
            outbox.insert(
                &format!("op-{i}"),
                &[recorded(&format!("e-{i}"), "a", i)],
                i * 10,
            );
        }
        let mark = IntentMark {
            operator: "o".into(),
            reason: "r".into(),
            action: "abandoned".into(),
            at_ms: 60,
        };
        outbox.apply(
            "e-2",
            &IntentChange::Operator {
                to: IntentState::Abandoned,
                mark,
            },
            60,
        );
        let list = outbox.list(StateFilter::Open, None, 2, 100);
        let ids: Vec<_> = list.intents.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e-1", "e-3"]);
        assert!(list.truncated);
        assert_eq!(list.intents[0].age_ms, Some(90));
        assert_eq!(list.oldest_pending_age_ms, Some(90));
        let all = outbox.list(StateFilter::All, Some("b"), 10, 100);
        assert!(all.intents.is_empty() && !all.truncated);
        // Snapshot and back: the same table, indexes rebuilt.
        let mut back: Outbox =
            serde_json::from_value(serde_json::to_value(&outbox).unwrap()).unwrap();
        back.reindex();
        assert_eq!(back, outbox);
        assert_eq!(back.get("e-4").map(|e| e.seq), Some(4));
    }
}
