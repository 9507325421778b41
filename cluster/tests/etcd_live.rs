//! net's etcd client against real etcd servers started by [`EtcdCluster`]: leases expire and
//! take their keys, a campaign is won once and the loser reads the holder, compare-and-swap
//! on the mod revision, and the client moves past a killed or paused member of three.
//!
//! These fail, never skip, without etcd (Debian: apt-get install etcd-server; CI installs
//! it). They live here rather than in net because net must not depend on this crate.

use std::time::{Duration, Instant};

use cluster::etcd::EtcdCluster;
use net::etcd::{Compare, Etcd, EtcdError, KeyValue, LeaseId, TxnOp};

/// Longest a test polls for etcd to do something it should do within a few seconds.
const POLL_BOUND: Duration = Duration::from_secs(15);

fn start(members: usize, dir: &tempfile::TempDir) -> EtcdCluster {
    EtcdCluster::start(members, dir.path()).unwrap_or_else(|e| panic!("{e}"))
}

fn client(cluster: &EtcdCluster) -> Etcd {
    Etcd::new(&cluster.client_urls(), Duration::from_secs(1)).unwrap()
}

fn campaign(key: &[u8], me: &[u8], lease: LeaseId) -> (Vec<Compare>, Vec<TxnOp>, Vec<Vec<u8>>) {
    (
        vec![Compare::CreateRevision {
            key: key.to_vec(),
            equals: 0,
        }],
        vec![TxnOp::Put {
            key: key.to_vec(),
            value: me.to_vec(),
            lease: Some(lease),
        }],
        vec![key.to_vec()],
    )
}

/// Calls `attempt` until it returns `Some`, at most [`POLL_BOUND`].
async fn poll<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + POLL_BOUND;
    loop {
        if let Some(done) = attempt().await {
            return done;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {POLL_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_not_kept_alive_expires_and_its_key_goes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(1, &dir);
    let etcd = client(&cluster);

    let lease = etcd.grant(Duration::from_secs(1)).await.unwrap();
    etcd.put(b"held", b"by-lease", Some(lease)).await.unwrap();
    let ttl = etcd.keep_alive(lease).await.unwrap();
    assert!(
        ttl.is_some_and(|ttl| ttl >= Duration::from_secs(1)),
        "{ttl:?}"
    );
    assert_eq!(etcd.get(b"held").await.unwrap().unwrap().lease, lease.0);

    let started = Instant::now();
    poll("the lease's key to disappear", || async {
        etcd.get(b"held").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "gone after {:?}, before its TTL",
        started.elapsed()
    );
    assert_eq!(etcd.keep_alive(lease).await.unwrap(), None);
    let error = etcd.put(b"held", b"again", Some(lease)).await.unwrap_err();
    assert!(
        matches!(error, EtcdError::LeaseNotFound { lease: l } if l == lease.0),
        "{error}"
    );

    // Revoking ends a lease at once; revoking it again is not an error.
    let revoked = etcd.grant(Duration::from_secs(30)).await.unwrap();
    etcd.put(b"revoked", b"x", Some(revoked)).await.unwrap();
    etcd.revoke(revoked).await.unwrap();
    assert_eq!(etcd.get(b"revoked").await.unwrap(), None);
    etcd.revoke(revoked).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_kept_alive_outlives_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(1, &dir);
    let etcd = client(&cluster);
    let lease = etcd.grant(Duration::from_secs(1)).await.unwrap();
    etcd.put(b"kept", b"x", Some(lease)).await.unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(etcd.keep_alive(lease).await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(etcd.get(b"kept").await.unwrap().unwrap().value, b"x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_is_won_once_and_the_loser_reads_the_holder_in_the_same_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(1, &dir);
    let etcd = client(&cluster);
    let first = etcd.grant(Duration::from_secs(30)).await.unwrap();
    let second = etcd.grant(Duration::from_secs(30)).await.unwrap();
    assert_ne!(first, second);

    let (compares, success, reads) = campaign(b"group/leader", b"coordinator-a", first);
    let won = etcd.txn(compares, success, reads).await.unwrap();
    assert!(won.succeeded);
    assert!(won.reads.is_empty());

    let (compares, success, reads) = campaign(b"group/leader", b"coordinator-b", second);
    let lost = etcd.txn(compares, success, reads).await.unwrap();
    assert!(!lost.succeeded);
    assert_eq!(
        lost.revision, won.revision,
        "the lost campaign wrote something"
    );
    assert_eq!(
        lost.reads,
        vec![Some(KeyValue {
            key: b"group/leader".to_vec(),
            value: b"coordinator-a".to_vec(),
            create_revision: won.revision,
            mod_revision: won.revision,
            lease: first.0,
        })]
    );

    // The holder's lease ends: the key goes, and the second campaigner wins.
    etcd.revoke(first).await.unwrap();
    let (compares, success, reads) = campaign(b"group/leader", b"coordinator-b", second);
    let now_won = etcd.txn(compares, success, reads).await.unwrap();
    assert!(now_won.succeeded);
    let holder = etcd.get(b"group/leader").await.unwrap().unwrap();
    assert_eq!(
        (holder.value.as_slice(), holder.lease),
        (&b"coordinator-b"[..], second.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_swap_on_the_mod_revision_lets_one_writer_through() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = start(1, &dir);
    let etcd = client(&cluster);
    let first = etcd.put(b"cfg/epoch", b"1", None).await.unwrap();
    let swap = |expected: i64, value: &[u8]| {
        (
            vec![Compare::ModRevision {
                key: b"cfg/epoch".to_vec(),
                equals: expected,
            }],
            vec![TxnOp::Put {
                key: b"cfg/epoch".to_vec(),
                value: value.to_vec(),
                lease: None,
            }],
            vec![b"cfg/epoch".to_vec()],
        )
    };
    let (c, s, r) = swap(first, b"2");
    let swapped = etcd.txn(c, s, r).await.unwrap();
    assert!(swapped.succeeded);
    assert!(swapped.revision > first);
    let (c, s, r) = swap(first, b"2-stale");
    let stale = etcd.txn(c, s, r).await.unwrap();
    assert!(!stale.succeeded);
    let current = stale.reads[0].clone().unwrap();
    assert_eq!(
        (current.value.as_slice(), current.mod_revision),
        (&b"2"[..], swapped.revision)
    );

    // A Value compare and a delete in the success branch.
    let dropped = etcd
        .txn(
            vec![Compare::Value {
                key: b"cfg/epoch".to_vec(),
                equals: b"2".to_vec(),
            }],
            vec![TxnOp::Delete {
                key: b"cfg/epoch".to_vec(),
            }],
            vec![],
        )
        .await
        .unwrap();
    assert!(dropped.succeeded);
    assert_eq!(etcd.get(b"cfg/epoch").await.unwrap(), None);

    // Prefix reads: every key under the prefix and none beside it, in key order.
    for key in [&b"m/b"[..], b"m/a", b"m0", b"l"] {
        etcd.put(key, b"", None).await.unwrap();
    }
    let keys: Vec<Vec<u8>> = etcd
        .get_prefix(b"m/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, vec![b"m/a".to_vec(), b"m/b".to_vec()]);
    assert!(etcd.delete(b"m/a").await.unwrap());
    assert!(!etcd.delete(b"m/a").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_moves_past_a_killed_and_a_paused_member_of_three() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(3, &dir);
    assert_eq!(cluster.client_urls().len(), 3);
    let etcd = client(&cluster);
    let lease = etcd.grant(Duration::from_secs(30)).await.unwrap();
    etcd.put(b"before", b"kill", Some(lease)).await.unwrap();

    // The client prefers member 0 (it answered last): kill it.
    cluster.kill(0).unwrap();
    let seen = poll("a read with member 0 dead", || async {
        match etcd.get(b"before").await {
            Ok(kv) => Some(kv),
            // While the survivors elect a leader (member 0 may have been it).
            Err(EtcdError::Unreachable { tried, .. }) => {
                assert_eq!(tried.len(), 3, "{tried:?}");
                None
            }
            Err(other) => panic!("{other}"),
        }
    })
    .await;
    assert_eq!(seen.unwrap().value, b"kill");
    // A campaign and a put go to a live member without the caller doing anything.
    let (compares, success, reads) = campaign(b"leader", b"me", lease);
    assert!(etcd.txn(compares, success, reads).await.unwrap().succeeded);
    etcd.put(b"after", b"kill", None).await.unwrap();

    // Member 0 comes back; member 1 is paused: it takes connections and answers nothing.
    cluster.restart(0).unwrap();
    cluster.stop(1).unwrap();
    let urls = cluster.client_urls();
    let paused_first = Etcd::new(
        &[urls[1].clone(), urls[0].clone(), urls[2].clone()],
        Duration::from_secs(1),
    )
    .unwrap();
    // A put the paused member may apply when it resumes is not sent to another one.
    let error = paused_first.put(b"doubtful", b"x", None).await.unwrap_err();
    assert!(
        matches!(&error, EtcdError::Timeout { endpoint, .. } if *endpoint == urls[1]),
        "{error}"
    );
    assert!(error.may_have_applied());
    // A read moves on (member 1 may have been the leader: then after the next election).
    let read = poll("a read with member 1 paused", || async {
        match paused_first.get(b"leader").await {
            Ok(kv) => Some(kv),
            Err(EtcdError::Unreachable { .. }) => None,
            Err(other) => panic!("{other}"),
        }
    })
    .await;
    assert_eq!(read.unwrap().value, b"me");
    assert!(paused_first.keep_alive(lease).await.unwrap().is_some());
    cluster.cont(1).unwrap();
    let resumed = Etcd::new(&[urls[1].clone()], Duration::from_secs(1)).unwrap();
    poll("member 1 to answer again", || async {
        resumed.get(b"leader").await.ok().flatten()
    })
    .await;
}
