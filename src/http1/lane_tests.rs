use super::*;
use http::header::HeaderName;

fn parsed(raw: &[u8]) -> (Parsed, BytesMut) {
    let mut buf = BytesMut::from(raw);
    let p = parse(&mut buf);
    (p, buf)
}

fn head(raw: &[u8]) -> Head {
    match parsed(raw).0 {
        Parsed::Head(h) => h,
        Parsed::Partial => panic!("partial: {}", String::from_utf8_lossy(raw)),
        Parsed::NotForLane => panic!("not for the lane: {}", String::from_utf8_lossy(raw)),
    }
}

#[test]
fn a_bodiless_request_is_taken_off_the_buffer_and_the_rest_stays() {
    let (p, rest) = parsed(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Y: z\r\n\r\nGET /next");
    let Parsed::Head(h) = p else {
        panic!("not parsed")
    };
    assert_eq!(h.req.method(), Method::GET);
    assert_eq!(h.req.uri(), "/a?b=1");
    assert_eq!(h.req.body().get("host"), Some(&b"x"[..]));
    assert_eq!(h.req.body().get("x-y"), Some(&b"z"[..]));
    assert!(h.keep_alive && !h.http10 && !h.method_head);
    assert_eq!(&rest[..], b"GET /next");
}

#[test]
fn partial_heads_wait_for_more() {
    assert!(matches!(
        parsed(b"GET / HTTP/1.1\r\nHost: x\r\n").0,
        Parsed::Partial
    ));
    assert!(matches!(parsed(b"GE").0, Parsed::Partial));
}

#[test]
fn bodies_upgrades_and_unusual_targets_go_to_hyper_untouched() {
    for raw in [
        &b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"[..],
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n",
        b"PUT / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
        b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
        // A `Connection` value the `http` crate would not read as text.
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: clöse\r\n\r\n".as_bytes(),
    ] {
        let (p, rest) = parsed(raw);
        assert!(
            matches!(p, Parsed::NotForLane),
            "{}",
            String::from_utf8_lossy(raw)
        );
        assert_eq!(&rest[..], raw, "the bytes stay for hyper");
    }
}

#[test]
fn an_explicit_zero_length_is_bodiless() {
    let h = head(b"DELETE /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(h.req.method(), Method::DELETE);
    // Repeated equal values are one length (RFC 9112 §6.3), but the upstream must get what
    // hyper would forward (one field): such a head goes to hyper (the differential tests).
    assert!(matches!(
        parsed(b"GET / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n").0,
        Parsed::NotForLane
    ));
}

#[test]
fn heads_with_more_headers_than_the_inline_spans_keep_every_field() {
    for n in [
        INLINE_SPANS - 1,
        INLINE_SPANS,
        INLINE_SPANS + 1,
        MAX_HEADERS,
    ] {
        let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..n {
            raw.extend_from_slice(format!("X-{i}: v{i}\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        let h = head(&raw);
        for i in 0..n {
            let want = format!("v{i}");
            assert_eq!(
                h.req.body().get(&format!("x-{i}")),
                Some(want.as_bytes()),
                "{n} headers, field {i}"
            );
        }
    }
}

#[test]
fn more_headers_than_slots_go_to_hyper() {
    let mut raw = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        raw.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    assert!(matches!(parsed(&raw).0, Parsed::NotForLane));
}

#[test]
fn keep_alive_follows_the_version_and_connection_tokens() {
    let ka = |raw: &[u8]| head(raw).keep_alive;
    assert!(ka(b"GET / HTTP/1.1\r\n\r\n"));
    assert!(!ka(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"));
    assert!(!ka(
        b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n"
    ));
    assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
    assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    assert!(!ka(
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"
    ));
    let h = head(b"HEAD / HTTP/1.0\r\nTE: trailers\r\n\r\n");
    assert!(h.http10 && h.method_head && h.te_trailers);
    assert_eq!(h.req.version(), Version::HTTP_10);
}

fn encoded(resp: Response<()>, exact: Option<u64>, opts: HeadOpts) -> (String, Framing, bool) {
    let (parts, ()) = resp.into_parts();
    let mut out = Vec::new();
    let (framing, keep) = encode_head(&parts, None, exact, opts, &mut out);
    (String::from_utf8(out).unwrap(), framing, keep)
}

const GET11: HeadOpts = HeadOpts {
    method_head: false,
    http10: false,
    keep_alive: true,
};

fn response(status: u16, headers: &[(&str, &str)]) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (k, v) in headers {
        r.headers_mut().append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    r
}

#[test]
fn a_known_length_is_framed_by_content_length_and_a_date_is_added() {
    let (head, framing, keep) = encoded(response(200, &[("x-a", "1")]), Some(5), GET11);
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\nx-a: 1\r\ndate: "),
        "{head}"
    );
    assert!(head.ends_with("GMT\r\ncontent-length: 5\r\n\r\n"), "{head}");
    assert_eq!(framing, Framing::Length(5));
    assert!(keep);
    // The upstream's own length and date are kept, a repeated equal length written once.
    let (head, framing, _) = encoded(
        response(
            200,
            &[
                ("content-length", "3"),
                ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ("content-length", "3"),
            ],
        ),
        None,
        GET11,
    );
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\ncontent-length: 3\r\n\r\n"
    );
    assert_eq!(framing, Framing::Length(3));
}

#[test]
fn an_unknown_length_is_chunked_for_http11_and_close_delimited_for_http10() {
    let date = ("date", "Sun, 06 Nov 1994 08:49:37 GMT");
    let (head, framing, keep) = encoded(response(200, &[date]), None, GET11);
    assert!(
        head.ends_with("transfer-encoding: chunked\r\n\r\n"),
        "{head}"
    );
    assert_eq!((framing, keep), (Framing::Chunked, true));
    let http10 = HeadOpts {
        http10: true,
        ..GET11
    };
    let (head, framing, keep) = encoded(response(200, &[date]), None, http10);
    assert!(head.ends_with("GMT\r\nconnection: close\r\n\r\n"), "{head}");
    assert_eq!((framing, keep), (Framing::Close, false));
    let (head, _, keep) = encoded(response(200, &[date]), Some(2), http10);
    assert!(head.ends_with("content-length: 2\r\nconnection: keep-alive\r\n\r\n"));
    assert!(keep);
}

#[test]
fn bodiless_answers_have_no_framing() {
    let date = ("date", "x");
    // HEAD keeps the upstream's length; an own answer's length is announced.
    let head_req = HeadOpts {
        method_head: true,
        ..GET11
    };
    let (h, f, _) = encoded(
        response(200, &[date, ("content-length", "42")]),
        None,
        head_req,
    );
    assert_eq!(
        (h.as_str(), f),
        (
            "HTTP/1.1 200 OK\r\ndate: x\r\ncontent-length: 42\r\n\r\n",
            Framing::None
        )
    );
    let (h, _, _) = encoded(response(404, &[date]), Some(9), head_req);
    assert!(h.ends_with("content-length: 9\r\n\r\n"), "{h}");
    let (h, _, _) = encoded(response(200, &[date]), Some(0), head_req);
    assert!(!h.contains("content-length"), "{h}");
    // 204 never carries a length; 304 keeps the upstream's.
    let (h, f, _) = encoded(
        response(204, &[date, ("content-length", "0")]),
        Some(0),
        GET11,
    );
    assert_eq!(
        (h.as_str(), f),
        ("HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n", Framing::None)
    );
    let (h, _, _) = encoded(response(304, &[date, ("content-length", "7")]), None, GET11);
    assert!(h.ends_with("content-length: 7\r\n\r\n"), "{h}");
}

#[test]
fn connection_close_and_hop_headers_are_the_lanes_to_write() {
    let (h, _, keep) = encoded(
        response(
            200,
            &[
                ("date", "x"),
                ("connection", "close"),
                ("transfer-encoding", "chunked"),
            ],
        ),
        Some(1),
        GET11,
    );
    assert!(!keep);
    assert_eq!(
        h,
        "HTTP/1.1 200 OK\r\ndate: x\r\ncontent-length: 1\r\nconnection: close\r\n\r\n"
    );
    let (h, _, _) = encoded(response(599, &[("date", "x")]), Some(0), GET11);
    assert!(h.starts_with("HTTP/1.1 599 \r\n"), "{h}");
}

#[test]
fn chunk_lines_are_lowercase_hex() {
    for (n, want) in [
        (0, "0\r\n"),
        (5, "5\r\n"),
        (255, "ff\r\n"),
        (0x1_0000, "10000\r\n"),
    ] {
        let mut out = Vec::new();
        chunk_line(&mut out, n);
        assert_eq!(out, want.as_bytes());
    }
}

#[test]
fn dates_are_imf_fixdates() {
    let mut d = Vec::new();
    with_date(|b| d.extend_from_slice(b));
    let s = String::from_utf8(d).unwrap();
    assert_eq!(s.len(), 29);
    assert!(s.ends_with(" GMT") && s.as_bytes()[3] == b',', "{s}");
    assert!(httpdate::parse_http_date(&s).is_ok(), "{s}");
}

/// Spare read buffers: an emptied one is reused by the next connection of the thread; one still
/// shared with other bytes is not kept; the list is bounded.
#[test]
fn spare_read_buffers_are_reused_bounded_and_never_shared() {
    SPARE.with(|s| s.borrow_mut().clear());
    let mut b = take_buf();
    assert!(b.capacity() >= READ_CHUNK);
    b.extend_from_slice(b"abc");
    b.clear();
    let at = b.as_ptr();
    give_buf(b);
    let again = take_buf();
    assert_eq!(again.as_ptr(), at, "the spare buffer was not reused");
    assert!(again.capacity() >= READ_CHUNK);

    // Shared with a frozen slice: reclaiming would need a new allocation, so it is dropped.
    let mut shared = again;
    shared.extend_from_slice(b"head");
    let head = shared.split_to(4).freeze();
    give_buf(shared);
    assert_eq!(SPARE.with(|s| s.borrow().len()), 0);
    drop(head);

    let many: Vec<BytesMut> = (0..SPARE_MAX + 10).map(|_| take_buf()).collect();
    for b in many {
        give_buf(b);
    }
    assert_eq!(SPARE.with(|s| s.borrow().len()), SPARE_MAX);
    SPARE.with(|s| s.borrow_mut().clear());
}
