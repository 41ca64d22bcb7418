//! The HTTP/1 fast lane on raw TCP: what goes over the wire for pipelining, HTTP/1.0, HEAD,
//! bodies of unknown length, heads in pieces, and the hand-over to hyper in the middle of a
//! connection (`src/activator/lane.rs`).

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use thaw::config::ActivatorConfig;
use thaw::revision::RevisionKey;

use crate::harness::*;

const ROUTE: &str =
    "Host: x\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: r\r\n";

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\n{ROUTE}{extra}\r\n").into_bytes()
}

/// One response read off a connection: its head, its body, and how the body was framed.
#[derive(Debug)]
struct Resp {
    head: String,
    body: Vec<u8>,
}

impl Resp {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Reads responses off one connection, keeping bytes past the current one for the next.
struct Reader {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            buf: Vec::new(),
        }
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk))
            .await
            .expect("no bytes within 10 s")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    async fn take_until(&mut self, pat: &[u8]) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf.windows(pat.len()).position(|w| w == pat) {
                let out = self.buf[..i].to_vec();
                self.buf.drain(..i + pat.len());
                return out;
            }
            assert!(self.fill().await > 0, "closed early: {:?}", self.buf);
        }
    }

    async fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill().await > 0, "closed early");
        }
        self.buf.drain(..n).collect()
    }

    /// One response; `head_request` for an answer to HEAD (no body whatever the head says).
    async fn response(&mut self, head_request: bool) -> Resp {
        let head = String::from_utf8(self.take_until(b"\r\n\r\n").await).unwrap();
        let mut r = Resp {
            head,
            body: Vec::new(),
        };
        if head_request || matches!(r.status(), 204 | 304) {
            return r;
        }
        if let Some(n) = r.header("content-length") {
            r.body = self.take(n.parse().unwrap()).await;
        } else if r.header("transfer-encoding").as_deref() == Some("chunked") {
            loop {
                let line = String::from_utf8(self.take_until(b"\r\n").await).unwrap();
                let size = usize::from_str_radix(&line, 16).unwrap();
                if size == 0 {
                    assert_eq!(self.take(2).await, b"\r\n");
                    break;
                }
                r.body.extend(self.take(size).await);
                assert_eq!(self.take(2).await, b"\r\n");
            }
        } else {
            while self.fill().await > 0 {}
            r.body = std::mem::take(&mut self.buf);
        }
        r
    }

    async fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 64];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk)).await,
            Ok(Ok(0) | Err(_))
        )
    }
}

async fn setup() -> (Upstream, Harness, Reader) {
    let up = Upstream::start().await;
    let h = Harness::start(vec![spec("r", 0)], ActivatorConfig::default()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up.addr]);
    let tcp = TcpStream::connect(h.data).await.unwrap();
    (up, h, Reader::new(tcp))
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_up, mut h, mut c) = setup().await;
    let mut two = get("/slow?ms=100", "");
    two.extend(get("/", ""));
    c.tcp.write_all(&two).await.unwrap();
    let first = c.response(false).await;
    let second = c.response(false).await;
    assert_eq!(first.status(), 200);
    assert!(String::from_utf8_lossy(&first.body).starts_with("slow from"));
    assert!(String::from_utf8_lossy(&second.body).starts_with("hello from"));
    assert!(first.header("date").is_some(), "{}", first.head);
    h.shutdown();
}

#[tokio::test]
async fn a_request_with_a_body_goes_to_hyper_mid_connection_with_the_bytes_read() {
    let (_up, mut h, mut c) = setup().await;
    // A lane request, then a POST pipelined behind it in the same write: the lane has read
    // part of the POST when it hands the connection over.
    let mut bytes = get("/", "");
    bytes.extend(
        format!("POST /echo HTTP/1.1\r\n{ROUTE}Content-Length: 11\r\n\r\nhello world").bytes(),
    );
    c.tcp.write_all(&bytes).await.unwrap();
    assert!(String::from_utf8_lossy(&c.response(false).await.body).starts_with("hello from"));
    let echoed = c.response(false).await;
    assert_eq!(
        (echoed.status(), &echoed.body[..]),
        (200, &b"hello world"[..])
    );
    // hyper keeps serving the connection.
    c.tcp.write_all(&get("/", "")).await.unwrap();
    assert_eq!(c.response(false).await.status(), 200);
    h.shutdown();
}

#[tokio::test]
async fn http10_keeps_the_connection_only_when_asked() {
    let (_up, mut h, mut c) = setup().await;
    let req10 = |extra: &str| format!("GET / HTTP/1.0\r\n{ROUTE}{extra}\r\n").into_bytes();
    c.tcp
        .write_all(&req10("Connection: keep-alive\r\n"))
        .await
        .unwrap();
    let r = c.response(false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("connection").as_deref(), Some("keep-alive"));
    c.tcp.write_all(&req10("")).await.unwrap();
    let r = c.response(false).await;
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    assert!(c.closed().await, "HTTP/1.0 without keep-alive closes");
    h.shutdown();
}

#[tokio::test]
async fn client_connection_close_closes_after_the_response() {
    let (_up, mut h, mut c) = setup().await;
    c.tcp
        .write_all(&get("/", "Connection: close\r\n"))
        .await
        .unwrap();
    let r = c.response(false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    assert!(c.closed().await);
    h.shutdown();
}

#[tokio::test]
async fn head_answers_carry_the_length_and_no_body() {
    let (_up, mut h, mut c) = setup().await;
    c.tcp
        .write_all(format!("HEAD / HTTP/1.1\r\n{ROUTE}\r\n").as_bytes())
        .await
        .unwrap();
    let r = c.response(true).await;
    assert_eq!(r.status(), 200);
    assert!(r.header("content-length").is_some(), "{}", r.head);
    // No stray body bytes: the next response starts right after the head.
    c.tcp.write_all(&get("/", "")).await.unwrap();
    let next = c.response(false).await;
    assert!(String::from_utf8_lossy(&next.body).starts_with("hello from"));
    h.shutdown();
}

#[tokio::test]
async fn a_body_of_unknown_length_is_chunked_and_streamed() {
    let (up, mut h, mut c) = setup().await;
    let chunks = up.next_stream();
    c.tcp.write_all(&get("/stream", "")).await.unwrap();
    chunks
        .send(Ok(Bytes::from_static(b"hello ")))
        .await
        .unwrap();
    // The first chunk reaches the client before the body ends.
    let head = String::from_utf8(c.take_until_head().await).unwrap();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert_eq!(c.take_until(b"\r\n").await, b"6");
    assert_eq!(c.take(8).await, b"hello \r\n");
    chunks.send(Ok(Bytes::from_static(b"world"))).await.unwrap();
    drop(chunks);
    assert_eq!(c.take_until(b"\r\n0\r\n\r\n").await, b"5\r\nworld");
    // Still kept alive.
    c.tcp.write_all(&get("/", "")).await.unwrap();
    assert_eq!(c.response(false).await.status(), 200);
    h.shutdown();
}

#[tokio::test]
async fn a_body_of_unknown_length_to_http10_ends_with_the_connection() {
    let (up, mut h, mut c) = setup().await;
    let chunks = up.next_stream();
    chunks.send(Ok(Bytes::from_static(b"all "))).await.unwrap();
    chunks.send(Ok(Bytes::from_static(b"of it"))).await.unwrap();
    drop(chunks);
    c.tcp
        .write_all(
            format!("GET /stream HTTP/1.0\r\n{ROUTE}Connection: keep-alive\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let r = c.response(false).await;
    assert_eq!(
        r.header("connection").as_deref(),
        Some("close"),
        "{}",
        r.head
    );
    assert_eq!(r.body, b"all of it");
    h.shutdown();
}

#[tokio::test]
async fn an_upstream_dying_mid_body_truncates_the_chunked_response() {
    let (_up, mut h, mut c) = setup().await;
    c.tcp.write_all(&get("/die", "")).await.unwrap();
    let head = String::from_utf8(c.take_until_head().await).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // "partial" arrives, then the connection closes without the last chunk.
    assert_eq!(c.take_until(b"\r\n").await, b"7");
    assert_eq!(c.take(9).await, b"partial\r\n");
    assert!(c.closed().await);
    assert!(c.buf.is_empty(), "no terminating chunk: {:?}", c.buf);
    h.shutdown();
}

#[tokio::test]
async fn a_head_in_pieces_is_served() {
    let (_up, mut h, mut c) = setup().await;
    let req = get("/", "X-Pad: 1\r\n");
    for part in req.chunks(7) {
        c.tcp.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(c.response(false).await.status(), 200);
    h.shutdown();
}

#[tokio::test]
async fn own_answers_are_framed_and_dated() {
    let (_up, mut h, mut c) = setup().await;
    c.tcp
        .write_all(b"GET / HTTP/1.1\r\nHost: nowhere.example.com\r\n\r\n")
        .await
        .unwrap();
    let r = c.response(false).await;
    assert_eq!(r.status(), 404);
    assert!(r.header("date").is_some(), "{}", r.head);
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string()),
        "{}",
        r.head
    );
    h.shutdown();
}

#[tokio::test]
async fn a_malformed_head_is_answered_by_hyper() {
    let (_up, mut h, mut c) = setup().await;
    c.tcp
        .write_all(b"GET / HTTP/1.1\r\nBad Header Name: x\r\n\r\n")
        .await
        .unwrap();
    let r = c.response(false).await;
    assert_eq!(r.status(), 400, "{}", r.head);
    h.shutdown();
}

impl Reader {
    async fn take_until_head(&mut self) -> Vec<u8> {
        self.take_until(b"\r\n\r\n").await
    }
}

#[tokio::test]
async fn a_large_streamed_body_arrives_whole_in_order() {
    let (up, mut h, mut c) = setup().await;
    let chunks = up.next_stream();
    c.tcp.write_all(&get("/stream", "")).await.unwrap();
    // 1 MiB in 256 chunks of 4 KiB, each chunk filled with its own index: the lane writes
    // many ready frames at once, in bounded batches, and large reads as they come.
    let sender = tokio::spawn(async move {
        for i in 0..256u32 {
            let chunk = Bytes::from(vec![(i % 251) as u8; 4096]);
            chunks.send(Ok(chunk)).await.unwrap();
        }
    });
    let r = c.response(false).await;
    sender.await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.body.len(), 256 * 4096);
    for (i, block) in r.body.chunks(4096).enumerate() {
        assert!(
            block.iter().all(|&b| b == (i % 251) as u8),
            "block {i} out of order"
        );
    }
    h.shutdown();
}

/// An upstream that answers every request with the same raw head: hop-by-hop fields, a field
/// its `Connection` names, mixed-case names, its own `Date`, and its own `X-Request-Id` when the
/// path is `/own-id`.
async fn raw_upstream() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut r = Reader::new(tcp);
                loop {
                    let head = String::from_utf8(r.take_until_head().await).unwrap();
                    let own_id = head.starts_with("GET /own-id ");
                    let id = if own_id {
                        "X-Request-Id: from-upstream\r\n"
                    } else {
                        ""
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                         Connection: X-Secret, keep-alive\r\nX-Secret: 1\r\n\
                         Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n{id}\
                         Date: Tue, 01 Jan 2030 00:00:00 GMT\r\nServer-Timing: app;dur=1\r\n\
                         Content-Length: 2\r\n\r\nok"
                    );
                    if r.tcp.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn count(head: &str, name: &str) -> usize {
    head.lines()
        .skip(1)
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.eq_ignore_ascii_case(name))
        })
        .count()
}

/// A direct upstream's response fields reach the client without a header map in between
/// (`fields::UpstreamFields`): hop-by-hop ones and those `Connection` names are left out, the
/// rest keep their spelling, one `Date` and one `X-Request-Id` (the upstream's if it sent one).
#[tokio::test]
async fn upstream_response_fields_pass_through_without_hop_by_hop_ones() {
    let up = raw_upstream().await;
    let mut h = Harness::start(vec![spec("r", 0)], ActivatorConfig::default()).await;
    h.endpoints
        .set_ready(&RevisionKey::new("default", "r"), vec![up]);
    let mut c = Reader::new(TcpStream::connect(h.data).await.unwrap());
    for (path, own_id) in [("/own-id", true), ("/", false), ("/own-id", true)] {
        c.tcp.write_all(&get(path, "")).await.unwrap();
        let r = c.response(false).await;
        assert_eq!((r.status(), &r.body[..]), (200, &b"ok"[..]), "{}", r.head);
        assert!(
            r.head.contains("\r\nContent-Type: text/plain\r\n"),
            "{}",
            r.head
        );
        assert!(
            r.head.contains("\r\nServer-Timing: app;dur=1\r\n"),
            "{}",
            r.head
        );
        for gone in ["x-secret", "keep-alive", "proxy-connection"] {
            assert_eq!(count(&r.head, gone), 0, "{gone} in {}", r.head);
        }
        // The lane's own `Connection` only: none on a kept-alive HTTP/1.1 answer.
        assert_eq!(count(&r.head, "connection"), 0, "{}", r.head);
        assert_eq!(count(&r.head, "date"), 1, "{}", r.head);
        assert_eq!(r.header("date").unwrap(), "Tue, 01 Jan 2030 00:00:00 GMT");
        assert_eq!(count(&r.head, "content-length"), 1, "{}", r.head);
        assert_eq!(count(&r.head, "x-request-id"), 1, "{}", r.head);
        let id = r.header("x-request-id").unwrap();
        if own_id {
            assert_eq!(id, "from-upstream");
        } else {
            assert_eq!(id.len(), 36, "a generated id: {id}");
        }
    }

    // hyper's server (here h2c) gets the same fields merged into the response's map.
    let rev = RevisionKey::new("default", "r");
    for (path, own_id) in [("/own-id", true), ("/", false)] {
        let (status, headers, body) = send(&h2_client(), h.get(&rev, path)).await;
        assert_eq!((status.as_u16(), body.as_str()), (200, "ok"));
        assert_eq!(headers["content-type"], "text/plain");
        assert_eq!(headers["server-timing"], "app;dur=1");
        assert_eq!(headers["date"], "Tue, 01 Jan 2030 00:00:00 GMT");
        for gone in ["x-secret", "keep-alive", "proxy-connection", "connection"] {
            assert!(!headers.contains_key(gone), "{gone} in {headers:?}");
        }
        let ids: Vec<_> = headers.get_all("x-request-id").iter().collect();
        assert_eq!(ids.len(), 1, "{headers:?}");
        assert_eq!(ids[0] == "from-upstream", own_id, "{headers:?}");
    }
    h.shutdown();
}
