//! The readable form of what the coordinator serves, laid out for an operator's terminal.
//! Every field a peer supplied is escaped where it is laid out (`printable`).

use protocol::operator::{AuditAction, AuditList, Evidence};
use protocol::{Decision, TransactionList, TransactionStatus};

use crate::printable::printable as p;

pub fn word(decision: Decision) -> &'static str {
    match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    }
}

pub fn list_text(list: &TransactionList) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut out = format!("{:<32} {:<11} {:>9}  pending\n", "id", "state", "age");
    for tx in &list.transactions {
        let pending: Vec<String> = tx
            .participants
            .iter()
            .filter(|p| !p.acked && tx.decided_at_ms.is_some())
            .map(|p| {
                format!(
                    "{} ({} attempts{})",
                    p.name,
                    p.attempts,
                    p.last_error
                        .as_deref()
                        .map(|e| format!(", last error: {}", crate::printable::printable(e)))
                        .unwrap_or_default()
                )
            })
            .collect();
        out.push_str(&format!(
            "{:<32} {:<11} {:>8}s  {}\n",
            tx.id.as_str(),
            format!("{:?}", tx.state).to_lowercase(),
            now.saturating_sub(tx.created_at_ms) / 1000,
            pending.join("; ")
        ));
    }
    out
}

pub fn status_text(status: &TransactionStatus) -> String {
    let mut out = format!(
        "{} ({}): {:?}{}\n",
        status.id,
        status.gtid,
        status.state,
        status
            .reason
            .as_deref()
            .map(|r| format!(", {}", p(r)))
            .unwrap_or_default()
    );
    for p in &status.participants {
        out.push_str(&format!(
            "  {:<16} vote {:<8} acked {:<5} attempts {}{}\n",
            p.name.as_str(),
            p.vote
                .map_or("-".to_string(), |v| format!("{v:?}").to_lowercase()),
            p.acked,
            p.attempts,
            p.last_error
                .as_deref()
                .map(|e| format!(", last error: {}", crate::printable::printable(e)))
                .unwrap_or_default()
        ));
    }
    out
}

pub fn evidence_text(evidence: &Evidence) -> String {
    let mut out = format!(
        "attempt {} of {}\n  coordinator: {}\n",
        evidence.gtid, evidence.id, evidence.coordinator
    );
    if let Some(named) = &evidence.named {
        let names: Vec<&str> = named.iter().map(|n| n.as_str()).collect();
        out.push_str(&format!("  named participants: {}\n", names.join(", ")));
    }
    for p in &evidence.participants {
        let said = match (&p.state, &p.error) {
            (Some(state), _) => {
                let since = p
                    .prepared_at_ms
                    .map(|at| {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                        format!(" for {} s", now.saturating_sub(at) / 1000)
                    })
                    .unwrap_or_default();
                format!("{}{since}", format!("{state:?}").to_lowercase())
            }
            (None, error) => format!(
                "not asked: {}",
                crate::printable::printable(error.as_deref().unwrap_or("no answer"))
            ),
        };
        out.push_str(&format!("  {:<16} {said}\n", p.participant.as_str()));
    }
    out
}

pub fn sagas_text(list: &protocol::saga::SagaList) -> String {
    let mut out = String::new();
    for saga in &list.sagas {
        out.push_str(&format!(
            "{} {} ({} s){}{}\n",
            saga.id,
            saga.state.as_str(),
            saga.age_ms / 1000,
            saga.reason
                .as_deref()
                .map(|r| format!(": {}", p(r)))
                .unwrap_or_default(),
            saga.resolved_by_hand
                .as_ref()
                .map(|h| format!(
                    " [settled by hand by {} (audit #{}): {}]",
                    p(&h.operator),
                    h.audit_seq,
                    p(&h.reason)
                ))
                .unwrap_or_default()
        ));
        for step in &saga.steps {
            out.push_str(&format!(
                "  {:<16} {:<16} {:?} attempts {}{}\n",
                p(&step.name),
                step.participant.as_str(),
                step.status,
                step.attempts,
                step.last_error
                    .as_deref()
                    .map(|e| format!(", last error: {}", p(e)))
                    .unwrap_or_default()
            ));
        }
    }
    if list.sagas.is_empty() {
        out.push_str("no sagas\n");
    }
    out
}

pub fn audit_text(list: &AuditList) -> String {
    let mut out = String::new();
    for entry in &list.audit {
        let what = match &entry.action {
            AuditAction::Resolve {
                id, gtid, decision, ..
            } => format!("resolve {id} ({gtid}) as {}", word(*decision)),
            AuditAction::RetryTransaction { id, retried } => {
                format!("retry {id}: {retried} deliveries")
            }
            AuditAction::RetryParticipant {
                participant,
                retried,
            } => format!("retry participant {participant}: {retried} deliveries"),
            AuditAction::RetrySaga { id } => format!("retry saga {id}"),
            AuditAction::ResolveSagaByHand { id } => format!("settle saga {id} by hand"),
            AuditAction::ClearBehind { cleared } => {
                format!("clear the log-behind mark (it rested on: {cleared})")
            }
        };
        out.push_str(&format!(
            "#{} at {} ms by {}: {what} ({})\n",
            entry.seq,
            entry.at_ms,
            p(&entry.operator),
            p(&entry.reason)
        ));
    }
    if list.audit.is_empty() {
        out.push_str("no operator actions recorded\n");
    }
    out
}

/// One saga beside what each participant says of its steps.
pub fn saga_evidence_text(evidence: &protocol::operator::SagaEvidence) -> String {
    let mut out = sagas_text(&protocol::saga::SagaList {
        sagas: vec![evidence.saga.clone()],
    });
    out.push_str("evidence (each step's action at its participant):\n");
    for step in &evidence.steps {
        let says = match (&step.participant_says, &step.error) {
            (Some(status), _) => format!("{status:?}").to_lowercase(),
            (None, error) => {
                format!("not asked: {}", p(error.as_deref().unwrap_or("no answer")))
            }
        };
        out.push_str(&format!(
            "  {:<16} {:<16} log: {:<22} participant: {says}\n",
            p(&step.name),
            step.participant.as_str(),
            format!("{:?}", step.coordinator_says)
        ));
    }
    out
}

/// Everything stuck or in doubt, in one screen.
pub fn cluster_text(view: &protocol::operator::ClusterView) -> String {
    let mut out = format!(
        "coordinator {} epoch {}{}\n{} live transactions ({} shown, oldest first)\n",
        view.coordinator_id,
        view.epoch,
        view.log_behind
            .as_deref()
            .map(|e| format!(" LOG BEHIND: {}", p(e)))
            .unwrap_or_default(),
        view.live_total,
        view.live.len()
    );
    out.push_str(&list_text(&protocol::TransactionList {
        transactions: view.live.clone(),
        next: None,
    }));
    out.push_str("in doubt at participants:\n");
    for p in &view.participants {
        if !p.reachable {
            out.push_str(&format!(
                "  {:<16} UNREACHABLE: {}\n",
                p.name.as_str(),
                crate::printable::printable(p.error.as_deref().unwrap_or(""))
            ));
        }
        for d in &p.in_doubt {
            out.push_str(&format!(
                "  {:<16} {} ({}) from {} epoch {}, {} s{}\n",
                p.name.as_str(),
                d.txid,
                d.gtid,
                d.coordinator_id,
                d.epoch,
                d.age_ms / 1000,
                d.last_answer
                    .as_deref()
                    .map(|a| format!(", last answer: {}", crate::printable::printable(a)))
                    .unwrap_or_default()
            ));
        }
    }
    out.push_str("sagas not ended well:\n");
    out.push_str(&sagas_text(&protocol::saga::SagaList {
        sagas: view.sagas.clone(),
    }));
    out.push_str(&format!("{} leases held\n", view.leases.len()));
    out
}

/// The leases held now, with the time each has left.
pub fn leases_text(list: &protocol::lease::LeaseList) -> String {
    let mut out = format!(
        "{:<32} {:<24} {:>8} {:>10}\n",
        "name", "holder", "token", "left"
    );
    for lease in &list.leases {
        out.push_str(&format!(
            "{:<32} {:<24} {:>8} {:>9}s\n",
            p(&lease.name),
            p(&lease.holder),
            lease.token,
            lease.expires_in_ms.unwrap_or(0) / 1000
        ));
    }
    if list.leases.is_empty() {
        out.push_str("no lease is held\n");
    }
    out
}
