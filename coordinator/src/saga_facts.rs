//! What a saga's log proves about each step (a [`Fact`]), and the one rule that folds log
//! events into it. The log's checkpoint keeps these facts, so they sit below both the records
//! and the planner that reads them; like the planner, this never does I/O.

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
    pub(super) fn success_order(self) -> Option<u32> {
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
    pub(super) fn compensation_failures(self) -> u32 {
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
