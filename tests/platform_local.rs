//! The local process platform with real `thaw sample-app` replicas: scale up, serve, drain,
//! stop, startup measurement and output forwarding.

#[path = "platform_local_support/mod.rs"]
mod support;

use std::time::Duration;

use thaw::platform::local::ReplicaState;
use thaw::platform::{EndpointSource, EndpointStatus, Platform};
use thaw::telemetry::platform::{ExitLabels, ExitReason};

use support::*;

#[tokio::test]
async fn scale_zero_to_one_publishes_a_ready_endpoint_that_answers() {
    let f = fixture(|_| {});
    let k = key("hello-00001");
    f.platform.upsert(sample("hello-00001", &[]));
    let mut rx = f.platform.endpoints(&k);
    assert!(rx.borrow_and_update().ready.is_empty());

    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "one ready endpoint", |s| s.ready.len() == 1).await;
    assert_eq!(snap.status, EndpointStatus::Ok);
    assert!(snap.ready[0].ip().is_loopback());
    assert_eq!(
        get(snap.ready[0], "/").await,
        (200, "Hello from hello-00001!\n".to_string()),
        "K_REVISION reaches the replica, and it listens on the PORT it was given"
    );

    let status = f.platform.status(&k).unwrap();
    assert_eq!(status.desired, 1);
    assert_eq!(status.ready(), 1);
    let r = &status.replicas[0];
    assert_eq!(r.state, ReplicaState::Ready);
    assert_eq!(r.addr, Some(snap.ready[0]));
    assert!(alive(r.pid.unwrap()));
    assert!(r.ready_after.is_some() && status.last_startup == r.ready_after);
    let exposition = f.exposition();
    assert!(
        exposition.contains(
            "thaw_platform_replica_startup_seconds_count{namespace=\"default\",revision=\"hello-00001\"} 1"
        ),
        "{exposition}"
    );
    assert!(exposition.contains(
        "thaw_platform_replicas{namespace=\"default\",revision=\"hello-00001\",state=\"ready\"} 1"
    ));

    // The replica's stdout reached the log sink, tagged with its replica index.
    poll_until("the listening line in the log", || {
        f.logs
            .contains("0/stdout: sample-app: listening on 127.0.0.1:")
    })
    .await;

    let pid = r.pid.unwrap();
    f.platform.shutdown().await;
    assert!(!alive(pid));
}

#[tokio::test]
async fn scale_down_moves_endpoints_to_terminating_and_stops_each_once_drained() {
    let f = fixture(|o| o.drain_timeout = Duration::from_secs(60));
    let k = key("hello-00002");
    f.platform.upsert(sample("hello-00002", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 2).await.unwrap();
    let up = wait_snapshot(&mut rx, "two ready endpoints", |s| s.ready.len() == 2).await;
    let status = f.platform.status(&k).unwrap();
    let pid_of = |addr| {
        status
            .replicas
            .iter()
            .find(|r| r.addr == Some(addr))
            .and_then(|r| r.pid)
            .unwrap()
    };
    let (a, b) = (up.ready[0], up.ready[1]);
    let (pa, pb) = (pid_of(a), pid_of(b));

    f.platform.scale(&k, 0).await.unwrap();
    // The snapshot is published before any process is signalled: both are still serving.
    let down = rx.borrow_and_update().clone();
    assert!(down.ready.is_empty());
    let mut terminating = down.terminating.clone();
    terminating.sort();
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(terminating, both);
    assert!(alive(pa) && alive(pb));
    assert_eq!(
        get(a, "/").await.0,
        200,
        "a terminating replica still serves"
    );

    // drained() well before the 60 s drain bound stops exactly that replica.
    f.platform.drained(&k, a);
    wait_snapshot(&mut rx, "a gone from terminating", |s| {
        s.terminating == vec![b]
    })
    .await;
    assert!(!alive(pa));
    assert!(alive(pb), "the undrained replica waits for its drain");

    f.platform.drained(&k, b);
    f.platform.drained(&k, b); // idempotent
    wait_snapshot(&mut rx, "nothing left", |s| s.terminating.is_empty()).await;
    assert!(!alive(pb));
    assert!(f.platform.status(&k).unwrap().replicas.is_empty());
    let stopped = f
        .metrics
        .exits
        .get_or_create(&ExitLabels {
            namespace: "default".into(),
            revision: "hello-00002".into(),
            reason: ExitReason::Stopped,
        })
        .get();
    assert_eq!(stopped, 2);
}

#[tokio::test]
async fn an_undrained_replica_is_stopped_after_the_drain_bound() {
    let f = fixture(|o| o.drain_timeout = Duration::from_millis(200));
    let k = key("hello-00003");
    f.platform.upsert(sample("hello-00003", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 1).await;
    let pid = pids(&f.platform, &k)[0];
    f.platform.scale(&k, 0).await.unwrap();
    assert_eq!(rx.borrow_and_update().terminating.len(), 1);
    wait_snapshot(&mut rx, "terminating emptied", |s| {
        s.terminating.is_empty() && s.ready.is_empty()
    })
    .await;
    assert!(!alive(pid));
}

#[tokio::test]
async fn a_replica_ignoring_sigterm_is_killed_after_the_grace() {
    let f = fixture(|o| o.kill_grace = Duration::from_millis(300));
    let k = key("stubborn-00001");
    f.platform
        .upsert(sample("stubborn-00001", &["--ignore-sigterm"]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    let snap = wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 1).await;
    let pid = pids(&f.platform, &k)[0];
    f.platform.scale(&k, 0).await.unwrap();
    f.platform.drained(&k, snap.ready[0]);
    wait_snapshot(&mut rx, "gone", |s| s.terminating.is_empty()).await;
    assert!(!alive(pid));
    poll_until("the ignored SIGTERM in the log", || {
        f.logs.contains("ignoring SIGTERM")
    })
    .await;
}

#[tokio::test]
async fn startup_delay_shows_in_the_measured_startup_time() {
    let f = fixture(|_| {});
    let k = key("slow-00001");
    // Readiness by HTTP this time: GET /healthz must answer 2xx.
    f.platform
        .upsert(sample("slow-00001", &["--startup-delay", "300ms"]).readiness_path("/healthz"));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 1).await.unwrap();
    wait_snapshot(&mut rx, "ready", |s| s.ready.len() == 1).await;
    let st = f.platform.status(&k).unwrap();
    // A lower bound only: the app sleeps 300 ms before it listens.
    assert!(
        st.last_startup.unwrap() >= Duration::from_millis(300),
        "{:?}",
        st.last_startup
    );
    f.platform.shutdown().await;
}

#[tokio::test]
async fn scale_up_and_down_in_steps_keeps_the_count() {
    let f = fixture(|o| o.drain_timeout = Duration::from_millis(100));
    let k = key("steps-00001");
    f.platform.upsert(sample("steps-00001", &[]));
    let mut rx = f.platform.endpoints(&k);
    f.platform.scale(&k, 3).await.unwrap();
    wait_snapshot(&mut rx, "three ready", |s| s.ready.len() == 3).await;
    f.platform.scale(&k, 1).await.unwrap();
    let s = rx.borrow_and_update().clone();
    assert_eq!((s.ready.len(), s.terminating.len()), (1, 2));
    f.platform.scale(&k, 2).await.unwrap();
    wait_snapshot(&mut rx, "two ready, none terminating", |s| {
        s.ready.len() == 2 && s.terminating.is_empty()
    })
    .await;
    let st = f.platform.status(&k).unwrap();
    assert_eq!(st.replicas.len(), 2);
    assert!(st.replicas.iter().all(|r| r.state == ReplicaState::Ready));
    f.platform.shutdown().await;
}
