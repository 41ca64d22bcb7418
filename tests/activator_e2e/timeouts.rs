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
    assert_eq!(h.revision(&rev).await["inFlight"], 0);
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

/// A request admitted at once starts its response-start clock when it arrives; a held one
/// starts it when it is forwarded. Both kinds of hold are covered: the first request of a
/// connection (held before the head is read) and a later request on a kept-alive connection.
#[tokio::test]
async fn a_held_request_gets_its_whole_response_start_timeout_once_forwarded() {
    let warm = RevisionKey::new("default", "warm");
    let cold = RevisionKey::new("default", "cold");
    let mut s = spec("cold", 0);
    s.timeouts.response_start = Duration::from_millis(400);
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("warm", 0), s], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&warm, vec![up.addr]);
    // One client: its second request goes on the connection the first one left idle.
    let kept = client();
    let (status, _, _) = send(&kept, h.get(&warm, "/")).await;
    assert_eq!(status, 200);
    let req = h.get(&cold, "/slow?ms=150");
    let later = tokio::spawn(async move { send(&kept, req).await });
    let req = h.get(&cold, "/slow?ms=150");
    let first = tokio::spawn(async move { send(&client(), req).await });
    // Held for longer than the response-start timeout, then answered within it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !later.is_finished() && !first.is_finished(),
        "held while cold"
    );
    h.endpoints.set_ready(&cold, vec![up.addr]);
    for (what, task) in [("kept-alive", later), ("first on its connection", first)] {
        let (status, _, body) = task.await.unwrap();
        assert_eq!(status, 200, "{what}: {body}");
    }
    h.shutdown();
}
