//! A new leader's scaler adopts the cluster as an earlier one left it (what the platform
//! `found`): no initial scale for an initialized revision, the serving mode kept until a
//! decision on stats, no scale-down on the silence of windows that only just started, and
//! Knative's restart panic. The in-memory platform, on a virtual clock, with the activator
//! path confirmed by the writer of the public endpoints (as on Kubernetes).

mod autoscaler_common;

use std::sync::Arc;

use autoscaler_common::{harness, key, revision, stat};
use thaw::autoscaler::lifecycle::Activity;
use thaw::autoscaler::scaler::{ActivatorPath, InPath, Trigger};
use thaw::clock;
use thaw::platform::Found;
use thaw::platform::memory::MemoryPlatform;
use thaw::stats::StatMessage;

fn confirmed() -> (ActivatorPath, Arc<InPath>) {
    let in_path = Arc::new(InPath::default());
    (ActivatorPath::Confirmed(in_path.clone()), in_path)
}

/// Ticks every even second from `from` to `to` with no stats; the platform's pods follow
/// its replicas at once.
async fn silent(h: &mut autoscaler_common::Harness, name: &str, from: u64, to: u64) {
    for s in (from..to).step_by(2) {
        let k = key(name);
        let replicas = h.platform.replicas(&k).unwrap_or(0);
        h.platform.set_ready(&k, replicas as usize);
        h.scaler.tick(clock::instant_of(s)).await;
    }
}

/// An initialized revision at zero (Knative's defaults: initial scale 1), and one no route
/// uses any more (`reserve`): a new leader scales neither up, for minutes of ticks.
#[tokio::test(start_paused = true)]
async fn revisions_at_zero_stay_at_zero_across_a_leader_change() {
    let platform = MemoryPlatform::new();
    let at_zero = Found {
        replicas: Some(0),
        initialized: true,
        activator_in_path: Some(true),
        activity: None,
    };
    platform.set_found(&key("idle"), at_zero);
    platform.set_found(&key("reserve"), at_zero);
    let (path, in_path) = confirmed();
    in_path.confirm(&key("idle"), clock::instant_of(1000));
    in_path.confirm(&key("reserve"), clock::instant_of(1000));
    let mut h = harness(
        vec![
            revision("idle", |_| {}),
            revision("reserve", |s| s.reachable = false),
        ],
        platform,
        path,
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    silent(&mut h, "idle", 1000, 1200).await;
    assert!(
        h.platform.scale_calls().is_empty(),
        "no scale call: {:?}",
        h.platform.scale_calls()
    );
    for name in ["idle", "reserve"] {
        let st = h.scaler.status(&key(name)).unwrap();
        assert!(matches!(st.activity, Activity::Inactive { .. }), "{name}");
        assert!(h.states.get(&key(name)).unwrap().initialized, "{name}");
    }
}

/// A revision that never reached its initial scale (its first pod never came up before the
/// leader changed) still gets it; one asked for that much already is left as it is.
#[tokio::test(start_paused = true)]
async fn a_revision_never_initialized_still_gets_its_initial_scale() {
    let platform = MemoryPlatform::new();
    platform.set_found(
        &key("new"),
        Found {
            replicas: Some(0),
            initialized: false,
            activator_in_path: None,
            activity: None,
        },
    );
    platform.set_found(
        &key("starting"),
        Found {
            replicas: Some(1),
            initialized: false,
            activator_in_path: Some(true),
            activity: None,
        },
    );
    let (path, _) = confirmed();
    let mut h = harness(
        vec![revision("new", |_| {}), revision("starting", |_| {})],
        platform,
        path,
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let calls: Vec<(String, u32)> = h
        .platform
        .scale_calls()
        .iter()
        .map(|c| (c.revision.name.to_string(), c.replicas))
        .collect();
    assert_eq!(calls, [("new".to_string(), 1)]);
    assert!(!h.states.get(&key("new")).unwrap().initialized);
}

/// A revision served by its pods (the activators out of its path) keeps that mode through
/// the new leader's first decisions, which have no stats yet; the first decision on stats
/// decides it again (here: too little burst capacity, so the activators come back).
#[tokio::test(start_paused = true)]
async fn a_served_revision_keeps_its_mode_until_a_decision_on_stats() {
    let platform = MemoryPlatform::new();
    platform.set_found(
        &key("warm"),
        Found {
            replicas: Some(3),
            initialized: true,
            activator_in_path: Some(false),
            activity: None,
        },
    );
    platform.set_ready(&key("warm"), 3);
    let (path, _) = confirmed();
    let mut h = harness(vec![revision("warm", |_| {})], platform, path);
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    let published = h.states.get(&key("warm")).unwrap();
    assert!(!published.activator_in_path, "published as found at once");
    assert_eq!(published.desired, 3);
    silent(&mut h, "warm", 1000, 1030).await;
    assert!(h.platform.scale_calls().is_empty());
    let st = h.scaler.status(&key("warm")).unwrap();
    assert!(!st.activator_in_path, "kept while no stats came");
    assert!(st.panicking, "3 ready: Knative's restart panic");
    assert!(matches!(st.activity, Activity::Active { .. }));

    // Stats: 250 requests in flight on 3 pods is more than the default target burst
    // capacity (211) leaves room for: the activators go back into the path.
    let now = clock::instant_of(1030);
    // (No decision yet: the stat asks for one at once, as a poke would.)
    let poked = h
        .scaler
        .ingest(StatMessage::Record(stat("warm", 1030, 250.0)), now);
    assert_eq!(poked, Some(key("warm")));
    h.scaler.decide(&key("warm"), Trigger::Tick, now).await;
    assert!(h.scaler.status(&key("warm")).unwrap().activator_in_path);
}

/// A warm revision adopted with one pod and no stats yet is not taken down on the silence of
/// windows that only just started: silence counts only once the new scaler watched it for a
/// stable window (the old one's history is gone; a late stat must not find it at zero).
#[tokio::test(start_paused = true)]
async fn silence_counts_only_after_a_stable_window_of_watching() {
    let platform = MemoryPlatform::new();
    platform.set_found(
        &key("r"),
        Found {
            replicas: Some(1),
            initialized: true,
            activator_in_path: Some(true),
            activity: None,
        },
    );
    platform.set_ready(&key("r"), 1);
    let (path, in_path) = confirmed();
    in_path.confirm(&key("r"), clock::instant_of(1000));
    let mut h = harness(
        vec![revision("r", |s| {
            s.scale_to_zero_grace_period = std::time::Duration::from_secs(30)
        })],
        platform,
        path,
    );
    h.scaler.sync_catalog(clock::instant_of(1000)).await;
    silent(&mut h, "r", 1000, 1060).await;
    assert!(
        h.platform.scale_calls().is_empty(),
        "kept for the first stable window: {:?}",
        h.platform.scale_calls()
    );
    assert_eq!(h.scaler.status(&key("r")).unwrap().decided, -1);
    // After it, silence is idleness as before: inactive, and gone after the grace period.
    silent(&mut h, "r", 1060, 1200).await;
    assert_eq!(h.platform.replicas(&key("r")), Some(0));
}
