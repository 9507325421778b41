//! Who may call which participant route (docs/participants.md, "Authentication"): the class
//! of every route, the middleware every route goes through (the cross-site rules, then the
//! token against the key ring), and the SIGHUP reload of the token files. The checking itself is `protocol::auth`. This module must never
//! log a token.

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use protocol::auth::{Access, Denied, KeyRing, REALM, TokenFiles};
use protocol::{ErrorCode, routes};
use tracing::Instrument;

use crate::api_error::ApiError;
use crate::cross_site::Served;

/// Every (method, path) the reference participant (`twopc participant`) serves.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", routes::PREPARE),
    ("post", routes::COMMIT),
    ("post", routes::ABORT),
    ("get", routes::CAPABILITIES),
    ("post", routes::BATCH_PREPARE),
    ("post", routes::BATCH_DECIDE),
    ("get", routes::PREPARED),
    ("get", routes::ATTEMPT),
    ("get", routes::FENCE),
    ("post", routes::FENCE_RESET),
    ("post", routes::SAGA_ACTION),
    ("post", routes::SAGA_COMPENSATE),
    ("get", routes::SAGA_OP),
    ("get", routes::KV_KEY),
    ("put", routes::KV_KEY),
    ("post", routes::KV_WRITE),
    ("get", routes::OUTBOX),
    ("get", routes::OUTBOX_INTENT),
    ("post", routes::OUTBOX_DELIVERED),
    ("post", routes::OUTBOX_ATTEMPT),
    ("post", routes::OUTBOX_RETRY),
    ("post", routes::OUTBOX_MARK),
    ("get", routes::HEALTHZ),
    ("get", routes::READYZ),
    ("get", routes::METRICS),
];

/// The routes the PostgreSQL participant (`twopc participant --backend postgres`) serves that
/// the reference participant does not: the local write (it serves the outbox routes of
/// [`ROUTES`] too, and the fence routes).
pub const PG_ROUTES: &[(&str, &str)] = &[("post", routes::PG_WRITE)];

/// The class of a participant route; `None` for one this table does not know (checked as a
/// peer route: closed until classified).
pub fn access(path: &str) -> Option<Access> {
    Some(match path {
        routes::PREPARE | routes::COMMIT | routes::ABORT => Access::Peer,
        routes::CAPABILITIES | routes::BATCH_PREPARE | routes::BATCH_DECIDE => Access::Peer,
        routes::SAGA_ACTION | routes::SAGA_COMPENSATE | routes::SAGA_OP => Access::Peer,
        routes::PREPARED | routes::ATTEMPT | routes::FENCE => Access::PeerOrOperator,
        routes::FENCE_RESET => Access::Operator,
        // Fenced writes come from lease workers, reads from clients and operators.
        routes::KV_KEY | routes::KV_WRITE => Access::Client,
        // Local writes at a PostgreSQL participant come from workflow workers too.
        routes::PG_WRITE => Access::Client,
        // Relays and operators read the outbox; relays report; operators retry and mark.
        routes::OUTBOX | routes::OUTBOX_INTENT => Access::PeerOrOperator,
        routes::OUTBOX_DELIVERED | routes::OUTBOX_ATTEMPT => Access::Peer,
        routes::OUTBOX_RETRY | routes::OUTBOX_MARK => Access::Operator,
        routes::HEALTHZ | routes::READYZ => Access::Open,
        routes::METRICS => Access::Metrics,
        _ => return None,
    })
}

/// Checks every route of `router` (those added so far) against the cross-site rules
/// (`crate::cross_site`), then against `keys`; `loopback_listen`: the listener is a loopback
/// address.
pub fn protect(router: Router, keys: KeyRing, loopback_listen: bool) -> Router {
    let served = Served {
        keys,
        loopback_listen,
    };
    router.route_layer(axum::middleware::from_fn_with_state(served, guard))
}

/// Every route's gate. A cross-site request is refused whoever's token it carries. One
/// middleware for both checks, not one each: every axum middleware layer costs boxed services
/// and futures on every request.
async fn guard(State(served): State<Served>, request: Request, next: Next) -> Response {
    match crate::cross_site::check(&served, &request) {
        Ok(()) => check(&served.keys, request, next).await,
        Err(refusal) => refusal.into_response(),
    }
}

async fn check(keys: &KeyRing, mut request: Request, next: Next) -> Response {
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| request.uri().path().to_string());
    let access = access(&path).unwrap_or(Access::Peer);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match keys.current().authorize(access, authorization) {
        Ok(None) => next.run(request).await,
        Ok(Some(caller)) => match caller.name.clone() {
            Some(name) => {
                let span = tracing::info_span!("caller", kind = caller.kind.as_str(), name);
                // Handlers that audit (a fence reset) name the token's holder.
                request.extensions_mut().insert(caller);
                next.run(request).instrument(span).await
            }
            // A caller without a name is the coordinator (a peer) or a scraper, which the
            // route already says: no span, which cost CPU on every phase message (issue 28).
            None => {
                request.extensions_mut().insert(caller);
                next.run(request).await
            }
        },
        Err(Denied::Forbidden(message)) => {
            ApiError::new(ErrorCode::Forbidden, message).into_response()
        }
        Err(Denied::Unauthorized(message)) => {
            let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
            if let Ok(bearer) = HeaderValue::from_str(&format!("Bearer realm=\"{REALM}\"")) {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, bearer);
            }
            response
        }
    }
}

/// Reads the token files at start; `Err` is a configuration error (exit 2).
pub fn load(files: &TokenFiles) -> Result<KeyRing, String> {
    files
        .load(|path| std::fs::read_to_string(path))
        .map(KeyRing::new)
        .map_err(|e| format!("token file refused: {e}"))
}

/// Rereads the token files on every SIGHUP and puts the new set in force whole; a file that
/// does not read or check keeps the old set (and says why).
///
/// Installed even with no token files: SIGHUP's default action ends the process, and a stray
/// `kill -HUP` must not stop a participant holding prepared transactions. Then it only says
/// there is nothing to reload.
pub async fn reload_on_sighup(files: TokenFiles, keys: KeyRing) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGHUP; tokens will not reload");
            return;
        }
    };
    while hangups.recv().await.is_some() {
        if !files.any() {
            tracing::info!("SIGHUP: no token files are given; nothing to reload");
            continue;
        }
        match files.load(|path| std::fs::read_to_string(path)) {
            Ok(loaded) => {
                tracing::info!(tokens = ?loaded, "SIGHUP: token files reloaded");
                keys.replace(loaded);
            }
            Err(error) => tracing::error!(%error,
                "SIGHUP: token files refused; the old tokens stay in force"),
        }
    }
}

/// The start-up rule for a listener (a non-loopback address needs tokens unless
/// `--insecure-no-auth`); warns when serving without auth on purpose.
pub fn check_exposure(
    listen: std::net::SocketAddr,
    keys: &KeyRing,
    insecure_no_auth: bool,
) -> Result<(), String> {
    for kind in keys.current().kinds_missing() {
        tracing::warn!(
            kind = kind.as_str(),
            "authentication is on but no {} token file is given: every {} call will be \
             refused (401); give --{}-token-file",
            kind.as_str(),
            kind.as_str(),
            kind.as_str()
        );
    }
    match protocol::auth::check_exposure(listen, &keys.current(), insecure_no_auth) {
        Ok(true) => {
            tracing::warn!(%listen, "--insecure-no-auth: serving a non-loopback address with \
                no token; anyone who reaches it may prepare, commit and abort");
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_a_class() {
        for (method, path) in ROUTES.iter().chain(PG_ROUTES) {
            assert!(access(path).is_some(), "{method} {path} unclassified");
        }
    }
}
