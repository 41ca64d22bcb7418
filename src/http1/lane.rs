//! The HTTP/1 fast lane: thaw's own loop for HTTP/1.1 (and 1.0) connections, serving the
//! requests that make up nearly all warm traffic without hyper's server machinery.
//!
//! Why: on the warm path hyper's server (dispatcher, parser, encoder, buffered I/O, the
//! service future moved into its slot) was about a third of the activator's instructions per
//! request (docs/decisions.md, "An HTTP/1 fast lane"). A proxy that forwards a bodiless request
//! needs much less: parse a head, call the handler, write a head and the body's bytes.
//!
//! Contract:
//! - **What the lane serves.** A request whose head parses (httparse, as hyper) and that has
//!   no body (no `Transfer-Encoding`, at most one `Content-Length`, of `0`), no `Upgrade`, no
//!   `Expect`, no `Connection: upgrade`, an origin-form target (`/...`), a method other than
//!   `CONNECT` (httparse accepts exactly the header names and values the `http` crate does).
//!   Its header fields stay slices of the head, with no header map
//!   ([`super::fields::RawFields`]). It goes to the same [`Handler::respond`] as every other
//!   request: what the answer is (probes, limits, routing, holding, proxying, errors) is the
//!   handler's.
//! - **Everything else goes to hyper.** The first request the lane does not serve — and every
//!   request after it on that connection — is served by hyper's HTTP/1 connection, handed the
//!   bytes the lane read but did not use ([`LaneEnd::Handoff`]). A malformed head, a head over
//!   hyper's header-slot count or buffer cap, a body, an upgrade: hyper answers them exactly as
//!   it did before the lane existed. (hyper reads the handed-over bytes first:
//!   [`super::head_clock::HeadIo`].)
//! - **Responses.** Status line `HTTP/1.1`; a direct upstream's fields as they came, less the
//!   hop-by-hop ones ([`super::fields::UpstreamFields`]); the response's headers as the
//!   handler left them; `Date` added when missing (RFC 9110 §6.6.1), then framing: the response's
//!   `Content-Length`, else the body's exact size, else chunked (HTTP/1.1 clients) or
//!   close-delimited (HTTP/1.0). No body for `HEAD`, 1xx, 204 and 304. Trailers are sent only to
//!   a client that asked for them (`TE: trailers`) on a chunked body, and only the fields the
//!   response announced in `Trailer` (as hyper's server sends them). A head and a small body go
//!   out in one write; body frames are written as they arrive, never buffered whole.
//! - **Keep-alive.** HTTP/1.1 unless the client sent `Connection: close`; HTTP/1.0 only with
//!   `Connection: keep-alive` (echoed back). Pipelined requests are answered in order. A body
//!   that fails or ends short of its length closes the connection (the client sees a truncated
//!   response, as with hyper).
//! - **Timeouts and drain,** as for hyper's connections (`super::conn`): a new connection's
//!   first head must be complete within the header-read timeout from accept (or from the end of
//!   its early hold); a later head that arrives in pieces, within one header-read timeout of
//!   its first piece; an idle connection closes after one to two keep-alive periods with no
//!   request. When drain starts an idle connection closes, and a busy one answers its current
//!   request with `Connection: close`. No timer is touched per request: one per connection is
//!   re-armed only when it fires.
//! - **Memory.** Reads go into a small buffer (`READ_CHUNK`); the head is split off it and its
//!   header values are slices of it, so a request keeps that buffer alive until it is answered.
//!   Once the connection waits with nothing buffered, the buffer goes back to its thread's spare
//!   list (`take_buf`, `give_buf`) and the connection waits for readability with no buffer;
//!   it takes one when bytes arrive. An idle kept-alive connection holds no read buffer.

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::activity::ConnActivity;
use super::direct::ContentLength;
use super::fields::{Known, RawFields, Span, UpstreamFields, put_field, tokens};
use super::{Handler, Limits, ResponseBody};

/// hyper's HTTP/1 header slots when no cap is set: a head with more goes to hyper, which
/// answers it as before (431, or thaw's check when the configured count is higher).
pub const MAX_HEADERS: usize = 100;
// Every parsed field fits a `RawFields` (one bit each in its skip mask).
const _: () = assert!(MAX_HEADERS <= super::fields::RAW_MAX);
/// Header spans kept on the stack while a head is split off its buffer; more go on the heap.
const INLINE_SPANS: usize = 24;
/// Room asked for per read. Most heads are well under it (a longer one takes more reads); a
/// request held on a kept-alive connection keeps this much alive with its head.
const READ_CHUNK: usize = 2 * 1024;
/// A body frame up to this size is copied behind the head (one write); a larger one is written
/// from its own buffer.
const COPY_MAX: usize = 16 * 1024;
/// Pending response bytes are written once this much has gathered, even if more frames are
/// ready (the write buffer stays bounded whatever the body does).
const FLUSH_AT: usize = 64 * 1024;
/// The write buffer kept between requests; a larger one is let go.
const KEEP_WRITE_BUF: usize = FLUSH_AT + COPY_MAX;
/// Spare read buffers kept per thread (at most this many times [`READ_CHUNK`] of memory).
const SPARE_MAX: usize = 64;

thread_local! {
    /// Read buffers given back by this thread's connections between requests.
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer with room for [`READ_CHUNK`]: a spare one, or a new one.
fn take_buf() -> BytesMut {
    SPARE
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK))
}

/// Gives an emptied read buffer back to this thread's spares. Kept only if its whole memory is
/// reusable without a new allocation (nothing else shares it) and the spare list has room;
/// otherwise it is freed.
fn give_buf(mut buf: BytesMut) {
    debug_assert!(buf.is_empty());
    if buf.try_reclaim(READ_CHUNK) {
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < SPARE_MAX {
                spare.push(buf);
            }
        });
    }
}

/// How the lane left a connection.
#[derive(Debug)]
pub enum LaneEnd<E> {
    /// Finished: closed by either side, timed out, drained, or failed.
    Closed,
    /// hyper serves the rest of the connection, starting with `prefix` (bytes read, not used).
    /// `early` is the connection's early hold if the lane did not get to use it.
    Handoff { prefix: Bytes, early: Option<E> },
}

/// What one connection's lane needs.
pub struct Lane<'a, H> {
    pub handler: &'a Arc<H>,
    pub peer: SocketAddr,
    pub activity: &'a Arc<ConnActivity>,
    /// The listener settings the connection was accepted under.
    pub limits: &'a Limits,
    /// The connection's drain token.
    pub drain: &'a CancellationToken,
    /// When the first head's clock started: accept, or the end of an early hold.
    pub first_head_from: Instant,
}

/// Serves `stream` until it closes or a request needs hyper (see the module doc). `early` is
/// the connection's first request's early hold, if it had one.
pub async fn serve<H: Handler>(
    lane: Lane<'_, H>,
    stream: &mut TcpStream,
    mut early: Option<H::Early>,
) -> LaneEnd<H::Early> {
    let cap = lane.limits.header_cap().max(READ_CHUNK);
    // No buffer until bytes arrive (see the module doc, "Memory").
    let mut buf = BytesMut::new();
    let mut out: Vec<u8> = Vec::new();
    let mut watchdog = Watchdog::new(lane.limits, lane.first_head_from);
    let drained = lane.drain.cancelled();
    tokio::pin!(drained);
    let mut closing = false;
    loop {
        // A complete head, from what is buffered and what arrives.
        let head = loop {
            if !buf.is_empty() {
                match parse(&mut buf) {
                    Parsed::Head(head) => break head,
                    Parsed::NotForLane => return handoff(buf, early),
                    Parsed::Partial if buf.len() >= cap => return handoff(buf, early),
                    Parsed::Partial => watchdog.head_in_pieces(),
                }
            }
            match wait_for_bytes(stream, &mut buf, &mut watchdog, drained.as_mut(), closing).await {
                Wait::Bytes => {}
                Wait::Closed => return LaneEnd::Closed,
                Wait::Drained => {
                    if buf.is_empty() {
                        return LaneEnd::Closed;
                    }
                    closing = true;
                }
            }
        };
        watchdog.served += 1;
        let keep_alive = head.keep_alive && !closing;
        let (method_head, http10, te_trailers) = (head.method_head, head.http10, head.te_trailers);
        let resp = H::respond(
            lane.handler,
            lane.peer,
            lane.activity.begin(),
            head.req,
            early.take(),
        )
        .await;
        let keep_alive = keep_alive && !lane.drain.is_cancelled();
        let opts = HeadOpts {
            method_head,
            http10,
            keep_alive,
        };
        let ended = write_response(stream, &mut out, resp, opts, te_trailers).await;
        if out.capacity() > KEEP_WRITE_BUF {
            out = Vec::new();
        }
        match ended {
            Ok(true) => {}
            Ok(false) => {
                let _ = stream.shutdown().await;
                return LaneEnd::Closed;
            }
            Err(e) => {
                tracing::debug!(error = %e, "writing the response failed");
                return LaneEnd::Closed;
            }
        }
    }
}

fn handoff<E>(buf: BytesMut, early: Option<E>) -> LaneEnd<E> {
    LaneEnd::Handoff {
        prefix: buf.freeze(),
        early,
    }
}

/// The lane's one timer per connection: the header-read and keep-alive timeouts, checked when
/// it fires rather than moved per request.
struct Watchdog {
    timer: Option<Pin<Box<Sleep>>>,
    head_timeout: Duration,
    keep_alive: Duration,
    /// Heads parsed so far.
    served: u64,
    /// What the armed period watches: `served` then, and whether a head was pending.
    armed: (u64, bool),
}

impl Watchdog {
    fn new(cfg: &Limits, first_head_from: Instant) -> Self {
        let head_timeout = cfg.header_read_timeout;
        let timer = (!head_timeout.is_zero())
            .then(|| Box::pin(tokio::time::sleep_until(first_head_from + head_timeout)));
        Self {
            timer,
            head_timeout,
            keep_alive: cfg.keep_alive_timeout,
            served: 0,
            armed: (0, true),
        }
    }

    /// Whether a head is being waited for: bytes of one are buffered, or none has come yet on
    /// this connection (its first head's clock runs from accept).
    fn head_pending(&self, buf: &BytesMut) -> bool {
        !buf.is_empty() || self.served == 0
    }

    /// A later head is arriving in pieces: it has one header-read timeout from now. (The first
    /// head's clock already runs from accept.)
    fn head_in_pieces(&mut self) {
        if self.served == 0 || self.armed == (self.served, true) {
            return;
        }
        self.arm(true, self.head_timeout);
    }

    /// Before a wait: the timer must not fire later than the state the connection is in now
    /// allows. Re-armed only when the state changed to one with a shorter period (a connection
    /// idle after its first request, whose timer still ran on the first head's header-read
    /// timeout), or when there is no timer yet; a steady stream of requests touches nothing.
    fn ensure(&mut self, head_pending: bool) {
        let want = self.period(head_pending);
        let rearm = match self.timer {
            None => self.armed != (self.served, head_pending),
            Some(_) => self.armed.1 != head_pending && want < self.period(self.armed.1),
        };
        if rearm {
            self.arm(head_pending, want);
        }
    }

    fn period(&self, head_pending: bool) -> Duration {
        if head_pending {
            self.head_timeout
        } else {
            self.keep_alive
        }
    }

    fn arm(&mut self, head_pending: bool, period: Duration) {
        self.armed = (self.served, head_pending);
        if period.is_zero() {
            self.timer = None;
            return;
        }
        let at = Instant::now() + period;
        match self.timer.as_mut() {
            Some(t) => t.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// The timer fired while the connection waited for bytes: whether the connection is done
    /// (the same state lasted a whole period), else re-armed for the state it is in now.
    fn fired(&mut self, head_pending: bool) -> bool {
        if self.armed == (self.served, head_pending) {
            return true;
        }
        self.arm(head_pending, self.period(head_pending));
        false
    }
}

enum Wait {
    Bytes,
    Closed,
    Drained,
}

/// Reads more bytes into `buf`, or tells why not.
async fn wait_for_bytes(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    watchdog: &mut Watchdog,
    mut drained: Pin<&mut tokio_util::sync::WaitForCancellationFuture<'_>>,
    closing: bool,
) -> Wait {
    if buf.is_empty() {
        // Nothing buffered: wait for readability without a buffer, take one to read into.
        if buf.capacity() > 0 {
            give_buf(std::mem::take(buf));
        }
    } else if buf.capacity() - buf.len() < READ_CHUNK / 2 {
        buf.reserve(READ_CHUNK);
    }
    watchdog.ensure(watchdog.head_pending(buf));
    loop {
        let step = std::future::poll_fn(|cx| {
            if buf.capacity() == 0 {
                match stream.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => *buf = take_buf(),
                    Poll::Ready(Err(e)) => return Poll::Ready(Step::Read(Err(e))),
                    Poll::Pending => {}
                }
            }
            if buf.capacity() > 0 {
                match tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, buf) {
                    Poll::Ready(r) => return Poll::Ready(Step::Read(r)),
                    // Readable was a false alarm: back to waiting without a buffer (the
                    // readiness poll above registers the wake-up again).
                    Poll::Pending if buf.is_empty() => give_buf(std::mem::take(buf)),
                    Poll::Pending => {}
                }
            }
            if !closing && drained.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Step::Drained);
            }
            if let Some(t) = watchdog.timer.as_mut()
                && t.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(Step::Timer);
            }
            Poll::Pending
        })
        .await;
        match step {
            Step::Read(Ok(0)) => return Wait::Closed,
            Step::Read(Ok(_)) => return Wait::Bytes,
            Step::Read(Err(e)) => {
                tracing::debug!(error = %e, "reading a request head failed");
                return Wait::Closed;
            }
            Step::Drained => return Wait::Drained,
            Step::Timer => {
                let head_pending = watchdog.head_pending(buf);
                if watchdog.fired(head_pending) {
                    if head_pending {
                        tracing::debug!("header read timeout: closing the connection");
                    } else {
                        tracing::debug!("keep-alive idle timeout");
                    }
                    return Wait::Closed;
                }
            }
        }
    }
}

enum Step {
    Read(io::Result<usize>),
    Drained,
    Timer,
}

/// A parsed head the lane serves.
struct Head {
    req: Request<RawFields>,
    keep_alive: bool,
    method_head: bool,
    http10: bool,
    te_trailers: bool,
}

// A return value taken apart at once: boxing the head would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Head(Head),
    Partial,
    NotForLane,
}

/// Parses the head at the front of `buf` and, if the lane serves it, takes it off the buffer.
/// (Inlined, as are [`build`] and [`check`]: the request is then built where the lane keeps it
/// instead of being moved out through three return values.)
#[inline(always)]
fn parse(buf: &mut BytesMut) -> Parsed {
    let mut slots: [MaybeUninit<httparse::Header<'_>>; MAX_HEADERS] =
        [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::NotForLane,
    };
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Parsed::NotForLane;
    };
    if !path.starts_with('/') || method == "CONNECT" {
        return Parsed::NotForLane;
    }
    // Offsets into the head, so that the head can be split off the buffer and every value
    // becomes a slice of it (one shared buffer, no copy per header).
    let base = buf.as_ptr() as usize;
    // Offsets fit in u32: the head is at most the header cap plus one read.
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start as u32, (start + s.len()) as u32)
    };
    let method_span = at(method.as_bytes());
    let path_span = at(path.as_bytes());
    let count = req.headers.len();
    // A typical head's spans fit on the stack (zeroing room for all `MAX_HEADERS` cost a
    // 1.6 KB memset per request); a longer head's go on the heap.
    let mut inline = [((0u32, 0u32), (0u32, 0u32)); INLINE_SPANS];
    let mut heap = Vec::new();
    let spans: &mut [(Span, Span)] = if count <= INLINE_SPANS {
        &mut inline[..count]
    } else {
        heap.resize(count, ((0, 0), (0, 0)));
        &mut heap
    };
    for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
        *span = (at(h.name.as_bytes()), at(h.value));
    }
    let head = buf.split_to(len).freeze();
    match build(head, method_span, path_span, version, spans) {
        Ok(h) => Parsed::Head(h),
        Err(head) => {
            // Not for the lane after all: hyper reads the head again from the start.
            let mut back = BytesMut::with_capacity(head.len() + buf.len());
            back.extend_from_slice(&head);
            back.extend_from_slice(buf);
            *buf = back;
            Parsed::NotForLane
        }
    }
}

/// The lane's request from a parsed head, or the head back if the lane does not serve it.
#[inline(always)]
fn build(
    head: Bytes,
    method: Span,
    path: Span,
    version: u8,
    fields: &[(Span, Span)],
) -> Result<Head, Bytes> {
    // The fields stay slices of the head (`super::fields`): httparse has checked them as the
    // `http` crate would. Each name is recognised once, here.
    let mut raw = RawFields::with_capacity(head, fields.len());
    let Some((method, uri, flags)) = check(&mut raw, method, path, fields) else {
        return Err(raw.into_head());
    };
    let http10 = version == 0;
    // `close` wins over `keep-alive`, whatever their order; HTTP/1.0 needs `keep-alive`.
    let keep_alive = !flags.close && (!http10 || flags.keep_alive_token);
    let method_head = method == Method::HEAD;
    let mut req = Request::new(raw);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    Ok(Head {
        req,
        keep_alive,
        method_head,
        http10,
        te_trailers: flags.te_trailers,
    })
}

/// What the lane reads of `Connection` and `TE`.
#[derive(Default)]
struct Flags {
    close: bool,
    keep_alive_token: bool,
    te_trailers: bool,
}

/// Adds the fields to `raw` and checks the head is one the lane serves (module doc).
#[inline(always)]
fn check(
    raw: &mut RawFields,
    method: Span,
    path: Span,
    fields: &[(Span, Span)],
) -> Option<(Method, Uri, Flags)> {
    let range = |(s, e): Span| s as usize..e as usize;
    let method = Method::from_bytes(&raw.head()[range(method)]).ok()?;
    let uri = Uri::from_maybe_shared(raw.head().slice(range(path))).ok()?;
    let mut flags = Flags::default();
    let mut length_seen = false;
    for &(name, value_span) in fields {
        let known = raw.push(name, value_span);
        let value = &raw.head()[range(value_span)];
        match known {
            // One `Content-Length: 0` at most: hyper folds repeated ones into one field, and the
            // upstream must get what it would get from hyper (the differential tests).
            Known::ContentLength if value != b"0" || length_seen => return None,
            Known::ContentLength => length_seen = true,
            Known::TransferEncoding | Known::Upgrade | Known::Expect => return None,
            // Values are read as the `http` crate's `to_str` would: visible ASCII only (a
            // `Connection` that is not goes to hyper, a `TE` that is not asks for nothing).
            Known::Connection => {
                if !value.is_ascii() {
                    return None;
                }
                for token in tokens(value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        flags.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        flags.keep_alive_token = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return None;
                    }
                }
            }
            Known::Te => {
                flags.te_trailers =
                    value.is_ascii() && tokens(value).any(|t| t.eq_ignore_ascii_case(b"trailers"));
            }
            _ => {}
        }
    }
    Some((method, uri, flags))
}

fn has_token(v: &HeaderValue, token: &str) -> bool {
    v.to_str()
        .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// What the response head depends on besides the response.
#[derive(Debug, Clone, Copy)]
struct HeadOpts {
    method_head: bool,
    http10: bool,
    keep_alive: bool,
}

/// How the response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body bytes at all.
    None,
    /// Exactly this many bytes left.
    Length(u64),
    Chunked,
    /// Until the connection closes.
    Close,
}

/// Encodes the status line and headers into `out`: a direct upstream's fields as they came
/// (`upstream`), then the response's map; returns the body's framing and whether the
/// connection stays open afterwards.
fn encode_head(
    parts: &http::response::Parts,
    upstream: Option<&UpstreamFields>,
    exact: Option<u64>,
    opts: HeadOpts,
    out: &mut Vec<u8>,
) -> (Framing, bool) {
    let status = parts.status;
    let mut keep_alive = opts.keep_alive
        && !parts
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| has_token(v, "close"));
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut has_date = false;
    // Written once below. Invalid or conflicting values (never from the handler) count as
    // none: the body is framed anew.
    let mut length = ContentLength::default();
    if let Some(upstream) = upstream {
        // Hop-by-hop fields (`Connection`, `Transfer-Encoding`, ...) are already left out.
        upstream.for_each(|known, name, value| match known {
            Known::ContentLength => length.add(value),
            _ => {
                has_date |= known == Known::Date;
                super::fields::put_raw(out, name, value);
            }
        });
    }
    for (name, value) in &parts.headers {
        if *name == header::CONNECTION || *name == header::TRANSFER_ENCODING {
            continue;
        }
        if *name == header::CONTENT_LENGTH {
            length.add(value.as_bytes());
            continue;
        }
        has_date |= *name == header::DATE;
        put_field(out, name, value);
    }
    if !has_date {
        out.extend_from_slice(b"date: ");
        with_date(|d| out.extend_from_slice(d));
        out.extend_from_slice(b"\r\n");
    }
    let no_body = opts.method_head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let length = length.get().ok().flatten();
    let framing = if no_body {
        // A HEAD answer carries the length its GET would have had; 1xx and 204 carry none
        // (RFC 9110 §8.6).
        let bodiless_status = status.is_informational() || status == StatusCode::NO_CONTENT;
        let n = length.or(exact.filter(|&n| n > 0 && opts.method_head));
        if let Some(n) = n.filter(|_| !bodiless_status) {
            content_length(out, n);
        }
        Framing::None
    } else if let Some(n) = length.or(exact) {
        content_length(out, n);
        Framing::Length(n)
    } else if opts.http10 {
        keep_alive = false;
        Framing::Close
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Framing::Chunked
    };
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if opts.http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (framing, keep_alive)
}

fn content_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes the response; `Ok(true)` when the connection can carry another request.
///
/// The head is encoded at once, and only the body and the framing go into the future (a plain
/// function, not an `async fn`, which would keep a second copy of `resp` in its state).
fn write_response<'a>(
    stream: &'a mut TcpStream,
    out: &'a mut Vec<u8>,
    resp: Response<impl ResponseBody>,
    opts: HeadOpts,
    te_trailers: bool,
) -> impl Future<Output = io::Result<bool>> + Send + 'a {
    out.clear();
    let (parts, mut body) = resp.into_parts();
    let upstream = body.take_upstream_fields();
    let exact = body.size_hint().exact();
    let (framing, keep_alive) = encode_head(&parts, upstream.as_deref(), exact, opts, out);
    // Trailers go to a client that asked for them, and only those the response announced in
    // `Trailer` (as hyper's server does). Read only then: most requests never ask.
    let announced = te_trailers.then(|| announced_trailers(&parts.headers, upstream.as_deref()));
    drop((parts, upstream));
    write_body(stream, out, body, framing, keep_alive, announced)
}

/// The body part of [`write_response`], after the head is in `out` (a plain function returning
/// the future, for the same reason).
#[allow(clippy::manual_async_fn)] // see the doc: no second copy of the arguments
fn write_body<'a>(
    stream: &'a mut TcpStream,
    out: &'a mut Vec<u8>,
    mut body: impl ResponseBody,
    framing: Framing,
    keep_alive: bool,
    announced: Option<Vec<HeaderName>>,
) -> impl Future<Output = io::Result<bool>> + Send + 'a {
    async move {
        if framing == Framing::None {
            drop(body);
            stream.write_all(out).await?;
            return Ok(keep_alive);
        }
        let mut left = match framing {
            Framing::Length(n) => n,
            _ => u64::MAX,
        };
        loop {
            // Frames that are ready join the pending bytes; the bytes go out when the body would
            // make us wait, or when a large frame comes.
            let next = std::future::poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
                Poll::Pending if !out.is_empty() => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
                Poll::Ready(frame) => Poll::Ready(Some(frame)),
            })
            .await;
            let frame = match next {
                None => {
                    stream.write_all(out).await?;
                    out.clear();
                    continue;
                }
                Some(None) => break,
                Some(Some(Ok(frame))) => frame,
                Some(Some(Err(e))) => {
                    // The client gets what came before the failure, then the connection closes:
                    // a truncated response, never one that looks complete.
                    tracing::debug!(error = %e, "response body failed");
                    stream.write_all(out).await?;
                    return Ok(false);
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let (Framing::Chunked, Ok(trailers)) = (framing, frame.into_trailers())
                        && let Some(announced) = &announced
                    {
                        write_trailers(out, &trailers, announced);
                        stream.write_all(out).await?;
                        return Ok(keep_alive);
                    }
                    continue;
                }
            };
            if frame.is_empty() {
                continue;
            }
            let data = match framing {
                Framing::Length(_) => {
                    if frame.len() as u64 > left {
                        tracing::debug!("response body longer than its length");
                        let fits = frame.slice(..left as usize);
                        write_data(stream, out, fits).await?;
                        return Ok(false);
                    }
                    left -= frame.len() as u64;
                    frame
                }
                Framing::Chunked => {
                    chunk_line(out, frame.len());
                    frame
                }
                _ => frame,
            };
            let chunked = framing == Framing::Chunked;
            if data.len() <= COPY_MAX {
                out.extend_from_slice(&data);
                if chunked {
                    out.extend_from_slice(b"\r\n");
                }
                if out.len() >= FLUSH_AT {
                    stream.write_all(out).await?;
                    out.clear();
                }
            } else {
                write_data(stream, out, data).await?;
                if chunked {
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
        let complete = match framing {
            Framing::Length(_) => left == 0,
            Framing::Chunked => {
                out.extend_from_slice(b"0\r\n\r\n");
                true
            }
            _ => true,
        };
        if !out.is_empty() {
            stream.write_all(out).await?;
        }
        if !complete {
            tracing::debug!(missing = left, "response body ended short of its length");
        }
        Ok(keep_alive && complete && framing != Framing::Close)
    }
}

/// A chunk-size line: `len` in hex, then CRLF.
fn chunk_line(out: &mut Vec<u8>, len: usize) {
    let mut digits = [0u8; 16];
    let (mut i, mut n) = (digits.len(), len);
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

fn write_trailers(out: &mut Vec<u8>, trailers: &HeaderMap, announced: &[HeaderName]) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        if announced.contains(name) {
            put_field(out, name, value);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// The field names a response announces in `Trailer` (its map's, or a direct upstream's raw
/// fields').
fn announced_trailers(map: &HeaderMap, upstream: Option<&UpstreamFields>) -> Vec<HeaderName> {
    let mut names = Vec::new();
    let mut add = |value: &[u8]| {
        names.extend(tokens(value).filter_map(|t| HeaderName::from_bytes(t).ok()));
    };
    for v in map.get_all(header::TRAILER) {
        add(v.as_bytes());
    }
    if let Some(f) = upstream {
        f.for_each(|known, _, value| {
            if known == Known::Trailer {
                add(value);
            }
        });
    }
    names
}

/// Writes the pending bytes and then `data`, in as few writes as the socket allows.
async fn write_data(stream: &mut TcpStream, out: &mut Vec<u8>, data: Bytes) -> io::Result<()> {
    let (mut a, mut b): (&[u8], &[u8]) = (out, &data);
    while !a.is_empty() || !b.is_empty() {
        let n = stream
            .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    out.clear();
    Ok(())
}

thread_local! {
    /// The `Date` value of the current second, formatted once per second per thread.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            let s = httpdate::fmt_http_date(now);
            if s.len() == text.len() {
                text.copy_from_slice(s.as_bytes());
                *at = secs;
            }
        }
        f(&text[..]);
    });
}

#[cfg(test)]
#[path = "lane_tests.rs"]
mod tests;
