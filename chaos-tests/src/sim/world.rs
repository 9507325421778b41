//! The world of one run: a coordinator, three participants and the checkout clients, and
//! what the seed draws before the first step (the shop, the faults, the engines' bounds, the
//! orders and the first events). The files that act on it (the scheduler, the operator, the
//! trace, the invariants) stand on it; it names none of them.

use std::collections::VecDeque;

use coordinator::digest::Digest;
use coordinator::engine::{EngineConfig as CoordConfig, WaitFor};
use participant::EngineConfig as PartConfig;
use participant::kv::KvStore;
use protocol::{GlobalTxId, Outcome, ParticipantName, TxId};

use super::coordinator_node::{BatchTerms, CoordinatorNode, SubmitTx};
use super::io::Io;
use super::net::{Connections, Ev, NetFaults, Node, Queue};
use super::participant_node::ParticipantNode;
use super::{Batching, RunStats, SimConfig};
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
    /// The answer streams of batch calls (which broke).
    pub connections: Connections,
    /// Percent of batches an adversary on the wire answers a forged line for.
    pub forge_lines_pct: u32,
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
                split_pct: rng.u32(0..=30),
                reorder_pct: rng.u32(0..=50),
                cut_pct: rng.u32(0..=20),
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
        // Batching: a lane flushes up to 25 ms after its first item (often at once), and in a
        // quarter of the runs the participants take tiny batches, so the sender splits them.
        let batched = match config.batching {
            Batching::PerMessage => false,
            Batching::Batched => true,
            Batching::Seeded => io.rng.bool(),
        };
        if batched {
            coordinator.batching = Some(BatchTerms {
                max_items: if io.rng.u32(0..4) == 0 {
                    io.rng.usize(1..=3)
                } else {
                    protocol::limits::BATCH_ITEMS_MAX
                },
                linger_max_ms: io.rng.u64(0..=25),
                // A participant in eight takes no batches (an older one): one by one.
                takes_batches: [(); 3].map(|_| io.rng.u32(0..8) != 0),
            });
        }
        let forge_lines_pct = if batched && faulty && io.rng.bool() {
            io.rng.u32(1..=20)
        } else {
            0
        };
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
            connections: Connections::default(),
            forge_lines_pct,
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
        // A quarter of the runs: the clients come in a burst, so their prepares meet in the
        // same batches and queue for each other's locks.
        let first_sends = if self.io.rng.u32(0..4) == 0 {
            let start = self.io.rng.u64(1..=window / 2);
            start..=start + 40
        } else {
            1..=window / 2
        };
        for order in 0..self.clients.len() {
            // A reused id comes later, mostly after the first use of it is over.
            let at = if self.clients[order].shared_id && self.io.rng.bool() {
                self.io.rng.u64(window / 2..=window)
            } else {
                self.io.rng.u64(first_sends.clone())
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
}
