//! Tokens for the clusters the harness starts (docs/security.md): a fresh set per cluster
//! directory (a peer token, a client and an operator `name token`, files 0600), the flags that
//! give them to a coordinator or participant, and the one function that builds the harness's
//! HTTP client (it sends the operator token, which every client route also takes).
//!
//! Authentication is on unless `TWOPC_HARNESS_AUTH=off`, so the tests run the secure path.
//! This module must never print a token, and never overwrite a token file it did not write.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use protocol::auth::{Kind, Token, TokenFileError};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};

/// The environment variable that turns the harness's tokens off (`off`).
pub const HARNESS_AUTH_ENV: &str = "TWOPC_HARNESS_AUTH";
/// The names in the generated client and operator files.
pub const CLIENT_NAME: &str = "client";
pub const OPERATOR_NAME: &str = "operator";
/// The file names in a token directory (also what `twopc tokens --out DIR` writes).
pub const PEER_FILE: &str = "peer.tokens";
pub const CLIENT_FILE: &str = "client.tokens";
pub const OPERATOR_FILE: &str = "operator.tokens";

/// Why a token set could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenSetError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} already exists; token files are never overwritten")]
    Exists(PathBuf),
    #[error(transparent)]
    File(#[from] TokenFileError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TokenSetError + '_ {
    move |source| TokenSetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether the harness starts its servers with tokens (`TWOPC_HARNESS_AUTH` is not `off`).
pub fn harness_auth() -> bool {
    std::env::var(HARNESS_AUTH_ENV).map_or(true, |v| !v.eq_ignore_ascii_case("off"))
}

/// A set of token files in one directory, with the secrets the harness's clients send.
/// `Debug` shows the paths only.
#[derive(Debug, Clone)]
pub struct TokenSet {
    pub dir: PathBuf,
    pub peer: Token,
    pub client: Token,
    pub operator: Token,
}

impl TokenSet {
    /// Writes a fresh set into `dir` (created if absent); refuses if any of its files exists.
    pub fn generate(dir: &Path) -> Result<TokenSet, TokenSetError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for name in [PEER_FILE, CLIENT_FILE, OPERATOR_FILE] {
            let path = dir.join(name);
            if path.exists() {
                return Err(TokenSetError::Exists(path));
            }
        }
        let set = TokenSet {
            dir: dir.to_path_buf(),
            peer: random_token()?,
            client: random_token()?,
            operator: random_token()?,
        };
        write_private(&set.path(Kind::Peer), &format!("{}\n", set.peer.expose()))?;
        write_private(
            &set.path(Kind::Client),
            &format!("{CLIENT_NAME} {}\n", set.client.expose()),
        )?;
        write_private(
            &set.path(Kind::Operator),
            &format!("{OPERATOR_NAME} {}\n", set.operator.expose()),
        )?;
        Ok(set)
    }

    /// Reads the set in `dir` (the first token of each file).
    pub fn open(dir: &Path) -> Result<TokenSet, TokenSetError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .map_err(io(&path))
                .map(|text| (path.display().to_string(), text))
        };
        let (file, text) = read(PEER_FILE)?;
        let peer = protocol::auth::parse_plain(&file, &text)?.remove(0);
        let (file, text) = read(CLIENT_FILE)?;
        let client = protocol::auth::parse_named(&file, &text)?.remove(0).token;
        let (file, text) = read(OPERATOR_FILE)?;
        let operator = protocol::auth::parse_named(&file, &text)?.remove(0).token;
        Ok(TokenSet {
            dir: dir.to_path_buf(),
            peer,
            client,
            operator,
        })
    }

    /// The set in `dir`: read if its peer file exists (a cluster started again on the same
    /// directory keeps its tokens), else freshly made.
    pub fn in_dir(dir: &Path) -> Result<TokenSet, TokenSetError> {
        if dir.join(PEER_FILE).exists() {
            TokenSet::open(dir)
        } else {
            TokenSet::generate(dir)
        }
    }

    /// The harness's set for a cluster under `dir` (in `dir/tokens`), or `None` when
    /// `TWOPC_HARNESS_AUTH=off`.
    pub fn for_harness(dir: &Path) -> Result<Option<TokenSet>, TokenSetError> {
        if harness_auth() {
            TokenSet::in_dir(&dir.join("tokens")).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The file of tokens of `kind` (client, operator or peer).
    pub fn path(&self, kind: Kind) -> PathBuf {
        self.dir.join(match kind {
            Kind::Client => CLIENT_FILE,
            Kind::Operator => OPERATOR_FILE,
            Kind::Peer | Kind::Metrics => PEER_FILE,
        })
    }

    /// The secret of `kind` (metrics has none here: `/metrics` stays open in the harness).
    pub fn token(&self, kind: Kind) -> &Token {
        match kind {
            Kind::Client => &self.client,
            Kind::Operator => &self.operator,
            Kind::Peer | Kind::Metrics => &self.peer,
        }
    }

    /// The flags that give a coordinator or participant these files (paths only: a token
    /// never goes on a command line).
    pub fn server_args(&self) -> Vec<String> {
        [
            ("--peer-token-file", Kind::Peer),
            ("--client-token-file", Kind::Client),
            ("--operator-token-file", Kind::Operator),
        ]
        .into_iter()
        .flat_map(|(flag, kind)| [flag.to_string(), self.path(kind).display().to_string()])
        .collect()
    }
}

/// Who the audit trail names for an operator action sent by a harness client with `tokens`
/// and `named` in its body: the operator token's holder when the servers check tokens (the
/// token wins over the body), else `named`.
pub fn audited_operator<'a>(tokens: Option<&TokenSet>, named: &'a str) -> &'a str {
    match tokens {
        Some(_) => OPERATOR_NAME,
        None => named,
    }
}

/// [`TokenSet::for_harness`] for tests: panics (failing the test) when the files cannot be made.
pub fn for_test(dir: &Path) -> Option<TokenSet> {
    TokenSet::for_harness(dir).unwrap_or_else(|e| panic!("cannot make the test's tokens: {e}"))
}

/// The token a harness caller presents on `url`: the peer token on the protocol routes
/// (`/2pc/`, `/saga/`, a decision query), the operator token everywhere else.
pub fn token_for_url<'a>(tokens: Option<&'a TokenSet>, url: &str) -> Option<&'a Token> {
    let peer = url.contains("/2pc/") || url.contains("/saga/") || url.contains("/decision");
    tokens.map(|t| if peer { &t.peer } else { &t.operator })
}

/// The harness's HTTP client builder: sends the operator token of `tokens` (if any) on every
/// request and follows no redirects. Callers add timeouts and build it.
pub fn http_client(tokens: Option<&TokenSet>) -> reqwest::ClientBuilder {
    http_client_as(tokens.map(|t| &t.operator))
}

/// [`http_client`] sending `token` (a test that calls as a client or a peer).
pub fn http_client_as(token: Option<&Token>) -> reqwest::ClientBuilder {
    let mut headers = HeaderMap::new();
    if let Some(value) = token.and_then(|t| HeaderValue::from_str(&t.bearer_header()).ok()) {
        let mut value = value;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .redirect(reqwest::redirect::Policy::none())
}

/// 32 random bytes from the kernel, hex: 64 characters.
fn random_token() -> Result<Token, TokenSetError> {
    let source = Path::new("/dev/urandom");
    let mut bytes = [0u8; 32];
    std::fs::File::open(source)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io(source))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Token::new(&hex).map_err(|e| TokenSetError::Io {
        path: source.to_path_buf(),
        source: std::io::Error::other(e),
    })
}

/// Creates `path` readable and writable by its owner only; fails if it exists.
fn write_private(path: &Path, text: &str) -> Result<(), TokenSetError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(text.as_bytes()).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_fresh_set_is_private_distinct_reusable_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let made = TokenSet::generate(dir.path()).unwrap();
        for kind in [Kind::Peer, Kind::Client, Kind::Operator] {
            let mode = std::fs::metadata(made.path(kind))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{kind:?}");
        }
        assert!(!made.peer.matches(made.client.expose()));
        assert!(!made.client.matches(made.operator.expose()));
        // The servers accept the files as they are.
        let files = protocol::auth::TokenFiles {
            client: Some(made.path(Kind::Client)),
            operator: Some(made.path(Kind::Operator)),
            peer: Some(made.path(Kind::Peer)),
            metrics: None,
        };
        let keys = files.load(|p| std::fs::read_to_string(p)).unwrap();
        let operator = keys
            .authorize(
                protocol::auth::Access::Operator,
                Some(&made.operator.bearer_header()),
            )
            .unwrap()
            .unwrap();
        assert_eq!(operator.name.as_deref(), Some(OPERATOR_NAME));

        assert!(matches!(
            TokenSet::generate(dir.path()),
            Err(TokenSetError::Exists(_))
        ));
        let again = TokenSet::in_dir(dir.path()).unwrap();
        assert!(again.operator.matches(made.operator.expose()));
        assert!(again.peer.matches(made.peer.expose()));

        let other = tempfile::tempdir().unwrap();
        let fresh = TokenSet::generate(other.path()).unwrap();
        assert!(!fresh.peer.matches(made.peer.expose()));
    }

    #[test]
    fn server_args_name_files_not_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let set = TokenSet::generate(dir.path()).unwrap();
        let args = set.server_args().join(" ");
        assert!(args.contains("--peer-token-file"), "{args}");
        assert!(args.contains("--operator-token-file"), "{args}");
        for kind in [Kind::Peer, Kind::Client, Kind::Operator] {
            assert!(!args.contains(set.token(kind).expose()));
        }
    }
}
