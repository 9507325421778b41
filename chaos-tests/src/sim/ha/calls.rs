//! The etcd calls a node has outstanding, and what each is for: plain data shared by the
//! node's side (`node`) and the leader's (`leader`), so neither imports the other for it.

use std::collections::BTreeSet;

use coordinator::ha::rules::GroupState;

use super::etcd::LeaseId;

/// What an outstanding etcd call (one at a time per node, besides keep-alives) is for.
#[derive(Debug, Clone)]
pub enum Purpose {
    Watch,
    /// The campaign txn, the state it would write, and the lease its key would hold.
    Campaign(GroupState, LeaseId),
    /// The read before a removal, then the removal txn, of these sync members.
    RemoveRead(BTreeSet<usize>),
    Remove(BTreeSet<usize>),
    Add(usize),
}

#[derive(Debug, Clone)]
pub struct Wait {
    pub rid: u64,
    pub deadline: u64,
    pub purpose: Purpose,
}
