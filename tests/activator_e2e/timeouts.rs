//! Per-revision timeouts after admission: response start and idle between body chunks.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

#[tokio::test]
async fn response_start_timeout_answers_504() {
    let rev = RevisionKey::new("default", "sluggish");
    let mut s = spec("sluggish", 0);
    s.timeouts.response_start = Duration::from_millis(200);
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let (status, _, body) = send(&client(), h.get(&rev, "/slow?ms=30000")).await;
    assert_eq!(status, 504);
    assert!(body.contains("sent no response"), "{body}");
    assert_eq!(h.revision(&rev).await["in_flight"], 0);
    h.shutdown();
}

#[tokio::test]
async fn idle_timeout_cuts_a_silent_stream() {
    let rev = RevisionKey::new("default", "quiet");
    let mut s = spec("quiet", 0);
    s.timeouts.idle = Some(Duration::from_millis(200));
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let chunks = up.next_stream();
    chunks.send(Ok(Bytes::from_static(b"hello"))).await.unwrap();
    let resp = client().request(h.get(&rev, "/stream")).await.unwrap();
    assert_eq!(resp.status(), 200);
    // The upstream keeps the stream open but silent: the activator cuts it.
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await;
    assert!(body.expect("cut before the deadline").is_err());
    drop(chunks);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            "thaw_activator_upstream_errors_total{namespace=\"default\",revision=\"quiet\"} 1"
        ),
        "{metrics}"
    );
    h.shutdown();
}
