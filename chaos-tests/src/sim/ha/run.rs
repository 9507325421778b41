//! One seeded run, tick by tick: time advances 1-5 ms; etcd expires leases; stopped
//! processes restart; due messages arrive (to a paused process they wait until it wakes; to
//! a dead one they are lost), each followed by the checks; then, during the fault window, the
//! faults are drawn (crash, pause past the lease, partition, lag); a client asks; every
//! running node ticks; the checks again. The order of the draws is what a seed means.

use super::net::{End, Msg};
use super::{ATTEMPTS, CALM_MS, HaFailure, HaStats, RUN_MS, TTL_MS, World};

impl World {
    pub(super) fn run(mut self) -> Result<HaStats, HaFailure> {
        while self.now < RUN_MS + CALM_MS {
            self.now += self.rng.u64(1..=5);
            self.stats.ticks += 1;
            self.etcd.expire(self.now);
            for i in 0..self.nodes.len() {
                if !self.nodes[i].up && self.nodes[i].restart_at <= self.now {
                    self.restart(i);
                }
            }
            for msg in self.net.due(self.now) {
                if let Some(to) = msg.to_node() {
                    let node = &self.nodes[to];
                    if !node.up {
                        continue;
                    }
                    if node.paused_until > self.now {
                        // The stopped process's socket buffers: read when it wakes, lost if
                        // it is killed first.
                        self.nodes[to].held.push(msg);
                        continue;
                    }
                    self.take_held(to)?;
                }
                self.take(msg)?;
            }
            if self.now < RUN_MS {
                self.faults();
            }
            if self.rng.u32(0..3) == 0 {
                let to = self.rng.usize(0..self.nodes.len());
                let attempt = self.rng.u64(0..ATTEMPTS);
                self.send(Msg::Decide { to, attempt });
            }
            for i in 0..self.nodes.len() {
                if self.nodes[i].runs(self.now) {
                    self.take_held(i)?;
                    if self.nodes[i].runs(self.now) {
                        self.node_tick(i);
                    }
                }
            }
            self.checked()?;
        }
        Ok(self.stats)
    }

    /// One message arrives, then the checks.
    fn take(&mut self, msg: Msg) -> Result<(), HaFailure> {
        if self.trace.is_some()
            && let Some(what) = describe(&msg)
        {
            self.note(|| what);
        }
        self.deliver(msg);
        self.checked()
    }

    /// A woken process reads what arrived while it was stopped, in order.
    fn take_held(&mut self, i: usize) -> Result<(), HaFailure> {
        for msg in std::mem::take(&mut self.nodes[i].held) {
            if !self.nodes[i].runs(self.now) {
                break; // it exited on one of them: the rest died with it
            }
            self.take(msg)?;
        }
        Ok(())
    }

    /// The checks, unless nothing they read changed since the last time.
    fn checked(&mut self) -> Result<(), HaFailure> {
        let now = (self.changes, self.etcd.revision());
        if now == self.checked {
            return Ok(());
        }
        self.checked = now;
        self.check().map_err(|(inv, d)| self.failure(inv, d))
    }

    /// The leader if one runs, else any node: the faults that matter hit the leader.
    fn victim(&mut self) -> usize {
        let leader = (0..self.nodes.len()).find(|i| self.nodes[*i].lead.is_some());
        match leader {
            Some(i) if self.rng.bool() => i,
            _ => self.rng.usize(0..self.nodes.len()),
        }
    }

    fn faults(&mut self) {
        if self.rng.u32(0..300) == 0 {
            let i = self.victim();
            self.crash(i);
        }
        if self.rng.u32(0..250) == 0 {
            let i = self.victim();
            if self.nodes[i].runs(self.now) {
                // SIGSTOP past the lease; SIGCONT later, with everything still in flight.
                let until = self.now + TTL_MS + self.rng.u64(0..2 * TTL_MS);
                self.nodes[i].paused_until = until;
                self.stats.pauses += 1;
                self.note(|| format!("n{i} paused (SIGSTOP) until t={until}"));
            }
        }
        if self.rng.u32(0..120) == 0 {
            let n = self.nodes.len();
            let a = self.rng.usize(0..=n);
            let b = (a + self.rng.usize(1..=n)) % (n + 1);
            let end = |k: usize| if k == n { End::Etcd } else { End::Node(k) };
            let until = self.now + self.rng.u64(30..400);
            self.net.partition(end(a), end(b), until);
            self.stats.partitions += 1;
            self.note(|| format!("partition {:?} | {:?} until t={until}", end(a), end(b)));
        }
        if self.rng.u32(0..150) == 0 {
            let i = self.rng.usize(0..self.nodes.len());
            let until = self.now + self.rng.u64(100..600);
            self.net.lag(i, until);
            self.note(|| format!("n{i} lags until t={until}"));
        }
    }
}

/// A trace line for a delivered message (keep-alives and watches are left out: noise).
fn describe(msg: &Msg) -> Option<String> {
    use super::etcd::{Op, Reply};
    Some(match msg {
        Msg::ToEtcd { from, op, .. } => match op {
            Op::KeepAlive { .. } | Op::Get | Op::Grant { .. } => return None,
            Op::Txn { cmps, puts } => format!("etcd <- n{from}: txn if {cmps:?} put {puts:?}"),
        },
        Msg::FromEtcd { to, reply, .. } => match reply {
            Reply::Txn { ok, revision } => format!("n{to} <- etcd: txn ok={ok} rev={revision}"),
            Reply::KeptAlive { alive: false, .. } => format!("n{to} <- etcd: lease gone"),
            _ => return None,
        },
        Msg::Backup {
            from,
            to,
            epoch,
            log,
            ..
        } => format!(
            "n{to} <- n{from}: base backup epoch {epoch}, {} records",
            log.len()
        ),
        Msg::Ship {
            from,
            to,
            epoch,
            at,
            recs,
            ..
        } => format!("n{to} <- n{from}: ship epoch {epoch} at {at}: {recs:?}"),
        Msg::Confirm { from, to, len, .. } => format!("n{to} <- n{from}: confirm {len}"),
        Msg::NeedBackup { from, to, .. } => format!("n{to} <- n{from}: need a base backup"),
        Msg::Decide { to, attempt } => format!("n{to} <- client: decide attempt {attempt}"),
    })
}
