//! The etcd client: which endpoint a call goes to, sending it under the outbound policy, and
//! turning answers into values. What each call means to etcd is in `wire`; when a failed call
//! may go to the next endpoint is in `retry` (the rules are in the `etcd` module doc).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rustls::ClientConfig;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::body_text;
use super::retry::{Resend, txn_resend};
use super::wire::{self, GatewayError};
use super::{Compare, EtcdError, KeyValue, LeaseId, TxnOp, TxnResult};
use crate::outbound::{self, AnswerError, Limits};

/// Cap of one answer. etcd refuses requests over 1.5 MiB by default, so one key is smaller;
/// this leaves room for a prefix read of a few such keys.
pub const ANSWER_BYTES_MAX: usize = 4 << 20;

/// A client of one etcd cluster, through its members' JSON gateways. Clones share the
/// connection pool and the endpoint that answered last.
#[derive(Debug, Clone)]
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Arc<[String]>,
    /// Index into `endpoints` of the one that answered last: the first one tried.
    preferred: Arc<AtomicUsize>,
    timeout: Duration,
}

/// An answer (2xx or 4xx) from one endpoint.
#[derive(Debug)]
struct Reply {
    endpoint: String,
    status: u16,
    body: Bytes,
    /// Whether an earlier endpoint of the same call failed after the request was sent, so
    /// that it may have applied it.
    sent_before: bool,
}

impl Etcd {
    /// A client of the members at `endpoints` (`http://host:port`), each call to one member
    /// bounded by `timeout`. `https://` endpoints need [`Etcd::with_tls`].
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Etcd, EtcdError> {
        Self::with_tls(endpoints, timeout, None)
    }

    /// As [`Etcd::new`], trusting the CA of `tls` for `https://` endpoints (`None`: nobody).
    pub fn with_tls(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<Arc<ClientConfig>>,
    ) -> Result<Etcd, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::Config {
                what: "no endpoint given".to_string(),
            });
        }
        if timeout.is_zero() {
            return Err(EtcdError::Config {
                what: "the timeout is zero".to_string(),
            });
        }
        let endpoints = endpoints
            .iter()
            .map(|endpoint| check_endpoint(endpoint))
            .collect::<Result<Vec<_>, _>>()?;
        let limits = Limits {
            connect: outbound::CONNECT_TIMEOUT.min(timeout),
            total: timeout,
            answer_bytes_max: ANSWER_BYTES_MAX,
        };
        let http = outbound::reqwest_client(&limits, tls).map_err(|e| EtcdError::Config {
            what: e.to_string(),
        })?;
        Ok(Etcd {
            http,
            endpoints: endpoints.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            timeout,
        })
    }

    /// The endpoints, as given (without a trailing slash).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// A new lease of `ttl` (whole seconds, rounded up; etcd may raise it to its minimum).
    /// The ID is picked here, so that the grant can be sent to another member after one that
    /// may have granted it failed: "already exists" then means it did.
    pub async fn grant(&self, ttl: Duration) -> Result<LeaseId, EtcdError> {
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let id = fastrand::i64(1..=i64::MAX);
        let request = wire::LeaseGrantRequest {
            ttl: seconds.max(1).to_string(),
            id: id.to_string(),
        };
        let reply = self
            .send("/v3/lease/grant", &request, Resend::Always)
            .await?;
        if reply.sent_before && gateway_error(&reply).code == wire::CODE_FAILED_PRECONDITION {
            return Ok(LeaseId(id));
        }
        let granted: wire::LeaseGrantResponse = answer(&reply, None)?;
        if !granted.error.is_empty() {
            return Err(refused(&reply));
        }
        if granted.id != id {
            return Err(malformed(
                &reply,
                format!("asked for lease {id}, granted {}", granted.id),
            ));
        }
        Ok(LeaseId(id))
    }

    /// Refreshes `lease`; its TTL from now, or `None` when etcd no longer has it (expired or
    /// revoked: the keys it held are gone).
    pub async fn keep_alive(&self, lease: LeaseId) -> Result<Option<Duration>, EtcdError> {
        let request = wire::LeaseIdRequest {
            id: lease.0.to_string(),
        };
        let reply = self
            .send("/v3/lease/keepalive", &request, Resend::Always)
            .await?;
        if !is_success(&reply) {
            return Err(refusal(&reply, Some(lease)));
        }
        let message =
            wire::decode_stream_first(&reply.body).map_err(|what| malformed(&reply, what))?;
        match (message.result, message.error) {
            (Some(result), _) => Ok(u64::try_from(result.ttl)
                .ok()
                .filter(|&ttl| ttl > 0)
                .map(Duration::from_secs)),
            (None, Some(error)) => Err(EtcdError::OutcomeUnknown {
                endpoint: reply.endpoint,
                cause: format!("keep-alive failed: {error}"),
            }),
            (None, None) => Err(malformed(
                &reply,
                "a keep-alive message without result".to_string(),
            )),
        }
    }

    /// Ends `lease` now, deleting the keys it holds. A lease already gone counts as revoked.
    pub async fn revoke(&self, lease: LeaseId) -> Result<(), EtcdError> {
        let request = wire::LeaseIdRequest {
            id: lease.0.to_string(),
        };
        let reply = self
            .send("/v3/lease/revoke", &request, Resend::Always)
            .await?;
        if is_success(&reply) {
            return Ok(());
        }
        match refusal(&reply, Some(lease)) {
            EtcdError::LeaseNotFound { .. } => Ok(()),
            error => Err(error),
        }
    }

    /// The key, if it exists (a linearizable read).
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let reply = self
            .send(
                "/v3/kv/range",
                &wire::RangeRequest::key(key),
                Resend::Always,
            )
            .await?;
        let range: wire::RangeResponse = answer(&reply, None)?;
        Ok(range.kvs.into_iter().next().map(KeyValue::from))
    }

    /// Every key starting with `prefix`, in key order (a linearizable read).
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let reply = self
            .send(
                "/v3/kv/range",
                &wire::RangeRequest::prefix(prefix),
                Resend::Always,
            )
            .await?;
        let range: wire::RangeResponse = answer(&reply, None)?;
        Ok(range.kvs.into_iter().map(KeyValue::from).collect())
    }

    /// Writes `key`, attached to `lease` if given; the store's revision after the write.
    /// Never sent to a second member once the first may have applied it.
    pub async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
    ) -> Result<i64, EtcdError> {
        let request = wire::PutRequest::new(key, value, lease);
        let reply = self
            .send("/v3/kv/put", &request, Resend::OnlyUnsent)
            .await?;
        let put: wire::HeaderOnly = answer(&reply, lease)?;
        Ok(put.header.revision)
    }

    /// Deletes `key`; whether it existed. Never sent to a second member once the first may
    /// have applied it.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, EtcdError> {
        let request = wire::DeleteRangeRequest {
            key: wire::b64(key),
        };
        let reply = self
            .send("/v3/kv/deleterange", &request, Resend::OnlyUnsent)
            .await?;
        let deleted: wire::DeleteRangeResponse = answer(&reply, None)?;
        Ok(deleted.deleted > 0)
    }

    /// If every compare holds, applies `success`; otherwise reads the `failure_reads` keys in
    /// the same round trip (so a lost campaign learns who holds the key). Sent to a second
    /// member after a doubtful first attempt only when its compares fence it (module doc):
    /// the answer may then say `succeeded: false` for a txn the first attempt applied, and the
    /// reads show the writes it made.
    pub async fn txn(
        &self,
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure_reads: Vec<Vec<u8>>,
    ) -> Result<TxnResult, EtcdError> {
        let resend = txn_resend(&compares, &success);
        let lease = success.iter().find_map(|op| match op {
            TxnOp::Put { lease, .. } => *lease,
            TxnOp::Delete { .. } => None,
        });
        let request = wire::TxnRequest {
            compare: compares.iter().map(wire::WireCompare::from).collect(),
            success: success.iter().map(wire::RequestOp::from).collect(),
            failure: failure_reads
                .iter()
                .map(|key| wire::RequestOp::range(key))
                .collect(),
        };
        let reply = self.send("/v3/kv/txn", &request, resend).await?;
        let txn: wire::TxnResponse = answer(&reply, lease)?;
        if txn.succeeded {
            return Ok(TxnResult {
                succeeded: true,
                revision: txn.header.revision,
                reads: Vec::new(),
            });
        }
        if txn.responses.len() != failure_reads.len() {
            return Err(malformed(
                &reply,
                format!(
                    "{} failure reads asked, {} answered",
                    failure_reads.len(),
                    txn.responses.len()
                ),
            ));
        }
        let mut reads = Vec::with_capacity(txn.responses.len());
        for response in txn.responses {
            let range = response
                .response_range
                .ok_or_else(|| malformed(&reply, "a failure read is not a range".to_string()))?;
            reads.push(range.kvs.into_iter().next().map(KeyValue::from));
        }
        Ok(TxnResult {
            succeeded: false,
            revision: txn.header.revision,
            reads,
        })
    }

    /// POSTs `body` to `path`, from the endpoint that answered last onwards, each endpoint at
    /// most once: a refused connection moves on; a timeout, a lost connection or a 5xx moves
    /// on only for `Resend::Always` (otherwise the request may have been applied, and the
    /// call fails saying so). A 2xx or 4xx answer is returned as it is.
    async fn send(
        &self,
        path: &str,
        body: &impl Serialize,
        resend: Resend,
    ) -> Result<Reply, EtcdError> {
        let body = Bytes::from(serde_json::to_vec(body).map_err(|e| EtcdError::Config {
            what: format!("cannot encode a request: {e}"),
        })?);
        let count = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed) % count;
        let mut tried = Vec::with_capacity(count);
        let mut last = String::new();
        let mut sent_before = false;
        for step in 0..count {
            let index = (start + step) % count;
            let endpoint = &self.endpoints[index];
            tried.push(endpoint.clone());
            let sent = self
                .http
                .post(format!("{endpoint}{path}"))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            // Why the request may have been applied without an answer saying so.
            let (cause, timed_out) = match sent {
                Err(e) if e.is_connect() => {
                    last = format!("{endpoint}: cannot connect: {e}");
                    continue;
                }
                Err(e) => (format!("{e}"), e.is_timeout()),
                Ok(response) => match outbound::read_answer(response, ANSWER_BYTES_MAX).await {
                    Ok((status, answer)) if status.is_server_error() => {
                        (format!("answered {status}: {}", body_text(&answer)), false)
                    }
                    Ok((status, answer)) => {
                        self.preferred.store(index, Ordering::Relaxed);
                        return Ok(Reply {
                            endpoint: endpoint.clone(),
                            status: status.as_u16(),
                            body: answer,
                            sent_before,
                        });
                    }
                    Err(AnswerError::Read(e)) => {
                        (format!("reading the answer: {e}"), e.is_timeout())
                    }
                    Err(source) => {
                        return Err(EtcdError::Answer {
                            endpoint: endpoint.clone(),
                            source,
                        });
                    }
                },
            };
            match resend {
                Resend::Always => {
                    sent_before = true;
                    last = format!("{endpoint}: {cause}");
                }
                Resend::OnlyUnsent if timed_out => {
                    return Err(EtcdError::Timeout {
                        endpoint: endpoint.clone(),
                        after: self.timeout,
                    });
                }
                Resend::OnlyUnsent => {
                    return Err(EtcdError::OutcomeUnknown {
                        endpoint: endpoint.clone(),
                        cause,
                    });
                }
            }
        }
        Err(EtcdError::Unreachable { tried, last })
    }
}

/// `http(s)://host[:port]` with nothing after it; returned without a trailing slash.
fn check_endpoint(endpoint: &str) -> Result<String, EtcdError> {
    let bad = |why: &str| EtcdError::Config {
        what: format!("{endpoint:?} {why}"),
    };
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| bad(&format!("is not an http:// or https:// URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("is not an http:// or https:// URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("carries credentials"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(bad("has a path, query or fragment; give http://host:port"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

fn is_success(reply: &Reply) -> bool {
    (200..300).contains(&reply.status)
}

/// A 2xx answer as `T`; anything else as the refusal it is.
fn answer<T: DeserializeOwned>(reply: &Reply, lease: Option<LeaseId>) -> Result<T, EtcdError> {
    if !is_success(reply) {
        return Err(refusal(reply, lease));
    }
    wire::decode(&reply.body).map_err(|what| malformed(reply, what))
}

/// The error of a non-2xx answer: [`EtcdError::LeaseNotFound`] when the request named a
/// lease and etcd says it is not found, [`EtcdError::Refused`] otherwise.
fn refusal(reply: &Reply, lease: Option<LeaseId>) -> EtcdError {
    let error = gateway_error(reply);
    match lease {
        Some(lease)
            if error.code == wire::CODE_NOT_FOUND && error.message.contains("lease not found") =>
        {
            EtcdError::LeaseNotFound { lease: lease.0 }
        }
        _ => refused(reply),
    }
}

fn refused(reply: &Reply) -> EtcdError {
    EtcdError::Refused {
        endpoint: reply.endpoint.clone(),
        status: reply.status,
        body: body_text(&reply.body),
    }
}

/// The gateway's error body; all zero when the body is not one.
fn gateway_error(reply: &Reply) -> GatewayError {
    if is_success(reply) {
        return GatewayError::default();
    }
    wire::decode(&reply.body).unwrap_or_default()
}

fn malformed(reply: &Reply, what: String) -> EtcdError {
    EtcdError::Malformed {
        endpoint: reply.endpoint.clone(),
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_plain_http_urls() {
        let timeout = Duration::from_secs(1);
        let ok = Etcd::new(
            &[
                "http://127.0.0.1:2379/".to_string(),
                "https://etcd-1:2379".to_string(),
            ],
            timeout,
        )
        .unwrap();
        assert_eq!(
            ok.endpoints(),
            ["http://127.0.0.1:2379", "https://etcd-1:2379"]
        );
        for (endpoints, says) in [
            (vec![], "no endpoint"),
            (vec!["127.0.0.1:2379".to_string()], "not an http"),
            (vec!["unix:///run/etcd.sock".to_string()], "not an http"),
            (vec!["grpc://127.0.0.1:2379".to_string()], "not an http"),
            (vec!["http://127.0.0.1:2379/v3".to_string()], "has a path"),
            (vec!["http://u:p@127.0.0.1:2379".to_string()], "credentials"),
            (vec!["http://[::1".to_string()], "not an http"),
        ] {
            let error = Etcd::new(&endpoints, timeout).unwrap_err();
            assert!(
                matches!(&error, EtcdError::Config { what } if what.contains(says)),
                "{endpoints:?}: {error}"
            );
        }
        let zero = Etcd::new(&["http://127.0.0.1:2379".to_string()], Duration::ZERO);
        assert!(matches!(zero, Err(EtcdError::Config { .. })));
    }
}
