//! `thaw queue` end to end: the real binary as the sidecar, `thaw sample-app` (or an in-process
//! echo server) as the user container, real sockets. Real clock; every wait polls with a
//! deadline, and no speed is asserted.

mod queue_support;

use queue_support::*;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::sys::signal::Signal;
use tokio::time::Instant;

/// The key the tests' revision tags are computed with (the tag key's place).
const TAG_KEY: &[u8] = b"test-proxy-tag-key-0123456789";
/// The UID of the tests' revision.
const UID: &str = "5d0c1f4e-0000-4000-8000-000000000001";

/// The proxy tag of the tests' revision (`default/hello-00001`), as the controller puts it in
/// `THAW_PROXY_TAG` and the activator in `K-Proxy-Request`.
fn revision_tag() -> String {
    thaw::knative::proxy_tag::tag(TAG_KEY, "default", "hello-00001", UID)
}

/// The sample app's own count: (in flight now, peak).
async fn app_inflight(port: u16) -> (u64, u64) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let (_, _, body) = send(&client, addr, "GET", "/inflight", &[], "").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (v["inFlight"].as_u64().unwrap(), v["peak"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_concurrency_1_admits_one_request_at_a_time() {
    let port = free_port();
    let _app = app(port, &["--response-delay", "20ms"]).await;
    let q = Queue::start(
        port,
        &[("CONTAINER_CONCURRENCY", "1"), ("THAW_QUEUE_DEPTH", "100")],
    );
    q.admin_until("/readyz", 200).await;
    let q = Arc::new(q);
    let clients: Vec<_> = (0..50)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.get("/", &[]).await })
        })
        .collect();
    for c in clients {
        let (status, body) = c.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "Hello from thaw!\n"));
    }
    let (now, peak) = app_inflight(port).await;
    assert_eq!(
        (now, peak),
        (0, 1),
        "the app saw more than one request at once"
    );
    let (_, text) = q.admin("/metrics").await;
    assert!(
        text.contains("response_code_class=\"2xx\"} 50"),
        "50 answers counted:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflow_beyond_the_queue_answers_503_with_a_reason() {
    let port = free_port();
    let _app = app(port, &["--response-delay", "1s"]).await;
    let q = Queue::start(
        port,
        &[("CONTAINER_CONCURRENCY", "1"), ("THAW_QUEUE_DEPTH", "2")],
    );
    q.admin_until("/readyz", 200).await;
    let q = Arc::new(q);
    let clients: Vec<_> = (0..10)
        .map(|_| {
            let q = q.clone();
            tokio::spawn(async move { q.send("GET", "/", &[], "").await })
        })
        .collect();
    let (mut ok, mut full) = (0, 0);
    for c in clients {
        let (status, headers, body) = c.await.unwrap();
        match status {
            200 => ok += 1,
            503 => {
                full += 1;
                assert_eq!(body, "overloaded: the request queue is full\n");
                assert_eq!(headers.get("retry-after").map(String::as_str), Some("1"));
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    // One in the app and two queued at once; a late arrival may find a place freed.
    assert!(ok >= 3 && full >= 1, "{ok} answered, {full} refused");
    assert_eq!(q.metric("thaw_queue_overflow_total").await, f64::from(full));
    assert_eq!(app_inflight(port).await.1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_stats_each_second_have_the_averages_and_proxied_shares() {
    let port = free_port();
    let _app = app(port, &["--threads", "2"]).await;
    let tag = revision_tag();
    let q = Arc::new(Queue::start(port, &[("THAW_PROXY_TAG", &tag)]));
    q.admin_until("/readyz", 200).await;
    let tag: &'static str = tag.leak();
    // Play the autoscaler: pull /stats five times a second (so no second is missed), keeping
    // each distinct second once.
    let puller = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut seen: Vec<serde_json::Value> = Vec::new();
            let end = Instant::now() + Duration::from_secs(7);
            while Instant::now() < end {
                let (status, body) = q.admin("/stats").await;
                assert_eq!(status, 200, "{body}");
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                if seen.last() != Some(&v) {
                    seen.push(v);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            seen
        })
    };
    // Four requests in flight for 4 s, two of them through an activator (tagged), one that
    // says so without the tag (direct).
    let long: Vec<_> = (0..4)
        .map(|i| {
            let q = q.clone();
            tokio::spawn(async move {
                let proxied = [("k-proxy-request", tag)];
                let forged = [("k-proxy-request", "activator")];
                let h: &[(&str, &str)] = match i {
                    0 | 2 => &proxied,
                    1 => &forged,
                    _ => &[],
                };
                q.get("/stream?chunks=2&delay=4s", h).await
            })
        })
        .collect();
    // And a burst of ten quick ones, three through an activator, two forged (another
    // revision's tag, and the tag's first half).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other: &'static str =
        thaw::knative::proxy_tag::tag(TAG_KEY, "default", "other", UID).leak();
    let quick: Vec<_> = (0..10)
        .map(|i| {
            let q = q.clone();
            tokio::spawn(async move {
                let proxied = [("k-proxy-request", tag)];
                let (other, half) = (
                    [("k-proxy-request", other)],
                    [("k-proxy-request", &tag[..32])],
                );
                let h: &[(&str, &str)] = match i {
                    0..3 => &proxied,
                    3 => &other,
                    4 => &half,
                    _ => &[],
                };
                q.get("/healthz", h).await
            })
        })
        .collect();
    for t in long.into_iter().chain(quick) {
        assert_eq!(t.await.unwrap().0, 200);
    }
    let seen = puller.await.unwrap();
    let sum = |k: &str| seen.iter().map(|v| v[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("requests"), 14, "{seen:#?}");
    assert_eq!(sum("proxiedRequests"), 5, "{seen:#?}");
    assert_eq!(
        q.metric("thaw_queue_untagged_proxy_requests_total").await,
        3.0
    );
    assert!(seen.iter().all(|v| v["pod"] == "hello-00001-pod"));
    // A second wholly inside the long requests: 4 on average, 2 of them proxied.
    let full = seen.iter().find(|v| {
        (v["averageConcurrency"].as_f64().unwrap() - 4.0).abs() < 0.01
            && (v["proxiedConcurrency"].as_f64().unwrap() - 2.0).abs() < 0.01
    });
    assert!(full.is_some(), "no second at 4 (2 proxied): {seen:#?}");
    // The gauges follow the last second (the load is gone by now).
    assert_eq!(q.metric("queue_average_concurrent_requests").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_with_the_apps_exit_gated_on_wait_for_drain() {
    let port = free_port();
    let app = app(port, &["--response-delay", "2s", "--threads", "2"]).await;
    let mut q = Queue::start(port, &[("THAW_DRAIN_DELAY", "1s")]);
    q.admin_until("/readyz", 200).await;
    let data = q.data;
    let client = q.client.clone();
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { send(&client, data, "GET", "/", &[], "").await })
        })
        .collect();
    let deadline = Instant::now() + DEADLINE;
    while app_inflight(port).await.0 < 20 {
        assert!(
            Instant::now() < deadline,
            "the 20 requests never reached the app"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The kubelet: SIGTERM to the sidecar, and at the same moment the app's preStop hook
    // (GET /wait-for-drain), after which the app is killed at once (most apps exit at once:
    // SIGKILL makes that certain).
    q.proc.signal(Signal::SIGTERM);
    let admin = q.admin;
    let pre_stop = {
        let client = client.clone();
        tokio::spawn(async move { send(&client, admin, "GET", "/wait-for-drain", &[], "").await })
    };
    // Readiness fails at once; new requests are still served during the drain delay.
    q.admin_until("/readyz", 503).await;
    let (status, body) = q.get("/", &[("k-network-probe", "queue")]).await;
    assert_eq!((status, body.as_str()), (503, "shutting down\n"));
    let late = q.get("/", &[]).await;
    assert_eq!(late.0, 200, "a request during the drain delay: {}", late.1);
    let (status, _, body) = pre_stop.await.unwrap();
    assert_eq!((status, body.as_str()), (200, "drained\n"));
    app.signal(Signal::SIGKILL);
    for r in requests {
        let (status, _, body) = r.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "Hello from thaw!\n"));
    }
    assert_eq!(q.proc.wait_exit().await, 0, "{}", q.proc.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dying_user_container_gives_502_and_fails_readiness_until_back() {
    let port = free_port();
    let mut app1 = app(port, &["--response-delay", "3s"]).await;
    let q = Arc::new(Queue::start(port, &[]));
    q.admin_until("/readyz", 200).await;
    let inflight = {
        let q = q.clone();
        tokio::spawn(async move { q.get("/", &[]).await })
    };
    let deadline = Instant::now() + DEADLINE;
    while app_inflight(port).await.0 < 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    app1.signal(Signal::SIGKILL);
    app1.wait_exit().await;
    let (status, body) = inflight.await.unwrap();
    assert_eq!(status, 502);
    assert_eq!(
        body, "the application did not answer\n",
        "generic, no internals"
    );
    q.admin_until("/readyz", 503).await;
    let (status, body) = q.get("/", &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (502, "the application did not answer\n")
    );
    let (status, _) = q.get("/", &[("k-network-probe", "queue")]).await;
    assert_eq!(status, 503, "the network probe fails with the container");
    let _app2 = app(port, &[]).await;
    q.admin_until("/readyz", 200).await;
    assert_eq!(
        q.get("/", &[]).await,
        (200, "Hello from thaw!\n".to_string())
    );
    assert!(q.metric("thaw_queue_user_errors_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_as_knatives_queue_proxy_answers_them() {
    let port = free_port();
    // No user container yet: not ready, and every probe says so.
    let q = Queue::start(
        port,
        &[(
            "SERVING_READINESS_PROBE",
            r#"{"httpGet":{"path":"/healthz","port":0}}"#,
        )],
    );
    assert_eq!(q.admin("/readyz").await.0, 503);
    assert_eq!(q.admin("/healthz").await, (200, "ok\n".into()));
    assert_eq!(q.get("/", &[("k-network-probe", "queue")]).await.0, 503);
    assert_eq!(q.get("/", &[("k-kubelet-probe", "1")]).await.0, 503);
    let _app = app(port, &[]).await;
    q.admin_until("/readyz", 200).await;
    let probe = q.get("/healthz", &[("k-network-probe", "queue")]).await;
    assert_eq!(probe, (200, "queue".into()));
    // The ingress prober's probe (as the activator answers it): the hash echoed, 200, empty;
    // without a hash, 400. Not the user container's to answer.
    let (status, headers, body) = q
        .send(
            "GET",
            "/healthz",
            &[("k-network-probe", "probe"), ("k-network-hash", "abc123")],
            "",
        )
        .await;
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(
        headers.get("k-network-hash").map(String::as_str),
        Some("abc123")
    );
    let (status, body) = q.get("/healthz", &[("k-network-probe", "probe")]).await;
    assert_eq!(
        (status, body.as_str()),
        (400, "K-Network-Hash header is missing\n")
    );
    // A probe meant for an activator is not answered as if this were one.
    let (status, body) = q.get("/healthz", &[("k-network-probe", "activator")]).await;
    assert_eq!(
        (status, body.as_str()),
        (400, "unexpected K-Network-Probe value\n")
    );
    assert_eq!(
        q.get("/", &[("k-kubelet-probe", "1")]).await,
        (200, "ok\n".into())
    );
    assert_eq!(
        q.get("/", &[("user-agent", "kube-probe/1.31")]).await,
        (200, "ok\n".into())
    );
    // Probes never reach the app.
    assert_eq!(app_inflight(port).await.1, 0);
    let (_, stats) = q.admin("/stats").await;
    assert!(stats.contains("\"pod\":\"hello-00001-pod\""), "{stats}");
    let (status, _) = q.admin("/nope").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_revisions_timeouts_the_answer_is_504_or_the_body_is_cut() {
    let port = free_port();
    let _app = app(port, &["--threads", "2"]).await;
    let q = Arc::new(Queue::start(
        port,
        &[
            ("REVISION_TIMEOUT_SECONDS", "3"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1"),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "1"),
        ],
    ));
    q.admin_until("/readyz", 200).await;
    // A stream whose first line comes at once and the next too late (idle timeout), and one
    // that keeps sending past the total timeout.
    let idle = {
        let q = q.clone();
        tokio::spawn(async move { body_outcome(&q, "/stream?chunks=3&delay=2500ms").await })
    };
    let total = {
        let q = q.clone();
        tokio::spawn(async move { body_outcome(&q, "/stream?chunks=50&delay=200ms").await })
    };
    let (idle_lines, idle_cut) = idle.await.unwrap();
    assert!(
        idle_cut && idle_lines < 3,
        "idle: {idle_lines} lines, cut {idle_cut}"
    );
    let (total_lines, total_cut) = total.await.unwrap();
    assert!(
        total_cut && total_lines < 50,
        "total: {total_lines} lines, cut {total_cut}"
    );
    assert!(q.metric("thaw_queue_user_errors_total").await >= 2.0);

    // A slow head: an app that waits 2 s before answering, behind a 1 s response-start timeout.
    let port2 = free_port();
    let _slow = app(port2, &["--response-delay", "2s"]).await;
    let q2 = Queue::start(port2, &[("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "1")]);
    q2.admin_until("/readyz", 200).await;
    let (status, body) = q2.get("/", &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (504, "the application did not answer in time\n")
    );
    assert_eq!(q2.metric("thaw_queue_timeouts_total").await, 1.0);
}

/// Reads a streamed body: (lines received, whether it was cut by an error).
async fn body_outcome(q: &Queue, path: &str) -> (usize, bool) {
    let req = hyper::Request::get(format!("http://{}{path}", q.data))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = q.client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut text = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Ok(d) = f.into_data() {
                    text.extend_from_slice(&d);
                }
            }
            Ok(Some(Err(_))) => return (count_lines(&text), true),
            Ok(None) => return (count_lines(&text), false),
            Err(_) => panic!("{path}: body stalled"),
        }
    }
}

fn count_lines(b: &[u8]) -> usize {
    b.iter().filter(|c| **c == b'\n').count()
}

/// An in-process user container that echoes what it received: the Host, the header names, the
/// method and the body length.
async fn echo_server() -> (u16, tokio::task::JoinHandle<()>) {
    echo_server_speaking(false).await
}

/// [`echo_server`], speaking HTTP/1.1 or (with `h2`) h2c with prior knowledge only.
async fn echo_server_speaking(h2: bool) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let host = req
                            .headers()
                            .get("host")
                            .map(|h| h.to_str().unwrap().to_string())
                            // HTTP/2: the authority.
                            .or_else(|| req.uri().authority().map(|a| a.to_string()))
                            .unwrap_or_default();
                        let hosts = req.headers().get_all("host").iter().count();
                        let mut names: Vec<String> =
                            req.headers().keys().map(|k| k.to_string()).collect();
                        names.sort();
                        let method = req.method().to_string();
                        let version = format!("{:?}", req.version());
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let text = format!(
                            "host={host}\nhosts={hosts}\nnames={}\nmethod={method}\nversion={version}\nbody={}\n",
                            names.join(","),
                            body.len()
                        );
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from(text),
                        )))
                    },
                );
                let io = TokioIo::new(stream);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await
                };
            });
        }
    });
    (port, task)
}

/// `/echo` sent with `headers` as a bodiless request (the engine's lane and direct connection)
/// and as one with a body (hyper's server and client), each answered 200: (method, body sent,
/// what the container saw).
async fn echo_both_ways(
    q: &Queue,
    headers: &[(&str, &str)],
) -> Vec<(&'static str, &'static str, String)> {
    let mut out = Vec::new();
    for (method, body) in [("GET", ""), ("POST", "some body")] {
        let (status, _, text) = q.send(method, "/echo", headers, body).await;
        assert_eq!(status, 200, "{method}: {text}");
        out.push((method, body, text));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_container_gets_the_original_host_and_no_internal_headers() {
    let (port, server) = echo_server().await;
    let tag = revision_tag();
    let q = Queue::start(port, &[("THAW_PROXY_TAG", &tag)]);
    q.admin_until("/readyz", 200).await;
    let sent = [
        ("host", "10.0.0.7:8012"),
        ("k-original-host", "hello.default.example.com"),
        ("k-proxy-request", &tag),
        ("k-network-hash", "set-by-a-client"),
        ("x-custom", "1"),
        ("connection", "x-hop"),
        ("x-hop", "dropped"),
    ];
    for (method, body, text) in echo_both_ways(&q, &sent).await {
        assert!(
            text.contains("host=hello.default.example.com\n"),
            "{method}: {text}"
        );
        let names = text.lines().find(|l| l.starts_with("names=")).unwrap();
        for gone in [
            "k-original-host",
            "k-proxy-request",
            "k-network-hash",
            "x-hop",
            "connection",
        ] {
            assert!(
                !names.split([',', '=']).any(|n| n == gone),
                "{method}: {gone} in {names}"
            );
        }
        assert!(names.contains("x-custom"), "{names}");
        assert!(text.contains(&format!("body={}\n", body.len())), "{text}");
    }
    // Without K-Original-Host the client's Host stays.
    let (_, text) = q.get("/echo", &[("host", "direct.example.com")]).await;
    assert!(text.contains("host=direct.example.com\n"), "{text}");
    assert_eq!(
        q.metric("thaw_queue_untagged_proxy_requests_total").await,
        0.0
    );
    // A client's own K-Proxy-Request and K-Original-Host, without the tag (Knative's value, a
    // tag of another revision, none at all): its Host stays, neither header reaches the app.
    let other = thaw::knative::proxy_tag::tag(TAG_KEY, "default", "hello-00002", UID);
    let forged: [&[(&str, &str)]; 3] = [
        &[("k-proxy-request", "activator")],
        &[("k-proxy-request", &other)],
        &[],
    ];
    for (i, proxy) in forged.into_iter().enumerate() {
        let mut h = vec![
            ("host", "direct.example.com"),
            ("k-original-host", "victim.other.example.com"),
        ];
        h.extend_from_slice(proxy);
        for (method, _, text) in echo_both_ways(&q, &h).await {
            assert!(
                text.contains("host=direct.example.com\n"),
                "{i} {method}: {text}"
            );
            assert!(!text.contains("k-proxy-request"), "{text}");
            assert!(!text.contains("k-original-host"), "{text}");
        }
    }
    assert_eq!(
        q.metric("thaw_queue_untagged_proxy_requests_total").await,
        6.0
    );

    // An h2c client (prior knowledge): served, and forwarded as HTTP/1.1 with its authority
    // as the Host.
    let stream = tokio::net::TcpStream::connect(q.data).await.unwrap();
    let (mut send_req, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("http://h2.example.com/echo")
        .header("k-proxy-request", "activator")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send_req.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(text.contains("host=h2.example.com\n"), "{text}");
    assert!(text.contains("version=HTTP/1.1"), "{text}");
    assert!(!text.contains("k-proxy-request"), "{text}");
    server.abort();
}

#[test]
fn invalid_settings_are_refused_naming_each_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["queue"])
        .env_clear()
        .env("SERVING_NAMESPACE", "default")
        .env("CONTAINER_CONCURRENCY", "lots")
        .env("USER_PORT", "8012")
        .env("THAW_REQUEST_BODY_IDLE_TIMEOUT", "0s")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "SERVING_REVISION: is required",
        "CONTAINER_CONCURRENCY: expected a whole number from 0 to 1000, got \"lots\"",
        "USER_PORT: 8012 is one of the sidecar's own ports",
        "THAW_REQUEST_BODY_IDLE_TIMEOUT: expected a duration such as 60s, got \"0s\": must be in [1ms, 1h]",
    ] {
        assert!(err.contains(needle), "{needle} not in:\n{err}");
    }
}

mod local_e2e_support;

/// `thaw local` with `sidecar: true`: each replica is `thaw queue -- COMMAND`, requests pass
/// through it (a cold start included), and a stop drains and ends both processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thaw_local_runs_each_replica_behind_the_sidecar() {
    use local_e2e_support as e2e;
    let local = format!(
        "sidecar: true\n{}",
        e2e::local_yaml(&[e2e::service("hello", &[], "one", "")])
    );
    let mut thaw = e2e::Thaw::start(&local, e2e::FAST_AUTOSCALER, e2e::FAST_ACTIVATOR);
    let (status, _, body) = thaw.get("hello.default.example.com", "/").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "Hello from one!\n"),
        "{}",
        thaw.dump_logs()
    );
    let replicas = thaw.replicas();
    assert_eq!(replicas.len(), 1, "{}", thaw.dump_logs());
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", replicas[0])).unwrap();
    let words: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    assert_eq!(words[1..4], ["queue", "--", "thaw"], "{words:?}");
    // The sidecar's child is the app.
    let app = e2e::children_of(replicas[0]);
    assert_eq!(app.len(), 1, "the sidecar runs the app");
    thaw.signal(Signal::SIGTERM);
    assert_eq!(thaw.wait_exit().await, 0, "{}", thaw.dump_logs());
    assert!(
        !std::path::Path::new(&format!("/proc/{}", app[0])).exists()
            || std::fs::read_to_string(format!("/proc/{}/stat", app[0]))
                .is_ok_and(|s| s.contains(") Z ")),
        "the app outlived thaw"
    );
}

/// An upstream that accepts `Upgrade: echo` and then echoes every byte back.
async fn upgrade_echo_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |mut req: hyper::Request<hyper::body::Incoming>| async move {
                        let asked = req.headers().get("upgrade").cloned();
                        let on = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            if let Ok(up) = on.await {
                                let (mut r, mut w) = tokio::io::split(TokioIo::new(up));
                                let _ = tokio::io::copy(&mut r, &mut w).await;
                            }
                        });
                        let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                        if let Some(p) = asked {
                            *resp.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
                            resp.headers_mut().insert("upgrade", p);
                            resp.headers_mut()
                                .insert("connection", "upgrade".parse().unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_style_upgrade_becomes_a_tunnel_under_the_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (port, server) = upgrade_echo_server().await;
    let q = Queue::start(
        port,
        &[("CONTAINER_CONCURRENCY", "1"), ("THAW_QUEUE_DEPTH", "0")],
    );
    q.admin_until("/readyz", 200).await;
    let mut s = tokio::net::TcpStream::connect(q.data).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: ws.example.com\r\nConnection: Upgrade\r\nUpgrade: echo\r\nK-Proxy-Request: activator\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "closed: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"ping");
    // The tunnel holds the one place under containerConcurrency 1 (no queue): another
    // request is refused while it lives, and admitted once it closes.
    assert_eq!(q.get("/", &[]).await.0, 503);
    drop(s);
    let deadline = Instant::now() + DEADLINE;
    while q.get("/", &[]).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the tunnel's place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.abort();
}

/// A preStop hook with no drain (the user container restarting alone) is answered within
/// moments, not after the pod's whole grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_drain_without_a_drain_answers_not_draining() {
    let port = free_port();
    let q = Queue::start(port, &[]);
    let (status, body) = q.admin("/wait-for-drain").await;
    assert_eq!((status, body.as_str()), (200, "not draining\n"));
}

/// A user container that speaks h2c only (`THAW_USER_PROTOCOL=h2c`): requests with and
/// without a body reach it over HTTP/2, with the client's Host as the authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_user_container_is_reached_over_http2() {
    let (port, server) = echo_server_speaking(true).await;
    let q = Queue::start(port, &[("THAW_USER_PROTOCOL", "h2c")]);
    q.admin_until("/readyz", 200).await;
    for (method, body) in [("GET", ""), ("POST", "a body")] {
        let headers = [
            ("host", "grpc.example.com"),
            ("k-proxy-request", "activator"),
        ];
        let (status, _, text) = q.send(method, "/echo", &headers, body).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("version=HTTP/2.0\n"), "{method}: {text}");
        assert!(text.contains("host=grpc.example.com\n"), "{method}: {text}");
        assert!(text.contains(&format!("method={method}\n")), "{text}");
        assert!(text.contains(&format!("body={}\n", body.len())), "{text}");
        assert!(!text.contains("k-proxy-request"), "{text}");
    }
    server.abort();
}

/// Wrapper mode (`thaw queue -- COMMAND`): the sidecar runs the user container as its child;
/// the child's exit ends the sidecar with exit 1, before or after it was ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_wrapper_mode_the_user_containers_exit_ends_the_sidecar() {
    let base = |port: u16| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
        cmd.env_clear()
            .env("SERVING_NAMESPACE", "default")
            .env("SERVING_REVISION", "hello-00001")
            .env("THAW_DRAIN_DELAY", "0s")
            .env("PORT", port.to_string());
        cmd
    };
    // Exits before it is ready.
    let mut cmd = base(free_port());
    cmd.args(["queue", "--", "thaw", "sample-app", "--crash"]);
    let mut crashing = Proc::spawn(cmd);
    assert_eq!(crashing.wait_exit().await, 1, "{}", crashing.logs());
    assert!(
        crashing
            .logs()
            .contains("the user container exited before it was ready")
    );
    // Serves, then its child dies.
    let port = free_port();
    let mut cmd = base(port);
    cmd.args(["queue", "--", "thaw", "sample-app"]);
    let mut sidecar = Proc::spawn(cmd);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + DEADLINE;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "{}", sidecar.logs());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, _, body) = send(&client, addr, "GET", "/", &[], "").await;
    assert_eq!((status, body.as_str()), (200, "Hello from thaw!\n"));
    let child = local_e2e_support::children_of(sidecar.child.id());
    assert_eq!(child.len(), 1);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child[0] as i32), Signal::SIGKILL).unwrap();
    assert_eq!(sidecar.wait_exit().await, 1, "{}", sidecar.logs());
    assert!(
        sidecar.logs().contains("the user container exited"),
        "{}",
        sidecar.logs()
    );
}

/// Writes `request` on a new connection to `addr` and reads until the peer closes it (or, with
/// `head_only`, until the end of the response head): what came back, as text.
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut out))
        .await
        .expect("the sidecar answered and closed")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// One h2c request (prior knowledge) to `addr` for `uri` with a `host` field: status and body.
async fn h2_get(addr: SocketAddr, uri: &str, host: Option<&str>) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send_req, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::get(uri);
    if let Some(h) = host {
        req = req.header("host", h);
    }
    let resp = send_req
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Issue 33: the sidecar applies the activator's host rule (`http1::host`): a duplicate Host
/// and a missing one (HTTP/1.1) are 400, an absolute-form target's authority is the one Host
/// the application sees, and on h2 a `host` differing from `:authority` is 400. Both engine
/// paths: the lane (bodiless) and hyper's server (a body, an absolute-form target).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_activators_host_rules_hold_in_the_sidecar() {
    let (port, server) = echo_server().await;
    let tag = revision_tag();
    let q = Queue::start(port, &[("THAW_PROXY_TAG", &tag)]);
    q.admin_until("/readyz", 200).await;
    let body = "Content-Length: 2\r\n\r\nhi";
    for (what, req) in [
        (
            "two Host fields",
            "GET /echo HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\nConnection: close\r\n\r\n".to_string(),
        ),
        (
            "two Host fields, a body",
            format!("POST /echo HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\nConnection: close\r\n{body}"),
        ),
        (
            "no Host on HTTP/1.1",
            "GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n".to_string(),
        ),
        (
            "no Host on HTTP/1.1, a body",
            format!("POST /echo HTTP/1.1\r\nConnection: close\r\n{body}"),
        ),
    ] {
        let got = raw_exchange(q.data, req.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{what}: {got}");
        assert!(!got.contains("hosts="), "{what} reached the app: {got}");
    }
    // HTTP/1.0 needs no Host.
    let got = raw_exchange(q.data, b"GET /echo HTTP/1.0\r\n\r\n").await;
    assert!(
        got.starts_with("HTTP/1.0 200 ") || got.starts_with("HTTP/1.1 200 "),
        "{got}"
    );
    // An absolute-form target's authority wins over Host, and the app gets exactly one Host.
    for req in [
        "GET http://right.example.com/echo HTTP/1.1\r\nHost: wrong.example.com\r\nConnection: close\r\n\r\n".to_string(),
        format!("POST http://right.example.com/echo HTTP/1.1\r\nHost: wrong.example.com\r\nConnection: close\r\n{body}"),
    ] {
        let got = raw_exchange(q.data, req.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
        assert!(got.contains("\nhost=right.example.com\nhosts=1\n"), "{got}");
    }
    // K-Original-Host (the activator's, on a tagged request) still replaces Host, once.
    let (_, text) = q
        .get(
            "/echo",
            &[
                ("host", "10.0.0.7:8012"),
                ("k-proxy-request", &tag),
                ("k-original-host", "orig.example.com"),
            ],
        )
        .await;
    assert!(text.contains("host=orig.example.com\nhosts=1\n"), "{text}");

    // h2: `host` must agree with `:authority` (in any case); the authority is the Host.
    let uri = "http://right.example.com/echo";
    assert_eq!(h2_get(q.data, uri, Some("wrong.example.com")).await.0, 400);
    let (status, text) = h2_get(q.data, uri, Some("RIGHT.example.com")).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("host=right.example.com\nhosts=1\n"), "{text}");
    let (status, text) = h2_get(q.data, uri, None).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("host=right.example.com\nhosts=1\n"), "{text}");
    server.abort();
}

/// Issue 33: a request body that stalls is cut after THAW_REQUEST_BODY_IDLE_TIMEOUT with 408
/// and its containerConcurrency place freed: with cc=1 a second request is served while the
/// stalled connection is still open. A body that keeps sending, however slowly, is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_cut_with_408_and_frees_its_place() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (port, server) = echo_server().await;
    let q = Queue::start(
        port,
        &[
            ("CONTAINER_CONCURRENCY", "1"),
            ("THAW_REQUEST_BODY_IDLE_TIMEOUT", "1s"),
        ],
    );
    q.admin_until("/readyz", 200).await;
    // Headers and 3 of 100 bytes, then nothing.
    let mut stalled = tokio::net::TcpStream::connect(q.data).await.unwrap();
    stalled
        .write_all(b"POST /echo HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("stalled") {
        let n = tokio::time::timeout(DEADLINE, stalled.read(&mut buf))
            .await
            .expect("an answer to the stalled body")
            .unwrap();
        assert!(
            n > 0,
            "closed without an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
    // The place is free: served at once (a held place would keep it for the revision's 300 s).
    let (status, _, text) = q.send("POST", "/echo", &[], "next").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("body=4\n"), "{text}");
    assert_eq!(
        q.metric("thaw_queue_request_body_timeouts_total").await,
        1.0
    );
    drop(stalled);

    // A body trickling in (every gap well inside the timeout, all of it longer) is not cut.
    let mut slow = tokio::net::TcpStream::connect(q.data).await.unwrap();
    slow.write_all(b"POST /echo HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 8\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        slow.write_all(b"x").await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, slow.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
    assert!(out.contains("body=8\n"), "{out}");
    assert_eq!(
        q.metric("thaw_queue_request_body_timeouts_total").await,
        1.0
    );
    server.abort();
}

/// A previous release's sidecar (its `Expected::accepts`): its one tag as the value or one of
/// the first two list elements.
fn previous_release_accepts(tag: &str, value: &str) -> bool {
    value.split(',').take(2).any(|p| p.trim() == tag)
}

/// Issue 47: the upgrade to tags over the revision's UID, under traffic, counts no proxied
/// request as direct. An old-form pod (as a previous release's controller wrote it: its only
/// tag the previous form, HMAC of the stats token over `namespace/revision`) and the new-form
/// pod this release rolls it to (the tag over `namespace/revision/uid` under the tag key, and
/// the previous form carried in `THAW_PROXY_TAG_LEGACY`) serve the revision in turn and, mid
/// roll, together; a previous release's activator (the previous form) and this release's
/// (its [`Tagger`]: both forms) send to them all along; mid-traffic both keys rotate (the old
/// activator sends `new, previous` as it does within a stats-token rotation, the new one both
/// forms under both keys). Every request is counted as proxied: its `K-Original-Host` is the
/// Host the app sees, and neither pod counts one in
/// `thaw_queue_untagged_proxy_requests_total`. Each value sent to the old-form pod also
/// carries its tag within the first two elements, all a previous release's sidecar reads. A
/// client's forged tag is still direct (the control case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_under_traffic_counts_no_proxied_request_as_direct() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
    use thaw::knative::proxy_tag::{TagCell, Tagger, legacy_tag, tag};

    let (s1, s2) = (
        b"stats-token-one-0123456789".as_slice(),
        b"stats-token-two-9876543210".as_slice(),
    );
    let (k1, k2) = (TAG_KEY, b"test-proxy-tag-key-rotated-012".as_slice());
    let legacy = legacy_tag(s1, "default", "hello-00001");
    let (port, server) = echo_server().await;
    let old_pod = Queue::start(port, &[("THAW_PROXY_TAG", &legacy)]);
    let new_pod = Queue::start(
        port,
        &[
            ("THAW_PROXY_TAG", &tag(k1, "default", "hello-00001", UID)),
            ("THAW_PROXY_TAG_LEGACY", &legacy),
        ],
    );
    old_pod.admin_until("/readyz", 200).await;
    new_pod.admin_until("/readyz", 200).await;
    let pods = Arc::new([old_pod, new_pod]);
    let tagger = Arc::new(Tagger::default());
    tagger.set([Some(k1), None], [Some(s1), None]);
    // 0: the old pod alone; 1: mid roll, both; 2: both, the keys just rotated; 3: the new
    // pod alone; 4: stop.
    let phase = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (pods, tagger, phase, sent) =
                (pods.clone(), tagger.clone(), phase.clone(), sent.clone());
            let legacy = legacy.clone();
            tokio::spawn(async move {
                let (cell, uid) = (TagCell::default(), Arc::<str>::from(UID));
                let mut per_pod = [0u64; 2];
                let mut i = w;
                loop {
                    let p = phase.load(SeqCst);
                    if p == 4 {
                        return per_pod;
                    }
                    i += 1;
                    let pod = match p {
                        0 => 0,
                        1 | 2 => i % 2,
                        _ => 1,
                    };
                    // Old and new activators in turn.
                    let value = if i % 3 == 0 {
                        if p >= 2 {
                            format!("{}, {}", legacy_tag(s2, "default", "hello-00001"), legacy)
                        } else {
                            legacy.clone()
                        }
                    } else {
                        let v = tagger.value(&cell, "default", "hello-00001", Some(&uid));
                        v.unwrap().to_str().unwrap().to_string()
                    };
                    if pod == 0 {
                        assert!(previous_release_accepts(&legacy, &value), "{value}");
                    }
                    let (status, text) = pods[pod]
                        .get(
                            "/echo",
                            &[
                                ("host", "10.0.0.7:8012"),
                                ("k-original-host", "hello.default.example.com"),
                                ("k-proxy-request", &value),
                            ],
                        )
                        .await;
                    assert_eq!(status, 200, "{text}");
                    assert!(
                        text.contains("host=hello.default.example.com\n"),
                        "phase {p}, pod {pod}, counted as direct: {value}\n{text}"
                    );
                    per_pod[pod] += 1;
                    sent.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    let until_sent = |n: u64| {
        let sent = sent.clone();
        async move {
            let end = Instant::now() + Duration::from_secs(30);
            while sent.load(SeqCst) < n {
                assert!(
                    Instant::now() < end,
                    "traffic stalled at {}",
                    sent.load(SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until_sent(100).await;
    phase.store(1, SeqCst);
    until_sent(200).await;
    // Both keys rotate: the new activator sends both forms under both keys.
    tagger.set([Some(k2), Some(k1)], [Some(s2), Some(s1)]);
    phase.store(2, SeqCst);
    until_sent(300).await;
    phase.store(3, SeqCst);
    until_sent(400).await;
    phase.store(4, SeqCst);
    let mut answered = [0u64; 2];
    for w in workers {
        let n = w.await.unwrap();
        answered[0] += n[0];
        answered[1] += n[1];
    }
    assert!(answered[0] >= 100 && answered[1] >= 100, "{answered:?}");
    for (pod, n) in pods.iter().zip(answered) {
        assert_eq!(
            pod.metric("thaw_queue_untagged_proxy_requests_total").await,
            0.0
        );
        let (_, metrics) = pod.admin("/metrics").await;
        assert!(
            metrics.contains(&format!("response_code_class=\"2xx\"}} {n}")),
            "{n} answers counted:\n{metrics}"
        );
    }
    // The control case: another revision's tag (or the revision's under another UID) is
    // direct on either pod.
    let forged = [
        tag(k1, "default", "hello-00002", UID),
        tag(
            k1,
            "default",
            "hello-00001",
            "the-uid-of-an-earlier-revision",
        ),
        legacy_tag(s1, "default", "hello-00002"),
    ];
    for pod in pods.iter() {
        for f in &forged {
            let (_, text) = pod
                .get(
                    "/echo",
                    &[
                        ("host", "direct.example.com"),
                        ("k-original-host", "hello.default.example.com"),
                        ("k-proxy-request", f),
                    ],
                )
                .await;
            assert!(text.contains("host=direct.example.com\n"), "{text}");
        }
        assert_eq!(
            pod.metric("thaw_queue_untagged_proxy_requests_total").await,
            forged.len() as f64
        );
    }
    server.abort();
}
