//! Both forms of a request's fields give the same answers (the module's contract).

use std::net::IpAddr;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use crate::activator::headers::NextHop;
use crate::activator::routing::FieldRef;

/// A head parsed by httparse as the lane parses it, in both forms.
fn both(head: &str) -> (ClientHeaders, ClientHeaders) {
    let head = Bytes::copy_from_slice(head.as_bytes());
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut slots);
    assert!(req.parse(&head).unwrap().is_complete(), "test head parses");
    let base = head.as_ptr() as usize;
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start as u32, (start + s.len()) as u32)
    };
    let mut spans = Vec::new();
    let mut map = HeaderMap::new();
    for h in req.headers.iter() {
        spans.push((at(h.name.as_bytes()), at(h.value)));
        map.append(
            HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(h.value).unwrap(),
        );
    }
    (
        ClientHeaders::Map(map),
        ClientHeaders::Raw(RawFields::new(head.clone(), &spans)),
    )
}

fn bytes(f: Option<FieldRef<'_>>) -> Option<Vec<u8>> {
    f.map(|v| v.as_bytes().to_vec())
}

/// The fields written upstream, lower-cased and sorted (the raw form keeps wire order and the
/// client's spelling; the map groups by name).
fn written(h: &ClientHeaders) -> Vec<String> {
    let mut out = Vec::new();
    h.write_fields(&mut out);
    assert_eq!(out.len(), h.encoded_len(), "encoded_len is exact");
    let text = String::from_utf8(out).unwrap();
    let mut lines: Vec<String> = text
        .split_terminator("\r\n")
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            format!("{}: {v}", n.to_ascii_lowercase())
        })
        .collect();
    lines.sort();
    lines
}

const HEADS: &[&str] = &[
    "GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
    "GET / HTTP/1.1\r\nhost: a\r\nUser-Agent: kube-probe/1.30\r\nX-Request-Id: abc\r\n\r\n",
    // Knative's routing headers, a spoofed K-Proxy-Request and K-Original-Host, a probe hash.
    "GET /x?y=1 HTTP/1.1\r\nHOST: a\r\nKnative-Serving-Namespace: ns\r\n\
     knative-serving-revision: r\r\nK-Proxy-Request: me\r\nK-Original-Host: b\r\n\
     K-Network-Hash: h\r\nK-Network-Probe: probe\r\nk-kubelet-probe: 1\r\ntraceparent: t\r\n\r\n",
    // Hop-by-hop headers, and headers that Connection names (one before, one after it).
    "GET / HTTP/1.1\r\nHost: a\r\nX-Gone: 1\r\nConnection: keep-alive, X-Gone, x-also\r\n\
     Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTrailer: x\r\nX-Also: 2\r\n\
     X-Stays: 3\r\n\r\n",
    // TE: only a first `trailers` passes.
    "GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: a\r\nTE: gzip\r\nTE: trailers\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: a\r\nConnection: TE\r\nTE: trailers\r\n\r\n",
    // X-Forwarded-For over several fields, X-Forwarded-Proto kept; X-Forwarded-Proto named by
    // Connection is dropped and replaced.
    "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2 \r\n\
     X-Forwarded-Proto: https\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: https\r\nConnection: x-forwarded-proto\r\n\r\n",
    // Duplicates: the first value of each name is seen.
    "GET / HTTP/1.1\r\nHost: first\r\nHost: second\r\nX-Request-Id: 1\r\nX-Request-Id: 2\r\n\r\n",
    // A websocket upgrade (the lane hands these to hyper, but the forms still agree).
    "GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
     Sec-WebSocket-Key: k\r\n\r\n",
    "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\n",
    // No Host at all, odd spacing and an obs-text value.
    "GET / HTTP/1.0\r\nAccept:text/html\r\nX-Odd:   spaced out   \r\nX-Latin: café\r\n\r\n",
    // A mesh identity, twice (kept only from the activator's own sidecar).
    "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Client-Cert: By=spiffe://c/ns/a/sa/b;URI=u\r\n\
     x-forwarded-client-cert: second\r\nX-Stays: 1\r\n\r\n",
];

#[test]
fn raw_fields_read_like_a_map() {
    for head in HEADS {
        let (map, raw) = both(head);
        let (m, r) = (map.view().scan(), raw.view().scan());
        assert_eq!(bytes(m.host), bytes(r.host), "{head}");
        assert_eq!(bytes(m.user_agent), bytes(r.user_agent), "{head}");
        assert_eq!(m.kubelet_probe, r.kubelet_probe, "{head}");
        assert_eq!(bytes(m.network_probe), bytes(r.network_probe), "{head}");
        assert_eq!(bytes(m.network_hash), bytes(r.network_hash), "{head}");
        assert_eq!(bytes(m.namespace), bytes(r.namespace), "{head}");
        assert_eq!(bytes(m.revision), bytes(r.revision), "{head}");
        assert_eq!(bytes(m.request_id), bytes(r.request_id), "{head}");
        assert_eq!(bytes(m.client_cert), bytes(r.client_cert), "{head}");
        assert_eq!(m.client_cert_count, r.client_cert_count, "{head}");
        let to_value = |f: Option<FieldRef<'_>>| f.and_then(FieldRef::to_value);
        assert_eq!(to_value(m.host), to_value(r.host), "{head}");
        let to_str = |f: Option<FieldRef<'_>>| f.and_then(FieldRef::to_str).map(str::to_owned);
        assert_eq!(to_str(m.host), to_str(r.host), "{head}");
        assert_eq!(map.view().is_upgrade(), raw.view().is_upgrade(), "{head}");
        for (count, bytes) in [(100, 8192), (2, 8192), (100, 20), (0, 0)] {
            assert_eq!(
                map.view().check_limits(count, bytes),
                raw.view().check_limits(count, bytes),
                "{head} limits {count}/{bytes}"
            );
        }
    }
    let (_, raw) = both(HEADS[1]);
    let ClientHeaders::Raw(raw) = raw else {
        unreachable!()
    };
    assert_eq!(raw.get("x-request-id"), Some(&b"abc"[..]));
    assert_eq!(raw.get("X-REQUEST-ID"), Some(&b"abc"[..]));
    assert_eq!(raw.get("accept"), None);
    assert_eq!(raw.len(), 3);
}

#[test]
fn raw_fields_are_forwarded_like_a_map() {
    let client: Option<IpAddr> = Some([127, 0, 0, 2].into());
    let cases = [false, true].into_iter().flat_map(|upgrade| {
        [client, None].into_iter().flat_map(move |client| {
            [NextHop::Sidecar, NextHop::Container]
                .into_iter()
                .flat_map(move |hop| {
                    [(true, false), (false, false), (true, true)]
                        .map(move |(trusted, cert)| (upgrade, client, hop, trusted, cert))
                })
        })
    });
    for head in HEADS {
        for (upgrade, client, hop, trusted, cert) in cases.clone() {
            {
                let (mut map, mut raw) = both(head);
                let host = map.view().scan().host.and_then(FieldRef::to_value);
                let added_map = map.prepare(hop, host.clone(), client, upgrade, trusted, cert);
                let added_raw = raw.prepare(hop, host, client, upgrade, trusted, cert);
                let what = format!(
                    "{head} upgrade={upgrade} client={client:?} {hop:?} trusted={trusted} cert={cert}"
                );
                // What the upstream receives: the kept fields and the additions.
                let sent = |h: &ClientHeaders, added: &Additions| {
                    let mut lines = written(h);
                    lines.extend(
                        added
                            .iter()
                            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())),
                    );
                    lines.sort();
                    lines
                };
                assert_eq!(sent(&map, &added_map), sent(&raw, &added_raw), "{what}");
                let (mut m, mut r) = (map.into_map(), raw.into_map());
                m.extend(added_map);
                r.extend(added_raw);
                assert_eq!(m, r, "{what}");
            }
        }
    }
}

#[test]
fn forwarding_removes_hop_by_hop_and_routing_headers_and_keeps_the_rest() {
    let client = Some([127, 0, 0, 2].into());
    let (_, mut raw) = both(HEADS[3]);
    raw.prepare(NextHop::Sidecar, None, client, false, true, false);
    // `Trailer` is end to end (RFC 9110 §7.6.1 no longer lists it as hop-by-hop).
    assert_eq!(
        written(&raw),
        ["trailer: x", "x-stays: 3"].map(String::from).to_vec()
    );
    let (_, mut raw) = both(HEADS[2]);
    let added = raw.prepare(
        NextHop::Sidecar,
        Some(HeaderValue::from_static("a")),
        client,
        false,
        true,
        false,
    );
    assert_eq!(
        written(&raw),
        [
            "k-kubelet-probe: 1",
            "k-network-probe: probe",
            "traceparent: t"
        ]
        .map(String::from)
        .to_vec()
    );
    let added: Vec<(String, String)> = added
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    let expected = [
        ("k-proxy-request", "activator"),
        ("k-original-host", "a"),
        ("x-forwarded-for", "127.0.0.2"),
        ("x-forwarded-proto", "http"),
    ];
    assert_eq!(added, expected.map(|(n, v)| (n.into(), v.into())).to_vec());
    // To the container itself: neither sidecar header is added, and the client's are still
    // removed.
    let (_, mut raw) = both(
        "GET / HTTP/1.1\r\nHost: a\r\nK-Proxy-Request: x\r\nK-Original-Host: y\r\nX-Stays: 1\r\n\r\n",
    );
    let added = raw.prepare(
        NextHop::Container,
        Some(HeaderValue::from_static("a")),
        client,
        false,
        true,
        false,
    );
    assert_eq!(written(&raw), ["x-stays: 1"].map(String::from).to_vec());
    let names: Vec<&str> = added.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["x-forwarded-for", "x-forwarded-proto"]);
    // Every earlier X-Forwarded-For value is kept, in order.
    let (_, mut raw) = both(HEADS[7]);
    let added = raw.prepare(NextHop::Sidecar, None, client, false, true, false);
    let xff = added.iter().find(|(n, _)| n == X_FORWARDED_FOR).unwrap();
    assert_eq!(xff.1, "10.0.0.1, 10.0.0.2, 127.0.0.2");
    assert!(added.iter().all(|(n, _)| n != X_FORWARDED_PROTO));
    // The client's spelling and order of names reach the upstream.
    let (_, mut raw) = both("GET / HTTP/1.1\r\nHost: a\r\nX-B: 1\r\nx-a: 2\r\nX-B: 3\r\n\r\n");
    raw.prepare(NextHop::Sidecar, None, client, false, true, false);
    let mut out = Vec::new();
    raw.write_fields(&mut out);
    assert_eq!(out, b"X-B: 1\r\nx-a: 2\r\nX-B: 3\r\n");
    // A mesh identity goes on only when the activator's own sidecar wrote it.
    for keep in [false, true] {
        let (_, mut raw) = both(HEADS[13]);
        raw.prepare(NextHop::Sidecar, None, client, false, true, keep);
        let certs = written(&raw)
            .iter()
            .filter(|l| l.starts_with("x-forwarded-client-cert"))
            .count();
        assert_eq!(certs, if keep { 2 } else { 0 });
    }
}
