//! The secret itself: what a token may look like, and the one way tokens are compared
//! (constant time), so no other module ever needs to touch the bytes or print them.

use std::fmt;

/// Shortest token accepted: shorter ones are guessable.
pub const TOKEN_CHARS_MIN: usize = 16;
/// Longest token accepted (and longest header value looked at).
pub const TOKEN_CHARS_MAX: usize = 4096;

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
