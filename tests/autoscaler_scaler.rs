//! The scaler against the in-memory platform, second by second on a virtual clock through its
//! step methods: scale-to-zero timing, reload, panic, bounds, activator path, retries.

mod autoscaler_common;

use std::time::Duration;

use autoscaler_common::{harness, key, local, revision, settles_at, stat};
use thaw::autoscaler::lifecycle::Activity;
use thaw::autoscaler::scaler::ActivatorPath;
use thaw::clock;
use thaw::platform::memory::MemoryPlatform;
use thaw::revision::CatalogSnapshot;
use thaw::stats::StatMessage;

#[tokio::test(start_paused = true)]
async fn the_last_pod_goes_a_stable_window_after_the_last_request() {
    let mut h = harness(
        vec![revision("r", |s| s.initial_scale = 0)],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    assert!(
        h.platform.scale_calls().is_empty(),
        "initial scale 0 starts nothing"
    );
    // Load of 1 for seconds 1000..=1009, then reported zeros.
    let replicas = h
        .run("r", 1000, 1100, |s| if s < 1010 { 1.0 } else { 0.0 })
        .await;
    assert_eq!(replicas[0], 1, "the first stat with load woke it");
    // Second 1009 leaves the 60s window after 1068; the tick at 1070 sees 0 and, the
    // activator being in the path for long, removes the pod at once.
    assert_eq!(replicas[(1068 - 1000) as usize], 1);
    assert_eq!(settles_at(&replicas, 1000, 0), Some(1070));
    let calls: Vec<u32> = h
        .platform
        .scale_calls()
        .iter()
        .map(|c| c.replicas)
        .collect();
    assert_eq!(
        calls,
        [1, 0],
        "the platform is called only when the answer changes"
    );
    let st = h.scaler.status(&key("r")).unwrap();
    assert!(matches!(st.activity, Activity::Inactive { .. }));
}

#[tokio::test(start_paused = true)]
async fn a_revision_without_traffic_keeps_its_initial_pod_for_a_stable_window() {
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    assert_eq!(
        h.platform.replicas(&key("r")),
        Some(1),
        "initial scale applied at once"
    );
    // No stats at all: with the activator always in the path, silence is no load.
    let mut replicas = Vec::new();
    for s in 1000..1100 {
        let now = clock::instant_of(s);
        h.platform
            .set_ready(&key("r"), h.platform.replicas(&key("r")).unwrap() as usize);
        if s.is_multiple_of(2) {
            h.scaler.tick(now).await;
        }
        replicas.push(h.platform.replicas(&key("r")).unwrap());
    }
    // Active from 1000 (its pod ready), inactive 60s later, and then gone.
    assert_eq!(settles_at(&replicas, 1000, 0), Some(1060));
}

#[tokio::test(start_paused = true)]
async fn a_live_reload_of_the_stable_window_applies_at_the_next_tick() {
    let mut h = harness(
        vec![revision("r", |s| s.initial_scale = 0)],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let before = h
        .run("r", 1000, 1020, |s| if s < 1010 { 1.0 } else { 0.0 })
        .await;
    assert_eq!(before.last(), Some(&1));
    h.catalog.store(CatalogSnapshot::new(
        [revision("r", |s| {
            s.initial_scale = 0;
            s.stable_window = Duration::from_secs(6);
            s.panic_window = Duration::from_secs(1);
        })],
        [],
    ));
    h.scaler.sync_catalog(clock::instant_of(1020)).await;
    assert_eq!(
        h.platform.replicas(&key("r")),
        Some(1),
        "nothing happens before the tick"
    );
    let after = h.run("r", 1020, 1040, |_| 0.0).await;
    // The 6s window holds only zeros and the revision was active for more than 6s: it turns
    // inactive at 1020 (with the 60s window it would stay active until 1070). The activator
    // has fronted it since it appeared at 1000, so its last pod goes once that is a 30s grace
    // period old, at 1030.
    assert!(matches!(
        h.scaler.status(&key("r")).unwrap().activity,
        Activity::Inactive { since, .. } if since == clock::instant_of(1020)
    ));
    assert_eq!(settles_at(&after, 1020, 0), Some(1030));
}

#[tokio::test(start_paused = true)]
async fn a_burst_panics_and_panic_holds_the_scale() {
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    h.run("r", 1000, 1010, |_| 10.0).await;
    assert_eq!(h.platform.replicas(&key("r")), Some(1));
    // 500 in flight: the 6s panic window climbs to 2, 4, 6, 8 pods in 2s steps; at 1012
    // ceil(255 / 70) = 4 ≥ 2 × 2 ready was the last decision over the threshold.
    let burst = h.run("r", 1010, 1020, |_| 500.0).await;
    assert_eq!(burst, [2, 2, 4, 4, 6, 6, 8, 8, 8, 8]);
    assert!(h.scaler.status(&key("r")).unwrap().panicking);
    // Load falls back: the panic holds the 8 until a stable window after 1012.
    let calm = h.run("r", 1020, 1080, |_| 10.0).await;
    assert!(calm[..(1074 - 1020)].iter().all(|&r| r == 8), "{calm:?}");
    assert!(calm[(1074 - 1020) as usize] < 8, "{calm:?}");
    assert!(!h.scaler.status(&key("r")).unwrap().panicking);
    let metrics = h.telemetry.encode();
    assert!(
        metrics.contains("thaw_autoscaler_panic_mode{namespace=\"ns\",revision=\"r\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("thaw_autoscaler_decision_seconds_count"));
}

#[tokio::test(start_paused = true)]
async fn min_and_max_scale_bound_the_answer() {
    let mut h = harness(
        vec![revision("r", |s| {
            s.min_scale = 2;
            s.max_scale = 4;
        })],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let replicas = h
        .run("r", 1000, 1200, |s| if s < 1010 { 1000.0 } else { 0.0 })
        .await;
    assert_eq!(*replicas.iter().max().unwrap(), 4);
    assert_eq!(
        replicas.last(),
        Some(&2),
        "min-scale keeps 2 without traffic"
    );
}

#[tokio::test(start_paused = true)]
async fn the_activator_leaves_the_path_with_enough_burst_capacity() {
    let mut h = harness(
        vec![revision("r", |s| s.min_scale = 3)],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    h.run("r", 1000, 1004, |_| 10.0).await;
    // 3 pods × 100 − 211 − 10 = 79 ≥ 0: pods serve directly.
    let st = h.states.subscribe(&key("r")).borrow().clone();
    assert_eq!(st.desired, 3);
    assert!(!st.activator_in_path);
    assert_eq!(
        h.scaler.status(&key("r")).unwrap().excess_burst_capacity,
        79
    );
    // 300 in flight: by 1006 the panic window averages 155, 300 − 211 − 155 < 0: back
    // behind the activator.
    h.run("r", 1004, 1007, |_| 300.0).await;
    assert!(h.states.subscribe(&key("r")).borrow().activator_in_path);
}

#[tokio::test(start_paused = true)]
async fn with_the_path_following_decisions_the_grace_period_counts_from_the_switch() {
    let mut h = harness(
        vec![revision("r", |s| {
            s.initial_scale = 0;
            s.target_burst_capacity = 0.0;
        })],
        MemoryPlatform::new(),
        ActivatorPath::FollowsDecision,
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let replicas = h
        .run("r", 1000, 1120, |s| if s < 1010 { 1.0 } else { 0.0 })
        .await;
    // TBC 0: pods serve directly while active. The revision turns inactive at 1070, the
    // activator enters the path then, and the pod goes a 30s grace period later.
    assert_eq!(replicas[(1098 - 1000) as usize], 1);
    assert_eq!(settles_at(&replicas, 1000, 0), Some(1100));
}

#[tokio::test(start_paused = true)]
async fn a_failed_scale_is_retried_at_the_next_decision() {
    let mut h = harness(
        vec![revision("r", |s| s.initial_scale = 0)],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    h.platform.fail_scale(&key("r"), Some("quota exceeded"));
    h.run("r", 1000, 1003, |_| 5.0).await;
    assert_eq!(h.platform.replicas(&key("r")), None);
    assert_eq!(h.states.subscribe(&key("r")).borrow().desired, -1);
    h.platform.fail_scale(&key("r"), None);
    h.run("r", 1003, 1005, |_| 5.0).await;
    assert_eq!(h.platform.replicas(&key("r")), Some(1));
    assert!(
        h.telemetry
            .encode()
            .contains("thaw_autoscaler_scale_errors_total 3")
    );
}

#[tokio::test(start_paused = true)]
async fn stats_for_unknown_revisions_are_counted_not_kept() {
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let now = clock::instant_of(1000);
    assert_eq!(
        h.scaler
            .ingest(StatMessage::Poke(stat("nope", 1000, 1.0)), now),
        None
    );
    assert!(
        h.telemetry
            .encode()
            .contains("thaw_autoscaler_stats_rejected_total{reason=\"unknown_revision\"} 1")
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_scaler_adopts_running_pods_and_holds_them_for_a_stable_window() {
    let platform = MemoryPlatform::new();
    platform.set_ready(&key("r"), 3);
    let mut h = harness(vec![revision("r", |_| {})], platform, local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    assert!(
        h.platform.scale_calls().is_empty(),
        "3 ready ≥ initial scale 1: adopted"
    );
    assert!(
        h.scaler.status(&key("r")).unwrap().panicking,
        "starts in panic"
    );
    // No history, no load: the start-up panic keeps the 3 pods for a stable window.
    let replicas = h.run("r", 1000, 1070, |_| 0.0).await;
    assert!(replicas[..61].iter().all(|&r| r == 3), "{replicas:?}");
    assert!(replicas[62] < 3, "{replicas:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_initial_scale_is_retried() {
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    // The platform does not know the revision yet when the scaler first sees it.
    h.platform.fail_scale(&key("r"), Some("unknown revision"));
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    assert_eq!(h.platform.replicas(&key("r")), None);
    h.scaler.tick(clock::instant_of(1000)).await;
    assert_eq!(h.platform.replicas(&key("r")), None);
    h.platform.fail_scale(&key("r"), None);
    h.scaler.tick(clock::instant_of(1002)).await;
    assert_eq!(
        h.platform.replicas(&key("r")),
        Some(1),
        "no traffic, yet the initial pod"
    );
}

/// Knative's class annotation: a revision of the HPA class belongs to another autoscaler. The
/// KPA never scales it (no initial scale, no answer to load) and never takes it to zero, even
/// when it changes class while it has replicas.
#[tokio::test(start_paused = true)]
async fn a_revision_of_the_hpa_class_is_never_scaled_nor_taken_to_zero() {
    let hpa =
        |s: &mut thaw::config::AutoscalingSpec| s.class = "hpa.autoscaling.knative.dev".into();
    let mut h = harness(vec![revision("h", hpa)], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let replicas = h
        .run("h", 1000, 1100, |s| if s < 1050 { 50.0 } else { 0.0 })
        .await;
    assert!(replicas.iter().all(|&r| r == 0), "{replicas:?}");
    assert!(h.platform.scale_calls().is_empty());
    assert!(h.scaler.status(&key("h")).is_none());

    // A KPA revision with replicas that turns HPA keeps them, through a long idle time.
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    h.run("r", 1000, 1010, |_| 100.0).await;
    let before = h.platform.replicas(&key("r")).unwrap();
    assert!(before >= 1);
    let calls = h.platform.scale_calls().len();
    h.catalog
        .store(CatalogSnapshot::new([revision("r", hpa)], []));
    h.scaler.sync_catalog(clock::instant_of(1010)).await;
    let after = h.run("r", 1010, 1300, |_| 0.0).await;
    assert!(after.iter().all(|&r| r == before), "{after:?}");
    assert_eq!(
        h.platform.scale_calls().len(),
        calls,
        "no scale call after the change"
    );
}

/// Per revision, the observed stable and panic load and the target per pod are gauges; a
/// revision adopted with several ready pods shows panic mode from the moment it is adopted,
/// before any tick; a removed revision loses its series.
#[tokio::test(flavor = "multi_thread")]
async fn load_and_target_gauges_and_panic_from_adoption() {
    let platform = MemoryPlatform::new();
    platform.set_ready(&key("r"), 3);
    let mut h = harness(vec![revision("r", |_| {})], platform, local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let m = h.telemetry.encode();
    assert!(
        m.contains("thaw_autoscaler_panic_mode{namespace=\"ns\",revision=\"r\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("thaw_autoscaler_target_per_pod{namespace=\"ns\",revision=\"r\",metric=\"concurrency\"} 70.0"),
        "{m}"
    );
    h.run("r", 1000, 1010, |_| 35.0).await;
    let m = h.telemetry.encode();
    assert!(
        m.contains("thaw_autoscaler_observed_stable{namespace=\"ns\",revision=\"r\",metric=\"concurrency\"} 35.0"),
        "{m}"
    );
    assert!(
        m.contains("thaw_autoscaler_observed_panic{namespace=\"ns\",revision=\"r\",metric=\"concurrency\"} 35.0"),
        "{m}"
    );
    h.catalog.store(CatalogSnapshot::new([], []));
    h.scaler.sync_catalog(clock::instant_of(1010)).await;
    let m = h.telemetry.encode();
    assert!(
        !m.contains("revision=\"r\""),
        "series of a removed revision left:\n{m}"
    );
}

/// The scaler follows single catalog changes: a revision added on its own gets its initial
/// scale, one changed on its own takes its new settings, one removed on its own is scaled to
/// 0 and forgotten; the others keep their state.
#[tokio::test(start_paused = true)]
async fn single_catalog_changes_are_applied_on_their_own() {
    let mut h = harness(vec![revision("a", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    assert_eq!(h.platform.replicas(&key("a")), Some(1), "initial scale");
    h.catalog.upsert(revision("b", |s| s.initial_scale = 2));
    h.scaler.sync_catalog(clock::instant_of(1001)).await;
    assert_eq!(
        h.platform.replicas(&key("b")),
        Some(2),
        "added: initial scale"
    );
    let a_before = h.scaler.status(&key("a")).unwrap();

    h.catalog.upsert(revision("b", |s| {
        s.initial_scale = 2;
        s.max_scale = 1;
    }));
    h.scaler.sync_catalog(clock::instant_of(1002)).await;
    h.scaler.tick(clock::instant_of(1002)).await;
    assert_eq!(
        h.platform.replicas(&key("b")),
        Some(1),
        "changed: max-scale 1"
    );

    assert!(h.catalog.remove(&key("b")));
    h.scaler.sync_catalog(clock::instant_of(1003)).await;
    assert_eq!(
        h.platform.replicas(&key("b")),
        Some(0),
        "removed: scaled to 0"
    );
    assert!(h.scaler.status(&key("b")).is_none());
    assert_eq!(h.scaler.revisions().count(), 1);
    assert_eq!(
        h.scaler.status(&key("a")).unwrap().desired,
        a_before.desired
    );
}

/// Knative's PodAutoscaler reachability: a revision no route uses any more (`routingState:
/// reserve`, resolved into `reachable: false`) is no longer held up by its min-scale.
#[tokio::test(start_paused = true)]
async fn min_scale_stops_holding_a_revision_no_route_uses() {
    let mut h = harness(
        vec![revision("r", |s| s.min_scale = 2)],
        MemoryPlatform::new(),
        local(),
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let replicas = h.run("r", 1000, 1200, |_| 0.0).await;
    assert_eq!(replicas.last(), Some(&2), "reachable: min-scale holds 2");

    h.catalog.upsert(revision("r", |s| {
        s.min_scale = 2;
        s.reachable = false;
    }));
    h.scaler.sync_catalog(clock::instant_of(1200)).await;
    let replicas = h.run("r", 1200, 1400, |_| 0.0).await;
    assert_eq!(replicas.last(), Some(&0), "unreachable: taken to zero");
}

/// Knative's decider reports an excess burst capacity of 0 until its first decision (a
/// decider built with 2 ready pods included); the activator stays in the path meanwhile, and
/// the first decision reports the real value.
#[tokio::test(start_paused = true)]
async fn excess_burst_capacity_reads_zero_until_the_first_decision() {
    let platform = MemoryPlatform::new();
    platform.set_ready(&key("r"), 2);
    let mut h = harness(
        vec![revision("r", |_| {})],
        platform,
        ActivatorPath::FollowsDecision,
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let st = h.scaler.status(&key("r")).unwrap();
    assert_eq!(st.excess_burst_capacity, 0);
    assert!(st.activator_in_path, "no decision yet: the activator stays");
    // Load of 1 at second 1000 with the 2 pods still ready, decided at the tick:
    // 2 pods × 100 − 211 − 1.
    let now = clock::instant_of(1000);
    h.scaler
        .ingest(StatMessage::Record(stat("r", 1000, 1.0)), now);
    h.scaler.tick(now).await;
    let st = h.scaler.status(&key("r")).unwrap();
    assert_eq!(st.excess_burst_capacity, 200 - 211 - 1);
    assert!(st.activator_in_path);
}

/// Extreme stats (a tenant's pod can report anything): each is clamped to the ceiling and
/// counted, the windows stay finite, and once the stable window has passed the revision
/// scales on its real load again (unclamped, one 1e20 stat left the window's running sum
/// wrong and halved the pods; two 1e308 made it infinite and pinned max-scale).
#[tokio::test(start_paused = true)]
async fn extreme_stats_are_clamped_and_forgotten_with_the_window() {
    let mut h = harness(vec![revision("r", |_| {})], MemoryPlatform::new(), local());
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    // A steady 700 in flight: 10 pods at the default target of 70 per pod.
    h.run("r", 1000, 1070, |_| 700.0).await;
    assert_eq!(h.platform.replicas(&key("r")), Some(10));
    for (i, extreme) in [1e20, f64::MAX].into_iter().enumerate() {
        let from = 1070 + 130 * i as u64;
        for s in [from, from + 1] {
            let now = clock::instant_of(s);
            let mut st = stat("r", s, extreme);
            st.source = "a-tenant-pod".into();
            h.scaler.ingest(StatMessage::Record(st), now);
        }
        let replicas = h.run("r", from, from + 130, |_| 700.0).await;
        assert!(
            replicas.iter().all(|r| *r <= 1_000_000 / 70 + 1),
            "clamped: at most the ceiling's pods"
        );
        assert_eq!(
            replicas.last(),
            Some(&10),
            "back to the real load after {extreme:e}"
        );
    }
    let text = h.telemetry.encode();
    assert!(
        text.contains("thaw_autoscaler_stats_clamped_total 4"),
        "{}",
        text.lines()
            .filter(|l| l.contains("clamped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
