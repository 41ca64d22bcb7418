//! The data-port review's regressions, one test per finding: each failed on the code
//! before its fix. Raw TCP where the exact bytes matter.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;
use crate::listener::{REQUEST, read_head, read_to_close};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty client SETTINGS frame: length 0, type 4, flags 0, stream 0.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// An h2 frame: 3-byte length, type, flags, stream id.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET /` to revision `default/r` (static-table methods and literals).
fn get_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84]; // :method GET, :scheme http, :path /
    b.extend_from_slice(&[0x41, 1, b'x']); // :authority x
    for (n, v) in [
        (&b"knative-serving-namespace"[..], &b"default"[..]),
        (b"knative-serving-revision", b"r"),
    ] {
        b.push(0x00);
        b.push(n.len() as u8);
        b.extend_from_slice(n);
        b.push(v.len() as u8);
        b.extend_from_slice(v);
    }
    b
}

fn short_timeouts() -> ActivatorConfig {
    ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        keep_alive_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Finding 1: an h2c connection whose first header block never ends is closed (the first
/// request is due within the header-read timeout, as on HTTP/1).
#[tokio::test]
async fn an_h2c_header_block_that_never_ends_is_cut() {
    let mut h = Harness::start(vec![spec("r", 0)], short_timeouts()).await;
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&SETTINGS).await.unwrap();
    // HEADERS on stream 1 without END_HEADERS (flags 0), then nothing.
    tcp.write_all(&frame(1, 0, 1, &[0x82])).await.unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the connection");
    h.shutdown();
}

/// Finding 1, after a first request: an unfinished header block on a later stream is cut once
/// the connection is closing (idle past the keep-alive timeout, then the closing grace).
#[tokio::test]
async fn an_unfinished_later_h2c_header_block_is_cut_once_closing() {
    let up = Upstream::start().await;
    let mut h = Harness::start(vec![spec("r", 0)], short_timeouts()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    tcp.write_all(PREFACE).await.unwrap();
    tcp.write_all(&SETTINGS).await.unwrap();
    // A complete request (END_HEADERS | END_STREAM), then a header block left open.
    tcp.write_all(&frame(1, 0x5, 1, &get_block()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(&frame(1, 0, 3, &[0x82])).await.unwrap();
    read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("the server closed the connection");
    h.shutdown();
}

/// Finding 2: a request body that starts with the h2 preface does not switch the header-read
/// timeout off for the rest of the HTTP/1 connection.
#[tokio::test]
async fn a_body_that_looks_like_the_h2_preface_keeps_the_head_clock() {
    let up = Upstream::start().await;
    let cfg = ActivatorConfig {
        header_read_timeout: Duration::from_millis(200),
        keep_alive_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let mut h = Harness::start(vec![spec("r", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let mut tcp = TcpStream::connect(h.data).await.unwrap();
    let head = b"POST /echo HTTP/1.1\r\nHost: x\r\nKnative-Serving-Namespace: default\r\n\
Knative-Serving-Revision: r\r\nContent-Length: 24\r\n\r\n";
    tcp.set_nodelay(true).unwrap();
    tcp.write_all(head).await.unwrap();
    // The body in a segment of its own: the first bytes hyper reads from the socket itself.
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(PREFACE).await.unwrap();
    let got = read_head(&mut tcp).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // The next head trickles in, a byte every 100 ms, for far longer than the timeout.
    let trickle = async {
        for b in REQUEST.iter().take(20) {
            if tcp.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    trickle.await;
    read_to_close(&mut tcp, Duration::from_secs(5))
        .await
        .expect("the trickled head was cut by the header-read timeout");
    h.shutdown();
}

/// Sends `head` (and `body`) on a fresh connection and reads the whole answer (the requests say
/// `Connection: close`): (status, body).
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let all = read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// Two revisions: `public` routed by its host, `secret` by Knative's headers only.
async fn public_and_secret(cfg: ActivatorConfig) -> (Harness, Upstream, Upstream) {
    let (public_up, secret_up) = (Upstream::start().await, Upstream::start().await);
    let mut public = spec("public", 0);
    public.hosts = vec!["public.default.example.com".into()];
    let h = Harness::start(vec![public, spec("secret", 0)], cfg).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "public"), vec![public_up.addr]);
    h.endpoints
        .set_ready(&RevisionKey::new("default", "secret"), vec![secret_up.addr]);
    (h, public_up, secret_up)
}

/// A request naming `secret` by Knative's headers, with a host that routes to `public`, and
/// client-sent forwarding headers; with a body it goes to hyper's server, without to the lane.
fn spoofing(with_body: bool) -> Vec<u8> {
    let mut r = b"POST /headers HTTP/1.1\r\nHost: public.default.example.com\r\n\
Knative-Serving-Namespace: default\r\nKnative-Serving-Revision: secret\r\n\
X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example.com\r\n\
Forwarded: for=1.2.3.4;proto=https\r\nX-Real-IP: 1.2.3.4\r\nConnection: close\r\n"
        .to_vec();
    if with_body {
        r.extend_from_slice(b"Content-Length: 2\r\n\r\nhi");
    } else {
        r.extend_from_slice(b"\r\n");
    }
    r
}

/// Finding 4: from an untrusted peer, Knative's routing headers do not pick the revision and
/// the forwarding headers are replaced; from a trusted one both are honoured. Lane and hyper.
#[tokio::test]
async fn routing_and_forwarding_headers_are_believed_only_from_trusted_peers() {
    use thaw::config::TrustedProxies;
    let untrusted = ActivatorConfig {
        trusted_proxies: TrustedProxies::Only(vec!["10.0.0.0/8".parse().unwrap()]),
        ..Default::default()
    };
    let (mut h, public_up, secret_up) = public_and_secret(untrusted).await;
    for with_body in [false, true] {
        let (status, body) = raw(h.data, &spoofing(with_body)).await;
        assert_eq!(status, 200, "{body}");
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(seen["x-forwarded-proto"], "http", "{seen}");
        for gone in [
            "x-forwarded-host",
            "forwarded",
            "x-real-ip",
            "knative-serving-revision",
        ] {
            assert!(seen.get(gone).is_none(), "{gone} stripped: {seen}");
        }
    }
    assert_eq!(
        (
            public_up.served.load(std::sync::atomic::Ordering::SeqCst),
            secret_up.served.load(std::sync::atomic::Ordering::SeqCst)
        ),
        (2, 0),
        "the host routed"
    );
    h.shutdown();

    let trusted = ActivatorConfig {
        trusted_proxies: TrustedProxies::Only(vec!["127.0.0.0/8".parse().unwrap()]),
        ..Default::default()
    };
    let (mut h, public_up, secret_up) = public_and_secret(trusted).await;
    for with_body in [false, true] {
        let (status, body) = raw(h.data, &spoofing(with_body)).await;
        assert_eq!(status, 200, "{body}");
        let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(seen["x-forwarded-proto"], "https", "{seen}");
        assert_eq!(seen["x-real-ip"], "1.2.3.4", "{seen}");
    }
    assert_eq!(
        (
            public_up.served.load(std::sync::atomic::Ordering::SeqCst),
            secret_up.served.load(std::sync::atomic::Ordering::SeqCst)
        ),
        (0, 2),
        "the headers routed"
    );
    h.shutdown();
}

/// Finding 5: two Host fields, or none on HTTP/1.1, are 400 on the lane and on hyper; an
/// absolute-form target routes by its authority, which replaces Host upstream.
#[tokio::test]
async fn host_ambiguity_is_refused_and_absolute_form_routes_by_authority() {
    let (mut h, public_up, _secret) = public_and_secret(ActivatorConfig::default()).await;
    for body in ["", "Content-Length: 2\r\n\r\nhi"] {
        let end = if body.is_empty() { "\r\n" } else { body };
        let two = format!(
            "GET / HTTP/1.1\r\nHost: public.default.example.com\r\nHost: other\r\n\
Connection: close\r\n{end}"
        );
        assert_eq!(
            raw(h.data, two.as_bytes()).await.0,
            400,
            "two hosts, {body:?}"
        );
        let none = format!("GET / HTTP/1.1\r\nConnection: close\r\n{end}");
        assert_eq!(
            raw(h.data, none.as_bytes()).await.0,
            400,
            "no host, {body:?}"
        );
        let absolute = format!(
            "GET http://public.default.example.com/headers HTTP/1.1\r\nHost: wrong\r\n\
Connection: close\r\n{end}"
        );
        let (status, seen) = raw(h.data, absolute.as_bytes()).await;
        assert_eq!(status, 200, "{seen}");
        let seen: serde_json::Value = serde_json::from_str(&seen).unwrap();
        // The harness forwards as to a sidecar: the client's host travels in K-Original-Host.
        assert_eq!(
            seen["k-original-host"], "public.default.example.com",
            "{seen}"
        );
    }
    assert_eq!(
        public_up.served.load(std::sync::atomic::Ordering::SeqCst),
        2
    );
    h.shutdown();
}

/// Finding 5 on h2c: a `host` field that differs from `:authority` is 400.
#[tokio::test]
async fn an_h2c_host_that_differs_from_the_authority_is_refused() {
    let (mut h, _public, _secret) = public_and_secret(ActivatorConfig::default()).await;
    let c = h2_client();
    let req = http::Request::get(format!(
        "http://public.default.example.com:{}/headers",
        h.data.port()
    ))
    .header("host", "other.example.com")
    .body(full(""))
    .unwrap();
    // The client connects to the URI's host: point it at the activator through the authority.
    let req = {
        let (mut parts, body) = req.into_parts();
        parts.uri = format!("http://{}/headers", h.data).parse().unwrap();
        http::Request::from_parts(parts, body)
    };
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, 400, "{body}");
    h.shutdown();
}

/// An upstream that answers every request with `answer` (raw bytes) once it has read the
/// request's head and body (Content-Length or chunked up to the last chunk), and records what
/// it received.
struct RawUpstream {
    addr: std::net::SocketAddr,
    got: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl RawUpstream {
    async fn start(answer: &'static [u8]) -> Self {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let record = got.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let complete = |b: &[u8]| {
                        let Some(end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
                            return false;
                        };
                        let head = String::from_utf8_lossy(&b[..end]).to_ascii_lowercase();
                        let body = &b[end + 4..];
                        if head.contains("transfer-encoding: chunked") {
                            body.windows(5).any(|w| w == b"0\r\n\r\n")
                        } else {
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            body.len() >= len
                        }
                    };
                    while !complete(&buf) {
                        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await
                        {
                            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => return,
                        }
                    }
                    record
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&buf).into_owned());
                    let _ = s.write_all(answer).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Self { addr, got }
    }

    fn requests(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }
}

/// One revision `r` (host `r.default.example.com`) in front of `up`.
async fn in_front_of(addr: std::net::SocketAddr) -> Harness {
    let mut r = spec("r", 0);
    r.hosts = vec!["r.default.example.com".into()];
    let h = Harness::start(vec![r], ActivatorConfig::default()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![addr]);
    h
}

/// The whole raw answer to `request` on a fresh connection.
async fn raw_text(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let all = read_to_close(&mut tcp, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    String::from_utf8_lossy(&all).into_owned()
}

const POST_R: &str = "POST / HTTP/1.1\r\nHost: r.default.example.com\r\nConnection: close\r\n";

/// Finding 6: an upstream answer with both Content-Length and Transfer-Encoding reaches the
/// client whole, without the stale length (hyper's client path: a request with a body).
#[tokio::test]
async fn a_stale_content_length_next_to_transfer_encoding_is_dropped() {
    let up = RawUpstream::start(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
A\r\n0123456789\r\n0\r\n\r\n",
    )
    .await;
    let mut h = in_front_of(up.addr).await;
    let text = raw_text(
        h.data,
        format!("{POST_R}Content-Length: 2\r\n\r\nhi").as_bytes(),
    )
    .await;
    let head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(!head.contains("content-length: 5"), "{text}");
    assert!(text.contains("0123456789"), "the whole body: {text}");
    h.shutdown();
}

/// Finding 7: a malformed chunked request body is the client's error: 400, counted in
/// `thaw_activator_client_errors_total`, not in the upstream errors.
#[tokio::test]
async fn a_malformed_request_body_is_a_400_and_not_an_upstream_error() {
    let up = RawUpstream::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let mut h = in_front_of(up.addr).await;
    let text = raw_text(
        h.data,
        format!("{POST_R}Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nZZ-not-a-size\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    let metrics = h.metrics().await;
    let count = |family: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(family) && l.contains("revision=\"r\""))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.trim().to_string())
    };
    assert_eq!(
        count("thaw_activator_client_errors_total").as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        count("thaw_activator_upstream_errors_total").as_deref(),
        Some("0"),
        "{metrics}"
    );
    h.shutdown();
}

/// Finding 8: framing, Content-*, authentication and routing fields never pass as trailers; the
/// rest do (direct client and lane: a bodiless request; hyper's client and server: a body).
#[tokio::test]
async fn forbidden_trailer_fields_are_dropped() {
    let up = RawUpstream::start(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n\
2\r\nok\r\n0\r\nX-Checksum: abc\r\nContent-Length: 99\r\nSet-Cookie: s=1\r\nHost: evil\r\n\r\n",
    )
    .await;
    let mut h = in_front_of(up.addr).await;
    for request in [
        format!("{POST_R}TE: trailers\r\nContent-Length: 2\r\n\r\nhi"),
        "GET / HTTP/1.1\r\nHost: r.default.example.com\r\nTE: trailers\r\nConnection: close\r\n\r\n"
            .to_string(),
    ] {
        let text = raw_text(h.data, request.as_bytes()).await;
        let trailers = text.rsplit_once("\r\n0\r\n").map_or("", |(_, t)| t).to_ascii_lowercase();
        assert!(trailers.contains("x-checksum: abc"), "{text}");
        for gone in ["content-length", "set-cookie", "host:"] {
            assert!(!trailers.contains(gone), "{gone} in the trailers: {text}");
        }
    }
    h.shutdown();
}

/// Finding 9: CONNECT and upgrades outside `allowed-upgrades` are refused with 501; an
/// `Upgrade: h2c` request is served over HTTP/1.1 without the upgrade's fields.
#[tokio::test]
async fn connect_and_unlisted_upgrades_are_refused_and_h2c_upgrades_served_plain() {
    let up = RawUpstream::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let mut h = in_front_of(up.addr).await;
    let connect = raw_text(
        h.data,
        b"CONNECT r.default.example.com:443 HTTP/1.1\r\nHost: r.default.example.com:443\r\n\
Connection: close\r\n\r\n",
    )
    .await;
    assert!(connect.starts_with("HTTP/1.1 501"), "{connect}");
    let other = raw_text(
        h.data,
        b"GET / HTTP/1.1\r\nHost: r.default.example.com\r\nConnection: upgrade, close\r\n\
Upgrade: foo/1\r\n\r\n",
    )
    .await;
    assert!(other.starts_with("HTTP/1.1 501"), "{other}");
    let h2c = raw_text(
        h.data,
        b"GET / HTTP/1.1\r\nHost: r.default.example.com\r\n\
Connection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    )
    .await;
    assert!(h2c.starts_with("HTTP/1.1 200"), "{h2c}");
    let sent = up.requests().concat().to_ascii_lowercase();
    assert!(
        !sent.contains("upgrade") && !sent.contains("http2-settings"),
        "{sent}"
    );
    h.shutdown();
}

/// Finding 10: a head with bare-LF line ends is served alike by the lane and by hyper (both
/// parse with httparse, which accepts them as RFC 9112 §2.2 allows; SECURITY.md).
#[tokio::test]
async fn bare_lf_heads_are_served_alike_by_the_lane_and_hyper() {
    let up = RawUpstream::start(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let mut h = in_front_of(up.addr).await;
    let lane = raw_text(
        h.data,
        b"GET / HTTP/1.1\nHost: r.default.example.com\nConnection: close\n\n",
    )
    .await;
    let hyper = raw_text(
        h.data,
        b"POST / HTTP/1.1\nHost: r.default.example.com\nConnection: close\nContent-Length: 2\n\nhi",
    )
    .await;
    assert!(lane.starts_with("HTTP/1.1 200"), "{lane}");
    assert!(hyper.starts_with("HTTP/1.1 200"), "{hyper}");
    h.shutdown();
}

/// Issue 33: a request body that stalls is cut after `request-body-idle-timeout` with 408 and
/// its throttler slot freed: with containerConcurrency 1 on one endpoint, a second request is
/// served while the stalled connection is still open; the cut is counted.
#[tokio::test]
async fn a_stalled_request_body_is_cut_with_408_and_frees_its_slot() {
    let up = Upstream::start().await;
    let mut r = spec("r", 1);
    r.hosts = vec!["r.default.example.com".into()];
    let config = ActivatorConfig {
        request_body_idle_timeout: Duration::from_secs(1),
        ..ActivatorConfig::default()
    };
    let mut h = Harness::start(vec![r], config).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    // Headers and 3 of 100 bytes, then nothing.
    let mut stalled = TcpStream::connect(h.data).await.unwrap();
    stalled
        .write_all(
            b"POST /echo HTTP/1.1\r\nHost: r.default.example.com\r\nContent-Length: 100\r\n\r\nabc",
        )
        .await
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(30), read_head(&mut stalled))
        .await
        .expect("an answer to the stalled body");
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    // The slot is free: served now, the stalled client still connected.
    let text = raw_text(
        h.data,
        b"POST /echo HTTP/1.1\r\nHost: r.default.example.com\r\nConnection: close\r\n\
Content-Length: 4\r\n\r\nnext",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("next"), "{text}");
    let metrics = h.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "thaw_activator_request_body_timeouts_total 1"),
        "{metrics}"
    );
    drop(stalled);
    h.shutdown();
}
