//! The fence table's tests, beside it: the highest-token rule, first answers, resets, retention and snapshots.

use super::*;
use serde_json::json;

fn claim(token: u64) -> FenceClaim {
    FenceClaim::unproven("orders", token)
}

fn open() -> FencePolicy {
    FencePolicy {
        keys: None,
        jump_max: u64::MAX,
    }
}

fn stale(token: u64, highest: u64) -> FenceRefusal {
    FenceRefusal::Stale(StaleToken {
        resource: "orders".into(),
        token,
        highest,
    })
}

#[test]
fn lower_tokens_are_stale_equal_and_higher_pass_and_highest_never_falls() {
    let mut fences = Fences::default();
    assert!(fences.check(&claim(41), &open()).is_ok());
    fences.accept(&claim(42), 1);
    assert_eq!(fences.check(&claim(41), &open()), Err(stale(41, 42)));
    assert!(fences.check(&claim(42), &open()).is_ok());
    fences.accept(&claim(7), 2);
    assert_eq!(fences.highest("orders"), Some(42));
}

#[test]
fn the_jump_bound_counts_from_the_highest_token_of_any_resource() {
    let mut fences = Fences::default();
    let bounded = FencePolicy {
        keys: None,
        jump_max: 100,
    };
    assert!(fences.check(&claim(100), &bounded).is_ok());
    assert!(matches!(
        fences.check(&claim(u64::MAX), &bounded),
        Err(FenceRefusal::TooHigh { ceiling: 0, .. })
    ));
    fences.accept(&FenceClaim::unproven("other", 1_000), 1);
    assert!(fences.check(&claim(1_100), &bounded).is_ok());
    assert!(fences.check(&claim(1_101), &bounded).is_err());
}

#[test]
fn the_first_answer_is_kept() {
    let mut fences = Fences::default();
    let first = FencedAnswer::Applied {
        token: 1,
        receipt: json!({"version": 1}),
        intents: Vec::new(),
    };
    let digest = Digest(1);
    fences.remember("w-1", digest, first.clone(), 5);
    fences.remember(
        "w-1",
        Digest(2),
        FencedAnswer::Applied {
            token: 2,
            receipt: json!(null),
            intents: Vec::new(),
        },
        6,
    );
    assert_eq!(fences.answer("w-1"), Some(&first));
    assert_eq!(fences.repeat("w-1", digest), Ok(Some(&first)));
    assert_eq!(fences.repeat("w-1", Digest(2)), Err(OpIdReused));
    assert_eq!(fences.repeat("w-2", Digest(2)), Ok(None));
}

#[test]
fn a_reset_is_compare_and_set_and_only_lowers() {
    let mut fences = Fences::default();
    fences.accept(&claim(u64::MAX), 1);
    let request = |from, to| FenceResetRequest {
        resource: "orders".into(),
        from,
        to,
        operator: "alice".into(),
        reason: "a typo fenced it off".into(),
    };
    assert!(matches!(
        fences.check_reset(&FenceResetRequest {
            resource: "nobody".into(),
            ..request(1, 0)
        }),
        Err(ResetRefused::Unknown { .. })
    ));
    assert!(matches!(
        fences.check_reset(&request(5, 0)),
        Err(ResetRefused::Changed { highest, .. }) if highest == u64::MAX
    ));
    assert!(matches!(
        fences.check_reset(&request(u64::MAX, u64::MAX)),
        Err(ResetRefused::NotLower { .. })
    ));
    assert_eq!(fences.check_reset(&request(u64::MAX, 3)), Ok(()));
    fences.apply_reset(FenceReset {
        resource: "orders".into(),
        from: u64::MAX,
        to: 3,
        operator: "alice".into(),
        reason: "typo".into(),
        at_ms: 9,
    });
    assert_eq!(fences.highest("orders"), Some(3));
    assert!(fences.check(&claim(3), &open()).is_ok());
    assert_eq!(fences.check(&claim(2), &open()), Err(stale(2, 3)));
    assert_eq!(fences.resets().len(), 1);
    let bounded = FencePolicy {
        keys: None,
        jump_max: 10,
    };
    assert!(
        fences.check(&claim(13), &bounded).is_ok(),
        "the ceiling falls with the reset"
    );
}

#[test]
fn retention_takes_old_answers_and_idle_resources_into_the_floor() {
    let retention = FenceRetention {
        highest_ms: 100,
        answers_ms: 50,
        answers_max: 2,
    };
    let mut fences = Fences::default();
    fences.accept(&claim(10), 0);
    fences.accept(&FenceClaim::unproven("busy", 20), 0);
    fences.accept(&FenceClaim::unproven("locked", 30), 0);
    let applied = FencedAnswer::Applied {
        token: 10,
        receipt: json!(null),
        intents: Vec::new(),
    };
    for (i, op) in ["a", "b", "c"].iter().enumerate() {
        fences.remember(op, Digest(i as u128), applied.clone(), 10 + i as u64);
    }
    // Over the count: the oldest answer goes at once.
    let took = fences.prune(20, &retention, |_| false);
    assert_eq!(
        took,
        Pruned {
            highest: 0,
            answers: 1
        }
    );
    assert!(fences.answer("a").is_none() && fences.answer("b").is_some());
    fences.accept(&FenceClaim::unproven("busy", 21), 90);
    let took = fences.prune(150, &retention, |r| r == "fence:locked" || r == "locked");
    assert_eq!(
        took,
        Pruned {
            highest: 1,
            answers: 2
        }
    );
    assert_eq!(fences.highest("orders"), None);
    assert_eq!(fences.highest("busy"), Some(21));
    assert_eq!(
        fences.highest("locked"),
        Some(30),
        "a locked resource stays"
    );
    assert_eq!(fences.floor(), 10);
    // The pruned resource still refuses its old holders: the floor stands for it.
    assert_eq!(fences.check(&claim(9), &open()), Err(stale(9, 10)));
    assert!(fences.check(&claim(10), &open()).is_ok());
    assert_eq!(
        fences.pruned(),
        Pruned {
            highest: 1,
            answers: 3
        }
    );
}

#[test]
fn a_snapshot_round_trip_keeps_times_and_older_snapshots_are_stamped_on_the_first_pass() {
    let mut fences = Fences::default();
    fences.accept(&claim(4), 7);
    let mut back: Fences = serde_json::from_value(serde_json::to_value(&fences).unwrap()).unwrap();
    back.reindex();
    assert_eq!(back, fences);
    let mut old: Fences =
        serde_json::from_value(json!({"highest": {"orders": 4}, "answers": {}})).unwrap();
    old.reindex();
    let retention = FenceRetention {
        highest_ms: 100,
        ..FenceRetention::default()
    };
    assert_eq!(old.prune(1_000, &retention, |_| false).highest, 0);
    assert_eq!(old.written_at_ms("orders"), Some(1_000));
    assert_eq!(old.prune(1_101, &retention, |_| false).highest, 1);
}
