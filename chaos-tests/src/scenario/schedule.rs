//! Seeded random fault schedules: process crashes (SIGKILL any node, restart after a while),
//! network faults on a participant's link (drop request, drop response, duplicate, delay,
//! reorder, partition), and disk faults (an fsync that stalls under load, then a crash that
//! tears the unsynced last record; a zero-filled tail on a killed node). [`generate`] is pure, so a seed names a
//! schedule; [`run`] plays one against a [`ChaosCluster`] while its workload runs.

use std::time::{Duration, Instant};

use crate::proxy::{Fault, Rule, RuleId, Scope};
use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING};

use super::{COORDINATOR, ChaosCluster, disk};

const NODES: [&str; 4] = [COORDINATOR, INVENTORY, PAYMENTS, SHIPPING];
const PARTICIPANTS: [&str; 3] = [INVENTORY, PAYMENTS, SHIPPING];

/// How long a node armed to stall its fsync may take to become ready (it may stall while
/// starting, which is fine: it is killed either way).
const STALLED_START_WAIT: Duration = Duration::from_secs(20);

/// One step of a schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Let the workload run undisturbed.
    Pause { ms: u64 },
    /// SIGKILL `node`, keep it down for `down_ms`, start it again.
    Crash { node: &'static str, down_ms: u64 },
    /// Apply `rule` on `participant`'s link for the next `for_ms` (later steps run meanwhile).
    Network {
        participant: &'static str,
        rule: Rule,
        for_ms: u64,
    },
    /// Cut `participant` off from the coordinator for the next `for_ms`.
    Partition {
        participant: &'static str,
        for_ms: u64,
    },
    /// Restart `node` with `wal::between_write_and_fsync` armed to stall (a disk whose fsync
    /// never returns) for `stall_ms` under load, then SIGKILL it, tear its last record if that
    /// record was written after the stall began (never synced; cut derived from `cut`), and
    /// start it again. Anything the node let out on the strength of an unsynced record shows up
    /// as a broken invariant.
    TornWrite {
        node: &'static str,
        stall_ms: u64,
        cut: u64,
    },
    /// SIGKILL `node`, append `bytes` zeros to its last segment, start it again.
    ZeroTail { node: &'static str, bytes: u64 },
}

/// The schedule of `seed`: `steps` steps, each fault followed by a short pause.
pub fn generate(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::with_capacity(steps * 2);
    for _ in 0..steps {
        let participant = PARTICIPANTS[rng.usize(0..PARTICIPANTS.len())];
        let node = NODES[rng.usize(0..NODES.len())];
        let scope = [Scope::Any, Scope::Prepare, Scope::Commit, Scope::Abort][rng.usize(0..4)];
        let for_ms = rng.u64(500..=3_000);
        let percent = rng.u8(20..=100);
        let step = match rng.u8(0..100) {
            0..=24 => Step::Crash {
                node,
                down_ms: rng.u64(0..=1_500),
            },
            25..=34 => Step::Partition {
                participant,
                for_ms,
            },
            35..=69 => {
                let fault = match rng.u8(0..5) {
                    0 => Fault::DropRequest,
                    1 => Fault::DropResponse,
                    2 => Fault::Duplicate,
                    3 => Fault::Delay {
                        min_ms: 50,
                        max_ms: rng.u64(100..=1_500),
                    },
                    _ => Fault::Reorder {
                        hold_ms: rng.u64(100..=1_000),
                    },
                };
                Step::Network {
                    participant,
                    rule: Rule::percent(scope, fault, percent),
                    for_ms,
                }
            }
            70..=84 => Step::TornWrite {
                node,
                stall_ms: rng.u64(300..=2_000),
                cut: rng.u64(..),
            },
            _ => Step::ZeroTail {
                node,
                bytes: rng.u64(1..=8_192),
            },
        };
        out.push(step);
        out.push(Step::Pause {
            ms: rng.u64(200..=1_200),
        });
    }
    out
}

/// A network fault still in force, and when it ends.
struct Active {
    until: Instant,
    participant: &'static str,
    rule: Option<RuleId>,
}

/// Plays `steps` against `chaos` (its workload should be running), then heals every link and
/// makes sure every node runs. Returns one line per step saying what happened.
pub fn run(chaos: &mut ChaosCluster, steps: &[Step]) -> Vec<String> {
    let mut active: Vec<Active> = Vec::new();
    let mut journal = Vec::new();
    for step in steps {
        expire(chaos, &mut active, Instant::now());
        journal.push(play(chaos, &mut active, *step));
    }
    expire(
        chaos,
        &mut active,
        Instant::now() + Duration::from_secs(3_600),
    );
    chaos.heal_all();
    for node in NODES {
        if !chaos.node(node).is_running() {
            chaos.restart(node, Vec::new());
        }
    }
    journal
}

fn expire(chaos: &ChaosCluster, active: &mut Vec<Active>, now: Instant) {
    active.retain(|a| {
        if a.until > now {
            return true;
        }
        let proxy = chaos.proxy(a.participant);
        match a.rule {
            Some(id) => {
                proxy.remove(id);
            }
            None => proxy.heal(),
        }
        false
    });
}

fn play(chaos: &mut ChaosCluster, active: &mut Vec<Active>, step: Step) -> String {
    match step {
        Step::Pause { ms } => {
            std::thread::sleep(Duration::from_millis(ms));
            format!("paused {ms} ms")
        }
        Step::Crash { node, down_ms } => {
            chaos.kill(node);
            std::thread::sleep(Duration::from_millis(down_ms));
            chaos.restart(node, Vec::new());
            format!("killed {node}, restarted after {down_ms} ms")
        }
        Step::Network {
            participant,
            rule,
            for_ms,
        } => {
            let id = chaos.proxy(participant).add(rule);
            active.push(Active {
                until: Instant::now() + Duration::from_millis(for_ms),
                participant,
                rule: Some(id),
            });
            format!("{participant}: {rule:?} for {for_ms} ms")
        }
        Step::Partition {
            participant,
            for_ms,
        } => {
            chaos.proxy(participant).partition();
            active.push(Active {
                until: Instant::now() + Duration::from_millis(for_ms),
                participant,
                rule: None,
            });
            format!("{participant}: partitioned for {for_ms} ms")
        }
        Step::TornWrite {
            node,
            stall_ms,
            cut,
        } => torn_write(chaos, node, stall_ms, cut),
        Step::ZeroTail { node, bytes } => {
            chaos.kill(node);
            let (segment, fill) = disk::zero_tail(&chaos.data_dir(node), bytes);
            chaos.restart(node, Vec::new());
            format!(
                "{node}: killed, {bytes} zeros appended to {} at {}, restarted",
                segment.display(),
                fill.range.start
            )
        }
    }
}

fn torn_write(chaos: &mut ChaosCluster, node: &'static str, stall_ms: u64, cut: u64) -> String {
    // The coordinator writes (and syncs) its epoch record while starting: let that one through.
    let skip = if node == COORDINATOR { "1*off->" } else { "" };
    let stall = vec![(
        "FAILPOINTS".to_string(),
        format!("wal::between_write_and_fsync={skip}pause"),
    )];
    // What the previous run left is the boundary: it may have been synced and acknowledged.
    chaos.kill(node);
    let data_dir = chaos.data_dir(node);
    let before = disk::last_segment(&data_dir);
    let before_len = std::fs::metadata(&before).map_or(u64::MAX, |m| m.len());
    chaos.restart_no_wait(node, stall);
    // It may stall while starting (a participant never does today); it is killed either way.
    let _ = chaos.node(node).wait_ready(STALLED_START_WAIT);
    std::thread::sleep(Duration::from_millis(stall_ms));
    chaos.kill(node);
    let last = disk::last_segment(&data_dir);
    let written: Vec<disk::Frame> = disk::frames(&last)
        .into_iter()
        .filter(|f| last != before || f.offset >= before_len)
        .collect();
    // Everything this run wrote is unsynced, except the coordinator's epoch record.
    let unsynced = if node == COORDINATOR {
        written
            .iter()
            .rposition(|f| f.record_type == coordinator::records::record_type::EPOCH)
            .map_or(0, |epoch| written.len() - epoch - 1)
    } else {
        written.len()
    };
    let outcome = if unsynced == 0 {
        "no write reached the stalled log; nothing torn".to_string()
    } else {
        match disk::tear_last_record(&data_dir, cut) {
            Some((path, t)) => format!(
                "{unsynced} unsynced record(s), the last torn in {} ({} -> {} bytes)",
                path.display(),
                t.len_before,
                t.len_after
            ),
            None => "nothing to tear".to_string(),
        }
    };
    chaos.restart(node, Vec::new());
    format!("{node}: fsync stalled for {stall_ms} ms, killed, {outcome}; restarted")
}
