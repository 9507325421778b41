//! The pure, seeded part of the fault proxy: which faults apply to the next request on a route.
//! No I/O, no clock; the same seed and the same sequence of requests give the same decisions.

use protocol::routes;

/// The protocol route of one request, as the proxy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `/2pc/prepare`, or `/2pc/batch/prepare` (a batch of prepares: a fault takes them all).
    Prepare,
    Commit,
    Abort,
    /// `/2pc/batch/decide`: commits and aborts in one request (issue 28); a rule for either
    /// kind applies to the whole batch.
    Decisions,
    /// Anything else (`/healthz`, `/v1/kv/...`): only `Scope::Any` rules apply to it.
    Other,
}

impl Route {
    pub const ALL: [Route; 5] = [
        Route::Prepare,
        Route::Commit,
        Route::Abort,
        Route::Decisions,
        Route::Other,
    ];

    /// The route of a request target (path with optional query).
    pub fn of_target(target: &str) -> Route {
        let path = target.split('?').next().unwrap_or(target);
        if path == routes::PREPARE || path == routes::BATCH_PREPARE {
            Route::Prepare
        } else if path == routes::BATCH_DECIDE {
            Route::Decisions
        } else if path == routes::COMMIT {
            Route::Commit
        } else if path == routes::ABORT {
            Route::Abort
        } else {
            Route::Other
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Route::Prepare => 0,
            Route::Commit => 1,
            Route::Abort => 2,
            Route::Decisions => 3,
            Route::Other => 4,
        }
    }
}

/// Which requests a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Any,
    Prepare,
    Commit,
    Abort,
}

impl Scope {
    pub fn matches(self, route: Route) -> bool {
        match self {
            Scope::Any => true,
            Scope::Prepare => route == Route::Prepare,
            Scope::Commit => matches!(route, Route::Commit | Route::Decisions),
            Scope::Abort => matches!(route, Route::Abort | Route::Decisions),
        }
    }
}

/// One kind of network fault. Each is distinct; see the module docs of `proxy` for exactly what
/// the caller and the upstream observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Never forwarded; the caller gets no answer.
    DropRequest,
    /// Forwarded and applied upstream; the answer is withheld from the caller.
    DropResponse,
    /// Forwarded twice in a row; the caller gets the first answer.
    Duplicate,
    /// Held before forwarding for a time drawn uniformly from `min_ms..=max_ms`.
    Delay { min_ms: u64, max_ms: u64 },
    /// Held until the next request on the same route has been forwarded, then forwarded; if none
    /// comes within `hold_ms`, forwarded alone.
    Reorder { hold_ms: u64 },
}

/// A fault applied to a `percent` of the requests in `scope` (100 = every one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub scope: Scope,
    pub fault: Fault,
    pub percent: u8,
}

impl Rule {
    pub fn always(scope: Scope, fault: Fault) -> Rule {
        Rule {
            scope,
            fault,
            percent: 100,
        }
    }

    /// `percent` above 100 counts as 100.
    pub fn percent(scope: Scope, fault: Fault, percent: u8) -> Rule {
        Rule {
            scope,
            fault,
            percent: percent.min(100),
        }
    }
}

/// What to do with one request: the union of every rule that fired for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plan {
    pub drop_request: bool,
    pub drop_response: bool,
    pub duplicate: bool,
    pub delay_ms: u64,
    pub reorder_hold_ms: Option<u64>,
}

/// Names a rule so it can be removed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u64);

#[derive(Debug)]
struct ActiveRule {
    id: RuleId,
    rule: Rule,
    rng: fastrand::Rng,
}

/// The active rules, each with its own RNG seeded from the schedule seed and the rule's id, so a
/// rule's decisions depend only on the seed, the order rules were added, and the sequence of
/// requests in its scope - not on other rules.
#[derive(Debug)]
pub struct Schedule {
    seed: u64,
    next_id: u64,
    rules: Vec<ActiveRule>,
}

impl Schedule {
    pub fn new(seed: u64) -> Schedule {
        Schedule {
            seed,
            next_id: 0,
            rules: Vec::new(),
        }
    }

    pub fn add(&mut self, rule: Rule) -> RuleId {
        let id = RuleId(self.next_id);
        self.next_id += 1;
        let rng = fastrand::Rng::with_seed(splitmix64(self.seed ^ splitmix64(id.0)));
        self.rules.push(ActiveRule { id, rule, rng });
        id
    }

    /// Returns whether the rule was active.
    pub fn remove(&mut self, id: RuleId) -> bool {
        let before = self.rules.len();
        self.rules.retain(|active| active.id != id);
        self.rules.len() != before
    }

    /// Removes every rule. Ids keep counting, so rules added afterwards get fresh RNG streams.
    pub fn clear(&mut self) {
        self.rules.clear();
    }

    pub fn rules(&self) -> Vec<(RuleId, Rule)> {
        self.rules.iter().map(|a| (a.id, a.rule)).collect()
    }

    /// Decides the next request on `route`. Every rule in scope draws from its RNG the same
    /// number of times whether it fires or not, which keeps the streams aligned across runs.
    pub fn decide(&mut self, route: Route) -> Plan {
        let mut plan = Plan::default();
        for active in &mut self.rules {
            if !active.rule.scope.matches(route) {
                continue;
            }
            let fires = active.rng.u8(0..100) < active.rule.percent;
            match active.rule.fault {
                Fault::DropRequest => plan.drop_request |= fires,
                Fault::DropResponse => plan.drop_response |= fires,
                Fault::Duplicate => plan.duplicate |= fires,
                Fault::Delay { min_ms, max_ms } => {
                    let delay_ms = active.rng.u64(min_ms.min(max_ms)..=max_ms.max(min_ms));
                    if fires {
                        plan.delay_ms = plan.delay_ms.max(delay_ms);
                    }
                }
                Fault::Reorder { hold_ms } => {
                    if fires {
                        plan.reorder_hold_ms = Some(plan.reorder_hold_ms.unwrap_or(0).max(hold_ms));
                    }
                }
            }
        }
        plan
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
