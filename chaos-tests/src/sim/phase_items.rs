//! A participant's phase messages as the node handles them, alone or as the items of a batch
//! (issue 28): each item with where its answer goes, the HTTP call of a lone message or a line
//! of its batch's answer.

use protocol::{Decision, DecisionRequest, ErrorBody, GlobalTxId, PrepareRequest, Vote};

use super::net::{Body, Incarnation, LineAnswer, Msg, Node, RequestId};

/// Where an answer goes: the HTTP call of a lone message, or a line of a batch call's answer.
#[derive(Debug, Clone)]
pub enum ReplyTo {
    Call(RequestId, Incarnation),
    Line {
        batch: RequestId,
        to: Incarnation,
        index: usize,
        gtid: GlobalTxId,
    },
}

impl ReplyTo {
    pub(super) fn vote(self, answer: Result<Vote, ErrorBody>) -> Msg {
        let body = match self {
            ReplyTo::Call(rid, to) => Body::PrepareAnswer { rid, to, answer },
            ReplyTo::Line {
                batch,
                to,
                index,
                gtid,
            } => Body::BatchAnswer {
                batch,
                to,
                index,
                gtid,
                answer: LineAnswer::Vote(answer),
            },
        };
        Msg {
            to: Some(Node::Coordinator),
            body,
        }
    }

    pub(super) fn ack(self, answer: Result<(), ErrorBody>) -> Msg {
        let body = match self {
            ReplyTo::Call(rid, to) => Body::DecideAnswer { rid, to, answer },
            ReplyTo::Line {
                batch,
                to,
                index,
                gtid,
            } => Body::BatchAnswer {
                batch,
                to,
                index,
                gtid,
                answer: LineAnswer::Ack(answer),
            },
        };
        Msg {
            to: Some(Node::Coordinator),
            body,
        }
    }
}

/// One phase message, alone or an item of a batch, with where its answer goes.
#[derive(Debug, Clone)]
pub enum Item {
    Prepare(ReplyTo, PrepareRequest),
    Decide(ReplyTo, Decision, DecisionRequest),
}

/// A batch's items in the order they arrived, each answering on its own line (none for any
/// other message).
pub fn batch_items(body: Body) -> Vec<Item> {
    match body {
        Body::PrepareBatch { batch, from, items } => items
            .into_iter()
            .map(|(index, request)| {
                let to = ReplyTo::Line {
                    batch,
                    to: from,
                    index,
                    gtid: request.gtid.clone(),
                };
                Item::Prepare(to, request)
            })
            .collect(),
        Body::DecideBatch { batch, from, items } => items
            .into_iter()
            .map(|(index, decision, request)| {
                let to = ReplyTo::Line {
                    batch,
                    to: from,
                    index,
                    gtid: request.gtid.clone(),
                };
                Item::Decide(to, decision, request)
            })
            .collect(),
        _ => Vec::new(),
    }
}
