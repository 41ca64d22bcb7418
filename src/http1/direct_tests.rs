//! Direct connections against a scripted raw-TCP upstream: each test states the exact bytes the
//! upstream answers, so framing, reuse and failure cases are pinned down byte for byte.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use http::{HeaderValue, Method, Request, header};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::super::fields::ClientHeaders;
use super::super::pool::{ReqBody, Upstream};
use super::{DirectBody, DirectError, ExchangeError, encode_head};

/// One scripted answer.
#[derive(Clone)]
struct Reply {
    bytes: Vec<u8>,
    /// Written one byte at a time, each its own segment.
    trickle: bool,
    /// The upstream closes the connection after writing it.
    close: bool,
}

fn reply(bytes: &[u8]) -> Reply {
    Reply {
        bytes: bytes.to_vec(),
        trickle: false,
        close: false,
    }
}

struct Scripted {
    addr: SocketAddr,
    accepted: Arc<AtomicU32>,
    /// Every request head received, in order.
    heads: Arc<std::sync::Mutex<Vec<String>>>,
}

/// An upstream answering the n-th request (over all connections) with `replies[n]` (the last
/// one again once they run out).
async fn scripted(replies: Vec<Reply>) -> Scripted {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicU32::new(0));
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let (a, h) = (accepted.clone(), heads.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            a.fetch_add(1, SeqCst);
            let (h, next, replies) = (h.clone(), next.clone(), replies.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // Read one request head.
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut chunk = [0u8; 1024];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let head: Vec<u8> = buf.drain(..end).collect();
                    h.lock().unwrap().push(String::from_utf8(head).unwrap());
                    let i = next.fetch_add(1, SeqCst).min(replies.len() - 1);
                    let r = &replies[i];
                    if r.trickle {
                        for b in &r.bytes {
                            if s.write_all(&[*b]).await.is_err() {
                                return;
                            }
                            s.flush().await.unwrap();
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    } else if s.write_all(&r.bytes).await.is_err() {
                        return;
                    }
                    if r.close {
                        return;
                    }
                }
            });
        }
    });
    Scripted {
        addr,
        accepted,
        heads,
    }
}

fn get(path: &str, host: &SocketAddr) -> Request<ReqBody> {
    let mut req = Request::new(ReqBody::Empty);
    *req.uri_mut() = path.parse().unwrap();
    req.headers_mut().insert(
        header::HOST,
        HeaderValue::from_str(&host.to_string()).unwrap(),
    );
    req
}

/// Sends one bodiless request over a direct connection to `addr` (a pooled one, else a new
/// one), as `proxy::forward` does: its head with `extra` after the request's own headers.
async fn send(
    up: &Upstream,
    req: &Request<ReqBody>,
    addr: SocketAddr,
    extra: &[(http::HeaderName, HeaderValue)],
    deadline: tokio::time::Instant,
) -> Result<http::Response<DirectBody>, ExchangeError> {
    let conn = match up.idle_direct(addr) {
        Some(conn) => conn,
        None => up.open_direct(addr).await.expect("connect"),
    };
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let fields = ClientHeaders::Map(req.headers().clone());
    let head = encode_head(req.method(), target, None, &fields, extra);
    let head_only = req.method() == Method::HEAD;
    let mut resp = conn
        .exchange(head, head_only, up.home(addr), deadline)
        .await?;
    // The fields as hyper's server would get them (`pipeline::handle`).
    let fields = resp
        .body_mut()
        .take_fields()
        .expect("a direct response has its fields");
    fields.merge_into(resp.headers_mut());
    Ok(resp)
}

/// Sends one bodiless request over a direct connection; the response and its whole body
/// (data, trailers).
async fn exchange(
    up: &Upstream,
    req: Request<ReqBody>,
    addr: SocketAddr,
) -> Result<(http::response::Parts, Vec<u8>, Option<http::HeaderMap>), String> {
    let resp = send(up, &req, addr, &[], far())
        .await
        .map_err(|e| match e {
            ExchangeError::Unsent(_, e) => format!("unsent: {e}"),
            ExchangeError::Failed(DirectError::TimedOut) => "timed out".to_string(),
            ExchangeError::Failed(e) => e.to_string(),
        })?;
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned();
    Ok((parts, collected.to_bytes().to_vec(), trailers))
}

fn pool() -> Upstream {
    Upstream::new(Duration::from_secs(2))
}

#[tokio::test]
async fn content_length_bodies_reuse_one_connection_and_the_head_is_sent_as_prepared() {
    let s = scripted(vec![reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello",
    )])
    .await;
    let up = pool();
    for _ in 0..3 {
        let mut req = get("/p?q=1", &s.addr);
        req.headers_mut()
            .insert("x-custom", HeaderValue::from_static("v"));
        let (parts, body, _) = exchange(&up, req, s.addr).await.unwrap();
        assert_eq!(parts.status, 200);
        assert_eq!(parts.headers["x-a"], "b");
        assert_eq!(parts.headers[header::CONTENT_LENGTH], "5");
        assert_eq!(body, b"hello");
    }
    assert_eq!(
        s.accepted.load(SeqCst),
        1,
        "one connection for three requests"
    );
    assert_eq!(up.pooled(s.addr).0, 1);
    let heads = s.heads.lock().unwrap().clone();
    assert_eq!(
        heads[0],
        format!(
            "GET /p?q=1 HTTP/1.1\r\nhost: {}\r\nx-custom: v\r\n\r\n",
            s.addr
        )
    );
}

#[tokio::test]
async fn chunked_bodies_decode_across_single_byte_reads_with_extensions_and_trailers() {
    let s = scripted(vec![Reply {
        bytes: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n\
                 5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
            .to_vec(),
        trickle: true,
        close: false,
    }])
    .await;
    let up = pool();
    let (parts, body, trailers) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(body, b"hello world");
    assert!(
        !parts.headers.contains_key(header::CONTENT_LENGTH),
        "Transfer-Encoding overrides Content-Length, which is dropped"
    );
    assert_eq!(trailers.unwrap()["x-trailer"], "t");
    // The connection went home and carries the next request.
    let (_, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(body, b"hello world");
    assert_eq!(s.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn chunked_without_trailers_ends_cleanly() {
    let s = scripted(vec![reply(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )])
    .await;
    let up = pool();
    let (_, body, trailers) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(body, b"abc");
    assert!(trailers.is_none());
    assert_eq!(up.pooled(s.addr).0, 1);
}

#[tokio::test]
async fn a_body_without_length_is_read_until_close_and_its_connection_is_not_reused() {
    let s = scripted(vec![Reply {
        bytes: b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nuntil the end".to_vec(),
        trickle: false,
        close: true,
    }])
    .await;
    let up = pool();
    for _ in 0..2 {
        let (_, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
        assert_eq!(body, b"until the end");
    }
    assert_eq!(s.accepted.load(SeqCst), 2);
    assert_eq!(up.pooled(s.addr).0, 0);
}

#[tokio::test]
async fn connection_close_and_http10_answers_are_not_reused() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"[..],
        &b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"[..],
    ] {
        let s = scripted(vec![reply(answer)]).await;
        let up = pool();
        let (_, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
        assert_eq!(body, b"ok");
        assert_eq!(
            up.pooled(s.addr).0,
            0,
            "{}",
            String::from_utf8_lossy(answer)
        );
    }
    // HTTP/1.0 with keep-alive may be reused.
    let s = scripted(vec![reply(
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
    )])
    .await;
    let up = pool();
    exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(up.pooled(s.addr).0, 1);
}

#[tokio::test]
async fn head_204_and_304_have_no_body_whatever_their_length_says() {
    let s = scripted(vec![
        reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"),
        reply(b"HTTP/1.1 204 No Content\r\n\r\n"),
        reply(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"),
        reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    ])
    .await;
    let up = pool();
    let mut head = get("/", &s.addr);
    *head.method_mut() = Method::HEAD;
    let (parts, body, _) = exchange(&up, head, s.addr).await.unwrap();
    assert_eq!(parts.headers[header::CONTENT_LENGTH], "10", "kept for HEAD");
    assert!(body.is_empty());
    for status in [204, 304] {
        let (parts, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
        assert_eq!(parts.status, status);
        assert!(body.is_empty());
    }
    // Nothing was left unread: the same connection answers the next request correctly.
    let (_, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(body, b"ok");
    assert_eq!(s.accepted.load(SeqCst), 1);
}

#[tokio::test]
async fn interim_answers_are_skipped() {
    let s = scripted(vec![reply(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )])
    .await;
    let up = pool();
    let (parts, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(parts.status, 200);
    assert!(!parts.headers.contains_key(header::LINK));
    assert_eq!(body, b"ok");
}

#[tokio::test]
async fn many_headers_take_the_larger_parse() {
    let mut answer = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..60 {
        answer.extend_from_slice(format!("x-h{i}: {i}\r\n").as_bytes());
    }
    answer.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
    let s = scripted(vec![reply(&answer)]).await;
    let up = pool();
    let (parts, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(parts.headers.len(), 61);
    assert_eq!(parts.headers["x-h59"], "59");
    assert_eq!(body, b"ok");
}

#[tokio::test]
async fn invalid_answers_are_errors_naming_what_is_wrong() {
    let mut too_many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..200 {
        too_many.extend_from_slice(format!("x-h{i}: {i}\r\n").as_bytes());
    }
    too_many.extend_from_slice(b"\r\n");
    let mut too_large = b"HTTP/1.1 200 OK\r\nX-Big: ".to_vec();
    too_large.extend(std::iter::repeat_n(b'a', super::MAX_HEAD_BYTES + 10));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok".to_vec(),
            "conflicting Content-Length",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n".to_vec(),
            "invalid Content-Length",
        ),
        (
            b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
            "malformed response head",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec(),
            "101",
        ),
        (too_many, "too many response headers"),
        (too_large, "response head too large"),
    ];
    for (answer, want) in cases {
        let s = scripted(vec![reply(&answer)]).await;
        let up = pool();
        let err = exchange(&up, get("/", &s.addr), s.addr).await.unwrap_err();
        assert!(err.contains(want), "{err} (wanted {want})");
        assert_eq!(up.pooled(s.addr).0, 0);
    }
}

#[tokio::test]
async fn an_upstream_that_closes_early_fails_the_head_or_the_body() {
    let s = scripted(vec![Reply {
        bytes: b"HTTP/1.1 200 OK\r\nContent-Le".to_vec(),
        trickle: false,
        close: true,
    }])
    .await;
    let err = exchange(&pool(), get("/", &s.addr), s.addr)
        .await
        .unwrap_err();
    assert!(err.contains("before a complete response head"), "{err}");

    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"[..],
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"[..],
    ] {
        let s = scripted(vec![Reply {
            bytes: answer.to_vec(),
            trickle: false,
            close: true,
        }])
        .await;
        let up = pool();
        let err = exchange(&up, get("/", &s.addr), s.addr).await.unwrap_err();
        assert!(err.contains("mid-body"), "{err}");
        assert_eq!(up.pooled(s.addr).0, 0);
    }
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_not_used_again() {
    // The upstream closes after answering, without saying so in the head.
    let s = scripted(vec![Reply {
        bytes: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        trickle: false,
        close: true,
    }])
    .await;
    let up = pool();
    exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(up.pooled(s.addr).0, 1, "looked reusable when it came back");
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The next request notices the close at checkout and opens a new connection.
    let (_, body, _) = exchange(&up, get("/", &s.addr), s.addr).await.unwrap();
    assert_eq!(body, b"ok");
    assert_eq!(s.accepted.load(SeqCst), 2);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_the_connection() {
    let s = scripted(vec![reply(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123",
    )])
    .await;
    let up = pool();
    let resp = send(&up, &get("/", &s.addr), s.addr, &[], far())
        .await
        .unwrap();
    drop(resp);
    assert_eq!(up.pooled(s.addr).0, 0);
}

#[tokio::test]
async fn extra_headers_follow_the_requests_own() {
    let s = scripted(vec![reply(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")]).await;
    let up = pool();
    let extra = [
        (
            http::HeaderName::from_static("k-proxy-request"),
            HeaderValue::from_static("activator"),
        ),
        (
            http::HeaderName::from_static("x-forwarded-for"),
            HeaderValue::from_static("10.0.0.1"),
        ),
    ];
    let resp = send(&up, &get("/x", &s.addr), s.addr, &extra, far())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        s.heads.lock().unwrap()[0],
        format!(
            "GET /x HTTP/1.1\r\nhost: {}\r\nk-proxy-request: activator\r\nx-forwarded-for: 10.0.0.1\r\n\r\n",
            s.addr
        )
    );
}

/// The response-start timer lives with the connection: pushed later for each request (no
/// re-registration), re-registered when a request's deadline is earlier. Either way a silent
/// upstream is cut at that request's own deadline, never at an earlier request's.
#[tokio::test]
async fn the_response_start_deadline_is_each_requests_own_on_a_reused_connection() {
    let ok = reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    let s = scripted(vec![ok.clone(), reply(b""), ok, reply(b"")]).await;
    let up = pool();
    let send = |deadline: Duration| {
        let up = &up;
        let addr = s.addr;
        async move {
            let started = tokio::time::Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(20),
                send(up, &get("/", &addr), addr, &[], started + deadline),
            )
            .await
            .expect("cut by its deadline, not left hanging");
            (r, started.elapsed())
        }
    };
    // 1: answered; the connection goes home with its timer armed 100 ms out.
    let (r, _) = send(Duration::from_millis(100)).await;
    let body = r
        .ok()
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"ok");
    // 2: a later deadline (the timer is pushed, not re-registered): the silent upstream is cut
    // at this request's 400 ms, not the first request's 100 ms.
    let (r, waited) = send(Duration::from_millis(400)).await;
    assert!(matches!(
        r,
        Err(ExchangeError::Failed(DirectError::TimedOut))
    ));
    assert!(waited >= Duration::from_millis(390), "{waited:?}");
    // The cut connection was not reused: a fresh one answers, then an earlier deadline than
    // its timer had (re-registered) still cuts.
    let (r, _) = send(Duration::from_secs(30)).await;
    r.ok().unwrap().into_body().collect().await.unwrap();
    let (r, waited) = send(Duration::from_millis(50)).await;
    assert!(matches!(
        r,
        Err(ExchangeError::Failed(DirectError::TimedOut))
    ));
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    assert_eq!(s.accepted.load(SeqCst), 2);
}

/// A response-start deadline no test reaches.
fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(60)
}

/// `Content-Length` merging: the digits-only fast path and the general one (lists, spaces,
/// overflow) give the same answers.
#[test]
fn content_length_values_merge_or_are_refused() {
    use super::ContentLength;
    let merged = |values: &[&'static str]| {
        let mut cl = ContentLength::default();
        for v in values {
            cl.add(v.as_bytes());
        }
        cl.get()
    };
    assert_eq!(merged(&[]), Ok(None));
    assert_eq!(merged(&["3"]), Ok(Some(3)));
    assert_eq!(merged(&["007"]), Ok(Some(7)));
    assert_eq!(merged(&["3", "3"]), Ok(Some(3)));
    assert_eq!(merged(&["3, 3"]), Ok(Some(3)));
    assert_eq!(merged(&["3 , 3"]), Ok(Some(3)));
    assert_eq!(merged(&["18446744073709551615"]), Ok(Some(u64::MAX)));
    assert_eq!(
        merged(&["9999999999999999999"]),
        Ok(Some(9_999_999_999_999_999_999))
    );
    let conflict = Err("conflicting Content-Length values");
    assert_eq!(merged(&["3", "4"]), conflict);
    assert_eq!(merged(&["3,4"]), conflict);
    assert_eq!(merged(&["4", "3, 3"]), conflict);
    let invalid = Err("invalid Content-Length");
    for bad in ["", "-1", "+3", "3a", "0x10", "3,", "18446744073709551616"] {
        assert_eq!(merged(&[bad]), invalid, "{bad:?}");
    }
    // The first problem stands.
    assert_eq!(merged(&["x", "3"]), invalid);
    assert_eq!(merged(&["3", "4", "x"]), conflict);
}

/// A response's fields, kept raw, give the client what the map path gave: the map built from
/// the head, hop-by-hop headers stripped (`fields::strip_hop_by_hop`), `Content-Length`
/// dropped under `Transfer-Encoding`, the request id added when the upstream sent none.
#[test]
fn raw_response_fields_match_the_map_path() {
    use super::super::fields::Known;
    use super::super::fields::{X_REQUEST_ID, strip_hop_by_hop};
    use super::{Parsed, framing, parse_head};
    let heads = [
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: a\r\nConnection: X-A, close\r\nX-A: 1\r\n\
         Keep-Alive: t=1\r\nX-B: 2\r\nx-b: 3\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n\
         Trailer: X-T\r\nUpgrade: h2c\r\nTE: trailers\r\n\r\n",
        "HTTP/1.1 404 Not Found\r\nX-Request-Id: up\r\nProxy-Connection: x\r\n\
         Content-Length: 1\r\n\r\n",
        "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nServer-Timing: a\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nTE: gzip\r\nX-Latin: café\r\n\r\n",
    ];
    for head in heads {
        let id = HeaderValue::from_static("generated");
        let mut buf = bytes::BytesMut::from(head.as_bytes());
        let Ok(Some(Parsed::Final(resp, _, seen, mut fields))) = parse_head(&mut buf) else {
            panic!("{head} parses");
        };
        framing(resp.status(), &mut fields, false, seen).unwrap();
        if !fields.has(Known::RequestId) {
            fields.echo_request_id(id.clone());
        }
        let mut raw = http::HeaderMap::new();
        fields.merge_into(&mut raw);

        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut parsed = httparse::Response::new(&mut slots);
        parsed.parse(head.as_bytes()).unwrap();
        let mut map = http::HeaderMap::new();
        for h in parsed.headers.iter() {
            map.append(
                http::HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(h.value).unwrap(),
            );
        }
        let chunked_or_coded = map.contains_key(header::TRANSFER_ENCODING);
        let no_body = matches!(resp.status().as_u16(), 204 | 304);
        strip_hop_by_hop(&mut map, false);
        if chunked_or_coded && !no_body {
            map.remove(header::CONTENT_LENGTH);
        }
        map.entry(X_REQUEST_ID).or_insert(id);
        assert_eq!(raw, map, "{head}");
    }
}
