use super::*;

/// `"a b* c"`: steps a, b, c; `*` marks a step without compensation.
fn steps(spec: &str) -> Vec<PlanStep> {
    spec.split_whitespace()
        .map(|s| PlanStep {
            name: s.trim_end_matches('*').to_string(),
            compensable: !s.ends_with('*'),
        })
        .collect()
}

/// `"a:ok b:unknown b:ok timeout"`.
fn log(spec: &str) -> Vec<LogEntry> {
    spec.split_whitespace()
        .map(|e| {
            if e == "timeout" {
                return LogEntry {
                    step: None,
                    event: LogEvent::TimedOut,
                };
            }
            let (step, what) = e.split_once(':').unwrap();
            let event = match what {
                "start" => LogEvent::Started,
                "ok" => LogEvent::Succeeded,
                "fail" => LogEvent::Failed,
                "unknown" => LogEvent::Unknown,
                "notfound" => LogEvent::NotFound,
                "undone" => LogEvent::Compensated,
                "undofail" => LogEvent::CompensationFailed,
                other => panic!("{other}"),
            };
            LogEntry {
                step: Some(step.into()),
                event,
            }
        })
        .collect()
}

struct Row {
    name: &'static str,
    steps: &'static str,
    log: &'static str,
    decision: Decision,
    compensate: &'static [&'static str],
    reconcile: &'static [&'static str],
    next: Option<&'static str>,
    human: bool,
    fence: &'static [&'static str],
}

const fn row(
    name: &'static str,
    steps: &'static str,
    log: &'static str,
    decision: Decision,
    compensate: &'static [&'static str],
) -> Row {
    Row {
        name,
        steps,
        log,
        decision,
        compensate,
        reconcile: &[],
        next: None,
        human: false,
        fence: &[],
    }
}

#[test]
fn the_table() {
    use Decision::*;
    let rows = [
        row("all succeeded", "a b c", "a:ok b:ok c:ok", Complete, &[]),
        Row {
            next: Some("b"),
            ..row("midway", "a b c", "a:ok", Continue, &[])
        },
        row(
            "failure in the middle",
            "a b c",
            "a:ok b:fail",
            Compensate,
            &["a"],
        ),
        row(
            "failure of the last step",
            "a b c",
            "a:ok b:ok c:fail",
            Compensate,
            &["b", "a"],
        ),
        row(
            "failure of the first step",
            "a b c",
            "a:fail",
            Compensated,
            &[],
        ),
        row(
            "retries: fail then succeed",
            "a b c",
            "a:fail a:ok b:ok c:fail",
            Compensate,
            &["b", "a"],
        ),
        row(
            "duplicate success records",
            "a b c",
            "a:ok a:ok b:ok a:ok b:ok c:fail",
            Compensate,
            &["b", "a"],
        ),
        row(
            "replayed log twice",
            "a b",
            "a:ok b:fail a:ok b:fail",
            Compensate,
            &["a"],
        ),
        row(
            "already compensated, once",
            "a b c",
            "a:ok b:ok c:fail b:undone b:undone",
            Compensate,
            &["a"],
        ),
        row(
            "all compensated",
            "a b c",
            "a:ok b:ok c:fail b:undone a:undone a:ok",
            Compensated,
            &[],
        ),
        row(
            "compensation failing is retried",
            "a b c",
            "a:ok b:ok c:fail b:undofail",
            Compensate,
            &["b", "a"],
        ),
        Row {
            reconcile: &["b"],
            ..row(
                "unknown outcome is reconciled",
                "a b c",
                "a:ok b:unknown",
                ReconcileFirst,
                &[],
            )
        },
        Row {
            reconcile: &["b"],
            ..row(
                "started without outcome is unknown",
                "a b c",
                "a:ok b:start",
                ReconcileFirst,
                &[],
            )
        },
        Row {
            next: Some("c"),
            ..row(
                "unknown then done",
                "a b c",
                "a:ok b:unknown b:ok",
                Continue,
                &[],
            )
        },
        Row {
            next: Some("b"),
            ..row(
                "unknown then not_found: retried",
                "a b c",
                "a:ok b:unknown b:notfound",
                Continue,
                &[],
            )
        },
        Row {
            fence: &["b"],
            ..row(
                "unknown then not_found, then timeout",
                "a b c",
                "a:ok b:unknown b:notfound timeout",
                Fence,
                &["a"],
            )
        },
        Row {
            reconcile: &["b"],
            ..row(
                "timeout with unknown step",
                "a b c",
                "a:ok b:unknown timeout",
                ReconcileFirst,
                &["a"],
            )
        },
        row(
            "unknown then done, then failure",
            "a b c",
            "a:ok b:unknown b:ok c:fail",
            Compensate,
            &["b", "a"],
        ),
        row(
            "timeout compensates",
            "a b c",
            "a:ok b:ok timeout",
            Compensate,
            &["b", "a"],
        ),
        row(
            "non-compensable step fails itself",
            "a b* c",
            "a:ok b:fail",
            Compensate,
            &["a"],
        ),
        Row {
            human: true,
            ..row(
                "failure after a pivot",
                "a b* c",
                "a:ok b:ok c:fail",
                NeedsAttention,
                &[],
            )
        },
        Row {
            next: Some("c"),
            ..row(
                "timeout after a pivot goes forward",
                "a b* c",
                "a:ok b:ok timeout",
                Continue,
                &[],
            )
        },
        row(
            "pivot never ran",
            "a b c*",
            "a:ok b:fail",
            Compensate,
            &["a"],
        ),
        row(
            "compensated null op fences an unknown",
            "a b c",
            "a:ok b:unknown timeout b:undone",
            Compensate,
            &["a"],
        ),
        Row {
            fence: &["c"],
            ..row(
                "a fence never tried goes before every compensation",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout",
                Fence,
                &["b", "a"],
            )
        },
        Row {
            fence: &["c"],
            ..row(
                "a failing fence does not hold up the others",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout c:undofail",
                Compensate,
                &["b", "a"],
            )
        },
        Row {
            fence: &["c"],
            ..row(
                "a failing fence does not hold up the others, halfway",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout c:undofail c:undofail b:undone",
                Compensate,
                &["a"],
            )
        },
        Row {
            fence: &["c"],
            ..row(
                "a failing fence is retried once the others are done",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout c:undofail b:undone a:undone",
                Fence,
                &[],
            )
        },
        row(
            "compensated only once the failing fence took",
            "a b c",
            "a:ok b:ok c:unknown c:notfound timeout c:undofail b:undone a:undone c:undone",
            Compensated,
            &[],
        ),
        Row {
            fence: &["c"],
            ..row(
                "a failing fence and a failing compensation take turns: compensation",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout c:undofail b:undofail",
                Compensate,
                &["b", "a"],
            )
        },
        Row {
            fence: &["c"],
            ..row(
                "a failing fence and a failing compensation take turns: fence",
                "a b c",
                "a:ok b:ok c:unknown c:notfound timeout c:undofail b:undofail b:undofail",
                Fence,
                &["b", "a"],
            )
        },
        Row {
            fence: &["b", "c"],
            ..row(
                "an untried fence before a failing one",
                "a b c",
                "a:ok b:unknown b:notfound c:unknown c:notfound timeout c:undofail",
                Fence,
                &["a"],
            )
        },
    ];
    for r in rows {
        let plan = plan_input(&PlanInput {
            steps: steps(r.steps),
            log: log(r.log),
        })
        .unwrap();
        assert_eq!(plan.decision, r.decision, "{}: {plan:?}", r.name);
        assert_eq!(plan.compensate, r.compensate, "{}: {plan:?}", r.name);
        assert_eq!(plan.reconcile, r.reconcile, "{}: {plan:?}", r.name);
        assert_eq!(plan.next.as_deref(), r.next, "{}: {plan:?}", r.name);
        assert_eq!(plan.fence, r.fence, "{}: {plan:?}", r.name);
        assert_eq!(
            !plan.needs_human.is_empty(),
            r.human,
            "{}: {plan:?}",
            r.name
        );
        // Never a step that failed, never ran or was never applied.
        let folded = fold(&steps(r.steps), &log(r.log));
        for name in &plan.compensate {
            let i = steps(r.steps).iter().position(|s| &s.name == name).unwrap();
            assert!(
                matches!(
                    folded.facts[i],
                    Fact::Succeeded { .. } | Fact::CompensationFailing { .. }
                ),
                "{}",
                r.name
            );
        }
    }
}

/// Issue 25, item 5: a fence that keeps failing is `compensation_failing` (counted with
/// the others), says why it is not compensated, and ends only in `not_applied`.
#[test]
fn a_failing_fence_is_compensation_failing_and_counted() {
    let spec = steps("a b c");
    let folded = fold(
        &spec,
        &log("a:ok b:ok c:unknown c:notfound timeout c:undofail c:undofail"),
    );
    assert_eq!(folded.facts[2], Fact::FenceFailing { failures: 2 });
    assert!(folded.facts[2].is_compensation_failing());
    assert!(is_backward(&spec, &folded.facts, false));
    let plan = plan(&spec, &folded.facts, folded.timed_out);
    assert!(
        plan.not_compensated
            .iter()
            .any(|h| h.step == "c" && h.reason.contains("fence keeps failing")),
        "{plan:?}"
    );
    let fenced = fold(
        &spec,
        &log("a:ok b:ok c:unknown c:notfound timeout c:undofail c:undone"),
    );
    assert_eq!(fenced.facts[2], Fact::NotApplied);
    // An ordinary compensation counts its failures too.
    let failing = fold(&spec, &log("a:ok b:ok c:fail b:undofail b:undofail"));
    assert_eq!(
        failing.facts[1],
        Fact::CompensationFailing {
            order: 2,
            failures: 2
        }
    );
}

#[test]
fn a_checkpointed_fact_from_before_failures_were_counted_still_reads() {
    let old: Fact = serde_json::from_str(r#"{"fact":"compensation_failing","order":3}"#).unwrap();
    assert_eq!(
        old,
        Fact::CompensationFailing {
            order: 3,
            failures: 0
        }
    );
}

#[test]
fn a_log_about_other_steps_is_refused() {
    let input = PlanInput {
        steps: steps("a"),
        log: log("z:ok"),
    };
    assert!(plan_input(&input).unwrap_err().contains("\"z\""));
}

#[test]
fn compensation_order_is_reverse_success_not_definition_order() {
    // Out-of-order successes (a log from a future parallel saga): b first, then a.
    let plan = plan_input(&PlanInput {
        steps: steps("a b c"),
        log: log("b:ok a:ok c:fail"),
    })
    .unwrap();
    assert_eq!(plan.compensate, ["a", "b"]);
}
