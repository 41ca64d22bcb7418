//! Listeners and drain: the data port (HTTP/1.1 and h2c with prior knowledge on one socket) and
//! the admin port, the `config-activator` connection limits, and graceful shutdown.
//!
//! Drain, in order: `shutdown` fires -> readiness fails at once (`/readyz`, kubelet probes on the
//! data port) -> new connections are still accepted for `drain-delay` so load balancers notice
//! -> the data listener closes, every connection is told to finish (HTTP/1: close after the
//! current response; h2: GOAWAY), held and in-flight requests complete -> after `drain-timeout`
//! whatever is left (connections, websocket tunnels) is cut.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::core::Activator;
use super::early::{self, Early};
use super::head_clock::{HeadClock, HeadIo};
use super::lane::{self, LaneEnd};
use super::pipeline::{self, EarlyHold};
use super::ticket::ConnActivity;
use crate::config::ActivatorConfig;

/// Open data-port connections, against `max-connections`.
#[derive(Debug, Default)]
struct ConnLimit {
    open: AtomicU32,
    closed: Notify,
}

/// Decrements the open count when a connection task ends, however it ends.
struct ConnSlot(Arc<ConnLimit>, prometheus_client::metrics::gauge::Gauge);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, SeqCst);
        self.1.dec();
        self.0.closed.notify_one();
    }
}

impl Activator {
    /// Serves the data and admin listeners until `shutdown` completes, then drains (see the
    /// module doc) and returns. Also runs the 1 s stats reporter and the catalog watch for as
    /// long as it serves. Returns an error only if accepting on the data listener fails
    /// persistently; per-connection errors are logged at debug.
    pub async fn serve(
        self: Arc<Self>,
        data: TcpListener,
        admin: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let mut background = JoinSet::new();
        background.spawn(self.clone().watch_catalog());
        background.spawn(super::report::run(self.clone()));
        let admin_stop = CancellationToken::new();
        background.spawn(super::admin::serve(self.clone(), admin, admin_stop.clone()));

        let limit = Arc::new(ConnLimit::default());
        let drain = CancellationToken::new();
        let mut conns = JoinSet::new();
        tracing::info!(addr = ?data.local_addr().ok(), "activator serving");

        tokio::pin!(shutdown);
        let result = loop {
            tokio::select! {
                _ = &mut shutdown => break Ok(()),
                Some(_) = conns.join_next() => {}
                accepted = accept(&data, &limit, &self) => match accepted {
                    Ok((stream, peer)) => self.spawn_conn(&mut conns, stream, peer, &limit, &drain),
                    Err(e) => break Err(e),
                },
            }
        };
        self.start_draining();
        let cfg = self.deps.config.load_full();
        tracing::info!(delay = ?cfg.drain_delay, timeout = ?cfg.drain_timeout, "draining");
        if result.is_ok() {
            // Keep accepting during the delay so load balancers see readiness fail first.
            let delay = tokio::time::sleep(cfg.drain_delay);
            tokio::pin!(delay);
            loop {
                tokio::select! {
                    _ = &mut delay => break,
                    Some(_) = conns.join_next() => {}
                    accepted = accept(&data, &limit, &self) => match accepted {
                        Ok((stream, peer)) => self.spawn_conn(&mut conns, stream, peer, &limit, &drain),
                        Err(_) => break,
                    },
                }
            }
        }
        drop(data);
        drain.cancel();
        self.tunnels.close();
        let finished = tokio::time::timeout(cfg.drain_timeout, async {
            while conns.join_next().await.is_some() {}
            self.tunnels.wait().await;
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                connections = conns.len(),
                tunnels = self.tunnels.len(),
                "drain timeout: cutting what is left"
            );
            conns.abort_all();
            self.tunnel_cancel.cancel();
            while conns.join_next().await.is_some() {}
        }
        admin_stop.cancel();
        background.abort_all();
        while background.join_next().await.is_some() {}
        tracing::info!("activator stopped");
        result
    }

    fn spawn_conn(
        self: &Arc<Self>,
        conns: &mut JoinSet<()>,
        stream: TcpStream,
        peer: SocketAddr,
        limit: &Arc<ConnLimit>,
        drain: &CancellationToken,
    ) {
        let _ = stream.set_nodelay(true);
        if let Err(e) = super::limits::set_tcp_keepalive(&stream) {
            tracing::debug!(error = %e, "cannot set TCP keep-alive on a client connection");
        }
        let cfg = self.deps.config.load_full();
        let slot = ConnSlot(
            limit.clone(),
            self.deps.telemetry.activator.connections.clone(),
        );
        slot.1.inc();
        // The slot lives as long as the connection and any tunnel it was upgraded into.
        let activity = Arc::new(ConnActivity::holding(slot));
        let act = self.clone();
        let task_act = self.clone();
        let conn_activity = activity.clone();
        // The connection's first request, if it was held before hyper read it (`early`).
        let early_slot: Arc<Mutex<Option<EarlyHold>>> = Arc::default();
        let service_early = early_slot.clone();
        let clock = HeadClock::new();
        let service_clock = clock.clone();
        let service = service_fn(move |req: hyper::Request<Incoming>| {
            // The head is complete. The connection counts as busy from here (so its body bytes
            // do not start the next head's clock) until the request's answer has been sent: the
            // pipeline keeps the guard in the request's ticket, through the response body.
            service_clock.head_received();
            let early = service_early
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            pipeline::handle(act.clone(), peer, conn_activity.begin(), req, early)
        });
        // A child token per connection: waiting on it polls this connection's own notifier, not
        // one shared by every connection on every worker (the connection task polls it on each
        // wake).
        let drain = drain.child_token();
        // With workers, the socket moves to the next worker's reactor (registered there, so its
        // readiness wakes that thread and no other).
        let (stream, worker) = match self.workers.get() {
            Some(w) => match stream.into_std() {
                Ok(std) => (Accepted::Std(std), Some(w.next().clone())),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot hand the connection to a worker");
                    return;
                }
            },
            None => (Accepted::Tokio(stream), None),
        };
        let task = async move {
            let stream = match stream.into_tokio() {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot register the connection");
                    return;
                }
            };
            // Until its first bytes, a connection is idle: the keep-alive timeout and drain
            // close it.
            // A new connection must start its first head within the header-read timeout (the
            // clock runs from accept).
            let speaks = tokio::select! {
                speaks = sniff(&stream, cfg.header_read_timeout) => speaks,
                _ = drain.cancelled() => return,
                _ = clock.expired(cfg.header_read_timeout) => {
                    tracing::debug!("header read timeout before the first byte");
                    return;
                }
            };
            let mut stream = stream;
            let mut prefix = bytes::Bytes::new();
            if let Ok(Speaks::Http1) = speaks {
                let (early, first_head_from) = match early::first_request(&task_act, &stream).await
                {
                    Early::Pass => (None, clock.accepted()),
                    Early::Held(hold) => (Some(hold), Instant::now()),
                    Early::ClientGone => return,
                };
                // The fast lane serves the connection until a request needs hyper (boxed: a
                // connection waiting in an early hold carries none of its state).
                let lane = lane::Lane {
                    act: &task_act,
                    peer,
                    activity: &activity,
                    cfg: &cfg,
                    drain: &drain,
                    first_head_from,
                };
                match Box::pin(lane::serve(lane, &mut stream, early)).await {
                    LaneEnd::Closed => return,
                    LaneEnd::Handoff {
                        prefix: rest,
                        early,
                    } => {
                        tracing::debug!("request handed to hyper");
                        if let Some(hold) = early {
                            *early_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(hold);
                        }
                        clock.head_started_now();
                        prefix = rest;
                    }
                }
            }
            let io = TokioIo::new(HeadIo::new(prefix, stream, clock.clone(), activity.clone()));
            let watch = ConnWatch {
                drain,
                clock,
                activity,
                cfg,
            };
            // Boxed once the protocol is known: the task holds only what its protocol needs.
            match speaks {
                Ok(Speaks::Http1) => {
                    let conn = http1_builder(&watch.cfg)
                        .serve_connection(io, service)
                        .with_upgrades();
                    Box::pin(watch.run(conn)).await;
                }
                Ok(Speaks::H2c) => {
                    let conn = http2_builder(&watch.cfg).serve_connection(io, service);
                    Box::pin(watch.run(conn)).await;
                }
                Ok(Speaks::Nothing) => {}
                Err(e) => tracing::debug!(error = %e, "connection failed before its first byte"),
            }
        }
        .instrument(tracing::debug_span!("conn", %peer));
        match worker {
            Some(handle) => conns.spawn_on(task, &handle),
            None => conns.spawn(task),
        };
    }
}

/// An accepted connection: registered with this runtime, or detached for a worker's.
enum Accepted {
    Tokio(TcpStream),
    Std(std::net::TcpStream),
}

impl Accepted {
    /// The stream registered with the current runtime's reactor.
    fn into_tokio(self) -> io::Result<TcpStream> {
        match self {
            Accepted::Tokio(s) => Ok(s),
            Accepted::Std(s) => TcpStream::from_std(s),
        }
    }
}

/// Waits for a free connection slot under `max-connections` (live config), then accepts.
async fn accept(
    listener: &TcpListener,
    limit: &ConnLimit,
    act: &Activator,
) -> io::Result<(TcpStream, SocketAddr)> {
    loop {
        let max = act.deps.config.load().max_connections;
        let notified = limit.closed.notified();
        if limit.open.load(SeqCst) < max {
            break;
        }
        notified.await;
    }
    loop {
        match listener.accept().await {
            Ok(pair) => {
                limit.open.fetch_add(1, SeqCst);
                return Ok(pair);
            }
            // Per-connection failures (reset before accept, fd exhaustion) must not stop the
            // listener; back off briefly on resource errors.
            Err(e) if is_transient(&e) => {
                tracing::warn!(error = %e, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e.raw_os_error().is_some_and(|c| c == 24 || c == 23) // EMFILE, ENFILE
}

/// Resolves once the connection has had no request in progress and no new request for a whole
/// `keep_alive` period (checked every `keep_alive`, so an idle connection closes after one to
/// two periods). Never resolves when `keep_alive` is zero. The header-read timeout does not
/// shorten it: that clock only runs while a request head is arriving (`head_clock`).
async fn idle(activity: &ConnActivity, keep_alive: Duration) {
    super::ticket::quiet_for(keep_alive, || activity.load().1, || activity.load().0 != 0).await
}

/// What a new connection speaks, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// Anything but the HTTP/2 preface (hyper answers garbage with 400).
    Http1,
    /// HTTP/2 with prior knowledge (h2c).
    H2c,
    /// Closed before sending a byte.
    Nothing,
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Tells HTTP/1 from h2c by peeking at the first bytes, which stay in the socket for hyper.
/// (hyper-util's auto server reads them into a prefix instead, which makes hyper grow its
/// 8 KiB read buffer to 16 KiB on every connection, copying it: held requests paid for that.)
///
/// A client that sends part of the preface has `head_timeout` (the header-read timeout) to send
/// the rest, as any request head; after that the connection is closed (`Speaks::Nothing`).
async fn sniff(stream: &TcpStream, head_timeout: Duration) -> io::Result<Speaks> {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut partial_deadline = None;
    loop {
        match partial_deadline {
            None => stream.readable().await?,
            Some(at) => match tokio::time::timeout_at(at, stream.readable()).await {
                Ok(ready) => ready?,
                Err(_) => {
                    tracing::debug!("partial HTTP/2 preface: header read timeout");
                    return Ok(Speaks::Nothing);
                }
            },
        }
        // `try_io` clears readiness on WouldBlock, so a partial preface waits for more bytes
        // rather than spinning.
        let seen = stream.try_io(tokio::io::Interest::READABLE, || {
            let n = nix::sys::socket::recv(fd, &mut buf, nix::sys::socket::MsgFlags::MSG_PEEK)
                .map_err(io::Error::from)?;
            if n == 0 {
                Ok(Speaks::Nothing)
            } else if buf[..n] != H2_PREFACE[..n] {
                Ok(Speaks::Http1)
            } else if n == H2_PREFACE.len() {
                Ok(Speaks::H2c)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            }
        });
        match seen {
            Ok(speaks) => return Ok(speaks),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                partial_deadline.get_or_insert_with(|| Instant::now() + head_timeout);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A served connection that can be asked to finish gracefully.
trait Graceful: Future<Output = Result<(), hyper::Error>> {
    fn finish(self: std::pin::Pin<&mut Self>);
}

impl<I, S> Graceful for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    Self: Future<Output = Result<(), hyper::Error>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn finish(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    Self: Future<Output = Result<(), hyper::Error>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn finish(self: std::pin::Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// What ends or winds down a served connection: drain, the header-read timeout, the keep-alive
/// idle timeout.
struct ConnWatch {
    drain: CancellationToken,
    clock: Arc<HeadClock>,
    activity: Arc<ConnActivity>,
    cfg: Arc<ActivatorConfig>,
}

impl ConnWatch {
    async fn run(self, conn: impl Graceful) {
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            // Biased, the connection first: after an early hold its first head is waiting in
            // the socket, and hyper must read it before a drain may close an idle connection.
            tokio::select! {
                biased;
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                _ = self.drain.cancelled(), if !closing => {
                    conn.as_mut().finish();
                    closing = true;
                }
                _ = self.clock.expired(self.cfg.header_read_timeout), if !closing => {
                    tracing::debug!("header read timeout: closing the connection");
                    return;
                }
                _ = idle(&self.activity, self.cfg.keep_alive_timeout), if !closing => {
                    tracing::debug!("keep-alive idle timeout");
                    conn.as_mut().finish();
                    closing = true;
                }
            }
        }
    }
}

/// hyper's own header caps sit above the configured header limits, so the client gets our 431
/// with a reason rather than hyper's bare one; hyper's cap still bounds the bytes buffered per
/// connection.
pub(super) fn header_cap(cfg: &ActivatorConfig) -> usize {
    (cfg.max_header_bytes as usize)
        .saturating_mul(2)
        .max(16 * 1024)
        + 8192
}

/// hyper's HTTP/1 header slots when no cap is set (`DEFAULT_MAX_HEADERS`).
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;

/// The data port's HTTP/1.1 settings from the live config.
fn http1_builder(cfg: &ActivatorConfig) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    // hyper's header-read timer also runs while a keep-alive connection waits for its next
    // request; thaw measures header reads itself (`head_clock`), so hyper's is off.
    b.timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(header_cap(cfg).max(8192));
    // hyper parses into a stack array of 100 header slots unless told a cap, in which case it
    // fills `cap` slots on every request (on the heap above 100: 7 KiB at 216). So the cap is
    // set only when the configured count is above 100, to one more than it, so that thaw's
    // check (431 with the reason) sees the request first. With a count of 100 or less (the
    // default is 100), a request with more than 100 headers gets hyper's own 431, without a
    // reason.
    let count = cfg.max_header_count as usize;
    if count > HYPER_DEFAULT_MAX_HEADERS {
        b.max_headers(count + 1);
    }
    b
}

/// The data port's h2c settings from the live config.
fn http2_builder(cfg: &ActivatorConfig) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(cfg.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(header_cap(cfg)).unwrap_or(u32::MAX));
    b
}
