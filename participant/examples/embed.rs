//! Embedding the participant library in a service of your own: a seat-booking service whose
//! bookings can join a twopc transaction. Quoted in docs/participants.md.
//!
//! `cargo run -p twopc-participant --example embed -- /tmp/seats-data 127.0.0.1:7101`

use std::collections::BTreeMap;

use axum::extract::Path;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use participant::fence::{FencedAnswer, FencedWrite};
use participant::{ApiError, InvalidPayload, Participant, ParticipantConfig, Resource, finish};
use protocol::lease::FenceClaim;
use serde::Deserialize;
use serde_json::{Value, json};

/// The service's committed state: seat -> holder.
#[derive(Debug, Default)]
struct Seats {
    booked: BTreeMap<String, String>,
}

/// A parsed payload: `{"seat": "12A", "holder": "ada"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Booking {
    seat: String,
    holder: String,
}

/// A booking outside 2PC by the holder of a lease (docs/leases.md):
/// `{"holder": "ada", "fence": {"resource": "seats", "token": 42}, "op_id": "b-7"}`.
#[derive(Debug, Deserialize)]
struct FencedBooking {
    holder: String,
    fence: FenceClaim,
    op_id: String,
}

impl Resource for Seats {
    type Staged = Booking;

    fn parse(&self, payload: &Value) -> Result<Booking, InvalidPayload> {
        serde_json::from_value(payload.clone()).map_err(|e| InvalidPayload::new(e.to_string()))
    }

    fn lock_keys(&self, booking: &Booking) -> Vec<String> {
        vec![booking.seat.clone()]
    }

    fn check(&self, booking: &Booking) -> Result<(), String> {
        match self.booked.get(&booking.seat) {
            Some(holder) => Err(format!("seat {} is taken by {holder}", booking.seat)),
            None => Ok(()),
        }
    }

    fn apply(&mut self, booking: Booking) {
        self.booked.insert(booking.seat, booking.holder);
    }

    fn snapshot(&self) -> Value {
        json!(self.booked)
    }

    fn restore(snapshot: Value) -> Result<Self, String> {
        let booked = serde_json::from_value(snapshot).map_err(|e| e.to_string())?;
        Ok(Seats { booked })
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let data_dir = args.next().unwrap_or_else(|| "seats-data".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:7101".into());

    let mut config = ParticipantConfig::new(data_dir);
    config.coordinator_urls = vec!["http://127.0.0.1:7000".into()]; // asked when in doubt
    // Locks the directory, replays the log, holds recovered prepared bookings' seats.
    let seats = Participant::open(config, Seats::default)?;

    tokio::runtime::Runtime::new()?.block_on(async move {
        let resolver = seats.spawn_resolver(); // asks the coordinator about in-doubt bookings
        let reads = seats.clone();
        let fenced = seats.clone();
        let own_routes =
            axum::Router::new()
                .route(
                    "/seats",
                    get(move || async move { axum::Json(reads.read(|s| json!(s.booked))) }),
                )
                // The library's fence: a token lower than one already accepted for its resource
                // is 409 stale_token, and a repeated op_id gets its first answer, applied once.
                .route(
                    "/seats/{seat}",
                    put(
                        move |Path(seat): Path<String>,
                              axum::Json(b): axum::Json<FencedBooking>| async move {
                            let write = FencedWrite {
                                op_id: b.op_id,
                                fence: b.fence,
                                payload: json!({"seat": seat, "holder": b.holder}),
                            };
                            match fenced.fenced_write(write).await {
                                Ok(FencedAnswer::Applied { token, .. }) => {
                                    axum::Json(json!({"booked": true, "token": token}))
                                        .into_response()
                                }
                                Ok(FencedAnswer::Stale(stale)) => stale.into_response(),
                                Err(e) => ApiError::from(e).into_response(),
                            }
                        },
                    ),
                );
        // /2pc/prepare, /2pc/commit, /2pc/abort, /v1/prepared, /healthz, /readyz, /metrics
        let app = finish(seats.router().merge(own_routes));
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        resolver.abort();
        seats.close();
        Ok(())
    })
}
