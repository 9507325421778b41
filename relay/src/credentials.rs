//! The relay's tokens: the peer token it sends to participants (`--peer-token-file`, its first
//! token), the client token it sends to coordinators (`--client-token-file`, its first), and
//! the tokens `/metrics` takes (`--metrics-token-file`). Read at start, where a bad file stops
//! the start; reread whole on SIGHUP, as the coordinator and the participants do, where a bad
//! file keeps the old set in force and says why. Every request reads the set in force when it
//! is sent, so a rotation needs no restart.
//!
//! This module must never print or log a token; errors name the file, not its text.

use std::path::PathBuf;
use std::sync::Arc;

use protocol::auth::{KeyRing, Keys, TokenFiles};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, RequestBuilder};

/// The token files given, and the set read from them last.
#[derive(Debug)]
pub struct Credentials {
    files: TokenFiles,
    keys: KeyRing,
}

/// Which token a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sends {
    /// The peer token: to participants (their outbox reports are peer routes).
    Peer,
    /// The client token: to coordinators.
    Client,
}

impl Credentials {
    /// Reads and checks every file given.
    pub fn load(
        peer: Option<PathBuf>,
        client: Option<PathBuf>,
        metrics: Option<PathBuf>,
    ) -> Result<Credentials, String> {
        let files = TokenFiles {
            peer,
            client,
            metrics,
            operator: None,
        };
        let keys = read(&files)?;
        Ok(Credentials {
            files,
            keys: KeyRing::new(keys),
        })
    }

    /// The set in force, shared: `/metrics` checks callers against it.
    pub fn keys(&self) -> KeyRing {
        self.keys.clone()
    }

    /// Rereads every file; the new set replaces the old whole, or not at all. Returns what
    /// was loaded (redacted) for the log.
    pub fn reload(&self) -> Result<String, String> {
        let keys = read(&self.files)?;
        let loaded = format!("{keys:?}");
        self.keys.replace(keys);
        Ok(loaded)
    }

    /// The `Authorization` value to send as `sends`, from the set in force (none: no file).
    fn authorization(&self, sends: Sends) -> Option<HeaderValue> {
        let keys = self.keys.current();
        let token = match sends {
            Sends::Peer => keys.peer_token(),
            Sends::Client => keys
                .client
                .as_ref()
                .and_then(|t| t.first())
                .map(|n| &n.token),
        }?;
        // Checked when read (see `read`); a value that fails here is left unsent, not guessed.
        let mut value = HeaderValue::from_str(&token.bearer_header()).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    /// Rereads the files on every SIGHUP until the task is aborted. Installed even with no
    /// token files: SIGHUP's default action ends the process, and a `kill -HUP` sent to every
    /// twopc process to rotate tokens must not stop the relay.
    pub async fn reload_on_sighup(self: Arc<Self>) {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGHUP; tokens will not reload");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            if !self.files.any() {
                tracing::info!("SIGHUP: no token files are given; nothing to reload");
                continue;
            }
            match self.reload() {
                Ok(tokens) => tracing::info!(%tokens, "SIGHUP: token files reloaded"),
                Err(error) => tracing::error!(%error,
                    "SIGHUP: token files refused; the old tokens stay in force"),
            }
        }
    }
}

/// Every file given, read and checked: a peer or client file must hold a token that can be
/// sent as a header.
fn read(files: &TokenFiles) -> Result<Keys, String> {
    let keys = files
        .load(|path| std::fs::read_to_string(path))
        .map_err(|e| e.to_string())?;
    let sent = [
        (files.peer.as_ref(), keys.peer_token()),
        (
            files.client.as_ref(),
            keys.client
                .as_ref()
                .and_then(|t| t.first())
                .map(|n| &n.token),
        ),
    ];
    for (file, token) in sent {
        let Some(file) = file else { continue };
        let name = file.display();
        let token = token.ok_or_else(|| format!("the token file {name} holds no token"))?;
        HeaderValue::from_str(&token.bearer_header())
            .map_err(|_| format!("{name}: the token is not a valid header value"))?;
    }
    Ok(keys)
}

/// An HTTP client that sends one of the relay's tokens, as in force at each request.
#[derive(Debug, Clone)]
pub struct Authed {
    client: reqwest::Client,
    credentials: Option<Arc<Credentials>>,
    sends: Sends,
}

impl Authed {
    pub fn new(client: reqwest::Client, credentials: Arc<Credentials>, sends: Sends) -> Authed {
        Authed {
            client,
            credentials: Some(credentials),
            sends,
        }
    }

    /// A client that sends no token.
    #[cfg(test)]
    pub fn without_token(client: reqwest::Client) -> Authed {
        Authed {
            client,
            credentials: None,
            sends: Sends::Peer,
        }
    }

    pub fn request(&self, method: Method, url: impl reqwest::IntoUrl) -> RequestBuilder {
        let request = self.client.request(method, url);
        match self
            .credentials
            .as_ref()
            .and_then(|c| c.authorization(self.sends))
        {
            Some(value) => request.header(AUTHORIZATION, value),
            None => request,
        }
    }

    pub fn get(&self, url: impl reqwest::IntoUrl) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    pub fn post(&self, url: impl reqwest::IntoUrl) -> RequestBuilder {
        self.request(Method::POST, url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER_1: &str = "relay-peer-token-one-0123456789abcdef";
    const PEER_2: &str = "relay-peer-token-two-0123456789abcdef";
    const CLIENT_1: &str = "relay-client-token-one-0123456789abcd";

    fn sent(credentials: &Credentials, sends: Sends) -> Option<String> {
        credentials
            .authorization(sends)
            .map(|v| v.to_str().unwrap().to_string())
    }

    #[test]
    fn a_reload_puts_the_new_files_in_force_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let peer = dir.path().join("peer.tokens");
        let client = dir.path().join("client.tokens");
        std::fs::write(&peer, format!("{PEER_1}\n")).unwrap();
        std::fs::write(&client, format!("relay {CLIENT_1}\n")).unwrap();
        let credentials =
            Credentials::load(Some(peer.clone()), Some(client.clone()), None).unwrap();
        assert_eq!(
            sent(&credentials, Sends::Peer),
            Some(format!("Bearer {PEER_1}"))
        );
        assert_eq!(
            sent(&credentials, Sends::Client),
            Some(format!("Bearer {CLIENT_1}"))
        );

        std::fs::write(&peer, format!("{PEER_2}\n{PEER_1}\n")).unwrap();
        let loaded = credentials.reload().unwrap();
        assert!(
            !loaded.contains(PEER_2),
            "the log line is redacted: {loaded}"
        );
        assert_eq!(
            sent(&credentials, Sends::Peer),
            Some(format!("Bearer {PEER_2}")),
            "the first token of the new file is sent"
        );

        // A bad file (a token too short, then no token) keeps the set in force, and the
        // refusal names the file, never a token.
        for bad in ["abc\n", "# rotated out\n"] {
            std::fs::write(&peer, bad).unwrap();
            let refused = credentials.reload().unwrap_err();
            assert!(refused.contains("peer.tokens"), "{refused}");
            assert!(!refused.contains(PEER_2), "{refused}");
            assert_eq!(
                sent(&credentials, Sends::Peer),
                Some(format!("Bearer {PEER_2}"))
            );
        }
        std::fs::remove_file(&client).unwrap();
        assert!(credentials.reload().unwrap_err().contains("client.tokens"));
        assert_eq!(
            sent(&credentials, Sends::Client),
            Some(format!("Bearer {CLIENT_1}"))
        );
    }

    #[test]
    fn without_files_nothing_is_sent_and_a_start_with_an_empty_file_is_refused() {
        let credentials = Credentials::load(None, None, None).unwrap();
        assert_eq!(sent(&credentials, Sends::Peer), None);
        assert_eq!(sent(&credentials, Sends::Client), None);
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.tokens");
        std::fs::write(&empty, "# nothing yet\n").unwrap();
        let refused = Credentials::load(Some(empty), None, None).unwrap_err();
        assert!(refused.contains("holds no token"), "{refused}");
    }
}
