//! thaw's upstream connection pool, over hyper's low-level `client::conn` (HTTP/1.1 and h2c with
//! prior knowledge).
//!
//! Contract:
//! - **Keyed by endpoint address.** HTTP/1.1: a stack of idle connections per endpoint, most
//!   recently used first; a connection is checked out by one request at a time and given back
//!   by [`Reusable::give_back`] once its response body has ended (never while a response is in
//!   flight, so no task per request waits for it to become ready). h2c: one multiplexed
//!   connection per endpoint, shared by every request and replaced when it closes.
//! - **Bounds.** At most [`MAX_IDLE_PER_HOST`] idle HTTP/1.1 connections per endpoint (a
//!   connection given back above that is closed); idle connections, and h2c connections unused
//!   for as long, are closed after [`POOL_IDLE_TIMEOUT`] by a sweep that runs every
//!   [`SWEEP_EVERY`] on the runtime that first connected, so a removed endpoint's connections
//!   go within `POOL_IDLE_TIMEOUT + SWEEP_EVERY`. Closed connections are dropped when seen.
//!   Idle time is counted on the sweep's clock, not read per request: a connection given back
//!   (or an h2c connection used) between two sweeps counts as idle from the second one, so it
//!   is closed between `POOL_IDLE_TIMEOUT` and `POOL_IDLE_TIMEOUT + SWEEP_EVERY` after its last
//!   use, never sooner.
//! - **Connect.** TCP with `TCP_NODELAY`, bounded by the connect timeout. A [`ConnectError`]
//!   means nothing of the request was sent: the caller may retry elsewhere.
//! - **Threads.** An [`Upstream`] works from any runtime (its map sits behind a mutex), but is
//!   meant to be used by one thread ([`Upstream::for_this_thread`]): connection tasks are
//!   spawned on the runtime of the request that opened them, so on a data worker a request and
//!   its upstream connection share one thread and the mutex is never contended.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant, Sleep};
use tracing::Instrument;

use super::Protocol;
use super::direct::{DirectBody, DirectConn, Home};
use super::fields::{BoxedFields, UpstreamFields};

/// Idle pooled HTTP/1.1 connections kept per endpoint. Knative keeps 100; an h2c client
/// multiplexing hundreds of streams onto one HTTP/1.1 replica needs one upstream connection
/// per stream in flight, and with 100 every response beyond them closed its connection and the
/// next stream opened a new one (16 connections x 32 streams: ~3,400 connections a second, p99
/// 2.3x nginx's; docs/benchmarks.md). 512 covers 16 x 32 per data worker.
pub const MAX_IDLE_PER_HOST: usize = 512;
/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often idle connections are swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The body of an upstream request: the client's body, or nothing.
#[derive(Debug)]
pub enum ReqBody {
    /// Nothing to send.
    Empty,
    /// The client's body, streamed as it arrives ([`ClientBody`]).
    Client(ClientBody),
}

impl ReqBody {
    /// `Empty` for a body that has already ended (no data frames to stream).
    pub fn new(body: Incoming) -> Self {
        if body.is_end_stream() {
            ReqBody::Empty
        } else {
            ReqBody::Client(ClientBody {
                body,
                idle: None,
                timer: None,
                waiting: false,
                stalls: None,
            })
        }
    }

    /// Cuts the client's body ([`ClientBodyError::Stalled`]) once it has sent nothing for
    /// `idle` while it was read (the request-body idle timeout), counting the cut in `stalls`.
    pub fn stall_after(mut self, idle: Duration, stalls: &Counter) -> Self {
        if let ReqBody::Client(c) = &mut self {
            c.idle = Some(idle);
            c.stalls = Some(stalls.clone());
        }
        self
    }
}

/// The client's request body as it is forwarded, under the request-body idle timeout: the
/// timer runs only while the body is read and the client has nothing for it (time the upstream
/// spends not reading is not the client's), is restarted by the first wait after each frame,
/// and is allocated on the first wait only, once per body (a body that arrives whole never
/// needs one). Restarting it is a clock read and [`Sleep::reset`]: nothing per frame.
#[derive(Debug)]
pub struct ClientBody {
    body: Incoming,
    idle: Option<Duration>,
    timer: Option<std::pin::Pin<Box<Sleep>>>,
    /// The timer runs for the current wait (no frame since it was set).
    waiting: bool,
    /// Counts the cut.
    stalls: Option<Counter>,
}

impl ClientBody {
    fn poll_frame(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.waiting = false;
                Poll::Ready(frame.map(|r| r.map_err(ClientBodyError::Read)))
            }
            Poll::Pending => {
                let Some(idle) = self.idle else {
                    return Poll::Pending;
                };
                let timer = match &mut self.timer {
                    Some(t) => {
                        if !self.waiting {
                            t.as_mut().reset(Instant::now() + idle);
                        }
                        t
                    }
                    None => self.timer.insert(Box::pin(tokio::time::sleep(idle))),
                };
                self.waiting = true;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        // Once: the exchange ends with this error.
                        self.idle = None;
                        if let Some(c) = self.stalls.take() {
                            c.inc();
                        }
                        Poll::Ready(Some(Err(ClientBodyError::Stalled(idle))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// The client's request body failed while it was forwarded: the client's fault, not the
/// upstream's. hyper's client keeps it as the source of its own error, so
/// [`ClientBodyError::find_in`] finds it.
#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    /// Malformed chunked framing, a length it did not keep, the client gone: 400.
    #[error("the client's request body failed: {0}")]
    Read(#[source] hyper::Error),
    /// Nothing arrived for the request-body idle timeout: 408.
    #[error("the client's request body sent nothing for {0:?}")]
    Stalled(Duration),
}

impl ClientBodyError {
    /// The [`ClientBodyError`] in `err` or anywhere in its chain of sources.
    pub fn find_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a ClientBodyError> {
        let mut e = Some(err);
        while let Some(x) = e {
            if let Some(found) = x.downcast_ref::<ClientBodyError>() {
                return Some(found);
            }
            e = x.source();
        }
        None
    }

    /// Whether `err` or anything in its chain of sources is a [`ClientBodyError`].
    pub fn is_in(err: &(dyn std::error::Error + 'static)) -> bool {
        Self::find_in(err).is_some()
    }

    /// Whether `err` carries a [`ClientBodyError::Stalled`].
    pub fn is_stall_in(err: &(dyn std::error::Error + 'static)) -> bool {
        matches!(Self::find_in(err), Some(ClientBodyError::Stalled(_)))
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self.get_mut() {
            ReqBody::Empty => std::task::Poll::Ready(None),
            ReqBody::Client(b) => b.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Empty => true,
            ReqBody::Client(b) => b.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Empty => SizeHint::with_exact(0),
            ReqBody::Client(b) => b.body.size_hint(),
        }
    }
}

/// Why no connection to an endpoint could be had. Nothing of the request was sent.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connect did not finish within the connect timeout.
    #[error("tcp connect timed out after {0:?}")]
    Timeout(Duration),
    /// The TCP connect failed (refused, unreachable, ...).
    #[error("tcp connect error: {0}")]
    Io(#[source] io::Error),
    /// The HTTP handshake on a new connection failed.
    #[error("handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
}

/// The error type of upstream exchanges and bodies (hyper's client, or [`super::direct`]'s).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request on an established connection failed.
#[derive(Debug)]
pub enum SendError {
    /// The connection was found closed before any of the request was written; the request
    /// comes back whole, so it can be sent again on another connection.
    Unsent(Box<Request<ReqBody>>, BoxError),
    /// The request was (or may have been) sent.
    Failed(BoxError),
    /// No response head before the deadline (the request may have been sent).
    TimedOut,
}

/// An upstream response body: from hyper's client, or read directly ([`super::direct`]).
// Held inside the boxed `ProxiedBody`; boxing the direct body (the common one) as well would be
// an allocation per response.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum RespBody {
    /// Through hyper's client (requests with a body, upgrades, h2c).
    Hyper(Incoming),
    /// Read by the request's own task off a direct connection.
    Direct(DirectBody),
}

impl RespBody {
    /// A direct response's header fields (its map holds none of them), while not taken.
    pub fn upstream_fields_mut(&mut self) -> Option<&mut UpstreamFields> {
        match self {
            RespBody::Direct(b) => b.fields_mut(),
            RespBody::Hyper(_) => None,
        }
    }

    /// Takes a direct response's header fields.
    pub fn take_upstream_fields(&mut self) -> Option<BoxedFields> {
        match self {
            RespBody::Direct(b) => b.take_fields(),
            RespBody::Hyper(_) => None,
        }
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RespBody::Hyper(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            RespBody::Direct(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Hyper(b) => b.is_end_stream(),
            RespBody::Direct(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Hyper(b) => b.size_hint(),
            RespBody::Direct(b) => b.size_hint(),
        }
    }
}

/// A connection checked out for one request.
#[derive(Debug)]
pub struct Conn {
    kind: ConnKind,
    /// Taken from the pool (not opened for this request).
    reused: bool,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug)]
enum ConnKind {
    H1(http1::SendRequest<ReqBody>),
    H2(http2::SendRequest<ReqBody>),
}

impl Conn {
    /// Whether the connection came from the pool rather than being opened for this request
    /// (only a reused connection can turn out stale).
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Sends `req` (HTTP/1.1: origin-form target and a `Host` header; h2c: absolute URI) and
    /// waits for the response head. An HTTP/1.1 connection comes back as the [`Reusable`] to
    /// give back once the response body has ended; h2c connections stay shared in the pool.
    /// (Direct connections are not `Conn`s: see [`Upstream::idle_direct`] and
    /// [`DirectConn::exchange`].) No response head by `deadline` is [`SendError::TimedOut`].
    pub async fn send(
        self,
        req: Request<ReqBody>,
        deadline: Instant,
    ) -> Result<(Response<RespBody>, Option<Reusable>), SendError> {
        let Conn {
            kind, addr, shared, ..
        } = self;
        let hyper_err =
            |mut e: hyper::client::conn::TrySendError<Request<ReqBody>>| match e.take_message() {
                Some(req) => SendError::Unsent(Box::new(req), e.into_error().into()),
                None => SendError::Failed(e.into_error().into()),
            };
        let timed = |r: Result<_, tokio::time::error::Elapsed>| r.map_err(|_| SendError::TimedOut);
        // hyper's sends are boxed: with their timeouts they would double the size of every
        // request's future, direct ones included (moved on each await).
        match kind {
            ConnKind::H1(mut tx) => {
                let sent = Box::pin(tokio::time::timeout_at(deadline, tx.try_send_request(req)));
                match timed(sent.await)? {
                    Ok(resp) => Ok((
                        resp.map(RespBody::Hyper),
                        Some(Reusable { tx, addr, shared }),
                    )),
                    Err(e) => Err(hyper_err(e)),
                }
            }
            ConnKind::H2(mut tx) => {
                let sent = Box::pin(tokio::time::timeout_at(deadline, tx.try_send_request(req)));
                match timed(sent.await)? {
                    Ok(resp) => Ok((resp.map(RespBody::Hyper), None)),
                    Err(e) => Err(hyper_err(e)),
                }
            }
        }
    }
}

/// An HTTP/1.1 connection whose response is in flight. [`Reusable::give_back`] returns it to
/// the pool (call it only once the response body has ended); dropping it instead closes the
/// connection once its current response is done with.
#[derive(Debug)]
pub struct Reusable {
    tx: http1::SendRequest<ReqBody>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Reusable {
    /// Puts the connection back on its endpoint's idle stack, unless it is closed or the stack
    /// is full (then it is closed).
    pub fn give_back(self) {
        if self.tx.is_closed() {
            return;
        }
        let mut map = self.shared.lock();
        let idle = &mut map.entry(self.addr).or_default().h1;
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push(Idle {
                tx: self.tx,
                since: self.shared.idle_from(),
            });
        }
    }
}

#[derive(Debug)]
struct Idle {
    tx: http1::SendRequest<ReqBody>,
    since: Instant,
}

#[derive(Debug)]
struct DirectIdle {
    conn: DirectConn,
    since: Instant,
}

/// One endpoint's pooled connections.
#[derive(Debug, Default)]
struct EndpointConns {
    /// Idle HTTP/1.1 connections, most recently given back last.
    h1: Vec<Idle>,
    /// Idle direct HTTP/1.1 connections (for bodiless requests), most recently given back last.
    direct: Vec<DirectIdle>,
    /// The shared h2c connection and when a request last used it.
    h2: Option<(http2::SendRequest<ReqBody>, Instant)>,
}

type AddrMap = HashMap<SocketAddr, EndpointConns, BuildHasherDefault<AddrHasher>>;

#[derive(Debug)]
pub(super) struct Shared {
    map: Mutex<AddrMap>,
    connect_timeout: Duration,
    sweeping: AtomicBool,
    /// The sweep clock's origin (the pool's creation).
    base: Instant,
    /// When the latest sweep ran, in milliseconds since `base`.
    swept_ms: AtomicU64,
}

impl Shared {
    fn new(connect_timeout: Duration) -> Self {
        Self {
            map: Mutex::new(AddrMap::default()),
            connect_timeout,
            sweeping: AtomicBool::new(false),
            base: Instant::now(),
            swept_ms: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, AddrMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When a connection given back (or used) now starts to count as idle: the next sweep's
    /// time (the latest sweep plus [`SWEEP_EVERY`]), which is no earlier than now while the
    /// sweeps keep their period. No clock is read: giving a connection back is per request.
    fn idle_from(&self) -> Instant {
        self.base + Duration::from_millis(self.swept_ms.load(Relaxed)) + SWEEP_EVERY
    }

    /// Moves the sweep clock to `now` (never back).
    fn sweep_clock_at(&self, now: Instant) {
        let at = now.saturating_duration_since(self.base).as_millis() as u64;
        self.swept_ms.fetch_max(at, Relaxed);
    }

    /// Puts a direct connection whose response has ended on its endpoint's idle stack, unless
    /// the stack is full (then it is closed).
    pub(super) fn give_back_direct(&self, addr: SocketAddr, conn: DirectConn) {
        let mut map = self.lock();
        let idle = &mut map.entry(addr).or_default().direct;
        if idle.len() < MAX_IDLE_PER_HOST {
            idle.push(DirectIdle {
                conn,
                since: self.idle_from(),
            });
        }
    }

    /// Drops closed connections and those idle for [`POOL_IDLE_TIMEOUT`]; forgets endpoints
    /// left without any.
    fn sweep(&self, now: Instant) {
        self.sweep_clock_at(now);
        let mut map = self.lock();
        map.retain(|_, conns| {
            conns.h1.retain(|c| {
                !c.tx.is_closed() && now.saturating_duration_since(c.since) < POOL_IDLE_TIMEOUT
            });
            conns.direct.retain(|c| {
                now.saturating_duration_since(c.since) < POOL_IDLE_TIMEOUT && c.conn.is_usable()
            });
            if conns.h2.as_ref().is_some_and(|(tx, used)| {
                tx.is_closed() || now.saturating_duration_since(*used) >= POOL_IDLE_TIMEOUT
            }) {
                conns.h2 = None;
            }
            !conns.h1.is_empty() || !conns.direct.is_empty() || conns.h2.is_some()
        });
    }
}

/// The first dial's timeout; each next one is [`DIAL_FACTOR`] times longer (Knative's
/// `DialWithBackOff`: 50 ms, x1.4).
const DIAL_FIRST: Duration = Duration::from_millis(50);
const DIAL_FACTOR: f64 = 1.4;

/// The timeouts of the dials made within `budget` (the `connect-timeout`): 50 ms, 70 ms,
/// 98 ms, ... and the rest of the budget last, so they add up to exactly the budget.
pub fn dial_attempts(budget: Duration) -> DialAttempts {
    DialAttempts {
        left: budget,
        next: DIAL_FIRST,
    }
}

/// The iterator [`dial_attempts`] returns.
#[derive(Debug, Clone)]
pub struct DialAttempts {
    left: Duration,
    next: Duration,
}

impl DialAttempts {
    /// Whether the budget is spent (no dial left).
    pub fn spent(&self) -> bool {
        self.left.is_zero()
    }
}

impl Iterator for DialAttempts {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.spent() {
            return None;
        }
        // A last dial shorter than the one before would be cut too soon: fold it in.
        let this = if self.left < self.next * 2 {
            self.left
        } else {
            self.next
        };
        self.left -= this;
        self.next = self.next.mul_f64(DIAL_FACTOR);
        Some(this)
    }
}

/// The pooled upstream connections. Cheap to clone (clones share the pool).
#[derive(Clone, Debug)]
pub struct Upstream {
    shared: Arc<Shared>,
}

thread_local! {
    /// This thread's own pool (see [`Upstream::for_this_thread`]).
    static THREAD_UPSTREAM: std::cell::OnceCell<Arc<Upstream>> = const { std::cell::OnceCell::new() };
}

impl Upstream {
    /// An empty pool whose TCP connects give up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared::new(connect_timeout)),
        }
    }

    /// A pool with the same settings that belongs to the calling thread, built on first use per
    /// thread (the connect timeout is the one at construction). On a single-threaded worker
    /// runtime its connections and the requests using them share one thread.
    pub fn for_this_thread(&self) -> Arc<Self> {
        let timeout = self.shared.connect_timeout;
        THREAD_UPSTREAM.with(|u| u.get_or_init(|| Arc::new(Self::new(timeout))).clone())
    }

    /// A ready connection to `addr`: an idle pooled one (HTTP/1.1), the shared one (h2c), or a
    /// new one. Must run inside a tokio runtime (new connections' tasks are spawned on it).
    pub async fn connect(
        &self,
        addr: SocketAddr,
        protocol: Protocol,
    ) -> Result<Conn, ConnectError> {
        if let Some(kind) = self.checkout(addr, protocol) {
            return Ok(self.conn(kind, addr, true));
        }
        // Boxed: opening a connection is the rare path, and its state (TCP connect, handshake)
        // would otherwise make every request's future several times larger.
        let kind = Box::pin(self.open(addr, protocol)).await?;
        Ok(self.conn(kind, addr, false))
    }

    /// An idle pooled connection of hyper's to `addr` for `protocol`, if one is ready. No
    /// waiting, so no timeout to arm: the usual case of [`Upstream::connect`].
    pub fn pooled_now(&self, addr: SocketAddr, protocol: Protocol) -> Option<Conn> {
        let kind = self.checkout(addr, protocol)?;
        Some(self.conn(kind, addr, true))
    }

    /// The most recently given back direct connection to `addr` that is still usable; unusable
    /// ones met on the way are dropped. No waiting.
    pub fn idle_direct(&self, addr: SocketAddr) -> Option<DirectConn> {
        let mut map = self.shared.lock();
        let idle = &mut map.get_mut(&addr)?.direct;
        while let Some(c) = idle.pop() {
            if c.conn.is_usable() {
                return Some(c.conn);
            }
        }
        None
    }

    /// Opens a new direct connection to `addr` (within the connect timeout).
    pub async fn open_direct(&self, addr: SocketAddr) -> Result<DirectConn, ConnectError> {
        let stream = Box::pin(self.tcp(addr)).await?;
        tracing::debug!(%addr, "direct upstream connection opened");
        Ok(DirectConn::new(stream))
    }

    /// Where a direct connection to `addr` goes back when its response has ended.
    pub fn home(&self, addr: SocketAddr) -> Home {
        Home {
            shared: self.shared.clone(),
            addr,
        }
    }

    /// A TCP connection to `addr` with `TCP_NODELAY` and keep-alive probes
    /// ([`super::limits::set_tcp_keepalive`]), within the connect timeout. A dial that
    /// times out is dialled again at once with a longer timeout ([`dial_attempts`]), as
    /// Knative's `DialWithBackOff` does; a refused or failed dial fails at once.
    ///
    /// Why: a listener whose accept queue is full drops the SYN, and the kernel sends it again
    /// only after a second (`TCP_TIMEOUT_INIT`). A burst of new connections to one replica
    /// (1,000 clients arriving at once at a warm revision, `loadtests/burst.sh`) met that
    /// second and the 1 s connect timeout: a few percent answered 502. A fresh dial after
    /// 50 ms finds the queue drained.
    async fn tcp(&self, addr: SocketAddr) -> Result<TcpStream, ConnectError> {
        self.start_sweeper();
        let budget = self.shared.connect_timeout;
        let mut attempts = dial_attempts(budget);
        let stream = loop {
            let this = attempts.next().unwrap_or(Duration::ZERO);
            match tokio::time::timeout(this, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => break s,
                Ok(Err(e)) => return Err(ConnectError::Io(e)),
                Err(_) if attempts.spent() => return Err(ConnectError::Timeout(budget)),
                Err(_) => tracing::debug!(%addr, timeout = ?this, "dial timed out; dialling again"),
            }
        };
        let _ = stream.set_nodelay(true);
        if let Err(e) = super::limits::set_tcp_keepalive(&stream) {
            tracing::debug!(%addr, error = %e, "cannot set TCP keep-alive on an upstream connection");
        }
        Ok(stream)
    }

    /// Opens a new connection and spawns its task on the current runtime.
    async fn open(&self, addr: SocketAddr, protocol: Protocol) -> Result<ConnKind, ConnectError> {
        let stream = self.tcp(addr).await?;
        let io = TokioIo::new(stream);
        let span = tracing::debug_span!("upstream_conn", %addr);
        let kind = match protocol {
            Protocol::Http1 => {
                let (tx, conn) = http1::Builder::new()
                    .handshake(io)
                    .await
                    .map_err(ConnectError::Handshake)?;
                tokio::spawn(
                    async move {
                        if let Err(e) = conn.with_upgrades().await {
                            tracing::debug!(error = %e, "upstream connection failed");
                        }
                    }
                    .instrument(span),
                );
                ConnKind::H1(tx)
            }
            Protocol::H2c => {
                let (tx, conn) = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .handshake(io)
                    .await
                    .map_err(ConnectError::Handshake)?;
                tokio::spawn(
                    async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "upstream h2 connection failed");
                        }
                    }
                    .instrument(span),
                );
                let mut map = self.shared.lock();
                map.entry(addr).or_default().h2 = Some((tx.clone(), self.shared.idle_from()));
                ConnKind::H2(tx)
            }
        };
        tracing::debug!(%addr, ?protocol, "upstream connection opened");
        Ok(kind)
    }

    fn conn(&self, kind: ConnKind, addr: SocketAddr, reused: bool) -> Conn {
        Conn {
            kind,
            reused,
            addr,
            shared: self.shared.clone(),
        }
    }

    /// The most recently used ready connection; closed ones met on the way are dropped, ones
    /// not ready yet (their connection task has not seen the last response end) stay.
    fn checkout(&self, addr: SocketAddr, protocol: Protocol) -> Option<ConnKind> {
        let mut map = self.shared.lock();
        let conns = map.get_mut(&addr)?;
        match protocol {
            Protocol::Http1 => {
                let mut i = conns.h1.len();
                while i > 0 {
                    i -= 1;
                    let c = &conns.h1[i];
                    if c.tx.is_ready() {
                        return Some(ConnKind::H1(conns.h1.swap_remove(i).tx));
                    }
                    if c.tx.is_closed() {
                        conns.h1.swap_remove(i);
                    }
                }
                None
            }
            Protocol::H2c => match &mut conns.h2 {
                Some((tx, used)) if !tx.is_closed() => {
                    *used = self.shared.idle_from();
                    Some(ConnKind::H2(tx.clone()))
                }
                _ => {
                    conns.h2 = None;
                    None
                }
            },
        }
    }

    /// Starts the periodic sweep on the current runtime, once per pool. The task holds the pool
    /// weakly and ends with it.
    fn start_sweeper(&self) {
        if self.shared.sweeping.swap(true, Relaxed) {
            return;
        }
        // The sweep clock starts with the sweeps: idle time counts from the first one on.
        let started = Instant::now();
        self.shared.sweep_clock_at(started);
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(started + SWEEP_EVERY, SWEEP_EVERY);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                shared.sweep(Instant::now());
            }
        });
    }

    /// Pooled connections to `addr` now: (idle HTTP/1.1, h2c open). Idle HTTP/1.1 counts both
    /// kinds (hyper's and direct).
    pub fn pooled(&self, addr: SocketAddr) -> (usize, bool) {
        let map = self.shared.lock();
        map.get(&addr).map_or((0, false), |c| {
            (c.h1.len() + c.direct.len(), c.h2.is_some())
        })
    }
}

/// FxHash-style hasher for the pool's `SocketAddr` keys: a few multiply-rotates instead of
/// SipHash. The keys are endpoint addresses thaw itself learned, not client input.
#[derive(Default, Clone, Copy)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
