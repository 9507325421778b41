//! This run's epoch after it started: what a participant's refusal of a message this run sent
//! proves, and how the run moves past it by itself.
//!
//! A participant refuses a message with `stale_epoch` (it holds a higher epoch of this
//! coordinator id) or `incarnation_conflict` (another run claimed this very epoch): either way
//! another run of this id reached further than this log knows, the restore case. That is
//! evidence, because this run sent the message; a decision query's say-so never is (a query
//! is a claim: `view::decision_for` counts it and nothing more). On such evidence the engine
//! - marks the log behind (logged, forced): new transactions are refused, because a log that
//!   lost a run also lost that run's idempotency records;
//! - logs a new epoch for this same run above the highest epoch the participant reported
//!   (forced), and once it is durable (`Event::EpochDurable`) sends every pending delivery
//!   again at once, so participants take this run's decisions, answers and operators'
//!   resolutions without a restart.
//!
//! Once a raise is durable the runtime probes every participant again at the new epoch: a
//! participant that holds that very epoch under another run (it refused an older message
//! with `stale_epoch` naming it) says so only to a message at it.
//!
//! Bounds: a refusal of a message sent below the current epoch is one this run already moved
//! past, unless it reports an epoch above the current one; a raise is at most `EPOCH_RAISE_MAX` above the current epoch (a participant reporting
//! more is not believed) and at most `EPOCH_RAISES_MAX` per run (two live coordinators on
//! copies of one data directory would otherwise raise past each other for ever).
//!
//! Pure: the runtime appends what this returns and feeds durability back.

use protocol::{Epoch, ParticipantName};

use super::Engine;
use super::io::Command;
use super::rules::start_delivery;
use super::tx::{Delivery, Phase};
use crate::records::{Attempt, BehindRecord, EpochRecord, LogRecord};

/// Most epochs one raise may go above the current one: a real coordinator rises by one per
/// start, so this is far more than any run of restarts, and far less than the epochs left.
pub const EPOCH_RAISE_MAX: u64 = 1_000_000;

/// Most raises one run makes; past it the run stays behind and says why.
pub const EPOCH_RAISES_MAX: u32 = 16;

/// A participant refused a message this run sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    pub participant: ParticipantName,
    /// What it said (code and message), for the log and `/readyz`.
    pub evidence: String,
    /// The epoch the refused message carried.
    pub sent_epoch: Epoch,
    /// The highest epoch the participant says it holds for this coordinator id (the refusal's
    /// `highest_epoch`); `None` from participants that do not say.
    pub highest: Option<Epoch>,
    pub now_ms: u64,
}

/// What a refusal leads to, beyond the commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochState {
    /// A raise submitted and not yet durable: its epoch.
    pub raising: Option<Epoch>,
    /// Raises this run made (durable).
    pub raises: u32,
}

impl Engine {
    /// Why this log takes no new work, if participants proved it is behind.
    pub fn behind(&self) -> Option<&BehindRecord> {
        self.behind.as_ref()
    }

    /// Applies a participant's refusal of a message this run sent: the records to append
    /// (`Command::AppendForced` for the behind mark the first time, `Command::AppendEpoch` for
    /// a raise), or nothing when the evidence is spent or not believed.
    pub(super) fn fenced(&mut self, fenced: Fenced) -> Vec<Command> {
        let Some(identity) = self.identity.clone() else {
            return Vec::new();
        };
        let passes_current = fenced.highest.is_some_and(|h| h > identity.epoch);
        if fenced.sent_epoch < identity.epoch && !passes_current {
            // Sent before a raise this run already made, and the participant holds nothing
            // above the current epoch: nothing new (the probe after the raise asks again).
            return Vec::new();
        }
        let mut commands = Vec::new();
        if self.behind.is_none() {
            let record = BehindRecord {
                evidence: format!("{}: {}", fenced.participant, fenced.evidence),
                at_ms: fenced.now_ms,
            };
            self.behind = Some(record.clone());
            commands.push(Command::AppendForced(LogRecord::Behind(record)));
        }
        let reported = fenced
            .highest
            .unwrap_or(fenced.sent_epoch)
            .max(identity.epoch);
        let Some(target) = reported.checked_next() else {
            return commands;
        };
        let believable = target.0 - identity.epoch.0 <= EPOCH_RAISE_MAX;
        let already = self.epoch.raising.is_some_and(|raising| raising >= target);
        if !believable || already || self.epoch.raises >= EPOCH_RAISES_MAX {
            return commands;
        }
        self.epoch.raising = Some(target);
        commands.push(Command::AppendEpoch(EpochRecord {
            epoch: target,
            ..identity
        }));
        commands
    }

    /// Whether a refusal reporting `highest` would be believed for a raise (for the runtime's
    /// log line when it is not).
    pub fn raise_refused_why(&self, highest: Option<Epoch>) -> Option<String> {
        let current = self.identity.as_ref()?.epoch;
        if self.epoch.raises >= EPOCH_RAISES_MAX {
            return Some(format!(
                "this run raised its epoch {EPOCH_RAISES_MAX} times already: is another \
                 coordinator running on a copy of this data directory?"
            ));
        }
        let highest = highest?;
        (highest.0.saturating_sub(current.0) >= EPOCH_RAISE_MAX).then(|| {
            format!(
                "the participant reports epoch {highest}, more than {EPOCH_RAISE_MAX} above this \
                 run's {current}: not believed"
            )
        })
    }

    /// A raised epoch of this run is durable: messages carry it from now on, and every
    /// delivery waiting for its backoff timer goes again at once.
    pub(super) fn epoch_durable(&mut self, raised: EpochRecord) -> Vec<Command> {
        let Some(identity) = &self.identity else {
            return Vec::new();
        };
        assert!(
            raised.incarnation == identity.incarnation
                && raised.coordinator_id == identity.coordinator_id,
            "a raised epoch belongs to the run that raised it"
        );
        if raised.epoch <= identity.epoch {
            return Vec::new();
        }
        self.epoch.raises += 1;
        if self.epoch.raising.is_some_and(|r| r <= raised.epoch) {
            self.epoch.raising = None;
        }
        self.note_run(&raised);
        self.identity = Some(raised);
        let mut commands = Vec::new();
        for tx in self.live.values_mut() {
            let Phase::Decided(decided) = &tx.phase else {
                continue;
            };
            let decision = decided.decision;
            for part in &mut tx.parts {
                if !part.acked && part.delivery == Delivery::RetryArmed {
                    commands.push(start_delivery(&tx.id, &tx.attempt.gtid, part, decision));
                }
            }
        }
        commands
    }

    /// This run's probe attempt: position 0, which no attempt is ever begun under (positions
    /// start at 1), so a participant that refuses an abort for it is the evidence above and
    /// one that acknowledges it holds no epoch of another run at or above this one. It takes
    /// no position from the numbering and nothing about it is logged.
    pub fn probe_attempt(&self) -> Option<Attempt> {
        let identity = self.identity.as_ref()?;
        Some(Attempt::new(
            &identity.coordinator_id,
            identity.incarnation,
            0,
        ))
    }

    /// An operator cleared the behind mark (audited): the log takes new work again.
    pub(super) fn clear_behind(&mut self) {
        self.behind = None;
    }
}
