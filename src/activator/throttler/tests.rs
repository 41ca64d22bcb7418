use std::sync::Mutex as StdMutex;
use std::sync::atomic::AtomicU32;

use prometheus_client::metrics::gauge::Gauge;

use super::*;

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn snapshot(ready: &[u16], terminating: &[u16]) -> EndpointSnapshot {
    EndpointSnapshot {
        limit: None,
        ready: ready.iter().map(|p| addr(*p)).collect(),
        terminating: terminating.iter().map(|p| addr(*p)).collect(),
        starting: Vec::new(),
        status: EndpointStatus::Ok,
        reach_pending: false,
        queue_proxy: false,
    }
}

fn throttler() -> (Throttler, Arc<StdMutex<Vec<SocketAddr>>>, Arc<HeldBudget>) {
    let drained = Arc::new(StdMutex::new(Vec::new()));
    let d = drained.clone();
    let budget = Arc::new(HeldBudget::default());
    let t = Throttler::new(
        budget.clone(),
        &Arc::from("ns"),
        Gauge::default(),
        Box::new(move |a| d.lock().unwrap().push(a)),
    );
    (t, drained, budget)
}

const LIMITS: HoldLimits = HoldLimits {
    queue_depth: 100,
    max_held: 1000,
    max_held_namespace: 1000,
};

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// A revision whose ready pods the activator is still probing the reach of has no ready
/// endpoint yet but is not cold: its request waits for the probe (held, then admitted), and
/// is not a cold start. No endpoint at all is cold; failing is not.
#[tokio::test(start_paused = true)]
async fn pending_reach_is_held_but_not_cold() {
    let (t, _, _) = throttler();
    assert!(t.is_cold(), "no endpoint yet");
    t.update(
        &EndpointSnapshot {
            reach_pending: true,
            ..snapshot(&[], &[])
        },
        0,
        0,
    );
    assert!(!t.is_cold(), "pods ready, reach being probed");
    assert_eq!(t.ready_count(), 0);
    let t2 = t.clone();
    let waiter = tokio::spawn(async move { t2.acquire(LIMITS, far()).await });
    tokio::task::yield_now().await;
    assert_eq!(t.held(), 1);
    tokio::time::advance(Duration::from_millis(2)).await;
    t.update(&snapshot(&[1], &[]), 0, 0);
    let adm = waiter.await.unwrap().unwrap();
    assert_eq!(adm.in_flight.addr(), addr(1));
    assert_eq!(adm.held_for, Some(Duration::from_millis(2)));
    drop(adm);
    t.update(&snapshot(&[], &[]), 0, 0);
    assert!(t.is_cold(), "no endpoint and none pending");
    t.update(
        &EndpointSnapshot {
            status: EndpointStatus::Failing {
                reason: "crash loop".into(),
            },
            ..snapshot(&[], &[])
        },
        0,
        0,
    );
    assert!(!t.is_cold(), "failing");
}

#[tokio::test(start_paused = true)]
async fn held_request_is_admitted_when_an_endpoint_appears() {
    let (t, _, budget) = throttler();
    let t2 = t.clone();
    let waiter = tokio::spawn(async move { t2.acquire(LIMITS, far()).await });
    tokio::task::yield_now().await;
    assert_eq!(t.held(), 1);
    assert_eq!(budget.held(), 1);
    tokio::time::advance(Duration::from_millis(250)).await;
    t.update(&snapshot(&[1], &[]), 1, 0);
    let adm = waiter.await.unwrap().unwrap();
    assert_eq!(adm.in_flight.addr(), addr(1));
    assert_eq!(adm.held_for, Some(Duration::from_millis(250)));
    assert_eq!((t.held(), budget.held()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_as_slots_free() {
    let (t, _, _) = throttler();
    t.update(&snapshot(&[1], &[]), 1, 0);
    let first = t.try_acquire().expect("free slot");
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (t, order) = (t.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let adm = t.acquire(LIMITS, far()).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
            drop(adm);
        }));
        tokio::task::yield_now().await; // enqueue in order
    }
    assert_eq!(t.held(), 5);
    assert!(
        t.try_acquire().is_none(),
        "a newcomer never overtakes the queue"
    );
    drop(first);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    assert_eq!(t.held(), 0);
    assert_eq!(t.endpoints()[0].in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn queue_depth_and_global_cap_bound_the_hold() {
    let (t, _, budget) = throttler();
    let limits = HoldLimits {
        queue_depth: 2,
        max_held: 3,
        max_held_namespace: 100,
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let t = t.clone();
        held.push(tokio::spawn(async move { t.acquire(limits, far()).await }));
    }
    tokio::task::yield_now().await;
    assert_eq!(
        t.acquire(limits, far()).await.unwrap_err(),
        Rejection::QueueFull { depth: 2 }
    );
    // A second revision shares the budget: one more fits, then the cap refuses.
    let other = Throttler::new(
        budget.clone(),
        &Arc::from("ns"),
        Gauge::default(),
        Box::new(|_| {}),
    );
    let o = other.clone();
    let third = tokio::spawn(async move { o.acquire(limits, far()).await });
    tokio::task::yield_now().await;
    assert_eq!(budget.held(), 3);
    assert_eq!(
        other.acquire(limits, far()).await.unwrap_err(),
        Rejection::HeldCapReached { cap: 3 }
    );
    third.abort();
    for h in held {
        h.abort();
    }
    tokio::task::yield_now().await;
    assert_eq!(budget.held(), 0, "cancelled waiters give the budget back");
    assert_eq!(t.held(), 0);
}

/// One namespace's revisions together hold at most its share; another namespace still gets
/// the rest of the activator's budget.
#[tokio::test(start_paused = true)]
async fn a_namespace_holds_at_most_its_share() {
    let budget = Arc::new(HeldBudget::default());
    let limits = HoldLimits {
        queue_depth: 100,
        max_held: 10,
        max_held_namespace: 4,
    };
    let new = |ns: &str| {
        Throttler::new(
            budget.clone(),
            &Arc::from(ns),
            Gauge::default(),
            Box::new(|_| {}),
        )
    };
    let (a1, a2, b) = (new("team-a"), new("team-a"), new("team-b"));
    let mut held = Vec::new();
    for t in [&a1, &a2, &a1, &a2] {
        let t = t.clone();
        held.push(tokio::spawn(async move { t.acquire(limits, far()).await }));
    }
    tokio::task::yield_now().await;
    assert_eq!(budget.held_in("team-a"), 4);
    assert_eq!(
        a1.acquire(limits, far()).await.unwrap_err(),
        Rejection::NamespaceShareReached { cap: 4 }
    );
    // team-b's cold start still holds.
    let bb = b.clone();
    held.push(tokio::spawn(async move { bb.acquire(limits, far()).await }));
    tokio::task::yield_now().await;
    assert_eq!(budget.held_in("team-b"), 1);
    assert_eq!(budget.held(), 5);
    for h in held {
        h.abort();
    }
    tokio::task::yield_now().await;
    assert_eq!((budget.held(), budget.held_in("team-a")), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn hold_timeout_leaves_the_queue() {
    let (t, _, budget) = throttler();
    let deadline = Instant::now() + Duration::from_secs(5);
    let t2 = t.clone();
    let waiter = tokio::spawn(async move { t2.acquire(LIMITS, deadline).await });
    tokio::task::yield_now().await;
    assert_eq!(t.held(), 1);
    tokio::time::advance(Duration::from_secs(6)).await;
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, Rejection::HoldTimeout { waited } if waited >= Duration::from_secs(5)));
    assert_eq!((t.held(), budget.held()), (0, 0));
    // The queue is clean: an endpoint now admits a fresh request at once.
    t.update(&snapshot(&[1], &[]), 1, 0);
    assert!(t.try_acquire().is_some());
}

#[tokio::test(start_paused = true)]
async fn failing_rejects_held_and_new_requests_until_ok_again() {
    let (t, _, budget) = throttler();
    let t2 = t.clone();
    let waiter = tokio::spawn(async move { t2.acquire(LIMITS, far()).await });
    tokio::task::yield_now().await;
    let failing = EndpointSnapshot {
        status: EndpointStatus::Failing {
            reason: "crash loop: exit code 1".into(),
        },
        ..Default::default()
    };
    t.update(&failing, 0, 0);
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err, Rejection::Failing("crash loop: exit code 1".into()));
    assert!(matches!(
        t.acquire(LIMITS, far()).await,
        Err(Rejection::Failing(_))
    ));
    assert_eq!(budget.held(), 0);
    t.update(&snapshot(&[1], &[]), 0, 0);
    assert!(t.acquire(LIMITS, far()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn removed_revision_answers_held_requests() {
    let (t, _, _) = throttler();
    let t2 = t.clone();
    let waiter = tokio::spawn(async move { t2.acquire(LIMITS, far()).await });
    tokio::task::yield_now().await;
    t.remove(Rejection::Removed);
    assert_eq!(waiter.await.unwrap().unwrap_err(), Rejection::Removed);
    assert_eq!(
        t.acquire(LIMITS, far()).await.unwrap_err(),
        Rejection::Removed
    );
}

#[tokio::test(start_paused = true)]
async fn cc0_new_endpoint_takes_the_burst_then_one_per_finished_request() {
    let (t, _, _) = throttler();
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let t = t.clone();
        waiters.push(tokio::spawn(async move { t.acquire(LIMITS, far()).await }));
    }
    tokio::task::yield_now().await;
    assert_eq!(t.held(), 10);
    t.update(&snapshot(&[1], &[]), 0, 3);
    tokio::task::yield_now().await;
    assert_eq!(t.held(), 7, "burst of 3");
    let mut admitted: Vec<_> = Vec::new();
    for w in waiters.iter_mut().take(3) {
        admitted.push(w.await.unwrap().unwrap());
    }
    drop(admitted.pop());
    assert_eq!(t.held(), 6, "one finished, one released");
    assert_eq!(t.endpoints()[0].in_flight, 3);
    drop(admitted);
    // Everything drains, one at a time; once nothing is held the limit is lifted.
    for w in waiters.into_iter().skip(3) {
        drop(w.await.unwrap().unwrap());
    }
    assert_eq!(t.held(), 0);
    assert_eq!(t.endpoints()[0].limit, None, "warm-up lifted");
}

#[tokio::test(start_paused = true)]
async fn terminating_endpoint_gets_nothing_new_and_is_reported_drained() {
    let (t, drained, _) = throttler();
    t.update(&snapshot(&[1, 2], &[]), 10, 0);
    let a = t.try_acquire().unwrap();
    let b = t.try_acquire().unwrap();
    let (on1, on2) = if a.addr() == addr(1) { (a, b) } else { (b, a) };
    assert_eq!(
        (on1.addr(), on2.addr()),
        (addr(1), addr(2)),
        "round robin spreads"
    );
    t.update(&snapshot(&[2], &[1]), 10, 0);
    for _ in 0..5 {
        assert_eq!(t.try_acquire().unwrap().addr(), addr(2));
    }
    assert!(drained.lock().unwrap().is_empty(), "one still in flight");
    drop(on1);
    assert_eq!(*drained.lock().unwrap(), [addr(1)]);
    // An idle endpoint that starts terminating is reported at once.
    t.update(&snapshot(&[], &[1, 2]), 10, 0);
    assert_eq!(*drained.lock().unwrap(), [addr(1)], "2 still busy");
    drop(on2);
    assert_eq!(*drained.lock().unwrap(), [addr(1), addr(2)]);
}

/// 1,000 held requests on a cold revision, three endpoints at containerConcurrency 2, two worker
/// threads releasing concurrently: every request is admitted exactly once and no endpoint ever
/// has more than 2 in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_held_requests_all_admitted_within_cc() {
    let (t, _, budget) = throttler();
    let peak: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    let now: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    let limits = HoldLimits {
        queue_depth: 1000,
        max_held: 1000,
        max_held_namespace: 1000,
    };
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let (t, peak, now) = (t.clone(), peak.clone(), now.clone());
        tasks.push(tokio::spawn(async move {
            let adm = t.acquire(limits, far()).await.unwrap();
            let i = (adm.in_flight.addr().port() - 1) as usize;
            let n = now[i].fetch_add(1, SeqCst) + 1;
            peak[i].fetch_max(n, SeqCst);
            tokio::task::yield_now().await;
            now[i].fetch_sub(1, SeqCst);
        }));
    }
    while t.held() < 1000 {
        tokio::task::yield_now().await;
    }
    t.update(&snapshot(&[1, 2, 3], &[]), 2, 0);
    for task in tasks {
        task.await.unwrap();
    }
    for p in peak.iter() {
        assert!(p.load(SeqCst) <= 2, "peak {}", p.load(SeqCst));
    }
    assert_eq!((t.held(), budget.held()), (0, 0));
    assert!(t.endpoints().iter().all(|e| e.in_flight == 0));
}
