//! The Bitronix peer of `twopc bench --backend postgres --peer bitronix`: the same transfer as
//! one XA transaction through Bitronix (a Java transaction manager; Debian's `libbtm-java`) with
//! pgjdbc's `PGXADataSource` on both databases. The program is `bench/bitronix/Transfer.java`,
//! built into this binary, written out and compiled with `javac` at run time (no build tool),
//! and run in one JVM for the whole bench: it warms up for 2 s, then measures each cell the
//! bench sends it on stdin and answers one JSON line. Its CPU time is read from `/proc` around
//! each cell, so JVM start-up and compilation stay out of the figure.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::cpu;

/// The peer's program, compiled at run time.
const SOURCE: &str = include_str!("../../bench/bitronix/Transfer.java");

/// Where Debian installs its Java libraries.
const JAR_DIR: &str = "/usr/share/java";

/// Every jar on the peer's class path and the Debian package that installs it.
const JARS: [(&str, &str); 5] = [
    ("btm.jar", "libbtm-java"),
    ("geronimo-jta-1.2-spec.jar", "libgeronimo-jta-1.2-spec-java"),
    ("postgresql.jar", "libpostgresql-jdbc-java"),
    ("slf4j-api.jar", "libslf4j-java"),
    // Bitronix logs through SLF4J: warnings and errors go to the JVM's log file.
    ("slf4j-simple.jar", "libslf4j-java"),
];

/// What to install when the JDK or a jar is missing.
const INSTALL_HINT: &str = "install them with: apt-get install --no-install-recommends \
    default-jdk-headless libbtm-java libgeronimo-jta-1.2-spec-java libpostgresql-jdbc-java \
    libslf4j-java";

/// How long the JVM may take to start, recover and warm up before it says it is ready.
const READY_WAIT_MAX: Duration = Duration::from_secs(120);

/// How much longer than its warm-up and measured time a cell may take to answer.
const CELL_SLACK: Duration = Duration::from_secs(120);

/// The running JVM.
pub struct Bitronix {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: PathBuf,
}

/// One cell as the JVM measured it, plus its CPU time as `/proc` saw it.
#[derive(Debug, Clone, Deserialize)]
pub struct PeerRun {
    /// Committed in the measured window.
    pub committed: u64,
    /// Committed including the cell's warm-up (what the CPU reading covers).
    pub committed_all: u64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub elapsed_s: f64,
    /// The first failure's exception, to say why a cell failed transfers.
    pub first_error: Option<String>,
    /// The JVM's user + system time during the cell.
    #[serde(skip)]
    pub cpu: Option<Duration>,
}

impl PeerRun {
    pub fn per_second(&self) -> f64 {
        self.committed as f64 / self.elapsed_s.max(1e-9)
    }
}

/// A PostgreSQL URL as JDBC takes it: the URL without credentials, the user, the password.
#[derive(Debug, PartialEq, Eq)]
struct Jdbc {
    url: String,
    user: String,
    password: Option<String>,
}

fn jdbc(url: &str) -> Result<Jdbc> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| anyhow!("not a PostgreSQL URL: {e}"))?;
    let host = match config.get_hosts() {
        [tokio_postgres::config::Host::Tcp(host)] => host.clone(),
        _ => bail!("the Bitronix peer needs exactly one TCP host in the PostgreSQL URL"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .context("the PostgreSQL URL names no database")?;
    Ok(Jdbc {
        url: format!("jdbc:postgresql://{host}:{port}/{db}"),
        user: config.get_user().unwrap_or("postgres").to_string(),
        password: config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
    })
}

/// The class path of Debian's jars, or which are missing.
fn class_path(classes: &Path) -> Result<String> {
    let mut path = vec![classes.display().to_string()];
    let mut missing = Vec::new();
    for (jar, package) in JARS {
        let file = Path::new(JAR_DIR).join(jar);
        if file.is_file() {
            path.push(file.display().to_string());
        } else {
            missing.push(format!("{} (Debian package {package})", file.display()));
        }
    }
    if !missing.is_empty() {
        bail!("missing {}; {INSTALL_HINT}", missing.join(", "));
    }
    Ok(path.join(":"))
}

fn compile(dir: &Path, class_path: &str) -> Result<()> {
    let source = dir.join("Transfer.java");
    std::fs::write(&source, SOURCE).with_context(|| format!("writing {}", source.display()))?;
    let output = Command::new("javac")
        .arg("-d")
        .arg(dir.join("classes"))
        .args(["-cp", class_path])
        .arg(&source)
        .output()
        .with_context(|| format!("cannot run javac (no JDK?); {INSTALL_HINT}"))?;
    if !output.status.success() {
        bail!(
            "javac failed on {}: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

impl Bitronix {
    /// Compiles the program in `dir`, starts the JVM on databases `db_a` and `db_b` (its
    /// journal in `dir` too) and waits for its warm-up to end.
    pub fn start(db_a: &str, db_b: &str, dir: &Path) -> Result<Bitronix> {
        let (a, b) = (jdbc(db_a)?, jdbc(db_b)?);
        let class_path = class_path(&dir.join("classes"))?;
        compile(dir, &class_path)?;
        let journal = dir.join("journal");
        std::fs::create_dir_all(&journal)
            .with_context(|| format!("creating {}", journal.display()))?;
        let log = dir.join("jvm.log");
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new("java")
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .args(["-cp", &class_path, "Transfer"])
            .arg(&journal)
            .args([&a.url, &b.url, &a.user])
            .env("TWOPC_BENCH_PG_PASSWORD", a.password.unwrap_or_default())
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("cannot run java (no JDK?); {INSTALL_HINT}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("the JVM's stdout")?;
        // A thread of its own reads the JVM's answers, so that every wait for one is bounded.
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Bitronix {
            child,
            stdin,
            lines,
            log,
        };
        let ready = peer.answer(READY_WAIT_MAX)?;
        if ready.trim() != r#"{"ready":true}"# {
            bail!("the JVM said {ready:?} instead of ready");
        }
        Ok(peer)
    }

    /// The next line the JVM prints, within `wait`.
    fn answer(&mut self, wait: Duration) -> Result<String> {
        match self.lines.recv_timeout(wait) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Timeout) => Err(anyhow!(
                "the Bitronix JVM did not answer within {wait:?}; its log {}:\n{}",
                self.log.display(),
                self.log_tail()
            )),
            Err(RecvTimeoutError::Disconnected) => Err(anyhow!(
                "the Bitronix JVM exited ({}); its log {}:\n{}",
                self.child
                    .try_wait()
                    .ok()
                    .flatten()
                    .map_or("still running".to_string(), |s| s.to_string()),
                self.log.display(),
                self.log_tail()
            )),
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// One cell: `concurrency` workers (and as many sessions per database) for `warmup`
    /// unmeasured, then `seconds` measured. Blocks for about their sum.
    pub fn run(&mut self, concurrency: usize, warmup: f64, seconds: f64) -> Result<PeerRun> {
        let pid = self.child.id();
        let cpu_before = cpu::cpu_of_all(&[pid]);
        let stdin = self.stdin.as_mut().context("the JVM's stdin is closed")?;
        writeln!(stdin, "{concurrency} {warmup} {seconds}")
            .and_then(|()| stdin.flush())
            .context("sending a cell to the Bitronix JVM")?;
        let wait = Duration::from_secs_f64(warmup + seconds) + CELL_SLACK;
        let line = self.answer(wait)?;
        let cpu_after = cpu::cpu_of_all(&[pid]);
        let mut run: PeerRun = serde_json::from_str(&line)
            .with_context(|| format!("the Bitronix JVM answered {line:?}"))?;
        run.cpu = match (cpu_before, cpu_after) {
            (Some(before), Some(after)) => after.checked_sub(before),
            _ => None,
        };
        Ok(run)
    }
}

impl Drop for Bitronix {
    /// End of input shuts the transaction manager down and the JVM exits; one that does not
    /// within 10 s is killed.
    fn drop(&mut self) {
        drop(self.stdin.take());
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_becomes_a_jdbc_url_with_the_credentials_apart() {
        assert_eq!(
            jdbc("postgres://bob:s%40cret@127.0.0.1:5433/bench_a_1").unwrap(),
            Jdbc {
                url: "jdbc:postgresql://127.0.0.1:5433/bench_a_1".into(),
                user: "bob".into(),
                password: Some("s@cret".into()),
            }
        );
        assert_eq!(
            jdbc("postgres://postgres@localhost/db").unwrap(),
            Jdbc {
                url: "jdbc:postgresql://localhost:5432/db".into(),
                user: "postgres".into(),
                password: None,
            }
        );
        assert!(jdbc("postgres://postgres@localhost:5432").is_err());
        assert!(jdbc("not a url at all ://").is_err());
    }
}
