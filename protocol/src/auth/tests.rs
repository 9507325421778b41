use std::path::Path;

use super::header::decode_base64;
use super::*;

const ALICE: &str = "alice-token-0123456789";
const OPS: &str = "operator-token-0123456789";
const PEER_NEW: &str = "peer-token-new-0123456789";
const PEER_OLD: &str = "peer-token-old-0123456789";

fn keys() -> Keys {
    Keys {
        client: Some(parse_named("clients", &format!("# clients\n\nalice {ALICE}\n")).unwrap()),
        operator: Some(parse_named("operators", &format!("ops {OPS}")).unwrap()),
        peer: Some(parse_plain("peers", &format!("{PEER_NEW}\n{PEER_OLD}\n")).unwrap()),
        metrics: None,
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn files_parse_with_comments_and_names() {
    let named = parse_named("f", &format!("# c\n\n  alice {ALICE}  \nops {OPS}\n")).unwrap();
    assert_eq!(named.len(), 2);
    assert_eq!(named[0].name, "alice");
    assert!(named[1].token.matches(OPS));
    let plain = parse_plain(
        "p",
        &format!("{PEER_NEW}\n# old one, until rotated\n{PEER_OLD}"),
    )
    .unwrap();
    assert!(
        plain[0].matches(PEER_NEW),
        "the first token is the one sent"
    );
}

#[test]
fn bad_files_are_refused_with_the_line_and_never_the_token() {
    let short = parse_named("clients.txt", "alice short").unwrap_err();
    assert!(
        matches!(short, TokenFileError::Token { line: 1, .. }),
        "{short}"
    );
    assert!(short.to_string().contains("at least 16"), "{short}");
    let duplicate = parse_named("c", &format!("alice {ALICE}\n\nbob {ALICE}\n")).unwrap_err();
    assert_eq!(
        duplicate,
        TokenFileError::Duplicate {
            file: "c".into(),
            line: 3,
            first: 1
        }
    );
    assert!(!duplicate.to_string().contains(ALICE));
    assert!(matches!(
        parse_named("c", ALICE).unwrap_err(),
        TokenFileError::Syntax { line: 1, .. }
    ));
    assert!(matches!(
        parse_named("c", &format!("a b {ALICE}")).unwrap_err(),
        TokenFileError::Syntax { .. }
    ));
    assert!(matches!(
        parse_named("c", &format!("al/ice {ALICE}")).unwrap_err(),
        TokenFileError::Name { .. }
    ));
    assert!(matches!(
        parse_plain("p", &format!("{PEER_NEW}\n{PEER_NEW}")).unwrap_err(),
        TokenFileError::Duplicate {
            line: 2,
            first: 1,
            ..
        }
    ));
    assert!(matches!(
        parse_plain("p", "# nothing\n\n").unwrap_err(),
        TokenFileError::Empty { .. }
    ));
}

#[test]
fn a_token_in_two_files_is_refused() {
    let files = TokenFiles {
        client: Some("clients".into()),
        peer: Some("peers".into()),
        ..TokenFiles::default()
    };
    let error = files
        .load(|path| {
            Ok(if path == Path::new("clients") {
                format!("alice {ALICE}")
            } else {
                ALICE.to_string()
            })
        })
        .unwrap_err();
    assert!(matches!(error, TokenFileError::Shared { .. }), "{error}");
}

#[test]
fn debug_never_shows_a_secret() {
    let keys = keys();
    let text = format!("{keys:?} {:?} {:?}", keys.peer, KeyRing::new(keys.clone()));
    for secret in [ALICE, OPS, PEER_NEW, PEER_OLD] {
        assert!(!text.contains(secret), "{text}");
    }
}

#[test]
fn constant_time_eq_is_equality() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
    assert!(constant_time_eq(b"", b""));
}

#[test]
fn each_route_class_takes_its_kinds() {
    let keys = keys();
    let client = bearer(ALICE);
    let operator = bearer(OPS);
    let peer = bearer(PEER_OLD);
    let ok = |access, header: &str| keys.authorize(access, Some(header));
    assert_eq!(
        ok(Access::Client, &client)
            .unwrap()
            .unwrap()
            .name
            .as_deref(),
        Some("alice")
    );
    assert_eq!(
        ok(Access::Client, &operator).unwrap().unwrap().kind,
        Kind::Operator
    );
    assert!(matches!(
        ok(Access::Client, &peer),
        Err(Denied::Forbidden(_))
    ));
    assert!(matches!(
        ok(Access::Operator, &client),
        Err(Denied::Forbidden(_))
    ));
    assert_eq!(ok(Access::Peer, &peer).unwrap().unwrap().kind, Kind::Peer);
    assert!(matches!(
        ok(Access::Peer, &operator),
        Err(Denied::Forbidden(_))
    ));
    assert!(ok(Access::PeerOrOperator, &operator).is_ok());
    assert!(ok(Access::PeerOrOperator, &peer).is_ok());
    assert!(matches!(
        ok(Access::PeerOrOperator, &client),
        Err(Denied::Forbidden(_))
    ));
    assert_eq!(keys.authorize(Access::Open, None), Ok(None));
    assert_eq!(
        keys.authorize(Access::Metrics, None),
        Ok(None),
        "no metrics file: open"
    );
    for access in [Access::Client, Access::Peer, Access::Operator] {
        assert!(matches!(
            keys.authorize(access, None),
            Err(Denied::Unauthorized(_))
        ));
        assert!(matches!(
            ok(access, &bearer("wrong-token-0123456789")),
            Err(Denied::Unauthorized(_))
        ));
        assert!(matches!(
            ok(access, "Token abc"),
            Err(Denied::Unauthorized(_))
        ));
    }
}

#[test]
fn basic_credentials_carry_the_token_as_password() {
    let keys = keys();
    let basic = format!(
        "Basic {}",
        encode_base64(format!("anyone:{OPS}").as_bytes())
    );
    let caller = keys
        .authorize(Access::Operator, Some(&basic))
        .unwrap()
        .unwrap();
    assert_eq!(
        caller.name.as_deref(),
        Some("ops"),
        "the file's name counts"
    );
    assert!(matches!(
        keys.authorize(Access::Operator, Some("Basic !!!!")),
        Err(Denied::Unauthorized(_))
    ));
}

#[test]
fn base64_round_trips() {
    for text in [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "ops:operator-token-0123456789",
    ] {
        let encoded = encode_base64(text.as_bytes());
        if text.is_empty() {
            assert_eq!(encoded, "");
            continue;
        }
        assert_eq!(
            decode_base64(&encoded).unwrap(),
            text.as_bytes(),
            "{encoded}"
        );
    }
    assert_eq!(encode_base64(b"ab"), "YWI=");
    assert!(decode_base64("YW=I").is_none());
}

#[test]
fn metrics_tokens_close_metrics_only() {
    let keys = Keys {
        metrics: Some(parse_plain("m", "metrics-token-0123456789").unwrap()),
        ..Keys::default()
    };
    assert!(
        !keys.enabled(),
        "a metrics file alone does not turn auth on"
    );
    assert_eq!(keys.authorize(Access::Client, None), Ok(None));
    assert!(matches!(
        keys.authorize(Access::Metrics, None),
        Err(Denied::Unauthorized(_))
    ));
    assert!(
        keys.authorize(Access::Metrics, Some("Bearer metrics-token-0123456789"))
            .is_ok()
    );
}

#[test]
fn auth_off_opens_everything_and_a_ring_swaps_whole_sets() {
    let ring = KeyRing::default();
    assert_eq!(ring.current().authorize(Access::Operator, None), Ok(None));
    assert_eq!(ring.peer_authorization(), None);
    ring.replace(keys());
    assert_eq!(ring.peer_authorization(), Some(bearer(PEER_NEW)));
    assert!(ring.current().authorize(Access::Operator, None).is_err());
    assert_eq!(ring.clone(), ring, "clones share the set");
}

#[test]
fn exposure_needs_tokens_or_the_insecure_flag() {
    let public: std::net::SocketAddr = "0.0.0.0:7100".parse().unwrap();
    let loopback: std::net::SocketAddr = "127.0.0.1:7100".parse().unwrap();
    let none = Keys::default();
    assert_eq!(check_exposure(loopback, &none, false), Ok(false));
    assert!(check_exposure(public, &none, false).is_err());
    assert_eq!(check_exposure(public, &none, true), Ok(true));
    assert_eq!(check_exposure(public, &keys(), false), Ok(false));
}

#[test]
fn a_half_configured_key_set_names_the_kinds_without_a_file() {
    assert!(Keys::default().kinds_missing().is_empty(), "auth off");
    assert!(keys().kinds_missing().is_empty(), "all configured");
    let only_peers = Keys {
        peer: keys().peer,
        ..Keys::default()
    };
    assert_eq!(
        only_peers.kinds_missing(),
        vec![Kind::Client, Kind::Operator]
    );
}
