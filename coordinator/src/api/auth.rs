//! Who may call which route (docs/api.md, "Authentication"): the class of every route, and
//! the check of the caller's token against the key ring that every route's guard
//! (`api::guard`) makes before the handler runs. The checking itself is `protocol::auth`; this module only maps routes to classes and
//! turns a refusal into 401/403. It must never log a token.

use axum::extract::{Extension, MatchedPath, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use protocol::auth::{Access, Caller, Denied, REALM};
use protocol::{ErrorCode, routes};
use tracing::Instrument;

use crate::api::{ApiError, AppState};

/// The class of a route. `None` for a route this table does not know: the middleware then
/// treats it as an operator route (a new route is closed until someone classifies it).
pub fn access(path: &str) -> Option<Access> {
    let access = match path {
        routes::TRANSACTIONS | routes::TRANSACTION => Access::Client,
        routes::SAGAS | routes::SAGA => Access::Client,
        routes::LEASES | routes::LEASE | routes::LEASE_RENEW => Access::Client,
        routes::TRANSACTION_DECISION => Access::Peer,
        routes::REPLICA_BACKUP | routes::REPLICA_OPS | routes::REPLICA_OUTCOMES => Access::Peer,
        routes::TRANSACTION_EVIDENCE
        | routes::TRANSACTION_RESOLVE
        | routes::TRANSACTION_RETRY
        | routes::PARTICIPANT_RETRY
        | routes::AUDIT
        | routes::CLUSTER
        | routes::UI
        | routes::SAGA_RETRY
        | routes::SAGA_RESOLVE
        | routes::SAGA_EVIDENCE
        | routes::LOG_BEHIND_CLEAR
        | routes::GROUP => Access::Operator,
        routes::HEALTHZ | routes::READYZ => Access::Open,
        routes::METRICS => Access::Metrics,
        _ => return None,
    };
    Some(access)
}

/// Checks the token, puts the [`Caller`] in the request's extensions, and runs the handler;
/// or answers 401 `unauthorized` (with `WWW-Authenticate`) or 403 `forbidden`.
pub async fn check(state: &AppState, mut request: Request, next: Next) -> Response {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| request.uri().path().to_string());
    let access = access(&path).unwrap_or(Access::Operator);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match state.keys().current().authorize(access, authorization) {
        Ok(None) => next.run(request).await,
        Ok(Some(caller)) => match caller.name.clone() {
            // Everything logged while serving the request names who asked.
            Some(name) => {
                let span = tracing::info_span!("caller", kind = caller.kind.as_str(), name);
                request.extensions_mut().insert(caller);
                next.run(request).instrument(span).await
            }
            // A caller without a name (a peer, a scraper) is no more than its route says; a
            // span on each of its requests cost CPU on the hot path for nothing (issue 28).
            None => {
                request.extensions_mut().insert(caller);
                next.run(request).await
            }
        },
        Err(denied) => refusal(denied, path == routes::UI),
    }
}

/// The name on the caller's token (client and operator tokens carry one); `None` with
/// authentication off.
pub fn caller_name(caller: &Option<Extension<Caller>>) -> Option<String> {
    caller.as_ref().and_then(|Extension(c)| c.name.clone())
}

/// 401 with a `Bearer` challenge (and a `Basic` one on `/ui`, so a browser asks for the
/// operator's name and token), or 403.
pub fn refusal(denied: Denied, browser: bool) -> Response {
    match denied {
        Denied::Forbidden(message) => ApiError::new(ErrorCode::Forbidden, message).into_response(),
        Denied::Unauthorized(message) => {
            let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
            let headers = response.headers_mut();
            if browser {
                headers.append(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"twopc\""),
                );
            }
            if let Ok(bearer) = HeaderValue::from_str(&format!("Bearer realm=\"{REALM}\"")) {
                headers.append(header::WWW_AUTHENTICATE, bearer);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_class() {
        for (method, path) in crate::api::ROUTES {
            assert!(access(path).is_some(), "{method} {path} unclassified");
        }
    }
}
