//! `protocol::cross_site` (docs/security.md, "Browsers") applied to a request, which every
//! route's guard (`api::guard`) does before the token is checked: a page on another site
//! cannot make a browser change anything here, and a loopback server without tokens answers
//! only loopback `Host` names. It refuses before the handler runs, so nothing refused is
//! audited or logged as done.

use axum::body::HttpBody;
use axum::extract::Request;
use axum::http::header;

use protocol::cross_site::{self, RequestFacts};

use crate::api::{ApiError, AppState};

/// `Ok` to go on, or the 403 `forbidden_host` / `forbidden_origin` or 415 answer.
pub fn check(state: &AppState, request: &Request) -> Result<(), ApiError> {
    // With no tokens there is nothing to reload (no token files), so this stays as started.
    let loopback_only = state.loopback_listen() && !state.keys().current().enabled();
    let mut facts = facts_of(request);
    if is_replication(request) && facts.content_type.is_some_and(is_octets) {
        // A group's replication carries the log's bytes as application/octet-stream: not a
        // type a cross-site form can send (a page would need a CORS preflight, which is
        // never granted), so it is as safe here as JSON is elsewhere.
        facts.content_type = Some("application/json");
    }
    cross_site::check(&facts, loopback_only).map_err(|body| ApiError::new(body.error, body.message))
}

fn is_replication(request: &Request) -> bool {
    matches!(
        request.uri().path(),
        protocol::routes::REPLICA_BACKUP
            | protocol::routes::REPLICA_OPS
            | protocol::routes::REPLICA_OUTCOMES
    )
}

fn is_octets(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/octet-stream")
}

/// What the rules look at, borrowed from `request`.
fn facts_of(request: &Request) -> RequestFacts<'_> {
    let header_text = |name| {
        request
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("(not text)"))
    };
    RequestFacts {
        state_changing: cross_site::is_state_changing(request.method().as_str()),
        host: header_text(header::HOST).or_else(|| request.uri().authority().map(|a| a.as_str())),
        origin: header_text(header::ORIGIN),
        content_type: header_text(header::CONTENT_TYPE),
        // Known empty only when the length is known to be zero (a chunked body has none).
        has_body: request.body().size_hint().exact() != Some(0),
    }
}
