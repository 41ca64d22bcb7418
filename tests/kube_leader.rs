//! Leader election over a Lease against the in-process API server: one leader at a time,
//! its stats address in `holderIdentity`, failover when the leader dies, immediate hand-over
//! when it stops cleanly. Timings are short; waits poll with a deadline.

mod kube_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use thaw::leader::{Leadership, LeaseSettings, elect, watch_leader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NS: &str = "thaw-system";
const LEASE: &str = "thaw-autoscaler";
const DEADLINE: Duration = Duration::from_secs(30);

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        ..LeaseSettings::new(NS, LEASE, identity)
    }
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !f() {
        assert!(tokio::time::Instant::now() < end, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_leader(rx: &mut watch::Receiver<Option<String>>, want: &str) {
    let ok = tokio::time::timeout(DEADLINE, rx.wait_for(|h| h.as_deref() == Some(want)))
        .await
        .is_ok();
    assert!(ok, "leader never became {want}: {:?}", rx.borrow());
}

/// A candidate whose work counts how many of them run at once.
fn candidate(
    client: kube::Client,
    identity: &str,
    stop: CancellationToken,
    running: Arc<AtomicUsize>,
    max_running: Arc<AtomicUsize>,
) -> Leadership {
    elect(client, settings(identity), stop, move || {
        let running = running.clone();
        let max_running = max_running.clone();
        async move {
            struct Guard(Arc<AtomicUsize>);
            impl Drop for Guard {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            max_running.fetch_max(now, Ordering::SeqCst);
            let _g = Guard(running);
            std::future::pending::<()>().await
        }
    })
    .unwrap()
}

#[tokio::test]
async fn one_leader_failover_when_it_is_cut_off_and_clean_hand_over() {
    let api = kube_support::TestApi::start().await;
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    let running = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let watcher_stop = CancellationToken::new();
    let mut leader = watch_leader(api.client(), NS, LEASE, watcher_stop.clone());

    // a reaches the server through a relay the test can cut; b directly. a starts first.
    let stop_a = CancellationToken::new();
    let a = candidate(
        kube_support::client_at(relay.addr()),
        "10.0.0.1:8080",
        stop_a.clone(),
        running.clone(),
        max_running.clone(),
    );
    wait_until("a leads", || a.is_leader()).await;
    let stop_b = CancellationToken::new();
    let b = candidate(
        api.client(),
        "10.0.0.2:8080",
        stop_b.clone(),
        running.clone(),
        max_running.clone(),
    );
    wait_leader(&mut leader, "10.0.0.1:8080").await;
    // b stays a candidate while a renews (more than a lease duration).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.is_leader() && !b.is_leader());

    // a is cut off from the server: it stops leading (renew deadline), and b takes over once
    // the Lease has been unchanged for the lease duration. Never both at once.
    relay.cut();
    wait_until("a gave up", || !a.is_leader()).await;
    wait_leader(&mut leader, "10.0.0.2:8080").await;
    wait_until("b leads", || b.is_leader()).await;
    assert_eq!(max_running.load(Ordering::SeqCst), 1, "two leaders at once");

    // b stops cleanly and releases the Lease: a, reachable again, takes it without waiting
    // for an expiry.
    relay.restore();
    stop_b.cancel();
    wait_until("b stopped leading", || !b.is_leader()).await;
    wait_leader(&mut leader, "10.0.0.1:8080").await;
    wait_until("a leads again", || a.is_leader()).await;
    assert_eq!(max_running.load(Ordering::SeqCst), 1, "two leaders at once");
    stop_a.cancel();
    watcher_stop.cancel();
}

#[test]
fn inconsistent_timings_are_refused_with_the_key() {
    let mut s = settings("x");
    s.renew_deadline = Duration::from_secs(5);
    assert!(s.validate().unwrap_err().starts_with("renew-deadline"));
    let mut s = settings("x");
    s.lease_duration = Duration::from_millis(1500);
    assert!(s.validate().unwrap_err().starts_with("lease-duration"));
    let s = settings("");
    assert!(s.validate().unwrap_err().starts_with("identity"));
}
