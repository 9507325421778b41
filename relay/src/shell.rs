//! The planner driven by real I/O: each command becomes a task whose result comes back as the
//! planner's next event, a timer becomes a sleep, and the clock is the process's monotonic one.
//! Every command yields exactly one event (a timeout turns no answer into `Unknown` or
//! `Failed`), which is what the planner's in-flight bookkeeping rests on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::outbox::OutboxEntry;
use tokio::sync::mpsc;

use crate::coordinator_target::{Coordinators, Kind};
use crate::metrics::{Metrics, Outcome};
use crate::plan::{Command, Event, Planner, Report, ReportResult};
use crate::targets::{Answer, Routes, Target};

/// What the tasks share.
#[derive(Debug)]
pub struct Wires {
    pub routes: Routes,
    /// To participants (the peer token).
    pub participants: crate::credentials::Authed,
    /// To HTTP receivers (no token of ours: they are not twopc services).
    pub receivers: reqwest::Client,
    /// To the coordinator group (the client token), when a target submits to it.
    pub coordinators: Option<Coordinators>,
    pub attempt_timeout: Duration,
    pub metrics: Arc<Metrics>,
}

/// Runs until `shutdown` resolves.
pub async fn run(mut planner: Planner, wires: Arc<Wires>, shutdown: impl Future<Output = ()>) {
    let (events, mut incoming) = mpsc::unbounded_channel::<Event>();
    let start = Instant::now();
    let now_ms = || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut timer: Option<tokio::time::Instant> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut next = Some(Event::Tick);
    loop {
        if let Some(event) = next.take() {
            for command in planner.step(now_ms(), event) {
                if let Command::SetTimer { at_ms } = command {
                    timer = Some(tokio::time::Instant::from_std(
                        start + Duration::from_millis(at_ms),
                    ));
                } else {
                    tokio::spawn(execute(command, wires.clone(), events.clone()));
                }
            }
            let in_flight = u64::try_from(planner.in_flight()).unwrap_or(u64::MAX);
            wires
                .metrics
                .in_flight
                .store(in_flight, std::sync::atomic::Ordering::Relaxed);
        }
        let sleep = async {
            match timer {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(event) = incoming.recv() => next = Some(event),
            () = sleep => {
                timer = None;
                next = Some(Event::Tick);
            }
            () = &mut shutdown => return,
        }
    }
}

/// Carries out one command and sends its one event back.
async fn execute(command: Command, wires: Arc<Wires>, events: mpsc::UnboundedSender<Event>) {
    let jitter = || fastrand::u16(0..=1000);
    let event = match command {
        Command::Deliver { participant, entry } => {
            let answer = deliver(&wires, &participant, &entry).await;
            let outcome = match &answer {
                Answer::Delivered(_) => Outcome::Delivered,
                Answer::Unknown(_) => Outcome::Unknown,
                Answer::Refused(_) => Outcome::Failed,
            };
            wires.metrics.delivery(&entry.target, outcome);
            let event_id = entry.event_id;
            match answer {
                Answer::Delivered(answer) => {
                    tracing::info!(%participant, %event_id, target = %entry.target, "delivered");
                    crate::crash::crash_point(crate::crash::AFTER_DELIVERY_BEFORE_MARK);
                    Event::Delivered {
                        participant,
                        event_id,
                        answer,
                    }
                }
                Answer::Unknown(error) => {
                    tracing::warn!(%participant, %event_id, %error, "delivery outcome unknown; it goes again under the same id");
                    Event::Unknown {
                        participant,
                        event_id,
                        error,
                        jitter_permille: jitter(),
                    }
                }
                Answer::Refused(error) => {
                    tracing::warn!(%participant, %event_id, %error, "delivery refused for good");
                    Event::Refused {
                        participant,
                        event_id,
                        error,
                    }
                }
            }
        }
        Command::ReportDelivered {
            participant,
            event_id,
            answer,
        } => {
            let result = match wires.routes.participants.get(&participant) {
                Some(base) => {
                    crate::outbox_client::report_delivered(
                        &wires.participants,
                        base,
                        &event_id,
                        answer,
                    )
                    .await
                }
                None => ReportResult::Failed,
            };
            reported(&wires, participant, event_id, Report::Delivered, result)
        }
        Command::ReportAttempt {
            participant,
            event_id,
            error,
            permanent,
        } => {
            let result = match wires.routes.participants.get(&participant) {
                Some(base) => {
                    crate::outbox_client::report_attempt(
                        &wires.participants,
                        base,
                        &event_id,
                        error,
                        permanent,
                    )
                    .await
                }
                None => ReportResult::Failed,
            };
            let report = if permanent {
                Report::Permanent
            } else {
                Report::Attempt
            };
            reported(&wires, participant, event_id, report, result)
        }
        Command::List {
            participant,
            generation,
        } => match wires.routes.participants.get(&participant) {
            Some(base) => {
                crate::outbox_client::list(&wires.participants, &participant, base, generation)
                    .await
            }
            None => Event::ListFailed {
                participant,
                generation,
            },
        },
        Command::SetTimer { .. } => return,
    };
    // The loop is gone only when the relay is stopping; the result is not needed then.
    let _ = events.send(event);
}

fn reported(
    wires: &Wires,
    participant: String,
    event_id: String,
    report: Report,
    result: ReportResult,
) -> Event {
    if result == ReportResult::Refused {
        wires
            .metrics
            .reports_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Event::Reported {
        participant,
        event_id,
        report,
        result,
        jitter_permille: fastrand::u16(0..=1000),
    }
}

/// One attempt at the intent's target, bounded by the attempt timeout.
async fn deliver(wires: &Wires, participant: &str, entry: &OutboxEntry) -> Answer {
    let Some(target) = wires.routes.targets.get(&entry.target) else {
        // Not refused for good: the relay's configuration may be what is wrong, and an
        // operator who fixes it wants the intent still pending.
        return Answer::Unknown(format!(
            "no target named {:?} in this relay's configuration",
            entry.target
        ));
    };
    let coordinator = |kind| async move {
        match &wires.coordinators {
            Some(group) => {
                group
                    .deliver(kind, &entry.event_id, &entry.body, wires.attempt_timeout)
                    .await
            }
            None => Answer::Unknown("no --coordinator configured".into()),
        }
    };
    match target {
        Target::Http(url) => {
            let attempt = crate::http_target::deliver(&wires.receivers, url, participant, entry);
            match tokio::time::timeout(wires.attempt_timeout, attempt).await {
                Ok(answer) => answer,
                Err(_) => Answer::Unknown(format!(
                    "no answer within {} ms",
                    wires.attempt_timeout.as_millis()
                )),
            }
        }
        Target::CoordinatorTransactions => coordinator(Kind::Transaction).await,
        Target::CoordinatorSagas => coordinator(Kind::Saga).await,
    }
}
