//! Header fields kept as slices of the head they were read in, and the header work on them.
//!
//! A request's fields come in either of two forms:
//! - [`ClientHeaders::Map`]: hyper's `HeaderMap`, for requests hyper's server read.
//! - [`ClientHeaders::Raw`]: the fast lane's fields ([`RawFields`]): the head's one buffer and
//!   where each name and value sits in it, in wire order, names as the client spelt them.
//!
//! A direct upstream's response fields are raw too ([`UpstreamFields`]).
//!
//! Why: turning a parsed head into a `HeaderMap` (validate and lower-case each name, hash it,
//! insert, drop the map after the response) cost about 1,090 instructions per header
//! (docs/decisions.md, "Raw request and response fields instead of header maps"). A warm
//! request only needs its fields read a few times and written out again, which slices of the
//! head do with no map at all.
//!
//! Contract: both forms give the same answers. [`HeadersRef::check_limits`] and
//! [`HeadersRef::is_upgrade`] read them as [`check_limits`] and [`is_upgrade`] read a map; the
//! skip mask ([`RawFields::skip`], with [`RawFields::hop_by_hop`]) leaves out of the forwarded
//! fields what a caller removes from a map (the activator's header hygiene does both, and its
//! tests check each form against the other). The raw
//! form keeps the client's order and spelling of names, as nginx does. Field names and values
//! are the bytes httparse accepted, which are exactly what the `http` crate accepts (checked by a
//! test over every byte), so a raw field always converts to a map entry.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// `X-Request-Id`: echoed on direct responses that carry none ([`UpstreamFields`]).
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

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
    /// Bit `i` set: field `i` is not forwarded ([`RawFields::skip`]).
    skip: u128,
    /// Bit `k as u32` set when a field named `k` ([`Known`]) is present.
    present: u32,
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
            present: 0,
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
        self.present |= known.bit();
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

    /// Leaves out of the forwarded fields every field whose bit is set in `mask` (bit `i` is
    /// field `i`, in wire order), besides those already left out.
    pub fn skip(&mut self, mask: u128) {
        self.skip |= mask;
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
    pub fn known(&self) -> impl Iterator<Item = (Known, &[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (f.known, self.at(f.name), self.at(f.value)))
    }

    /// The fields that are forwarded, with what their names are (all of them until
    /// [`RawFields::skip`] or [`UpstreamFields::new`] marks some).
    fn kept_known(&self) -> impl Iterator<Item = (Known, &[u8], &[u8])> {
        let skip = self.skip;
        self.known()
            .enumerate()
            .filter(move |(i, _)| skip & (1u128 << i) == 0)
            .map(|(_, f)| f)
    }

    /// [`Self::kept_known`] without the kinds.
    fn kept(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.kept_known().map(|(_, n, v)| (n, v))
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

    /// Bit `i` set for each hop-by-hop field (RFC 9110 §7.6.1): the hop-by-hop names and every
    /// field a `Connection` field names (gathered first: it may come after them). With
    /// `upgrade`, `Upgrade` stays. A first `TE` that is `trailers` stays (gRPC over h2c needs it),
    /// as the activator's `headers::strip_hop_by_hop` keeps it.
    pub fn hop_by_hop(&self, upgrade: bool) -> u128 {
        const HOP: u32 = Known::Connection.bit()
            | Known::KeepAlive.bit()
            | Known::ProxyConnection.bit()
            | Known::Te.bit()
            | Known::TransferEncoding.bit()
            | Known::Upgrade.bit();
        // Most heads carry none of them (and so no `Connection` naming others).
        if self.present & HOP == 0 {
            return 0;
        }
        // Rare, so only then allocated.
        let named: Vec<&[u8]> = self
            .known()
            .filter(|(k, _, _)| *k == Known::Connection)
            .flat_map(|(_, _, v)| tokens(v))
            .filter(|t| !(upgrade && t.eq_ignore_ascii_case(b"upgrade")))
            .collect();
        let mut skip = 0u128;
        let mut te_seen = false;
        for (i, (known, name, value)) in self.known().enumerate() {
            let drop = match known {
                Known::Connection
                | Known::KeepAlive
                | Known::ProxyConnection
                | Known::TransferEncoding => true,
                Known::Upgrade => !upgrade,
                Known::Te => {
                    let keep = !te_seen && value.eq_ignore_ascii_case(b"trailers");
                    te_seen = true;
                    !keep
                }
                _ => false,
            };
            let named_by_connection = !named.is_empty()
                && named.iter().any(|t| t.eq_ignore_ascii_case(name))
                && !(upgrade && known == Known::Upgrade);
            if drop || named_by_connection {
                skip |= 1u128 << i;
            }
        }
        skip
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
    ForwardedHost,
    Forwarded,
    RealIp,
    ClientCert,
    Connection,
    KeepAlive,
    ProxyConnection,
    Te,
    Trailer,
    TransferEncoding,
    Upgrade,
    ContentLength,
    Expect,
    Date,
    Other,
}

impl Known {
    /// This name's bit in [`RawFields`]' set of names present.
    pub const fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// Whether `name` is `lower` in any case, for a `lower` of lower-case letters and `-` and a
/// `name` of token characters (RFC 9110 §5.6.2, as httparse checks them): setting bit 5 of each
/// byte then lower-cases a letter, keeps `-`, and makes no other token character equal to a
/// lower-case letter or `-`. Eight bytes at a time.
fn eq_lower(name: &[u8], lower: &[u8]) -> bool {
    if name.len() != lower.len() {
        return false;
    }
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    let (mut a, mut b) = (name.chunks_exact(8), lower.chunks_exact(8));
    for (x, y) in (&mut a).zip(&mut b) {
        if word(x) | 0x2020_2020_2020_2020 != word(y) {
            return false;
        }
    }
    a.remainder()
        .iter()
        .zip(b.remainder())
        .all(|(x, y)| x | 0x20 == *y)
}

/// Which [`Known`] name `name` is, in any case: its length and first letter pick the one
/// candidate compared in full. `name` is a token (httparse has checked it), as `eq_lower`
/// needs.
pub fn classify(name: &[u8]) -> Known {
    use Known::*;
    let Some(&first) = name.first() else {
        return Other;
    };
    let candidate = match (name.len(), first | 0x20) {
        (2, b't') => (Te, &b"te"[..]),
        (4, b'h') => (Host, &b"host"[..]),
        (4, b'd') => (Date, &b"date"[..]),
        (6, b'e') => (Expect, &b"expect"[..]),
        (9, b'f') => (Forwarded, &b"forwarded"[..]),
        (9, b'x') => (RealIp, &b"x-real-ip"[..]),
        (7, b'u') => (Upgrade, &b"upgrade"[..]),
        (7, b't') => (Trailer, &b"trailer"[..]),
        (10, b'c') => (Connection, &b"connection"[..]),
        (10, b'u') => (UserAgent, &b"user-agent"[..]),
        (10, b'k') => (KeepAlive, &b"keep-alive"[..]),
        (12, b'x') => (RequestId, &b"x-request-id"[..]),
        (14, b'c') => (ContentLength, &b"content-length"[..]),
        (14, b'k') => (NetworkHash, &b"k-network-hash"[..]),
        (15, b'x') => (ForwardedFor, &b"x-forwarded-for"[..]),
        (15, b'k') => {
            // Four names of 15 letters start with `k-`; the third letter tells them apart.
            match name[2] | 0x20 {
                b'n' => (NetworkProbe, &b"k-network-probe"[..]),
                b'k' => (KubeletProbe, &b"k-kubelet-probe"[..]),
                b'p' => (ProxyRequest, &b"k-proxy-request"[..]),
                b'o' => (OriginalHost, &b"k-original-host"[..]),
                _ => return Other,
            }
        }
        (16, b'p') => (ProxyConnection, &b"proxy-connection"[..]),
        (16, b'x') => (ForwardedHost, &b"x-forwarded-host"[..]),
        (17, b't') => (TransferEncoding, &b"transfer-encoding"[..]),
        (17, b'x') => (ForwardedProto, &b"x-forwarded-proto"[..]),
        (23, b'x') => (ClientCert, &b"x-forwarded-client-cert"[..]),
        (24, b'k') => (ServingRevision, &b"knative-serving-revision"[..]),
        (25, b'k') => (ServingNamespace, &b"knative-serving-namespace"[..]),
        _ => return Other,
    };
    if eq_lower(name, candidate.1) {
        candidate.0
    } else {
        Other
    }
}

/// The comma-separated tokens of a header value, trimmed, empty ones left out.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
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
    /// [`check_limits`] for either form.
    pub fn check_limits(
        self,
        max_count: u32,
        max_bytes: u32,
    ) -> Result<(), (&'static str, usize, usize)> {
        let raw = match self {
            HeadersRef::Map(map) => return check_limits(map, max_count, max_bytes),
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

    /// [`is_upgrade`] for either form.
    pub fn is_upgrade(self) -> bool {
        let raw = match self {
            HeadersRef::Map(map) => return is_upgrade(map),
            HeadersRef::Raw(raw) => raw,
        };
        // Most heads have no `Upgrade` field: no pass over the fields then.
        if raw.present & Known::Upgrade.bit() == 0 {
            return false;
        }
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

    /// The `Upgrade` field's value when the request asks for an upgrade ([`Self::is_upgrade`]).
    pub fn upgrade_protocols(self) -> Option<&'a [u8]> {
        if !self.is_upgrade() {
            return None;
        }
        match self {
            HeadersRef::Map(map) => map.get(header::UPGRADE).map(HeaderValue::as_bytes),
            HeadersRef::Raw(raw) => raw
                .known()
                .find(|(k, _, _)| *k == Known::Upgrade)
                .map(|(_, _, v)| v),
        }
    }
}

/// Whether a trailer field may be forwarded (RFC 9110 §6.5.1): not framing, routing,
/// authentication, a `Content-*` field, a response control or a hop-by-hop field, which a
/// recipient must not take from a trailer section.
pub fn allowed_in_trailers(name: &HeaderName) -> bool {
    const NOT_IN_TRAILERS: [&str; 25] = [
        "transfer-encoding",
        "trailer",
        "te",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "authorization",
        "proxy-authorization",
        "www-authenticate",
        "proxy-authenticate",
        "cookie",
        "set-cookie",
        "cache-control",
        "expect",
        "max-forwards",
        "pragma",
        "range",
        "age",
        "expires",
        "date",
        "location",
        "retry-after",
        "vary",
    ];
    let n = name.as_str();
    !n.starts_with("content-") && !NOT_IN_TRAILERS.contains(&n)
}

/// Removes every field a trailer section must not carry ([`allowed_in_trailers`]).
pub fn strip_forbidden_trailers(trailers: &mut HeaderMap) {
    if trailers.keys().all(allowed_in_trailers) {
        return;
    }
    let bad: Vec<HeaderName> = trailers
        .keys()
        .filter(|n| !allowed_in_trailers(n))
        .cloned()
        .collect();
    for name in bad {
        trailers.remove(name);
    }
}

impl ClientHeaders {
    /// Borrowed.
    pub fn view(&self) -> HeadersRef<'_> {
        match self {
            ClientHeaders::Map(map) => HeadersRef::Map(map),
            ClientHeaders::Raw(raw) => HeadersRef::Raw(raw),
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

/// A direct upstream response's header fields, kept as slices of its head rather than a map
/// (see the module doc; the same reasons hold for responses), plus the request id the
/// activator echoes when the upstream sent none.
/// - Hop-by-hop fields are marked when it is made, as the activator's `strip_hop_by_hop` would
///   remove them from a map.
/// - The fast lane writes the rest as they are ([`UpstreamFields::for_each`]).
/// - For hyper's server they are merged into the response's map ([`UpstreamFields::merge_into`]).
#[derive(Debug)]
pub struct UpstreamFields {
    fields: RawFields,
    request_id: Option<HeaderValue>,
}

/// [`UpstreamFields`] boxed: the response head and its body are moved several times on the
/// way to the client, and a pointer moves cheaper than the fields (about 450 instructions of
/// `memcpy` per request, against one small allocation).
pub type BoxedFields = Box<UpstreamFields>;

impl UpstreamFields {
    /// The fields of a response head, hop-by-hop ones marked.
    pub fn new(mut fields: RawFields) -> Self {
        fields.skip = fields.hop_by_hop(false);
        Self {
            fields,
            request_id: None,
        }
    }

    /// Leaves out every field named `known` (`Content-Length` under `Transfer-Encoding`).
    pub fn drop_all(&mut self, known: Known) {
        let mut skip = self.fields.skip;
        for (i, (k, _, _)) in self.fields.known().enumerate() {
            if k == known {
                skip |= 1u128 << i;
            }
        }
        self.fields.skip = skip;
    }

    /// Whether a kept field is named `known`.
    pub fn has(&self, known: Known) -> bool {
        // Most heads do not carry the name at all: no pass over the fields then.
        self.fields.present & known.bit() != 0
            && self.fields.kept_known().any(|(k, _, _)| k == known)
    }

    /// Echoes `id` as `X-Request-Id` (the caller has checked the upstream sent none).
    pub fn echo_request_id(&mut self, id: HeaderValue) {
        self.request_id = Some(id);
    }

    /// Each field the client gets, in the upstream's order and spelling, then the echoed id.
    pub fn for_each(&self, mut f: impl FnMut(Known, &[u8], &[u8])) {
        for (known, name, value) in self.fields.kept_known() {
            f(known, name, value);
        }
        if let Some(id) = &self.request_id {
            f(Known::RequestId, b"x-request-id", id.as_bytes());
        }
    }

    /// Puts these fields into `map` ahead of what it holds (the activator's own additions).
    pub fn merge_into(self, map: &mut HeaderMap) {
        let ours = std::mem::take(map);
        map.reserve(self.fields.len() + 1 + ours.len());
        for (name, value) in self.fields.kept() {
            // Cannot fail (module doc); never a panic if it did.
            if let (Ok(n), Some(v)) = (HeaderName::from_bytes(name), self.fields.value(value)) {
                map.append(n, v);
            }
        }
        if let Some(id) = self.request_id {
            map.append(X_REQUEST_ID, id);
        }
        map.extend(ours);
    }
}

pub const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1).
///
/// `Trailer` is not one (RFC 9110 §7.6.1 lists it no more): it announces the trailer fields end
/// to end, and hyper's HTTP/1 server sends only the trailers a response announces.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Bit `i` set when `names[i]` is present: one pass over the map's keys instead of a hashed
/// lookup per name (most requests carry none of the names looked for).
pub fn present(headers: &HeaderMap, names: &[HeaderName]) -> u32 {
    debug_assert!(names.len() <= 32);
    let mut found = 0;
    for key in headers.keys() {
        if let Some(i) = names.iter().position(|n| n == key) {
            found |= 1 << i;
        }
    }
    found
}

/// Removes hop-by-hop headers, including every header the `Connection` header names. With
/// `keep_upgrade` the `Upgrade` header stays and `Connection: upgrade` is re-added (a websocket
/// passes through). `TE: trailers` is kept: gRPC over h2c needs it.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let found = present(headers, &HOP_BY_HOP);
    if found != 0 {
        strip_present(headers, keep_upgrade, found);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The slow path of [`strip_hop_by_hop`]: `found` marks the [`HOP_BY_HOP`] names present.
fn strip_present(headers: &mut HeaderMap, keep_upgrade: bool, found: u32) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if !(keep_upgrade && name == header::UPGRADE) {
            headers.remove(&name);
        }
    }
    let te_trailers = headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if found & (1 << i) != 0 && !(keep_upgrade && *name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether the request asks for a protocol upgrade (`Upgrade` and `Connection: upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Checks the header count and total size (names + values) against the limits; on failure,
/// which limit, the actual value and the limit.
pub fn check_limits(
    headers: &HeaderMap,
    max_count: u32,
    max_bytes: u32,
) -> Result<(), (&'static str, usize, usize)> {
    let count = headers.len();
    if count > max_count as usize {
        return Err(("header count", count, max_count as usize));
    }
    let bytes: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    if bytes > max_bytes as usize {
        return Err(("header bytes", bytes, max_bytes as usize));
    }
    Ok(())
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

/// One header field line: `name: value` and CRLF (inlined, see [`put_raw`]).
#[inline(always)]
pub fn put_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    put_raw(out, name.as_str().as_bytes(), value.as_bytes());
}

#[cfg(test)]
#[path = "fields_tests.rs"]
mod tests;
