//! The token files: their two formats, the checks that refuse a file before any of it is in
//! force (bad lines, duplicates, one token in two files), and loading a server's set of them.
//! The shell does the reading; this module only judges the text.

use std::path::{Path, PathBuf};

use super::keys::Keys;
use super::token::{NamedToken, Token, TokenError};

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

// Here, not with `Keys`: a token in two files is a fault of the files, found as they load.
impl Keys {
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
