//! The activator's table follows single catalog changes, and a revision's
//! state (throttler, window, endpoint task, metric series) is created on its first request.

use std::time::Duration;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

/// Polls `/revisions` until `pred` holds for `rev` (deadline 10 s).
async fn wait_view(h: &Harness, rev: &RevisionKey, pred: impl Fn(&serde_json::Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let view = h.revision(rev).await;
        if pred(&view) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{rev}: {view}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn states_are_created_on_first_use_and_follow_single_changes() {
    let up = Upstream::start().await;
    let specs = (0..100).map(|i| spec(&format!("r{i}"), 0)).collect();
    let mut h = Harness::start(specs, ActivatorConfig::default()).await;
    assert_eq!(h.activator.revision_counts(), (100, 0), "known, none used");
    let (r7, r8) = (
        RevisionKey::new("default", "r7"),
        RevisionKey::new("default", "r8"),
    );
    h.endpoints.set_ready(&r7, vec![up.addr]);
    h.endpoints.set_ready(&r8, vec![up.addr]);

    // A never-requested revision is listed from the platform's snapshot, without a state.
    let view = h.revision(&r8).await;
    assert_eq!(
        (view["state"].as_str(), view["held"].as_u64()),
        (Some("ready"), Some(0))
    );
    assert_eq!(view["endpoints"][0]["address"], up.addr.to_string());

    // The first request creates r7's state (its endpoints applied before it goes on).
    let c = client();
    assert_eq!(send(&c, h.get(&r7, "/")).await.0, 200);
    assert_eq!(h.activator.revision_counts(), (100, 1));
    let metrics = h.metrics().await;
    assert!(metrics.contains("revision=\"r7\""), "{metrics}");
    assert!(
        !metrics.contains("revision=\"r8\""),
        "no series before first use"
    );

    // A changed spec reaches the existing state: containerConcurrency 1 limits the endpoint.
    h.catalog.upsert(spec("r7", 1));
    wait_view(&h, &r7, |v| v["endpoints"][0]["limit"] == 1).await;
    assert_eq!(h.activator.revision_counts(), (100, 1));

    // A revision added on its own routes at once; one removed on its own answers its held
    // request 503; the others keep their states.
    h.catalog.upsert(spec("new", 0));
    let new = RevisionKey::new("default", "new");
    h.endpoints.set_ready(&new, vec![up.addr]);
    assert_eq!(send(&c, h.get(&new, "/")).await.0, 200);
    let r9 = RevisionKey::new("default", "r9");
    let (c2, req) = (c.clone(), h.get(&r9, "/"));
    let held = tokio::spawn(async move { send(&c2, req).await });
    h.wait_held(&r9, 1).await;
    assert_eq!(h.activator.revision_counts(), (101, 3));
    assert!(h.catalog.remove(&r9));
    assert_eq!(held.await.unwrap().0, 503);
    assert_eq!(send(&c, h.get(&r9, "/")).await.0, 404);
    assert_eq!(h.activator.revision_counts(), (100, 2));
    assert_eq!(send(&c, h.get(&r7, "/")).await.0, 200);
    h.shutdown();
}
