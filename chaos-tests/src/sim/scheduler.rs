//! The scheduler: one seeded run, event by event in simulated time: each event handed to the
//! node it is for, the outboxes handed to the network, the invariants checked after every
//! step, until the run settles after the faults heal (or is stuck, a liveness failure).

use coordinator::engine::Reply as ClientReply;

use super::net::{Body, Ev, NetFaults, Node};
use super::participant_node::{Item, batch_items};
use super::world::World;
use super::{Failure, RunStats};

const STEPS_MAX: u64 = 400_000;
const CLIENT_ATTEMPTS_MAX: u32 = 4;
const CLIENT_TIMEOUT_MS: u64 = 1_500;

impl World {
    /// Runs to quiescence after the faults heal; checks every invariant after every step.
    pub fn run(&mut self) -> Result<RunStats, Failure> {
        while let Some((at_ms, ev)) = self.queue.pop() {
            self.io.now_ms = at_ms;
            self.steps += 1;
            let what = self.io.tracing.then(|| super::trace::describe(&ev));
            self.handle(ev)
                .map_err(|detail| self.failure("startup", detail))?;
            if let Some(what) = what {
                let notes: Vec<String> = self.io.notes.drain(..).collect();
                self.remember(format!("#{} t={at_ms}ms {what}", self.steps), notes);
            }
            self.flush();
            self.settle_resolutions()
                .map_err(|(inv, detail)| self.failure(inv, detail))?;
            self.check_commits_rest_on_yes()
                .map_err(|(inv, detail)| self.failure(inv, detail))?;
            self.check()
                .map_err(|(inv, detail)| self.failure(inv, detail))?;
            if self.healed && self.quiescent() {
                self.check_final()
                    .map_err(|(inv, detail)| self.failure(inv, detail))?;
                self.stats.steps = self.steps;
                self.stats.sim_ms = at_ms;
                return Ok(self.stats);
            }
            if self.steps > STEPS_MAX || at_ms > self.heal_at_ms + self.config.quiesce_bound_ms {
                let detail = self.stuck();
                return Err(self.failure("liveness", detail));
            }
        }
        let detail = self.stuck();
        Err(self.failure("liveness", format!("the event queue ran dry: {detail}")))
    }

    fn failure(&self, invariant: &str, detail: String) -> Failure {
        Failure {
            seed: self.seed,
            mutation: self.config.mutation,
            batching: self.config.batching,
            orders: self.config.orders,
            invariant: invariant.to_string(),
            detail,
            step: self.steps,
            now_ms: self.io.now_ms,
            trace: self.trace.iter().cloned().collect(),
        }
    }

    /// Hands the outboxes to the network and the queue; maybe crashes a node that just acted.
    fn flush(&mut self) {
        let faults = if self.healed {
            NetFaults::NONE
        } else {
            self.faults
        };
        for msg in std::mem::take(&mut self.io.msgs) {
            if let Some((batch, items)) = msg.body.batch() {
                if items > 0 {
                    self.stats.batches += 1;
                    self.stats.batch_items += items as u64;
                    // An adversary that saw the batch on the wire forges an answer line.
                    if !self.healed && self.io.rng.u32(0..100) < self.forge_lines_pct {
                        let after = self.io.rng.u64(0..=faults.delay_max_ms);
                        self.queue
                            .push(self.io.now_ms + after, Ev::ForgeLine(batch));
                    }
                } else if !self.connections.carries(&faults, &mut self.io.rng, batch) {
                    self.stats.messages += 1;
                    self.stats.lines_cut += 1;
                    continue;
                }
            }
            let reshaped = faults.reshape(&mut self.io.rng, msg);
            self.stats.batch_splits += u64::from(reshaped.split);
            self.stats.batch_reorders += u64::from(reshaped.reordered);
            for msg in reshaped.msgs {
                self.stats.messages += 1;
                let times = faults.schedule(&mut self.io.rng, self.io.now_ms);
                match times.len() {
                    0 => self.stats.dropped += 1,
                    1 => {}
                    _ => self.stats.duplicated += 1,
                }
                for at in times {
                    self.queue.push(at, Ev::Deliver(msg.clone()));
                }
            }
        }
        for (at, ev) in std::mem::take(&mut self.io.events) {
            self.queue.push(at, ev);
        }
    }

    fn maybe_crash_after(&mut self, node: Node) {
        if !self.healed && self.io.rng.u32(0..100) < self.crash_after_step_pct {
            self.queue.push(self.io.now_ms, Ev::Crash(node));
        }
    }

    fn handle(&mut self, ev: Ev) -> Result<(), String> {
        match ev {
            Ev::Deliver(msg) => match msg.to {
                None => self.client_answer(msg.body),
                Some(Node::Coordinator) => {
                    if let Body::Submit { order, attempt } = msg.body {
                        if self.coordinator.is_up() {
                            let tx = self.clients[order].tx.clone();
                            self.coordinator.submit(&mut self.io, order, attempt, &tx);
                        }
                    } else {
                        self.coordinator.deliver(&mut self.io, msg.body);
                    }
                    self.maybe_crash_after(Node::Coordinator);
                }
                Some(Node::Participant(i))
                    if matches!(
                        msg.body,
                        Body::PrepareBatch { .. } | Body::DecideBatch { .. }
                    ) =>
                {
                    self.deliver_batch(i, batch_items(msg.body));
                }
                Some(Node::Participant(i)) => {
                    self.participants[i].deliver(&mut self.io, msg.body);
                    self.maybe_crash_after(Node::Participant(i));
                }
            },
            Ev::Timer {
                node,
                incarnation,
                timer,
            } => match node {
                Node::Coordinator => self.coordinator.timer(&mut self.io, incarnation, timer),
                Node::Participant(i) => {
                    self.participants[i].timer(&mut self.io, incarnation, timer)
                }
            },
            Ev::DiskSync { node, incarnation } => match node {
                Node::Coordinator if incarnation == self.coordinator.incarnation => {
                    self.coordinator.disk_synced(&mut self.io);
                    self.maybe_crash_after(node);
                }
                Node::Participant(i) if incarnation == self.participants[i].incarnation => {
                    self.participants[i].disk_synced(&mut self.io);
                    self.maybe_crash_after(node);
                }
                Node::Coordinator | Node::Participant(_) => {}
            },
            Ev::Crash(node) => self.crash(node),
            Ev::Restart(node) => self.restart(node)?,
            Ev::Backup if !self.healed => {
                self.coordinator.backup();
                let downtime = self.io.rng.u64(20..=300);
                self.io.after(downtime, Ev::Restart(Node::Coordinator));
            }
            Ev::Restore if !self.healed => {
                if self.coordinator.restore() {
                    self.stats.restores += 1;
                    let downtime = self.io.rng.u64(20..=300);
                    self.io.after(downtime, Ev::Restart(Node::Coordinator));
                }
            }
            Ev::Backup | Ev::Restore => {}
            Ev::Checkpoint(node) => match node {
                Node::Coordinator => self.coordinator.checkpoint(&mut self.io),
                Node::Participant(i) => self.participants[i].checkpoint(&mut self.io),
            },
            Ev::ClientSend { order, attempt } => {
                let client = &mut self.clients[order];
                client.attempts = attempt;
                self.io.send(super::net::Msg {
                    to: Some(Node::Coordinator),
                    body: Body::Submit { order, attempt },
                });
                self.io
                    .after(CLIENT_TIMEOUT_MS, Ev::ClientTimeout { order, attempt });
            }
            Ev::ClientTimeout { order, attempt } => {
                let client = &mut self.clients[order];
                if client.observed.is_empty() && client.attempts == attempt {
                    if attempt < CLIENT_ATTEMPTS_MAX {
                        let backoff = self.io.rng.u64(10..=500);
                        self.io.after(
                            backoff,
                            Ev::ClientSend {
                                order,
                                attempt: attempt + 1,
                            },
                        );
                    } else {
                        // Gives up: the outcome stays unknown to this client (never assumed).
                        client.busy = false;
                    }
                }
            }
            Ev::Operator => {
                self.operator_idle = self.operator_round() == super::operator::Round::Idle;
                if !self.operator_idle {
                    self.io.after(super::operator::ROUND_MS, Ev::Operator);
                }
            }
            Ev::Forge(target) => {
                if self.participants[target].is_up() {
                    let coordinator_id =
                        protocol::CoordinatorId::new(super::coordinator_node::COORDINATOR_ID)
                            .map_err(|e| e.to_string())?;
                    let msg = super::forger::forge(
                        &mut self.io.rng,
                        &coordinator_id,
                        &self.participants[target],
                    );
                    self.stats.forged += 1;
                    self.participants[target].deliver(&mut self.io, msg.body);
                }
            }
            Ev::ForgeLine(batch) => {
                if self.coordinator.is_up() {
                    let items = self.coordinator.batch_items(batch);
                    if let Some(msg) = super::forger::forge_line(
                        &mut self.io.rng,
                        batch,
                        self.coordinator.incarnation,
                        &items,
                    ) {
                        self.stats.forged_lines += 1;
                        self.coordinator.deliver(&mut self.io, msg.body);
                    }
                }
            }
            Ev::HostileQuery => {
                if self.coordinator.is_up() {
                    let coordinator_id =
                        protocol::CoordinatorId::new(super::coordinator_node::COORDINATOR_ID)
                            .map_err(|e| e.to_string())?;
                    let msg = super::forger::hostile_query(&mut self.io.rng, &coordinator_id);
                    self.stats.forged += 1;
                    self.coordinator.deliver(&mut self.io, msg.body);
                }
            }
            Ev::HostileOperator => {
                if self.coordinator.is_up() {
                    self.hostile_operator();
                }
            }
            Ev::Heal => {
                self.healed = true;
                self.io.after(super::operator::ROUND_MS, Ev::Operator);
                if !self.coordinator.is_up() {
                    self.restart(Node::Coordinator)?;
                }
                for i in 0..self.participants.len() {
                    if !self.participants[i].is_up() {
                        self.restart(Node::Participant(i))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A batch reaches participant `i`: its items one by one, each as the lone message, with a
    /// crash point after each (the records of the items before it written, maybe not yet
    /// durable, their answers waiting on them; the items after it never seen).
    fn deliver_batch(&mut self, i: usize, items: Vec<Item>) {
        let node = Node::Participant(i);
        for item in items {
            self.participants[i].deliver_item(&mut self.io, item);
            if !self.healed && self.io.rng.u32(0..100) < self.crash_after_step_pct {
                self.crash(node);
                return;
            }
        }
    }

    fn crash(&mut self, node: Node) {
        if self.healed {
            return;
        }
        // Half the time a power loss (only synced records survive), otherwise a process crash
        // that keeps some of what was written after the last sync.
        let power_loss = self.io.rng.bool();
        let unsynced = match node {
            Node::Coordinator => self.coordinator.disk.unsynced(),
            Node::Participant(i) => self.participants[i].disk.unsynced(),
        };
        let extra = if power_loss {
            0
        } else {
            self.io.rng.usize(0..=unsynced)
        };
        let up = match node {
            Node::Coordinator => self.coordinator.is_up(),
            Node::Participant(i) => self.participants[i].is_up(),
        };
        if !up {
            return;
        }
        self.stats.crashes += 1;
        self.io
            .note(|| format!("{node:?} crashes, keeping {extra} of {unsynced} unsynced records"));
        match node {
            Node::Coordinator => self.coordinator.crash(extra),
            Node::Participant(i) => self.participants[i].crash(extra),
        }
        let downtime = self.io.rng.u64(20..=600);
        self.io.after(downtime, Ev::Restart(node));
    }

    pub(super) fn restart(&mut self, node: Node) -> Result<(), String> {
        match node {
            Node::Coordinator if !self.coordinator.is_up() => {
                self.coordinator.start(&mut self.io);
            }
            Node::Participant(i) if !self.participants[i].is_up() => {
                self.participants[i].start(&mut self.io)?;
            }
            Node::Coordinator | Node::Participant(_) => {}
        }
        Ok(())
    }

    fn client_answer(&mut self, body: Body) {
        let Body::ClientAnswer {
            order,
            attempt,
            reply,
        } = body
        else {
            return;
        };
        let client = &mut self.clients[order];
        let outcome = match reply {
            ClientReply::Outcome(response) => Ok((response.gtid, response.outcome)),
            // The id is another client's while its outcome is remembered: try again later
            // (the client's timeout retries), or give up.
            ClientReply::Conflict { .. } if client.shared_id => return,
            ClientReply::Conflict { txid } => Err(format!("409 conflict for {txid}")),
            ClientReply::LogFailed { error } => Err(format!("log failed: {error}")),
            // Admission control turned it away; nothing was begun, its timer tries again.
            ClientReply::Overloaded { .. } => return,
            // 503s: nothing was started; the client's timeout retries with the same id.
            ClientReply::Busy { .. } | ClientReply::IndexUnavailable { .. } => return,
            ClientReply::LookAgain => Err("an internal LookAgain reached the client".into()),
        };
        match outcome {
            Ok((gtid, outcome)) => {
                if let Some((_, seen)) = client.observed.iter().find(|(g, _)| *g == gtid)
                    && *seen != outcome
                {
                    self.problem = Some((
                        "durability",
                        format!(
                            "client saw two outcomes for attempt {gtid} of {}: {seen:?}, then \
                             {outcome:?}",
                            client.order.id
                        ),
                    ));
                    return;
                }
                self.io.note(|| {
                    format!(
                        "client {} attempt {attempt} sees {outcome:?} ({gtid})",
                        client.order.id
                    )
                });
                client.observed.push((gtid, outcome));
                client.busy = false;
            }
            Err(e) => {
                self.problem = Some((
                    "client contract",
                    format!("client {} got {e}", client.order.id),
                ));
            }
        }
    }

    /// Nothing left to do: the coordinator has nothing live (or is behind and refuses work;
    /// what it still holds it cannot deliver to participants that fenced it out), every
    /// participant's prepared attempt is one the coordinator cannot decide, and no client waits.
    fn quiescent(&self) -> bool {
        let Some(engine) = &self.coordinator.engine else {
            return false;
        };
        let g = engine.gauges();
        (g.preparing + g.committing + g.aborting + g.pending_acks == 0
            || self.coordinator.is_behind())
            && self.participants.iter().all(|p| {
                p.engine
                    .as_ref()
                    .is_some_and(|e| e.prepared_len() == p.undecidable().len())
            })
            && self.clients.iter().all(|c| !c.busy)
            && self.operator_idle
    }
}
