//! `twopc demo --workflow --backend postgres`: the database under the shop participant. A fresh
//! database on `TWOPC_POSTGRES_URL`'s server or a throwaway cluster (as `--backend postgres`
//! finds one), with `cluster::pg_workflow`'s tables and seed, and its statements file; the
//! participant flags that serve them.
//!
//! It prepares; it never moves a checkout.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use cluster::pg_workflow;
use cluster::postgres::PgServer;

use super::workflow_audit::Setup;

/// The server (keep it alive while the cluster runs) and the shop's `--backend postgres` flags.
pub fn prepare(dir: &Path, setup: &Setup) -> Result<(PgServer, Vec<String>)> {
    let server = tokio::task::block_in_place(PgServer::find).map_err(|e| {
        anyhow!(
            "{e}\n--workflow --backend postgres needs a PostgreSQL: set TWOPC_POSTGRES_URL or \
             install the server binaries (docs/postgres.md, \"Try it locally\")"
        )
    })?;
    let url = tokio::task::block_in_place(|| server.create_database("twopc_workflow"));
    let db = url.rsplit('/').next().unwrap_or_default().to_string();
    let sql = format!(
        "{}; {}",
        pg_workflow::SCHEMA_SQL,
        pg_workflow::seed_sql(&setup.stock, &setup.checkouts)
    );
    tokio::task::block_in_place(|| server.psql(&db, &sql))
        .map_err(|e| anyhow!("cannot create the workflow tables in {db}: {e}"))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let statements = dir.join("workflow-statements.json");
    std::fs::write(&statements, pg_workflow::STATEMENTS)
        .with_context(|| format!("cannot write {}", statements.display()))?;
    println!("  the shop is a PostgreSQL participant over database {db}");
    Ok((
        server,
        vec![
            "--postgres-url".into(),
            url,
            "--statements".into(),
            statements.display().to_string(),
        ],
    ))
}
