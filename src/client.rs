//! The one place the `twopc` command builds its HTTP clients (ctl, lease-worker, audit, bench,
//! demo): the `--token-file` flag they share and the client that sends its token on every
//! request, and `--tls-ca`, the only CA whose certificates an `https://` server may show. Every
//! client follows the outbound policy of `net::outbound`: no redirects, bounded connect time,
//! and no proxy from the environment.
//!
//! This module must never print or log a token; errors name the file and line, not its text.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use protocol::auth::Token;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};

/// How our commands reach the servers.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientArgs {
    /// A file with the token to send (`Authorization: Bearer`): a client or operator token
    /// file (`name token`) or a file holding just the token. Its first line that is not blank
    /// or a `#` comment is used. Without it no token is sent.
    #[arg(long, value_name = "FILE", env = "TWOPC_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM certificate(s) of the CA that https:// servers' certificates must come from;
    /// nothing else is trusted (without it, https:// URLs fail).
    #[arg(long, value_name = "FILE", env = "TWOPC_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
}

impl ClientArgs {
    /// What a caller of a cluster we started sends: its operator token (operators may do
    /// what clients do), or nothing when it runs without authentication.
    pub fn for_cluster(tokens: Option<&cluster::auth::TokenSet>) -> ClientArgs {
        tokens.map_or_else(ClientArgs::default, |t| {
            ClientArgs::with_token_file(&t.path(protocol::auth::Kind::Operator))
        })
    }

    /// Arguments that send the token in `file`.
    pub fn with_token_file(file: &Path) -> ClientArgs {
        ClientArgs {
            token_file: Some(file.to_path_buf()),
            ..ClientArgs::default()
        }
    }

    /// The TLS configuration of `--tls-ca` (none given: none).
    pub fn tls(&self) -> Result<Option<Arc<net::rustls::ClientConfig>>> {
        Ok(self.tls_ca.as_deref().map(net::client_config).transpose()?)
    }
}

/// Most bytes of one answer `twopc ctl` and `twopc lease-worker` read: far above any answer a
/// coordinator gives (`ctl list` is bounded by `--limit`), far below what would hurt.
pub const ANSWER_BYTES_MAX: usize = 16 << 20;

/// A client builder with everything `args` asks for; callers add their own timeouts and
/// pool sizes and build it.
pub fn builder(args: &ClientArgs) -> Result<reqwest::ClientBuilder> {
    let mut headers = HeaderMap::new();
    if let Some(file) = &args.token_file {
        let token = read_token(file)?;
        let mut value = HeaderValue::from_str(&token.bearer_header()).with_context(|| {
            format!("{}: the token is not a valid header value", file.display())
        })?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    // No proxy from HTTP_PROXY/HTTPS_PROXY/ALL_PROXY: the bearer token would go to whoever
    // runs it (over plain HTTP, readable), and these commands talk to servers named outright.
    let builder = reqwest::Client::builder()
        .default_headers(headers)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(net::outbound::CONNECT_TIMEOUT)
        .no_proxy();
    Ok(net::outbound::with_tls(builder, args.tls()?)?)
}

/// The client `args` asks for, with a total time limit per request.
pub fn build(args: &ClientArgs, timeout: std::time::Duration) -> Result<reqwest::Client> {
    Ok(builder(args)?.timeout(timeout).build()?)
}

/// The token of a token file: the first line that is not blank or a comment, either `name
/// token` or the token alone.
pub fn read_token(file: &Path) -> Result<Token> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the token file {}", file.display()))?;
    token_of(&text).with_context(|| format!("token file {}", file.display()))
}

fn token_of(text: &str) -> Result<Token> {
    let Some((number, line)) = text
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .find(|(_, line)| !line.is_empty() && !line.starts_with('#'))
    else {
        bail!("holds no token");
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let token = match words.as_slice() {
        [token] | [_, token] => *token,
        _ => bail!("line {number}: expected `name token` or a token"),
    };
    Token::new(token).with_context(|| format!("line {number}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TOKEN: &str = "0123456789abcdef0123";

    #[test]
    fn a_named_or_plain_file_gives_its_first_token() {
        let named = format!("# operators\n\nalice {TOKEN}\nbob other-token-0000000\n");
        assert!(token_of(&named).unwrap().matches(TOKEN));
        assert!(token_of(&format!("{TOKEN}\n")).unwrap().matches(TOKEN));
    }

    #[test]
    fn a_bad_file_is_refused_without_quoting_it() {
        assert!(token_of("# nothing\n\n").is_err());
        let three = token_of(&format!("a b {TOKEN}")).unwrap_err();
        assert!(!format!("{three:#}").contains(TOKEN), "{three:#}");
        let short = token_of("alice short").unwrap_err();
        assert!(format!("{short:#}").contains("line 1"), "{short:#}");
        assert!(!format!("{short:#}").contains("short"), "{short:#}");
    }

    /// Serves one request on a loopback port and hands back what it received.
    fn one_request_server() -> (String, std::thread::JoinHandle<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let served = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut received = Vec::new();
            let mut buffer = [0u8; 4096];
            while !received.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buffer).unwrap();
                assert!(n > 0, "the client closed before its headers ended");
                received.extend_from_slice(&buffer[..n]);
            }
            let answer = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
            stream.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&received).to_lowercase()
        });
        (url, served)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_client_sends_the_token_as_a_bearer_header() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, format!("ops {TOKEN}\n")).unwrap();
        let client = build(&ClientArgs::with_token_file(&file), Duration::from_secs(5)).unwrap();
        let (url, served) = one_request_server();
        client.get(&url).send().await.unwrap();
        let received = served.join().unwrap();
        assert!(
            received.contains(&format!("authorization: bearer {}", TOKEN.to_lowercase())),
            "{received}"
        );

        let none = build(&ClientArgs::default(), Duration::from_secs(5)).unwrap();
        let (url, served) = one_request_server();
        none.get(&url).send().await.unwrap();
        assert!(!served.join().unwrap().contains("authorization"));
    }
}
