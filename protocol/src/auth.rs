//! Bearer tokens between the parties (issue 17, docs/security.md): the token file formats, the
//! constant-time check, who a presented token makes the caller, and which kinds of caller each
//! class of route takes.
//!
//! Both servers use this one implementation; each shell reads the files (it passes a reader in)
//! and reloads them on SIGHUP into a [`KeyRing`]. This module must never do I/O itself, never
//! print a token (every `Debug` here is redacted), and never compare a token with `==`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Shortest token accepted: shorter ones are guessable.
pub const TOKEN_CHARS_MIN: usize = 16;
/// Longest token accepted (and longest header value looked at).
pub const TOKEN_CHARS_MAX: usize = 4096;

/// The realm named in `WWW-Authenticate` challenges.
pub const REALM: &str = "twopc";

/// A secret. Its `Debug` never shows it; it is compared in constant time.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// A token from a file's text: printable ASCII without spaces, at least
    /// [`TOKEN_CHARS_MIN`] characters.
    pub fn new(text: &str) -> Result<Token, TokenError> {
        if text.len() < TOKEN_CHARS_MIN {
            return Err(TokenError::Short { chars: text.len() });
        }
        if text.len() > TOKEN_CHARS_MAX {
            return Err(TokenError::Long { chars: text.len() });
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Characters);
        }
        Ok(Token(text.to_string()))
    }

    /// The secret itself, for sending it in an `Authorization` header. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this token, in time that depends only on their lengths.
    pub fn matches(&self, candidate: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), candidate.as_bytes())
    }

    /// The `Authorization` header value that presents this token.
    pub fn bearer_header(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Byte-wise equality whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is {chars} characters; at least {TOKEN_CHARS_MIN} are needed")]
    Short { chars: usize },
    #[error("token is {chars} characters; at most {TOKEN_CHARS_MAX} are allowed")]
    Long { chars: usize },
    #[error("token holds characters other than printable ASCII")]
    Characters,
}

/// A token with the name of whoever holds it (client and operator files).
#[derive(Debug, Clone)]
pub struct NamedToken {
    pub name: String,
    pub token: Token,
}

/// Why a token file is refused. Lines are 1-based; no message ever quotes a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenFileError {
    #[error("{file}: line {line}: {source}")]
    Token {
        file: String,
        line: usize,
        source: TokenError,
    },
    #[error("{file}: line {line}: expected `name token`")]
    Syntax { file: String, line: usize },
    #[error("{file}: line {line}: the name must be 1 to 64 letters, digits or -_.@")]
    Name { file: String, line: usize },
    #[error("{file}: line {line}: the same token as line {first}")]
    Duplicate {
        file: String,
        line: usize,
        first: usize,
    },
    #[error("{file}: holds no token")]
    Empty { file: String },
    #[error("{file} and {other}: the same token in both (each token must have one kind)")]
    Shared { file: String, other: String },
    #[error("cannot read {file}: {message}")]
    Read { file: String, message: String },
}

/// The lines that matter: no blank lines, no `#` comments; 1-based numbers.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
}

fn refuse_duplicates<'a>(
    file: &str,
    tokens: impl Iterator<Item = (usize, &'a Token)>,
) -> Result<(), TokenFileError> {
    let mut seen: Vec<(usize, &Token)> = Vec::new();
    for (line, token) in tokens {
        if let Some((first, _)) = seen.iter().find(|(_, t)| t.matches(token.expose())) {
            return Err(TokenFileError::Duplicate {
                file: file.to_string(),
                line,
                first: *first,
            });
        }
        seen.push((line, token));
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

/// A client or operator token file: one `name token` per line. `file` names it in errors.
pub fn parse_named(file: &str, text: &str) -> Result<Vec<NamedToken>, TokenFileError> {
    let mut parsed = Vec::new();
    for (line, content) in lines(text) {
        let mut words = content.split_whitespace();
        let (Some(name), Some(token), None) = (words.next(), words.next(), words.next()) else {
            return Err(TokenFileError::Syntax {
                file: file.to_string(),
                line,
            });
        };
        if !valid_name(name) {
            return Err(TokenFileError::Name {
                file: file.to_string(),
                line,
            });
        }
        let token = Token::new(token).map_err(|source| TokenFileError::Token {
            file: file.to_string(),
            line,
            source,
        })?;
        parsed.push((
            line,
            NamedToken {
                name: name.to_string(),
                token,
            },
        ));
    }
    refuse_duplicates(file, parsed.iter().map(|(line, n)| (*line, &n.token)))?;
    if parsed.is_empty() {
        return Err(TokenFileError::Empty {
            file: file.to_string(),
        });
    }
    Ok(parsed.into_iter().map(|(_, named)| named).collect())
}

/// A peer or metrics token file: one token per line; the first is the one sent.
pub fn parse_plain(file: &str, text: &str) -> Result<Vec<Token>, TokenFileError> {
    let mut parsed = Vec::new();
    for (line, content) in lines(text) {
        if content.split_whitespace().nth(1).is_some() {
            return Err(TokenFileError::Syntax {
                file: file.to_string(),
                line,
            });
        }
        let token = Token::new(content).map_err(|source| TokenFileError::Token {
            file: file.to_string(),
            line,
            source,
        })?;
        parsed.push((line, token));
    }
    refuse_duplicates(file, parsed.iter().map(|(line, t)| (*line, t)))?;
    if parsed.is_empty() {
        return Err(TokenFileError::Empty {
            file: file.to_string(),
        });
    }
    Ok(parsed.into_iter().map(|(_, token)| token).collect())
}

/// The token files a server was given (paths only; the shell reads them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenFiles {
    pub client: Option<PathBuf>,
    pub operator: Option<PathBuf>,
    pub peer: Option<PathBuf>,
    pub metrics: Option<PathBuf>,
}

impl TokenFiles {
    /// Whether any file is given.
    pub fn any(&self) -> bool {
        self.client.is_some()
            || self.operator.is_some()
            || self.peer.is_some()
            || self.metrics.is_some()
    }

    /// Reads (with `read`, the shell's file reader) and checks every file given.
    pub fn load(
        &self,
        read: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Keys, TokenFileError> {
        let text = |path: &PathBuf| {
            read(path).map_err(|e| TokenFileError::Read {
                file: path.display().to_string(),
                message: e.to_string(),
            })
        };
        let name = |path: &PathBuf| path.display().to_string();
        let mut keys = Keys::default();
        if let Some(path) = &self.client {
            keys.client = Some(parse_named(&name(path), &text(path)?)?);
        }
        if let Some(path) = &self.operator {
            keys.operator = Some(parse_named(&name(path), &text(path)?)?);
        }
        if let Some(path) = &self.peer {
            keys.peer = Some(parse_plain(&name(path), &text(path)?)?);
        }
        if let Some(path) = &self.metrics {
            keys.metrics = Some(parse_plain(&name(path), &text(path)?)?);
        }
        keys.refuse_shared(self)?;
        Ok(keys)
    }
}

/// What kind of credential a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Client,
    Operator,
    Peer,
    Metrics,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Operator => "operator",
            Kind::Peer => "peer",
            Kind::Metrics => "metrics",
        }
    }
}

/// Who called, once a token checked out. Handlers find it in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub kind: Kind,
    /// The holder's name from the token file (client and operator tokens only).
    pub name: Option<String>,
}

/// Which callers a route takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (`/healthz`, `/readyz`).
    Open,
    /// Anyone, unless metrics tokens are configured.
    Metrics,
    /// Clients, and operators (who may do what clients do).
    Client,
    /// The other side of the protocol.
    Peer,
    /// Operators only.
    Operator,
    /// Peers or operators (a participant's read routes).
    PeerOrOperator,
}

impl Access {
    fn takes(self, kind: Kind) -> bool {
        match self {
            Access::Open => true,
            Access::Metrics => kind == Kind::Metrics,
            Access::Client => matches!(kind, Kind::Client | Kind::Operator),
            Access::Peer => kind == Kind::Peer,
            Access::Operator => kind == Kind::Operator,
            Access::PeerOrOperator => matches!(kind, Kind::Peer | Kind::Operator),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Access::Open => "anyone",
            Access::Metrics => "a metrics token",
            Access::Client => "a client or operator token",
            Access::Peer => "a peer token",
            Access::Operator => "an operator token",
            Access::PeerOrOperator => "a peer or operator token",
        }
    }
}

/// Why a request is refused: 401 `unauthorized` or 403 `forbidden`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    Unauthorized(String),
    Forbidden(String),
}

/// The tokens a server accepts (and, for peers, sends). `Debug` shows only counts.
#[derive(Clone, Default)]
pub struct Keys {
    pub client: Option<Vec<NamedToken>>,
    pub operator: Option<Vec<NamedToken>>,
    pub peer: Option<Vec<Token>>,
    pub metrics: Option<Vec<Token>>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |n: Option<usize>| n.map_or("none".to_string(), |n| n.to_string());
        f.debug_struct("Keys")
            .field("client", &count(self.client.as_ref().map(Vec::len)))
            .field("operator", &count(self.operator.as_ref().map(Vec::len)))
            .field("peer", &count(self.peer.as_ref().map(Vec::len)))
            .field("metrics", &count(self.metrics.as_ref().map(Vec::len)))
            .finish()
    }
}

impl Keys {
    /// Whether authentication is on: any client, operator or peer token configured. With it
    /// off every route is open (the loopback default); `/metrics` goes by its own file.
    pub fn enabled(&self) -> bool {
        self.client.is_some() || self.operator.is_some() || self.peer.is_some()
    }

    /// With authentication on, the kinds of caller that have no token file, so no one of that
    /// kind can get through (a half-configured server; the caller warns at start). Empty with
    /// authentication off.
    pub fn kinds_missing(&self) -> Vec<Kind> {
        if !self.enabled() {
            return Vec::new();
        }
        let mut missing = Vec::new();
        if self.client.is_none() {
            missing.push(Kind::Client);
        }
        if self.operator.is_none() {
            missing.push(Kind::Operator);
        }
        if self.peer.is_none() {
            missing.push(Kind::Peer);
        }
        missing
    }

    /// The peer token this side sends: the first of the peer file.
    pub fn peer_token(&self) -> Option<&Token> {
        self.peer.as_ref().and_then(|tokens| tokens.first())
    }

    /// Every kind this token is, with its holder's name. Every token is compared (no early
    /// exit), so the time taken says nothing about which kind matched.
    fn identify(&self, presented: &str) -> Option<Caller> {
        let mut found = None;
        let named = [
            (Kind::Client, self.client.as_deref()),
            (Kind::Operator, self.operator.as_deref()),
        ];
        for (kind, tokens) in named {
            for entry in tokens.unwrap_or_default() {
                if entry.token.matches(presented) && found.is_none() {
                    found = Some(Caller {
                        kind,
                        name: Some(entry.name.clone()),
                    });
                }
            }
        }
        let plain = [
            (Kind::Peer, self.peer.as_deref()),
            (Kind::Metrics, self.metrics.as_deref()),
        ];
        for (kind, tokens) in plain {
            for token in tokens.unwrap_or_default() {
                if token.matches(presented) && found.is_none() {
                    found = Some(Caller { kind, name: None });
                }
            }
        }
        found
    }

    /// Decides a request to a route of class `access` that presented `authorization` (the
    /// header's value, if any). `Ok(None)`: allowed without a caller (open route, auth off).
    pub fn authorize(
        &self,
        access: Access,
        authorization: Option<&str>,
    ) -> Result<Option<Caller>, Denied> {
        let checked = match access {
            Access::Open => false,
            Access::Metrics => self.metrics.is_some(),
            _ => self.enabled(),
        };
        if !checked {
            return Ok(None);
        }
        let Some(header) = authorization else {
            return Err(Denied::Unauthorized(format!(
                "this route needs {}: send Authorization: Bearer <token>",
                access.describe()
            )));
        };
        let Some(presented) = presented_token(header) else {
            return Err(Denied::Unauthorized(
                "the Authorization header is not `Bearer <token>` (or Basic with the token as \
                 password)"
                    .to_string(),
            ));
        };
        let Some(caller) = self.identify(&presented) else {
            return Err(Denied::Unauthorized(
                "the token is not valid (unknown, or rotated out)".to_string(),
            ));
        };
        if access.takes(caller.kind) {
            Ok(Some(caller))
        } else {
            Err(Denied::Forbidden(format!(
                "a {} token may not call this route; it takes {}",
                caller.kind.as_str(),
                access.describe()
            )))
        }
    }

    /// Refuses a token that is in two files (its kind would be ambiguous).
    fn refuse_shared(&self, files: &TokenFiles) -> Result<(), TokenFileError> {
        let name = |path: &Option<PathBuf>| {
            path.as_ref()
                .map_or_else(String::new, |p| p.display().to_string())
        };
        let client: Vec<&Token> = self.client.iter().flatten().map(|n| &n.token).collect();
        let operator: Vec<&Token> = self.operator.iter().flatten().map(|n| &n.token).collect();
        let peer: Vec<&Token> = self.peer.iter().flatten().collect();
        let metrics: Vec<&Token> = self.metrics.iter().flatten().collect();
        let sets = [
            (name(&files.client), client),
            (name(&files.operator), operator),
            (name(&files.peer), peer),
            (name(&files.metrics), metrics),
        ];
        for (i, (file, tokens)) in sets.iter().enumerate() {
            for (other, others) in &sets[i + 1..] {
                let shared = tokens
                    .iter()
                    .any(|t| others.iter().any(|o| o.matches(t.expose())));
                if shared {
                    return Err(TokenFileError::Shared {
                        file: file.clone(),
                        other: other.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The token in an `Authorization` value: `Bearer <token>`, or `Basic base64(name:token)`
/// (browsers, for `/ui`; the name is ignored, the token file's name counts).
fn presented_token(header: &str) -> Option<String> {
    if header.len() > TOKEN_CHARS_MAX * 2 {
        return None;
    }
    let (scheme, rest) = header.trim().split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = decode_base64(rest)?;
        let text = String::from_utf8(decoded).ok()?;
        let (_, token) = text.split_once(':')?;
        return Some(token.to_string());
    }
    None
}

/// Standard base64 with padding (what browsers send for Basic credentials).
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (index, chunk) in bytes.chunks(4).enumerate() {
        let last = index == bytes.len() / 4 - 1;
        let padding = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && !last) {
            return None;
        }
        let mut group = 0u32;
        for &c in &chunk[..4 - padding] {
            group = (group << 6) | value(c)?;
        }
        group <<= 6 * padding as u32;
        let produced = [(group >> 16) as u8, (group >> 8) as u8, group as u8];
        out.extend_from_slice(&produced[..3 - padding]);
    }
    Some(out)
}

/// The standard base64 of `bytes` (for clients building Basic credentials in tests).
pub fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let group = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((group >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The tokens in force, swapped whole on reload so a request sees either the old set or the
/// new one. Cheap to clone (clones share the set); equal when they share it.
#[derive(Clone, Default)]
pub struct KeyRing(Arc<RwLock<Arc<Keys>>>);

impl KeyRing {
    pub fn new(keys: Keys) -> KeyRing {
        KeyRing(Arc::new(RwLock::new(Arc::new(keys))))
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<Keys> {
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts `keys` in force (a reload that read and checked every file).
    pub fn replace(&self, keys: Keys) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
    }

    /// The `Authorization` value this side sends to its peers, if it has a peer token.
    pub fn peer_authorization(&self) -> Option<String> {
        self.current().peer_token().map(Token::bearer_header)
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.current(), f)
    }
}

impl PartialEq for KeyRing {
    fn eq(&self, other: &KeyRing) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Why a server may not listen where it was asked to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to listen on {addr} with no token configured: anyone who can reach it could \
     commit, abort or submit. Give --peer-token-file, --client-token-file and \
     --operator-token-file (docs/security.md), listen on a loopback address, or pass \
     --insecure-no-auth to accept the risk"
)]
pub struct Exposed {
    pub addr: std::net::SocketAddr,
}

/// The start-up rule: a non-loopback listener needs tokens, unless `insecure_no_auth`.
/// `Ok(true)`: serving without auth on purpose; the shell warns at every start.
pub fn check_exposure(
    addr: std::net::SocketAddr,
    keys: &Keys,
    insecure_no_auth: bool,
) -> Result<bool, Exposed> {
    if keys.enabled() || addr.ip().is_loopback() {
        return Ok(false);
    }
    if insecure_no_auth {
        Ok(true)
    } else {
        Err(Exposed { addr })
    }
}

#[cfg(test)]
mod tests;
