//! A request's header fields in either form the pipeline meets, and the header work on them.
//!
//! - [`ClientHeaders::Map`]: hyper's `HeaderMap`, for requests hyper's server read.
//! - [`ClientHeaders::Raw`]: the fast lane's fields ([`RawFields`]): the head's one buffer and
//!   where each name and value sits in it, in wire order, names as the client spelt them.
//!
//! Why two forms: turning a parsed head into a `HeaderMap` (validate and lower-case each name,
//! hash it, insert, drop the map after the response) cost about 1,090 instructions per header
//! (docs/decisions.md, "Raw request fields"). A warm lane request only needs its fields read a
//! few times and written upstream, which slices of the head do with no map at all.
//!
//! Contract: both forms give the same answers. [`HeadersRef::scan`], [`HeadersRef::check_limits`]
//! and [`HeadersRef::is_upgrade`] read them as `super::routing::Seen::scan`,
//! `super::headers::check_limits` and `super::headers::is_upgrade` read a map;
//! [`ClientHeaders::prepare`] removes and adds what `super::headers::upstream_additions` does
//! (hop-by-hop headers, those `Connection` names, Knative's routing headers, `Host`), and the
//! upstream receives the same fields (`fields_tests` checks each against the map path). The raw
//! form keeps the client's order and spelling of names, as nginx does. Field names and values
//! are the bytes httparse accepted, which are exactly what the `http` crate accepts (checked by a
//! test over every byte), so a raw field always converts to a map entry.

use std::net::IpAddr;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::headers::{
    self as hdr, Additions, K_ORIGINAL_HOST, K_PROXY_REQUEST, X_FORWARDED_FOR, X_FORWARDED_PROTO,
};
use super::routing::{FieldRef, Seen};

/// Start and end offsets of a name or value in the head.
pub type Span = (u32, u32);

/// The most fields a [`RawFields`] holds (one bit each in its skip mask). The lane parses at
/// most [`super::lane::MAX_HEADERS`].
pub const RAW_MAX: usize = 128;

/// The fields of a head the fast lane parsed: slices of the head's buffer, in wire order, each
/// with its name recognised once ([`classify`]) for every later pass.
#[derive(Debug, Clone)]
pub struct RawFields {
    head: Bytes,
    fields: Vec<Field>,
    /// Bit `i` set: field `i` is not forwarded ([`ClientHeaders::prepare`]).
    skip: u128,
}

#[derive(Debug, Clone, Copy)]
struct Field {
    name: Span,
    value: Span,
    known: Known,
}

impl RawFields {
    /// No fields yet, room for `n`.
    pub fn with_capacity(head: Bytes, n: usize) -> Self {
        Self {
            head,
            fields: Vec::with_capacity(n.min(RAW_MAX)),
            skip: 0,
        }
    }

    /// The fields at `spans` (name, value) of `head`. At most [`RAW_MAX`].
    pub fn new(head: Bytes, spans: &[(Span, Span)]) -> Self {
        let mut raw = Self::with_capacity(head, spans.len());
        for &(name, value) in spans {
            raw.push(name, value);
        }
        raw
    }

    /// Adds the field whose name and value are at these spans of the head; returns what its
    /// name is. Panics past [`RAW_MAX`] fields (the lane parses at most 100).
    pub fn push(&mut self, name: Span, value: Span) -> Known {
        assert!(self.fields.len() < RAW_MAX, "at most {RAW_MAX} raw fields");
        let known = classify(self.at(name));
        self.fields.push(Field { name, value, known });
        known
    }

    /// The head the fields are slices of.
    pub fn head(&self) -> &Bytes {
        &self.head
    }

    /// The head, given back.
    pub fn into_head(self) -> Bytes {
        self.head
    }

    /// How many fields the head has.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the head has no fields.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    fn at(&self, (s, e): Span) -> &[u8] {
        &self.head[s as usize..e as usize]
    }

    /// Every field, names as sent, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (self.at(f.name), self.at(f.value)))
    }

    /// Every field with what its name is.
    fn known(&self) -> impl Iterator<Item = (Known, &[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (f.known, self.at(f.name), self.at(f.value)))
    }

    /// The fields that are forwarded (all of them until [`ClientHeaders::prepare`]).
    fn kept(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let skip = self.skip;
        self.iter()
            .enumerate()
            .filter(move |(i, _)| skip & (1u128 << i) == 0)
            .map(|(_, f)| f)
    }

    /// The first value of `name` (any case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// `value` (a slice of this head) as a header value sharing the head's buffer.
    pub fn value(&self, value: &[u8]) -> Option<HeaderValue> {
        HeaderValue::from_maybe_shared(self.head.slice_ref(value)).ok()
    }

    /// The kept fields as a map (hyper's client path).
    fn into_map(self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.fields.len());
        for (name, value) in self.kept() {
            // Cannot fail: httparse accepts exactly the names and values `http` does (module
            // doc); a field that did not convert would be dropped, never a panic.
            if let (Ok(n), Some(v)) = (HeaderName::from_bytes(name), self.value(value)) {
                map.append(n, v);
            }
        }
        map
    }
}

/// The names the activator acts on, recognised from raw bytes in any case (one length switch
/// and at most a few comparisons per field).
#[allow(missing_docs)] // each is the header of its name
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Known {
    Host,
    UserAgent,
    ServingNamespace,
    ServingRevision,
    RequestId,
    NetworkProbe,
    NetworkHash,
    KubeletProbe,
    ProxyRequest,
    OriginalHost,
    ForwardedFor,
    ForwardedProto,
    Connection,
    KeepAlive,
    ProxyConnection,
    Te,
    Trailer,
    TransferEncoding,
    Upgrade,
    ContentLength,
    Expect,
    Other,
}

/// Which [`Known`] name `name` is, in any case.
pub fn classify(name: &[u8]) -> Known {
    use Known::*;
    let is = |s: &[u8]| name.eq_ignore_ascii_case(s);
    match name.len() {
        2 if is(b"te") => Te,
        4 if is(b"host") => Host,
        6 if is(b"expect") => Expect,
        7 if is(b"upgrade") => Upgrade,
        7 if is(b"trailer") => Trailer,
        10 if is(b"connection") => Connection,
        10 if is(b"user-agent") => UserAgent,
        10 if is(b"keep-alive") => KeepAlive,
        12 if is(b"x-request-id") => RequestId,
        14 if is(b"content-length") => ContentLength,
        14 if is(b"k-network-hash") => NetworkHash,
        15 if is(b"x-forwarded-for") => ForwardedFor,
        15 if is(b"k-network-probe") => NetworkProbe,
        15 if is(b"k-kubelet-probe") => KubeletProbe,
        15 if is(b"k-proxy-request") => ProxyRequest,
        15 if is(b"k-original-host") => OriginalHost,
        16 if is(b"proxy-connection") => ProxyConnection,
        17 if is(b"transfer-encoding") => TransferEncoding,
        17 if is(b"x-forwarded-proto") => ForwardedProto,
        24 if is(b"knative-serving-revision") => ServingRevision,
        25 if is(b"knative-serving-namespace") => ServingNamespace,
        _ => Other,
    }
}

/// The comma-separated tokens of a header value, trimmed, empty ones left out.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// A client request's headers, in the form it was read in (see the module doc).
#[derive(Debug)]
pub enum ClientHeaders {
    Map(HeaderMap),
    Raw(RawFields),
}

/// A borrowed [`ClientHeaders`].
#[derive(Debug, Clone, Copy)]
pub enum HeadersRef<'a> {
    Map(&'a HeaderMap),
    Raw(&'a RawFields),
}

impl<'a> HeadersRef<'a> {
    /// The headers the activator reads, in one pass (`Seen::scan` for either form).
    pub fn scan(self) -> Seen<'a> {
        match self {
            HeadersRef::Map(map) => Seen::scan(map),
            HeadersRef::Raw(raw) => scan_raw(raw),
        }
    }

    /// [`super::headers::check_limits`] for either form.
    pub fn check_limits(
        self,
        max_count: u32,
        max_bytes: u32,
    ) -> Result<(), (&'static str, usize, usize)> {
        let raw = match self {
            HeadersRef::Map(map) => return hdr::check_limits(map, max_count, max_bytes),
            HeadersRef::Raw(raw) => raw,
        };
        let count = raw.len();
        if count > max_count as usize {
            return Err(("header count", count, max_count as usize));
        }
        let bytes: usize = raw.iter().map(|(n, v)| n.len() + v.len()).sum();
        if bytes > max_bytes as usize {
            return Err(("header bytes", bytes, max_bytes as usize));
        }
        Ok(())
    }

    /// [`super::headers::is_upgrade`] for either form.
    pub fn is_upgrade(self) -> bool {
        let raw = match self {
            HeadersRef::Map(map) => return hdr::is_upgrade(map),
            HeadersRef::Raw(raw) => raw,
        };
        let mut upgrade = false;
        let mut connection_upgrade = false;
        for (known, _, value) in raw.known() {
            match known {
                Known::Upgrade => upgrade = true,
                Known::Connection => {
                    connection_upgrade |= tokens(value).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
                }
                _ => {}
            }
        }
        upgrade && connection_upgrade
    }
}

fn scan_raw(raw: &RawFields) -> Seen<'_> {
    let mut s = Seen::default();
    for (known, _, value) in raw.known() {
        let slot = match known {
            Known::Host => &mut s.host,
            Known::UserAgent => &mut s.user_agent,
            Known::ServingNamespace => &mut s.namespace,
            Known::ServingRevision => &mut s.revision,
            Known::RequestId => &mut s.request_id,
            Known::NetworkProbe => &mut s.network_probe,
            Known::NetworkHash => &mut s.network_hash,
            Known::KubeletProbe => {
                s.kubelet_probe = true;
                continue;
            }
            _ => continue,
        };
        slot.get_or_insert(FieldRef::Raw(raw, value));
    }
    s
}

impl ClientHeaders {
    /// Borrowed.
    pub fn view(&self) -> HeadersRef<'_> {
        match self {
            ClientHeaders::Map(map) => HeadersRef::Map(map),
            ClientHeaders::Raw(raw) => HeadersRef::Raw(raw),
        }
    }

    /// Rewrites the headers for forwarding and returns what the activator adds, exactly as
    /// [`super::headers::upstream_additions`] does for a map (see its doc).
    pub fn prepare(
        &mut self,
        original_host: Option<HeaderValue>,
        client: Option<IpAddr>,
        upgrade: bool,
    ) -> Additions {
        match self {
            ClientHeaders::Map(map) => hdr::upstream_additions(map, original_host, client, upgrade),
            ClientHeaders::Raw(raw) => prepare_raw(raw, original_host, client, upgrade),
        }
    }

    /// Bytes [`Self::write_fields`] writes.
    pub fn encoded_len(&self) -> usize {
        match self {
            ClientHeaders::Map(map) => map
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len() + 4)
                .sum(),
            ClientHeaders::Raw(raw) => raw.kept().map(|(n, v)| n.len() + v.len() + 4).sum(),
        }
    }

    /// Writes each forwarded field as `name: value` and CRLF.
    pub fn write_fields(&self, out: &mut Vec<u8>) {
        match self {
            ClientHeaders::Map(map) => {
                for (name, value) in map {
                    put_raw(out, name.as_str().as_bytes(), value.as_bytes());
                }
            }
            ClientHeaders::Raw(raw) => {
                for (name, value) in raw.kept() {
                    put_raw(out, name, value);
                }
            }
        }
    }

    /// The forwarded fields as a map (hyper's client takes one).
    pub fn into_map(self) -> HeaderMap {
        match self {
            ClientHeaders::Map(map) => map,
            ClientHeaders::Raw(raw) => raw.into_map(),
        }
    }
}

/// One header field line: `name: value` and CRLF. Inlined: the separators then become plain
/// stores rather than calls to `memcpy`.
#[inline(always)]
pub fn put_raw(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.reserve(name.len() + value.len() + 4);
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn prepare_raw(
    raw: &mut RawFields,
    original_host: Option<HeaderValue>,
    client: Option<IpAddr>,
    upgrade: bool,
) -> Additions {
    let mut skip = 0u128;
    // Headers that `Connection` names are hop-by-hop too (RFC 9110 §7.6.1): gathered first,
    // since a `Connection` field may come after the fields it names. Rare, so only then
    // allocated.
    let named: Vec<&[u8]> = raw
        .known()
        .filter(|(k, _, _)| *k == Known::Connection)
        .flat_map(|(_, _, v)| tokens(v))
        .filter(|t| !(upgrade && t.eq_ignore_ascii_case(b"upgrade")))
        .collect();
    let mut te_seen = false;
    for (i, (known, name, value)) in raw.known().enumerate() {
        let drop = match known {
            Known::Connection
            | Known::KeepAlive
            | Known::ProxyConnection
            | Known::Trailer
            | Known::TransferEncoding => true,
            Known::Upgrade => !upgrade,
            // The first TE passes if it is `trailers` (gRPC over h2c needs it); no other does.
            Known::Te => {
                let keep = !te_seen && value.eq_ignore_ascii_case(b"trailers");
                te_seen = true;
                !keep
            }
            Known::ServingNamespace
            | Known::ServingRevision
            | Known::NetworkHash
            | Known::Host
            | Known::ProxyRequest
            | Known::OriginalHost => true,
            _ => false,
        };
        let named_by_connection = !named.is_empty()
            && named.iter().any(|t| t.eq_ignore_ascii_case(name))
            && !(upgrade && known == Known::Upgrade);
        if drop || named_by_connection {
            skip |= 1u128 << i;
        }
    }
    // What is left of X-Forwarded-For / -Proto after the hop-by-hop removal.
    let mut prev_for: Vec<&[u8]> = Vec::new();
    let mut has_proto = false;
    for (i, (known, _, value)) in raw.known().enumerate() {
        if skip & (1u128 << i) != 0 {
            continue;
        }
        match known {
            Known::ForwardedFor if client.is_some() => {
                prev_for.push(value);
                skip |= 1u128 << i;
            }
            Known::ForwardedProto => has_proto = true,
            _ => {}
        }
    }
    let mut add = Vec::with_capacity(5);
    if upgrade {
        // The map form re-adds it in `strip_hop_by_hop`; the raw form cannot add a field.
        add.push((header::CONNECTION, HeaderValue::from_static("upgrade")));
    }
    add.push((K_PROXY_REQUEST, HeaderValue::from_static("activator")));
    if let Some(host) = original_host {
        add.push((K_ORIGINAL_HOST, host));
    }
    if let Some(ip) = client {
        let prev = prev_for.iter().filter_map(|v| std::str::from_utf8(v).ok());
        if let Some(v) = hdr::forwarded_for(prev, ip) {
            add.push((X_FORWARDED_FOR, v));
        }
    }
    if !has_proto {
        add.push((X_FORWARDED_PROTO, HeaderValue::from_static("http")));
    }
    drop(prev_for);
    raw.skip = skip;
    add
}

#[cfg(test)]
#[path = "fields_tests.rs"]
mod fields_tests;
