//! The live page (`/ui`) in a real browser: headless Chromium against a real coordinator with
//! one participant down. Needs Chromium (Debian: `apt-get install chromium`); `.ci/run`
//! installs it and runs these with `--ignored`. `TWOPC_UI_SCREENSHOT=docs/ui.png` refreshes the
//! screenshot in the docs.

mod coordinator_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};

const WAIT: Duration = Duration::from_secs(20);

/// `TWOPC_CHROMIUM`, else the first of the usual names on `PATH`.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("TWOPC_CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if let Some(path) = found.filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
    }
    panic!(
        "this test needs Chromium: install it (Debian: apt-get install chromium) or set \
         TWOPC_CHROMIUM to its binary"
    );
}

/// Loads `url` headless, lets its scripts run, and returns the DOM (and a screenshot, if asked).
fn browse(url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut command = Command::new(chromium());
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        // The login page of `ui_entry` opens a window without a user's click.
        "--disable-popup-blocking",
        "--virtual-time-budget=4000",
        "--window-size=1280,1000",
    ]);
    command.arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(path) => command.arg(format!("--screenshot={}", path.display())),
        None => command.arg("--dump-dom"),
    };
    let output = command.arg(url).output().expect("running chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What Chromium opens to see `/ui` of `c`. With tokens on: a page in `dir` (mode 0600, so the
/// token stays in a file and off every command line) that logs in as an operator would at the
/// browser's prompt: it opens `/ui` with the operator's name and token in the URL (the browser
/// answers /ui's Basic challenge with them and keeps them for the origin), then loads `/ui`
/// itself without them. The page's own requests then carry the kept credentials, as after a
/// prompt. (A page whose own URL holds credentials cannot `fetch` a relative path at all.)
/// Without tokens: `/ui` itself.
fn ui_entry(c: &Coordinator, dir: &Path) -> String {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(tokens) = c.node.tokens() else {
        return format!("{}/ui", c.url());
    };
    let addr = c.node.spec().addr;
    let login = format!(
        "http://{}:{}@{addr}/ui",
        cluster::auth::OPERATOR_NAME,
        tokens.operator.expose()
    );
    let page = format!("http://{addr}/ui");
    let path = dir.join(format!("open-ui-{}.html", addr.port()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    write!(
        file,
        "<!doctype html><script>window.open({login:?}); \
         setTimeout(function () {{ location.replace({page:?}); }}, 500);</script>"
    )
    .unwrap();
    format!("file://{}", path.display())
}

/// The text of the table with `id` in a dumped DOM.
fn table<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id} in\n{dom}"));
    let end = dom[start..].find("</table>").expect("a closed table") + start;
    &dom[start..end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium; .ci/run installs it and runs this with --ignored"]
async fn the_live_page_shows_stuck_work_and_a_participant_that_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let c = Coordinator::start(dir.path(), "coord", &[&a, &b], &[]);
    let (_, done) = c.submit("", &two_party("order-done", &a, &b)).await;
    assert_eq!(done["outcome"], "committed", "{done}");
    // Every acknowledgement of the first order is in (it ended) before payments goes down.
    c.wait_state("order-done", "committed", WAIT).await;
    // payments goes down: the next order's commit waits for it.
    b.set_ack(AckMode::Down);
    let (_, stuck) = c.submit("", &two_party("order-stuck", &a, &b)).await;
    assert_eq!(stuck["outcome"], "committed", "{stuck}");
    c.wait_state("order-stuck", "committing", WAIT).await;
    // inventory holds an attempt of another coordinator in doubt.
    a.pretend("order-ghost", "c-elsewhere:00000000000000aa:3", "prepared");

    let url = ui_entry(&c, dir.path());
    let dom = tokio::task::spawn_blocking(move || browse(&url, None))
        .await
        .unwrap();
    let stuck = table(&dom, "stuck");
    assert!(
        stuck.contains("data-id=\"order-stuck\"")
            && stuck.contains("payments (")
            && stuck.contains("503"),
        "the stuck transaction is listed with the participant it waits for:\n{stuck}"
    );
    assert!(
        !stuck.contains("order-done"),
        "an ended one is not stuck:\n{stuck}"
    );
    let in_doubt = table(&dom, "in-doubt");
    assert!(
        in_doubt.contains("order-ghost") && in_doubt.contains("c-elsewhere"),
        "{in_doubt}"
    );
    let participants = table(&dom, "participants");
    assert!(
        participants.contains("class=\"down\"") && participants.contains("no: HTTP 503"),
        "payments is shown unreachable:\n{participants}"
    );

    if c.node.tokens().is_some() {
        // Without the operator's credentials the browser gets no page (headless, it cannot
        // answer the Basic prompt): nothing of what the operator saw above.
        let plain = format!("{}/ui", c.url());
        let refused = tokio::task::spawn_blocking(move || browse(&plain, None))
            .await
            .unwrap();
        assert!(
            !refused.contains("<table id=\"stuck\"") && !refused.contains("order-stuck"),
            "{refused}"
        );
    }

    let shot = std::env::var_os("TWOPC_UI_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("ui.png"));
    let url = ui_entry(&c, dir.path());
    let target = shot.clone();
    tokio::task::spawn_blocking(move || browse(&url, Some(&target)))
        .await
        .unwrap();
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium; .ci/run installs it and runs this with --ignored"]
async fn the_live_page_renders_with_ten_thousand_live_transactions() {
    const LIVE: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Down).await;
    let c = Coordinator::start(
        dir.path(),
        "coord",
        &[&a, &b],
        &[
            "--max-pending-acks-per-participant",
            "20000",
            "--max-live-per-participant",
            "20000",
            "--retry-base-ms",
            "60000",
            "--retry-max-ms",
            "60000",
        ],
    );
    let started = Instant::now();
    let client = c.node.http();
    let url = format!("{}/v1/transactions", c.url());
    let mut pending = futures_like::Window::new(64);
    for i in 0..LIVE {
        let body = two_party(&format!("order-{i}"), &a, &b);
        let request = client.post(&url).json(&body).send();
        pending
            .push(tokio::spawn(async move {
                let response = request.await.expect("POST");
                assert_eq!(response.status(), 200);
            }))
            .await;
    }
    pending.drain().await;
    let loaded = started.elapsed();

    let ui = ui_entry(&c, dir.path());
    let (dom, page) = tokio::task::spawn_blocking(move || {
        let t = Instant::now();
        let dom = browse(&ui, None);
        (dom, t.elapsed())
    })
    .await
    .unwrap();
    let blank = tokio::task::spawn_blocking(|| {
        let t = Instant::now();
        browse("about:blank", None);
        t.elapsed()
    })
    .await
    .unwrap();
    let view = Instant::now();
    let (_, cluster) = c.get("/v1/cluster").await;
    let view = view.elapsed();
    assert_eq!(
        cluster["live_total"], LIVE,
        "every transaction waits for payments"
    );
    assert!(
        dom.contains(&format!("<span id=\"live-total\">{LIVE}</span>")),
        "the page shows the total"
    );
    eprintln!(
        "{LIVE} live transactions (loaded in {loaded:.1?}): GET /v1/cluster {view:.1?}; \
         headless Chromium loading /ui and running its scripts {page:.1?}, about:blank \
         {blank:.1?} (the browser's own start), so the page itself {:.1?}",
        page.saturating_sub(blank)
    );
}

/// A bounded window of spawned requests, so 10,000 of them do not all start at once.
mod futures_like {
    pub struct Window {
        max: usize,
        tasks: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
    }

    impl Window {
        pub fn new(max: usize) -> Window {
            Window {
                max,
                tasks: std::collections::VecDeque::new(),
            }
        }

        pub async fn push(&mut self, task: tokio::task::JoinHandle<()>) {
            self.tasks.push_back(task);
            if self.tasks.len() >= self.max
                && let Some(first) = self.tasks.pop_front()
            {
                first.await.expect("request task");
            }
        }

        pub async fn drain(&mut self) {
            while let Some(task) = self.tasks.pop_front() {
                task.await.expect("request task");
            }
        }
    }
}
