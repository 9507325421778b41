//! The lease engine's rules, one by one (pure: time is an argument).

use super::*;
use protocol::lease::{LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN, Lease};

fn acquire(
    e: &mut LeaseEngine,
    name: &str,
    holder: &str,
    ttl_ms: u64,
    now_ms: u64,
) -> Vec<LeaseCommand> {
    e.step(LeaseEvent::Acquire {
        name: name.into(),
        holder: holder.into(),
        ttl_ms,
        now_ms,
    })
}

fn renew(
    e: &mut LeaseEngine,
    name: &str,
    holder: &str,
    token: u64,
    now_ms: u64,
) -> Vec<LeaseCommand> {
    e.step(LeaseEvent::Renew {
        name: name.into(),
        holder: holder.into(),
        token,
        now_ms,
    })
}

fn release(
    e: &mut LeaseEngine,
    name: &str,
    holder: &str,
    token: u64,
    now_ms: u64,
) -> Vec<LeaseCommand> {
    e.step(LeaseEvent::Release {
        name: name.into(),
        holder: holder.into(),
        token,
        now_ms,
    })
}

fn granted(commands: &[LeaseCommand]) -> Lease {
    match commands.last() {
        Some(LeaseCommand::Reply(LeaseReply::Granted(lease))) => lease.clone(),
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn records(commands: &[LeaseCommand]) -> Vec<LeaseRecord> {
    commands
        .iter()
        .filter_map(|c| match c {
            LeaseCommand::Append(r) => Some(r.clone()),
            LeaseCommand::Reply(_) => None,
        })
        .collect()
}

#[test]
fn a_grant_is_logged_before_it_is_answered() {
    let mut e = LeaseEngine::new();
    let commands = acquire(&mut e, "orders", "a", 5_000, 1_000);
    assert!(matches!(
        commands[0],
        LeaseCommand::Append(LeaseRecord::Granted(_))
    ));
    let lease = granted(&commands);
    assert_eq!(
        (lease.token, lease.ttl_ms, lease.expires_at_ms),
        (1, 5_000, 6_000)
    );
    assert_eq!(lease.holder, "a");
    assert_eq!(e.get("orders", 1_000).map(|l| l.token), Some(1));
}

#[test]
fn a_held_lease_is_refused_to_others_with_holder_and_time_left() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 5_000, 1_000);
    let commands = acquire(&mut e, "orders", "b", 5_000, 2_000);
    assert_eq!(
        commands,
        vec![LeaseCommand::Reply(LeaseReply::Held {
            holder: "a".into(),
            expires_in_ms: 4_000
        })]
    );
}

#[test]
fn the_holder_acquiring_again_renews_with_the_same_token() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 5_000, 1_000);
    let commands = acquire(&mut e, "orders", "a", 2_000, 3_000);
    assert!(matches!(
        commands[0],
        LeaseCommand::Append(LeaseRecord::Renewed(_))
    ));
    let lease = granted(&commands);
    assert_eq!(
        (lease.token, lease.expires_at_ms, lease.ttl_ms),
        (1, 5_000, 2_000)
    );
}

#[test]
fn renew_extends_and_a_wrong_holder_or_token_is_lost() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 5_000, 1_000);
    let lease = granted(&renew(&mut e, "orders", "a", 1, 4_000));
    assert_eq!(lease.expires_at_ms, 9_000);
    for commands in [
        renew(&mut e, "orders", "b", 1, 4_100),
        renew(&mut e, "orders", "a", 7, 4_100),
    ] {
        assert!(
            matches!(
                &commands[..],
                [LeaseCommand::Reply(LeaseReply::Lost { .. })]
            ),
            "{commands:?}"
        );
    }
}

#[test]
fn an_expired_lease_is_never_revived_and_the_next_owner_gets_a_higher_token() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 1_000, 0);
    // At exactly the expiry it no longer holds.
    assert_eq!(e.get("orders", 1_000), None);
    assert!(matches!(
        &renew(&mut e, "orders", "a", 1, 1_000)[..],
        [LeaseCommand::Reply(LeaseReply::Lost { .. })]
    ));
    let b = granted(&acquire(&mut e, "orders", "b", 1_000, 1_500));
    assert_eq!(b.token, 2);
    // A's late renew is lost, and names the superseding token.
    match &renew(&mut e, "orders", "a", 1, 1_600)[..] {
        [LeaseCommand::Reply(LeaseReply::Lost { reason })] => {
            assert!(reason.contains("token 2"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn release_is_idempotent_and_never_lowers_the_next_token() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 5_000, 0);
    let first = release(&mut e, "orders", "a", 1, 100);
    assert_eq!(
        records(&first),
        vec![LeaseRecord::Released {
            name: "orders".into(),
            token: 1
        }]
    );
    let again = release(&mut e, "orders", "a", 1, 200);
    assert!(records(&again).is_empty(), "a repeat logs nothing");
    match (&first[..], &again[..]) {
        (
            [_, LeaseCommand::Reply(LeaseReply::Released(one))],
            [LeaseCommand::Reply(LeaseReply::Released(two))],
        ) => {
            assert!(one.released && !two.released);
            assert_eq!((one.token, two.token), (1, 1));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        granted(&acquire(&mut e, "orders", "b", 5_000, 300)).token,
        2
    );
}

#[test]
fn release_under_the_current_token_by_someone_else_is_refused() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "orders", "a", 5_000, 0);
    assert!(matches!(
        &release(&mut e, "orders", "b", 1, 100)[..],
        [LeaseCommand::Reply(LeaseReply::Lost { .. })]
    ));
    assert_eq!(
        e.get("orders", 100).map(|l| l.holder),
        Some("a".to_string())
    );
}

#[test]
fn ttl_is_clamped_to_the_bounds() {
    let mut e = LeaseEngine::new();
    assert_eq!(
        granted(&acquire(&mut e, "x", "a", 1, 0)).ttl_ms,
        LEASE_TTL_MS_MIN
    );
    assert_eq!(
        granted(&acquire(&mut e, "y", "a", u64::MAX, 0)).ttl_ms,
        LEASE_TTL_MS_MAX
    );
}

#[test]
fn tokens_rise_for_ever_through_every_path() {
    let mut e = LeaseEngine::new();
    let mut last = 0;
    let mut now = 0;
    for round in 0..50u64 {
        let name = if round % 3 == 0 { "a" } else { "b" };
        let commands = acquire(&mut e, name, &format!("w{round}"), 100, now);
        if let Some(LeaseCommand::Reply(LeaseReply::Granted(lease))) = commands.last() {
            assert!(lease.token > last, "token {} after {last}", lease.token);
            last = lease.token;
            if round % 2 == 0 {
                release(&mut e, name, &lease.holder, lease.token, now + 1);
            }
        }
        now += 60 + round % 70;
        if round % 10 == 9 {
            // A restart from the records alone, and from a checkpoint.
            let snapshot = e.snapshot();
            e = LeaseEngine::recover(snapshot, [], now);
            now += 200;
        }
    }
    assert!(last >= 30, "enough grants happened: {last}");
}

/// Replays a run's records into a fresh engine, as recovery does.
fn restart(log: &[LeaseRecord], now_ms: u64) -> LeaseEngine {
    LeaseEngine::recover(LeaseSnapshot::default(), log.iter().cloned(), now_ms)
}

#[test]
fn after_a_restart_a_possibly_held_lease_holds_a_full_ttl_from_the_restart() {
    let mut e = LeaseEngine::new();
    let mut log = records(&acquire(&mut e, "orders", "a", 5_000, 1_000));
    // The restart comes 1 s later by the clock, which may have jumped: the lease (logged to
    // expire at 6 000) is held until 2 000 + 5 000.
    let mut e = restart(&log, 2_000);
    assert_eq!(e.get("orders", 6_500).map(|l| l.token), Some(1));
    assert!(matches!(
        &acquire(&mut e, "orders", "b", 5_000, 6_500)[..],
        [LeaseCommand::Reply(LeaseReply::Held { .. })]
    ));
    // Its holder may renew it: it was live when the log was last written.
    assert_eq!(granted(&renew(&mut e, "orders", "a", 1, 6_500)).token, 1);

    // A restart after a forward clock jump past the logged expiry: still held for a full TTL
    // since the restart, but never revived.
    log.push(LeaseRecord::Renewed(HeldLease {
        name: "orders".into(),
        holder: "a".into(),
        token: 1,
        ttl_ms: 5_000,
        expires_at_ms: 11_500,
        renewable: true,
    }));
    let mut e = restart(&log, 100_000);
    assert!(matches!(
        &acquire(&mut e, "orders", "b", 5_000, 104_999)[..],
        [LeaseCommand::Reply(LeaseReply::Held { .. })]
    ));
    assert!(matches!(
        &renew(&mut e, "orders", "a", 1, 101_000)[..],
        [LeaseCommand::Reply(LeaseReply::Lost { .. })]
    ));
    assert!(matches!(
        &acquire(&mut e, "orders", "a", 5_000, 101_000)[..],
        [LeaseCommand::Reply(LeaseReply::Held { .. })]
    ));
    let b = granted(&acquire(&mut e, "orders", "b", 5_000, 105_000));
    assert_eq!(b.token, 2);
}

#[test]
fn a_released_lease_is_free_at_once_after_a_restart_and_tokens_continue() {
    let mut e = LeaseEngine::new();
    let mut log = records(&acquire(&mut e, "orders", "a", 5_000, 0));
    log.extend(records(&acquire(&mut e, "other", "c", 5_000, 0)));
    log.extend(records(&release(&mut e, "orders", "a", 1, 10)));
    let mut e = restart(&log, 20);
    assert_eq!(e.last_token(), 2);
    assert_eq!(granted(&acquire(&mut e, "orders", "b", 5_000, 30)).token, 3);
}

#[test]
fn checkpoint_then_records_rebuild_the_same_state() {
    let mut e = LeaseEngine::new();
    acquire(&mut e, "a", "x", 5_000, 0);
    let snapshot = e.snapshot();
    let later = records(&acquire(&mut e, "b", "y", 5_000, 10));
    let rebuilt = LeaseEngine::recover(snapshot, later, 0);
    assert_eq!(rebuilt.last_token(), 2);
    assert_eq!(rebuilt.list(20).len(), 2);
    let decoded =
        serde_json::from_slice::<LeaseSnapshot>(&serde_json::to_vec(&e.snapshot()).unwrap())
            .unwrap();
    assert_eq!(decoded, e.snapshot());
    for record in later_records() {
        let back = LeaseRecord::decode(record.record_type(), &record.encode().unwrap());
        assert_eq!(back.unwrap().unwrap(), record);
    }
}

fn later_records() -> Vec<LeaseRecord> {
    let lease = HeldLease {
        name: "n".into(),
        holder: "h".into(),
        token: 4,
        ttl_ms: 100,
        expires_at_ms: 200,
        renewable: true,
    };
    vec![
        LeaseRecord::Granted(lease.clone()),
        LeaseRecord::Renewed(lease),
        LeaseRecord::Released {
            name: "n".into(),
            token: 4,
        },
    ]
}
