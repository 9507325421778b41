//! The step trace a failure prints, and the description of what is stuck when a run does not
//! settle.

use coordinator::engine::Reply as ClientReply;

use super::net::{Body, Ev};
use super::world::World;

impl World {
    pub(super) fn remember(&mut self, line: String, notes: Vec<String>) {
        let line = if notes.is_empty() {
            line
        } else {
            format!("{line} [{}]", notes.join("; "))
        };
        self.trace.push_back(line);
        while self.trace.len() > self.trace_keep {
            self.trace.pop_front();
        }
    }

    pub(super) fn stuck(&self) -> String {
        let mut out = Vec::new();
        match &self.coordinator.engine {
            Some(engine) => {
                let g = engine.gauges();
                out.push(format!(
                    "coordinator: {} preparing, {} committing, {} aborting, {} pending acks",
                    g.preparing, g.committing, g.aborting, g.pending_acks
                ));
                for status in engine.list(None, 20) {
                    if status.ended_at_ms.is_none() {
                        out.push(format!(
                            "  {} {:?} last errors {:?}",
                            status.id,
                            status.state,
                            status
                                .participants
                                .iter()
                                .map(|p| (p.name.as_str(), p.acked, p.last_error.clone()))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
            None => out.push("coordinator down".into()),
        }
        for p in &self.participants {
            match &p.engine {
                Some(engine) => {
                    for entry in engine.prepared_list() {
                        out.push(format!(
                            "participant {} in doubt on {} ({}), last answer {:?}",
                            p.index, entry.txid, entry.gtid, entry.last_answer
                        ));
                    }
                }
                None => out.push(format!("participant {} down", p.index)),
            }
        }
        for c in &self.clients {
            if c.busy {
                out.push(format!("client {} still waiting", c.order.id));
            }
        }
        out.join("\n")
    }
}

pub(super) fn describe(ev: &Ev) -> String {
    match ev {
        Ev::Deliver(msg) => {
            let to = match msg.to {
                Some(node) => format!("{node:?}"),
                None => "client".into(),
            };
            let what = match &msg.body {
                Body::Submit { order, attempt } => format!("submit o-{order} attempt {attempt}"),
                Body::ClientAnswer { order, reply, .. } => match reply {
                    ClientReply::Outcome(r) => format!("answer o-{order}: {:?}", r.outcome),
                    other => format!("answer o-{order}: {other:?}"),
                },
                Body::Prepare { rid, request, .. } => {
                    format!(
                        "prepare {} as {} (rid {rid}, epoch {})",
                        request.txid, request.gtid, request.epoch
                    )
                }
                Body::PrepareAnswer { rid, answer, .. } => format!("vote {answer:?} (rid {rid})"),
                Body::Decide {
                    rid,
                    decision,
                    request,
                    ..
                } => format!(
                    "{decision:?} {} (rid {rid}, epoch {})",
                    request.gtid, request.epoch
                ),
                Body::DecideAnswer { rid, answer, .. } => format!("ack {answer:?} (rid {rid})"),
                Body::PrepareBatch { batch, items, .. } => format!(
                    "batch {batch} of prepares [{}]",
                    items
                        .iter()
                        .map(|(i, r)| format!("#{i} {} as {} epoch {}", r.txid, r.gtid, r.epoch))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Body::DecideBatch { batch, items, .. } => format!(
                    "batch {batch} of decisions [{}]",
                    items
                        .iter()
                        .map(|(i, d, r)| format!("#{i} {d:?} {} epoch {}", r.gtid, r.epoch))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Body::BatchAnswer {
                    batch,
                    index,
                    gtid,
                    answer,
                    ..
                } => format!("line of batch {batch}: #{index} {gtid} {answer:?}"),
                Body::Query { query, from, .. } => {
                    format!("query {} from {}", query.gtid, from.0)
                }
                Body::QueryAnswer { rid, answer, .. } => format!(
                    "decision (rid {rid}): {:?} at epoch {:?} {}",
                    answer.decision,
                    answer.epoch.map(|e| e.0),
                    answer.reason.as_deref().unwrap_or("")
                ),
            };
            format!("deliver to {to}: {what}")
        }
        Ev::Timer { node, timer, .. } => format!("timer {node:?} {timer:?}"),
        Ev::DiskSync { node, .. } => format!("fdatasync {node:?}"),
        Ev::Crash(node) => format!("crash {node:?}"),
        Ev::Restart(node) => format!("restart {node:?}"),
        Ev::Checkpoint(node) => format!("checkpoint {node:?}"),
        Ev::Backup => "operator stops the coordinator and copies its data directory".into(),
        Ev::Restore => "operator stops the coordinator and restores the copy".into(),
        Ev::ClientSend { order, attempt } => format!("client sends o-{order} attempt {attempt}"),
        Ev::ClientTimeout { order, attempt } => {
            format!("client timeout o-{order} attempt {attempt}")
        }
        Ev::Heal => "faults stop; every node restarts".into(),
        Ev::Forge(i) => format!("an adversary forges a message to participant {i}"),
        Ev::ForgeLine(batch) => format!("an adversary forges an answer line of batch {batch}"),
        Ev::HostileQuery => "a hostile peer asks about a made-up run".into(),
        Ev::HostileOperator => "an operator who errs tries a resolve".into(),
        Ev::Operator => "operator looks for attempts in doubt the coordinator cannot decide".into(),
    }
}
