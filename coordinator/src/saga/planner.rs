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

pub use crate::saga_facts::{Fact, Folded, LogEntry, LogEvent, PlanStep, apply, fold};

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
#[path = "planner_tests.rs"]
mod tests;
