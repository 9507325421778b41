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

use protocol::operator::{AttemptState, ParticipantEvidence};
use protocol::{Decision, ErrorCode, ParticipantName};

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

fn word(decision: Decision) -> &'static str {
    match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    }
}

/// Whether `requested` may be recorded for the attempt. `named`: the participants the attempt
/// named, when known. `evidence`: every participant asked, with its answer.
pub fn judge(
    requested: Decision,
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
                    "no participant committed it and the coordinator's log no longer names the \
                     attempt's participants: commit needs every one of them prepared; name them \
                     in \"participants\""
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
                                "participant {p} does not hold the attempt prepared ({other:?}): \
                                 it never voted yes, so it cannot commit"
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
                code(judge(requested, &own, Some(&[p("a"), p("b")]), &all)),
                Some(expected),
                "{own:?} {requested:?}"
            );
        }
    }

    #[test]
    fn commit_needs_every_named_participant_prepared_or_one_committed() {
        let named = [p("a"), p("b")];
        let both = [says("a", Prepared), says("b", Prepared)];
        assert_eq!(judge(Commit, &unknown(), Some(&named), &both), Ok(()));
        assert_eq!(
            code(judge(Commit, &unknown(), None, &both)),
            Some(ErrorCode::InsufficientEvidence),
            "without the attempt's participants, prepared-everywhere cannot be shown"
        );
        let one_missing = [says("a", Prepared), says("b", Unknown)];
        assert_eq!(
            code(judge(Commit, &unknown(), Some(&named), &one_missing)),
            Some(ErrorCode::ContradictsEvidence),
            "b never voted yes"
        );
        let one_committed = [says("a", Prepared), says("b", Committed), silent("c")];
        assert_eq!(judge(Commit, &unknown(), None, &one_committed), Ok(()));
        let one_aborted = [says("a", Prepared), says("b", Aborted)];
        assert_eq!(
            code(judge(Commit, &unknown(), Some(&named), &one_aborted)),
            Some(ErrorCode::ContradictsEvidence)
        );
        let one_refused = [says("a", Prepared), says("b", Refused)];
        assert_eq!(
            code(judge(Commit, &unknown(), Some(&named), &one_refused)),
            Some(ErrorCode::ContradictsEvidence)
        );
        let forgot = [says("a", Prepared), says("b", Forgotten)];
        assert_eq!(
            code(judge(Commit, &unknown(), Some(&named), &forgot)),
            Some(ErrorCode::InsufficientEvidence)
        );
        let unasked = [says("a", Prepared), silent("b")];
        assert_eq!(
            code(judge(Commit, &unknown(), Some(&named), &unasked)),
            Some(ErrorCode::InsufficientEvidence)
        );
    }

    #[test]
    fn abort_needs_no_participant_committed() {
        let named = [p("a"), p("b")];
        assert_eq!(
            judge(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), says("b", Unknown)]
            ),
            Ok(())
        );
        assert_eq!(
            judge(
                Abort,
                &unknown(),
                Some(&named),
                &[says("a", Prepared), says("b", Aborted)]
            ),
            Ok(())
        );
        assert_eq!(
            code(judge(
                Abort,
                &unknown(),
                Some(&named),
                &[says("a", Prepared), says("b", Committed)]
            )),
            Some(ErrorCode::ContradictsEvidence)
        );
        assert_eq!(
            code(judge(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), says("b", Forgotten)]
            )),
            Some(ErrorCode::InsufficientEvidence),
            "b may have committed"
        );
        assert_eq!(
            code(judge(
                Abort,
                &unknown(),
                None,
                &[says("a", Prepared), silent("b")]
            )),
            Some(ErrorCode::InsufficientEvidence)
        );
    }
}
