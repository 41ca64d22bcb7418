use super::*;
use crate::platform::local::slots::pick_victims;
use std::net::{Ipv4Addr, SocketAddrV4};

fn addr(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

fn entry() -> RevisionEntry {
    let e = RevisionEntry::new(RevisionKey::new("ns", "rev"), &PlatformMetrics::default());
    e.update(|st| {
        st.def = Some(Arc::new(LocalRevision::new(
            RevisionKey::new("ns", "rev"),
            ["true"],
        )))
    });
    e
}

#[test]
fn victims_are_idle_slots_first_then_newest_ready() {
    use ReplicaState::*;
    let live = [
        (0, Ready),
        (1, Ready),
        (2, Starting),
        (3, Backoff),
        (4, Ready),
    ];
    assert_eq!(pick_victims(&live, 1), vec![3]);
    assert_eq!(pick_victims(&live, 2), vec![3, 2]);
    assert_eq!(pick_victims(&live, 4), vec![3, 2, 4, 1]);
    assert_eq!(pick_victims(&live, 9).len(), 5);
}

#[test]
fn scale_down_moves_ready_endpoints_to_terminating_before_stopping() {
    let e = entry();
    let created = e.update(|st| {
        st.set_desired(2);
        st.reconcile(true)
    });
    assert_eq!(created.len(), 2);
    let mut rx = e.subscribe();
    e.slot_spawned(0, 100, addr(1000), Instant::now());
    e.slot_spawned(1, 101, addr(1001), Instant::now());
    e.slot_ready(0, Duration::from_millis(5));
    e.slot_ready(1, Duration::from_millis(7));
    assert_eq!(rx.borrow_and_update().ready, vec![addr(1000), addr(1001)]);

    let none = e.update(|st| {
        st.set_desired(1);
        st.reconcile(true)
    });
    assert!(none.is_empty());
    let snap = rx.borrow_and_update().clone();
    assert_eq!(snap.ready, vec![addr(1000)]);
    assert_eq!(
        snap.terminating,
        vec![addr(1001)],
        "newest ready one drains"
    );
    assert_eq!(*created[1].1.borrow(), StopSignal::Drain);
    assert_eq!(*created[0].1.borrow(), StopSignal::Run);

    e.drained(addr(1001));
    assert_eq!(*created[1].1.borrow(), StopSignal::Now);
    e.slot_gone(1);
    assert!(rx.borrow_and_update().terminating.is_empty());
    assert_eq!(e.status().last_startup, Some(Duration::from_millis(7)));
}

#[test]
fn starting_slots_stop_at_once_without_being_advertised() {
    let e = entry();
    let created = e.update(|st| {
        st.set_desired(1);
        st.reconcile(true)
    });
    e.slot_spawned(0, 100, addr(1000), Instant::now());
    e.update(|st| {
        st.set_desired(0);
        st.reconcile(true)
    });
    assert_eq!(*created[0].1.borrow(), StopSignal::Now);
    let snap = e.subscribe().borrow().clone();
    assert!(snap.ready.is_empty() && snap.terminating.is_empty());
    // A probe that passes after the stop must not advertise the endpoint.
    e.slot_ready(0, Duration::from_millis(1));
    assert!(e.subscribe().borrow().ready.is_empty());
}

#[test]
fn crashes_in_a_row_fail_the_revision_until_ready_or_scale_to_zero() {
    let p = RestartPolicy::default();
    let e = entry();
    e.update(|st| {
        st.set_desired(1);
        st.reconcile(true)
    });
    let rx = e.subscribe();
    for _ in 0..2 {
        e.slot_exited(0, true, "exit status 1", &p);
    }
    assert_eq!(rx.borrow().status, EndpointStatus::Ok);
    // An exit after ready does not count.
    e.slot_exited(0, false, "exit status 9", &p);
    assert_eq!(rx.borrow().status, EndpointStatus::Ok);
    e.slot_exited(0, true, "exit status 1 (last output: 'boom')", &p);
    assert_eq!(
        rx.borrow().status,
        EndpointStatus::Failing {
            reason: "replicas keep crashing: exit status 1".into()
        },
        "the replica's output stays out of the reason unless asked for"
    );
    assert_eq!(e.status().consecutive_crashes, 3);

    e.slot_spawned(0, 5, addr(1), Instant::now());
    e.slot_ready(0, Duration::from_millis(1));
    assert_eq!(
        rx.borrow().status,
        EndpointStatus::Ok,
        "recovers when ready"
    );

    for _ in 0..3 {
        e.slot_exited(0, true, "exit status 1", &p);
    }
    assert_ne!(rx.borrow().status, EndpointStatus::Ok);
    e.update(|st| {
        st.set_desired(0);
        st.reconcile(true)
    });
    assert_eq!(rx.borrow().status, EndpointStatus::Ok, "scale to 0 resets");
    // The stopping slot's own crash does not re-fail the revision.
    for _ in 0..3 {
        e.slot_exited(0, true, "exit status 1", &p);
    }
    assert_eq!(rx.borrow().status, EndpointStatus::Ok);
    assert_eq!(e.status().consecutive_crashes, 0);
}

#[test]
fn gauges_follow_replica_states() {
    let metrics = PlatformMetrics::default();
    let key = RevisionKey::new("ns", "rev");
    let e = RevisionEntry::new(key.clone(), &metrics);
    e.update(|st| st.def = Some(Arc::new(LocalRevision::new(key, ["true"]))));
    e.update(|st| {
        st.set_desired(3);
        st.reconcile(true)
    });
    e.slot_spawned(0, 1, addr(1), Instant::now());
    e.slot_ready(0, Duration::from_millis(1));
    e.slot_spawned(1, 2, addr(2), Instant::now());
    let get = |state| {
        metrics
            .replicas
            .get_or_create(&ReplicaStateLabels {
                namespace: "ns".into(),
                revision: "rev".into(),
                state,
            })
            .get()
    };
    assert_eq!(get(ReplicaStateLabel::Ready), 1);
    assert_eq!(get(ReplicaStateLabel::Starting), 1);
    assert_eq!(get(ReplicaStateLabel::Backoff), 1);
    assert_eq!(get(ReplicaStateLabel::Terminating), 0);
}
