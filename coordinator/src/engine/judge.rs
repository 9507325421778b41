//! Whether an operator may resolve an attempt by hand, from the evidence: the coordinator's own
//! answer and each participant's word. Pure: the runtime gathers the evidence, this decides.
//!
//! The rule protects the one thing a resolution could break, atomicity: every participant of
//! an attempt must end it the same way, and no participant that already ended it can change.
//! - The coordinator's own log wins: an attempt it decided, is still deciding, or can prove
//!   aborted is not the operator's to resolve (`not_in_doubt`, or `contradicts_evidence` for
//!   the other decision).
//! - Commit only if no participant aborted or refused it, and either one committed it (the
//!   lost decision was commit) or every participant the attempt named holds it prepared.
//! - Abort only if no participant committed it.
//! - A participant that could not be asked, or that forgot how the attempt ended, could hide
//!   the contradiction: `insufficient_evidence`, except that one participant's commit already
//!   proves commit.
//! - The attempt is judged only under its own id: a participant that holds it under another
//!   id refuses the claim (`attempt_id_mismatch`), as the engine's own records do before
//!   (`Engine::claim_refusal`).
//! - Which participants the attempt named comes from the attempt, never from the operator:
//!   the log's Begin or Decision, or else the list each participant kept from its prepare
//!   (they vouch for it, and must agree). An operator's list is only checked against it.

use protocol::operator::{AttemptState, ParticipantEvidence};
use protocol::{Decision, ErrorCode, ParticipantName, TxId};

/// What the coordinator itself says about the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnAnswer {
    /// Its log holds the decision (live, staged or in the outcome index).
    Decided(Decision),
    /// An operator resolved it before.
    Resolved(Decision),
    /// Still in phase one, or its decision is not durable yet: the coordinator decides.
    Pending,
    /// Its log proves no decision was made: participants asking already hear abort.
    PresumedAbort(String),
    /// Its log cannot say (the restore case, or an attempt it never began).
    Unknown(String),
}

/// Why a resolution is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

fn refuse(code: ErrorCode, message: String) -> Result<(), Refusal> {
    Err(Refusal { code, message })
}

fn state_word(state: AttemptState) -> &'static str {
    match state {
        AttemptState::Prepared => "prepared",
        AttemptState::Committed => "committed",
        AttemptState::Aborted => "aborted",
        AttemptState::Refused => "refused",
        AttemptState::Forgotten => "forgotten",
        AttemptState::Unknown => "never seen",
    }
}

fn word(decision: Decision) -> &'static str {
    match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    }
}

/// The participants the attempt named, from the attempt itself: the log's list when it holds
/// one, else the list the participants kept from their prepares (all that say must agree).
/// An operator's list that differs from it is refused; one that nothing can confirm is not
/// taken as proof (`None`).
pub fn attempt_participants(
    from_log: Option<&[ParticipantName]>,
    from_operator: Option<&[ParticipantName]>,
    evidence: &[ParticipantEvidence],
) -> Result<Option<Vec<ParticipantName>>, Refusal> {
    let sorted = |list: &[ParticipantName]| {
        let mut list = list.to_vec();
        list.sort();
        list
    };
    let attempt = match from_log {
        Some(list) => Some(sorted(list)),
        None => {
            let mut vouched: Option<(&ParticipantName, Vec<ParticipantName>)> = None;
            for e in evidence {
                let Some(list) = &e.participants else {
                    continue;
                };
                let list = sorted(list);
                match &vouched {
                    None => vouched = Some((&e.participant, list)),
                    Some((first, held)) if *held != list => {
                        return Err(Refusal {
                            code: ErrorCode::ContradictsEvidence,
                            message: format!(
                                "participants disagree on the attempt's participants: {first} \
                                 holds [{}], {} holds [{}]",
                                names(held),
                                e.participant,
                                names(&list)
                            ),
                        });
                    }
                    Some(_) => {}
                }
            }
            vouched.map(|(_, list)| list)
        }
    };
    match (attempt, from_operator) {
        (Some(attempt), Some(given)) if sorted(given) != attempt => Err(Refusal {
            code: ErrorCode::ContradictsEvidence,
            message: format!(
                "the attempt named [{}], not [{}]",
                names(&attempt),
                names(&sorted(given))
            ),
        }),
        (attempt, _) => Ok(attempt),
    }
}

fn names(list: &[ParticipantName]) -> String {
    list.iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `requested` may be recorded for the attempt, claimed as an attempt of `txid`.
/// `named`: the participants the attempt named, when known (`attempt_participants`).
/// `evidence`: every participant asked, with its answer.
pub fn judge(
    requested: Decision,
    txid: &TxId,
    own: &OwnAnswer,
    named: Option<&[ParticipantName]>,
    evidence: &[ParticipantEvidence],
) -> Result<(), Refusal> {
    match own {
        OwnAnswer::Decided(decided) | OwnAnswer::Resolved(decided) => {
            let by = if matches!(own, OwnAnswer::Resolved(_)) {
                "an operator already resolved it as"
            } else {
                "the coordinator's log decided"
            };
            return if *decided == requested {
                refuse(
                    ErrorCode::NotInDoubt,
                    format!(
                        "{by} {}; participants asking hear it already",
                        word(*decided)
                    ),
                )
            } else {
                refuse(
                    ErrorCode::ContradictsEvidence,
                    format!(
                        "{by} {}; {} would split it",
                        word(*decided),
                        word(requested)
                    ),
                )
            };
        }
        OwnAnswer::Pending => {
            return refuse(
                ErrorCode::NotInDoubt,
                "the coordinator is still deciding this attempt; it needs no operator".into(),
            );
        }
        OwnAnswer::PresumedAbort(why) => {
            return match requested {
                Decision::Abort => refuse(
                    ErrorCode::NotInDoubt,
                    format!("already answered abort to participants that ask ({why})"),
                ),
                Decision::Commit => refuse(
                    ErrorCode::ContradictsEvidence,
                    format!("the coordinator's log proves abort ({why}); commit would split it"),
                ),
            };
        }
        OwnAnswer::Unknown(_) => {}
    }
    if let Some(e) = evidence
        .iter()
        .find(|e| e.txid.as_ref().is_some_and(|held| held != txid))
    {
        return refuse(
            ErrorCode::AttemptIdMismatch,
            format!(
                "participant {} holds this attempt as transaction {}, not {txid}",
                e.participant,
                e.txid.as_ref().map_or("", |t| t.as_str())
            ),
        );
    }
    if let Some(named) = named {
        // A participant the attempt named that was not asked (not in this coordinator's
        // configuration) may have ended it either way.
        if let Some(p) = named
            .iter()
            .find(|p| !evidence.iter().any(|e| &e.participant == *p))
        {
            return refuse(
                ErrorCode::InsufficientEvidence,
                format!(
                    "participant {p}, which the attempt named, is not in this coordinator's \
                     configuration and could not be asked"
                ),
            );
        }
    }
    let with = |state: AttemptState| -> Vec<&ParticipantName> {
        evidence
            .iter()
            .filter(|e| e.state == Some(state))
            .map(|e| &e.participant)
            .collect()
    };
    let committed = with(AttemptState::Committed);
    let ended_other_way: Vec<&ParticipantName> = with(AttemptState::Aborted)
        .into_iter()
        .chain(with(AttemptState::Refused))
        .collect();
    match requested {
        Decision::Commit => {
            if let Some(p) = ended_other_way.first() {
                return refuse(
                    ErrorCode::ContradictsEvidence,
                    format!("participant {p} aborted (or voted no on) this attempt"),
                );
            }
            if !committed.is_empty() {
                // The lost decision was commit: nobody else can have ended it otherwise.
                return Ok(());
            }
        }
        Decision::Abort => {
            if let Some(p) = committed.first() {
                return refuse(
                    ErrorCode::ContradictsEvidence,
                    format!("participant {p} committed this attempt"),
                );
            }
        }
    }
    if let Some(e) = evidence.iter().find(|e| e.state.is_none()) {
        return refuse(
            ErrorCode::InsufficientEvidence,
            format!(
                "participant {} could not be asked ({}); it may have ended the attempt",
                e.participant,
                e.error.as_deref().unwrap_or("no answer")
            ),
        );
    }
    if let Some(p) = with(AttemptState::Forgotten).first() {
        return refuse(
            ErrorCode::InsufficientEvidence,
            format!(
                "participant {p} ended this attempt but no longer remembers how (its tombstone \
                 expired); check its data by hand"
            ),
        );
    }
    match requested {
        Decision::Abort => Ok(()),
        Decision::Commit => {
            let Some(named) = named else {
                return refuse(
                    ErrorCode::InsufficientEvidence,
                    "no participant committed it, and neither the coordinator's log nor any \
                     participant names the attempt's participants: commit needs every one of \
                     them prepared, and an operator's list cannot prove which they were"
                        .into(),
                );
            };
            for p in named {
                let state = evidence
                    .iter()
                    .find(|e| &e.participant == p)
                    .and_then(|e| e.state);
                match state {
                    Some(AttemptState::Prepared) => {}
                    None => {
                        return refuse(
                            ErrorCode::InsufficientEvidence,
                            format!("participant {p} was not asked"),
                        );
                    }
                    Some(other) => {
                        return refuse(
                            ErrorCode::ContradictsEvidence,
                            format!(
                                "participant {p} does not hold the attempt prepared ({}): it \
                                 never voted yes, so it cannot commit",
                                state_word(other)
                            ),
                        );
                    }
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str) -> ParticipantName {
        ParticipantName::new(name).unwrap()
    }

    fn says(name: &str, state: AttemptState) -> ParticipantEvidence {
        ParticipantEvidence {
            participant: p(name),
            prepared_at_ms: None,
            state: Some(state),
            error: None,
            txid: None,
            participants: None,
        }
    }

    fn silent(name: &str) -> ParticipantEvidence {
        ParticipantEvidence {
            participant: p(name),
            prepared_at_ms: None,
            state: None,
            error: Some("connection refused".into()),
            txid: None,
            participants: None,
        }
    }

    fn t() -> TxId {
        TxId::new("order-1").unwrap()
    }

    /// The judge, for an attempt claimed under its own id `order-1`.
    fn j(
        requested: Decision,
        own: &OwnAnswer,
        named: Option<&[ParticipantName]>,
        evidence: &[ParticipantEvidence],
    ) -> Result<(), Refusal> {
        judge(requested, &t(), own, named, evidence)
    }

    fn holding(mut e: ParticipantEvidence, txid: &str, named: &[&str]) -> ParticipantEvidence {
        e.txid = Some(TxId::new(txid).unwrap());
        e.participants = Some(named.iter().map(|n| p(n)).collect());
        e
    }

    fn unknown() -> OwnAnswer {
        OwnAnswer::Unknown("restored log".into())
    }

    use AttemptState::*;
    use Decision::*;

    fn code(result: Result<(), Refusal>) -> Option<ErrorCode> {
        result.err().map(|r| r.code)
    }

    #[test]
    fn the_coordinators_own_answer_wins() {
        let all = [says("a", Prepared), says("b", Prepared)];
        for (own, requested, expected) in [
            (OwnAnswer::Decided(Commit), Commit, ErrorCode::NotInDoubt),
            (
                OwnAnswer::Decided(Commit),
                Abort,
                ErrorCode::ContradictsEvidence,
            ),
            (OwnAnswer::Resolved(Abort), Abort, ErrorCode::NotInDoubt),
            (
                OwnAnswer::Resolved(Abort),
                Commit,
                ErrorCode::ContradictsEvidence,
            ),
            (OwnAnswer::Pending, Commit, ErrorCode::NotInDoubt),
            (OwnAnswer::Pending, Abort, ErrorCode::NotInDoubt),
            (
                OwnAnswer::PresumedAbort("x".into()),
                Abort,
                ErrorCode::NotInDoubt,
            ),
            (
                OwnAnswer::PresumedAbort("x".into()),
                Commit,
                ErrorCode::ContradictsEvidence,
            ),
        ] {
            assert_eq!(
                code(j(requested, &own, Some(&[p("a"), p("b")]), &all)),
                Some(expected),
                "{own:?} {requested:?}"
            );
        }
    }

    #[test]
    fn commit_needs_every_named_participant_prepared_or_one_committed() {
        let named = [p("a"), p("b")];
        let both = [says("a", Prepared), says("b", Prepared)];
        assert_eq!(j(Commit, &unknown(), Some(&named), &both), Ok(()));
        assert_eq!(
            code(j(Commit, &unknown(), None, &both)),
            Some(ErrorCode::InsufficientEvidence),
            "without the attempt's participants, prepared-everywhere cannot be shown"
        );
        let one_missing = [says("a", Prepared), says("b", Unknown)];
        assert_eq!(
            code(j(Commit, &unknown(), Some(&named), &one_missing)),
            Some(ErrorCode::ContradictsEvidence),
            "b never voted yes"
        );
        let one_committed = [says("a", Prepared), says("b", Committed), silent("c")];
        assert_eq!(j(Commit, &unknown(), None, &one_committed), Ok(()));
        let one_aborted = [says("a", Prepared), says("b", Aborted)];
        assert_eq!(
            code(j(Commit, &unknown(), Some(&named), &one_aborted)),
            Some(ErrorCode::ContradictsEvidence)
        );
        let one_refused = [says("a", Prepared), says("b", Refused)];
        assert_eq!(
            code(j(Commit, &unknown(), Some(&named), &one_refused)),
            Some(ErrorCode::ContradictsEvidence)
        );
        let forgot = [says("a", Prepared), says("b", Forgotten)];
        assert_eq!(
            code(j(Commit, &unknown(), Some(&named), &forgot)),
            Some(ErrorCode::InsufficientEvidence)
        );
        let unasked = [says("a", Prepared), silent("b")];
        assert_eq!(
            code(j(Commit, &unknown(), Some(&named), &unasked)),
            Some(ErrorCode::InsufficientEvidence)
        );
    }

    #[test]
    fn abort_needs_no_participant_committed() {
        let named = [p("a"), p("b")];
        assert_eq!(
            j(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), says("b", Unknown)]
            ),
            Ok(())
        );
        assert_eq!(
            j(
                Abort,
                &unknown(),
                Some(&named),
                &[says("a", Prepared), says("b", Aborted)]
            ),
            Ok(())
        );
        assert_eq!(
            code(j(
                Abort,
                &unknown(),
                Some(&named),
                &[says("a", Prepared), says("b", Committed)]
            )),
            Some(ErrorCode::ContradictsEvidence)
        );
        assert_eq!(
            code(j(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), says("b", Forgotten)]
            )),
            Some(ErrorCode::InsufficientEvidence),
            "b may have committed"
        );
        assert_eq!(
            code(j(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), silent("b")]
            )),
            Some(ErrorCode::InsufficientEvidence)
        );
    }

    #[test]
    fn an_attempt_is_judged_only_under_its_own_id() {
        let named = [p("a"), p("b")];
        let other = [
            holding(says("a", Prepared), "ghost", &["a", "b"]),
            says("b", Prepared),
        ];
        for requested in [Commit, Abort] {
            assert_eq!(
                code(j(requested, &unknown(), Some(&named), &other)),
                Some(ErrorCode::AttemptIdMismatch),
                "{requested:?} of another id's attempt"
            );
        }
        let own = [
            holding(says("a", Prepared), "order-1", &["a", "b"]),
            holding(says("b", Prepared), "order-1", &["a", "b"]),
        ];
        assert_eq!(j(Commit, &unknown(), Some(&named), &own), Ok(()));
    }

    #[test]
    fn a_named_participant_nobody_could_ask_blocks_the_resolution() {
        let named = [p("a"), p("b"), p("z")];
        let asked = [says("a", Prepared), says("b", Prepared)];
        for requested in [Commit, Abort] {
            assert_eq!(
                code(j(requested, &unknown(), Some(&named), &asked)),
                Some(ErrorCode::InsufficientEvidence),
                "z is not configured: it may have ended the attempt ({requested:?})"
            );
        }
    }

    #[test]
    fn the_attempts_participants_come_from_the_attempt_not_the_operator() {
        let log = [p("b"), p("a")];
        let vouching = [
            holding(says("a", Prepared), "order-1", &["a", "b"]),
            holding(says("b", Prepared), "order-1", &["b", "a"]),
        ];
        // The log's list wins and is what the operator's list is checked against.
        assert_eq!(
            attempt_participants(Some(&log), None, &[]),
            Ok(Some(vec![p("a"), p("b")]))
        );
        assert_eq!(
            attempt_participants(Some(&log), Some(&[p("a")]), &vouching)
                .err()
                .map(|r| r.code),
            Some(ErrorCode::ContradictsEvidence),
            "an operator who leaves b out is refused"
        );
        // Without the log, the participants vouch (in any order).
        assert_eq!(
            attempt_participants(None, Some(&[p("a"), p("b")]), &vouching),
            Ok(Some(vec![p("a"), p("b")]))
        );
        assert_eq!(
            attempt_participants(None, Some(&[p("a")]), &vouching)
                .err()
                .map(|r| r.code),
            Some(ErrorCode::ContradictsEvidence)
        );
        // Participants that disagree are a contradiction in themselves.
        let disagree = [
            holding(says("a", Prepared), "order-1", &["a", "b"]),
            holding(says("b", Prepared), "order-1", &["a", "b", "c"]),
        ];
        assert_eq!(
            attempt_participants(None, None, &disagree)
                .err()
                .map(|r| r.code),
            Some(ErrorCode::ContradictsEvidence)
        );
        // Nothing vouches: the operator's list is not taken as proof, so commit cannot pass.
        let silent_lists = [says("a", Prepared), says("b", Prepared)];
        let named = attempt_participants(None, Some(&[p("a"), p("b")]), &silent_lists);
        assert_eq!(named, Ok(None));
        assert_eq!(
            code(j(Commit, &unknown(), None, &silent_lists)),
            Some(ErrorCode::InsufficientEvidence)
        );
    }
}
