//! A real PostgreSQL for the tests that need one.
//!
//! `TWOPC_POSTGRES_URL` (`postgres://user[:password]@127.0.0.1:port/db`, a role that may
//! `CREATE DATABASE`) names a running server; `.ci/run` starts one and exports it. Unset, each
//! [`PgServer::get`] starts a throwaway cluster of its own with `initdb`/`pg_ctl` from
//! `/usr/lib/postgresql/*/bin` (or PATH) on a loopback port with `max_prepared_transactions`
//! set, stopped when the handle drops. When neither is possible the test fails with how to
//! install PostgreSQL: a test that needs a database never passes without one. Those tests are
//! `#[ignore]`d so that `cargo test --workspace` needs no database; `.ci/run` starts one and
//! runs them with `-- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable naming a running PostgreSQL.
pub const URL_ENV: &str = "TWOPC_POSTGRES_URL";

/// What a test failing for want of PostgreSQL says.
pub const INSTALL_HINT: &str = "this test needs PostgreSQL: set TWOPC_POSTGRES_URL to a running \
server (postgres://user@127.0.0.1:5432/postgres, a role allowed to CREATE DATABASE, with \
max_prepared_transactions > 0), or install the server binaries (Debian: apt-get install -y \
postgresql) so the test can start a throwaway cluster with initdb/pg_ctl";

/// A PostgreSQL server for one test: either the one `TWOPC_POSTGRES_URL` names or a throwaway
/// cluster owned by this handle.
#[derive(Debug)]
pub struct PgServer {
    /// The URL up to (not including) the database name: `postgres://user@host:port/`.
    base: String,
    cluster: Option<Cluster>,
}

#[derive(Debug)]
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    options: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PgServer {
    /// The server of `TWOPC_POSTGRES_URL`, else a new throwaway cluster. Panics with
    /// [`INSTALL_HINT`] when neither is possible.
    pub fn get() -> PgServer {
        Self::find().unwrap_or_else(|e| panic!("{INSTALL_HINT}\n({e})"))
    }

    /// [`PgServer::get`] without the panic (for `twopc bench --backend postgres`).
    pub fn find() -> Result<PgServer, String> {
        if let Ok(url) = std::env::var(URL_ENV)
            && !url.is_empty()
        {
            let base = match url.rfind('/') {
                Some(slash) if slash > "postgres://".len() => url[..=slash].to_string(),
                _ => {
                    return Err(format!(
                        "{URL_ENV}={url:?} is not postgres://user@host:port/db"
                    ));
                }
            };
            return Ok(PgServer {
                base,
                cluster: None,
            });
        }
        // A prepared transaction holds no session: it stays prepared from its vote until its
        // COMMIT PREPARED, which runs after the client has its answer. So a bench at
        // concurrency 64 across two databases of this server keeps 128 prepared and more while
        // phase two catches up; 512 leaves room (a few MB of shared memory).
        Self::throwaway(&[("max_prepared_transactions", "512")])
    }

    /// A cluster of this test's own (for restarting it or for unusual settings).
    pub fn throwaway(settings: &[(&str, &str)]) -> Result<PgServer, String> {
        let bin = server_bin().ok_or("no initdb in /usr/lib/postgresql/*/bin or on PATH")?;
        let dir = tempfile::Builder::new()
            .prefix("twopc-pg-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");
        if is_root() {
            run(Command::new("chown").arg("postgres").arg(dir.path()))?;
        }
        as_server_user(
            &bin.join("initdb"),
            &[
                "-D",
                path_str(&data)?,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )?;
        let port = crate::ports::free_port();
        let mut options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=on -c max_connections=200",
            path_str(dir.path())?
        );
        for (name, value) in settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let server = PgServer {
            base: format!("postgres://postgres@127.0.0.1:{port}/"),
            cluster: Some(Cluster {
                bin,
                data,
                options,
                log,
                _dir: dir,
            }),
        };
        server.pg_ctl(&["start"])?;
        Ok(server)
    }

    fn pg_ctl(&self, action: &[&str]) -> Result<(), String> {
        let cluster = self
            .cluster
            .as_ref()
            .ok_or("this server is not a throwaway cluster of the test")?;
        let mut args = action.to_vec();
        args.extend([
            "-w",
            "-t",
            "60",
            "-D",
            path_str(&cluster.data)?,
            "-l",
            path_str(&cluster.log)?,
            "-o",
            &cluster.options,
        ]);
        as_server_user(&cluster.bin.join("pg_ctl"), &args)
    }

    /// `pg_ctl restart -m immediate`: the server crashes and recovers from its WAL.
    pub fn restart_immediate(&self) -> Result<(), String> {
        self.pg_ctl(&["restart", "-m", "immediate"])
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("{}{db}", self.base)
    }

    /// Creates a fresh database with a unique name; returns its URL.
    pub fn create_database(&self, prefix: &str) -> String {
        let name = format!(
            "{prefix}_{}_{}",
            std::process::id(),
            fastrand::u32(..1_000_000)
        );
        self.psql("postgres", &format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("cannot create database {name}: {e}\n{INSTALL_HINT}"));
        self.url(&name)
    }

    /// Runs `sql` in `db` with psql; returns its unaligned, tuples-only output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        psql_url(&self.url(db), sql)
    }
}

/// Runs `sql` against `url` with psql (`-At`, stop on the first error).
pub fn psql_url(url: &str, sql: &str) -> Result<String, String> {
    let psql = server_bin()
        .map(|bin| bin.join("psql"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("psql"));
    let output = Command::new(psql)
        .args([
            "-X",
            "-q",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .output()
        .map_err(|e| format!("cannot run psql: {e}; {INSTALL_HINT}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.cluster.is_some() {
            let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
        }
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding initdb (Debian keeps the server
/// binaries off PATH), else the first directory on PATH holding `initdb`.
pub fn server_bin() -> Option<PathBuf> {
    debian_server_bin().or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
    })
}

fn debian_server_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// initdb and the server refuse to run as root: run them as `postgres` then.
fn as_server_user(program: &Path, args: &[&str]) -> Result<(), String> {
    let mut command = if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    command.args(args).current_dir("/tmp");
    run(&mut command)
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed with {}: {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn path_str(path: &Path) -> Result<&str, String> {
    path.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}
