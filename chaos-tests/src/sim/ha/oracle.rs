//! The invariants, checked after every delivered message and every tick, against etcd's
//! state (who may take over), every node's log, and what was acknowledged. It only reads the
//! world; violations seen in the middle of a step (conflicting acknowledgements, a repeated
//! epoch, an answer under a lapsed lease) are flagged there and reported here.

use coordinator::ha::rules;

use super::{Decided, World, decisions, name};

pub type Violation = (&'static str, String);

impl World {
    pub(super) fn check(&self) -> Result<(), Violation> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        // (1) No log holds two decisions for one attempt.
        for (i, node) in self.nodes.iter().enumerate() {
            if let Err(attempt) = decisions(node.log()) {
                return Err((
                    "(1) one decision per attempt",
                    format!("n{i}'s log holds two decisions for attempt {attempt}"),
                ));
            }
        }
        let Some(state) = self.etcd.state() else {
            return Ok(()); // a fresh group: nothing was decided yet
        };
        // The nodes that may take over next (the rules' own answer, never mutated).
        let eligible: Vec<usize> = (0..self.nodes.len())
            .filter(|i| rules::may_campaign(&name(*i), Some(state)))
            .collect();
        let mut held: Vec<(usize, Decided)> = Vec::new();
        for &i in &eligible {
            let log = decisions(self.nodes[i].durable.iter()).unwrap_or_default();
            // (3) Whichever of them survives a failure holds every acknowledged decision.
            for (attempt, commit) in self.acked.iter() {
                if log.get(attempt) != Some(commit) {
                    return Err((
                        "(3) no acknowledged decision lost",
                        format!(
                            "n{i} may take over (state {state:?}) but its durable log holds \
                             attempt {attempt} as {:?}, acknowledged commit={commit}",
                            log.get(attempt)
                        ),
                    ));
                }
            }
            // (1) Their durable logs agree with each other.
            for (j, other) in &held {
                for (attempt, commit) in log.iter() {
                    if let Some(theirs) = other.get(attempt)
                        && theirs != commit
                    {
                        return Err((
                            "(1) one durable decision per attempt",
                            format!(
                                "n{i} and n{j} may both take over but hold attempt {attempt} as \
                                 commit={commit} and commit={theirs}"
                            ),
                        ));
                    }
                }
            }
            held.push((i, log));
        }
        // (2) The current term's leader holds every acknowledged decision, with its value.
        for (i, node) in self.nodes.iter().enumerate() {
            let Some(lead) = &node.lead else {
                continue;
            };
            if lead.term != state.term || !node.up {
                continue;
            }
            let log = decisions(node.log()).unwrap_or_default();
            for (attempt, commit) in self.acked.iter() {
                if log.get(attempt) != Some(commit) {
                    return Err((
                        "(2) no acknowledged outcome contradicted",
                        format!(
                            "n{i} leads term {} but holds attempt {attempt} as {:?}, \
                             acknowledged commit={commit}",
                            lead.term,
                            log.get(attempt)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
