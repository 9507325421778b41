//! The scheduler: one seeded run of a coordinator, three participants and the checkout clients,
//! event by event in simulated time, with the invariants checked after every step.

use std::collections::VecDeque;

use coordinator::digest::Digest;
use coordinator::engine::{EngineConfig as CoordConfig, Reply as ClientReply, WaitFor};
use participant::EngineConfig as PartConfig;
use participant::kv::KvStore;
use protocol::{GlobalTxId, Outcome, ParticipantName, TxId};

use super::coordinator_node::{CoordinatorNode, SubmitTx};
use super::io::Io;
use super::net::{Body, Ev, NetFaults, Node, Queue};
use super::participant_node::ParticipantNode;
use super::{Failure, RunStats, SimConfig};
use cluster::checkout::{self, CheckoutConfig, Order};

/// The checkout orders as the clients see them.
#[derive(Debug)]
pub struct Client {
    pub order: Order,
    pub tx: SubmitTx,
    /// Every outcome the client saw, with the attempt it came from (the answers of one attempt
    /// must agree; a retry after the outcome was forgotten is another attempt).
    pub observed: Vec<(GlobalTxId, Outcome)>,
    /// Another client uses the same id with another body (a client id reused), so `409
    /// id_conflict` is a fair answer while the other's outcome is remembered.
    pub shared_id: bool,
    pub attempts: u32,
    /// An attempt is waiting for an answer or a retry is scheduled.
    pub busy: bool,
    /// Per participant, the key whose presence says the order was applied there.
    pub markers: [String; 3],
}

/// The conservation keys: (stock, sold) per sku and (balance, spent) per customer.
#[derive(Debug)]
pub struct ShopKeys {
    pub stock: Vec<(String, String)>,
    pub money: Vec<(String, String)>,
}

#[derive(Debug)]
pub struct World {
    pub seed: u64,
    pub config: SimConfig,
    pub shop: CheckoutConfig,
    pub keys: ShopKeys,
    pub io: Io,
    pub queue: Queue,
    pub coordinator: CoordinatorNode,
    pub participants: Vec<ParticipantNode>,
    pub clients: Vec<Client>,
    pub faults: NetFaults,
    /// Percent of node steps right after which that node crashes (a crash point anywhere).
    pub crash_after_step_pct: u32,
    pub healed: bool,
    pub heal_at_ms: u64,
    pub trace: VecDeque<String>,
    pub trace_keep: usize,
    pub steps: u64,
    pub stats: RunStats,
    /// A violation seen while handling an event (reported by the next check).
    pub problem: Option<(&'static str, String)>,
    /// The operator's last round found nothing left to resolve (see `operator`).
    pub operator_idle: bool,
    /// A mistaken resolve (`Ev::HostileOperator`) the coordinator accepted, if any.
    pub hostile_accepted: Option<String>,
}

/// Steps kept in a failure's trace (`TWOPC_SIM_TRACE=N` for more).
const TRACE_KEEP: usize = 40;
const STEPS_MAX: u64 = 400_000;
const CLIENT_ATTEMPTS_MAX: u32 = 4;
const CLIENT_TIMEOUT_MS: u64 = 1_500;

impl World {
    pub fn new(seed: u64, config: SimConfig, tracing: bool) -> Self {
        let mut io = Io::new(seed, config.mutation);
        io.tracing = tracing;
        let rng = &mut io.rng;
        let shop = CheckoutConfig {
            skus: 3,
            stock_per_sku: rng.i64(2..=6),
            customers: 3,
            balance_per_customer: rng.i64(20..=80),
            max_quantity: 3,
            max_unit_price: 20,
        };
        let faulty = config.faults;
        let faults = if faulty {
            NetFaults {
                drop_pct: rng.u32(0..=20),
                dup_pct: rng.u32(0..=15),
                delay_max_ms: rng.u64(1..=60),
                long_delay_pct: rng.u32(0..=5),
            }
        } else {
            NetFaults::NONE
        };
        io.sync_max_ms = io.rng.u64(0..=12);
        let crash_after_step_pct = if faulty { io.rng.u32(0..=3) } else { 0 };
        let names: Vec<ParticipantName> = [
            cluster::checkout::INVENTORY,
            cluster::checkout::PAYMENTS,
            cluster::checkout::SHIPPING,
        ]
        .iter()
        .map(|n| ParticipantName::new(*n).expect("constant names are valid"))
        .collect();
        // A third of the runs remember almost nothing: outcomes and tombstones leave within a
        // transaction or two, so every retry and every late message meets a forgotten id.
        let retained_max = if io.rng.u32(0..3) == 0 {
            io.rng.usize(1..=3)
        } else {
            10_000
        };
        let tombstones_max = if io.rng.u32(0..3) == 0 {
            io.rng.usize(1..=4)
        } else {
            1_000_000
        };
        // A third of the runs admit almost nothing: a participant with one or two transactions
        // in progress or unacknowledged turns new work away (503 overloaded), and a second
        // request for one transaction may be refused; the clients' timers try again.
        let bounds = if io.rng.u32(0..3) == 0 {
            coordinator::engine::Bounds {
                live_per_participant: io.rng.u64(1..=2),
                pending_acks_per_participant: io.rng.u64(1..=2),
                waiters_per_transaction: io.rng.usize(1..=2),
            }
        } else {
            coordinator::engine::Bounds::UNBOUNDED
        };
        let mut coordinator = CoordinatorNode::new(
            CoordConfig {
                retry_base_ms: 50,
                retry_max_ms: 800,
                retained_max,
                bounds,
            },
            names.clone(),
        );
        // The same runs keep almost nothing in the outcome index either (a tiny disk budget):
        // forgotten ids meet retries and late messages.
        if retained_max < 10 {
            coordinator.index_max = retained_max;
        }
        let part_config = PartConfig {
            in_doubt_after_ms: 300,
            decision_backoff_base_ms: 50,
            decision_backoff_max_ms: 800,
            tombstone_retention_ms: u64::MAX / 4,
            tombstones_max,
            // Waits shorter than most prepare deadlines (60..=400 ms), so both a granted
            // waiter and one that times out happen in the mix.
            lock_wait_max_ms: 150,
            lock_waiters_max: 64,
            epoch_jump_max: (config.mutation != super::Mutation::NoEpochBound)
                .then_some(super::forger::EPOCH_JUMP_MAX),
            ..PartConfig::default()
        };
        let participants = shop
            .seeds()
            .into_iter()
            .enumerate()
            .map(|(i, (_, seed_json))| {
                let bytes = serde_json::to_vec(&seed_json).unwrap_or_default();
                let store = KvStore::from_seed(&bytes).unwrap_or_default();
                ParticipantNode::new(i, part_config.clone(), store)
            })
            .collect();
        let mut clients = Vec::new();
        for index in 0..config.orders {
            let order = shop.order("o", index as u64, &mut io.rng);
            let participants = order
                .payloads()
                .into_iter()
                .map(|(name, payload)| {
                    (
                        ParticipantName::new(name).expect("constant names are valid"),
                        serde_json::to_value(payload).unwrap_or_default(),
                    )
                })
                .collect();
            let wait = if io.rng.u32(0..4) == 0 {
                WaitFor::Acked
            } else {
                WaitFor::Decision
            };
            // A quarter of the later orders reuse an earlier client's id with their own body.
            let reused = (index > 0 && io.rng.u32(0..4) == 0).then(|| io.rng.usize(0..index));
            let txid = match reused {
                Some(earlier) => {
                    let earlier: &mut Client = &mut clients[earlier];
                    earlier.shared_id = true;
                    earlier.tx.txid.clone()
                }
                None => TxId::new(order.id.clone()).expect("order ids are valid"),
            };
            let tx = SubmitTx {
                txid,
                digest: Digest(index as u128 + 1),
                participants,
                timeout_ms: io.rng.u64(60..=400),
                wait,
            };
            let markers = order.marker_keys().map(|(_, key)| key);
            clients.push(Client {
                markers,
                order,
                tx,
                observed: Vec::new(),
                shared_id: reused.is_some(),
                attempts: 0,
                busy: true,
            });
        }
        let heal_at_ms = config.fault_window_ms;
        let keys = ShopKeys {
            stock: (0..shop.skus)
                .map(|s| (checkout::stock_key(s), checkout::sold_key(s)))
                .collect(),
            money: (0..shop.customers)
                .map(|c| (checkout::balance_key(c), checkout::spent_key(c)))
                .collect(),
        };
        let mut world = World {
            seed,
            config,
            shop,
            keys,
            io,
            queue: Queue::default(),
            coordinator,
            participants,
            clients,
            faults,
            crash_after_step_pct,
            healed: !faulty,
            heal_at_ms,
            trace: VecDeque::new(),
            trace_keep: std::env::var("TWOPC_SIM_TRACE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(TRACE_KEEP),
            steps: 0,
            stats: RunStats::default(),
            problem: None,
            // Without faults nothing is ever in doubt for good: no operator rounds.
            operator_idle: !config.faults,
            hostile_accepted: None,
        };
        world.schedule_start();
        world
    }

    fn schedule_start(&mut self) {
        let window = self.config.fault_window_ms;
        self.queue.push(0, Ev::Restart(Node::Coordinator));
        for i in 0..self.participants.len() {
            self.queue.push(0, Ev::Restart(Node::Participant(i)));
        }
        for order in 0..self.clients.len() {
            // A reused id comes later, mostly after the first use of it is over.
            let at = if self.clients[order].shared_id && self.io.rng.bool() {
                self.io.rng.u64(window / 2..=window)
            } else {
                self.io.rng.u64(1..=window / 2)
            };
            self.queue.push(at, Ev::ClientSend { order, attempt: 1 });
        }
        if self.config.faults {
            for _ in 0..self.io.rng.u32(0..=4) {
                let at = self.io.rng.u64(1..window);
                let node = self.random_node();
                self.queue.push(at, Ev::Crash(node));
            }
            for _ in 0..self.io.rng.u32(0..=3) {
                let at = self.io.rng.u64(1..window);
                let node = self.random_node();
                self.queue.push(at, Ev::Checkpoint(node));
            }
            // A quarter of the faulty runs: an operator copies the coordinator's data directory
            // while it is stopped, and later puts the copy back.
            if self.io.rng.u32(0..4) == 0 {
                let backup_at = self.io.rng.u64(1..window / 2);
                let restore_at = self.io.rng.u64(backup_at + 1..window);
                self.queue.push(backup_at, Ev::Backup);
                self.queue.push(restore_at, Ev::Restore);
            }
            // Half the faulty runs: an adversary on the network forges a few messages.
            if self.io.rng.bool() {
                for _ in 0..self.io.rng.u32(1..=4) {
                    let at = self.io.rng.u64(1..window);
                    let target = self.io.rng.usize(0..self.participants.len());
                    self.queue.push(at, Ev::Forge(target));
                }
            }
            // Half the faulty runs: a hostile peer asks about made-up runs and epochs, and an
            // operator who errs tries to resolve what is not theirs to.
            if self.io.rng.bool() {
                for _ in 0..self.io.rng.u32(1..=4) {
                    let at = self.io.rng.u64(1..window);
                    self.queue.push(at, Ev::HostileQuery);
                }
            }
            if self.io.rng.bool() {
                for _ in 0..self.io.rng.u32(1..=4) {
                    let at = self.io.rng.u64(1..window);
                    self.queue.push(at, Ev::HostileOperator);
                }
            }
            self.queue.push(window, Ev::Heal);
        }
    }

    fn random_node(&mut self) -> Node {
        match self.io.rng.usize(0..=self.participants.len()) {
            0 => Node::Coordinator,
            i => Node::Participant(i - 1),
        }
    }

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
