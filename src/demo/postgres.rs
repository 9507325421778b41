//! `twopc demo --backend postgres`: the checkout demo with `payments` as a `--backend postgres`
//! participant over a fresh database (inventory and shipping stay KV participants), through the
//! same coordinator crash, audited with the same invariants read across the KV stores and the
//! database, plus one of PostgreSQL's own: nothing left in `pg_prepared_xacts`.
//!
//! The server is `TWOPC_POSTGRES_URL`'s or a throwaway cluster, found as the tests find it
//! (`cluster::postgres`). With neither, the demo stops before starting anything and says
//! what to do. The database is dropped after a run whose invariants all hold and kept (named)
//! otherwise, for a look in psql.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use cluster::audit::{self, Check, ClusterUrls, Totals};
use cluster::checkout::{CheckoutConfig, PAYMENTS};
use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::oracle::{self, Ledger, PaymentsLedger};
use cluster::pg_checkout;
use cluster::postgres::PgServer;

use super::{AUDIT_SETTLE, Args, http_client, run_load};

/// What to do when no PostgreSQL can be reached (printed after the reason).
const NO_SERVER: &str = "twopc demo --backend postgres needs a PostgreSQL it can reach. Either \
set TWOPC_POSTGRES_URL to a running server (postgres://postgres@127.0.0.1:5432/postgres: a role \
allowed to CREATE DATABASE, max_prepared_transactions > 0), or install the server binaries \
(Debian: apt-get install -y postgresql; initdb in /usr/lib/postgresql/*/bin or on PATH) and the \
demo starts a throwaway cluster of its own. docs/postgres.md (\"Try it locally\") shows both. \
`twopc demo` without --backend needs nothing.";

pub async fn run(args: &Args, config: &CheckoutConfig) -> Result<bool> {
    if args.target.targeted()
        || args.keep_running
        || args.record.is_some()
        || args.write_seeds.is_some()
    {
        bail!(
            "--backend postgres runs its own cluster once: --target-*, --keep-running, --record \
             and --write-seeds are for the KV demo"
        );
    }
    // Declared before the cluster so that it outlives it (a throwaway server stops on drop).
    let server =
        tokio::task::block_in_place(PgServer::find).map_err(|e| anyhow!("{e}\n{NO_SERVER}"))?;
    let db = PaymentsDb::create(&server, config).await?;
    let mut cluster = start_cluster(args, config, &db)?;
    let urls = cluster.checkout_urls()?;
    println!("  coordinator {}", urls.coordinator);
    println!(
        "  inventory {}  payments {} (PostgreSQL database {})  shipping {}",
        urls.inventory, urls.payments, db.name, urls.shipping
    );

    let client = http_client(&super::own_client_args(&cluster), args.concurrency)?;
    let before = Totals {
        sold: oracle::read_sold(&client, &urls, config).await?,
        spent: db.ledger(config).await?.money.iter().map(|l| l.moved).sum(),
    };
    let ran = run_load(
        args,
        config,
        &urls,
        Some(&mut cluster),
        &client,
        pg_checkout::request,
    )
    .await?;

    println!("checking invariants against the KV participants, PostgreSQL and the coordinator...");
    let report = audit_across(&client, &urls, config, &db, before, &ran).await?;
    ran.summary(args, &report).print();
    tokio::task::block_in_place(|| cluster.stop());
    if report.all_ok() {
        db.drop_database().await;
    } else {
        println!(
            "the payments database {} is kept for a look: psql '{}'",
            db.name,
            redact(&db.url)
        );
    }
    Ok(report.all_ok())
}

/// The KV demo's invariants with payments read from its database, and nothing left prepared
/// in PostgreSQL (gids the participant cannot attribute included).
async fn audit_across(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
    db: &PaymentsDb,
    before: Totals,
    ran: &super::Ran,
) -> Result<audit::AuditReport> {
    let prepared_left = oracle::wait_no_prepared(client, urls, AUDIT_SETTLE).await?;
    let payments = db.ledger(config).await?;
    let observation = oracle::observe_settled(
        client,
        urls,
        config,
        before,
        &ran.observed(),
        AUDIT_SETTLE,
        prepared_left,
        payments,
    )
    .await?;
    let mut report = oracle::judge(config, &observation);
    report.checks.push(db.nothing_prepared().await?);
    Ok(report)
}

fn start_cluster(args: &Args, config: &CheckoutConfig, db: &PaymentsDb) -> Result<LocalCluster> {
    // The payments database is new each run, so the KV data must be too.
    let data_dir = args.data_dir.join("postgres");
    if data_dir.exists() {
        std::fs::remove_dir_all(&data_dir)
            .with_context(|| format!("cannot wipe {}", data_dir.display()))?;
    }
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let statements = data_dir.join("payments-statements.json");
    std::fs::write(&statements, pg_checkout::STATEMENTS)
        .with_context(|| format!("cannot write {}", statements.display()))?;
    println!(
        "twopc demo: starting a coordinator and 3 participants (inventory, shipping: KV; \
         payments: PostgreSQL)"
    );
    println!(
        "  data in {}/ (wiped each --backend postgres run)",
        data_dir.display()
    );
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    let mut spec = ClusterSpec::checkout(&binary, &data_dir, config);
    spec.postgres_args = vec![(
        PAYMENTS.to_string(),
        vec![
            "--postgres-url".into(),
            db.url.clone(),
            "--statements".into(),
            path_arg(&statements),
        ],
    )];
    let cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))?;
    println!("  process logs in {}/", cluster.log_dir.display());
    Ok(cluster)
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The demo's payments database: created, seeded, read by the audit, dropped after a good run.
struct PaymentsDb {
    name: String,
    url: String,
    /// The server's maintenance database (`postgres`), for CREATE and DROP DATABASE.
    admin_url: String,
    client: tokio_postgres::Client,
}

impl PaymentsDb {
    async fn create(server: &PgServer, config: &CheckoutConfig) -> Result<PaymentsDb> {
        let admin_url = server.url("postgres");
        let admin = connect(&admin_url)
            .await
            .map_err(|e| anyhow!("{e:#}\n{NO_SERVER}"))?;
        let prepared: String = admin
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .context("SHOW max_prepared_transactions")?
            .get(0);
        if prepared.trim() == "0" {
            bail!(
                "max_prepared_transactions is 0 on {admin_url}: PREPARE TRANSACTION is off. Set \
                 it (64, say) in postgresql.conf or with -c, then restart PostgreSQL \
                 (docs/postgres.md)"
            );
        }
        let name = format!("twopc_demo_payments_{}", std::process::id());
        // Two statements: CREATE DATABASE cannot run in the implicit transaction of a batch.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin.batch_execute(&sql).await.with_context(|| {
                format!("cannot create database {name} (the role needs CREATEDB)")
            })?;
        }
        let url = server.url(&name);
        let client = connect(&url).await?;
        client
            .batch_execute(&format!(
                "{}; {}",
                pg_checkout::SCHEMA_SQL,
                pg_checkout::seed_sql(config)
            ))
            .await
            .with_context(|| format!("cannot create the payments tables in {name}"))?;
        Ok(PaymentsDb {
            name,
            url,
            admin_url,
            client,
        })
    }

    /// Every customer's balance and spent, and the orders with a payment row.
    async fn ledger(&self, config: &CheckoutConfig) -> Result<PaymentsLedger> {
        let mut ledger = PaymentsLedger::default();
        for customer in 0..config.customers {
            let id = pg_checkout::customer_id(customer);
            let row = self
                .client
                .query_opt("SELECT balance, spent FROM customers WHERE id = $1", &[&id])
                .await
                .with_context(|| format!("reading customer {id} in {}", self.name))?;
            // A customer row gone missing is a broken ledger, not a read error: it shows up
            // as (0, 0), which conservation reports.
            let (left, moved) = row.map_or((0, 0), |r| (r.get(0), r.get(1)));
            ledger.money.push(Ledger {
                id: customer,
                left,
                moved,
            });
        }
        let paid: BTreeSet<String> = self
            .client
            .query("SELECT order_id FROM payments", &[])
            .await
            .with_context(|| format!("reading payments in {}", self.name))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        ledger.paid = paid;
        Ok(ledger)
    }

    /// PostgreSQL's own view: no prepared transaction left in this database.
    async fn nothing_prepared(&self) -> Result<Check> {
        let gids: Vec<String> = self
            .client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
                &[],
            )
            .await
            .context("reading pg_prepared_xacts")?
            .iter()
            .map(|row| row.get(0))
            .collect();
        Ok(Check {
            name: "PostgreSQL: nothing left in pg_prepared_xacts",
            ok: gids.is_empty(),
            detail: if gids.is_empty() {
                format!("no prepared transaction in {}", self.name)
            } else {
                format!("{} still prepared: {}", gids.len(), gids.join(", "))
            },
        })
    }

    /// Drops the database; a failure only leaves it behind, so it is reported, not fatal.
    async fn drop_database(self) {
        drop(self.client);
        let dropped = match connect(&self.admin_url).await {
            Ok(admin) => admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("{e:#}")),
        };
        if let Err(e) = dropped {
            eprintln!(
                "twopc demo: could not drop the payments database {}: {e}",
                self.name
            );
        }
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("cannot connect to {}", redact(url)))?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped; an error then is nobody's concern.
        let _ = connection.await;
    });
    Ok(client)
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = &url[scheme + 3..at];
            let user = user.split(':').next().unwrap_or(user);
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_never_carry_the_password() {
        assert_eq!(
            redact("postgres://app:secret@127.0.0.1:5432/db"),
            "postgres://app@127.0.0.1:5432/db"
        );
        assert_eq!(
            redact("postgres://app@127.0.0.1/db"),
            "postgres://app@127.0.0.1/db"
        );
        assert_eq!(redact("host=x user=y"), "host=x user=y");
    }
}
