//! gRPC through `thaw queue`: the real binary as the sidecar in front of a real tonic server
//! (h2c), a real tonic client on the sidecar's data port. Every wait polls with a deadline; no
//! speed is asserted.

mod grpc_support;
mod queue_support;

use grpc_support::{Client, Msg, Server, UNARY, raw_call};
use queue_support::{Queue, app, free_port};
use tonic::Code;

/// The sidecar in front of `server` speaking h2c, ready, with `env` added.
async fn sidecar(server: &Server, env: &[(&str, &str)]) -> Queue {
    let mut all = vec![("THAW_USER_PROTOCOL", "h2c")];
    all.extend_from_slice(env);
    let q = Queue::start(server.addr.port(), &all);
    q.admin_until("/readyz", 200).await;
    q
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_streaming_and_status_pass_through_the_sidecar() {
    let server = Server::start().await;
    let q = sidecar(&server, &[]).await;
    let mut c = Client::connect(q.data, &[]).await;
    grpc_support::four_kinds_status_and_4mib(&mut c).await;
}

/// Dropping a call mid-stream reaches the replica: its stream is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancel_reaches_the_replica() {
    let server = Server::start().await;
    let q = sidecar(&server, &[]).await;
    let mut c = Client::connect(q.data, &[]).await;
    grpc_support::a_cancel_reaches(&mut c, &server).await;
}

/// A long stream holds its place under containerConcurrency while it lives: with cc 1 and no
/// queue, a second call is refused by the sidecar as a gRPC error (UNAVAILABLE, the HTTP
/// answer's reason, trailers-only), and the stream still finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_holds_its_place_and_overflow_is_a_grpc_error() {
    let server = Server::start().await;
    let q = sidecar(
        &server,
        &[("CONTAINER_CONCURRENCY", "1"), ("THAW_QUEUE_DEPTH", "0")],
    )
    .await;
    let mut c = Client::connect(q.data, &[]).await;
    let mut stream = grpc_support::open_waiting(&mut c, &server).await;

    let err = c.unary(Msg::new("echo")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(err.message(), "overloaded: the request queue is full");
    let raw = raw_call(q.data, UNARY, &[], &Msg::new("echo")).await;
    raw.assert_trailers_only();
    assert_eq!(
        raw.grpc_status(),
        (
            Some("14".into()),
            Some("overloaded: the request queue is full".into())
        )
    );
    // The HTTP answer to a plain request says the same.
    let (status, text) = q.get("/", &[]).await;
    assert_eq!(
        (status, text.as_str()),
        (503, "overloaded: the request queue is full\n")
    );

    grpc_support::finish_waiting(&server, &mut stream).await;
    assert_eq!(c.unary(Msg::new("echo")).await.unwrap().text, "echo");
}

/// A call is cut at the shorter of its `grpc-timeout` and the revision's timeout, with
/// DEADLINE_EXCEEDED: before the response starts, a trailers-only answer; mid-stream, the
/// status in trailers after the messages already sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_cut_at_its_deadline_with_deadline_exceeded() {
    let server = Server::start().await;
    let q = sidecar(&server, &[("REVISION_TIMEOUT_SECONDS", "1")]).await;
    // grpc-timeout shorter than the revision's: the sidecar cuts the call at it.
    let raw = raw_call(
        q.data,
        UNARY,
        &[("grpc-timeout", "200m")],
        &Msg::new("sleep:20000"),
    )
    .await;
    raw.assert_trailers_only();
    assert_eq!(
        raw.grpc_status(),
        (
            Some("4".into()),
            Some("the application did not answer in time".into())
        )
    );
    // An invalid grpc-timeout is ignored: the revision's timeout (1 s) cuts the call.
    let raw = raw_call(
        q.data,
        UNARY,
        &[("grpc-timeout", "soon")],
        &Msg::new("sleep:20000"),
    )
    .await;
    assert_eq!(raw.grpc_status().0.as_deref(), Some("4"), "{raw:?}");

    // Mid-stream: the revision's timeout ends the stream with status 4 in trailers.
    let mut c = Client::connect(q.data, &[]).await;
    grpc_support::cut_mid_stream(&mut c).await;
    // The cut call's place is free again.
    assert_eq!(c.unary(Msg::new("echo")).await.unwrap().text, "echo");
}

/// A user container that speaks HTTP/1.1 only (the default protocol): a gRPC call is refused
/// at once with UNIMPLEMENTED and a reason saying what to change, while plain requests over
/// h2c to the same sidecar still reach it over HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_to_an_http1_application_is_refused_with_a_reason() {
    let port = free_port();
    let _app = app(port, &[]).await;
    let q = Queue::start(port, &[]);
    q.admin_until("/readyz", 200).await;
    let mut c = Client::connect(q.data, &[]).await;
    let err = c.unary(Msg::new("echo")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert_eq!(
        err.message(),
        "the application serves HTTP/1.1 only: a gRPC call needs an h2c port (ports[].name: h2c)"
    );
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = h2
        .get(format!("http://{}/", q.data).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
}

/// A `grpc` readiness probe runs in the sidecar: `grpc.health.v1.Health/Check` for the
/// probe's service over h2c; ready while it answers SERVING, not ready on NOT_SERVING or an
/// unknown service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_readiness_probe_runs_in_the_sidecar() {
    use std::sync::atomic::Ordering::SeqCst;
    let server = Server::start().await;
    let probe = format!(
        r#"{{"grpc":{{"port":{},"service":"thaw.test.Test"}}}}"#,
        server.addr.port()
    );
    let q = sidecar(&server, &[("SERVING_READINESS_PROBE", &probe)]).await;
    assert!(
        server
            .seen
            .health_checks
            .lock()
            .unwrap()
            .iter()
            .all(|s| s == "thaw.test.Test"),
        "the probe names its service"
    );
    server.seen.not_serving.store(true, SeqCst);
    q.admin_until("/readyz", 503).await;
    server.seen.not_serving.store(false, SeqCst);
    q.admin_until("/readyz", 200).await;
    drop(q);

    // A service the server does not know (NOT_FOUND): never ready, however often probed.
    let probe = format!(
        r#"{{"grpc":{{"port":{},"service":"unknown.Service"}}}}"#,
        server.addr.port()
    );
    let q = Queue::start(
        server.addr.port(),
        &[
            ("THAW_USER_PROTOCOL", "h2c"),
            ("SERVING_READINESS_PROBE", &probe),
        ],
    );
    server
        .seen
        .until("the unknown service is probed three times", |s| {
            s.health_checks
                .lock()
                .unwrap()
                .iter()
                .filter(|n| *n == "unknown.Service")
                .count()
                >= 3
        })
        .await;
    assert_eq!(q.admin("/readyz").await.0, 503);
}

/// A user container that does not answer (nothing listens on its port): a call gets the
/// sidecar's 502 as UNAVAILABLE, with the HTTP answer's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_application_is_unavailable() {
    let q = Queue::start(free_port(), &[("THAW_USER_PROTOCOL", "h2c")]);
    let raw = raw_call(q.data, UNARY, &[], &Msg::new("echo")).await;
    raw.assert_trailers_only();
    assert_eq!(
        raw.grpc_status(),
        (
            Some("14".into()),
            Some("the application did not answer".into())
        )
    );
    let (status, text) = q.get("/", &[]).await;
    assert_eq!(
        (status, text.as_str()),
        (502, "the application did not answer\n")
    );
}
