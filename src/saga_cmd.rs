//! `twopc saga plan FILE`: the compensation planner on a JSON execution log (the seeds'
//! exercise), printing the plan as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use coordinator::saga::planner::{PlanInput, plan_input};

#[derive(Debug, Subcommand)]
pub enum SagaCommand {
    /// Read `{"steps":[{"name","compensable"}],"log":[{"step","event"}]}` and print the plan:
    /// what to compensate in which order, what to reconcile first, what needs a human.
    Plan {
        /// The execution log (JSON); `-` reads stdin.
        file: PathBuf,
    },
}

pub fn main(command: SagaCommand) -> ExitCode {
    match command {
        SagaCommand::Plan { file } => match plan_file(&file) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("twopc saga plan: {}: {e}", file.display());
                ExitCode::from(2)
            }
        },
    }
}

fn plan_file(file: &PathBuf) -> Result<String, String> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| e.to_string())?
    } else {
        std::fs::read_to_string(file).map_err(|e| e.to_string())?
    };
    let input: PlanInput =
        serde_json::from_str(&text).map_err(|e| format!("not an execution log: {e}"))?;
    let plan = plan_input(&input)?;
    serde_json::to_string_pretty(&plan).map_err(|e| e.to_string())
}
