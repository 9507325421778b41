//! `protocol::cross_site` (docs/security.md, "Browsers") applied to a participant request,
//! which every route's guard (`crate::auth::protect`) does before the token is checked: a
//! page on another site cannot make a browser prepare, commit or write here, and a loopback
//! participant without tokens answers only loopback `Host` names (DNS rebinding).

use axum::body::HttpBody;
use axum::extract::Request;
use axum::http::header;
use protocol::auth::KeyRing;
use protocol::cross_site::{self, RequestFacts};

use crate::api_error::ApiError;

/// What the check needs of the server: its tokens, and whether it listens on loopback.
#[derive(Debug, Clone)]
pub struct Served {
    pub keys: KeyRing,
    pub loopback_listen: bool,
}

/// `Ok` to go on, or the 403 `forbidden_host` / `forbidden_origin` or 415 answer.
pub fn check(served: &Served, request: &Request) -> Result<(), ApiError> {
    let loopback_only = served.loopback_listen && !served.keys.current().enabled();
    cross_site::check(&facts_of(request), loopback_only)
        .map_err(|body| ApiError::new(body.error, body.message))
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
