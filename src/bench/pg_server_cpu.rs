//! CPU time of a PostgreSQL server on this machine, for the PostgreSQL bench's CPU per
//! transaction: the postmaster, every process it has forked that is still alive (backends,
//! WAL writer, checkpointer, ...), and those it has already reaped (the postmaster waits for
//! every child, so their time lands in its `cutime`/`cstime`). A session closed between two
//! readings is thus counted once either way; a reading during which a child was reaped is
//! taken again (sessions close in bursts at the end of a run, just when it is read).
//!
//! The server is found through a session of ours: `pg_backend_pid()` names our backend, whose
//! parent is the postmaster. A server on another machine (or in another pid namespace) gives no
//! figure rather than a stranger's.

use std::time::Duration;

use super::cpu;

/// How many times a reading is retried while children are being reaped under it.
const READ_TRIES: usize = 10;

/// The local PostgreSQL server's processes.
pub struct PgServerCpu {
    postmaster: u32,
}

impl PgServerCpu {
    /// The server that `url` reaches, if it runs on this machine and `/proc` shows it.
    pub async fn find(url: &str) -> Option<PgServerCpu> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .ok()?;
        let connection = tokio::spawn(connection);
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .ok()?
            .get(0);
        // Read while our session (and so the backend) is still open.
        let backend = u32::try_from(backend).ok()?;
        let postmaster = cpu::stat(backend)?.parent;
        let found =
            (is_postgres(backend) && is_postgres(postmaster)).then_some(PgServerCpu { postmaster });
        drop(client);
        let _ = connection.await;
        found
    }

    /// User plus system time of the whole server so far; `None` if `/proc` stopped showing it.
    pub fn read(&self) -> Option<Duration> {
        // A child reaped while the children are listed would be missed (gone from the list, not
        // yet in the reaped time we read first): list again until the reaped time holds still.
        let mut total = None;
        for _ in 0..READ_TRIES {
            let before = cpu::stat(self.postmaster)?;
            let children = self.live_children();
            let after = cpu::stat(self.postmaster)?;
            total = Some(after.own + after.reaped_children + children);
            if after.reaped_children == before.reaped_children {
                break;
            }
        }
        total
    }

    /// The summed CPU time of the postmaster's children alive now (exited but not yet reaped
    /// ones included: `/proc` still shows their time).
    fn live_children(&self) -> Duration {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Duration::ZERO;
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(cpu::stat)
            .filter(|stat| stat.parent == self.postmaster)
            .map(|stat| stat.own)
            .sum()
    }
}

/// Whether `pid` runs the PostgreSQL server binary (its backends keep the name `postgres`
/// whatever title they set).
fn is_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres")
}
