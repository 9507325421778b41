//! The tokens a server holds and the decision on each request (which kind of caller its
//! token makes, and whether the route takes that kind), plus the ring that swaps the set whole
//! on reload.

use std::fmt;
use std::sync::{Arc, RwLock};

use super::access::{Access, Caller, Denied, Kind};
use super::header::presented_token;
use super::token::{NamedToken, Token};

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
                "the {} token may not call this route; it takes {}",
                caller.kind.as_str(),
                access.describe()
            )))
        }
    }
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
