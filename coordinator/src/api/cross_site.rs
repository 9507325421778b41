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
