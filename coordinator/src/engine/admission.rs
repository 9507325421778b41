//! A client's submit: answered from what is known (live, staged, or the outcome the index
//! held), refused when a bound says so (staging full, a participant overloaded, too many
//! waiters), or begun as a new attempt of this run and its prepares sent.

use protocol::{ParticipantName, TxId};

use crate::engine::Engine;
use crate::engine::io::{Command, Reply, WaitFor, WaiterId};
use crate::engine::tx::{Part, Phase, Tx, response, retained_response};
use crate::records::{Attempt, BeginRecord, LogRecord, Retained};

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &mut self,
        waiter: WaiterId,
        wait: WaitFor,
        txid: TxId,
        digest: crate::digest::Digest,
        participants: Vec<(ParticipantName, serde_json::Value)>,
        timeout_ms: u64,
        now_ms: u64,
        (archived, archive_generation): (Option<Retained>, u64),
        client: Option<String>,
    ) -> Vec<Command> {
        if let Some(retained) = self.retained.get(&txid) {
            let reply = if retained.decision.digest == digest {
                Reply::Outcome(retained_response(&retained.decision))
            } else {
                Reply::Conflict { txid }
            };
            return vec![Command::Reply { waiter, reply }];
        }
        if let Some(tx) = self.live.get_mut(&txid) {
            if tx.digest != digest {
                return vec![Command::Reply {
                    waiter,
                    reply: Reply::Conflict { txid },
                }];
            }
            // A retry of a request we are still working on: answer now if its wait is over,
            // otherwise join the waiters. Never a second prepare.
            return match &tx.phase {
                Phase::Decided(decided) if wait == WaitFor::Decision => vec![Command::Reply {
                    waiter,
                    reply: Reply::Outcome(response(tx, decided)),
                }],
                Phase::LogFailed { error } => vec![Command::Reply {
                    waiter,
                    reply: Reply::LogFailed {
                        error: error.clone(),
                    },
                }],
                Phase::Decided(_) | Phase::Preparing | Phase::Deciding(_)
                    if tx.waiters.len() >= self.config.bounds.waiters_per_transaction =>
                {
                    vec![Command::Reply {
                        waiter,
                        reply: Reply::Overloaded {
                            participant: tx.parts[0].name.clone(),
                            message: format!(
                                "{} requests already wait for transaction {txid} (the bound is \
                                 {}); retry later",
                                tx.waiters.len(),
                                self.config.bounds.waiters_per_transaction
                            ),
                        },
                    }]
                }
                Phase::Decided(_) | Phase::Preparing | Phase::Deciding(_) => {
                    tx.waiters.push((waiter, wait));
                    Vec::new()
                }
            };
        }
        // Not live, not staged: the index's answer, if it had one, is the recorded outcome.
        if let Some(retained) = archived.filter(|r| r.decision.txid == txid) {
            let reply = if retained.decision.digest == digest {
                Reply::Outcome(retained_response(&retained.decision))
            } else {
                Reply::Conflict { txid }
            };
            return vec![Command::Reply { waiter, reply }];
        }
        if archive_generation != self.archive_generation {
            // Something left staging for the index since the runtime looked there: this id's
            // outcome may be among it. Look again rather than start a second attempt.
            return vec![Command::Reply {
                waiter,
                reply: Reply::LookAgain,
            }];
        }
        if self.retained.len() >= self.config.retained_max {
            return vec![Command::Reply {
                waiter,
                reply: Reply::Busy {
                    staged: self.retained.len(),
                },
            }];
        }
        if let Some(overload) = self.loads.refusal(
            &self.config.bounds,
            participants.iter().map(|(name, _)| name),
        ) {
            return vec![Command::Reply {
                waiter,
                reply: Reply::Overloaded {
                    participant: overload.participant,
                    message: overload.message,
                },
            }];
        }
        let Some(identity) = &self.identity else {
            // The runtime takes no transaction before recovery began this run.
            debug_assert!(false, "a transaction submitted before RecoveryDone");
            return vec![Command::Reply {
                waiter,
                reply: Reply::LogFailed {
                    error: "the coordinator has not finished recovery".to_string(),
                },
            }];
        };
        let attempt = Attempt::new(
            &identity.coordinator_id,
            identity.incarnation,
            self.next_position,
        );
        self.next_position += 1;
        self.note_attempt(&attempt);
        let mut commands = vec![Command::AppendLazy(LogRecord::Begin(BeginRecord {
            txid: txid.clone(),
            attempt: attempt.clone(),
            digest,
            participants: participants.iter().map(|(name, _)| name.clone()).collect(),
            created_at_ms: now_ms,
            client: client.clone(),
        }))];
        let named: Vec<ParticipantName> =
            participants.iter().map(|(name, _)| name.clone()).collect();
        let parts = named.iter().cloned().map(Part::new).collect();
        // The payloads move into their prepares: nothing else here needs them.
        for (name, payload) in participants {
            commands.push(Command::SendPrepare {
                txid: txid.clone(),
                attempt: attempt.clone(),
                participant: name,
                payload,
                timeout_ms,
                started_at_ms: now_ms,
                named: named.clone(),
            });
        }
        commands.push(Command::ArmPrepareDeadline {
            txid: txid.clone(),
            after_ms: timeout_ms,
        });
        let tx = Tx {
            id: txid.clone(),
            attempt,
            digest,
            created_at_ms: now_ms,
            parts,
            phase: Phase::Preparing,
            waiters: vec![(waiter, wait)],
            client,
        };
        self.live.insert(txid, tx);
        commands
    }
}
