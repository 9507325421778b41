//! What each message does where it arrives: lease requests at the lease service, fenced
//! writes (honest and forged) and resets at the participant, and the answers at the workers,
//! the forger and the operator.

use coordinator::leases::{LeaseEvent, LeaseReply};
use participant::Event;
use participant::fence::FencedAnswer;

use super::{Payload, RESOURCE, World};

impl World {
    pub(super) fn deliver(&mut self, payload: Payload) -> Result<(), String> {
        match payload {
            Payload::Acquire { worker, ttl_ms } => {
                let event = LeaseEvent::Acquire {
                    name: RESOURCE.into(),
                    holder: format!("w{worker}"),
                    ttl_ms,
                    now_ms: self.now,
                };
                self.lease_request(worker, event)?;
            }
            Payload::Renew { worker, token } => {
                let event = LeaseEvent::Renew {
                    name: RESOURCE.into(),
                    holder: format!("w{worker}"),
                    token,
                    now_ms: self.now,
                };
                self.lease_request(worker, event)?;
            }
            Payload::Lease { worker, reply } => {
                let w = &mut self.workers[worker];
                if !w.waiting_lease {
                    return Ok(()); // a duplicate
                }
                w.waiting_lease = false;
                match reply {
                    LeaseReply::Granted(lease) => {
                        w.token = Some(lease.token);
                        w.proof = lease.proof;
                        w.believed_until = w.asked_at + lease.ttl_ms;
                    }
                    LeaseReply::Lost { .. } => w.token = None,
                    LeaseReply::Held { .. } | LeaseReply::Released(_) => {}
                }
            }
            Payload::Write { worker, write } => self.fenced_request(Some(worker), write, None),
            Payload::Forged { write, forged } => self.fenced_request(None, write, Some(forged)),
            Payload::Written {
                worker,
                op_id,
                answer,
            } => self.written(worker, op_id, answer)?,
            Payload::Refused {
                op_id,
                forged,
                rejection,
            } => self.refused(&op_id, forged, &rejection)?,
            Payload::ForgedAnswered {
                op_id,
                forged,
                answer,
            } => {
                if let FencedAnswer::Applied { receipt, .. } = &answer {
                    // The forger's own write, never another writer's receipt.
                    if receipt["key"].as_str() != Some("forged") {
                        return Err(format!(
                            "forged op {op_id} ({forged:?}) was answered another write's \
                             receipt {receipt}"
                        ));
                    }
                    self.stats.forged_applied += 1;
                }
            }
            Payload::Reset(request) => {
                let event = Event::ResetFence {
                    request,
                    now_ms: self.part_now(),
                };
                self.participant_request(event, |_| Payload::ResetDone);
            }
            Payload::ResetDone => self.reset_waiting = false,
        }
        Ok(())
    }
}
