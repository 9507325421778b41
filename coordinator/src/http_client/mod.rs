//! A lean HTTP/1.1 client for the hot path: one `Endpoint` per peer (`http://host:port` or
//! `https://host:port`), a pool of kept-alive connections to it, and one call shape: POST a
//! JSON body, read the status and the whole (bounded) answer; `lines` reads a batch's answer line
//! by line as it arrives.
//!
//! Why not reqwest here: every transaction makes two calls per participant, and measured on the
//! two-core bench machine, reqwest's per-request work (URL parsing, header maps, redirect and
//! timeout layers, a client clone) halved the throughput of a bare request chain compared with
//! hyper's connection API underneath it (docs/benchmarks.md). Everything off the hot path keeps
//! using reqwest.
//!
//! The outbound policy (as `net::outbound` for reqwest clients): a redirect is an error and is
//! never followed, an answer over [`ANSWER_BYTES_MAX`] is an error and is not read to its end,
//! connecting is bounded by [`CONNECT_TIMEOUT`] and the whole call by the caller's timeout.
//! `https://` trusts only the CA given (`with_tls`); without one every handshake fails.
//!
//! Retrying: a request that fails on a *reused* connection before any answer arrived (the peer
//! closed the idle connection as we sent) is sent once more on a fresh connection. That is
//! safe only because every call made through this client is idempotent by protocol (prepare,
//! commit and abort carry the transaction id; so does a client's transaction request).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

mod lines;

pub use lines::Lines;

/// Answers larger than this are refused: no peer of ours sends more than a few hundred bytes,
/// and a broken one must not make us buffer without bound.
pub const ANSWER_BYTES_MAX: usize = net::outbound::SERVICE_ANSWER_BYTES_MAX;

/// Longest a TCP connect, and then a TLS handshake, may take (the call's timeout bounds both
/// too, and is usually shorter).
pub const CONNECT_TIMEOUT: Duration = net::outbound::CONNECT_TIMEOUT;

/// Idle connections kept per endpoint beyond this are closed (each is a socket on both sides).
const IDLE_MAX: usize = 512;

/// An idle connection unused for this long is closed rather than reused: the peer may be
/// about to close it, and a request that races that close costs a retry.
const IDLE_FOR_MAX: Duration = Duration::from_secs(30);

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("HTTP exchange with {authority} failed: {source}")]
    Exchange {
        authority: String,
        source: hyper::Error,
    },
    #[error("answer from {authority} unreadable or over {ANSWER_BYTES_MAX} bytes: {detail}")]
    Body { authority: String, detail: String },
    #[error("cannot build a request to {authority}: {detail}")]
    Request { authority: String, detail: String },
    #[error("TLS with {authority} failed: {source}")]
    Tls {
        authority: String,
        source: net::tls_connect::ConnectError,
    },
    #[error("{authority} answered a redirect (HTTP {status}); redirects are not followed")]
    Redirect { authority: String, status: u16 },
}

const JSON: &str = "application/json";
const OCTETS: &str = "application/octet-stream";

/// A status and a whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Why a base URL is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url:?} is not a base URL of the form http://host:port or https://host:port")]
pub struct BadBaseUrl {
    pub url: String,
}

struct Tls {
    name: rustls_pki_types::ServerName<'static>,
    /// The `--tls-ca` configuration; until `with_tls` gives one, a configuration that trusts
    /// nobody (every handshake fails, and says why).
    config: Arc<rustls::ClientConfig>,
}

struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

/// One peer and its kept-alive connections.
pub struct Endpoint {
    base_url: String,
    /// `host:port`: what is dialled and what the `Host` header says.
    authority: String,
    idle: Mutex<Vec<Idle>>,
    /// `Some` for an `https://` URL: the name the certificate must carry, and whom to trust.
    tls: Option<Tls>,
    /// Where the peer token sent on every call comes from (reloaded on SIGHUP); none: no
    /// `Authorization` header.
    keys: Option<protocol::auth::KeyRing>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// `base_url` must be `http://host:port` or `https://host:port` (a trailing `/` is
    /// allowed; port 80 or 443 if absent).
    pub fn new(base_url: &str) -> Result<Self, BadBaseUrl> {
        let bad = || BadBaseUrl {
            url: base_url.to_string(),
        };
        let (rest, https) = match base_url.strip_prefix("https://") {
            Some(rest) => (rest, true),
            None => (base_url.strip_prefix("http://").ok_or_else(bad)?, false),
        };
        let host_port = rest.strip_suffix('/').unwrap_or(rest);
        if host_port.is_empty() || host_port.contains(['/', '?', '#', '@', ' ']) {
            return Err(bad());
        }
        let has_port = !host_port.ends_with(']') && host_port.contains(':');
        let authority = if has_port {
            host_port.to_string()
        } else {
            format!("{host_port}:{}", if https { 443 } else { 80 })
        };
        let parsed: hyper::http::uri::Authority = authority.parse().map_err(|_| bad())?;
        if parsed.port_u16().is_none() || parsed.host().is_empty() {
            return Err(bad());
        }
        let tls = if https {
            Some(Tls {
                name: net::tls_connect::server_name(&authority).map_err(|_| bad())?,
                config: net::tls_config::client_config_trusting_nobody().map_err(|_| bad())?,
            })
        } else {
            None
        };
        Ok(Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            authority,
            idle: Mutex::new(Vec::new()),
            tls,
            keys: None,
        })
    }

    /// Trusts the CA of `config` (from `--tls-ca`) for an `https://` endpoint; no effect on an
    /// `http://` one.
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.config = config;
        }
        self
    }

    /// Whether calls go over TLS.
    pub fn is_https(&self) -> bool {
        self.tls.is_some()
    }

    /// Sends the peer token in force in `keys` (the first of the peer file) on every call.
    pub fn with_keys(mut self, keys: protocol::auth::KeyRing) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The URL as configured, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// POSTs `json` to `path` and reads the answer, all within `timeout`.
    pub async fn post_json(
        &self,
        path: &str,
        json: Vec<u8>,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        let body = Bytes::from(json);
        tokio::time::timeout(
            timeout,
            self.call_with_one_retry(hyper::Method::POST, path, body),
        )
        .await
        .unwrap_or(Err(CallError::Timeout(timeout)))
    }

    /// POSTs raw bytes (`application/octet-stream`: a coordinator group's replication) to
    /// `path` and reads the answer, all within `timeout`.
    pub async fn post_bytes(
        &self,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, CallError> {
        tokio::time::timeout(
            timeout,
            self.call_with_one_retry_as(hyper::Method::POST, path, body, OCTETS),
        )
        .await
        .unwrap_or(Err(CallError::Timeout(timeout)))
    }

    /// GETs `path` and reads the answer, all within `timeout` (saga op queries, operators'
    /// evidence).
    pub async fn get(&self, path: &str, timeout: Duration) -> Result<Answer, CallError> {
        tokio::time::timeout(
            timeout,
            self.call_with_one_retry(hyper::Method::GET, path, Bytes::new()),
        )
        .await
        .unwrap_or(Err(CallError::Timeout(timeout)))
    }

    async fn call_with_one_retry(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
    ) -> Result<Answer, CallError> {
        self.call_with_one_retry_as(method, path, body, JSON).await
    }

    async fn call_with_one_retry_as(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<Answer, CallError> {
        let (sender, reused) = match self.take_idle() {
            Some(sender) => (sender, true),
            None => (self.connect().await?, false),
        };
        match self
            .exchange(sender, method.clone(), path, body.clone(), content_type)
            .await
        {
            Err(CallError::Exchange { source, .. })
                if reused && (source.is_canceled() || source.is_incomplete_message()) =>
            {
                let fresh = self.connect().await?;
                self.exchange(fresh, method, path, body, content_type).await
            }
            result => result,
        }
    }

    async fn exchange(
        &self,
        mut sender: SendRequest<Full<Bytes>>,
        method: hyper::Method,
        path: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<Answer, CallError> {
        let response = self
            .send(&mut sender, method, path, body, content_type)
            .await?;
        let status = response.status().as_u16();
        let body = self.read_whole(response).await?;
        // Only a connection whose answer was read to the end can carry the next request.
        self.put_idle(sender);
        Ok(Answer { status, body })
    }

    /// Sends one request and waits for the answer's head; a redirect is an error.
    async fn send(
        &self,
        sender: &mut SendRequest<Full<Bytes>>,
        method: hyper::Method,
        path: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<hyper::Response<hyper::body::Incoming>, CallError> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, content_type);
        if let Some(value) = self.keys.as_ref().and_then(|k| k.peer_authorization()) {
            request = request.header(hyper::header::AUTHORIZATION, value);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| CallError::Request {
                authority: self.authority.clone(),
                detail: e.to_string(),
            })?;
        let exchange_error = |source| CallError::Exchange {
            authority: self.authority.clone(),
            source,
        };
        sender.ready().await.map_err(exchange_error)?;
        let response = sender.send_request(request).await.map_err(exchange_error)?;
        if response.status().is_redirection() {
            // The connection is dropped with the unread answer.
            return Err(CallError::Redirect {
                authority: self.authority.clone(),
                status: response.status().as_u16(),
            });
        }
        Ok(response)
    }

    /// The whole answer body, refused past [`ANSWER_BYTES_MAX`].
    async fn read_whole(
        &self,
        response: hyper::Response<hyper::body::Incoming>,
    ) -> Result<Bytes, CallError> {
        Ok(Limited::new(response.into_body(), ANSWER_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| CallError::Body {
                authority: self.authority.clone(),
                detail: e.to_string(),
            })?
            .to_bytes())
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, CallError> {
        let connect_error = |source| CallError::Connect {
            authority: self.authority.clone(),
            source,
        };
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(self.authority.as_str()),
        )
        .await
        .map_err(|_| connect_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(connect_error)?;
        // Requests are small and answered at once; Nagle would hold each one back.
        stream.set_nodelay(true).map_err(connect_error)?;
        match &self.tls {
            None => self.handshake(TokioIo::new(stream)).await,
            Some(tls) => {
                let stream = net::tls_connect::connect(
                    stream,
                    tls.name.clone(),
                    Arc::clone(&tls.config),
                    CONNECT_TIMEOUT,
                )
                .await
                .map_err(|source| CallError::Tls {
                    authority: self.authority.clone(),
                    source,
                })?;
                self.handshake(TokioIo::new(stream)).await
            }
        }
    }

    /// HTTP/1.1 on a connected stream (plain or TLS).
    async fn handshake<T>(&self, io: TokioIo<T>) -> Result<SendRequest<Full<Bytes>>, CallError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) =
            hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|source| CallError::Exchange {
                    authority: self.authority.clone(),
                    source,
                })?;
        // The connection's I/O runs as its own task; it ends when `sender` is dropped or the
        // peer closes. Its error, if any, also reaches the request that was in flight.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(Idle { sender, since }) = idle.pop() {
            if !sender.is_closed() && since.elapsed() < IDLE_FOR_MAX {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_MAX {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// Idle connections held now (for tests).
    pub fn idle_connections(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked() {
        let endpoint = Endpoint::new("http://127.0.0.1:7001/").unwrap();
        assert_eq!(endpoint.authority, "127.0.0.1:7001");
        assert_eq!(endpoint.base_url(), "http://127.0.0.1:7001");
        assert_eq!(
            Endpoint::new("http://inventory").unwrap().authority,
            "inventory:80"
        );
        let secure = Endpoint::new("https://inventory.internal").unwrap();
        assert_eq!(secure.authority, "inventory.internal:443");
        assert!(secure.is_https());
        for bad in [
            "ftp://x:1",
            "https://",
            "http://",
            "http://x:1/path",
            "x:1",
            "http://u@x:1",
            "http://x:notaport",
        ] {
            assert!(Endpoint::new(bad).is_err(), "{bad} accepted");
        }
    }

    async fn serve(
        app: axum::Router,
    ) -> (String, tokio::task::JoinHandle<Result<(), std::io::Error>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        (
            url,
            tokio::spawn(async move { axum::serve(listener, app).await }),
        )
    }

    #[tokio::test]
    async fn posts_json_reads_the_answer_and_reuses_the_connection() {
        use axum::routing::post;
        let app = axum::Router::new().route(
            "/echo",
            post(|headers: axum::http::HeaderMap, body: Bytes| async move {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                (
                    axum::http::StatusCode::ACCEPTED,
                    format!("{kind} {}", body.len()),
                )
            }),
        );
        let (url, _server) = serve(app).await;
        let endpoint = Endpoint::new(&url).unwrap();
        for _ in 0..3 {
            let answer = endpoint
                .post_json("/echo", b"{\"a\":1}".to_vec(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(answer.status, 202);
            assert_eq!(&answer.body[..], b"application/json 7");
            assert_eq!(endpoint.idle_connections(), 1, "one connection, reused");
        }
    }

    #[tokio::test]
    async fn a_slow_peer_times_out_and_its_connection_is_not_reused() {
        use axum::routing::post;
        let app = axum::Router::new().route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "late"
            }),
        );
        let (url, _server) = serve(app).await;
        let endpoint = Endpoint::new(&url).unwrap();
        let error = endpoint
            .post_json("/slow", b"{}".to_vec(), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Timeout(_)), "{error}");
        assert_eq!(endpoint.idle_connections(), 0);
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused() {
        use axum::routing::post;
        let app =
            axum::Router::new().route("/big", post(|| async { vec![b'x'; ANSWER_BYTES_MAX + 1] }));
        let (url, _server) = serve(app).await;
        let endpoint = Endpoint::new(&url).unwrap();
        let error = endpoint
            .post_json("/big", b"{}".to_vec(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Body { .. }), "{error}");
    }

    #[tokio::test]
    async fn nobody_listening_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let endpoint = Endpoint::new(&url).unwrap();
        let error = endpoint
            .post_json("/x", b"{}".to_vec(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Connect { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_while_idle_is_replaced() {
        // A raw server that answers one request per connection and then closes it, without
        // saying `Connection: close`: the pooled connection is dead when it is next used.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buffer = vec![0u8; 4096];
                let _ = socket.read(&mut buffer).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                drop(socket);
            }
        });
        let endpoint = Endpoint::new(&url).unwrap();
        for _ in 0..3 {
            let answer = endpoint
                .post_json("/x", b"{}".to_vec(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(&answer.body[..], b"ok");
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "each request needed a connection of its own"
        );
    }
}
