//! Those who take steps of their own: the workers (acquire, renew, write, pause between the
//! check and the write, resend what got no answer), the forger, and the operator who resets
//! a fence a forged token raised.

use participant::fence::FencedWrite;
use protocol::lease::FenceClaim;

use crate::sim::fencing_adversary::{self, Target};

use super::{JUMP_MAX, Payload, RESOURCE, World};

impl World {
    pub(super) fn step_worker(&mut self, i: usize) {
        let now = self.now;
        if self.workers[i].paused_until > now {
            return;
        }
        if let Some(write) = self.workers[i].deferred.take() {
            // Back from a pause taken after checking the lease: it writes anyway.
            self.workers[i]
                .unanswered
                .insert(write.op_id.clone(), (write.clone(), now));
            self.send(Payload::Write { worker: i, write });
            return;
        }
        let resend: Vec<FencedWrite> = self.workers[i]
            .unanswered
            .values()
            .filter(|(_, at)| now.saturating_sub(*at) > 400)
            .map(|(w, _)| w.clone())
            .collect();
        for write in resend {
            self.workers[i]
                .unanswered
                .insert(write.op_id.clone(), (write.clone(), now));
            self.send(Payload::Write { worker: i, write });
        }
        let w = &mut self.workers[i];
        if w.waiting_lease {
            if now.saturating_sub(w.asked_at) > 300 {
                w.waiting_lease = false; // the answer was lost; ask again later
            }
            return;
        }
        match w.token {
            None => {
                w.waiting_lease = true;
                w.asked_at = now;
                let ttl_ms = self.rng.u64(100..600);
                self.send(Payload::Acquire { worker: i, ttl_ms });
            }
            Some(_) if now >= w.believed_until => w.token = None,
            Some(token) if self.rng.bool() => {
                w.waiting_lease = true;
                w.asked_at = now;
                self.send(Payload::Renew { worker: i, token });
            }
            Some(token) => {
                w.writes += 1;
                let value = format!("w{i}-{}", w.writes);
                let write = FencedWrite {
                    op_id: value.clone(),
                    fence: FenceClaim {
                        resource: RESOURCE.into(),
                        token,
                        holder: Some(format!("w{i}")),
                        proof: w.proof.clone(),
                    },
                    payload: serde_json::json!({"ops": [
                        {"op": "put", "key": format!("k{}", w.writes % 3), "value": value}
                    ]}),
                };
                self.payloads
                    .insert(write.op_id.clone(), write.payload.clone());
                if self.rng.u32(0..10) == 0 {
                    // Checked its lease, then stopped (GC, SIGSTOP) before writing.
                    w.paused_until = now + self.rng.u64(50..1_500);
                    w.deferred = Some(write);
                    self.stats.pauses += 1;
                } else {
                    w.unanswered
                        .insert(write.op_id.clone(), (write.clone(), now));
                    self.send(Payload::Write { worker: i, write });
                }
            }
        }
    }

    /// The adversary's turn: a forged write, now and then.
    pub(super) fn step_forger(&mut self) {
        let highest_granted = self.granted.last_key_value().map_or(0, |(t, _)| *t);
        let known: Vec<String> = self.first_answers.keys().cloned().collect();
        let target = Target {
            resource: RESOURCE,
            jump_max: JUMP_MAX,
        };
        if let Some((write, forged)) = fencing_adversary::forge(
            &mut self.rng,
            target,
            highest_granted,
            &known,
            self.stats.forged,
        ) {
            self.stats.forged += 1;
            self.send(Payload::Forged { write, forged });
        }
    }

    /// The operator's turn: when the fence stands above every granted token (a forged token
    /// got in, without a key), they read it and reset it to the last grant.
    pub(super) fn step_operator(&mut self) {
        if self.reset_waiting {
            return;
        }
        let highest_granted = self.granted.last_key_value().map_or(0, |(t, _)| *t);
        let seen = self.part.fences().effective_highest(RESOURCE);
        if let Some(request) = fencing_adversary::reset_if_forged(RESOURCE, seen, highest_granted) {
            self.reset_waiting = true;
            self.stats.resets += 1;
            self.send(Payload::Reset(request));
        }
    }
}
