//! The HTTP/1 engine: thaw's own HTTP/1.1 server loop and upstream client, in front of hyper,
//! with the raw header fields, the head clock, body framing and the upstream connection pool
//! they share. The activator and the queue sidecar are each a [`Handler`] plugged into it.
//!
//! **What it serves itself** ([`conn::serve`], [`lane`]): on an HTTP/1 connection, every
//! request whose head parses and that has no body, no upgrade, no `Expect`, an origin-form
//! target and a method other than `CONNECT`. Its fields stay slices of the head
//! ([`fields::RawFields`]); the handler's response is written with exact framing, `Date` added,
//! keep-alive and pipelining as RFC 9112 says (the lane's module doc has the whole contract).
//!
//! **What it hands to hyper:** the first request the lane does not serve, and every request
//! after it on that connection, go to hyper's HTTP/1 server with the bytes already read; an h2c
//! connection (prior-knowledge preface, seen by peeking before any byte is consumed) is hyper's
//! HTTP/2 server's from the start. Either way the handler answers through the same interface.
//!
//! **Upstream** ([`pool`], [`direct`]): a pool of HTTP/1.1 and h2c connections per endpoint
//! address; bodiless HTTP/1.1 exchanges are written and read by [`direct`] (fields as slices of
//! the response head, hop-by-hop ones dropped), everything else by hyper's client. A
//! [`pool::ConnectError`] means nothing of the request was sent.
//!
//! **What it guarantees:** every connection is bounded in time ([`Limits`]: the header-read
//! timeout from the first byte of each head, the keep-alive timeout between requests, drain),
//! in memory (the header cap bounds what is buffered per head; idle connections hold no read
//! buffer) and in count (the caller's accept loop). The handler never sees a malformed request:
//! the lane hands those to hyper, which answers them itself.
//!
//! **What it knows nothing of:** revisions, routing, holding, throttling, cold starts and
//! metric names. It uses only the `http`/`hyper`/`tokio` stack; a handler learns what it needs
//! (the peer, the connection's activity guard, the request) through [`Handler`], and timings and
//! errors come back through the engine's own types ([`pool::SendError`], [`direct::DirectError`],
//! [`fields::UpstreamFields`]).

pub mod activity;
pub mod conn;
pub mod direct;
pub mod fields;
pub mod grpc;
pub mod head_clock;
pub mod host;
pub mod lane;
pub mod limits;
pub mod pool;
pub mod served;
pub mod timed;
pub mod tunnel;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use tokio::net::TcpStream;
use tokio::time::Duration;

use self::activity::ConnActive;
use self::fields::{BoxedFields, ClientHeaders, HeadersRef, RawFields};
use self::pool::ReqBody;

/// The error type of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The protocol an upstream speaks: h2c with prior knowledge, or HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Http1,
    H2c,
}

/// The per-connection limits the engine enforces, copied from the caller's live settings when
/// the connection is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head must be complete within this of its first byte (0 = no limit).
    pub header_read_timeout: Duration,
    /// An idle connection closes after one to two of these with no request (0 = never).
    pub keep_alive_timeout: Duration,
    /// The caller's header byte limit: the engine buffers a little more than this per head, so
    /// the handler (not the engine) answers a head that is too large, with its reason.
    pub max_header_bytes: u32,
    /// The caller's header count limit (the same way).
    pub max_header_count: u32,
    /// Concurrent streams per h2c connection.
    pub h2_max_concurrent_streams: u32,
    /// Whether the lane serves what it can (`false`: hyper's server reads every request).
    pub lane: bool,
}

impl Limits {
    /// The most head bytes buffered per connection: above the handler's header limit, so the
    /// handler answers 431 with a reason rather than hyper without one, and still bounded.
    pub fn header_cap(&self) -> usize {
        (self.max_header_bytes as usize)
            .saturating_mul(2)
            .max(16 * 1024)
            + 8192
    }
}

/// A response body the engine can write: streamed frames, plus the raw header fields of a
/// direct upstream response, which the response's map does not hold.
pub trait ResponseBody:
    http_body::Body<Data = Bytes, Error = BoxError> + Send + Unpin + 'static
{
    /// A direct upstream response's header fields ([`fields::UpstreamFields`]): whoever writes
    /// the response head takes them (the lane writes them as they are, hyper's server gets them
    /// merged into the map).
    fn take_upstream_fields(&mut self) -> Option<BoxedFields>;
}

/// What a request's body type tells a handler: where the request's header fields are and what
/// body it forwards.
/// - hyper's [`Incoming`] (a connection hyper's server reads): the request's `HeaderMap`, and
///   that body;
/// - [`RawFields`] (a bodiless request the lane read): the fields are slices of the lane's head
///   carried in the body's place (the request's map stays empty), and no body;
/// - `()`: the request's map, and no body.
pub trait ClientRequest: Sized {
    /// The request's header fields.
    fn fields(req: &Request<Self>) -> HeadersRef<'_>;
    /// The fields, owned, and the body as the upstream request's.
    fn split(headers: HeaderMap, body: Self) -> (ClientHeaders, ReqBody);
}

impl ClientRequest for Incoming {
    fn fields(req: &Request<Self>) -> HeadersRef<'_> {
        HeadersRef::Map(req.headers())
    }
    fn split(headers: HeaderMap, body: Self) -> (ClientHeaders, ReqBody) {
        (ClientHeaders::Map(headers), ReqBody::new(body))
    }
}

impl ClientRequest for () {
    fn fields(req: &Request<Self>) -> HeadersRef<'_> {
        HeadersRef::Map(req.headers())
    }
    fn split(headers: HeaderMap, (): Self) -> (ClientHeaders, ReqBody) {
        (ClientHeaders::Map(headers), ReqBody::Empty)
    }
}

impl ClientRequest for RawFields {
    fn fields(req: &Request<Self>) -> HeadersRef<'_> {
        HeadersRef::Raw(req.body())
    }
    fn split(_empty: HeaderMap, fields: Self) -> (ClientHeaders, ReqBody) {
        (ClientHeaders::Raw(fields), ReqBody::Empty)
    }
}

/// What became of a connection's first request before the engine read it ([`Handler::first_request`]).
#[derive(Debug)]
pub enum FirstRequest<E> {
    /// Not held: the engine reads it as any other.
    Pass,
    /// Held by the handler; `E` goes back to it with the request once the head is read.
    Held(E),
    /// The client closed the connection while its request was held.
    ClientGone,
}

/// What the engine calls: the activator's request path, or the queue sidecar's.
///
/// Static dispatch throughout (the lane is monomorphised per handler), so the interface costs
/// nothing on the warm path.
pub trait Handler: Send + Sync + Sized + 'static {
    /// The response body.
    type Body: ResponseBody;
    /// What the handler keeps of a request it held before its head was read (`()` if it never
    /// holds early).
    type Early: Send + 'static;

    /// Before the engine reads anything of a new HTTP/1 connection: the handler may peek at the
    /// stream (never consume) and hold the first request. Default: never holds.
    fn first_request<'a>(
        &'a self,
        stream: &'a TcpStream,
    ) -> impl Future<Output = FirstRequest<Self::Early>> + Send + 'a {
        let _ = stream;
        std::future::ready(FirstRequest::Pass)
    }

    /// Answers one request read by the lane (borrowing the handler: no reference count moved
    /// per request). Never fails: every error is a response. `conn` marks the connection busy
    /// until dropped (keep it until the response body ends); `early` is the request's
    /// [`FirstRequest::Held`] value, if it was held.
    fn respond<'a, B: ClientRequest + Send + 'static>(
        this: &'a Arc<Self>,
        peer: SocketAddr,
        conn: ConnActive,
        req: Request<B>,
        early: Option<Self::Early>,
    ) -> impl Future<Output = Response<Self::Body>> + Send + 'a;

    /// Answers one request read by hyper's server (HTTP/1 after a hand-over, or h2c). The
    /// response's upstream fields must already be in its map (hyper writes the map alone).
    fn handle(
        this: Arc<Self>,
        peer: SocketAddr,
        conn: ConnActive,
        req: Request<Incoming>,
        early: Option<Self::Early>,
    ) -> impl Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;
}
