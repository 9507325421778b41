//! `twopc ctl`: the operator's command line over the coordinator's HTTP API. It only reads
//! what the coordinator serves and asks it to act; every action is judged and audited there.
//!
//! Exit codes: 0 done; 1 the coordinator refused or failed (its error is printed); 2 bad
//! usage; 3 the coordinator could not be reached.

use std::process::ExitCode;
use std::time::Duration;

use protocol::operator::{AuditAction, AuditList, Evidence, RefusalBody, ResolveResponse};
use protocol::{Decision, ErrorBody, TransactionList, TransactionStatus};
use serde_json::{Value, json};

use crate::printable::{printable as p, printable_json, printable_lines};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The coordinator's base URL.
    #[arg(
        long,
        env = "TWOPC_COORDINATOR",
        default_value = "http://127.0.0.1:7100",
        global = true
    )]
    pub coordinator: String,
    /// Print the coordinator's JSON instead of the readable form.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub client: crate::client::ClientArgs,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum CtlCommand {
    /// Transactions by state, live ones first (stuck work: `--state committing|aborting`).
    List {
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One transaction: the coordinator's record and what each participant holds of it.
    Show {
        id: String,
        /// The attempt, when participants hold several of the id.
        #[arg(long)]
        gtid: Option<String>,
    },
    /// Resolve an attempt the coordinator cannot decide (after a restore), if the evidence
    /// allows it. Refused, with the evidence, when it would contradict anything.
    Resolve {
        id: String,
        #[arg(long, value_parser = ["commit", "abort"])]
        decision: String,
        /// Why, for the audit trail.
        #[arg(long)]
        reason: String,
        /// Who, for the audit trail (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        #[arg(long)]
        gtid: Option<String>,
        /// Every participant the attempt named (comma-separated), when the log lost it.
        #[arg(long, value_delimiter = ',')]
        participants: Vec<String>,
    },
    /// Deliver pending decisions now: of one transaction, or every one for a participant.
    Retry {
        /// The transaction (or use --participant).
        #[arg(
            required_unless_present = "participant",
            conflicts_with = "participant"
        )]
        id: Option<String>,
        #[arg(long)]
        participant: Option<String>,
        #[arg(long, default_value = "retry now")]
        reason: String,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// The audit trail, newest first.
    Audit {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Sagas, stuck first (needs_attention, compensating, running), with age and each step.
    Sagas {
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Try a saga that waits for its backoff timer (a failing compensation) now.
    RetrySaga {
        id: String,
        #[arg(long, default_value = "retry now")]
        reason: String,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Mark a needs_attention saga as settled by hand (it stays listed, marked, audited).
    ResolveSaga {
        id: String,
        /// What was done outside twopc, for the audit trail.
        #[arg(long)]
        reason: String,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Clear the "log behind" mark (audited): after checking that the evidence it rests on
    /// is a mistake, or accepting that this log lost a run (docs/operations.md, "Restores").
    ClearBehind {
        /// Why, for the audit trail.
        #[arg(long)]
        reason: String,
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Leases held now, with holder, token and time left.
    Leases,
    /// One saga: its steps in the coordinator's log beside what each participant says.
    Saga { id: String },
    /// Everything stuck or in doubt: live transactions, what each participant holds in doubt
    /// (or that it cannot be reached), sagas not ended well, leases.
    Cluster,
}

/// A failure with the exit code it means.
struct Failed {
    code: u8,
    message: String,
}

pub fn main(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("twopc ctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed { code, message }) => {
            // The message may quote the server (its error text): escaped as a whole.
            eprintln!("twopc ctl: {}", printable_lines(&message));
            ExitCode::from(code)
        }
    }
}

async fn run(args: Args) -> Result<(), Failed> {
    let client =
        crate::client::build(&args.client, Duration::from_secs(30)).map_err(|e| Failed {
            code: 2,
            message: format!("{e:#}"),
        })?;
    let base = args.coordinator.trim_end_matches('/').to_string();
    let call = Call {
        client,
        base,
        json: args.json,
    };
    match args.command {
        CtlCommand::List { state, limit } => {
            let mut path = format!("/v1/transactions?limit={limit}");
            if let Some(state) = state {
                path.push_str(&format!("&state={state}"));
            }
            let body = call.get(&path).await?;
            call.print(&body, |b| {
                let list: TransactionList = serde_json::from_value(b.clone())?;
                Ok(list_text(&list))
            })
        }
        CtlCommand::Show { id, gtid } => {
            let status = call.get_optional(&format!("/v1/transactions/{id}")).await?;
            let mut path = format!("/v1/transactions/{id}/evidence");
            if let Some(gtid) = gtid {
                path.push_str(&format!("?gtid={gtid}"));
            }
            let evidence = call.get(&path).await?;
            let both = json!({"status": status, "evidence": evidence});
            call.print(&both, |b| {
                let mut out = String::new();
                match serde_json::from_value::<Option<TransactionStatus>>(b["status"].clone())? {
                    Some(status) => out.push_str(&status_text(&status)),
                    None => out.push_str(&format!(
                        "{id}: not in the coordinator's log or outcome index\n"
                    )),
                }
                let evidence: Evidence = serde_json::from_value(b["evidence"].clone())?;
                out.push_str(&evidence_text(&evidence));
                Ok(out)
            })
        }
        CtlCommand::Resolve {
            id,
            decision,
            reason,
            operator,
            gtid,
            participants,
        } => {
            let mut body = json!({"decision": decision, "operator": operator, "reason": reason});
            if let Some(gtid) = gtid {
                body["gtid"] = json!(gtid);
            }
            if !participants.is_empty() {
                body["participants"] = json!(participants);
            }
            let answer = call
                .post(&format!("/v1/transactions/{id}/resolve"), &body)
                .await?;
            call.print(&answer, |b| {
                let resolved: ResolveResponse = serde_json::from_value(b.clone())?;
                Ok(format!(
                    "resolved {} attempt {} as {} (audit #{}); participants in doubt apply it when they next ask\n{}",
                    resolved.id,
                    resolved.gtid,
                    word(resolved.decision),
                    resolved.audit_seq,
                    evidence_text(&resolved.evidence)
                ))
            })
        }
        CtlCommand::Retry {
            id,
            participant,
            reason,
            operator,
        } => {
            let path = match (id, participant) {
                (Some(id), _) => format!("/v1/transactions/{id}/retry"),
                (None, Some(p)) => format!("/v1/participants/{p}/retry"),
                (None, None) => {
                    return Err(Failed {
                        code: 2,
                        message: "name a transaction or --participant".into(),
                    });
                }
            };
            let answer = call
                .post(&path, &json!({"operator": operator, "reason": reason}))
                .await?;
            call.print(&answer, |b| {
                Ok(format!(
                    "{} deliveries started now (audit #{})\n",
                    b["retried"], b["audit_seq"]
                ))
            })
        }
        CtlCommand::Sagas { state, limit } => {
            let mut path = format!("/v1/sagas?limit={limit}");
            if let Some(state) = state {
                path.push_str(&format!("&state={state}"));
            }
            let body = call.get(&path).await?;
            call.print(&body, |b| {
                let list: protocol::saga::SagaList = serde_json::from_value(b.clone())?;
                Ok(sagas_text(&list))
            })
        }
        CtlCommand::RetrySaga {
            id,
            reason,
            operator,
        } => {
            let answer = call
                .post(
                    &format!("/v1/sagas/{id}/retry"),
                    &json!({"operator": operator, "reason": reason}),
                )
                .await?;
            call.print(&answer, |b| {
                Ok(format!(
                    "saga {id}: {} (audit #{})\n",
                    if b["retried"] == 1 {
                        "tried now"
                    } else {
                        "nothing was waiting for a timer"
                    },
                    b["audit_seq"]
                ))
            })
        }
        CtlCommand::ResolveSaga {
            id,
            reason,
            operator,
        } => {
            let answer = call
                .post(
                    &format!("/v1/sagas/{id}/resolve"),
                    &json!({"operator": operator, "reason": reason}),
                )
                .await?;
            call.print(&answer, |b| {
                let saga: protocol::saga::SagaResponse = serde_json::from_value(b.clone())?;
                Ok(sagas_text(&protocol::saga::SagaList { sagas: vec![saga] }))
            })
        }
        CtlCommand::ClearBehind { reason, operator } => {
            let answer = call
                .post(
                    protocol::routes::LOG_BEHIND_CLEAR,
                    &json!({"operator": operator, "reason": reason}),
                )
                .await?;
            call.print(&answer, |b| {
                Ok(format!(
                    "log-behind mark cleared (audit #{}); it rested on: {}\n",
                    b["audit_seq"],
                    b["cleared"].as_str().unwrap_or("")
                ))
            })
        }
        CtlCommand::Saga { id } => {
            let body = call.get(&format!("/v1/sagas/{id}/evidence")).await?;
            call.print(&body, |b| {
                let evidence: protocol::operator::SagaEvidence = serde_json::from_value(b.clone())?;
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
                Ok(out)
            })
        }
        CtlCommand::Cluster => {
            let body = call.get("/v1/cluster").await?;
            call.print(&body, |b| {
                let view: protocol::operator::ClusterView = serde_json::from_value(b.clone())?;
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
                                .map(|a| format!(
                                    ", last answer: {}",
                                    crate::printable::printable(a)
                                ))
                                .unwrap_or_default()
                        ));
                    }
                }
                out.push_str("sagas not ended well:\n");
                out.push_str(&sagas_text(&protocol::saga::SagaList {
                    sagas: view.sagas.clone(),
                }));
                out.push_str(&format!("{} leases held\n", view.leases.len()));
                Ok(out)
            })
        }
        CtlCommand::Leases => {
            let body = call.get("/v1/leases").await?;
            call.print(&body, |b| {
                let list: protocol::lease::LeaseList = serde_json::from_value(b.clone())?;
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
                Ok(out)
            })
        }
        CtlCommand::Audit { limit } => {
            let body = call.get(&format!("/v1/audit?limit={limit}")).await?;
            call.print(&body, |b| {
                let list: AuditList = serde_json::from_value(b.clone())?;
                Ok(audit_text(&list))
            })
        }
    }
}

struct Call {
    client: reqwest::Client,
    base: String,
    json: bool,
}

impl Call {
    async fn get(&self, path: &str) -> Result<Value, Failed> {
        self.send(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    /// A GET whose 404 means "none" rather than a failure.
    async fn get_optional(&self, path: &str) -> Result<Value, Failed> {
        match self.get(path).await {
            Err(Failed { code: 1, message }) if message.starts_with("not_found") => Ok(Value::Null),
            other => other,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, Failed> {
        self.send(self.client.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, Failed> {
        let response = request.send().await.map_err(|e| Failed {
            code: 3,
            message: format!("cannot reach the coordinator at {}: {e}", self.base),
        })?;
        let (status, bytes) = net::outbound::read_answer(response, crate::client::ANSWER_BYTES_MAX)
            .await
            .map_err(|e| Failed {
                code: 1,
                message: format!("the coordinator at {}: {e}", self.base),
            })?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| Failed {
            code: 1,
            message: format!("HTTP {status}: the answer is not JSON: {e}"),
        })?;
        if status.is_success() {
            return Ok(body);
        }
        let message = if let Ok(refusal) = serde_json::from_value::<RefusalBody>(body.clone()) {
            format!(
                "{}: {}\n{}",
                refusal.error,
                p(&refusal.message),
                evidence_text(&refusal.evidence)
            )
        } else if let Ok(error) = serde_json::from_value::<ErrorBody>(body.clone()) {
            format!("{}: {}", error.error, p(&error.message))
        } else {
            format!("HTTP {status}: {}", printable_json(&body.to_string()))
        };
        Err(Failed { code: 1, message })
    }

    fn print(
        &self,
        body: &Value,
        readable: impl FnOnce(&Value) -> serde_json::Result<String>,
    ) -> Result<(), Failed> {
        if self.json {
            println!("{}", printable_json(&body.to_string()));
            return Ok(());
        }
        let text = readable(body).map_err(|e| Failed {
            code: 1,
            message: format!("unexpected answer shape ({e}): {body}"),
        })?;
        // Each peer-supplied field was escaped where it was laid out; this catches any other.
        print!("{}", printable_lines(&text));
        Ok(())
    }
}

fn word(decision: Decision) -> &'static str {
    match decision {
        Decision::Commit => "commit",
        Decision::Abort => "abort",
    }
}

fn list_text(list: &TransactionList) -> String {
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

fn status_text(status: &TransactionStatus) -> String {
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

fn evidence_text(evidence: &Evidence) -> String {
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

fn sagas_text(list: &protocol::saga::SagaList) -> String {
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

fn audit_text(list: &AuditList) -> String {
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
