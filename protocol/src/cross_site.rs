//! What keeps a web page on another site from using a browser to act on a twopc server
//! (docs/security.md, "Browsers"): the rules both servers apply to every request before its
//! token is checked.
//!
//! - A state-changing request (POST, PUT, PATCH, DELETE) whose `Origin` is not the server's
//!   own (same host and port as `Host`) is refused: 403 `forbidden_origin`. A browser sends
//!   `Origin` with every cross-site POST, so a form on evil.example cannot submit, retry or
//!   resolve with the credentials the browser holds for `/ui`.
//! - A state-changing request must send its body as `application/json` (415
//!   `unsupported_media_type`): the only content types a cross-site page can send without a
//!   CORS preflight are form encodings and `text/plain`. A request with no body may omit the
//!   content type, but may not name another one.
//! - A server on a loopback address with no tokens (the no-auth default) answers only `Host`
//!   names that are loopback (`localhost`, `127.0.0.1`, `[::1]`, any port): 403
//!   `forbidden_host`. A page that rebinds its own name to 127.0.0.1 (DNS rebinding) is then
//!   same-origin with the server, and only the `Host` it sends (its own name) gives it away.
//!
//! Pure functions over header text; each server's middleware hands them the headers.

use crate::{ErrorBody, ErrorCode};

/// What the rules look at in one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts<'a> {
    /// The method is POST, PUT, PATCH or DELETE.
    pub state_changing: bool,
    /// The `Host` header (or the authority of an absolute-form target).
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// The request has a body (a non-zero or unknown length).
    pub has_body: bool,
}

/// Whether `method` changes state: the methods a refusal here applies to.
pub fn is_state_changing(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH" | "DELETE")
}

/// Checks `facts`. `loopback_only`: the server listens on a loopback address without tokens,
/// so only loopback `Host` names are answered. The refusal is the answer's body.
pub fn check(facts: &RequestFacts<'_>, loopback_only: bool) -> Result<(), ErrorBody> {
    // A request without `Host` is no browser's (every browser sends one); nothing to check.
    if loopback_only
        && let Some(host) = facts.host
        && !is_loopback_host(host)
    {
        return Err(ErrorBody::new(
            ErrorCode::ForbiddenHost,
            format!(
                "Host {host:?} is not a loopback name; this server runs without tokens on a \
                 loopback address and answers only localhost, 127.0.0.1 or [::1] (give token \
                 files to serve other names)"
            ),
        ));
    }
    if !facts.state_changing {
        return Ok(());
    }
    if let Some(origin) = facts.origin
        && !facts.host.is_some_and(|host| same_origin(origin, host))
    {
        return Err(ErrorBody::new(
            ErrorCode::ForbiddenOrigin,
            format!(
                "Origin {origin:?} is not this server's own; a page from another site may not \
                 change anything here"
            ),
        ));
    }
    match facts.content_type {
        Some(content_type) if !is_json(content_type) => Err(ErrorBody::new(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Type {content_type:?}: send the body as application/json"),
        )),
        None if facts.has_body => Err(ErrorBody::new(
            ErrorCode::UnsupportedMediaType,
            "a body without Content-Type: send it as application/json",
        )),
        _ => Ok(()),
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Whether `host` (a `Host` value: a name or address, with or without a port) names this
/// machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let (name, _) = split_port(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the serialized `origin` (`scheme://host[:port]`) names the same host and port as
/// `host`. A default port (80 for http, 443 for https) counts as no port, on either side: the
/// browser leaves it out of `Origin`, and a client may leave it out of `Host`.
pub fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        // `null` (a sandboxed page, a file) and anything else malformed.
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let normal = |value: &str| {
        let (name, port) = split_port(value);
        let port = port.filter(|p| *p != default_port);
        (name.to_ascii_lowercase(), port.map(str::to_string))
    };
    !authority.is_empty() && !authority.contains('/') && normal(authority) == normal(host)
}

/// `name[:port]` or `[v6][:port]` into the name and the port.
fn split_port(value: &str) -> (&str, Option<&str>) {
    if value.starts_with('[') {
        return match value.find(']') {
            Some(end) => {
                let port = value[end + 1..].strip_prefix(':');
                (&value[..=end], port)
            }
            None => (value, None),
        };
    }
    match value.rsplit_once(':') {
        // A bare IPv6 address is not a valid Host; treat its colons as no port.
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (value, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post<'a>(host: &'a str, origin: Option<&'a str>, ct: Option<&'a str>) -> RequestFacts<'a> {
        RequestFacts {
            state_changing: true,
            host: Some(host),
            origin,
            content_type: ct,
            has_body: ct.is_some(),
        }
    }

    fn code(result: Result<(), ErrorBody>) -> Option<ErrorCode> {
        result.err().map(|body| body.error)
    }

    #[test]
    fn loopback_names_are_loopback_and_others_are_not() {
        for host in [
            "localhost",
            "LOCALHOST:7100",
            "localhost.",
            "127.0.0.1",
            "127.0.0.1:7100",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:7100",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7100",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:7100",
            "[::2]:7100",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn same_origin_is_same_host_and_port() {
        assert!(same_origin("http://127.0.0.1:7100", "127.0.0.1:7100"));
        assert!(same_origin("http://LocalHost:7100", "localhost:7100"));
        assert!(same_origin("https://ops.example", "ops.example:443"));
        assert!(same_origin("http://ops.example", "ops.example"));
        assert!(same_origin("http://[::1]:7100", "[::1]:7100"));
        assert!(!same_origin("https://evil.example", "127.0.0.1:7100"));
        assert!(!same_origin("http://127.0.0.1:7101", "127.0.0.1:7100"));
        assert!(!same_origin("http://127.0.0.1", "127.0.0.1:7100"));
        assert!(!same_origin("null", "127.0.0.1:7100"));
        assert!(!same_origin("file://", "127.0.0.1:7100"));
        assert!(!same_origin("ftp://127.0.0.1:7100", "127.0.0.1:7100"));
    }

    #[test]
    fn a_cross_site_post_is_refused_and_a_same_origin_one_is_not() {
        let host = "127.0.0.1:7100";
        let evil = Some("https://evil.example");
        let form = Some("application/x-www-form-urlencoded");
        let json = Some("application/json; charset=utf-8");
        assert_eq!(
            code(check(&post(host, evil, form), false)),
            Some(ErrorCode::ForbiddenOrigin)
        );
        assert_eq!(
            code(check(&post(host, evil, json), false)),
            Some(ErrorCode::ForbiddenOrigin)
        );
        let own = Some("http://127.0.0.1:7100");
        assert_eq!(code(check(&post(host, own, json), true)), None);
        assert_eq!(code(check(&post(host, None, json), true)), None);
        // A GET from another site changes nothing and reads nothing a browser would show it.
        let get = RequestFacts {
            state_changing: false,
            ..post(host, evil, None)
        };
        assert_eq!(code(check(&get, false)), None);
    }

    #[test]
    fn a_write_must_be_json_or_have_no_body() {
        let host = "127.0.0.1:7100";
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert_eq!(
                code(check(&post(host, None, Some(ct)), false)),
                Some(ErrorCode::UnsupportedMediaType),
                "{ct}"
            );
            // An empty body with a form's content type is what a cross-site form sends.
            let empty = RequestFacts {
                has_body: false,
                ..post(host, None, Some(ct))
            };
            assert_eq!(
                code(check(&empty, false)),
                Some(ErrorCode::UnsupportedMediaType)
            );
        }
        let untyped_body = RequestFacts {
            has_body: true,
            ..post(host, None, None)
        };
        assert_eq!(
            code(check(&untyped_body, false)),
            Some(ErrorCode::UnsupportedMediaType)
        );
        assert_eq!(code(check(&post(host, None, None), false)), None);
        assert!(is_json("Application/JSON"));
        assert!(!is_json("application/jsonp"));
    }

    #[test]
    fn the_host_rule_holds_only_for_a_loopback_server_without_tokens() {
        let rebound = RequestFacts {
            host: Some("evil.example:7100"),
            ..RequestFacts::default()
        };
        assert_eq!(code(check(&rebound, true)), Some(ErrorCode::ForbiddenHost));
        assert_eq!(code(check(&rebound, false)), None);
        assert_eq!(code(check(&RequestFacts::default(), true)), None);
    }

    #[test]
    fn methods_that_change_state() {
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            assert!(is_state_changing(method));
        }
        for method in ["GET", "HEAD", "OPTIONS"] {
            assert!(!is_state_changing(method));
        }
    }
}
