//! The policy every outbound twopc client follows: a redirect is an error (never followed), an
//! answer is capped in size (an answer over the cap is an error, and is not read to its end),
//! connecting and the whole call are bounded in time, and `https://` trusts only the CA given
//! (none given: nobody). Owns building such reqwest clients and reading capped answers; knows
//! nothing about what the answers mean.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustls::ClientConfig;

/// Cap of an answer between twopc's own services: none sends more than a few kilobytes.
pub const SERVICE_ANSWER_BYTES_MAX: usize = 1 << 20;

/// Longest a TCP connect (and TLS handshake) may take unless a client says otherwise.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The bounds of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connecting (TCP and TLS handshake).
    pub connect: Duration,
    /// The whole call: connect, request, and the answer read to its end.
    pub total: Duration,
    /// Most bytes of one answer's body.
    pub answer_bytes_max: usize,
}

impl Limits {
    /// A service-to-service client: [`SERVICE_ANSWER_BYTES_MAX`], `total` per call, and a
    /// connect bound of [`CONNECT_TIMEOUT`] or `total`, whichever is shorter.
    pub fn service(total: Duration) -> Self {
        Self {
            connect: CONNECT_TIMEOUT.min(total),
            total,
            answer_bytes_max: SERVICE_ANSWER_BYTES_MAX,
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot make a TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("redirected ({status}{}); redirects are not followed", location_text(.location))]
    Redirect {
        status: u16,
        location: Option<String>,
    },
    #[error("the answer is larger than {max} bytes")]
    TooLarge { max: usize },
    #[error("reading the answer failed: {0}")]
    Read(#[from] reqwest::Error),
}

fn location_text(location: &Option<String>) -> String {
    location
        .as_deref()
        .map(|l| format!(" to {l:?}"))
        .unwrap_or_default()
}

/// A reqwest client under this policy. `tls`: the configuration from `--tls-ca`
/// ([`crate::client_config`]); `None` makes every `https://` call fail its handshake.
pub fn reqwest_client(
    limits: &Limits,
    tls: Option<Arc<ClientConfig>>,
) -> Result<reqwest::Client, BuildError> {
    Ok(reqwest_builder(limits, tls)?.build()?)
}

/// As [`reqwest_client`], for a caller that adds its own settings (default headers).
pub fn reqwest_builder(
    limits: &Limits,
    tls: Option<Arc<ClientConfig>>,
) -> Result<reqwest::ClientBuilder, BuildError> {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(limits.connect)
        .timeout(limits.total)
        .no_proxy();
    with_tls(builder, tls)
}

/// Makes `builder` trust exactly the CA of `tls` for `https://` (`None`: nobody).
pub fn with_tls(
    builder: reqwest::ClientBuilder,
    tls: Option<Arc<ClientConfig>>,
) -> Result<reqwest::ClientBuilder, BuildError> {
    let tls = match tls {
        Some(config) => config,
        None => crate::tls_config::client_config_trusting_nobody()?,
    };
    // reqwest takes the rustls configuration by value (it checks the type at run time).
    Ok(builder.use_preconfigured_tls(ClientConfig::clone(&tls)))
}

/// Takes an answer's status and body: a 3xx is [`AnswerError::Redirect`]; a body over
/// `max` bytes is [`AnswerError::TooLarge`], found from `Content-Length` before reading or
/// after at most `max` bytes plus one chunk.
pub async fn read_answer(
    mut response: reqwest::Response,
    max: usize,
) -> Result<(reqwest::StatusCode, Bytes), AnswerError> {
    let status = response.status();
    if status.is_redirection() {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        return Err(AnswerError::Redirect {
            status: status.as_u16(),
            location,
        });
    }
    if response
        .content_length()
        .is_some_and(|length| length > max as u64)
    {
        return Err(AnswerError::TooLarge { max });
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(AnswerError::TooLarge { max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, body.freeze()))
}
