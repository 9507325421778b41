//! Route paths of both services, so the servers, the clients and the tests spell them once.

/// Coordinator: create (POST) and list (GET) transactions.
pub const TRANSACTIONS: &str = "/v1/transactions";
/// Coordinator: one transaction's status. Axum path syntax.
pub const TRANSACTION: &str = "/v1/transactions/{id}";
/// Coordinator: the decision for participants in doubt. Axum path syntax.
pub const TRANSACTION_DECISION: &str = "/v1/transactions/{id}/decision";

/// Coordinator, operators: resolve an attempt in doubt, retry deliveries now, the audit trail.
pub const TRANSACTION_EVIDENCE: &str = "/v1/transactions/{id}/evidence";
pub const TRANSACTION_RESOLVE: &str = "/v1/transactions/{id}/resolve";
pub const TRANSACTION_RETRY: &str = "/v1/transactions/{id}/retry";
pub const PARTICIPANT_RETRY: &str = "/v1/participants/{name}/retry";
pub const AUDIT: &str = "/v1/audit";
/// Coordinator, operators: everything stuck or in doubt, and the live page that shows it.
pub const CLUSTER: &str = "/v1/cluster";
pub const UI: &str = "/ui";
/// Coordinator: create (POST) and list (GET) sagas; one saga's status (issue 13).
pub const SAGAS: &str = "/v1/sagas";
pub const SAGA: &str = "/v1/sagas/{id}";
/// Coordinator, operators: try a waiting saga now; settle a needs_attention saga by hand.
pub const SAGA_RETRY: &str = "/v1/sagas/{id}/retry";
pub const SAGA_RESOLVE: &str = "/v1/sagas/{id}/resolve";
pub const SAGA_EVIDENCE: &str = "/v1/sagas/{id}/evidence";
/// Coordinator, operators: clear a mistaken "log behind" mark (audited).
pub const LOG_BEHIND_CLEAR: &str = "/v1/log-behind/clear";
/// A coordinator group's view from this node: its role, the leader, its copy (docs/ha.md).
pub const GROUP: &str = "/v1/group";
/// A group's replication, leader to follower (peer token): a base backup of the log, one
/// sync point's file operations, a batch of the outcome index.
pub const REPLICA_BACKUP: &str = "/v1/replica/backup";
pub const REPLICA_OPS: &str = "/v1/replica/ops";
pub const REPLICA_OUTCOMES: &str = "/v1/replica/outcomes";

/// Participant saga routes, relative to the participant's base URL.
pub const SAGA_ACTION: &str = "/saga/action";
pub const SAGA_COMPENSATE: &str = "/saga/compensate";
pub const SAGA_OP: &str = "/saga/ops/{op_id}";
/// The path and query of a coordinator's question about one saga op (`GET /saga/ops/{op_id}`,
/// [`crate::saga::OpQuery`]). Op ids and coordinator ids are made of id characters and a digest
/// of hex digits, none of which needs escaping in a path or a query string.
pub fn saga_op_query_path(op_id: &str, query: &crate::saga::OpQuery) -> String {
    let mut path = SAGA_OP.replace("{op_id}", op_id);
    let mut separator = '?';
    if let Some(coordinator_id) = &query.coordinator_id {
        path.push_str(&format!("{separator}coordinator_id={coordinator_id}"));
        separator = '&';
    }
    if let Some(digest) = query.payload_digest {
        path.push_str(&format!(
            "{separator}payload_digest={}",
            String::from(digest)
        ));
    }
    path
}

/// Coordinator: list leases (GET).
pub const LEASES: &str = "/v1/leases";
/// Coordinator: acquire (POST), read (GET) and release (DELETE) one lease. Axum path syntax.
pub const LEASE: &str = "/v1/leases/{name}";
/// Coordinator: renew one lease (POST).
pub const LEASE_RENEW: &str = "/v1/leases/{name}/renew";

/// Participant protocol routes, relative to the participant's base URL.
pub const PREPARE: &str = "/2pc/prepare";
pub const COMMIT: &str = "/2pc/commit";
pub const ABORT: &str = "/2pc/abort";
/// Participant: what it offers beyond the per-message protocol, and the batched phase messages
/// (`crate::batch`).
pub const CAPABILITIES: &str = "/2pc/capabilities";
pub const BATCH_PREPARE: &str = "/2pc/batch/prepare";
pub const BATCH_DECIDE: &str = "/2pc/batch/decide";

/// Reference participant: committed value of one key. Axum path syntax.
pub const KV_KEY: &str = "/v1/kv/{key}";
/// Reference participant: a write of several ops under an op id, with its next intents
/// (`protocol::outbox::WriteRequest`).
pub const KV_WRITE: &str = "/v1/kv";
/// PostgreSQL participant: a local write outside 2PC, one named statement with its next intents
/// in one local transaction (`protocol::outbox::PgWriteRequest`).
pub const PG_WRITE: &str = "/v1/pg/write";
/// Participant: the outbox, in write order (`?state=&aggregate=&limit=`).
pub const OUTBOX: &str = "/v1/outbox";
/// Participant: one intent. Axum path syntax.
pub const OUTBOX_INTENT: &str = "/v1/outbox/{event_id}";
/// Participant, relays: the receiver answered for this intent (forced before the answer).
pub const OUTBOX_DELIVERED: &str = "/v1/outbox/{event_id}/delivered";
/// Participant, relays: an attempt that delivered nothing known.
pub const OUTBOX_ATTEMPT: &str = "/v1/outbox/{event_id}/attempt";
/// Participant, operators: a failed intent back to pending (audited).
pub const OUTBOX_RETRY: &str = "/v1/outbox/{event_id}/retry";
/// Participant, operators: an intent marked delivered or abandoned by hand (audited).
pub const OUTBOX_MARK: &str = "/v1/outbox/{event_id}/mark";
/// Reference participant: in-doubt transactions.
pub const PREPARED: &str = "/v1/prepared";
/// Participant: what it holds of one attempt (operators' evidence). Axum path syntax.
pub const ATTEMPT: &str = "/v1/attempts/{gtid}";
/// Participant: one fenced resource's highest token and resets (peers, operators).
pub const FENCE: &str = "/v1/fences/{resource}";
/// Participant, operators: lower a fenced resource's highest token (audited).
pub const FENCE_RESET: &str = "/v1/fences/{resource}/reset";

/// The URL path of a participant's evidence about one attempt.
pub fn attempt_path(gtid: &crate::GlobalTxId) -> String {
    format!("/v1/attempts/{gtid}")
}

/// Both services.
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";

/// The URL path of a transaction's status, for clients.
pub fn transaction_path(id: &crate::TxId) -> String {
    format!("{TRANSACTIONS}/{id}")
}

/// The URL path a participant in doubt asks, for clients.
pub fn decision_path(id: &crate::TxId) -> String {
    format!("{TRANSACTIONS}/{id}/decision")
}

/// The path and query a participant in doubt about one attempt asks. Every part is made of id
/// characters (letters, digits, `-_.:`), which need no escaping in a query string.
pub fn decision_query_path(id: &crate::TxId, query: &crate::DecisionQuery) -> String {
    format!(
        "{}?gtid={}&incarnation={}&epoch={}&position={}",
        decision_path(id),
        query.gtid,
        query.incarnation,
        query.epoch,
        query.position
    )
}
