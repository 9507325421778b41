//! The `twopc` command: a thin clap dispatch to the crates that do the work.

mod async_main;
mod audit_cmd;
mod bench;
mod client;
mod coordinator_group;
mod ctl;
mod demo;
mod latency;
mod lease_worker;
mod metrics_text;
mod printable;
mod saga_cmd;
mod target;
mod tokens_cmd;
mod wal_cmd;
mod workflow_store;
mod workflow_worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Every process of a cluster is this binary. glibc's allocator was a third of the
/// coordinator's CPU at full load (docs/benchmarks.md); mimalloc serves the many small,
/// short-lived allocations of HTTP and JSON handling from thread-local pages instead.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "twopc",
    version,
    about = "A two-phase commit coordinator you can trust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a coordinator: the HTTP transaction API, 2PC and recovery.
    Coordinator(coordinator::cli::Args),
    /// Run a reference key-value participant.
    Participant(participant::cli::Args),
    /// Relay participants' outbox intents to their targets, at least once, in order per
    /// aggregate, under each intent's event_id (docs/workflows.md).
    Relay(relay::cli::Args),
    /// Start a local cluster, run a checkout workload through a coordinator crash, check every
    /// invariant.
    Demo(demo::Args),
    /// Measure committed transactions/s and latency against a durability-off baseline.
    Bench(bench::Args),
    /// Check the invariants of a recorded demo run against a running cluster again.
    Audit(audit_cmd::Args),
    /// One process of `twopc bench`'s HTTP floor cluster (started by the bench itself).
    #[command(hide = true)]
    BenchFloorNode(bench::floor::NodeArgs),
    /// Operators: list, show (with each participant's evidence), retry, resolve, audit; of one
    /// coordinator or the leader of a group (`--coordinator URL,URL,...`).
    Ctl(ctl::Args),
    /// A lease holder that acquires, renews and writes through a fence (tests, docs/leases.md).
    #[command(hide = true)]
    LeaseWorker(lease_worker::Args),
    /// The checkout workflow's reference worker: holds a lease, moves checkouts by fenced
    /// transitions (`twopc demo --workflow`, docs/workflows.md).
    #[command(hide = true)]
    WorkflowWorker(workflow_worker::Args),
    /// Write a fresh set of token files (peer, client, operator) for a cluster.
    Tokens(tokens_cmd::Args),
    /// Look at a write-ahead log directory.
    #[command(subcommand)]
    Wal(wal_cmd::WalCommand),
    /// Sagas: `twopc saga plan FILE` prints the compensation plan of an execution log.
    #[command(subcommand)]
    Saga(saga_cmd::SagaCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // Crash points are armed by the FAILPOINTS environment variable (`name=return` aborts there).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    match cli.command {
        Command::Coordinator(args) => coordinator::cli::main(args),
        Command::Participant(args) => participant::command::main(args),
        Command::Relay(args) => relay::cli::main(args),
        Command::Wal(command) => wal_cmd::main(command),
        Command::Demo(args) => demo::main(args),
        Command::Bench(args) => bench::main(args),
        Command::BenchFloorNode(args) => bench::floor::main(args),
        Command::Audit(args) => audit_cmd::main(args),
        Command::Ctl(args) => ctl::main(args),
        Command::Saga(command) => saga_cmd::main(command),
        Command::LeaseWorker(args) => lease_worker::main(args),
        Command::WorkflowWorker(args) => workflow_worker::main(args),
        Command::Tokens(args) => tokens_cmd::main(args),
    }
}

/// Logs go to stderr, so `twopc wal dump` can keep stdout for records. `RUST_LOG` filters
/// (default `info`); `TWOPC_LOG_FORMAT=json` switches to one JSON object per line. Colour only
/// on a terminal (log files stay plain), and never with `NO_COLOR` set.
fn init_logging() {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    if std::env::var("TWOPC_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
