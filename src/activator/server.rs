//! Listeners and drain: the data port (HTTP/1.1 and h2c with prior knowledge on one socket,
//! each connection served by the HTTP/1 engine, `crate::http1::conn`) and the admin port, the
//! `config-activator` connection limits, and graceful shutdown.
//!
//! Drain, in order: `shutdown` fires -> readiness fails at once (`/readyz`, kubelet probes on the
//! data port) -> new connections are still accepted for `drain-delay` so load balancers notice
//! -> the data listener closes, every connection is told to finish (HTTP/1: close after the
//! current response; h2: GOAWAY), held and in-flight requests complete -> after `drain-timeout`
//! whatever is left (connections, websocket tunnels) is cut.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::core::Activator;
use crate::config::ActivatorConfig;
use crate::http1::{self, activity::ConnActivity};

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
        if let Err(e) = http1::limits::set_tcp_keepalive(&stream) {
            tracing::debug!(error = %e, "cannot set TCP keep-alive on a client connection");
        }
        let limits = conn_limits(&self.deps.config.load());
        let slot = ConnSlot(
            limit.clone(),
            self.deps.telemetry.activator.connections.clone(),
        );
        slot.1.inc();
        // The slot lives as long as the connection and any tunnel it was upgraded into.
        let activity = Arc::new(ConnActivity::holding(slot));
        let act = self.clone();
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
            http1::conn::serve(act, stream, peer, activity, limits, drain).await;
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

/// The engine's per-connection limits from the live `config-activator`.
pub(crate) fn conn_limits(cfg: &ActivatorConfig) -> http1::Limits {
    http1::Limits {
        header_read_timeout: cfg.header_read_timeout,
        keep_alive_timeout: cfg.keep_alive_timeout,
        max_header_bytes: cfg.max_header_bytes,
        max_header_count: cfg.max_header_count,
        h2_max_concurrent_streams: cfg.h2_max_concurrent_streams,
        lane: cfg.fast_lane,
    }
}
