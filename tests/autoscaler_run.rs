//! The scaler's run loop on tokio's paused clock: pokes, catalog changes, shutdown.

mod autoscaler_common;

use std::time::Duration;

use autoscaler_common::{harness, key, local, revision, stat};
use thaw::clock;
use thaw::platform::memory::MemoryPlatform;
use thaw::revision::CatalogSnapshot;
use thaw::stats::{StatSink, stat_channel};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_poke_scales_from_zero_without_waiting_for_the_tick() {
    let platform = MemoryPlatform::with_startup(Duration::from_secs(1));
    let h = harness(
        vec![revision("r", |s| s.initial_scale = 0)],
        platform,
        local(),
    );
    let (sink, rx) = stat_channel(64);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let states = h.states.clone();
    let platform = h.platform.clone();
    let task = tokio::spawn(h.scaler.run(rx, async {
        let _ = stopped.await;
    }));
    // Mid-way between two ticks.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut state = states.subscribe(&key("r"));
    assert_eq!(state.borrow().desired, -1);
    let poked_at = Instant::now();
    sink.poke(stat("r", clock::now_second(), 1.0));
    let decided = state.wait_for(|s| s.desired == 1).await.unwrap().clone();
    assert_eq!(
        decided.decided_at,
        Some(poked_at),
        "decided on the poke, not the tick"
    );
    assert!(decided.activator_in_path, "no pod is ready yet");
    assert_eq!(platform.scale_calls().len(), 1);
    // The pod becomes ready; the activator stays in the path (1 pod < TBC 211).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(platform.ready(&key("r")), 1);
    stop.send(()).unwrap();
    task.await.unwrap();
    assert_eq!(
        platform.replicas(&key("r")),
        Some(1),
        "shutdown leaves replicas alone"
    );
}

#[tokio::test(start_paused = true)]
async fn the_run_loop_follows_catalog_changes() {
    let platform = MemoryPlatform::new();
    let h = harness(
        vec![revision("a", |s| s.initial_scale = 0)],
        platform,
        local(),
    );
    let (_sink, rx) = stat_channel(64);
    let (catalog, states, platform) = (h.catalog.clone(), h.states.clone(), h.platform.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(h.scaler.run(rx, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut a_state = states.subscribe(&key("a"));
    // Add "b" (initial scale 2), drop "a".
    catalog.store(CatalogSnapshot::new(
        [revision("b", |s| s.initial_scale = 2)],
        [],
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(platform.replicas(&key("b")), Some(2));
    assert!(a_state.changed().await.is_err(), "a's state channel closed");
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn any_stat_with_load_wakes_a_revision_at_zero_but_zeros_do_not() {
    let h = harness(
        vec![revision("r", |s| s.initial_scale = 0)],
        MemoryPlatform::new(),
        local(),
    );
    let (sink, rx) = stat_channel(64);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (states, platform) = (h.states.clone(), h.platform.clone());
    let task = tokio::spawn(h.scaler.run(rx, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A zero report between ticks changes nothing.
    sink.record(stat("r", clock::now_second(), 0.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(platform.scale_calls().is_empty());
    // A regular report with load decides at once, as a poke does (Knative pokes on every
    // stat while the answer is 0).
    let mut state = states.subscribe(&key("r"));
    let at = Instant::now();
    sink.record(stat("r", clock::now_second(), 3.0));
    let decided = state.wait_for(|s| s.desired == 1).await.unwrap().clone();
    assert_eq!(decided.decided_at, Some(at));
    stop.send(()).unwrap();
    task.await.unwrap();
}
