//! One client connection, served: what it speaks (peeked, never consumed), the handler's early
//! hold, the lane, the hand-over to hyper (HTTP/1, or h2c from the start), and what ends or
//! winds a connection down (drain, the header-read timeout, the keep-alive idle timeout).
//!
//! The caller owns the listener, the connection limit and the drain order; [`serve`] owns one
//! connection from its first byte to its close.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::activity::ConnActivity;
use super::head_clock::{HeadClock, HeadIo};
use super::lane::{self, LaneEnd};
use super::{FirstRequest, Handler, Limits};

/// Serves one accepted connection until it closes, times out or is drained (`drain`), under
/// `limits`. `activity` is the connection's (it may hold the caller's connection-limit slot);
/// every request gets a guard of it through the handler. Errors are logged at debug; nothing
/// is returned.
pub async fn serve<H: Handler>(
    handler: Arc<H>,
    stream: TcpStream,
    peer: SocketAddr,
    activity: Arc<ConnActivity>,
    limits: Limits,
    drain: CancellationToken,
) {
    let clock = HeadClock::new();
    // The connection's first request, if it was held before hyper read it (`early`).
    let early_slot: Arc<Mutex<Option<H::Early>>> = Arc::default();
    let handle = {
        let (handler, activity, early_slot, clock) = (
            handler.clone(),
            activity.clone(),
            early_slot.clone(),
            clock.clone(),
        );
        move |req: hyper::Request<Incoming>| {
            // The head is complete. The connection counts as busy from here (so its body bytes
            // do not start the next head's clock) until the request's answer has been sent: the
            // handler keeps the guard through the response body.
            clock.head_received();
            let early = early_slot.lock().unwrap_or_else(|p| p.into_inner()).take();
            H::handle(handler.clone(), peer, activity.begin(), req, early)
        }
    };
    // Until its first bytes, a connection is idle: the keep-alive timeout and drain close it.
    // A new connection must start its first head within the header-read timeout (the clock
    // runs from accept).
    let speaks = tokio::select! {
        speaks = sniff(&stream, limits.header_read_timeout) => speaks,
        _ = drain.cancelled() => return,
        _ = clock.expired(limits.header_read_timeout) => {
            tracing::debug!("header read timeout before the first byte");
            return;
        }
    };
    let mut stream = stream;
    let mut prefix = bytes::Bytes::new();
    if let Ok(Speaks::Http1) = speaks {
        let (early, first_head_from) = match handler.first_request(&stream).await {
            FirstRequest::Pass => (None, clock.accepted()),
            FirstRequest::Held(hold) => (Some(hold), Instant::now()),
            FirstRequest::ClientGone => return,
        };
        if !limits.lane {
            // hyper reads every request; a held first request's head has its whole header-read
            // timeout from the end of the hold.
            if let Some(hold) = early {
                *early_slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(hold);
                clock.head_started_now();
            }
        } else {
            // The fast lane serves the connection until a request needs hyper (boxed: a
            // connection waiting in an early hold carries none of its state).
            let lane = lane::Lane {
                handler: &handler,
                peer,
                activity: &activity,
                limits: &limits,
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
    }
    if let Ok(Speaks::H2c) = speaks {
        clock.speaks_h2();
    }
    let io = TokioIo::new(HeadIo::new(prefix, stream, clock.clone(), activity.clone()));
    let watch = ConnWatch {
        drain,
        clock,
        activity,
        cfg: limits,
    };
    // Boxed once the protocol is known: the task holds only what its protocol needs.
    match speaks {
        Ok(Speaks::Http1) => {
            // HTTP/1 polls the handler's future in place, inside the connection's task.
            let conn = http1_builder(&watch.cfg)
                .serve_connection(io, service_fn(handle))
                .with_upgrades();
            Box::pin(watch.run(conn)).await;
        }
        Ok(Speaks::H2c) => {
            // h2 spawns a task per stream around the handler's future and moves it on the way
            // (into the spawn, into the task's cell): boxed, what moves is a pointer, not the
            // whole future (copying it was most of the memcpy in an h2c request's profile).
            let service = service_fn(move |req| Box::pin(handle(req)));
            let conn = http2_builder(&watch.cfg).serve_connection(io, service);
            Box::pin(watch.run(conn)).await;
        }
        Ok(Speaks::Nothing) => {}
        Err(e) => tracing::debug!(error = %e, "connection failed before its first byte"),
    }
}

/// Resolves once the connection has had no request in progress and no new request for a whole
/// `keep_alive` period (checked every `keep_alive`, so an idle connection closes after one to
/// two periods). Never resolves when `keep_alive` is zero. The header-read timeout does not
/// shorten it: that clock only runs while a request head is arriving (`head_clock`).
async fn idle(activity: &ConnActivity, keep_alive: Duration) {
    super::activity::quiet_for(keep_alive, || activity.load().1, || activity.load().0 != 0).await
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
    cfg: Limits,
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
                // Closing (GOAWAY sent, or `Connection: close` due) but nothing in progress for a
                // whole grace period: a peer that keeps the socket open without finishing a
                // request (an h2 header block never ended) is cut, so every connection ends.
                _ = idle(&self.activity, closing_grace(&self.cfg)), if closing => {
                    tracing::debug!("closing connection idle past its grace: cut");
                    return;
                }
            }
        }
    }
}

/// How long a closing connection may stay open with nothing in progress: the header-read
/// timeout, else the keep-alive timeout, else 10 s (never unbounded).
fn closing_grace(cfg: &Limits) -> Duration {
    [cfg.header_read_timeout, cfg.keep_alive_timeout]
        .into_iter()
        .find(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(10))
}

/// h2 keep-alive PINGs: every this often (at most), and a peer that does not answer one within
/// as long is closed (hyper's `keep_alive_interval` / `keep_alive_timeout`). Bounded by the
/// keep-alive timeout, so a short keep-alive setting pings sooner.
const H2_PING_EVERY: Duration = Duration::from_secs(15);

/// hyper's HTTP/1 header slots when no cap is set (`DEFAULT_MAX_HEADERS`).
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;

/// hyper's HTTP/1.1 server settings for a connection under `cfg`.
fn http1_builder(cfg: &Limits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    // hyper's header-read timer also runs while a keep-alive connection waits for its next
    // request; thaw measures header reads itself (`head_clock`), so hyper's is off.
    b.timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(cfg.header_cap().max(8192));
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

/// hyper's h2c server settings for a connection under `cfg`.
fn http2_builder(cfg: &Limits) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    let ping = match cfg.keep_alive_timeout {
        d if d.is_zero() => H2_PING_EVERY,
        d => d.min(H2_PING_EVERY),
    };
    b.timer(TokioTimer::new())
        .keep_alive_interval(ping)
        .keep_alive_timeout(ping)
        .max_concurrent_streams(cfg.h2_max_concurrent_streams)
        .max_header_list_size(u32::try_from(cfg.header_cap()).unwrap_or(u32::MAX));
    b
}
