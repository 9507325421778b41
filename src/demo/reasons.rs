//! Abort reasons as a few categories (`inventory: lock conflict`), so the summary reads like a
//! histogram rather than one line per distinct message.

use protocol::{TransactionResponse, VoteKind};

/// The first participant that did not vote yes, and a short reason.
pub fn abort_category(answer: &TransactionResponse) -> String {
    let Some(part) = answer.participants.iter().find(|p| p.vote != VoteKind::Yes) else {
        return format!(
            "aborted: {}",
            answer.reason.as_deref().unwrap_or("no reason given")
        );
    };
    let reason = answer.reason.as_deref().unwrap_or("").to_ascii_lowercase();
    let why = match part.vote {
        VoteKind::Timeout => "prepare timed out",
        VoteKind::Error => "no valid vote (error)",
        // The participant's own prefixes first: a wait that ran out, and an immediate no (a
        // younger holder, too many waiters); "lock conflict" is what older participants said.
        VoteKind::Yes | VoteKind::No if reason.contains("lock_timeout") => "lock wait timed out",
        VoteKind::Yes | VoteKind::No if reason.contains("lock_conflict") => {
            "lock conflict (younger holder or no wait)"
        }
        VoteKind::Yes | VoteKind::No if reason.contains("lock") => "lock conflict",
        VoteKind::Yes | VoteKind::No
            if reason.contains("min") || reason.contains("insufficient") =>
        {
            "would go below minimum"
        }
        VoteKind::Yes | VoteKind::No if reason.contains("version") => "version check failed",
        VoteKind::Yes | VoteKind::No => "voted no",
    };
    format!("{}: {why}", part.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{GlobalTxId, Outcome, ParticipantName, ParticipantResult, TxId};

    fn answer(votes: &[(&str, VoteKind)], reason: &str) -> TransactionResponse {
        TransactionResponse {
            id: TxId::new("o-1").unwrap(),
            gtid: GlobalTxId::new("c-1:0000000000000001:1").unwrap(),
            outcome: Outcome::Aborted,
            reason: Some(reason.to_string()),
            participants: votes
                .iter()
                .map(|(name, vote)| ParticipantResult {
                    name: ParticipantName::new(*name).unwrap(),
                    vote: *vote,
                    acked: false,
                })
                .collect(),
        }
    }

    #[test]
    fn names_the_first_participant_that_did_not_vote_yes() {
        use VoteKind::*;
        let cases = [
            (
                vec![("inventory", Yes), ("payments", No)],
                "key balance:cust-1 is locked by o-0",
                "payments: lock conflict",
            ),
            (
                vec![("inventory", No)],
                "inventory voted no: lock_timeout: waited 1500 ms for key \"stock:sku-1\" held by prepared attempt c:1:1",
                "inventory: lock wait timed out",
            ),
            (
                vec![("payments", No)],
                "payments voted no: lock_conflict: key \"balance:c-1\" is locked by prepared attempt c:1:2, which started after this one",
                "payments: lock conflict (younger holder or no wait)",
            ),
            (
                vec![("inventory", No), ("payments", Yes)],
                "stock:sku-1 would go to -1, below min 0",
                "inventory: would go below minimum",
            ),
            (
                vec![("inventory", Yes), ("shipping", Timeout)],
                "",
                "shipping: prepare timed out",
            ),
            (
                vec![("inventory", Error)],
                "500",
                "inventory: no valid vote (error)",
            ),
            (
                vec![("inventory", No)],
                "check failed: version 3, expected 2",
                "inventory: version check failed",
            ),
            (
                vec![("inventory", No)],
                "something else",
                "inventory: voted no",
            ),
            (
                vec![("inventory", Yes)],
                "recovered undecided",
                "aborted: recovered undecided",
            ),
        ];
        for (votes, reason, expected) in cases {
            assert_eq!(
                abort_category(&answer(&votes, reason)),
                expected,
                "{reason}"
            );
        }
    }
}
