use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use super::*;

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

#[tokio::test(start_paused = true)]
async fn admits_up_to_the_limit_then_queues_then_hands_on() {
    let l = Limiter::new(2, 10);
    let a = l.try_acquire().expect("first");
    let _b = l.try_acquire().expect("second");
    assert!(l.try_acquire().is_none(), "third is over the limit");
    let waiter = tokio::spawn({
        let l = l.clone();
        async move { l.acquire(far()).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(l.queued(), 1);
    drop(a);
    let c = waiter.await.unwrap().expect("handed the freed permit");
    assert_eq!((l.in_flight(), l.queued()), (2, 0));
    drop(c);
    assert_eq!(l.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_a_deadline_ends_a_wait() {
    let l = Limiter::new(1, 1);
    let _held = l.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let l = l.clone();
        async move { l.acquire(Instant::now() + Duration::from_secs(5)).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(
        l.acquire(far()).await.unwrap_err(),
        Rejected::QueueFull { depth: 1 }
    );
    let err = waiter.await.unwrap().unwrap_err();
    assert!(matches!(err, Rejected::Timeout { waited } if waited >= Duration::from_secs(5)));
    assert_eq!(l.queued(), 0, "the timed-out waiter left the queue");
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_a_newcomer_never_overtakes() {
    let l = Limiter::new(1, 10);
    let first = l.try_acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (l, order) = (l.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let p = l.acquire(far()).await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(p);
        }));
        tokio::task::yield_now().await;
    }
    drop(first);
    assert!(l.try_acquire().is_none(), "waiters come first");
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!((l.in_flight(), l.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_and_its_turn_goes_to_the_next() {
    let l = Limiter::new(1, 10);
    let held = l.try_acquire().unwrap();
    let gone = tokio::spawn({
        let l = l.clone();
        async move { l.acquire(far()).await }
    });
    tokio::task::yield_now().await;
    let next = tokio::spawn({
        let l = l.clone();
        async move { l.acquire(far()).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(l.queued(), 2);
    gone.abort();
    let _ = gone.await;
    assert_eq!(l.queued(), 1, "cancelled: left the queue");
    drop(held);
    let p = next.await.unwrap().expect("the next waiter got the permit");
    assert_eq!((l.in_flight(), l.queued()), (1, 0));
    drop(p);
    assert_eq!(l.in_flight(), 0);
}

#[tokio::test]
async fn zero_is_unlimited() {
    let l = Limiter::new(0, 0);
    let permits: Vec<_> = (0..1000).map(|_| l.try_acquire().unwrap()).collect();
    assert_eq!(l.in_flight(), 1000);
    drop(permits);
    assert_eq!(l.in_flight(), 0);
}

/// Many tasks on several threads: never more than the limit at once, nobody lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_the_limit_under_contention() {
    let l = Limiter::new(3, 1000);
    let (now, peak) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (l, now, peak) = (l.clone(), now.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let p = l.acquire(far()).await.expect("admitted");
            let n = now.fetch_add(1, SeqCst) + 1;
            peak.fetch_max(n, SeqCst);
            tokio::task::yield_now().await;
            now.fetch_sub(1, SeqCst);
            drop(p);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(peak.load(SeqCst) <= 3, "peak {}", peak.load(SeqCst));
    assert_eq!((l.in_flight(), l.queued()), (0, 0));
}
