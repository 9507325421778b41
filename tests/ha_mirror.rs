//! The leader's replication rule against a real etcd and a follower we control: a follower
//! in the sync set that does not confirm a sync point is taken out of the set in etcd
//! *before* the sync point is acknowledged, and a leader that can no longer prove it leads
//! (its key gone) acknowledges nothing (docs/ha.md). The processes tests
//! (tests/ha_failover.rs) show the same end to end; this one pins the order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;

use cluster::etcd::EtcdCluster;
use coordinator::ha::etcd_group::{EtcdGroup, Term};
use coordinator::ha::mirror::GroupMirror;
use coordinator::ha::rules::Member;
use net::etcd::{Etcd, LeaseId};
use wal::{FileOp, FileStorage, Mirror, MirroredStorage, OpBatch};

const OK: u8 = 0;
const REFUSE: u8 = 1;

/// A follower that answers every replication message 200, or 409 when told to.
async fn fake_follower(mode: Arc<AtomicU8>) -> String {
    let answer = move || {
        let mode = Arc::clone(&mode);
        async move {
            if mode.load(Ordering::SeqCst) == OK {
                (StatusCode::OK, "{}")
            } else {
                (
                    StatusCode::CONFLICT,
                    r#"{"error":"replica_refused","message":"told to"}"#,
                )
            }
        }
    };
    let app = Router::new()
        .route("/v1/replica/backup", post(answer.clone()))
        .route("/v1/replica/ops", post(answer.clone()))
        .route("/v1/replica/outcomes", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn batch() -> OpBatch {
    OpBatch {
        first: 1,
        ops: vec![FileOp::Create {
            name: "probe".to_string(),
        }],
    }
}

/// Ships one sync point the way the log's writer thread does, off the async workers.
async fn ship(mirror: &GroupMirror) -> std::io::Result<()> {
    let waiter = mirror.ship(batch());
    tokio::task::spawn_blocking(waiter).await.unwrap()
}

async fn sync_set(group: &EtcdGroup) -> Vec<String> {
    let (state, _) = group.state().await.unwrap();
    state.unwrap().sync.into_iter().collect()
}

struct Leading {
    group: EtcdGroup,
    term: Term,
    lease: LeaseId,
    mirror: GroupMirror,
    _dir: tempfile::TempDir,
}

async fn lead(urls: &[String], follower_url: &str) -> Leading {
    let etcd = Etcd::new(urls, Duration::from_secs(2)).unwrap();
    let group = EtcdGroup::new(etcd, "/test/mirror");
    let lease = group.grant(Duration::from_secs(5)).await.unwrap();
    let term = group
        .campaign("a", "http://127.0.0.1:1", lease)
        .await
        .unwrap()
        .expect("the first campaign of a new group wins");
    let member_lease = group.grant(Duration::from_secs(30)).await.unwrap();
    group
        .register(
            &Member {
                node: "b".to_string(),
                url: follower_url.to_string(),
            },
            member_lease,
        )
        .await
        .unwrap();
    let mirror = GroupMirror::new(
        group.clone(),
        term.state.term,
        term.claim_revision,
        Duration::from_millis(300),
        protocol::auth::KeyRing::default(),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let storage = MirroredStorage::new(
        Arc::new(FileStorage),
        dir.path().to_path_buf(),
        Arc::new(mirror.clone()),
    );
    mirror.set_storage(storage);
    Leading {
        group,
        term,
        lease,
        mirror,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_member_leaves_the_sync_set_before_the_ack_and_a_deposed_leader_acks_nothing()
{
    let etcd_dir = tempfile::tempdir().unwrap();
    let etcd = EtcdCluster::start(1, etcd_dir.path()).expect("etcd (apt-get install etcd-server)");
    let mode = Arc::new(AtomicU8::new(OK));
    let follower = fake_follower(Arc::clone(&mode)).await;
    let leading = lead(&etcd.client_urls(), &follower).await;

    // Attached: base backup, then counted in sync here and in etcd.
    leading.mirror.attach_new_members("a").await;
    assert_eq!(sync_set(&leading.group).await, vec!["b".to_string()]);
    assert!(
        ship(&leading.mirror).await.is_ok(),
        "a confirmed sync point is acknowledged"
    );

    // The follower stops confirming: the sync point is acknowledged only with the follower
    // already out of the sync set in etcd (so it can never be promoted without it).
    mode.store(REFUSE, Ordering::SeqCst);
    assert!(ship(&leading.mirror).await.is_ok());
    assert!(
        sync_set(&leading.group).await.is_empty(),
        "the follower that missed an acknowledged sync point must be out of the sync set"
    );
    assert!(leading.mirror.followers().is_empty(), "and detached");

    // Back: it attaches again from a fresh base backup and counts in sync again.
    mode.store(OK, Ordering::SeqCst);
    leading.mirror.attach_new_members("a").await;
    assert_eq!(sync_set(&leading.group).await, vec!["b".to_string()]);

    // The leader loses its key (its lease revoked: what expiry does). Now a follower that
    // fails cannot be taken out under this leader's claim: nothing is acknowledged.
    leading.group.etcd().revoke(leading.lease).await.unwrap();
    mode.store(REFUSE, Ordering::SeqCst);
    let refused = ship(&leading.mirror).await;
    assert!(
        refused.is_err(),
        "a deposed leader acknowledged a sync point its sync member did not confirm"
    );
    assert_eq!(
        sync_set(&leading.group).await,
        vec!["b".to_string()],
        "the sync set is untouched by a leader that no longer holds the key"
    );
    assert_eq!(leading.term.state.term, 1);
}
