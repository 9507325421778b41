//! The relay's status listener: `/healthz` and `/readyz` open, `/metrics` open unless metrics
//! tokens are given (`--metrics-token-file`, as on the coordinator and the participants), and
//! then read only with one of them, as in force at the request (reread on SIGHUP): 401
//! `unauthorized` without one, 403 `forbidden` with a token of another kind. This module must
//! never log a token.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use protocol::auth::{Access, Denied, KeyRing, REALM};
use protocol::{ErrorBody, ErrorCode};

use crate::metrics::Metrics;

#[derive(Clone)]
struct Status {
    metrics: Arc<Metrics>,
    targets: Arc<Vec<String>>,
    keys: KeyRing,
}

/// The listener's routes; `keys` holds the metrics tokens, if any were given.
pub fn routes(metrics: Arc<Metrics>, targets: Vec<String>, keys: KeyRing) -> Router {
    Router::new()
        .route(protocol::routes::HEALTHZ, get(|| async { "ok\n" }))
        .route(protocol::routes::READYZ, get(|| async { "ready\n" }))
        .route(protocol::routes::METRICS, get(metrics_text))
        .with_state(Status {
            metrics,
            targets: Arc::new(targets),
            keys,
        })
}

async fn metrics_text(State(status): State<Status>, headers: HeaderMap) -> Response {
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match status.keys.current().authorize(Access::Metrics, presented) {
        Ok(_) => (
            [(CONTENT_TYPE, net::exposition::CONTENT_TYPE)],
            status.metrics.text(&status.targets),
        )
            .into_response(),
        Err(denied) => refusal(denied),
    }
}

fn refusal(denied: Denied) -> Response {
    let (code, message) = match denied {
        Denied::Unauthorized(message) => (ErrorCode::Unauthorized, message),
        Denied::Forbidden(message) => (ErrorCode::Forbidden, message),
    };
    let status = StatusCode::from_u16(code.status()).unwrap_or(StatusCode::UNAUTHORIZED);
    let mut response = (status, axum::Json(ErrorBody::new(code, message))).into_response();
    if code == ErrorCode::Unauthorized
        && let Ok(bearer) = HeaderValue::from_str(&format!("Bearer realm=\"{REALM}\""))
    {
        response.headers_mut().insert(WWW_AUTHENTICATE, bearer);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::auth::{Keys, TokenFiles};

    const METRICS_TOKEN: &str = "9f2c4e6a8b0d1f3e5a7c9e1b3d5f7a9c0e2b4d6f8a1c3e5b7d9f0a2c4e6b8d0f";
    const OTHER_TOKEN: &str = "1a3c5e7b9d0f2a4c6e8b0d1f3a5c7e9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a1c";

    /// Serves the routes on a loopback port; returns the base URL.
    async fn serve(keys: KeyRing) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let router = routes(Arc::new(Metrics::default()), vec!["orders".into()], keys);
        tokio::spawn(async move { axum::serve(listener, router).await });
        base
    }

    async fn get(url: &str, token: Option<&str>) -> (u16, Option<String>, String) {
        let mut request = reqwest::Client::new().get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap().to_string());
        (
            response.status().as_u16(),
            challenge,
            response.text().await.unwrap(),
        )
    }

    fn metrics_keys() -> Keys {
        TokenFiles {
            metrics: Some("metrics.tokens".into()),
            peer: Some("peer.tokens".into()),
            ..TokenFiles::default()
        }
        .load(|path| {
            Ok(match path.to_str() {
                Some("metrics.tokens") => format!("{METRICS_TOKEN}\n"),
                _ => format!("{OTHER_TOKEN}\n"),
            })
        })
        .unwrap()
    }

    #[tokio::test]
    async fn metrics_are_open_without_metrics_tokens() {
        let base = serve(KeyRing::new(Keys::default())).await;
        let (status, _, text) = get(&format!("{base}/metrics"), None).await;
        assert_eq!(status, 200);
        assert!(text.contains("twopc_relay_"), "{text}");
    }

    #[tokio::test]
    async fn with_metrics_tokens_only_a_metrics_token_reads_them() {
        let keys = KeyRing::new(metrics_keys());
        let base = serve(keys.clone()).await;
        let url = format!("{base}/metrics");
        let (status, challenge, body) = get(&url, None).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"twopc\""));
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"], "unauthorized", "{body}");
        let (status, _, body) = get(&url, Some("not-a-token-of-ours")).await;
        assert_eq!(status, 401, "{body}");
        let (status, _, body) = get(&url, Some(OTHER_TOKEN)).await;
        assert_eq!(status, 403, "{body}");
        assert!(
            !body.contains(OTHER_TOKEN),
            "a refusal never echoes a token: {body}"
        );
        let (status, _, text) = get(&url, Some(METRICS_TOKEN)).await;
        assert_eq!(status, 200);
        assert!(text.contains("twopc_relay_"), "{text}");
        // Health stays open: an orchestrator's probe carries no token.
        let (status, _, _) = get(&format!("{base}/healthz"), None).await;
        assert_eq!(status, 200);

        // Rotated (what SIGHUP does): the old token is refused at the next request, the new
        // one reads.
        keys.replace(
            TokenFiles {
                metrics: Some("metrics.tokens".into()),
                ..TokenFiles::default()
            }
            .load(|_| Ok(format!("{OTHER_TOKEN}\n")))
            .unwrap(),
        );
        let (status, _, _) = get(&url, Some(METRICS_TOKEN)).await;
        assert_eq!(status, 401);
        let (status, _, _) = get(&url, Some(OTHER_TOKEN)).await;
        assert_eq!(status, 200);
    }
}
