use super::*;

fn file(json: &str) -> FileConfig {
    serde_json::from_str(json).unwrap()
}

#[test]
fn defaults_fill_what_is_missing() {
    let config = file(r#"{"data_dir": "/tmp/x", "participants": {"a": "http://127.0.0.1:9"}}"#)
        .into_config()
        .unwrap();
    assert_eq!(config.listen.to_string(), defaults::LISTEN);
    assert_eq!(config.prepare_timeout_ms, defaults::PREPARE_TIMEOUT_MS);
    assert_eq!(config.retention_ms, defaults::RETENTION_MS);
    assert_eq!(config.wal_fill_ahead_bytes, wal::FILL_AHEAD_BYTES);
    assert!(config.fsync);
}

#[test]
fn the_logs_fill_ahead_comes_from_the_file_or_a_flag() {
    let json =
        r#"{"data_dir": "/a", "participants": {"a": "http://h:1"}, "wal_fill_ahead_bytes": 0}"#;
    assert_eq!(file(json).into_config().unwrap().wal_fill_ahead_bytes, 0);
    let base = file(json);
    let flags = FileConfig {
        wal_fill_ahead_bytes: Some(1 << 20),
        ..FileConfig::default()
    };
    let config = base.overlay(flags).into_config().unwrap();
    assert_eq!(config.wal_fill_ahead_bytes, 1 << 20);
}

#[test]
fn flags_override_the_file() {
    let base = file(
        r#"{"data_dir": "/a", "prepare_timeout_ms": 10, "participants": {"a": "http://h:1", "b": "http://h:2"}}"#,
    );
    let flags = FileConfig {
        data_dir: Some("/b".into()),
        participants: [("b".to_string(), "http://h:3".to_string())].into(),
        ..FileConfig::default()
    };
    let config = base.overlay(flags).into_config().unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/b"));
    assert_eq!(config.prepare_timeout_ms, 10);
    let b = ParticipantName::new("b").unwrap();
    assert_eq!(config.participants[&b], "http://h:3");
    assert_eq!(config.participants.len(), 2);
}

#[test]
fn bad_configs_are_refused_with_reason() {
    let cases = [
        (r#"{"participants": {"a": "http://h:1"}}"#, "data-dir"),
        (r#"{"data_dir": "/x"}"#, "no participants"),
        (
            r#"{"data_dir": "/x", "participants": {"a b": "http://h:1"}}"#,
            "participant name",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "https://h:1"}}"#,
            "--tls-ca",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "ftp://h:1"}}"#,
            "http://host:port",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "tls_cert": "/c.pem"}"#,
            "both or neither",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "tls_key": "/k.pem"}"#,
            "both or neither",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "https://h:1"}, "tls_ca": "/no/ca.pem"}"#,
            "/no/ca.pem",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1/path"}}"#,
            "http://host:port",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h"}}"#,
            "http://host:port",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "prepare_timeout_ms": 0}"#,
            "prepare_timeout_ms",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "retry_base_ms": 500, "retry_max_ms": 100}"#,
            "retry_max_ms",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "listen": "nope"}"#,
            "listen",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "connections_max": 0}"#,
            "--connections-max",
        ),
        (
            r#"{"data_dir": "/x", "participants": {"a": "http://h:1"}, "wal_fill_ahead_bytes": 67108865}"#,
            "wal_fill_ahead_bytes",
        ),
    ];
    for (json, needle) in cases {
        let err = file(json).into_config().unwrap_err().to_string();
        assert!(err.contains(needle), "{json}: {err}");
    }
    assert!(serde_json::from_str::<FileConfig>(r#"{"bogus": 1}"#).is_err());
    assert!(parse_participant("noequals").is_err());
    assert_eq!(
        parse_participant("a=http://h:1").unwrap(),
        ("a".to_string(), "http://h:1".to_string())
    );
}

#[test]
fn trailing_slash_is_trimmed() {
    let config = file(r#"{"data_dir": "/x", "participants": {"a": "http://h:1/"}}"#)
        .into_config()
        .unwrap();
    assert_eq!(config.participants.values().next().unwrap(), "http://h:1");
}
