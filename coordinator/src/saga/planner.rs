//! The saga compensation planner (the seeds' first build): a pure function from a saga's
//! definition and its execution log to what must happen next — which steps to compensate in
//! which order, which to reconcile first, which need a human.
//!
//! The saga engine asks it at every turn, so the rules live here once:
//! - only steps that succeeded are compensated, each once, in reverse order of success; a step
//!   that failed, never ran, or was proven never applied (`not_found`) is not;
//! - a duplicate or replayed success changes nothing (success is sticky: with stable op ids a
//!   later attempt of the same op can only repeat the first answer);
//! - unknown is a state: an unknown outcome is reconciled (asked under its original op id)
//!   before anything that depends on it, never guessed as failed;
//! - a step found `not_found` going backward is fenced (its compensation sent) before any
//!   ordinary compensation; a fence that fails is retried, but it never holds up the ordinary
//!   compensations of the other steps, and the saga is compensated only once it succeeded;
//! - once a step without compensation (a pivot) succeeded, the saga only goes forward: a failure
//!   after it needs a human and nothing is compensated silently; a timeout no longer applies.
//!
//! It must never do I/O or read a clock: the same input gives the same plan.

use serde::{Deserialize, Serialize};

/// A step as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    pub name: String,
    /// `false` for a step whose compensation is `null` (a pivot).
    #[serde(default = "yes")]
    pub compensable: bool,
}

fn yes() -> bool {
    true
}

/// One entry of an execution log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The step it is about; absent for `timed_out`.
    #[serde(default)]
    pub step: Option<String>,
    pub event: LogEvent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogEvent {
    /// The action was sent (no outcome yet: if nothing follows, the outcome is unknown).
    Started,
    Succeeded,
    /// A definite business failure: nothing was done.
    Failed,
    /// Timeout, 5xx, malformed answer: the action may or may not have been applied.
    Unknown,
    /// The participant, asked under the op id, has no record of the action.
    NotFound,
    Compensated,
    CompensationFailed,
    /// The saga's deadline passed.
    TimedOut,
}

/// What the log proves about one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "fact")]
pub enum Fact {
    NotRun,
    Unknown,
    Failed,
    /// An op query found no trace of the action. Not proof yet: a delayed copy may still
    /// arrive, so going forward it is sent again (same op id), going backward it is fenced.
    NotFound,
    /// Proven never applied: its compensation found nothing to undo and fenced it (a late
    /// action is refused by the participant's barrier).
    NotApplied,
    /// `order` counts successes, so compensation runs in reverse of it.
    Succeeded {
        order: u32,
    },
    CompensationFailing {
        order: u32,
        /// Failed compensation attempts so far (0 in checkpoints written before it was kept).
        #[serde(default)]
        failures: u32,
    },
    Compensated {
        order: u32,
    },
    /// Found `not_found`, and its fence (the compensation sent to make the participant refuse
    /// a late action) failed `failures` times: retried, shown as `compensation_failing`.
    FenceFailing {
        failures: u32,
    },
}

impl Fact {
    fn success_order(self) -> Option<u32> {
        match self {
            Fact::Succeeded { order }
            | Fact::CompensationFailing { order, .. }
            | Fact::Compensated { order } => Some(order),
            Fact::NotRun
            | Fact::Unknown
            | Fact::Failed
            | Fact::NotFound
            | Fact::NotApplied
            | Fact::FenceFailing { .. } => None,
        }
    }

    /// How often this step's compensation (or fence) failed so far.
    fn compensation_failures(self) -> u32 {
        match self {
            Fact::CompensationFailing { failures, .. } | Fact::FenceFailing { failures } => {
                failures
            }
            _ => 0,
        }
    }

    /// Whether its compensation keeps failing (the `compensation_failing` status and gauge).
    pub fn is_compensation_failing(self) -> bool {
        matches!(
            self,
            Fact::CompensationFailing { .. } | Fact::FenceFailing { .. }
        )
    }
}

/// The facts of every step after a log, and whether the saga timed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    pub facts: Vec<Fact>,
    pub timed_out: bool,
    /// Log entries naming no step of the definition (reported, not fatal).
    pub strays: Vec<String>,
}

/// Applies one event to one step's fact (the whole rule set of the log).
pub fn apply(fact: Fact, event: LogEvent, next_order: &mut u32) -> Fact {
    match (event, fact) {
        // Success is sticky, and a duplicate success gets no new order.
        (_, Fact::Compensated { .. }) => fact,
        (LogEvent::Succeeded, Fact::Succeeded { .. } | Fact::CompensationFailing { .. }) => fact,
        (LogEvent::Succeeded, _) => {
            *next_order += 1;
            Fact::Succeeded { order: *next_order }
        }
        (
            LogEvent::Compensated,
            Fact::Succeeded { order } | Fact::CompensationFailing { order, .. },
        ) => Fact::Compensated { order },
        // A compensation that found nothing to undo fences the action: never applied.
        (
            LogEvent::Compensated,
            Fact::Unknown
            | Fact::NotFound
            | Fact::FenceFailing { .. }
            | Fact::NotApplied
            | Fact::NotRun,
        ) => Fact::NotApplied,
        (LogEvent::CompensationFailed, Fact::Succeeded { order }) => {
            Fact::CompensationFailing { order, failures: 1 }
        }
        (LogEvent::CompensationFailed, Fact::CompensationFailing { order, failures }) => {
            Fact::CompensationFailing {
                order,
                failures: failures.saturating_add(1),
            }
        }
        (_, Fact::Succeeded { .. } | Fact::CompensationFailing { .. }) => fact,
        // The fence of a step found `not_found` failed (or its answer was lost).
        (LogEvent::CompensationFailed, Fact::NotFound) => Fact::FenceFailing { failures: 1 },
        (LogEvent::CompensationFailed, Fact::FenceFailing { failures }) => Fact::FenceFailing {
            failures: failures.saturating_add(1),
        },
        (LogEvent::Failed, _) => Fact::Failed,
        (LogEvent::Started | LogEvent::Unknown, _) => Fact::Unknown,
        (LogEvent::NotFound, Fact::Unknown) => Fact::NotFound,
        (LogEvent::NotFound | LogEvent::Compensated | LogEvent::CompensationFailed, _) => fact,
        (LogEvent::TimedOut, _) => fact,
    }
}

/// Folds an execution log over the definition.
pub fn fold(steps: &[PlanStep], log: &[LogEntry]) -> Folded {
    let mut facts = vec![Fact::NotRun; steps.len()];
    let mut timed_out = false;
    let mut strays = Vec::new();
    let mut order = 0;
    for entry in log {
        if entry.event == LogEvent::TimedOut {
            timed_out = true;
            continue;
        }
        let found = entry
            .step
            .as_deref()
            .and_then(|name| steps.iter().position(|s| s.name == name));
        match found {
            Some(i) => facts[i] = apply(facts[i], entry.event, &mut order),
            // Quoted (the name is the log's text), never `Some(..)`/`None`: it reaches users.
            None => strays.push(match &entry.step {
                Some(name) => format!("{name:?}"),
                None => "(an entry without a step)".to_string(),
            }),
        }
    }
    Folded {
        facts,
        timed_out,
        strays,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Every step succeeded.
    Complete,
    /// Run `next` (again, under the same op id if it was proven never applied).
    Continue,
    /// Ask about `reconcile[0]` under its original op id before anything else.
    ReconcileFirst,
    /// Send the compensation of `fence[0]` (found `not_found`): it undoes nothing if the
    /// action never arrived, and makes the participant refuse it if it arrives late. A fence
    /// never tried goes before every ordinary compensation; a fence that failed is tried
    /// again between them (see [`plan`]).
    Fence,
    /// Compensate `compensate[0]` (then the rest, in order).
    Compensate,
    /// Every succeeded step is undone.
    Compensated,
    /// Forward is impossible and backward is not allowed: a human decides.
    NeedsAttention,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HumanItem {
    pub step: String,
    pub reason: String,
}

/// The plan. Step lists hold names; `*_index` fields the same as positions (for the engine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub decision: Decision,
    pub reason: String,
    pub next: Option<String>,
    pub compensate: Vec<String>,
    pub reconcile: Vec<String>,
    pub fence: Vec<String>,
    pub needs_human: Vec<HumanItem>,
    pub already_compensated: Vec<String>,
    /// Steps that are not compensated, with why.
    pub not_compensated: Vec<HumanItem>,
    #[serde(skip)]
    pub next_index: Option<usize>,
    #[serde(skip)]
    pub compensate_index: Vec<usize>,
    #[serde(skip)]
    pub reconcile_index: Vec<usize>,
    #[serde(skip)]
    pub fence_index: Vec<usize>,
}

/// The plan for `steps` given what is known of each.
pub fn plan(steps: &[PlanStep], facts: &[Fact], timed_out: bool) -> Plan {
    assert_eq!(steps.len(), facts.len(), "one fact per step");
    let name = |i: usize| steps[i].name.clone();
    let succeeded = |f: Fact| matches!(f, Fact::Succeeded { .. });
    let pivot = (0..steps.len()).find(|&i| !steps[i].compensable && succeeded(facts[i]));
    let failed = (0..steps.len()).find(|&i| facts[i] == Fact::Failed);
    let unknown: Vec<usize> = (0..steps.len())
        .filter(|&i| facts[i] == Fact::Unknown)
        .collect();
    let already_compensated = (0..steps.len())
        .filter(|&i| matches!(facts[i], Fact::Compensated { .. }))
        .map(name)
        .collect();
    let mut plan = Plan {
        decision: Decision::Complete,
        reason: String::new(),
        next: None,
        compensate: Vec::new(),
        reconcile: Vec::new(),
        fence: Vec::new(),
        needs_human: Vec::new(),
        already_compensated,
        not_compensated: Vec::new(),
        next_index: None,
        compensate_index: Vec::new(),
        reconcile_index: Vec::new(),
        fence_index: Vec::new(),
    };
    if !is_backward(steps, facts, timed_out) {
        if let Some(&i) = unknown.first() {
            plan.decision = Decision::ReconcileFirst;
            plan.reason = format!("the outcome of step {:?} is unknown", steps[i].name);
            plan.reconcile_index = vec![i];
        } else if let Some(i) = facts.iter().position(|f| !succeeded(*f)) {
            plan.decision = Decision::Continue;
            plan.reason = format!("step {:?} runs next", steps[i].name);
            plan.next_index = Some(i);
        } else {
            plan.decision = Decision::Complete;
            plan.reason = "every step succeeded".into();
        }
        return fill_names(plan, steps);
    }
    let why = match failed {
        Some(i) => format!("step {:?} failed", steps[i].name),
        None if timed_out => "the saga timed out".to_string(),
        None => "compensation had begun".to_string(),
    };
    if let Some(p) = pivot {
        let failing = failed.map_or_else(|| why.clone(), |i| steps[i].name.clone());
        plan.decision = Decision::NeedsAttention;
        plan.reason = format!(
            "{why} after step {:?}, which cannot be compensated, succeeded: the saga can only go \
             forward, and nothing is compensated without a human",
            steps[p].name
        );
        plan.needs_human.push(HumanItem {
            step: failing,
            reason: plan.reason.clone(),
        });
        return fill_names(plan, steps);
    }
    // Compensate in reverse order of success, never what failed, never ran or never applied.
    let mut to_undo: Vec<usize> = (0..steps.len())
        .filter(|&i| {
            matches!(
                facts[i],
                Fact::Succeeded { .. } | Fact::CompensationFailing { .. }
            )
        })
        .collect();
    to_undo.sort_by_key(|&i| std::cmp::Reverse(facts[i].success_order()));
    for (i, fact) in facts.iter().enumerate() {
        let reason = match fact {
            Fact::Failed => "it failed: nothing to undo",
            Fact::NotRun => "it never ran",
            Fact::NotApplied => "it was proven never applied",
            Fact::NotFound => "not found at the participant: fenced, nothing undone",
            Fact::FenceFailing { .. } => {
                "not found at the participant: its fence keeps failing and is retried, nothing \
                 undone"
            }
            Fact::Unknown => "its outcome is unknown: reconcile first",
            Fact::Compensated { .. } => "already compensated",
            Fact::Succeeded { .. } | Fact::CompensationFailing { .. } => continue,
        };
        plan.not_compensated.push(HumanItem {
            step: steps[i].name.clone(),
            reason: reason.into(),
        });
    }
    plan.compensate_index = to_undo;
    plan.reconcile_index = unknown;
    // Unknown steps are reconciled first, latest first: compensation order depends on them.
    plan.reconcile_index.reverse();
    // Fences never tried first (latest step first), then the failing ones, fewest failures
    // first: each is tried in turn.
    let mut fences: Vec<usize> = (0..steps.len())
        .rev()
        .filter(|&i| matches!(facts[i], Fact::NotFound | Fact::FenceFailing { .. }))
        .collect();
    fences.sort_by_key(|&i| facts[i].compensation_failures());
    plan.fence_index = fences;
    plan.decision = if !plan.reconcile_index.is_empty() {
        Decision::ReconcileFirst
    } else {
        backward_turn(facts, &plan.fence_index, &plan.compensate_index)
    };
    plan.reason = why;
    fill_names(plan, steps)
}

/// Whose turn it is going backward, once nothing is unknown: a fence never tried goes first
/// (it must reach the participant before a late action does); then the ordinary compensations
/// in order, unless a fence that failed has failed no more often than the compensation at
/// their head, so that neither a failing fence holds up the other steps' compensations nor a
/// failing compensation stops a fence from being retried.
fn backward_turn(facts: &[Fact], fences: &[usize], to_undo: &[usize]) -> Decision {
    let fence = fences.first().map(|&i| facts[i]);
    match (fence, to_undo.first().map(|&i| facts[i])) {
        (Some(Fact::NotFound), _) => Decision::Fence,
        (Some(fence), Some(head))
            if fence.compensation_failures() < head.compensation_failures() =>
        {
            Decision::Fence
        }
        (_, Some(_)) => Decision::Compensate,
        (Some(_), None) => Decision::Fence,
        (None, None) => Decision::Compensated,
    }
}

fn fill_names(mut plan: Plan, steps: &[PlanStep]) -> Plan {
    let names = |v: &[usize]| v.iter().map(|&i| steps[i].name.clone()).collect();
    plan.next = plan.next_index.map(|i| steps[i].name.clone());
    plan.compensate = names(&plan.compensate_index);
    plan.reconcile = names(&plan.reconcile_index);
    plan.fence = names(&plan.fence_index);
    plan
}

/// Whether the saga goes backward: a step failed, the saga timed out, or compensation already
/// began. A timeout alone does not turn a saga back once its pivot succeeded.
pub fn is_backward(steps: &[PlanStep], facts: &[Fact], timed_out: bool) -> bool {
    let pivot = (0..steps.len().min(facts.len()))
        .any(|i| !steps[i].compensable && matches!(facts[i], Fact::Succeeded { .. }));
    let failed = facts.contains(&Fact::Failed);
    let backward_started = facts.iter().any(|f| {
        matches!(
            f,
            Fact::Compensated { .. }
                | Fact::CompensationFailing { .. }
                | Fact::FenceFailing { .. }
                | Fact::NotApplied
        )
    });
    failed || backward_started || (timed_out && !pivot)
}

/// The input of `twopc saga plan FILE`: the definition and its execution log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput {
    pub steps: Vec<PlanStep>,
    pub log: Vec<LogEntry>,
}

/// Folds and plans a whole input; unknown step names in the log are an error (a log about
/// another saga must not be planned as if it were this one).
pub fn plan_input(input: &PlanInput) -> Result<Plan, String> {
    let folded = fold(&input.steps, &input.log);
    if !folded.strays.is_empty() {
        return Err(format!(
            "the log names steps the definition does not have: {}",
            folded.strays.join(", ")
        ));
    }
    Ok(plan(&input.steps, &folded.facts, folded.timed_out))
}

#[cfg(test)]
mod tests {
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
        let old: Fact =
            serde_json::from_str(r#"{"fact":"compensation_failing","order":3}"#).unwrap();
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
}
