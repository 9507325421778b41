use protocol::{CoordinatorId, Epoch, Incarnation, ParticipantName, VoteKind};

use crate::digest::Digest;

use super::*;

fn name(s: &str) -> ParticipantName {
    ParticipantName::new(s).unwrap()
}

fn identity() -> EpochRecord {
    EpochRecord {
        coordinator_id: CoordinatorId::new("c-1").unwrap(),
        epoch: Epoch(3),
        incarnation: Incarnation(0xfeed),
    }
}

#[test]
fn every_record_round_trips_with_its_type() {
    let txid = TxId::new("t-1").unwrap();
    let attempt = Attempt::new(&identity().coordinator_id, Incarnation(0xfeed), 7);
    let decision = DecisionRecord {
        txid: txid.clone(),
        attempt: attempt.clone(),
        digest: Digest(42),
        decision: Decision::Commit,
        reason: None,
        votes: vec![(name("a"), VoteKind::Yes), (name("b"), VoteKind::Yes)],
        created_at_ms: 1,
        decided_at_ms: 2,
        client: Some("shop".to_string()),
    };
    let records = [
        LogRecord::Epoch(identity()),
        LogRecord::Begin(BeginRecord {
            txid: txid.clone(),
            attempt,
            digest: Digest(42),
            participants: vec![name("a"), name("b")],
            created_at_ms: 1,
            client: Some("shop".to_string()),
        }),
        LogRecord::Decision(decision.clone()),
        LogRecord::Ack(AckRecord {
            txid: txid.clone(),
            participant: name("a"),
        }),
        LogRecord::End(EndRecord {
            txid,
            ended_at_ms: 9,
        }),
        LogRecord::Behind(BehindRecord {
            evidence: "inventory: incarnation_conflict".into(),
            at_ms: 10,
        }),
        LogRecord::Audit(AuditEntry {
            seq: 1,
            at_ms: 11,
            operator: "ana".into(),
            reason: "inventory came back".into(),
            action: protocol::operator::AuditAction::RetryParticipant {
                participant: name("a"),
                retried: 2,
            },
        }),
    ];
    for (i, record) in records.iter().enumerate() {
        let back = LogRecord::decode(i as u64, record.record_type(), &record.encode()).unwrap();
        assert_eq!(&back, record);
    }
    let snapshot = Snapshot {
        identity: identity(),
        runs: vec![RunSpan {
            incarnation: Incarnation(0xfeed),
            epoch: Epoch(3),
            reach: 7,
        }],
        begun: vec![],
        decided: vec![LiveDecided {
            decision: decision.clone(),
            acked: vec![name("a")],
        }],
        behind: None,
        retained: vec![Retained {
            decision,
            ended_at_ms: 5,
        }],
        resolved: vec![ResolvedAttempt {
            gtid: attempt_gtid(),
            txid: TxId::new("t-0").unwrap(),
            decision: Decision::Abort,
            audit_seq: 1,
            at_ms: 4,
            operator: "ana".into(),
            reason: "restore".into(),
        }],
        audit: vec![],
        audit_next_seq: 2,
        hand_resolved_sagas: vec![],
        sagas: vec![],
        leases: LeaseSnapshot {
            last_token: 9,
            held: vec![],
        },
    };
    assert_eq!(Snapshot::decode(&snapshot.encode()).unwrap(), snapshot);
}

fn attempt_gtid() -> GlobalTxId {
    GlobalTxId::new("c-1:000000000000feed:3").unwrap()
}

#[test]
fn an_attempt_is_logged_with_its_global_id_and_position() {
    let attempt = Attempt::new(&identity().coordinator_id, Incarnation(0xfeed), 7);
    assert_eq!(attempt.gtid.as_str(), "c-1:000000000000feed:7");
    let bytes = LogRecord::Epoch(identity()).encode();
    assert!(
        String::from_utf8_lossy(&bytes).contains("\"incarnation\":\"000000000000feed\""),
        "the run's incarnation is in its epoch record"
    );
    // A log written before attempts existed does not decode: it is refused, not guessed.
    let old = br#"{"txid":"t","digest":"0000000000000000000000000000002a","participants":[],"created_at_ms":1}"#;
    assert!(LogRecord::decode(3, record_type::BEGIN, old).is_err());
}

#[test]
fn wrong_type_or_garbage_is_an_error_not_a_guess() {
    let ack = LogRecord::Ack(AckRecord {
        txid: TxId::new("t").unwrap(),
        participant: name("a"),
    });
    assert!(matches!(
        LogRecord::decode(7, record_type::DECISION, &ack.encode()),
        Err(DecodeError::BadPayload { seq: 7, .. })
    ));
    assert!(matches!(
        LogRecord::decode(8, 99, b"{}"),
        Err(DecodeError::UnknownType {
            seq: 8,
            record_type: 99
        })
    ));
    assert!(Snapshot::decode(b"not json").is_err());
}
