//! The shared shell of the async subcommands (`demo`, `bench`, `audit`): a tokio runtime, and
//! an exit code from the work's result, with the error chain printed on failure.

use std::future::Future;
use std::process::ExitCode;

/// Runs `work` to completion on a new multi-threaded runtime. `Err` prints
/// `twopc COMMAND: <error chain>` and exits 1.
pub fn block_on(command: &str, work: impl Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("twopc {command}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("twopc {command}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Exit 0 when every invariant held, else 1 after saying so.
pub fn verdict(command: &str, all_ok: bool) -> ExitCode {
    if all_ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("twopc {command}: an invariant does not hold (see above)");
        ExitCode::FAILURE
    }
}
