//! The activator's metrics for operators: every family listed from start, the per-revision latency
//! histogram (Knative's activator_request_latencies), one counter for unmatched requests, and
//! a removed revision's series gone.

use thaw::config::ActivatorConfig;
use thaw::revision::{CatalogSnapshot, RevisionKey};

use crate::harness::*;

#[tokio::test]
async fn families_are_listed_from_start_and_series_follow_their_revision() {
    let up = Upstream::start().await;
    let mut r = spec("r", 0);
    r.service = Some("hello".into());
    let mut h = Harness::start(vec![r], ActivatorConfig::default()).await;
    let rev = RevisionKey::new("default", "r");
    h.endpoints.set_ready(&rev, vec![up.addr]);

    // Before any request: HELP and TYPE of the per-revision families are there.
    let before = h.metrics().await;
    for family in [
        "thaw_activator_requests",
        "thaw_activator_request_latencies_seconds",
        "thaw_activator_cold_start_phase_seconds",
        "thaw_activator_unmatched_requests",
        "thaw_activator_hold_seconds",
        "thaw_activator_upstream_errors",
    ] {
        assert!(
            before.contains(&format!("# TYPE {family}")),
            "{family}:\n{before}"
        );
    }

    let c = client();
    assert_eq!(send(&c, h.get(&rev, "/")).await.0, 200);
    assert_eq!(
        send(&c, h.get(&RevisionKey::new("default", "nope"), "/"))
            .await
            .0,
        404
    );
    let after = h.metrics().await;
    let latency = "thaw_activator_request_latencies_seconds_count{namespace=\"default\",\
service=\"hello\",configuration=\"hello\",revision=\"r\",code=\"200\",response_code_class=\"2xx\"} 1";
    assert!(after.contains(latency), "{latency}:\n{after}");
    let unmatched = "thaw_activator_unmatched_requests_total{reason=\"not_found\"} 1";
    assert!(after.contains(unmatched), "{unmatched}:\n{after}");
    assert!(
        !after.contains("revision=\"\""),
        "no series with empty labels:\n{after}"
    );

    // The revision is removed: its series go with it.
    h.catalog.store(CatalogSnapshot::default());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = h.metrics().await;
        if !now.contains("revision=\"r\"") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "series stayed:\n{now}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    h.shutdown();
}

/// A route host split 50/50 between two revisions sends each about half of the requests
/// (traffic percent splits work locally; 400 requests, each side within 120..280,
/// which a fair split misses with a probability below 1e-12).
#[tokio::test]
async fn a_percent_split_shares_requests_between_revisions() {
    use std::sync::atomic::Ordering::SeqCst;
    let (ua, ub) = (Upstream::start().await, Upstream::start().await);
    let (a, b) = (spec("a", 0), spec("b", 0));
    let host = "split.default.example.com".to_string();
    let mut h = Harness::start(vec![], ActivatorConfig::default()).await;
    h.catalog.store(
        CatalogSnapshot::new([a, b], [(host.clone(), RevisionKey::new("default", "a"))])
            .with_splits([(
                host.clone(),
                vec![
                    (RevisionKey::new("default", "a"), 50),
                    (RevisionKey::new("default", "b"), 50),
                ],
            )]),
    );
    h.endpoints
        .set_ready(&RevisionKey::new("default", "a"), vec![ua.addr]);
    h.endpoints
        .set_ready(&RevisionKey::new("default", "b"), vec![ub.addr]);
    let c = client();
    for _ in 0..400 {
        let req = http::Request::get(format!("http://{}/", h.data))
            .header("host", &host)
            .body(full(""))
            .unwrap();
        assert_eq!(send(&c, req).await.0, 200);
    }
    let (na, nb) = (ua.served.load(SeqCst), ub.served.load(SeqCst));
    assert_eq!(na + nb, 400);
    assert!(
        (120..=280).contains(&na) && (120..=280).contains(&nb),
        "{na} / {nb}"
    );
    h.shutdown();
}
