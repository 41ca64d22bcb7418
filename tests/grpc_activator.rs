//! gRPC through the activator: a real `Activator::serve` on loopback (the activator tests'
//! harness), a real tonic server as the revision's replica, a real tonic client routed by
//! Knative's headers. Every wait polls with a deadline; no speed is asserted.

mod grpc_support;
#[path = "activator_e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
mod queue_support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use grpc_support::{Client, Msg, Server, UNARY, drain, raw_call};
use harness::{Harness, admin_get, h2_client, send, spec};
use thaw::config::ActivatorConfig;
use thaw::revision::{Protocol, RevisionKey, RevisionSpec};
use tonic::Code;

/// A revision speaking h2c, of containerConcurrency `cc`.
fn h2c_spec(name: &str, cc: u32) -> RevisionSpec {
    let mut s = spec(name, cc);
    s.protocol = Protocol::H2c;
    s
}

/// Knative's routing headers for `default/name`.
fn route(name: &str) -> [(&'static str, &str); 2] {
    [
        ("knative-serving-namespace", "default"),
        ("knative-serving-revision", name),
    ]
}

/// A client of the activator routed to `default/name`.
async fn client(h: &Harness, name: &str) -> Client {
    Client::connect(h.data, &route(name)).await
}

#[tokio::test]
async fn unary_streaming_status_cancel_and_4mib_through_the_activator() {
    let rev = RevisionKey::new("default", "g");
    let h = Harness::start(vec![h2c_spec("g", 0)], ActivatorConfig::default()).await;
    let server = Server::start().await;
    h.endpoints.set_ready(&rev, vec![server.addr]);
    let mut c = client(&h, "g").await;
    grpc_support::four_kinds_status_and_4mib(&mut c).await;
    grpc_support::a_cancel_reaches(&mut c, &server).await;
}

/// A call to a revision at zero is held through its cold start, then answered.
#[tokio::test]
async fn a_call_is_held_through_a_cold_start_then_answered() {
    let rev = RevisionKey::new("default", "cold");
    let h = Harness::start(vec![h2c_spec("cold", 0)], ActivatorConfig::default()).await;
    let mut c = client(&h, "cold").await;
    let mut c2 = c.clone();
    let unary = tokio::spawn(async move { c2.unary(Msg::new("echo")).await });
    let mut c3 = c.clone();
    let stream = tokio::spawn(async move {
        let mut s = c3.server_stream(Msg::new("count:3")).await?;
        Ok::<_, tonic::Status>(drain(&mut s).await)
    });
    h.wait_held(&rev, 2).await;
    assert!(!unary.is_finished() && !stream.is_finished());
    // The replica comes up and the endpoints controller reports it.
    let server = Server::start().await;
    h.endpoints.set_ready(&rev, vec![server.addr]);
    assert_eq!(unary.await.unwrap().unwrap().text, "echo");
    let (texts, end) = stream.await.unwrap().unwrap();
    assert_eq!(texts, ["0", "1", "2"]);
    end.unwrap();
    // A call with a deadline held through the cold start: the replica is told what is left.
    let h = Harness::start(vec![h2c_spec("cold", 0)], ActivatorConfig::default()).await;
    let headers = [route("cold").as_slice(), &[("grpc-timeout", "20S")]].concat();
    let addr = h.data;
    let held = tokio::spawn(async move {
        grpc_support::raw_call(addr, UNARY, &headers, &Msg::new("deadline")).await
    });
    h.wait_held(&rev, 1).await;
    h.endpoints.set_ready(&rev, vec![server.addr]);
    let raw = held.await.unwrap();
    assert_eq!(raw.grpc_status().0.as_deref(), Some("0"), "{raw:?}");
    let told = grpc_support::unary_answer(&raw);
    let ms: u64 = told.strip_suffix('m').unwrap().parse().unwrap();
    assert!(ms < 20_000, "{told}");
    assert_eq!(c.unary(Msg::new("echo")).await.unwrap().text, "echo");
}

/// The activator's own answers to gRPC calls are gRPC errors (trailers-only, HTTP 200), each
/// with the status mapped from its HTTP answer and the HTTP answer's reason.
#[tokio::test]
async fn the_activators_own_errors_are_grpc_errors() {
    let mut slow = h2c_spec("slow", 0);
    slow.timeouts.total = Duration::from_secs(3);
    slow.timeouts.response_start = Duration::from_secs(1);
    slow.timeouts.cold_wait = Duration::from_secs(1);
    let mut cold_wait = h2c_spec("coldwait", 0);
    cold_wait.timeouts.cold_wait = Duration::from_millis(300);
    let specs = vec![
        h2c_spec("cold", 0),
        h2c_spec("failing", 0),
        h2c_spec("dead", 0),
        slow,
        cold_wait,
    ];
    let h = Harness::start(specs, ActivatorConfig::default()).await;
    let server = Server::start().await;
    h.endpoints.set_failing(
        &RevisionKey::new("default", "failing"),
        "exit status 1: secret output",
    );
    let dead = harness::dead_addr("127.0.0.1").await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "dead"), vec![dead]);
    h.endpoints
        .set_ready(&RevisionKey::new("default", "slow"), vec![server.addr]);

    // (revision, extra headers, the request's text) -> (grpc-status, the reason's start).
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str, &'a str);
    let cases: [Case; 7] = [
        ("nope", &[], "echo", "12", "revision default/nope not found"),
        (
            "failing",
            &[],
            "echo",
            "14",
            "revision default/failing is unavailable",
        ),
        (
            "dead",
            &[],
            "echo",
            "14",
            "revision default/dead: upstream failed",
        ),
        // Held past the call's own deadline (grpc-timeout, shorter than the revision's).
        (
            "cold",
            &[("grpc-timeout", "300m")],
            "echo",
            "4",
            "revision default/cold: the call's deadline passed after",
        ),
        // Held past the revision's cold wait: no replica, UNAVAILABLE (the HTTP answer is 504).
        (
            "coldwait",
            &[],
            "echo",
            "14",
            "revision default/coldwait did not become ready within",
        ),
        // The revision's response-start timeout.
        (
            "slow",
            &[],
            "sleep:20000",
            "4",
            "revision default/slow: upstream sent no response within",
        ),
        // grpc-timeout shorter than the revision's: the whole-call timeout.
        (
            "slow",
            &[("grpc-timeout", "200m")],
            "sleep:20000",
            "4",
            "revision default/slow: request timed out after",
        ),
    ];
    for (name, extra, text, status, reason) in cases {
        let mut headers = route(name).to_vec();
        headers.extend_from_slice(extra);
        let raw = raw_call(h.data, UNARY, &headers, &Msg::new(text)).await;
        raw.assert_trailers_only();
        let (got_status, message) = raw.grpc_status();
        let message = message.unwrap();
        assert_eq!(got_status.as_deref(), Some(status), "{name}: {raw:?}");
        assert!(message.starts_with(reason), "{name}: {message}");
        assert!(message.contains("(request id "), "{name}: {message}");
        for internal in [dead.to_string(), "secret".into()] {
            assert!(!message.contains(&internal), "{message}");
        }
        // The same reason over HTTP.
        if extra.is_empty() && text == "echo" {
            let (_, _, body) =
                send(&h2_client(), h.get(&RevisionKey::new("default", name), "/")).await;
            assert!(body.starts_with(reason), "{body}");
        }
    }
    // And through tonic: the status and message as the client library reads them.
    let mut c = client(&h, "nope").await;
    let err = c.unary(Msg::new("echo")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(
        err.message()
            .starts_with("revision default/nope not found (request id ")
    );
}

/// A long stream holds its containerConcurrency slot while it lives (a second call overflows a
/// queue of 0: UNAVAILABLE), and the revision's timeout cuts a stream mid-way with
/// DEADLINE_EXCEEDED in its trailers.
#[tokio::test]
async fn a_long_stream_holds_its_slot_and_is_cut_by_the_revision_timeout() {
    let mut held = h2c_spec("held", 1);
    held.queue_depth = 0;
    let mut short = h2c_spec("short", 0);
    short.timeouts.total = Duration::from_secs(1);
    let h = Harness::start(vec![held, short], ActivatorConfig::default()).await;
    let server = Server::start().await;
    for name in ["held", "short"] {
        h.endpoints
            .set_ready(&RevisionKey::new("default", name), vec![server.addr]);
    }
    let mut c = client(&h, "held").await;
    let mut stream = grpc_support::open_waiting(&mut c, &server).await;
    let err = c.unary(Msg::new("echo")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .starts_with("revision default/held is overloaded: its queue is full"),
        "{err:?}"
    );
    grpc_support::finish_waiting(&server, &mut stream).await;
    assert_eq!(c.unary(Msg::new("echo")).await.unwrap().text, "echo");

    let mut c = client(&h, "short").await;
    grpc_support::cut_mid_stream(&mut c).await;
}

/// A revision declared HTTP/1.1 only: a gRPC call is refused at once with UNIMPLEMENTED and a
/// reason (no hold, no hang), while plain requests over h2c still reach it over HTTP/1.1.
#[tokio::test]
async fn a_grpc_call_to_an_http1_revision_is_refused_and_plain_h2c_still_works() {
    let rev = RevisionKey::new("default", "web");
    let h = Harness::start(vec![spec("web", 0)], ActivatorConfig::default()).await;
    let up = harness::Upstream::start().await;
    h.endpoints.set_ready(&rev, vec![up.addr]);
    let mut c = client(&h, "web").await;
    let err = c.unary(Msg::new("echo")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(
        err.message().starts_with(
            "revision default/web serves HTTP/1.1 only: a gRPC call needs an h2c port (ports[].name: h2c)"
        ),
        "{err:?}"
    );
    let (status, _, body) = send(&h2_client(), h.get(&rev, "/")).await;
    assert_eq!(status, 200);
    assert!(body.starts_with("hello from"), "{body}");
}

/// Drain: the connection is told to go away (GOAWAY) and the listener closes; a stream open
/// on it finishes, and a new call is refused (UNAVAILABLE) rather than left hanging.
#[tokio::test]
async fn drain_sends_goaway_and_open_streams_finish() {
    let rev = RevisionKey::new("default", "g");
    let cfg = ActivatorConfig {
        drain_delay: Duration::from_millis(100),
        drain_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let mut h = Harness::start(vec![h2c_spec("g", 0)], cfg).await;
    let server = Server::start().await;
    h.endpoints.set_ready(&rev, vec![server.addr]);
    let mut c = client(&h, "g").await;
    let mut stream = grpc_support::open_waiting(&mut c, &server).await;
    h.shutdown();
    // Calls succeed until the GOAWAY and the listener's close; then a new call is refused:
    // one the client still sent on the connection after its GOAWAY is not served (tonic reads
    // that as CANCELLED), and one on a new connection finds the listener closed (UNAVAILABLE).
    let deadline = tokio::time::Instant::now() + grpc_support::DEADLINE;
    loop {
        match c.unary(Msg::new("echo")).await {
            Ok(m) => assert_eq!(m.text, "echo"),
            Err(e) if e.code() == Code::Unavailable => break,
            Err(e) => assert_eq!(e.code(), Code::Cancelled, "{e:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(admin_get(h.admin, "/readyz").await.0, 503);
    grpc_support::finish_waiting(&server, &mut stream).await;
}

/// A stream that sends nothing for several keep-alive timeouts stays open: the activator PINGs
/// the client (seen as bytes coming back while no stream sends any), the client answers, and
/// the stream then finishes.
#[tokio::test]
async fn keepalive_pings_keep_an_idle_stream_alive() {
    let rev = RevisionKey::new("default", "g");
    let keep_alive = Duration::from_millis(200);
    let cfg = ActivatorConfig {
        keep_alive_timeout: keep_alive,
        ..Default::default()
    };
    let h = Harness::start(vec![h2c_spec("g", 0)], cfg).await;
    let server = Server::start().await;
    h.endpoints.set_ready(&rev, vec![server.addr]);
    let (relay, back) = grpc_support::counting_relay(h.data).await;
    let mut c = Client::connect(relay, &route("g")).await;
    let mut stream = grpc_support::open_waiting(&mut c, &server).await;
    let before = back.load(SeqCst);
    // Idle for five keep-alive timeouts: PINGs (17 bytes each) are all that comes back.
    tokio::time::sleep(keep_alive * 5).await;
    let pinged = back.load(SeqCst) - before;
    assert!(
        pinged >= 17,
        "no PING in five keep-alive periods ({pinged} bytes)"
    );
    grpc_support::finish_waiting(&server, &mut stream).await;
}

/// The whole data path: the activator forwards to `thaw queue` (h2c to its tonic replica);
/// each kind of call and the replica's status pass through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_activator_and_the_sidecar_together() {
    let rev = RevisionKey::new("default", "g");
    let server = Server::start().await;
    let q = queue_support::Queue::start(
        server.addr.port(),
        &[("THAW_USER_PROTOCOL", "h2c"), ("SERVING_REVISION", "g")],
    );
    q.admin_until("/readyz", 200).await;
    let h = Harness::start(vec![h2c_spec("g", 0)], ActivatorConfig::default()).await;
    h.endpoints.set_ready(&rev, vec![q.data]);
    let mut c = client(&h, "g").await;
    grpc_support::four_kinds_status_and_4mib(&mut c).await;
    grpc_support::a_cancel_reaches(&mut c, &server).await;
}
