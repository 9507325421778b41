//! The lease service as its runtime runs the pure engine: a reply that rests on a logged
//! record leaves once the record is durable (the mutation answers at once), grants are signed
//! for their holder with a key and checked as they leave (never one token to two holders,
//! always higher than before), and a crash keeps the durable log plus any prefix of the rest.

use coordinator::leases::{LeaseCommand, LeaseEngine, LeaseEvent, LeaseReply};

use super::{FencingMutation, Payload, World};

impl World {
    /// The coordinator answers (the moment a holder may hear it): a token is never answered
    /// to two holders, and a new token is higher than every one answered before. With a key,
    /// the API signs the grant for its holder, as `api::leases` does.
    fn answer_lease(&mut self, answer: Payload) -> Result<(), String> {
        let answer = match answer {
            Payload::Lease {
                worker,
                reply: LeaseReply::Granted(mut lease),
            } => {
                if let Some(keys) = &self.keys {
                    lease.proof = Some(keys.sign(&lease.name, lease.token, &lease.holder));
                }
                Payload::Lease {
                    worker,
                    reply: LeaseReply::Granted(lease),
                }
            }
            other => other,
        };
        if let Payload::Lease { worker, reply } = &answer {
            let worker = *worker;
            let reply = reply.clone();
            if let LeaseReply::Granted(lease) = &reply {
                match self.granted.get(&lease.token) {
                    Some(&other) if other != worker => {
                        return Err(format!(
                            "token {} granted to w{other} and to w{worker}",
                            lease.token
                        ));
                    }
                    Some(_) => {}
                    None => {
                        if let Some((&highest, _)) = self.granted.last_key_value()
                            && lease.token < highest
                        {
                            return Err(format!(
                                "new grant of token {} after token {highest}",
                                lease.token
                            ));
                        }
                        self.granted.insert(lease.token, worker);
                        self.stats.grants += 1;
                    }
                }
            }
        }
        self.send(answer);
        Ok(())
    }

    pub(super) fn lease_request(&mut self, worker: usize, event: LeaseEvent) -> Result<(), String> {
        let commands = self.leases.step(event);
        let logged = commands
            .iter()
            .any(|c| matches!(c, LeaseCommand::Append(_)));
        for command in commands {
            match command {
                LeaseCommand::Append(record) => self.lease_log.pending.push(record),
                LeaseCommand::Reply(reply) => {
                    let answer = Payload::Lease { worker, reply };
                    if logged && self.mutation != FencingMutation::GrantBeforeDurable {
                        self.lease_waiting.push(answer);
                    } else {
                        self.answer_lease(answer)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Everything submitted is durable; answers waiting for it leave.
    pub(super) fn sync_leases(&mut self) -> Result<(), String> {
        let pending = std::mem::take(&mut self.lease_log.pending);
        self.lease_log.durable.extend(pending);
        for answer in std::mem::take(&mut self.lease_waiting) {
            self.answer_lease(answer)?;
        }
        if self.rng.u32(0..20) == 0 {
            self.lease_snapshot = self.leases.snapshot();
            self.lease_log.durable.clear();
        }
        Ok(())
    }

    /// A crash: the unsynced tail survives up to a random point; unsent answers are gone.
    pub(super) fn crash_leases(&mut self) {
        let pending = std::mem::take(&mut self.lease_log.pending);
        let kept = self.rng.usize(0..=pending.len());
        self.lease_log
            .durable
            .extend(pending.into_iter().take(kept));
        self.lease_waiting.clear();
        self.leases = LeaseEngine::recover(
            self.lease_snapshot.clone(),
            self.lease_log.durable.clone(),
            self.now,
        );
        self.stats.crashes += 1;
    }
}
