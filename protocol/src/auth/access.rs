//! Who may call what: the kinds of credential, the caller a token makes, and the classes of
//! route with the kinds each takes. Kept apart from the tokens so a route's rule reads alone.

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
    pub(super) fn takes(self, kind: Kind) -> bool {
        match self {
            Access::Open => true,
            Access::Metrics => kind == Kind::Metrics,
            Access::Client => matches!(kind, Kind::Client | Kind::Operator),
            Access::Peer => kind == Kind::Peer,
            Access::Operator => kind == Kind::Operator,
            Access::PeerOrOperator => matches!(kind, Kind::Peer | Kind::Operator),
        }
    }

    pub(super) fn describe(self) -> &'static str {
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
