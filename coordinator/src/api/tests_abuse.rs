//! The decision route under abuse (issue 17): a caller that does not authenticate floods it
//! with queries about attempts that do not exist. It must write nothing, evict no retained
//! outcome, and be cut off at its budget while known attempts stay answered.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::tests::{
    JSON, call, cooperative_participant, decision_uri, post_body, ready_app_with, two,
};

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9));
const PARTICIPANT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1));

/// A GET from `caller`, as the server records it; the status, `Retry-After` and the body.
async fn get_from(app: &Router, caller: IpAddr, uri: &str) -> (StatusCode, Option<String>, Value) {
    let mut request = Request::get(uri).body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(caller, 40_000)));
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn ten_thousand_unknown_id_queries_write_nothing_evict_nothing_and_are_cut_off() {
    const BURST: u64 = 50;
    let url = cooperative_participant().await;
    let (app, core, _dir) = ready_app_with(&[("inventory", &url), ("payments", &url)], |c| {
        c.retained_max = 8;
        c.decision_query_rate = 1;
        c.decision_query_burst = BURST;
    })
    .await;
    let epoch = core.identity().epoch.0;
    let mut committed = Vec::new();
    for i in 0..5 {
        let id = format!("kept-{i}");
        let (status, body) = call(
            &app,
            "POST",
            "/v1/transactions?wait=acked",
            JSON,
            post_body(&id, two()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["outcome"], "committed", "{body}");
        committed.push((id, body["gtid"].as_str().unwrap().to_string()));
    }
    // Acks and ends are appended lazily: wait until the log is still.
    let mut before = core.wal_stats();
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let now = core.wal_stats();
        if now.records_appended == before.records_appended {
            break;
        }
        before = now;
    }
    let log_bytes = core.log_bytes();
    let started = std::time::Instant::now();

    let (mut answered, mut refused) = (0u64, 0u64);
    for i in 0..10_000u64 {
        // Ids nobody used; half plain (legacy) queries, half naming an attempt of another
        // coordinator, as a scan of random ids would.
        let uri = if i % 2 == 0 {
            format!("/v1/transactions/nobody-{i}/decision")
        } else {
            format!(
                "/v1/transactions/nobody-{i}/decision?gtid=elsewhere.{:016x}.{i}&incarnation={:016x}&epoch=1&position={i}",
                i * 7919,
                i * 7919
            )
        };
        let (status, retry_after, body) = get_from(&app, ATTACKER, &uri).await;
        match status {
            StatusCode::OK => {
                answered += 1;
                assert_ne!(body["decision"], "commit", "{uri}: {body}");
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_eq!(body["error"], "rate_limited", "{body}");
                assert!(retry_after.is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
            }
            other => panic!("{uri}: {other} {body}"),
        }
    }
    let elapsed_s = started.elapsed().as_secs() + 1;
    assert!(answered >= BURST, "the burst is answered: {answered}");
    assert!(
        answered <= BURST + elapsed_s,
        "beyond the burst, one a second: {answered} answered in {elapsed_s} s"
    );
    assert_eq!(answered + refused, 10_000);
    assert_eq!(
        core.metrics()
            .decision_queries_rate_limited
            .load(Ordering::Relaxed),
        refused
    );

    let after = core.wal_stats();
    assert_eq!(
        after.records_appended, before.records_appended,
        "nothing logged"
    );
    assert_eq!(after.fsyncs, before.fsyncs, "nothing forced");
    assert_eq!(core.log_bytes(), log_bytes);
    // Every retained outcome is still there, for clients and for participants in doubt, and
    // known attempts are answered even to the caller that spent its budget.
    for (id, gtid) in &committed {
        let (status, body) =
            call(&app, "GET", &format!("/v1/transactions/{id}"), None, vec![]).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::OK, Some("committed")),
            "{body}"
        );
        for caller in [PARTICIPANT, ATTACKER] {
            let (status, _, body) = get_from(&app, caller, &decision_uri(id, gtid, epoch)).await;
            assert_eq!(
                (status, body["decision"].as_str()),
                (StatusCode::OK, Some("commit")),
                "{body}"
            );
        }
    }
    // Another caller has its own budget.
    let (status, _, body) = get_from(&app, PARTICIPANT, "/v1/transactions/nobody-x/decision").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn with_authentication_on_unauthenticated_queries_are_refused_and_change_nothing() {
    use protocol::auth::{KeyRing, Keys, parse_plain};
    const PEER: &str = "peer-token-for-the-abuse-test";
    let url = cooperative_participant().await;
    let ring = KeyRing::new(Keys {
        peer: Some(parse_plain("peers", PEER).unwrap()),
        ..Keys::default()
    });
    let ring_for_config = ring.clone();
    let (open_app, core, _dir) = ready_app_with(&[("inventory", &url), ("payments", &url)], |c| {
        c.keys = ring_for_config;
    })
    .await;
    // The same core behind a router that checks tokens (as `server::start` builds it).
    let state = super::AppState::new(std::sync::Arc::new(crate::metrics::Metrics::default()))
        .with_keys(ring);
    state.set_ready(std::sync::Arc::clone(&core));
    let app = super::router(state);
    let (status, body) = call(
        &open_app,
        "POST",
        "/v1/transactions?wait=acked",
        JSON,
        post_body("kept", two()),
    )
    .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("committed")),
        "{body}"
    );
    let gtid = body["gtid"].as_str().unwrap().to_string();
    let epoch = core.identity().epoch.0;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let before = core.wal_stats();

    for i in 0..10_000u64 {
        // Random ids, attempts of this run past its last position, and the kept attempt at
        // epochs far above this run's: what an attacker would send to make the log look
        // behind or to fish for presumed aborts.
        let uri = match i % 3 {
            0 => format!("/v1/transactions/nobody-{i}/decision"),
            1 => decision_uri(
                &format!("nobody-{i}"),
                // Another position of the same run: only the last part changes (a plain
                // replace of ":1" also hit an incarnation that starts with 1).
                &match gtid.rsplit_once(':') {
                    Some((run, _)) => format!("{run}:{}", i + 10),
                    None => gtid.clone(),
                },
                epoch,
            ),
            _ => decision_uri("kept", &gtid, u64::MAX - i),
        };
        let (status, _, body) = get_from(&app, ATTACKER, &uri).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}: {body}");
        assert_eq!(body["error"], "unauthorized", "{body}");
    }
    let after = core.wal_stats();
    assert_eq!(
        after.records_appended, before.records_appended,
        "nothing logged"
    );
    assert_eq!(after.fsyncs, before.fsyncs, "nothing forced");
    assert!(
        core.log_behind().is_none(),
        "no forged query made the log look behind"
    );
    // The participant with the peer token is answered, unlimited.
    let mut request = Request::get(decision_uri("kept", &gtid, epoch))
        .header("authorization", format!("Bearer {PEER}"))
        .body(Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::new(PARTICIPANT, 40_001)));
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(answer["decision"], "commit", "{answer}");
}
