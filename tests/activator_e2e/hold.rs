//! Holding: cold start, the 1,000-request wake-up, overflow, hold timeout, failing and removed
//! revisions, and the stats a cold request produces.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use thaw::autoscaler::scaler::{ScaleState, ScaleStates};
use thaw::config::ActivatorConfig;
use thaw::revision::{CatalogSnapshot, RevisionKey};
use thaw::stats::StatMessage;

use crate::harness::*;

#[tokio::test]
async fn cold_request_is_held_poked_and_answered_once_an_endpoint_appears() {
    let rev = RevisionKey::new("default", "cold");
    let mut h = Harness::start(vec![spec("cold", 0)], ActivatorConfig::default()).await;
    let up = Upstream::start().await;
    let c = client();
    let req = h.get(&rev, "/headers");
    let pending = tokio::spawn(async move { send(&c, req).await });
    h.wait_held(&rev, 1).await;
    assert_eq!(h.revision(&rev).await["state"], "activating");
    // The poke arrived at once, carrying the held request as concurrency.
    match h.stats.recv().await.unwrap() {
        StatMessage::Poke(s) => {
            assert_eq!(s.revision, rev);
            assert!(s.average_concurrency >= 1.0);
            assert_eq!(&*s.source, "activator-test");
        }
        other => panic!("expected a poke first, got {other:?}"),
    }
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let (status, headers, body) = pending.await.unwrap();
    assert_eq!(status, 200);
    let timing = headers["server-timing"].to_str().unwrap();
    assert!(timing.starts_with("cold-start;dur="), "{timing}");
    assert!(headers.contains_key("x-request-id"));
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["k-proxy-request"], "activator");
    assert_eq!(seen["k-original-host"], h.data.to_string());
    assert_eq!(seen["host"], up.addr.to_string());
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        seen["x-request-id"],
        headers["x-request-id"].to_str().unwrap()
    );
    assert!(seen.get("knative-serving-revision").is_none());
    // The 1 s reports include this revision (held concurrency counted).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let msg = tokio::time::timeout_at(deadline, h.stats.recv())
            .await
            .unwrap()
            .unwrap();
        if let StatMessage::Record(s) = msg {
            assert_eq!(s.revision, rev);
            if s.requests > 0 {
                assert!(s.average_concurrency > 0.0);
                break;
            }
        }
    }
    let metrics = h.metrics().await;
    for needle in [
        "thaw_activator_requests_total{namespace=\"default\",service=\"\",configuration=\"\",revision=\"cold\",code=\"200\",response_code_class=\"2xx\"} 1",
        "thaw_activator_hold_seconds_count{namespace=\"default\",revision=\"cold\"} 1",
        "thaw_activator_cold_start_phase_seconds_count{namespace=\"default\",revision=\"cold\",phase=\"poke_to_ready\"} 1",
        "thaw_activator_cold_start_phase_seconds_count{namespace=\"default\",revision=\"cold\",phase=\"ready_to_first_byte\"} 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    h.shutdown();
}

/// 1,000 concurrent requests on a cold revision (containerConcurrency 2, four endpoints): all
/// complete with 200 once the endpoints appear, and no endpoint ever sees more than 2 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_held_requests_complete_within_container_concurrency() {
    let rev = RevisionKey::new("default", "burst");
    let mut h = Harness::start(vec![spec("burst", 2)], ActivatorConfig::default()).await;
    let ups = [
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    ];
    let c = client();
    let mut tasks = Vec::new();
    for _ in 0..1000 {
        let (c, req) = (c.clone(), h.get(&rev, "/slow?ms=2"));
        tasks.push(tokio::spawn(async move { send(&c, req).await.0 }));
    }
    h.wait_held(&rev, 1000).await;
    h.endpoints
        .set_ready(&rev, ups.iter().map(|u| u.addr).collect());
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let served: u32 = ups.iter().map(|u| u.served.load(SeqCst)).sum();
    assert_eq!(served, 1000, "none lost, none duplicated");
    for u in &ups {
        assert!(u.peak.load(SeqCst) <= 2, "peak {}", u.peak.load(SeqCst));
    }
    let r = h.revision(&rev).await;
    assert_eq!(
        (r["held"].as_u64(), r["inFlight"].as_u64()),
        (Some(0), Some(0))
    );
    h.shutdown();
}

#[tokio::test]
async fn overflow_answers_503_with_retry_after() {
    let rev = RevisionKey::new("default", "small");
    let mut s = spec("small", 1);
    s.queue_depth = 2;
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    let c = client();
    let mut held = Vec::new();
    for _ in 0..2 {
        let (c, req) = (c.clone(), h.get(&rev, "/"));
        held.push(tokio::spawn(async move { send(&c, req).await.0 }));
    }
    h.wait_held(&rev, 2).await;
    let (status, headers, body) = send(&c, h.get(&rev, "/")).await;
    assert_eq!(status, 503);
    assert_eq!(headers["retry-after"], "1");
    assert!(body.contains("queue is full"), "{body}");
    let metrics = h.metrics().await;
    assert!(
        metrics
            .contains("thaw_activator_overflow_total{namespace=\"default\",revision=\"small\"} 1"),
        "{metrics}"
    );
    let up = Upstream::start().await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    for t in held {
        assert_eq!(t.await.unwrap(), 200);
    }
    h.shutdown();
}

/// On tokio's paused clock the runtime jumps to the next timer whenever it is idle, so the
/// 5-minute cold-wait passes without waiting.
#[tokio::test(start_paused = true)]
async fn hold_timeout_answers_504() {
    let rev = RevisionKey::new("default", "never");
    let mut s = spec("never", 0);
    s.timeouts.cold_wait = Duration::from_secs(300);
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    let (status, _, body) = send(&client(), h.get(&rev, "/")).await;
    assert_eq!(status, 504);
    assert!(body.contains("did not become ready"), "{body}");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            "thaw_activator_hold_timeouts_total{namespace=\"default\",revision=\"never\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(h.revision(&rev).await["held"], 0);
    h.shutdown();
}

#[tokio::test]
async fn failing_revision_answers_held_and_new_requests_503_with_reason() {
    let rev = RevisionKey::new("default", "crashy");
    let mut h = Harness::start(vec![spec("crashy", 0)], ActivatorConfig::default()).await;
    let c = client();
    let (c2, req) = (c.clone(), h.get(&rev, "/"));
    let held = tokio::spawn(async move { send(&c2, req).await });
    h.wait_held(&rev, 1).await;
    h.endpoints
        .set_failing(&rev, "container exited with code 3");
    let (status, headers, body) = held.await.unwrap();
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
    // The platform's reason is state for operators, not for clients (SECURITY.md: client error bodies are generic).
    assert!(body.contains("is unavailable"), "{body}");
    assert!(!body.contains("exited with code 3"), "{body}");
    let (status, _, body) = send(&c, h.get(&rev, "/")).await;
    assert_eq!(status, 503);
    assert!(body.contains("is unavailable"), "{body}");
    let view = h.revision(&rev).await;
    assert_eq!(view["state"], "failing");
    assert_eq!(view["reason"], "container exited with code 3");
    h.shutdown();
}

#[tokio::test]
async fn removed_revision_answers_held_requests_503_then_404() {
    let rev = RevisionKey::new("default", "gone");
    let mut h = Harness::start(vec![spec("gone", 0)], ActivatorConfig::default()).await;
    let c = client();
    let (c2, req) = (c.clone(), h.get(&rev, "/"));
    let held = tokio::spawn(async move { send(&c2, req).await });
    h.wait_held(&rev, 1).await;
    h.catalog.store(CatalogSnapshot::default());
    let (status, _, body) = held.await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains("is unavailable"), "{body}");
    let (status, _, _) = send(&c, h.get(&rev, "/")).await;
    assert_eq!(status, 404);
    h.shutdown();
}

#[tokio::test]
async fn client_giving_up_leaves_the_queue() {
    let rev = RevisionKey::new("default", "quitter");
    let mut h = Harness::start(vec![spec("quitter", 0)], ActivatorConfig::default()).await;
    let c = client();
    let req = h.get(&rev, "/");
    let pending = tokio::spawn(async move { c.request(req).await });
    h.wait_held(&rev, 1).await;
    pending.abort(); // drops the client connection
    h.wait_held(&rev, 0).await;
    assert_eq!(h.activator.held_requests(), 0, "global budget returned");
    h.shutdown();
}

/// With the scaler's states visible, a cold start records all four phases and `/revisions`
/// shows the decision.
#[tokio::test]
async fn cold_start_phases_include_the_scaler_decision() {
    let rev = RevisionKey::new("default", "phased");
    let states = ScaleStates::new();
    let mut h = Harness::start_with(
        vec![spec("phased", 0)],
        ActivatorConfig::default(),
        Some(states.clone()),
    )
    .await;
    assert_eq!(h.revision(&rev).await["desired"], serde_json::Value::Null);
    let c = client();
    let req = h.get(&rev, "/");
    let pending = tokio::spawn(async move { send(&c, req).await });
    h.wait_held(&rev, 1).await;
    assert!(matches!(h.stats.recv().await, Some(StatMessage::Poke(_))));
    states.publish(
        &rev,
        ScaleState {
            desired: 1,
            decided_at: Some(tokio::time::Instant::now()),
            activator_in_path: true,
            initialized: false,
            activity: None,
        },
    );
    let up = Upstream::start().await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    assert_eq!(pending.await.unwrap().0, 200);
    assert_eq!(h.revision(&rev).await["desired"], 1);
    let metrics = h.metrics().await;
    for phase in [
        "poke_to_decision",
        "decision_to_ready",
        "poke_to_ready",
        "ready_to_first_byte",
    ] {
        let line = format!(
            "thaw_activator_cold_start_phase_seconds_count{{namespace=\"{}\",revision=\"{}\",phase=\"{phase}\"}} 1",
            rev.namespace, rev.name
        );
        assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    }
    h.shutdown();
}

/// containerConcurrency 0: a pod that appears while 60 requests are held gets its initial burst
/// (5) and then one more per finished request, never the whole backlog at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cc0_waking_pod_gets_the_initial_burst_not_the_backlog() {
    let rev = RevisionKey::new("default", "burst0");
    let mut s = spec("burst0", 0);
    s.initial_burst = 5;
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    let up = Upstream::start().await;
    let c = client();
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let (c, req) = (c.clone(), h.get(&rev, "/slow?ms=5"));
        tasks.push(tokio::spawn(async move { send(&c, req).await.0 }));
    }
    h.wait_held(&rev, 60).await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(up.served.load(SeqCst), 60);
    assert!(up.peak.load(SeqCst) <= 5, "peak {}", up.peak.load(SeqCst));
    // The backlog is gone, so the warm-up limit is lifted.
    let r = h.revision(&rev).await;
    assert_eq!(r["endpoints"][0]["limit"], serde_json::Value::Null, "{r}");
    h.shutdown();
}
