//! One process of the group through its life: it registers as a member, follows (its copy
//! kept by the leader) until no leader holds the key and the rules let it campaign, freezes
//! its copy and campaigns, and once it won, leads: it keeps its lease alive, attaches
//! followers, and steps down (the process ends, exit code 5) the moment it can no longer
//! prove it leads. Clients are told `not_leader` by every node that does not lead with a
//! lease that surely holds (`refusal`).
//!
//! Must never: let a client hear an answer from a node whose lease may have lapsed; campaign
//! with a copy that can still move; go on leading after etcd said its lease is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::{error, info, warn};

use net::etcd::{Etcd, LeaseId};

use super::HaSettings;
use super::etcd_group::{EtcdGroup, GroupError, Term};
use super::mirror::GroupMirror;
use super::replica_host::ReplicaHost;
use super::rules::{self, Member};

/// What this node is now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    Following {
        leader: Option<String>,
    },
    Campaigning,
    Leading {
        term: u64,
    },
    /// Lost the lease or the log: the process is ending.
    SteppedDown {
        why: String,
    },
}

/// A node of the group.
#[derive(Debug)]
pub struct GroupNode {
    settings: HaSettings,
    group: EtcdGroup,
    host: Arc<ReplicaHost>,
    role: RwLock<Role>,
    clock: Instant,
    leading: AtomicBool,
    /// When the last keep-alive that etcd confirmed was sent (ms on `clock`).
    lease_confirmed_sent_ms: AtomicU64,
    /// The leader claim's create revision, for resigning.
    claim_revision: AtomicU64,
    leader_lease: AtomicU64,
    deposed: Notify,
    mirror: std::sync::OnceLock<GroupMirror>,
}

impl GroupNode {
    /// Connects to etcd, opens the copy under `data_dir` and registers as a member.
    pub async fn join(
        settings: HaSettings,
        data_dir: &std::path::Path,
        index_max_bytes: u64,
        retention_ms: u64,
    ) -> Result<Arc<GroupNode>, GroupError> {
        let etcd = Etcd::new(&settings.etcd, request_timeout(&settings))?;
        let group = EtcdGroup::new(etcd, &settings.prefix);
        let host = ReplicaHost::open(data_dir, index_max_bytes, retention_ms).map_err(|e| {
            GroupError::Undecodable {
                what: "this node's copy",
                detail: e.to_string(),
            }
        })?;
        let node = Arc::new(GroupNode {
            settings,
            group,
            host: Arc::new(host),
            role: RwLock::new(Role::Following { leader: None }),
            clock: Instant::now(),
            leading: AtomicBool::new(false),
            lease_confirmed_sent_ms: AtomicU64::new(0),
            claim_revision: AtomicU64::new(0),
            leader_lease: AtomicU64::new(0),
            deposed: Notify::new(),
            mirror: std::sync::OnceLock::new(),
        });
        let lease = node.group.grant(node.settings.lease_ttl).await?;
        node.group.register(&node.member(), lease).await?;
        tokio::spawn(Arc::clone(&node).keep_membership(lease));
        info!(node = %node.settings.node, url = %node.settings.advertise,
              etcd = ?node.settings.etcd, "joined the coordinator group as a member");
        Ok(node)
    }

    fn member(&self) -> Member {
        Member {
            node: self.settings.node.clone(),
            url: self.settings.advertise.clone(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn settings(&self) -> &HaSettings {
        &self.settings
    }

    pub fn host(&self) -> &Arc<ReplicaHost> {
        &self.host
    }

    pub fn group(&self) -> &EtcdGroup {
        &self.group
    }

    pub fn role(&self) -> Role {
        self.role.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_role(&self, role: Role) {
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = role;
    }

    pub fn mirror(&self) -> Option<&GroupMirror> {
        self.mirror.get()
    }

    /// The group's numbers for `/metrics`.
    pub fn numbers(&self) -> crate::metrics::group::GroupNumbers {
        let copy = self.host.status();
        let mut numbers = crate::metrics::group::GroupNumbers {
            leader: self.refusal().is_none(),
            term: copy.highest_term,
            copy_batches_applied: copy.batches_applied,
            ..Default::default()
        };
        if let Some(mirror) = self.mirror.get() {
            let followers = mirror.followers();
            numbers.term = mirror.term();
            numbers.followers_attached = followers.len() as u64;
            numbers.followers_in_sync =
                followers.iter().filter(|(_, _, in_sync)| *in_sync).count() as u64;
            let stats = mirror.stats();
            numbers.followers_dropped = stats.followers_dropped.load(Ordering::Relaxed);
            numbers.sync_points = stats.sync_points.load(Ordering::Relaxed);
        }
        numbers
    }

    /// Why a client must go elsewhere, with the leader's URL when known; `None` while this
    /// node leads and its lease surely holds.
    pub fn refusal(&self) -> Option<(Option<String>, String)> {
        if self.leading.load(Ordering::Acquire) {
            let holds = rules::lease_holds(
                self.now_ms(),
                self.lease_confirmed_sent_ms.load(Ordering::Acquire),
                millis(self.settings.lease_ttl),
                millis(self.settings.lease_margin()),
            );
            if holds {
                return None;
            }
            return Some((
                None,
                "this node led the group but cannot prove its etcd lease still holds; it takes \
                 no requests (a new leader is being elected)"
                    .to_string(),
            ));
        }
        match self.role() {
            Role::Following { leader } => Some((
                leader.clone(),
                match leader {
                    Some(url) => format!("this node follows the group's leader at {url}"),
                    None => "this node follows; the group has no leader at the moment".to_string(),
                },
            )),
            Role::Campaigning => Some((
                None,
                "this node is campaigning to lead the group".to_string(),
            )),
            Role::Leading { .. } => Some((None, "this node is taking over the group".to_string())),
            Role::SteppedDown { why } => Some((None, format!("this node stepped down: {why}"))),
        }
    }

    /// Resolves when this node must stop (its lease or its log is gone).
    pub async fn deposed(&self) {
        self.deposed.notified().await;
    }

    /// Follows until elected: returns the term won and the lease that holds the leader key.
    pub async fn until_elected(&self) -> Result<(Term, LeaseId), GroupError> {
        let mut first = true;
        loop {
            if !first {
                tokio::time::sleep(self.settings.poll).await;
            }
            first = false;
            match self.group.leader().await {
                Ok(Some((claim, _))) => {
                    self.set_role(Role::Following {
                        leader: (claim.node != self.settings.node).then_some(claim.url),
                    });
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "cannot read the group's leader key");
                    continue;
                }
            }
            let state = match self.group.state().await {
                Ok((state, _)) => state,
                Err(e) => {
                    warn!(error = %e, "cannot read the group's state");
                    continue;
                }
            };
            if !rules::may_campaign(&self.settings.node, state.as_ref()) {
                self.set_role(Role::Following { leader: None });
                continue;
            }
            // Frozen first: a deposed leader's late sync points are refused from here on, so
            // the copy this node would lead from is the one the sync set vouched for.
            self.host.freeze();
            self.set_role(Role::Campaigning);
            let sent = self.now_ms();
            let lease = match self.group.grant(self.settings.lease_ttl).await {
                Ok(lease) => lease,
                Err(e) => {
                    warn!(error = %e, "cannot get a lease to campaign with");
                    self.host.thaw();
                    continue;
                }
            };
            match self
                .group
                .campaign(&self.settings.node, &self.settings.advertise, lease)
                .await
            {
                Ok(Some(term)) => {
                    self.lease_confirmed_sent_ms.store(sent, Ordering::Release);
                    self.claim_revision.store(
                        u64::try_from(term.claim_revision).unwrap_or(0),
                        Ordering::Release,
                    );
                    self.leader_lease
                        .store(u64::try_from(lease.0).unwrap_or(0), Ordering::Release);
                    info!(node = %self.settings.node, term = term.state.term,
                          "won the campaign: leading the group (recovering from the replicated log)");
                    self.set_role(Role::Leading {
                        term: term.state.term,
                    });
                    return Ok((term, lease));
                }
                Ok(None) => {}
                Err(e) => warn!(error = %e, "campaign failed"),
            }
            let _ = self.group.etcd().revoke(lease).await;
            self.host.thaw();
        }
    }

    /// Recovery is done: answer clients, keep the lease, attach followers, watch the log
    /// (`log_failed` says whether the runtime's log has failed; the group stands below the
    /// runtime, so it is asked, not imported).
    pub fn lead(
        self: &Arc<Self>,
        log_failed: impl Fn() -> bool + Send + 'static,
        mirror: GroupMirror,
        lease: LeaseId,
    ) {
        let _ = self.mirror.set(mirror.clone());
        self.leading.store(true, Ordering::Release);
        tokio::spawn(Arc::clone(self).keep_leader_lease(lease));
        let node = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                if log_failed() {
                    node.step_down(
                        "the log failed (a sync point could not be made durable on \
                                    this node and its sync set)",
                    );
                    return;
                }
                mirror.attach_new_members(&node.settings.node).await;
                tokio::time::sleep(node.settings.poll).await;
            }
        });
    }

    fn step_down(&self, why: &str) {
        if self.leading.swap(false, Ordering::AcqRel) {
            error!(node = %self.settings.node, reason = why,
                   "STEPPING DOWN: this node can no longer prove it leads the group; it stops \
                    answering and ends (exit 5) so a supervisor restarts it as a follower");
        }
        self.set_role(Role::SteppedDown {
            why: why.to_string(),
        });
        self.deposed.notify_one();
    }

    async fn keep_leader_lease(self: Arc<Self>, lease: LeaseId) {
        let every = self.settings.lease_ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            if !self.leading.load(Ordering::Acquire) {
                return;
            }
            let sent = self.now_ms();
            match self.group.etcd().keep_alive(lease).await {
                Ok(Some(_)) => self.lease_confirmed_sent_ms.store(sent, Ordering::Release),
                Ok(None) => {
                    self.step_down("etcd says the leader lease is gone");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "leader lease keep-alive failed");
                    if self.refusal().is_some() {
                        self.step_down(&format!(
                            "the leader lease could not be renewed in time: {e}"
                        ));
                        return;
                    }
                }
            }
        }
    }

    async fn keep_membership(self: Arc<Self>, mut lease: LeaseId) {
        let every = self.settings.lease_ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            match self.group.etcd().keep_alive(lease).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "member lease keep-alive failed");
                    continue;
                }
            }
            // Gone (etcd was away longer than the TTL): register again.
            match self.group.grant(self.settings.lease_ttl).await {
                Ok(fresh) => {
                    lease = fresh;
                    if let Err(e) = self.group.register(&self.member(), lease).await {
                        warn!(error = %e, "cannot register as a member again");
                    }
                }
                Err(e) => warn!(error = %e, "cannot get a member lease"),
            }
        }
    }

    /// Graceful shutdown of a leader: gives the key up so a follower need not wait out the
    /// lease. Only after the log is closed (nothing more will be acknowledged).
    pub async fn resign(&self) {
        if !self.leading.swap(false, Ordering::AcqRel) {
            return;
        }
        let lease = self.leader_lease.load(Ordering::Acquire);
        if let Ok(lease) = i64::try_from(lease)
            && let Err(e) = self.group.etcd().revoke(LeaseId(lease)).await
        {
            warn!(error = %e, "could not give the leader key up; followers wait out its lease");
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Each etcd call must end well inside the lease, so a keep-alive that hangs is noticed.
fn request_timeout(settings: &HaSettings) -> Duration {
    (settings.lease_ttl / 4).max(Duration::from_millis(200))
}
