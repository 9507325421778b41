//! Command-line entry point. (Being built.)

/// Command-line arguments.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs the service; returns the process exit code.
pub fn main(_args: Args) -> std::process::ExitCode {
    tracing::error!("not built yet");
    std::process::ExitCode::FAILURE
}
