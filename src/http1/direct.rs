//! A direct HTTP/1.1 upstream connection for bodiless requests: the request's own task writes
//! the head and reads the response, with no connection task in between.
//!
//! Why: hyper's client runs each connection as a task of its own, so every forwarded request
//! crossed two channels and two task wake-ups (request → connection task → response), and its
//! body a third. On the warm path that was about a tenth of the proxy's CPU per request
//! (docs/decisions.md, "A direct upstream connection for bodiless requests").
//!
//! Contract:
//! - **Scope.** Used by [`super::pool`] for HTTP/1.1 requests without a body and without an
//!   upgrade (GET, HEAD, DELETE, ...: most warm traffic). Requests with a body, upgrades and
//!   h2c still go through hyper's client, which writes a body while it reads an early answer.
//! - **Request.** `METHOD target HTTP/1.1`, the endpoint's `Host`, then the headers exactly as
//!   prepared (the caller has removed hop-by-hop headers and put its additions last), nothing
//!   else added ([`encode_head`]). `proxy::forward` encodes the head once per endpoint and hands
//!   it to [`DirectConn::exchange`].
//! - **Response.** Interim 1xx answers are skipped (as hyper's client does); a `101` is an error
//!   here (upgrades never come this way). The head is limited to [`MAX_HEAD_BYTES`] and
//!   [`MAX_HEADERS`] headers. Framing follows RFC 9112 §6.3: no body for HEAD, 1xx, 204 and
//!   304; `Transfer-Encoding` ending in `chunked` is decoded (trailers become a trailers frame;
//!   `Content-Length` is then dropped, as the RFC requires); other transfer codings and
//!   responses without a length are read until the upstream closes; conflicting or malformed
//!   `Content-Length` values are an error. Body data is handed on as it is read, never
//!   buffered whole. The header fields are not put in a map: they stay slices of the head,
//!   hop-by-hop ones marked, carried by the body ([`DirectBody::take_fields`],
//!   [`super::fields::UpstreamFields`]); the response's own map is empty.
//! - **Reuse.** The connection goes back to its pool the moment the last byte of the body has
//!   been read, unless the upstream said `Connection: close`, answered HTTP/1.0, framed the
//!   body by closing, or sent bytes past the response. A body dropped before its end closes
//!   the connection.
//! - **Response-start deadline.** Writing the head and reading the response head race the
//!   deadline the caller gives ([`DirectError::TimedOut`]). The timer lives with the connection
//!   and is pushed later for each request, which costs one atomic update; a timer per request
//!   was a timer-wheel insert and removal each time. The body is not under it (its idle and
//!   total timeouts are [`super::timed::TimedBody`]'s).
//! - **Staleness.** [`DirectConn::is_usable`] checks an idle connection without a system call
//!   when the reactor has seen nothing on it, and with one non-blocking read otherwise (the
//!   upstream closed it, or sent something unasked: either way it is not reused).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::fields::{BoxedFields, ClientHeaders, Known, RawFields, UpstreamFields, tokens};
use super::pool::Shared;

/// Largest response head accepted (status line and headers), and largest trailer section.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most response headers accepted.
pub const MAX_HEADERS: usize = 128;
// Every parsed field fits a `RawFields` (one bit each in its skip mask).
const _: () = assert!(MAX_HEADERS <= super::fields::RAW_MAX);
/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// How much room a read asks for.
const READ_CHUNK: usize = 8 * 1024;

/// Why a direct exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// Writing the request or reading the response failed.
    #[error("upstream i/o: {0}")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before a complete response head.
    #[error("upstream closed the connection before a complete response head")]
    ClosedBeforeHead,
    /// The upstream closed the connection in the middle of the body.
    #[error("upstream closed the connection mid-body")]
    ClosedMidBody,
    /// The response was not valid HTTP/1.1.
    #[error("invalid upstream response: {0}")]
    Invalid(&'static str),
    /// No complete response head before the response-start deadline.
    #[error("no response head before the response-start deadline")]
    TimedOut,
}

/// One upstream HTTP/1.1 connection, used by one request at a time.
#[derive(Debug)]
pub struct DirectConn {
    io: TcpStream,
    /// Bytes read but not yet used. Empty between responses.
    buf: BytesMut,
    /// The response-start timer, kept across requests (see the module doc).
    timer: Option<Pin<Box<Sleep>>>,
}

/// Why [`DirectConn::exchange`] failed, and whether the request may go elsewhere.
#[derive(Debug)]
pub enum ExchangeError {
    /// Nothing of the head was written: it comes back whole.
    Unsent(Vec<u8>, DirectError),
    /// The head was (or may have been) sent.
    Failed(DirectError),
}

impl DirectConn {
    /// Wraps a connected socket.
    pub fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
            timer: None,
        }
    }

    /// Whether an idle connection can carry another request: the upstream has neither closed
    /// it nor sent anything unasked. No system call unless the reactor saw it readable.
    pub fn is_usable(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Writes `head` (a complete request head for a bodiless request, see [`encode_head`]) and
    /// reads the response head, both before `deadline` (else [`DirectError::TimedOut`]).
    /// `head_only`: the request was `HEAD` (the response has no body whatever it says).
    ///
    /// A plain function returning the exchange (not an `async fn`): an `async fn` keeps a
    /// second copy of each argument in its state, and this state is moved on every request.
    pub fn exchange(
        mut self,
        head: Vec<u8>,
        head_only: bool,
        home: Home,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response<DirectBody>, ExchangeError>> + Send {
        match self.timer.as_mut() {
            Some(t) => t.as_mut().reset(deadline),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        async move {
            if let Err(e) = self.write_head(&head).await {
                // Only a connection the upstream had already reset or closed leaves the request
                // unsent. The write does not say how much went out, so only a reset or broken
                // pipe on a head small enough to go out in one write (an idle connection's
                // socket buffer is empty) counts as unsent; anything else may have reached the
                // upstream.
                return Err(match e {
                    DirectError::Io(e) if unsent_kind(&e) && head.len() <= 16 * 1024 => {
                        ExchangeError::Unsent(head, e.into())
                    }
                    e => ExchangeError::Failed(e),
                });
            }
            drop(head);
            self.read_response(head_only, home)
                .await
                .map_err(ExchangeError::Failed)
        }
    }

    /// Reads until a complete non-1xx head, then frames the body. (A plain function returning
    /// the future, as [`DirectConn::exchange`] is.)
    #[allow(clippy::manual_async_fn)] // see the doc: no second copy of the arguments
    fn read_response(
        mut self,
        head_only: bool,
        home: Home,
    ) -> impl Future<Output = Result<Response<DirectBody>, DirectError>> + Send {
        async move {
            loop {
                // Nothing to parse yet (the usual case right after the request went out).
                if self.buf.is_empty() {
                    if self.fill_head().await? == 0 {
                        return Err(DirectError::ClosedBeforeHead);
                    }
                    continue;
                }
                match parse_head(&mut self.buf)? {
                    Some(Parsed::Interim) => continue,
                    Some(Parsed::Final(resp, keep_alive, seen, mut fields)) => {
                        let framing = framing(resp.status(), &mut fields, head_only, seen)?;
                        let reusable = keep_alive && !matches!(framing, Framing::UntilClose);
                        let body = DirectBody::new(self, framing, reusable, home, fields);
                        return Ok(resp.map(|()| body));
                    }
                    None => {
                        if self.buf.len() >= MAX_HEAD_BYTES {
                            return Err(DirectError::Invalid("response head too large"));
                        }
                        if self.fill_head().await? == 0 {
                            return Err(DirectError::ClosedBeforeHead);
                        }
                    }
                }
            }
        }
    }

    /// Writes the whole head, racing the response-start timer.
    async fn write_head(&mut self, mut head: &[u8]) -> Result<(), DirectError> {
        std::future::poll_fn(|cx| {
            while !head.is_empty() {
                match Pin::new(&mut self.io).poll_write(cx, head) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                    }
                    Poll::Ready(Ok(n)) => head = &head[n..],
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => {
                        ready!(self.poll_timer(cx));
                        return Poll::Ready(Err(DirectError::TimedOut));
                    }
                }
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// Reads once into the buffer (0 at end of stream), racing the response-start timer.
    async fn fill_head(&mut self) -> Result<usize, DirectError> {
        std::future::poll_fn(|cx| match self.poll_fill(cx) {
            Poll::Ready(r) => Poll::Ready(r.map_err(DirectError::from)),
            Poll::Pending => {
                ready!(self.poll_timer(cx));
                Poll::Ready(Err(DirectError::TimedOut))
            }
        })
        .await
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.timer.as_mut() {
            Some(t) => t.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

fn unsent_kind(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::NotConnected
    )
}

/// A bodiless request's head as one buffer: the request line (`target` is the origin-form
/// path and query), `Host: host` if given, the `headers`' forwarded fields, then `extra`.
pub fn encode_head(
    method: &Method,
    target: &str,
    host: Option<&HeaderValue>,
    headers: &ClientHeaders,
    extra: &[(HeaderName, HeaderValue)],
) -> Vec<u8> {
    let method = method.as_str();
    let mut len = method.len() + target.len() + 14 + host.map_or(0, |h| h.len() + 8);
    len += headers.encoded_len();
    for (name, value) in extra {
        len += name.as_str().len() + value.len() + 4;
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(host) = host {
        super::fields::put_field(&mut out, &http::header::HOST, host);
    }
    headers.write_fields(&mut out);
    for (name, value) in extra {
        super::fields::put_field(&mut out, name, value);
    }
    out.extend_from_slice(b"\r\n");
    out
}

// A return value taken apart at once: boxing the final head would cost an allocation per response.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    /// A 1xx answer, consumed.
    Interim,
    /// The final head (body framing still to decide; its map is empty), whether the connection
    /// may be kept, what the framing needs from its headers, and the header fields.
    Final(Response<()>, bool, FramingHeaders, BoxedFields),
}

/// Parses a complete head off the front of `buf`, or `None` if more bytes are needed. Most
/// heads have few headers: they are parsed with room for [`FEW_HEADERS`] on the stack, and only
/// a head with more is parsed again with room for [`MAX_HEADERS`].
fn parse_head(buf: &mut BytesMut) -> Result<Option<Parsed>, DirectError> {
    match parse_head_with::<FEW_HEADERS>(buf) {
        Err(DirectError::Invalid(TOO_MANY)) => parse_head_with::<MAX_HEADERS>(buf),
        other => other,
    }
}

/// Headers parsed on the fast path.
const FEW_HEADERS: usize = 24;
const TOO_MANY: &str = "too many response headers";

fn parse_head_with<const N: usize>(buf: &mut BytesMut) -> Result<Option<Parsed>, DirectError> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(DirectError::Invalid(TOO_MANY)),
        Err(_) => return Err(DirectError::Invalid("malformed response head")),
    };
    let code = parsed.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| DirectError::Invalid("invalid status code"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(DirectError::Invalid(
            "101 Switching Protocols without an upgrade",
        ));
    }
    if status.is_informational() {
        buf.advance(len);
        return Ok(Some(Parsed::Interim));
    }
    let http10 = parsed.version == Some(0);
    // Where each name and value sits in the head, so the head can be split off the buffer and
    // the values become slices of it: one shared buffer, no copy per header.
    let base = buf.as_ptr() as usize;
    let mut spans = [(0u32, 0u32, 0u32, 0u32); N];
    let count = parsed.headers.len();
    for (span, h) in spans.iter_mut().zip(parsed.headers.iter()) {
        let name = h.name.as_ptr() as usize - base;
        let value = h.value.as_ptr() as usize - base;
        // Offsets fit: the head is at most `MAX_HEAD_BYTES` plus one read.
        *span = (
            name as u32,
            (name + h.name.len()) as u32,
            value as u32,
            (value + h.value.len()) as u32,
        );
    }
    let head = buf.split_to(len).freeze();
    // The fields stay slices of the head (`super::fields`); httparse has checked names and
    // values as the `http` crate would.
    let mut fields = RawFields::with_capacity(head, count);
    let mut close = http10;
    let mut seen = FramingHeaders::default();
    for &(ns, ne, vs, ve) in &spans[..count] {
        let known = fields.push((ns, ne), (vs, ve));
        let value = &fields.head()[vs as usize..ve as usize];
        match known {
            Known::ContentLength => seen.length.add(value),
            Known::TransferEncoding => {
                // The last coding of the last field decides (RFC 9112 §6.3).
                seen.transfer_encoding = true;
                seen.chunked_last = value.is_ascii()
                    && value
                        .rsplit(|&b| b == b',')
                        .next()
                        .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
            Known::Connection if value.is_ascii() => {
                for t in tokens(value) {
                    if t.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if http10 && t.eq_ignore_ascii_case(b"keep-alive") {
                        close = false;
                    }
                }
            }
            _ => {}
        }
    }
    seen.http10 = http10;
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    *resp.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    Ok(Some(Parsed::Final(
        resp,
        !close,
        seen,
        Box::new(UpstreamFields::new(fields)),
    )))
}

/// What body framing needs of a response's headers, gathered while the head is parsed (no
/// lookups in the map afterwards).
#[derive(Debug, Default, Clone, Copy)]
struct FramingHeaders {
    /// An HTTP/1.0 response: `Transfer-Encoding` there is faulty framing (RFC 9112 §6.1).
    http10: bool,
    transfer_encoding: bool,
    /// The last `Transfer-Encoding` field ends in `chunked`.
    chunked_last: bool,
    /// Reported only if no `Transfer-Encoding` overrides it.
    length: ContentLength,
}

/// `Content-Length` values merged one by one (RFC 9112 §6.3: a list of equal values is one
/// length; anything else is invalid). Also used by the fast lane on responses it frames.
#[derive(Debug, Clone, Copy)]
pub struct ContentLength(Result<Option<u64>, &'static str>);

impl Default for ContentLength {
    fn default() -> Self {
        Self(Ok(None))
    }
}

impl ContentLength {
    /// `None` when no value was added; the first problem if any value was invalid or they
    /// disagree.
    pub fn get(self) -> Result<Option<u64>, &'static str> {
        self.0
    }

    /// Merges one header value.
    pub fn add(&mut self, b: &[u8]) {
        let Ok(mut length) = self.0 else {
            return;
        };
        // The usual value: digits only (no list, no spaces), at most 19 of them (fits a u64).
        if !b.is_empty() && b.len() <= 19 && b.iter().all(u8::is_ascii_digit) {
            let n = b.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            self.0 = match length {
                Some(l) if l != n => Err("conflicting Content-Length values"),
                _ => Ok(Some(n)),
            };
            return;
        }
        self.0 = (|| {
            let s = std::str::from_utf8(b).map_err(|_| "invalid Content-Length")?;
            for part in s.split(',') {
                let part = part.trim();
                if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("invalid Content-Length");
                }
                let n: u64 = part.parse().map_err(|_| "invalid Content-Length")?;
                if length.is_some_and(|l| l != n) {
                    return Err("conflicting Content-Length values");
                }
                length = Some(n);
            }
            Ok(length)
        })();
    }
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `n` more bytes.
    Length(u64),
    /// Chunked coding, in this state.
    Chunked(Chunk),
    /// Until the upstream closes.
    UntilClose,
    /// Fully read.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// `n` bytes of chunk data left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// Expecting the trailer section (after the last chunk).
    Trailers,
}

/// Decides the body's framing from the head, leaving out a `Content-Length` that
/// `Transfer-Encoding` overrides.
fn framing(
    status: StatusCode,
    fields: &mut UpstreamFields,
    head_only: bool,
    seen: FramingHeaders,
) -> Result<Framing, DirectError> {
    if head_only || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Done);
    }
    if seen.transfer_encoding && seen.http10 {
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (hyper's
        // client refuses it too); a bodiless answer above never reads it.
        return Err(DirectError::Invalid(
            "Transfer-Encoding in an HTTP/1.0 response",
        ));
    }
    if seen.transfer_encoding {
        fields.drop_all(Known::ContentLength);
        return Ok(if seen.chunked_last {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::UntilClose
        });
    }
    Ok(match seen.length.get().map_err(DirectError::Invalid)? {
        Some(0) => Framing::Done,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// Where a connection goes back to: its pool and endpoint.
#[derive(Debug, Clone)]
pub struct Home {
    pub(super) shared: Arc<Shared>,
    pub(super) addr: SocketAddr,
}

/// A response body read straight off its upstream connection.
#[derive(Debug)]
pub struct DirectBody {
    /// `None` once the body has ended (the connection went home) or failed.
    conn: Option<DirectConn>,
    framing: Framing,
    reusable: bool,
    home: Home,
    /// The response's header fields (its map is empty), until the head's writer takes them.
    fields: Option<BoxedFields>,
}

impl DirectBody {
    fn new(
        conn: DirectConn,
        framing: Framing,
        reusable: bool,
        home: Home,
        fields: BoxedFields,
    ) -> Self {
        let mut body = Self {
            conn: Some(conn),
            framing,
            reusable,
            home,
            fields: Some(fields),
        };
        if framing == Framing::Done {
            body.finish();
        }
        body
    }

    /// The response's header fields, while nobody has taken them.
    pub fn fields_mut(&mut self) -> Option<&mut UpstreamFields> {
        self.fields.as_deref_mut()
    }

    /// Takes the response's header fields (the response's map holds none of them).
    pub fn take_fields(&mut self) -> Option<BoxedFields> {
        self.fields.take()
    }

    /// The body has ended: the connection goes home if it can carry another request.
    fn finish(&mut self) {
        self.framing = Framing::Done;
        if let Some(conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            self.home.shared.give_back_direct(self.home.addr, conn);
        }
    }

    fn fail(&mut self, e: DirectError) -> Poll<Option<Result<Frame<Bytes>, DirectError>>> {
        self.conn = None;
        self.framing = Framing::Done;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for DirectBody {
    type Data = Bytes;
    type Error = DirectError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, DirectError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.framing {
                Framing::Done => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Framing::Length(left) => {
                    if !conn.buf.is_empty() {
                        let n = left.min(conn.buf.len() as u64) as usize;
                        let data = conn.buf.split_to(n).freeze();
                        let left = left - n as u64;
                        this.framing = Framing::Length(left);
                        if left == 0 {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    match ready!(conn.poll_fill(cx)) {
                        Ok(0) => return this.fail(DirectError::ClosedMidBody),
                        Ok(_) => {}
                        Err(e) => return this.fail(e.into()),
                    }
                }
                Framing::UntilClose => {
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    match ready!(conn.poll_fill(cx)) {
                        Ok(0) => {
                            this.finish();
                            return Poll::Ready(None);
                        }
                        Ok(_) => {}
                        Err(e) => return this.fail(e.into()),
                    }
                }
                Framing::Chunked(state) => match decode_chunk(&mut conn.buf, state) {
                    Ok(Step::Frame(frame, next)) => {
                        this.framing = next;
                        if next == Framing::Done {
                            this.finish();
                        }
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    Ok(Step::Next(next)) => this.framing = next,
                    Ok(Step::NeedMore) => match ready!(conn.poll_fill(cx)) {
                        Ok(0) => return this.fail(DirectError::ClosedMidBody),
                        Ok(_) => {}
                        Err(e) => return this.fail(e.into()),
                    },
                    Err(e) => return this.fail(e),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// One step of chunked decoding.
enum Step {
    /// A frame to hand on, and the state after it.
    Frame(Frame<Bytes>, Framing),
    /// Moved on without a frame.
    Next(Framing),
    /// The buffer holds too little to move on.
    NeedMore,
}

/// Decodes what the buffer allows from `state` (RFC 9112 §7.1).
fn decode_chunk(buf: &mut BytesMut, state: Chunk) -> Result<Step, DirectError> {
    match state {
        Chunk::Size => {
            let Some(end) = find_crlf(buf) else {
                return if buf.len() > MAX_CHUNK_LINE {
                    Err(DirectError::Invalid("chunk-size line too long"))
                } else {
                    Ok(Step::NeedMore)
                };
            };
            let line = &buf[..end];
            let digits = line
                .iter()
                .position(|b| !b.is_ascii_hexdigit())
                .unwrap_or(line.len());
            let rest = &line[digits..];
            if digits == 0
                || digits > 16
                || !(rest.is_empty() || matches!(rest[0], b';' | b' ' | b'\t'))
            {
                return Err(DirectError::Invalid("invalid chunk size"));
            }
            let size = std::str::from_utf8(&line[..digits])
                .ok()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or(DirectError::Invalid("invalid chunk size"))?;
            buf.advance(end + 2);
            Ok(Step::Next(Framing::Chunked(if size == 0 {
                Chunk::Trailers
            } else {
                Chunk::Data(size)
            })))
        }
        Chunk::Data(left) => {
            if buf.is_empty() {
                return Ok(Step::NeedMore);
            }
            let n = left.min(buf.len() as u64) as usize;
            let data = buf.split_to(n).freeze();
            let left = left - n as u64;
            let next = if left == 0 {
                Chunk::DataEnd
            } else {
                Chunk::Data(left)
            };
            Ok(Step::Frame(Frame::data(data), Framing::Chunked(next)))
        }
        Chunk::DataEnd => {
            if buf.len() < 2 {
                return Ok(Step::NeedMore);
            }
            if &buf[..2] != b"\r\n" {
                return Err(DirectError::Invalid("missing CRLF after chunk data"));
            }
            buf.advance(2);
            Ok(Step::Next(Framing::Chunked(Chunk::Size)))
        }
        Chunk::Trailers => {
            if buf.starts_with(b"\r\n") {
                buf.advance(2);
                return Ok(Step::Next(Framing::Done));
            }
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                return if buf.len() > MAX_HEAD_BYTES {
                    Err(DirectError::Invalid("trailer section too large"))
                } else {
                    Ok(Step::NeedMore)
                };
            };
            let section = buf.split_to(end + 4).freeze();
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let trailers = match httparse::parse_headers(&section, &mut slots) {
                Ok(httparse::Status::Complete((_, parsed))) => {
                    let mut map = HeaderMap::with_capacity(parsed.len());
                    for h in parsed {
                        let name = HeaderName::from_bytes(h.name.as_bytes())
                            .map_err(|_| DirectError::Invalid("invalid trailer name"))?;
                        let value = HeaderValue::from_maybe_shared(section.slice_ref(h.value))
                            .map_err(|_| DirectError::Invalid("invalid trailer value"))?;
                        map.append(name, value);
                    }
                    map
                }
                _ => return Err(DirectError::Invalid("malformed trailer section")),
            };
            Ok(Step::Frame(Frame::trailers(trailers), Framing::Done))
        }
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
