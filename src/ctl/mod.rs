//! `twopc ctl`: the operator's command line over the coordinator's HTTP API. It only reads
//! what the coordinator serves and asks it to act; every action is judged and audited there.
//!
//! `--coordinator` may name every coordinator of a group (issue 27): each request goes to
//! the one that answered last, and on no answer or a 503 `not_leader`/`not_ready` to the
//! others in turn (`crate::coordinator_group`).
//!
//! Exit codes: 0 done; 1 the coordinator refused or failed (its error is printed); 2 bad
//! usage; 3 no coordinator could be reached.
//!
//! This file holds the command line and its dispatch; `call` one request to the coordinator
//! and the exit code its answer means, `text` the readable form of what it serves.

mod call;
mod text;

use std::process::ExitCode;
use std::time::Duration;

use protocol::operator::{AuditList, Evidence, ResolveResponse};
use protocol::{TransactionList, TransactionStatus};
use serde_json::json;

use crate::coordinator_group::{Addresses, Group, Resend};
use crate::printable::printable_lines;
use call::{Call, Failed};
use text::{
    audit_text, cluster_text, evidence_text, leases_text, list_text, saga_evidence_text,
    sagas_text, status_text, word,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The coordinator's base URL, or every coordinator of a group, comma-separated
    /// (`http://a:7100,http://b:7100`): requests go to the leader, found by trying them in
    /// turn (a follower answers 503 not_leader).
    #[arg(
        long,
        env = "TWOPC_COORDINATOR",
        default_value = "http://127.0.0.1:7100",
        value_name = "URL[,URL...]",
        value_parser = Addresses::parse,
        global = true
    )]
    pub coordinator: Addresses,
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
    /// Sent to the first --coordinator only: a repeat could clear a mark nobody checked.
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
    let call = Call {
        group: Group::new(client, args.coordinator),
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
            // A repeat is refused not_in_doubt once the first took: it cannot act twice.
            let answer = call
                .post(
                    &format!("/v1/transactions/{id}/resolve"),
                    &body,
                    Resend::Safe,
                )
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
            // It only resends decisions already logged, which participants take idempotently.
            let answer = call
                .post(
                    &path,
                    &json!({"operator": operator, "reason": reason}),
                    Resend::Safe,
                )
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
                    Resend::Safe,
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
                    // A saga settled already is refused the second time.
                    Resend::Safe,
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
                    // No id: a repeat could clear a new mark nobody has checked.
                    Resend::Never,
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
                Ok(saga_evidence_text(&evidence))
            })
        }
        CtlCommand::Cluster => {
            let body = call.get("/v1/cluster").await?;
            call.print(&body, |b| {
                let view: protocol::operator::ClusterView = serde_json::from_value(b.clone())?;
                Ok(cluster_text(&view))
            })
        }
        CtlCommand::Leases => {
            let body = call.get("/v1/leases").await?;
            call.print(&body, |b| {
                let list: protocol::lease::LeaseList = serde_json::from_value(b.clone())?;
                Ok(leases_text(&list))
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
