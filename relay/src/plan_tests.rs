use super::*;
use serde_json::json;

const P: &str = "orders";

fn config() -> Config {
    Config {
        poll_ms: 1000,
        backoff_base_ms: 100,
        backoff_max_ms: 1000,
        max_in_flight: 8,
    }
}

fn entry(aggregate: &str, seq: u64, state: IntentState) -> OutboxEntry {
    OutboxEntry {
        event_id: format!("{aggregate}-{seq}"),
        aggregate: aggregate.into(),
        seq,
        target: "payments".into(),
        kind: "payment.authorize.v1".into(),
        body: json!({"seq": seq}),
        state,
        op_id: format!("op-{aggregate}-{seq}"),
        created_at_ms: 0,
        attempts: 0,
        last_error: None,
        last_attempt_at_ms: None,
        delivered_at_ms: None,
        answer: None,
        marks: Vec::new(),
        age_ms: None,
    }
}

fn list(entries: Vec<OutboxEntry>) -> OutboxList {
    OutboxList {
        intents: entries,
        pending: 0,
        failed: 0,
        oldest_pending_age_ms: None,
        truncated: false,
    }
}

/// A planner that has asked for its first listing (generation 1).
fn started(config: Config) -> Planner {
    let mut planner = Planner::new(config, [P.to_string()]);
    let out = planner.step(0, Event::Tick);
    assert!(out.contains(&Command::List {
        participant: P.into(),
        generation: 1
    }));
    planner
}

fn listed(
    planner: &mut Planner,
    now: u64,
    generation: u64,
    entries: Vec<OutboxEntry>,
) -> Vec<Command> {
    planner.step(
        now,
        Event::Listed {
            participant: P.into(),
            generation,
            list: list(entries),
        },
    )
}

fn delivered_ids(out: &[Command]) -> Vec<String> {
    out.iter()
        .filter_map(|c| match c {
            Command::Deliver { entry, .. } => Some(entry.event_id.clone()),
            _ => None,
        })
        .collect()
}

fn list_generation(out: &[Command]) -> Option<u64> {
    out.iter().find_map(|c| match c {
        Command::List { generation, .. } => Some(*generation),
        _ => None,
    })
}

fn delivered(event_id: &str) -> Event {
    Event::Delivered {
        participant: P.into(),
        event_id: event_id.into(),
        answer: json!({"ok": event_id}),
    }
}

fn report(event_id: &str, report: Report, result: ReportResult) -> Event {
    Event::Reported {
        participant: P.into(),
        event_id: event_id.into(),
        report,
        result,
        jitter_permille: 0,
    }
}

#[test]
fn only_each_aggregates_lowest_pending_intent_goes() {
    let mut planner = started(config());
    let out = listed(
        &mut planner,
        1,
        1,
        vec![
            entry("a", 1, IntentState::Pending),
            entry("b", 1, IntentState::Failed),
            entry("a", 2, IntentState::Pending),
            entry("b", 2, IntentState::Pending),
            entry("c", 3, IntentState::Pending),
        ],
    );
    assert_eq!(
        delivered_ids(&out),
        ["a-1", "c-3"],
        "b is held by its failed head"
    );
    assert_eq!(planner.in_flight(), 2);
}

#[test]
fn the_next_seq_goes_only_after_the_report_is_accepted_and_a_later_listing_shows_it() {
    let mut planner = started(config());
    listed(
        &mut planner,
        1,
        1,
        vec![
            entry("a", 1, IntentState::Pending),
            entry("a", 2, IntentState::Pending),
        ],
    );
    let out = planner.step(2, delivered("a-1"));
    assert_eq!(
        out[0],
        Command::ReportDelivered {
            participant: P.into(),
            event_id: "a-1".into(),
            answer: json!({"ok": "a-1"})
        }
    );
    assert!(delivered_ids(&out).is_empty());
    // A poll's listing is asked for while the report is in flight.
    let out = planner.step(1000, Event::Tick);
    assert_eq!(list_generation(&out), Some(2));
    let out = planner.step(
        1001,
        report("a-1", Report::Delivered, ReportResult::Accepted),
    );
    assert!(delivered_ids(&out).is_empty());
    assert_eq!(list_generation(&out), None, "one listing at a time");
    // It arrives after the report was accepted, still showing a-1: not trusted for "a".
    let out = listed(
        &mut planner,
        1002,
        2,
        vec![entry("a", 1, IntentState::Pending)],
    );
    assert!(delivered_ids(&out).is_empty());
    assert_eq!(
        list_generation(&out),
        Some(3),
        "the report's own listing follows"
    );
    let out = listed(
        &mut planner,
        1003,
        3,
        vec![entry("a", 2, IntentState::Pending)],
    );
    assert_eq!(delivered_ids(&out), ["a-2"]);
}

#[test]
fn an_unknown_outcome_is_retried_under_the_same_event_id_after_a_backoff() {
    let mut planner = started(config());
    listed(
        &mut planner,
        0,
        1,
        vec![entry("a", 1, IntentState::Pending)],
    );
    let unknown = |jitter| Event::Unknown {
        participant: P.into(),
        event_id: "a-1".into(),
        error: "timed out".into(),
        jitter_permille: jitter,
    };
    let out = planner.step(10, unknown(1000));
    assert!(out.contains(&Command::ReportAttempt {
        participant: P.into(),
        event_id: "a-1".into(),
        error: "timed out".into(),
        permanent: false
    }));
    assert!(out.contains(&Command::SetTimer { at_ms: 110 }));
    assert_eq!(planner.in_flight(), 0);
    assert!(delivered_ids(&planner.step(109, Event::Tick)).is_empty());
    let out = planner.step(110, Event::Tick);
    assert_eq!(delivered_ids(&out), ["a-1"]);
    // The second unknown waits twice as long (jitter 0: the lower half of 200).
    let out = planner.step(120, unknown(0));
    assert!(out.contains(&Command::SetTimer { at_ms: 220 }));
    // A delivered answer settles it; an unknown never reports delivered.
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::ReportDelivered { .. }))
    );
}

#[test]
fn backoff_doubles_up_to_its_cap_and_jitter_spreads_the_upper_half() {
    let config = config();
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 1, 0),
        50
    );
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 1, 1000),
        100
    );
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 2, 1000),
        200
    );
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 4, 1000),
        800
    );
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 5, 1000),
        1000
    );
    assert_eq!(
        crate::backoff::backoff_ms(config.backoff_base_ms, config.backoff_max_ms, 60, 500),
        750
    );
}

#[test]
fn a_permanent_refusal_reports_failed_and_holds_the_aggregate() {
    let mut planner = started(config());
    listed(
        &mut planner,
        0,
        1,
        vec![
            entry("a", 1, IntentState::Pending),
            entry("a", 2, IntentState::Pending),
        ],
    );
    let out = planner.step(
        1,
        Event::Refused {
            participant: P.into(),
            event_id: "a-1".into(),
            error: "422 no such account".into(),
        },
    );
    assert!(out.contains(&Command::ReportAttempt {
        participant: P.into(),
        event_id: "a-1".into(),
        error: "422 no such account".into(),
        permanent: true
    }));
    let out = planner.step(2, report("a-1", Report::Permanent, ReportResult::Accepted));
    let generation = list_generation(&out).unwrap();
    let out = listed(
        &mut planner,
        3,
        generation,
        vec![
            entry("a", 1, IntentState::Failed),
            entry("a", 2, IntentState::Pending),
        ],
    );
    assert!(
        delivered_ids(&out).is_empty(),
        "a failed head holds a-2 back"
    );
}

#[test]
fn a_failed_report_is_sent_again_and_a_refused_one_sends_back_to_a_listing() {
    let mut planner = started(config());
    listed(
        &mut planner,
        0,
        1,
        vec![entry("a", 1, IntentState::Pending)],
    );
    planner.step(1, delivered("a-1"));
    let out = planner.step(2, report("a-1", Report::Delivered, ReportResult::Failed));
    assert!(out.contains(&Command::SetTimer { at_ms: 52 }));
    let out = planner.step(52, Event::Tick);
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::ReportDelivered { event_id, .. } if event_id == "a-1"))
    );
    let out = planner.step(53, report("a-1", Report::Delivered, ReportResult::Refused));
    assert_eq!(
        list_generation(&out),
        Some(2),
        "a refusal sends back to a listing"
    );
}

#[test]
fn deliveries_in_flight_are_bounded_overall() {
    let mut planner = started(Config {
        max_in_flight: 2,
        ..config()
    });
    let out = listed(
        &mut planner,
        0,
        1,
        vec![
            entry("a", 1, IntentState::Pending),
            entry("b", 1, IntentState::Pending),
            entry("c", 1, IntentState::Pending),
        ],
    );
    assert_eq!(delivered_ids(&out), ["a-1", "b-1"]);
    let out = planner.step(1, delivered("a-1"));
    assert_eq!(
        delivered_ids(&out),
        ["c-1"],
        "room made by a-1's answer goes to c"
    );
    assert_eq!(planner.in_flight(), 2);
}

#[test]
fn when_room_is_short_every_aggregate_gets_its_turn() {
    let mut planner = started(Config {
        max_in_flight: 1,
        ..config()
    });
    let heads = vec![
        entry("a", 1, IntentState::Pending),
        entry("b", 1, IntentState::Pending),
        entry("c", 1, IntentState::Pending),
    ];
    assert_eq!(delivered_ids(&listed(&mut planner, 0, 1, heads)), ["a-1"]);
    let out = planner.step(1, delivered("a-1"));
    assert_eq!(
        delivered_ids(&out),
        ["b-1"],
        "not a again: a waits for its report anyway"
    );
    // a's report is accepted and a fresh listing shows a-2: still c goes before a.
    let out = planner.step(2, report("a-1", Report::Delivered, ReportResult::Accepted));
    let generation = list_generation(&out).unwrap();
    let later = vec![
        entry("a", 2, IntentState::Pending),
        entry("c", 1, IntentState::Pending),
    ];
    listed(&mut planner, 3, generation, later);
    let out = planner.step(4, delivered("b-1"));
    assert_eq!(delivered_ids(&out), ["c-1"]);
    let out = planner.step(5, delivered("c-1"));
    assert_eq!(delivered_ids(&out), ["a-2"]);
}

#[test]
fn a_backoff_ends_early_when_a_listing_shows_the_intent_settled() {
    let mut planner = started(Config {
        poll_ms: 10,
        ..config()
    });
    listed(
        &mut planner,
        0,
        1,
        vec![
            entry("a", 1, IntentState::Pending),
            entry("a", 2, IntentState::Pending),
        ],
    );
    planner.step(
        1,
        Event::Unknown {
            participant: P.into(),
            event_id: "a-1".into(),
            error: "503".into(),
            jitter_permille: 0,
        },
    );
    // The poll at 10 comes before the backoff's end at 51.
    let out = planner.step(10, Event::Tick);
    assert!(delivered_ids(&out).is_empty());
    assert_eq!(list_generation(&out), Some(2));
    // An operator marked a-1 delivered: the fresh listing's head is a-2.
    let out = listed(
        &mut planner,
        11,
        2,
        vec![entry("a", 2, IntentState::Pending)],
    );
    assert_eq!(delivered_ids(&out), ["a-2"]);
}

#[test]
fn results_for_deliveries_not_in_flight_change_nothing() {
    let mut planner = started(config());
    let before = planner.clone();
    let out = planner.step(1, delivered("zz-1"));
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::ReportDelivered { .. }))
    );
    assert_eq!(planner.in_flight(), before.in_flight());
}
