//! HTTP requests from arbitrary bytes, and what every answer must look like.
//!
//! ```text
//! input   := request*            (at most REQUESTS_MAX)
//! request := method u8 | path bytes | header* (count u8) | auth u8 | caller u8 | body bytes
//! header  := name u8 (one of HEADER_NAMES) | value bytes
//! ```
//!
//! A request whose method, path or header value the HTTP/1 parser in front of the router
//! would refuse is skipped: the router never sees those on a real server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderName, HeaderValue, Method, Request, header};
use http_body_util::BodyExt;
use protocol::{ErrorBody, ErrorCode};
use tower::ServiceExt;

use crate::input::{Reader, Writer};

pub const REQUESTS_MAX: usize = 4;
const HEADERS_MAX: usize = 4;
/// Longest a request may take to answer; the harness's own participants answer at once, so
/// only a request that hangs takes this long.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(20);

const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "FUZZ",
];
const HEADER_NAMES: [&str; 6] = [
    "content-type",
    "accept",
    "authorization",
    "x-request-id",
    "idempotency-key",
    "cookie",
];

/// Which credential a request carries, from the server's configured tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    None,
    Client,
    Operator,
    Peer,
    Metrics,
    /// A well-formed bearer header with a token nobody holds.
    Wrong,
    /// `Basic` with the operator token as the password (how a browser sends it to `/ui`).
    BasicOperator,
}

impl Auth {
    const ALL: [Auth; 7] = [
        Auth::None,
        Auth::Client,
        Auth::Operator,
        Auth::Peer,
        Auth::Metrics,
        Auth::Wrong,
        Auth::BasicOperator,
    ];

    pub fn byte(self) -> u8 {
        Auth::ALL.iter().position(|a| *a == self).unwrap_or(0) as u8
    }
}

/// The tokens the harness's servers are configured with (test values, not secrets).
pub mod tokens {
    pub const CLIENT: &str = "fuzz-client-token-0123456789abcdef";
    pub const OPERATOR: &str = "fuzz-operator-token-0123456789abcdef";
    pub const PEER: &str = "fuzz-peer-token-0123456789abcdef";
    pub const METRICS: &str = "fuzz-metrics-token-0123456789abcdef";
}

/// One decoded request, before it is built.
#[derive(Debug, Clone)]
pub struct FuzzRequest {
    pub method: String,
    pub path: Vec<u8>,
    pub headers: Vec<(&'static str, Vec<u8>)>,
    pub auth: Auth,
    /// The last octet of the caller's loopback address (callers are told apart by address).
    pub caller: u8,
    pub body: Vec<u8>,
}

impl FuzzRequest {
    pub fn read_all(input: &[u8]) -> Vec<FuzzRequest> {
        let mut r = Reader::new(input);
        let mut requests = Vec::new();
        while !r.is_empty() && requests.len() < REQUESTS_MAX {
            let method = METHODS[usize::from(r.u8()) % METHODS.len()].to_string();
            let path = r.bytes().to_vec();
            let count = usize::from(r.u8()) % (HEADERS_MAX + 1);
            let headers = (0..count)
                .map(|_| {
                    let name = HEADER_NAMES[usize::from(r.u8()) % HEADER_NAMES.len()];
                    (name, r.bytes().to_vec())
                })
                .collect();
            let auth = Auth::ALL[usize::from(r.u8()) % Auth::ALL.len()];
            let caller = r.u8();
            let body = r.bytes().to_vec();
            requests.push(FuzzRequest {
                method,
                path,
                headers,
                auth,
                caller,
                body,
            });
        }
        requests
    }

    /// The bytes [`FuzzRequest::read_all`] reads back as this request (seed generation).
    pub fn write(&self, w: &mut Writer) {
        let method = METHODS.iter().position(|m| *m == self.method).unwrap_or(0);
        w.u8(method as u8).bytes(&self.path);
        w.u8(self.headers.len() as u8);
        for (name, value) in &self.headers {
            let name = HEADER_NAMES.iter().position(|n| n == name).unwrap_or(0);
            w.u8(name as u8).bytes(value);
        }
        w.u8(self.auth.byte()).u8(self.caller).bytes(&self.body);
    }

    /// A JSON request with `auth` (seed generation).
    pub fn json(method: &str, path: &str, auth: Auth, body: &str) -> FuzzRequest {
        FuzzRequest {
            method: method.to_string(),
            path: path.as_bytes().to_vec(),
            headers: if body.is_empty() {
                Vec::new()
            } else {
                vec![("content-type", b"application/json".to_vec())]
            },
            auth,
            caller: 1,
            body: body.as_bytes().to_vec(),
        }
    }

    /// The request as the router gets it, or `None` where the HTTP/1 parser would refuse it.
    pub fn build(&self) -> Option<Request<Body>> {
        let method = Method::from_bytes(self.method.as_bytes()).ok()?;
        let path = std::str::from_utf8(&self.path).ok()?;
        if !path.starts_with('/') {
            return None;
        }
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in &self.headers {
            let value = HeaderValue::from_bytes(value).ok()?;
            request = request.header(HeaderName::from_static(name), value);
        }
        let authorization = match self.auth {
            Auth::None => None,
            Auth::Client => Some(format!("Bearer {}", tokens::CLIENT)),
            Auth::Operator => Some(format!("Bearer {}", tokens::OPERATOR)),
            Auth::Peer => Some(format!("Bearer {}", tokens::PEER)),
            Auth::Metrics => Some(format!("Bearer {}", tokens::METRICS)),
            Auth::Wrong => Some("Bearer fuzz-nobody-token-0123456789abcdef".to_string()),
            Auth::BasicOperator => Some(format!(
                "Basic {}",
                protocol::auth::encode_base64(format!("ops:{}", tokens::OPERATOR).as_bytes())
            )),
        };
        if let Some(authorization) = authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        let mut request = request.body(Body::from(self.body.clone())).ok()?;
        let caller = IpAddr::V4(Ipv4Addr::new(127, 0, 0, self.caller.max(1)));
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(caller, 40_000)));
        Some(request)
    }
}

/// Sends `request` through `app` and checks the answer: it comes within [`ANSWER_WITHIN`];
/// no 5xx but 503 (the harness's servers are healthy, so a 500 is an input that broke
/// something); every 4xx and 5xx carries `{"error": code, "message": ...}` whose code goes
/// with the status; a JSON answer is valid JSON.
pub async fn send_and_check(app: &Router, request: Request<Body>) -> u16 {
    let described = format!("{} {}", request.method(), request.uri());
    // An answer to HEAD has no body (RFC 9110 9.3.2): only its status can be checked.
    let head = request.method() == Method::HEAD;
    let answered = tokio::time::timeout(ANSWER_WITHIN, async {
        let response = match app.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .unwrap_or_else(|e| panic!("{described}: the answer's body failed: {e}"));
        (parts, bytes)
    })
    .await;
    let (parts, bytes) =
        answered.unwrap_or_else(|_| panic!("{described}: no answer within {ANSWER_WITHIN:?}"));
    let status = parts.status.as_u16();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        status < 500 || status == 503,
        "{described}: answered {status}: {text}"
    );
    if head {
        assert!(bytes.is_empty(), "{described}: answered HEAD with a body");
        return status;
    }
    if status >= 400 {
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("{described}: answered {status} without a JSON error body ({e}): {text}")
        });
        assert!(
            code_goes_with(body.error, status),
            "{described}: answered {status} with code {:?}",
            body.error
        );
        // A 503 that means the service stopped itself for good is a finding, whatever input
        // led to it: a request is a claim, and none may poison the log or mark it behind.
        assert!(
            !matches!(body.error, ErrorCode::LogFailed | ErrorCode::LogBehind),
            "{described}: the service poisoned itself ({:?}): {text}",
            body.error
        );
    }
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json && parts.status.as_u16() != 204 {
        assert!(
            serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(),
            "{described}: answered {status} with invalid JSON: {text}"
        );
    }
    status
}

fn code_goes_with(code: ErrorCode, status: u16) -> bool {
    code.status() == status
}
