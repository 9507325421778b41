//! A coordinator group as the `twopc` command's clients see it (issue 27): the list of base
//! URLs a `--coordinator`/`--target-coordinator` flag names (`http://a:7100,http://b:7100`),
//! and [`Group::send`], which finds the leader by trying them in turn. A follower, or a leader
//! whose etcd lease lapsed, answers 503 `not_leader` (naming the leader when it knows it);
//! nothing redirects, so the client moves on itself.
//!
//! This module must never resend a request that could act twice: a request goes to a second
//! address only when [`Resend::Safe`] says a repeat cannot do anything the first did not
//! (see [`Resend`]). It never follows an address that is not in the list.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use protocol::{ErrorBody, ErrorCode};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::printable::printable;

/// The base URLs of a coordinator group, in the order given; never empty, no duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses(Vec<String>);

impl Addresses {
    /// Parses a comma-separated list of `http://` or `https://` base URLs (a clap value
    /// parser). Each is checked; a trailing `/` is dropped; the same address twice is refused
    /// (it would only be asked twice in a row).
    pub fn parse(value: &str) -> Result<Addresses, String> {
        let mut urls = Vec::new();
        let mut seen = HashSet::new();
        for item in value.split(',') {
            let url = base_url(item.trim())?;
            if !seen.insert(url.clone()) {
                return Err(format!("{url} is named twice"));
            }
            urls.push(url);
        }
        Ok(Addresses(urls))
    }

    pub fn urls(&self) -> &[String] {
        &self.0
    }

    fn index_of(&self, url: &str) -> Option<usize> {
        let url = base_url(url).ok()?;
        self.0.iter().position(|u| *u == url)
    }
}

impl std::fmt::Display for Addresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// One address checked and in its normal form (scheme and host lower case, default port
/// dropped, no trailing `/`), so that two spellings of one address compare equal.
fn base_url(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("an empty address in the list".into());
    }
    let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{text:?} is not a base URL (http://host:port or https://host:port)"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(format!(
            "{text:?} must be a base URL (no user, query or fragment)"
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// Whether a request may be sent to another address of the group after one did not take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// A repeat cannot act twice: a GET, a submission under a client-chosen id (the same id
    /// on another coordinator of the group gets the same answer), an operator action on one
    /// named transaction or saga whose repeat is refused or does nothing new.
    Safe,
    /// A repeat could act on something the caller did not ask about (a POST with no id): it
    /// is sent once, to the address that answered last.
    Never,
}

/// One request, as often as the group needs it: method, path (with query) and JSON body.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
    pub resend: Resend,
}

impl Request {
    pub fn get(path: impl Into<String>) -> Request {
        Request {
            method: Method::GET,
            path: path.into(),
            body: None,
            resend: Resend::Safe,
        }
    }

    pub fn post(path: impl Into<String>, body: Value, resend: Resend) -> Request {
        Request {
            method: Method::POST,
            path: path.into(),
            body: Some(body),
            resend,
        }
    }
}

/// The answer of the address that took the request (any status but the "ask another" ones).
#[derive(Debug)]
pub struct Answer {
    /// The base URL that answered.
    pub base: String,
    pub status: StatusCode,
    pub body: Vec<u8>,
}

/// What one address said when it did not take the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// No answer: a connection error or a timeout before the answer's head.
    Unreachable(String),
    /// 503 `not_leader` or `not_ready`: this node cannot take it now.
    Declined(ErrorBody),
}

/// No address took the request: every attempt, in order.
#[derive(Debug)]
pub struct Exhausted {
    pub attempts: Vec<(String, Said)>,
}

impl Exhausted {
    /// Whether no address answered at all (every attempt was unreachable).
    pub fn none_answered(&self) -> bool {
        self.attempts
            .iter()
            .all(|(_, said)| matches!(said, Said::Unreachable(_)))
    }
}

impl std::fmt::Display for Exhausted {
    /// One attempt: as a single coordinator always said it. Several: one line per address.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let [(url, said)] = self.attempts.as_slice() {
            return match said {
                Said::Unreachable(e) => write!(f, "cannot reach the coordinator at {url}: {e}"),
                Said::Declined(body) => write!(f, "{}", declined_text(body)),
            };
        }
        write!(f, "no coordinator of the group took the request:")?;
        for (url, said) in &self.attempts {
            match said {
                Said::Unreachable(e) => write!(f, "\n  {url}: cannot reach it: {e}")?,
                Said::Declined(body) => write!(f, "\n  {url}: {}", declined_text(body))?,
            }
        }
        Ok(())
    }
}

/// A node's words, each field escaped: they are a peer's and end up on a terminal, where a
/// newline in them must not start a line that looks like ours.
fn declined_text(body: &ErrorBody) -> String {
    let message = printable(&body.message);
    match &body.leader {
        Some(leader) => format!("{}: {message} (leader: {})", body.error, printable(leader)),
        None => format!("{}: {message}", body.error),
    }
}

/// How hard [`Group::send`] tries: rounds over the whole list, and the pause between them (a
/// new leader takes a moment to be elected). A list of one address is tried once.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    pub rounds: u32,
    pub pause: Duration,
}

impl Default for Patience {
    fn default() -> Self {
        Patience {
            rounds: 3,
            pause: Duration::from_millis(200),
        }
    }
}

/// A client of a coordinator group: the list, the HTTP client, and the address that answered
/// last (asked first next time).
#[derive(Debug)]
pub struct Group {
    client: reqwest::Client,
    addresses: Addresses,
    last: AtomicUsize,
    patience: Patience,
    answer_bytes_max: usize,
}

impl Group {
    pub fn new(client: reqwest::Client, addresses: Addresses) -> Group {
        Group {
            client,
            addresses,
            last: AtomicUsize::new(0),
            patience: Patience::default(),
            answer_bytes_max: crate::client::ANSWER_BYTES_MAX,
        }
    }

    /// Other rounds and pauses (the tests' shorter ones; every command uses the default).
    #[cfg(test)]
    pub fn with_patience(mut self, patience: Patience) -> Group {
        self.patience = patience;
        self
    }

    /// The address that answered last (the first one before any answer).
    #[cfg(test)]
    pub fn current(&self) -> &str {
        &self.addresses.0[self.last.load(Ordering::Relaxed)]
    }

    /// Sends `request` to the address that answered last; on no answer or a 503 `not_leader`
    /// / `not_ready` (and if `request.resend` allows) to the leader that answer names, when it
    /// is in the list, then to the others in turn, for a few rounds. `Ok` carries the first
    /// other answer, whatever its status (a 404 or a 409 is the leader's word); `Err` says
    /// what every address said, or that an answer could not be read.
    pub async fn send(&self, request: &Request) -> Result<Answer, SendError> {
        let count = self.addresses.0.len();
        let rounds = if count == 1 || request.resend == Resend::Never {
            1
        } else {
            self.patience.rounds.max(1)
        };
        let mut attempts = Vec::new();
        for round in 0..rounds {
            if round > 0 {
                tokio::time::sleep(self.patience.pause).await;
            }
            let mut tried = vec![false; count];
            let mut next = Some(self.last.load(Ordering::Relaxed));
            while let Some(i) = next {
                tried[i] = true;
                let base = &self.addresses.0[i];
                let said = match self.attempt(base, request).await? {
                    Attempt::Took(answer) => {
                        self.last.store(i, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Attempt::Moved(said) => said,
                };
                // A `leader` in a body is a claim, not evidence: only an address the operator
                // listed is ever followed, so a wrong or forged answer cannot send the request
                // (and its token) anywhere else.
                let named = match &said {
                    Said::Declined(body) => body
                        .leader
                        .as_deref()
                        .and_then(|l| self.addresses.index_of(l))
                        .filter(|&j| !tried[j]),
                    Said::Unreachable(_) => None,
                };
                attempts.push((base.clone(), said));
                if request.resend == Resend::Never {
                    break;
                }
                next = named.or_else(|| (1..count).map(|k| (i + k) % count).find(|&j| !tried[j]));
            }
        }
        Err(SendError::Exhausted(Exhausted { attempts }))
    }

    async fn attempt(&self, base: &str, request: &Request) -> Result<Attempt, SendError> {
        let mut builder = self
            .client
            .request(request.method.clone(), format!("{base}{}", request.path));
        if let Some(body) = &request.body {
            builder = builder.json(body);
        }
        // An error from `send` means no answer's head came (connect, timeout, reset): the
        // request may not have arrived, and the next address may be the leader.
        let response = match builder.send().await {
            Ok(response) => response,
            Err(e) => return Ok(Attempt::Moved(Said::Unreachable(e.to_string()))),
        };
        let (status, bytes) = net::outbound::read_answer(response, self.answer_bytes_max)
            .await
            .map_err(|error| SendError::Answer {
                base: base.to_string(),
                error,
            })?;
        if status == StatusCode::SERVICE_UNAVAILABLE
            && let Ok(body) = serde_json::from_slice::<ErrorBody>(&bytes)
            && matches!(body.error, ErrorCode::NotLeader | ErrorCode::NotReady)
        {
            return Ok(Attempt::Moved(Said::Declined(body)));
        }
        Ok(Attempt::Took(Answer {
            base: base.to_string(),
            status,
            body: bytes.to_vec(),
        }))
    }

    /// The address that leads now, found by a read every node answers (a leader with its
    /// list, a follower 503 `not_leader`): for callers that need one URL (the demo's
    /// workload, the bench's load). Any answer but "ask another" counts, a 401 included: that
    /// node takes requests, and the caller will hear the 401 itself.
    pub async fn leader(&self) -> Result<String, SendError> {
        let probe = Request::get(format!("{}?limit=1", protocol::routes::TRANSACTIONS));
        Ok(self.send(&probe).await?.base)
    }
}

enum Attempt {
    Took(Answer),
    Moved(Said),
}

/// Why [`Group::send`] has no answer.
#[derive(Debug)]
pub enum SendError {
    Exhausted(Exhausted),
    /// An address answered, but its answer could not be read (a redirect, too large, cut).
    Answer {
        base: String,
        error: net::outbound::AnswerError,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Exhausted(exhausted) => exhausted.fmt(f),
            SendError::Answer { base, error } => write!(f, "the coordinator at {base}: {error}"),
        }
    }
}

impl std::error::Error for SendError {}

#[cfg(test)]
#[path = "coordinator_group_tests.rs"]
mod tests;
