//! The checks after each 2PC run of the PostgreSQL bench (twopc's and the peer's): money
//! conserved (the balances of both databases sum to what they did before the run) and nothing
//! left in `pg_prepared_xacts` for either database. A transfer whose client already heard the
//! outcome may still be in phase two, so the check first waits, bounded, for the prepared
//! transactions to go.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tokio_postgres::Client;

/// How long phase two may take to finish after a run before what is left counts as left.
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// One session on each of the bench's two databases.
pub struct Books {
    a: Client,
    b: Client,
}

/// What the checks after one run found.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Check {
    /// The sum of all balances in both databases is what it was before the run.
    pub money_conserved: bool,
    /// Prepared transactions still in either database after waiting up to 30 s.
    pub prepared_left: i64,
}

impl Check {
    /// An error naming `run` and what failed, unless both checks passed.
    pub fn require(&self, run: &str) -> Result<()> {
        if self.money_conserved && self.prepared_left == 0 {
            return Ok(());
        }
        anyhow::bail!("the checks after {run} failed: {}", self.describe())
    }

    /// What the checks found, in a few words.
    pub fn describe(&self) -> String {
        match (self.money_conserved, self.prepared_left) {
            (true, 0) => "ok".to_string(),
            (true, n) => format!("{n} PREPARED LEFT"),
            (false, 0) => "MONEY NOT CONSERVED".to_string(),
            (false, n) => format!("MONEY NOT CONSERVED, {n} PREPARED LEFT"),
        }
    }
}

impl Books {
    pub async fn open(db_a: &str, db_b: &str) -> Result<Books> {
        Ok(Books {
            a: connect(db_a).await?,
            b: connect(db_b).await?,
        })
    }

    /// The sum of every balance in both databases.
    pub async fn total(&self) -> Result<i64> {
        const SUM: &str = "SELECT coalesce(sum(balance), 0)::bigint FROM accounts";
        let a: i64 = self.a.query_one(SUM, &[]).await?.get(0);
        let b: i64 = self.b.query_one(SUM, &[]).await?.get(0);
        Ok(a + b)
    }

    async fn prepared(&self) -> Result<i64> {
        const LEFT: &str =
            "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()";
        let a: i64 = self.a.query_one(LEFT, &[]).await?.get(0);
        let b: i64 = self.b.query_one(LEFT, &[]).await?.get(0);
        Ok(a + b)
    }

    /// The checks after a run that began when the books summed to `before`.
    pub async fn check(&self, before: i64) -> Result<Check> {
        let deadline = Instant::now() + SETTLE_MAX;
        let mut prepared_left = self.prepared().await?;
        while prepared_left > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            prepared_left = self.prepared().await?;
        }
        Ok(Check {
            money_conserved: self.total().await? == before,
            prepared_left,
        })
    }
}

async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {} for the checks", redact(url)))?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            let user = user.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}
