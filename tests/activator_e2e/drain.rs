//! Graceful drain: readiness fails at once, held requests still finish, then serve returns.

use std::time::Duration;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

#[tokio::test]
async fn drain_fails_readiness_and_finishes_held_requests_http1() {
    drain_finishes_held_requests(false, None).await;
}

/// Over h2c the held stream finishes after the connection was told to go away (GOAWAY).
#[tokio::test]
async fn drain_fails_readiness_and_finishes_held_requests_h2c() {
    drain_finishes_held_requests(true, None).await;
}

/// The same on data workers (the connections and their held requests live on the workers'
/// runtimes, not the one that serves): the held request finishes and the listener closes.
#[tokio::test]
async fn drain_on_workers_finishes_held_requests_and_closes_the_listener() {
    drain_finishes_held_requests(false, Some(2)).await;
    drain_finishes_held_requests(true, Some(3)).await;
}

async fn drain_finishes_held_requests(h2: bool, workers: Option<usize>) {
    let rev = RevisionKey::new("default", "d");
    let cfg = ActivatorConfig {
        drain_delay: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut h = match workers {
        Some(n) => Harness::start_on_workers(vec![spec("d", 0)], cfg, n).await,
        None => Harness::start(vec![spec("d", 0)], cfg).await,
    };
    let (status, _) = admin_get(h.admin, "/readyz").await;
    assert_eq!(status, 200);
    let c = if h2 { h2_client() } else { client() };
    let (c2, req) = (c.clone(), h.get(&rev, "/"));
    let held = tokio::spawn(async move { send(&c2, req).await });
    h.wait_held(&rev, 1).await;
    h.shutdown();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = admin_get(h.admin, "/readyz").await;
        if status == 503 {
            assert_eq!(body, "draining\n");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness never failed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let up = Upstream::start().await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let (status, _, body) = held.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let served = h.served.take().unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), served).await;
    result
        .expect("serve returned after drain")
        .unwrap()
        .unwrap();
    // The listener is closed now.
    assert!(tokio::net::TcpStream::connect(h.data).await.is_err());
}

#[tokio::test]
async fn drain_timeout_cuts_requests_that_never_finish() {
    drain_timeout_cuts(None).await;
}

/// On workers the drain timeout cuts connections running on the workers' runtimes too.
#[tokio::test]
async fn drain_timeout_on_workers_cuts_requests_that_never_finish() {
    drain_timeout_cuts(Some(2)).await;
}

async fn drain_timeout_cuts(workers: Option<usize>) {
    let rev = RevisionKey::new("default", "stuck");
    let cfg = ActivatorConfig {
        drain_delay: Duration::ZERO,
        drain_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let mut h = match workers {
        Some(n) => Harness::start_on_workers(vec![spec("stuck", 0)], cfg, n).await,
        None => Harness::start(vec![spec("stuck", 0)], cfg).await,
    };
    let c = client();
    let (c2, req) = (c.clone(), h.get(&rev, "/"));
    let held = tokio::spawn(async move { c2.request(req).await });
    h.wait_held(&rev, 1).await;
    h.shutdown();
    let served = h.served.take().unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), served).await;
    result
        .expect("serve returned at the drain timeout")
        .unwrap()
        .unwrap();
    assert!(held.await.unwrap().is_err(), "the held request was cut");
}
