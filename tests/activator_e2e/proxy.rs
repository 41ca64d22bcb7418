//! Forwarding: routing errors, header limits, upstream failures, retries, h2c, websocket
//! upgrades, streaming, probes and terminating endpoints.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use thaw::config::ActivatorConfig;
use thaw::revision::{CatalogSnapshot, Protocol, RevisionKey};

use crate::harness::*;

fn rev(name: &str) -> RevisionKey {
    RevisionKey::new("default", name)
}

#[tokio::test]
async fn unknown_revision_and_unknown_host_get_404_with_a_reason() {
    let mut h = Harness::start(vec![spec("known", 0)], ActivatorConfig::default()).await;
    let c = client();
    let (status, _, body) = send(&c, h.get(&rev("nope"), "/")).await;
    assert_eq!(status, 404);
    assert!(
        body.starts_with("revision default/nope not found (request id "),
        "{body}"
    );
    let req = Request::get(format!("http://{}/", h.data))
        .header("host", "other.example.com")
        .body(Default::default())
        .unwrap();
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, 404);
    assert!(body.contains("other.example.com"), "{body}");
    h.shutdown();
}

#[tokio::test]
async fn routes_by_host_table() {
    let mut s = spec("hello-00001", 0);
    s.hosts = vec!["hello-00001.default.example.com".into()];
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![], ActivatorConfig::default()).await;
    h.catalog.store(CatalogSnapshot::new(
        [s],
        [("hello.default.example.com".to_string(), rev("hello-00001"))],
    ));
    h.endpoints.set_ready(&rev("hello-00001"), vec![up.addr]);
    for host in [
        "hello.default.example.com",
        "HELLO-00001.default.example.com:80",
    ] {
        let req = Request::get(format!("http://{}/", h.data))
            .header("host", host)
            .body(Default::default())
            .unwrap();
        let (status, _, body) = send(&client(), req).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    h.shutdown();
}

#[tokio::test]
async fn oversized_headers_get_431_with_a_reason() {
    let cfg = ActivatorConfig {
        max_header_count: 20,
        max_header_bytes: 1024,
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    let c = client();
    let mut req = h.get(&rev("r"), "/");
    for i in 0..30 {
        req.headers_mut().insert(
            http::HeaderName::try_from(format!("x-h{i}")).unwrap(),
            "v".parse().unwrap(),
        );
    }
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert!(body.contains("header count"), "{body}");
    let mut req = h.get(&rev("r"), "/");
    req.headers_mut()
        .insert("x-big", "a".repeat(2000).parse().unwrap());
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, 431);
    assert!(body.contains("header bytes"), "{body}");
    h.shutdown();
}

#[tokio::test]
async fn upstream_dying_mid_response_reaches_the_client_and_frees_the_slot() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("r", 1)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("r"), vec![up.addr]);
    let c = client();
    let resp = c.request(h.get(&rev("r"), "/die")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let err = resp.into_body().collect().await;
    assert!(err.is_err(), "the client must see the broken body");
    // cc = 1: a leaked slot would hold the next request forever.
    let next = tokio::time::timeout(Duration::from_secs(5), send(&c, h.get(&rev("r"), "/"))).await;
    assert_eq!(next.expect("slot was released").0, 200);
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(
            "thaw_activator_upstream_errors_total{namespace=\"default\",revision=\"r\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(h.revision(&rev("r")).await["inFlight"], 0);
    h.shutdown();
}

#[tokio::test]
async fn connect_refused_is_retried_on_another_endpoint() {
    // First-available (cc 1) tries endpoints in address order: the dead one (127.0.0.1) first.
    let dead = dead_addr("127.0.0.1").await;
    let up = Upstream::start_on("127.0.0.2:0").await;
    let mut h = Harness::start(vec![spec("r", 1)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("r"), vec![up.addr, dead]);
    let c = client();
    for _ in 0..3 {
        let (status, _, body) = send(&c, h.get(&rev("r"), "/")).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(up.served.load(SeqCst), 3);
    // Only the first request paid for the dead endpoint: the failed connect ejected it, and the
    // next two went straight to the live one.
    let metrics = h.metrics().await;
    for line in [
        "thaw_activator_retries_total{namespace=\"default\",revision=\"r\"} 1",
        "thaw_activator_endpoint_ejections_total{namespace=\"default\",revision=\"r\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let view = h.revision(&rev("r")).await;
    let ejected: Vec<(String, bool)> = view["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap().to_string(),
                e["ejected"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(ejected.contains(&(dead.to_string(), true)), "{view}");
    assert!(ejected.contains(&(up.addr.to_string(), false)), "{view}");
    // With only the (ejected) dead endpoint left it is still tried, not waited on: 502 with the
    // reason.
    h.endpoints.set_ready(&rev("r"), vec![dead]);
    h.wait_endpoints(&rev("r"), &[dead]).await;
    let (status, _, body) = send(&c, h.get(&rev("r"), "/")).await;
    assert_eq!(status, 502);
    assert!(
        body.contains("upstream failed") && !body.contains("127.0.0.1"),
        "{body}"
    );
    h.shutdown();
}

/// Every policy passes over an ejected endpoint; when a connect succeeds again (the endpoint
/// came back while it was the only one, so it was tried despite the ejection) it is no longer
/// ejected.
#[tokio::test]
async fn an_ejected_endpoint_is_passed_over_by_every_policy_and_cleared_by_a_connect() {
    for cc in [0, 1, 10] {
        let name = format!("p{cc}");
        let dead = dead_addr("127.0.0.1").await;
        let up = Upstream::start_on("127.0.0.2:0").await;
        let mut h = Harness::start(vec![spec(&name, cc)], ActivatorConfig::default()).await;
        h.endpoints.set_ready(&rev(&name), vec![up.addr, dead]);
        let c = client();
        for _ in 0..20 {
            let (status, _, body) = send(&c, h.get(&rev(&name), "/")).await;
            assert_eq!(status, 200, "cc {cc}: {body}");
        }
        let metrics = h.metrics().await;
        let retries =
            format!("thaw_activator_retries_total{{namespace=\"default\",revision=\"{name}\"}} 1");
        assert!(
            metrics.contains(&retries),
            "cc {cc}: {retries} in {metrics}"
        );
        h.shutdown();
    }
    // The dead address comes back to life: a listener on the same port.
    let dead = dead_addr("127.0.0.1").await;
    let mut h = Harness::start(vec![spec("back", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("back"), vec![dead]);
    let (status, _, _) = send(&client(), h.get(&rev("back"), "/")).await;
    assert_eq!(status, 502);
    assert_eq!(
        h.revision(&rev("back")).await["endpoints"][0]["ejected"],
        true
    );
    let up = Upstream::start_on(&dead.to_string()).await;
    assert_eq!(up.addr, dead);
    let (status, _, body) = send(&client(), h.get(&rev("back"), "/")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        h.revision(&rev("back")).await["endpoints"][0]["ejected"],
        false
    );
    h.shutdown();
}

/// cc 1, a dead endpoint first in address order and a live one: the dead one is ejected by the
/// first request. With the live one busy (a stream kept open), the next request waits rather
/// than trying the ejected endpoint; when that endpoint comes back and its ejection ends, the
/// held request is dispatched to it — without waiting for the live one's slot.
#[tokio::test]
async fn a_request_held_behind_a_full_live_endpoint_takes_the_ejected_one_when_it_comes_back() {
    let dead = dead_addr("127.0.0.1").await;
    let live = Upstream::start_on("127.0.0.2:0").await;
    let mut h = Harness::start(vec![spec("r", 1)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("r"), vec![live.addr, dead]);
    let c = client();
    let (status, _, body) = send(&c, h.get(&rev("r"), "/")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(h.revision(&rev("r")).await["endpoints"][0]["ejected"], true);
    // The live endpoint's one slot stays taken by an open stream.
    let chunks = live.next_stream();
    chunks.send(Ok(Bytes::from_static(b"open"))).await.unwrap();
    let stream = c.request(h.get(&rev("r"), "/stream")).await.unwrap();
    assert_eq!(stream.status(), 200);
    let (c2, req) = (c.clone(), h.get(&rev("r"), "/"));
    let held = tokio::spawn(async move { send(&c2, req).await });
    h.wait_held(&rev("r"), 1).await;
    // The dead address comes back; the ejection (1 s) ends and the held request goes there.
    let back = Upstream::start_on(&dead.to_string()).await;
    let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("dispatched when the ejection ended, not at the live slot's release")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(back.served.load(SeqCst), 1);
    drop(chunks);
    drop(stream);
    h.shutdown();
}

#[tokio::test]
async fn h2c_passes_through_both_ways() {
    let up = Upstream::start().await;
    let mut s = spec("grpc", 0);
    s.protocol = Protocol::H2c;
    let mut h = Harness::start(vec![s, spec("plain", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("grpc"), vec![up.addr]);
    h.endpoints.set_ready(&rev("plain"), vec![up.addr]);
    // h2c client -> activator -> h2c upstream.
    let (status, headers, _) = send(&h2_client(), h.get(&rev("grpc"), "/headers")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-version"], "HTTP/2.0");
    // HTTP/1 client -> h2c upstream, and h2c client -> HTTP/1 upstream.
    let (_, headers, _) = send(&client(), h.get(&rev("grpc"), "/headers")).await;
    assert_eq!(headers["x-version"], "HTTP/2.0");
    let (status, headers, body) = send(&h2_client(), h.get(&rev("plain"), "/headers")).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-version"], "HTTP/1.1");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        seen["k-original-host"],
        h.data.to_string(),
        "h2 :authority kept"
    );
    h.shutdown();
}

/// Sends a websocket upgrade for `name` and reads the response head (lower-cased).
async fn upgrade(h: &Harness, name: &str) -> (tokio::net::TcpStream, String) {
    let mut tcp = tokio::net::TcpStream::connect(h.data).await.unwrap();
    let head = format!(
        "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Knative-Serving-Namespace: default\r\nKnative-Serving-Revision: {name}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the response head");
        got.extend_from_slice(&buf[..n]);
    }
    (tcp, String::from_utf8_lossy(&got).to_lowercase())
}

#[tokio::test]
async fn websocket_upgrade_passes_through() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("ws", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("ws"), vec![up.addr]);
    let (mut tcp, text) = upgrade(&h, "ws").await;
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(text.contains("upgrade: websocket"), "{text}");
    tcp.write_all(b"ping over the tunnel").await.unwrap();
    let mut echo = vec![0u8; 20];
    tcp.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping over the tunnel");
    assert_eq!(
        h.revision(&rev("ws")).await["inFlight"],
        1,
        "the tunnel holds its slot"
    );
    drop(tcp);
    h.shutdown();
}

/// With an idle timeout (`idleTimeoutSeconds`) a tunnel that carries bytes stays open past it,
/// and one that carries nothing either way for that long is closed and gives its slot back.
/// The total timeout does not cut a tunnel.
#[tokio::test]
async fn an_idle_websocket_tunnel_is_closed_and_frees_its_slot() {
    let up = Upstream::start().await;
    let mut s = spec("ws", 0);
    s.timeouts.idle = Some(Duration::from_millis(300));
    s.timeouts.total = Duration::from_millis(500);
    let mut h = Harness::start(vec![s], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("ws"), vec![up.addr]);
    let (mut tcp, text) = upgrade(&h, "ws").await;
    assert!(text.starts_with("http/1.1 101"), "{text}");
    let mut buf = vec![0u8; 1024];
    // Busy for 1.5 s (three total timeouts, five idle ones): one echo every 100 ms.
    for _ in 0..15 {
        tcp.write_all(b"tick").await.unwrap();
        let mut echo = [0u8; 4];
        tcp.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"tick");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.revision(&rev("ws")).await["inFlight"], 1);
    // Then silent: closed within two idle periods (plus slack), and the slot is free.
    let closed = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the idle tunnel was closed: {closed:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.revision(&rev("ws")).await["inFlight"] != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was not freed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    h.shutdown();
}

#[tokio::test]
async fn streaming_response_chunks_are_flushed_as_they_come() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("s", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("s"), vec![up.addr]);
    let chunks = up.next_stream();
    chunks.send(Ok(Bytes::from_static(b"first"))).await.unwrap();
    let resp = client().request(h.get(&rev("s"), "/stream")).await.unwrap();
    let mut body = resp.into_body();
    // The first chunk arrives while the upstream still holds the rest back.
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame()).await;
    let first = frame.expect("first chunk flushed").unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    chunks
        .send(Ok(Bytes::from_static(b"second")))
        .await
        .unwrap();
    let second = body.frame().await.unwrap().unwrap();
    assert_eq!(second.into_data().unwrap(), "second");
    drop(chunks);
    assert!(body.frame().await.is_none());
    h.shutdown();
}

#[tokio::test]
async fn request_body_streams_to_the_upstream() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("e", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("e"), vec![up.addr]);
    let payload = "x".repeat(256 * 1024);
    let mut req = h.get(&rev("e"), "/echo");
    *req.method_mut() = http::Method::POST;
    *req.body_mut() = http_body_util::Full::new(Bytes::from(payload.clone()))
        .map_err(|n| match n {})
        .boxed();
    let (status, _, body) = send(&client(), req).await;
    assert_eq!(status, 200);
    assert_eq!(body.len(), payload.len());
    h.shutdown();
}

#[tokio::test]
async fn probes_are_answered_by_the_activator() {
    let mut h = Harness::start(vec![], ActivatorConfig::default()).await;
    let c = client();
    let probe = |k: &str, v: &str| {
        Request::get(format!("http://{}/", h.data))
            .header(k, v)
            .body(Default::default())
            .unwrap()
    };
    let (status, _, body) = send(&c, probe("k-network-probe", "activator")).await;
    assert_eq!((status.as_u16(), body.as_str()), (200, "activator"));
    let (status, _, _) = send(&c, probe("user-agent", "kube-probe/1.30")).await;
    assert_eq!(status, 200);
    let (status, _, _) = send(&c, probe("k-network-probe", "probe")).await;
    assert_eq!(status, 400, "hash missing");
    let (status, _) = admin_get(h.admin, "/healthz").await;
    assert_eq!(status, 200);
    // OpenMetrics when asked for, the classic text format otherwise.
    for (accept, want) in [
        (
            Some("application/openmetrics-text"),
            "application/openmetrics-text",
        ),
        (None, "text/plain; version=0.0.4"),
    ] {
        let mut req = Request::get(format!("http://{}/metrics", h.admin));
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let resp = client()
            .request(req.body(Default::default()).unwrap())
            .await
            .unwrap();
        let ct = resp.headers()["content-type"].to_str().unwrap();
        assert!(ct.starts_with(want), "{accept:?}: {ct}");
    }
    h.shutdown();
}

#[tokio::test]
async fn terminating_endpoint_gets_no_new_requests_and_is_reported_drained() {
    let a = Upstream::start().await;
    let b = Upstream::start().await;
    let mut h = Harness::start(vec![spec("t", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev("t"), vec![a.addr, b.addr]);
    let c = client();
    let chunks = a.next_stream();
    // Keep one request in flight on `a` (the stream), whichever endpoint it lands on first.
    let mut inflight = None;
    for _ in 0..20 {
        let resp = c.request(h.get(&rev("t"), "/stream")).await.unwrap();
        if a.served.load(SeqCst) == 1 {
            inflight = Some(resp);
            break;
        }
    }
    let inflight = inflight.expect("a request landed on endpoint a");
    h.endpoints.set(
        &rev("t"),
        thaw::platform::EndpointSnapshot {
            limit: None,
            ready: vec![b.addr],
            terminating: vec![a.addr],
            ..Default::default()
        },
    );
    h.wait_endpoints(&rev("t"), &[b.addr]).await;
    let before = a.served.load(SeqCst);
    for _ in 0..10 {
        assert_eq!(send(&c, h.get(&rev("t"), "/")).await.0, 200);
    }
    assert_eq!(
        a.served.load(SeqCst),
        before,
        "terminating endpoint got nothing new"
    );
    assert!(h.endpoints.drained_calls().is_empty());
    drop(chunks);
    let _ = inflight.into_body().collect().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.endpoints.drained_calls().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "drained never reported"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(h.endpoints.drained_calls(), vec![(rev("t"), a.addr)]);
    h.shutdown();
}

/// Forwarding to the container itself (`thaw local`, no queue sidecar): the container sees the
/// client's `Host`, as it would behind Knative's queue-proxy, and no sidecar header — on the
/// direct path (bodiless), through hyper's client (a body) and over h2c (`:authority`).
#[tokio::test]
async fn the_container_gets_the_clients_host_and_no_sidecar_headers() {
    let up = Upstream::start().await;
    let mut g = spec("grpc", 0);
    g.protocol = Protocol::H2c;
    // The requests route by Knative's headers, which thaw local believes only from peers it is
    // told to trust (the data-port review).
    let cfg = ActivatorConfig {
        trusted_proxies: thaw::config::TrustedProxies::Every,
        ..Default::default()
    };
    let mut h = Harness::start_to_containers(vec![spec("c", 0), g], cfg).await;
    h.endpoints.set_ready(&rev("c"), vec![up.addr]);
    h.endpoints.set_ready(&rev("grpc"), vec![up.addr]);
    let mut post = h.get(&rev("c"), "/headers");
    *post.method_mut() = http::Method::POST;
    *post.body_mut() = full("a body");
    let requests = [
        ("direct", client(), h.get(&rev("c"), "/headers")),
        ("hyper", client(), post),
        ("h2c", client(), h.get(&rev("grpc"), "/headers")),
    ];
    for (path, c, mut req) in requests {
        req.headers_mut()
            .insert("host", "hello.default.example.com".parse().unwrap());
        req.headers_mut()
            .insert("k-original-host", "spoofed".parse().unwrap());
        let (status, _, body) = send(&c, req).await;
        assert_eq!(status, 200, "{path}: {body}");
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
        let host = if path == "h2c" {
            // h2 has no Host field; the upstream server reads the authority from the URI.
            assert_eq!(
                seen["x-authority"], "hello.default.example.com",
                "{path}: {seen}"
            );
            &seen["x-authority"]
        } else {
            &seen["host"]
        };
        assert_eq!(host, "hello.default.example.com", "{path}: {seen}");
        assert!(seen.get("k-original-host").is_none(), "{path}: {seen}");
        assert!(seen.get("k-proxy-request").is_none(), "{path}: {seen}");
        assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "{path}: {seen}");
        assert!(seen.get("x-request-id").is_some(), "{path}: {seen}");
    }
    h.shutdown();
}

/// With the tag key's tagger, what the activator forwards to a sidecar carries each
/// revision's own tag (over its namespace, name and UID) in `K-Proxy-Request` (a client's own
/// value replaced), on the direct and the hyper path alike.
#[tokio::test]
async fn forwarded_requests_carry_the_revisions_proxy_tag() {
    use thaw::knative::proxy_tag::{Tagger, tag};
    let key = b"the-proxy-tag-key-0123456789abcdef";
    let up = Upstream::start().await;
    let with_uid = |name: &str| {
        let mut s = spec(name, 0);
        s.uid = Some(format!("uid-of-{name}").into());
        s
    };
    let mut h = Harness::start(
        vec![with_uid("tagged-a"), with_uid("tagged-b")],
        ActivatorConfig::default(),
    )
    .await;
    h.activator
        .use_proxy_tags(std::sync::Arc::new(Tagger::fixed(key)));
    let c = client();
    for name in ["tagged-a", "tagged-b"] {
        h.endpoints.set_ready(&rev(name), vec![up.addr]);
        for method in ["GET", "POST"] {
            let mut req = h.get(&rev(name), "/headers");
            *req.method_mut() = method.parse().unwrap();
            req.headers_mut()
                .insert("k-proxy-request", "forged".parse().unwrap());
            let (status, _, body) = send(&c, req).await;
            assert_eq!(status, 200, "{name} {method}: {body}");
            let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(
                seen["k-proxy-request"],
                tag(key, "default", name, &format!("uid-of-{name}")).as_str(),
                "{name} {method}: {seen}"
            );
        }
    }
    h.shutdown();
}
