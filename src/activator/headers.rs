//! Header hygiene for forwarding (Knative's `pkg/http/header`): hop-by-hop headers, Knative's
//! routing and proxy headers, `X-Forwarded-*`, request ids, and the configured header limits.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use rand::RngExt;

use crate::http1::fields::present;
pub use crate::http1::fields::{X_REQUEST_ID, check_limits, is_upgrade, strip_hop_by_hop};
use crate::revision::Protocol;

/// Set by the ingress: the revision's namespace (removed before forwarding).
pub const KNATIVE_SERVING_NAMESPACE: HeaderName =
    HeaderName::from_static("knative-serving-namespace");
/// Set by the ingress: the revision's name (removed before forwarding).
pub const KNATIVE_SERVING_REVISION: HeaderName =
    HeaderName::from_static("knative-serving-revision");
/// Knative's probe header (`activator`, `probe`).
pub const K_NETWORK_PROBE: HeaderName = HeaderName::from_static("k-network-probe");
/// The ingress prober's hash, echoed back.
pub const K_NETWORK_HASH: HeaderName = HeaderName::from_static("k-network-hash");
/// Marks a kubelet probe.
pub const K_KUBELET_PROBE: HeaderName = HeaderName::from_static("k-kubelet-probe");
/// Tells the queue sidecar the request came through the activator.
pub const K_PROXY_REQUEST: HeaderName = HeaderName::from_static("k-proxy-request");
/// The client's Host, moved aside when Host becomes the target.
pub const K_ORIGINAL_HOST: HeaderName = HeaderName::from_static("k-original-host");
/// Client addresses, the activator's peer appended.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// The client's scheme.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// The client's original host, as a proxy saw it.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// RFC 7239's forwarding header.
pub const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// The client's address, as a proxy saw it.
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// The mesh identity of the peer, as an Envoy sidecar saw its certificate
/// (`super::mesh_identity`): kept only when the activator's own sidecar wrote it.
pub const X_FORWARDED_CLIENT_CERT: HeaderName = HeaderName::from_static("x-forwarded-client-cert");
/// `cold-start;dur=<ms>` (or `queue;dur=<ms>`) on held requests' responses.
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");
/// Request headers [`upstream_additions`] removes or reads, looked for in one pass. The first
/// six are always removed when present, `X-Forwarded-For` when the client's address is
/// appended (it comes back extended), `X-Forwarded-Proto` is only read, and
/// `X-Forwarded-Client-Cert` is removed unless the activator's own sidecar wrote it.
const ROUTING: [HeaderName; 9] = [
    KNATIVE_SERVING_NAMESPACE,
    KNATIVE_SERVING_REVISION,
    K_NETWORK_HASH,
    header::HOST,
    K_PROXY_REQUEST,
    K_ORIGINAL_HOST,
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_CLIENT_CERT,
];
const XFF_BIT: u32 = 1 << 6;
const XFCC_BIT: u32 = 1 << 8;
/// What a proxy says about the client, believed only from a trusted peer.
const UNTRUSTED_FORWARDING: [HeaderName; 4] =
    [X_FORWARDED_PROTO, X_FORWARDED_HOST, FORWARDED, X_REAL_IP];
const XFP_BIT: u32 = 1 << 7;

/// Whom the activator forwards to, which decides how the client's `Host` travels
/// (Knative's `pkg/http/header`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NextHop {
    /// A queue sidecar in front of the user container (Knative's activator): `Host` becomes the
    /// endpoint, the client's host moves to `K-Original-Host` (`RewriteHostIn`, which the
    /// sidecar undoes), and `K-Proxy-Request: activator` tells the sidecar not to count the
    /// request twice.
    #[default]
    Sidecar,
    /// The user container itself (`thaw local`, where no sidecar stands in front of a
    /// replica): the client's `Host` goes as it came, which is what a container behind a
    /// sidecar sees (`RewriteHostOut`), and neither sidecar header is sent.
    Container,
}

/// Headers the activator adds to a forwarded request, kept apart from the client's map: the
/// direct upstream connection writes them after the map's own, and hyper's client gets them
/// merged in. Adding them to the client's map instead made it grow (reallocate and rehash) on
/// nearly every request.
pub type Additions = Vec<(HeaderName, HeaderValue)>;

/// Rewrites a routed request's headers for forwarding (Knative's `pkg/http/header`): hop-by-hop
/// headers, Knative's routing headers and the probe hash removed; `Host` removed (each attempt
/// sets it with [`set_target_host`]). Returns what is added: for a [`NextHop::Sidecar`],
/// `K-Proxy-Request: activator` and the original host as `K-Original-Host`; the client appended to
/// `X-Forwarded-For`, `X-Forwarded-Proto: http` if absent (any client-sent `K-Proxy-Request`,
/// `K-Original-Host` or `X-Forwarded-For` is replaced). `traceparent`/`tracestate` and
/// `X-Request-Id` pass as they are (the caller ensures an id exists). From a peer that is not
/// `trusted`, `X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded` and `X-Real-IP` are dropped
/// and `X-Forwarded-Proto: http` added (the caller passes `true` when none of them came).
/// `X-Forwarded-Client-Cert` goes on only with `keep_client_cert` (the activator's own
/// sidecar wrote it); any other is removed.
pub fn upstream_additions(
    headers: &mut HeaderMap,
    next_hop: NextHop,
    original_host: Option<HeaderValue>,
    client: Option<IpAddr>,
    upgrade: bool,
    trusted: bool,
    keep_client_cert: bool,
) -> Additions {
    strip_hop_by_hop(headers, upgrade);
    let mut found = present(headers, &ROUTING);
    if found & XFCC_BIT != 0 && !keep_client_cert {
        headers.remove(X_FORWARDED_CLIENT_CERT);
    }
    if !trusted {
        for name in UNTRUSTED_FORWARDING {
            headers.remove(name);
        }
        found &= !XFP_BIT;
    }
    let mut add = Vec::with_capacity(5);
    if next_hop == NextHop::Sidecar {
        add.push((K_PROXY_REQUEST, HeaderValue::from_static("activator")));
        if let Some(host) = original_host {
            add.push((K_ORIGINAL_HOST, host));
        }
    }
    if let Some(ip) = client {
        // Allocated only when the client sent one.
        let prev: Vec<&str> = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .filter(|_| found & XFF_BIT != 0)
            .filter_map(|v| v.to_str().ok())
            .collect();
        if let Some(v) = forwarded_for(prev.into_iter(), ip) {
            add.push((X_FORWARDED_FOR, v));
        }
    }
    if found & XFP_BIT == 0 {
        add.push((X_FORWARDED_PROTO, HeaderValue::from_static("http")));
    }
    let replaced = if client.is_some() { 7 } else { 6 };
    for (i, name) in ROUTING[..replaced].iter().enumerate() {
        if found & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    add
}

/// Puts the revision's tag ([`crate::knative::proxy_tag`]) in the additions'
/// `K-Proxy-Request` (there for a [`NextHop::Sidecar`]), in place of `activator`.
pub fn set_proxy_tag(additions: &mut Additions, tag: HeaderValue) {
    if let Some((_, v)) = additions.iter_mut().find(|(n, _)| *n == K_PROXY_REQUEST) {
        *v = tag;
    }
}

/// [`upstream_additions`], merged into the map (the tests' view of the forwarded headers;
/// `proxy::forward` merges them itself for hyper's client).
#[cfg(test)]
pub fn prepare_upstream(
    headers: &mut HeaderMap,
    original_host: Option<HeaderValue>,
    client: Option<IpAddr>,
    upgrade: bool,
) {
    let add = upstream_additions(
        headers,
        NextHop::Sidecar,
        original_host,
        client,
        upgrade,
        true,
        false,
    );
    headers.extend(add);
}

/// The earlier `X-Forwarded-For` values (every field, in order, as one list), then `ip`, built
/// in one buffer of exactly its size, which becomes the header value without a copy or a
/// second allocation.
pub(crate) fn forwarded_for<'a>(
    prev: impl Iterator<Item = &'a str> + Clone,
    ip: IpAddr,
) -> Option<HeaderValue> {
    // The address first, on the stack (39 bytes hold any IPv6 text form).
    let mut addr = [0u8; 39];
    let addr_len = match ip {
        // Dotted quad written directly: the formatter costs more than the rest of this header.
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    addr[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    addr[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    addr[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                addr[n] = b'0' + octet % 10;
                n += 1;
            }
            n
        }
        IpAddr::V6(_) => {
            use std::io::Write;
            let mut w = &mut addr[..];
            write!(w, "{ip}").ok()?;
            39 - w.len()
        }
    };
    let prev = prev.map(str::trim).filter(|p| !p.is_empty());
    let len = prev.clone().map(|p| p.len() + 2).sum::<usize>() + addr_len;
    let mut buf = Vec::with_capacity(len);
    for p in prev {
        buf.extend_from_slice(p.as_bytes());
        buf.extend_from_slice(b", ");
    }
    buf.extend_from_slice(&addr[..addr_len]);
    HeaderValue::from_maybe_shared(bytes::Bytes::from(buf)).ok()
}

/// Sets `Host` to the endpoint an attempt goes to (HTTP/1). On h2c the endpoint travels as the
/// URI's `:authority` and no `Host` header is sent.
pub fn set_target_host(headers: &mut HeaderMap, target: &HeaderValue, protocol: Protocol) {
    if protocol == Protocol::Http1 {
        headers.insert(header::HOST, target.clone());
    }
}

thread_local! {
    /// wyrand state for request ids, seeded once per thread from the OS-seeded thread RNG.
    static ID_RNG: std::cell::Cell<u64> = std::cell::Cell::new(rand::rng().random());
}

/// 128 bits from this thread's wyrand stream (ids need to be distinct, not secret: a few
/// multiplies instead of a ChaCha block per request).
fn id_bits() -> [u8; 16] {
    ID_RNG.with(|state| {
        let next = || {
            let s = state.get().wrapping_add(0xa076_1d64_78bd_642f);
            state.set(s);
            let t = u128::from(s) * u128::from(s ^ 0xe703_7ed1_a0b4_28db);
            ((t >> 64) as u64) ^ (t as u64)
        };
        let (hi, lo) = (next(), next());
        ((u128::from(hi) << 64) | u128::from(lo)).to_le_bytes()
    })
}

/// A fresh request id: a random (version 4) UUID in its usual text form, formatted on the
/// stack (one allocation, for the header value itself).
pub fn new_request_id() -> HeaderValue {
    // Each byte's two hex digits, looked up at once.
    const PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = [HEX[i >> 4], HEX[i & 15]];
            i += 1;
        }
        t
    };
    // Where each byte's digits go in `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let mut b = id_bits();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut out = [b'-'; 36];
    for (byte, at) in b.iter().zip(AT) {
        out[at..at + 2].copy_from_slice(&PAIRS[usize::from(*byte)]);
    }
    HeaderValue::from_bytes(&out).expect("hex and '-' are a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::fields::KEEP_ALIVE;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(KEEP_ALIVE, HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(h[header::TE], "trailers");
        assert!(h.contains_key("x-keep"));
    }

    #[test]
    fn plain_requests_pass_the_fast_paths_unchanged_but_for_the_forwarding_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a.example.com"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        prepare_upstream(&mut h, None, Some([10, 1, 2, 3].into()), false);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "accept",
                "k-proxy-request",
                "x-forwarded-for",
                "x-forwarded-proto"
            ]
        );
        assert_eq!(h[X_FORWARDED_FOR], "10.1.2.3");
        let mut v6 = HeaderMap::new();
        v6.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        prepare_upstream(&mut v6, None, Some("2001:db8::1".parse().unwrap()), false);
        assert_eq!(v6[X_FORWARDED_FOR], "2001:db8::1");
        // The longest IPv6 text (39 bytes) after earlier values, each trimmed.
        let longest = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        let v = forwarded_for(
            [" 10.0.0.1", "", "b "].into_iter(),
            longest.parse().unwrap(),
        );
        assert_eq!(v.unwrap(), format!("10.0.0.1, b, {longest}").as_str());
        for ip in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "127.0.0.1",
            "10.200.7.45",
        ] {
            let mut h = HeaderMap::new();
            prepare_upstream(&mut h, None, Some(ip.parse().unwrap()), false);
            assert_eq!(h[X_FORWARDED_FOR], ip);
        }
        assert_eq!(v6[X_FORWARDED_PROTO], "https", "kept when set");
    }

    #[test]
    fn keeps_upgrade_for_websockets() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
    }

    #[test]
    fn prepares_knative_and_forwarding_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::HOST,
            HeaderValue::from_static("hello.default.example.com"),
        );
        h.insert(KNATIVE_SERVING_REVISION, HeaderValue::from_static("r"));
        h.insert(KNATIVE_SERVING_NAMESPACE, HeaderValue::from_static("ns"));
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        h.insert("traceparent", HeaderValue::from_static("00-abc-def-01"));
        let original = h.get(header::HOST).cloned();
        let client = Some([127, 0, 0, 2].into());
        prepare_upstream(&mut h, original, client, false);
        assert!(!h.contains_key(header::HOST));
        set_target_host(
            &mut h,
            &HeaderValue::from_static("127.0.0.1:9000"),
            Protocol::Http1,
        );
        assert_eq!(h[header::HOST], "127.0.0.1:9000");
        assert_eq!(h[K_ORIGINAL_HOST], "hello.default.example.com");
        assert_eq!(h[K_PROXY_REQUEST], "activator");
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.1, 127.0.0.2");
        assert_eq!(h[X_FORWARDED_PROTO], "http");
        assert_eq!(h["traceparent"], "00-abc-def-01");
        assert!(!h.contains_key(KNATIVE_SERVING_REVISION));
        assert!(!h.contains_key(KNATIVE_SERVING_NAMESPACE));
    }

    /// A client's `X-Forwarded-Client-Cert` never reaches the revision; the one the
    /// activator's own sidecar wrote does.
    #[test]
    fn a_client_cert_goes_on_only_from_the_sidecar() {
        for keep in [false, true] {
            let mut h = HeaderMap::new();
            h.insert(
                X_FORWARDED_CLIENT_CERT,
                HeaderValue::from_static("By=spiffe://a/ns/b/sa/c;URI=spiffe://a/ns/d/sa/e"),
            );
            let add = upstream_additions(&mut h, NextHop::Sidecar, None, None, false, true, keep);
            assert!(add.iter().all(|(n, _)| *n != X_FORWARDED_CLIENT_CERT));
            assert_eq!(h.contains_key(X_FORWARDED_CLIENT_CERT), keep);
        }
    }

    #[test]
    fn request_ids_are_uuid_v4_shaped_and_distinct() {
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        let s = a.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4");
        // 8-4-4-4-12 lower-case hex groups, RFC 4122 variant (8, 9, a or b).
        let groups: Vec<&str> = s.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(
            s.bytes()
                .all(|c| c == b'-' || c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        );
        assert!(matches!(&s[19..20], "8" | "9" | "a" | "b"), "{s}");
        let many: std::collections::HashSet<_> = (0..10_000).map(|_| new_request_id()).collect();
        assert_eq!(many.len(), 10_000, "ids repeat");
    }

    #[test]
    fn header_limits() {
        let mut h = HeaderMap::new();
        h.insert("a", HeaderValue::from_static("12345"));
        h.insert("b", HeaderValue::from_static("1"));
        assert!(check_limits(&h, 2, 100).is_ok());
        assert_eq!(check_limits(&h, 1, 100), Err(("header count", 2, 1)));
        assert_eq!(check_limits(&h, 5, 7), Err(("header bytes", 8, 7)));
    }
}
