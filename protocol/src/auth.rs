//! Bearer tokens between the parties (issue 17, docs/security.md): the token file formats, the
//! constant-time check, who a presented token makes the caller, and which kinds of caller each
//! class of route takes.
//!
//! Both servers use this one implementation; each shell reads the files (it passes a reader in)
//! and reloads them on SIGHUP into a [`KeyRing`]. This module must never do I/O itself, never
//! print a token (every `Debug` here is redacted), and never compare a token with `==`.

mod access;
mod header;
mod keys;
mod token;
mod token_file;

pub use access::{Access, Caller, Denied, Kind};
pub use header::encode_base64;
pub use keys::{KeyRing, Keys};
pub use token::{
    NamedToken, TOKEN_CHARS_MAX, TOKEN_CHARS_MIN, Token, TokenError, constant_time_eq,
};
pub use token_file::{TokenFileError, TokenFiles, parse_named, parse_plain};

/// The realm named in `WWW-Authenticate` challenges.
pub const REALM: &str = "twopc";

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
