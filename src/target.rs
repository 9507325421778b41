//! `--target-*` flags: point the demo or the audit at a cluster that is already running (the
//! docker-compose cluster, say) instead of starting one.

use cluster::audit::ClusterUrls;

#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Coordinator of a running cluster (then no processes are started and none is killed).
    #[arg(
        long,
        requires_all = ["target_inventory", "target_payments", "target_shipping"]
    )]
    pub target_coordinator: Option<String>,
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
    /// The URLs when a cluster is targeted; `None` means start our own.
    pub fn urls(&self) -> Option<ClusterUrls> {
        let trim =
            |url: &Option<String>| url.as_deref().map(|u| u.trim_end_matches('/').to_string());
        Some(ClusterUrls {
            coordinator: trim(&self.target_coordinator)?,
            inventory: trim(&self.target_inventory)?,
            payments: trim(&self.target_payments)?,
            shipping: trim(&self.target_shipping)?,
        })
    }
}
