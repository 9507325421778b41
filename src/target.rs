//! `--target-*` flags: point the demo or the audit at a cluster that is already running (the
//! docker-compose cluster, say) instead of starting one. `--target-coordinator` may name every
//! coordinator of a group; the run then drives the one that leads when it starts (its workload
//! and audit use one URL, and do not follow a failover during the run).

use std::time::Duration;

use anyhow::{Context, Result};
use cluster::audit::ClusterUrls;

use crate::client::ClientArgs;
use crate::coordinator_group::{Addresses, Group};

#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Coordinator of a running cluster (then no processes are started and none is killed),
    /// or every coordinator of its group, comma-separated: the run drives the one that leads.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        value_parser = Addresses::parse,
        requires_all = ["target_inventory", "target_payments", "target_shipping"]
    )]
    pub target_coordinator: Option<Addresses>,
    /// The running cluster's `inventory` participant.
    #[arg(long)]
    pub target_inventory: Option<String>,
    /// The running cluster's `payments` participant.
    #[arg(long)]
    pub target_payments: Option<String>,
    /// The running cluster's `shipping` participant.
    #[arg(long)]
    pub target_shipping: Option<String>,
}

impl TargetArgs {
    /// Whether a running cluster is named (every `--target-*` flag given).
    pub fn targeted(&self) -> bool {
        self.target_coordinator.is_some()
            && self.target_inventory.is_some()
            && self.target_payments.is_some()
            && self.target_shipping.is_some()
    }

    /// The URLs when a cluster is targeted; `None` means start our own. A group's leader is
    /// asked for with `client`'s token; a single coordinator is taken as given.
    pub async fn urls(&self, client: &ClientArgs) -> Result<Option<ClusterUrls>> {
        let trim =
            |url: &Option<String>| url.as_deref().map(|u| u.trim_end_matches('/').to_string());
        let (Some(coordinators), Some(inventory), Some(payments), Some(shipping)) = (
            &self.target_coordinator,
            trim(&self.target_inventory),
            trim(&self.target_payments),
            trim(&self.target_shipping),
        ) else {
            return Ok(None);
        };
        Ok(Some(ClusterUrls {
            coordinator: leader(coordinators, client).await?,
            inventory,
            payments,
            shipping,
        }))
    }
}

/// The one address of `coordinators` that leads now (the only one, if one is named).
pub async fn leader(coordinators: &Addresses, client: &ClientArgs) -> Result<String> {
    if let [only] = coordinators.urls() {
        return Ok(only.clone());
    }
    let http = crate::client::build(client, Duration::from_secs(10))?;
    let leader = Group::new(http, coordinators.clone())
        .leader()
        .await
        .with_context(|| format!("finding the leader of {coordinators}"))?;
    println!("  the coordinator group's leader is {leader}");
    Ok(leader)
}
