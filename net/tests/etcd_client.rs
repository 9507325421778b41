//! The etcd client's choice of endpoint against fake members on loopback: a read or a
//! self-fencing write moves on past a member that failed; a plain write that may have been
//! applied does not, and says so; whatever a member sends is an error, never a panic. (The
//! client against real etcd: cluster/tests/etcd_live.rs.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use net::etcd::{Compare, Etcd, EtcdError, LeaseId, TxnOp};
use net::test_servers::{raw_server, silent_server};
use tokio::io::AsyncWriteExt;

const RANGE_FOO: &str = r#"{"header":{"revision":"7"},"kvs":[{"key":"Zm9v","value":"YmFy","create_revision":"2","mod_revision":"7","lease":"12"}],"count":"1"}"#;

/// A fake member answering every request with `status` and `body`; counts the requests.
async fn member(status: &'static str, body: &'static str) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let url = raw_server(move |mut socket| {
        let seen = Arc::clone(&seen);
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    })
    .await;
    (url, count)
}

/// A loopback URL nothing listens on (bound, then closed).
fn nobody() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

fn client(endpoints: &[&String]) -> Etcd {
    let endpoints: Vec<String> = endpoints.iter().map(|e| e.to_string()).collect();
    Etcd::new(&endpoints, Duration::from_millis(500)).unwrap()
}

#[tokio::test]
async fn a_read_moves_past_a_failing_member_and_stays_with_the_one_that_answered() {
    let (failing, failing_hits) = member(
        "503 Service Unavailable",
        r#"{"error":"etcdserver: no leader","code":14}"#,
    )
    .await;
    let (good, good_hits) = member("200 OK", RANGE_FOO).await;
    let etcd = client(&[&failing, &good]);
    let kv = etcd.get(b"foo").await.unwrap().unwrap();
    assert_eq!(
        (kv.value.as_slice(), kv.lease, kv.mod_revision),
        (&b"bar"[..], 12, 7)
    );
    assert_eq!(failing_hits.load(Ordering::SeqCst), 1);
    let again = etcd.clone().get(b"foo").await.unwrap();
    assert!(again.is_some());
    assert_eq!(
        failing_hits.load(Ordering::SeqCst),
        1,
        "the failing member was asked again"
    );
    assert_eq!(good_hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_put_goes_to_the_next_member_only_when_it_never_left() {
    let (good, good_hits) = member("200 OK", r#"{"header":{"revision":"9"}}"#).await;
    let revision = client(&[&nobody(), &good])
        .put(b"k", b"v", None)
        .await
        .unwrap();
    assert_eq!(revision, 9);
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);

    let (failing, _) = member(
        "503 Service Unavailable",
        r#"{"error":"etcdserver: request timed out","code":14}"#,
    )
    .await;
    let error = client(&[&failing, &good])
        .put(b"k", b"v", None)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, EtcdError::OutcomeUnknown { endpoint, cause } if *endpoint == failing && cause.contains("503")),
        "{error}"
    );
    assert!(error.may_have_applied());
    assert_eq!(
        good_hits.load(Ordering::SeqCst),
        1,
        "a put that may have applied was sent again"
    );
}

#[tokio::test]
async fn a_put_to_a_silent_member_times_out_and_is_not_sent_again() {
    let silent = silent_server().await;
    let (good, good_hits) = member("200 OK", r#"{"header":{"revision":"9"}}"#).await;
    let etcd = client(&[&silent, &good]);
    let started = Instant::now();
    let error = etcd.put(b"k", b"v", None).await.unwrap_err();
    assert!(
        matches!(&error, EtcdError::Timeout { endpoint, .. } if *endpoint == silent),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(good_hits.load(Ordering::SeqCst), 0);
    // A read in the same spot moves on.
    assert_eq!(etcd.get(b"foo").await.unwrap(), None);
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_txn_is_sent_again_only_when_its_compares_fence_it() {
    let (failing, _) = member(
        "503 Service Unavailable",
        r#"{"error":"etcdserver: request timed out","code":14}"#,
    )
    .await;
    let (good, good_hits) =
        member("200 OK", r#"{"header":{"revision":"3"},"succeeded":true}"#).await;
    let campaign = |key: &[u8]| {
        (
            vec![Compare::CreateRevision {
                key: key.to_vec(),
                equals: 0,
            }],
            vec![TxnOp::Put {
                key: key.to_vec(),
                value: b"me".to_vec(),
                lease: Some(LeaseId(5)),
            }],
        )
    };
    let (compares, success) = campaign(b"leader");
    let won = client(&[&failing, &good])
        .txn(compares, success, vec![b"leader".to_vec()])
        .await
        .unwrap();
    assert!(won.succeeded);
    assert_eq!(won.revision, 3);
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);

    // The compare is on another key than the put: not fenced.
    let (compares, _) = campaign(b"other");
    let (_, success) = campaign(b"leader");
    let error = client(&[&failing, &good])
        .txn(compares, success, vec![])
        .await
        .unwrap_err();
    assert!(matches!(error, EtcdError::OutcomeUnknown { .. }), "{error}");
    assert_eq!(good_hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_resent_grant_that_finds_its_lease_took_it() {
    let (failing, _) = member(
        "503 Service Unavailable",
        r#"{"error":"etcdserver: request timed out","code":14}"#,
    )
    .await;
    let exists = r#"{"error":"etcdserver: lease already exists","message":"etcdserver: lease already exists","code":9}"#;
    let (existing, _) = member("412 Precondition Failed", exists).await;
    let lease = client(&[&failing, &existing])
        .grant(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(lease.0 > 0);
    // Without a doubtful first attempt, "already exists" is somebody else's lease.
    let error = client(&[&existing])
        .grant(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(error, EtcdError::Refused { status: 412, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn refusals_and_gone_leases_are_typed() {
    let not_found = r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
    let (gone, _) = member("404 Not Found", not_found).await;
    let etcd = client(&[&gone]);
    let error = etcd.put(b"k", b"v", Some(LeaseId(77))).await.unwrap_err();
    assert!(
        matches!(error, EtcdError::LeaseNotFound { lease: 77 }),
        "{error}"
    );
    assert!(!error.may_have_applied());
    etcd.revoke(LeaseId(77)).await.unwrap();
    let (bad, _) = member(
        "400 Bad Request",
        r#"{"error":"illegal base64 data","code":3}"#,
    )
    .await;
    let error = client(&[&bad]).get(b"k").await.unwrap_err();
    assert!(
        matches!(&error, EtcdError::Refused { status: 400, body, .. } if body.contains("illegal base64")),
        "{error}"
    );
}

#[tokio::test]
async fn whatever_a_member_sends_is_an_error_not_a_panic() {
    for body in [
        "not json",
        r#"{"kvs":[{"key":"!!"}]}"#,
        r#"{"header":{"revision":"x"}}"#,
        r#"{"kvs":7}"#,
    ] {
        let (odd, _) = member("200 OK", body).await;
        let error = client(&[&odd]).get(b"k").await.unwrap_err();
        assert!(
            matches!(error, EtcdError::Malformed { .. }),
            "{body}: {error}"
        );
    }
    let (odd, _) = member("200 OK", r#"{"header":{}}"#).await;
    let etcd = client(&[&odd]);
    let error = etcd.keep_alive(LeaseId(1)).await.unwrap_err();
    assert!(matches!(error, EtcdError::Malformed { .. }), "{error}");
    let error = etcd.grant(Duration::from_secs(1)).await.unwrap_err();
    assert!(
        matches!(&error, EtcdError::Malformed { what, .. } if what.contains("granted 0")),
        "{error}"
    );
    let error = etcd
        .txn(vec![], vec![], vec![b"a".to_vec()])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, EtcdError::Malformed { what, .. } if what.contains("failure reads")),
        "{error}"
    );
    let (moved, _) = member("307 Temporary Redirect", "").await;
    let error = client(&[&moved]).get(b"k").await.unwrap_err();
    assert!(matches!(error, EtcdError::Answer { .. }), "{error}");
}

#[tokio::test]
async fn no_member_answering_names_every_one_tried() {
    let (first, second) = (nobody(), nobody());
    let error = client(&[&first, &second]).get(b"k").await.unwrap_err();
    match &error {
        EtcdError::Unreachable { tried, last } => {
            assert_eq!(tried, &vec![first.clone(), second.clone()]);
            assert!(last.contains(&second), "{last}");
        }
        other => panic!("{other}"),
    }
}
