//! Listeners, the background tasks and drain.
//!
//! Drain, in order (SIGTERM): readiness fails at once (`/readyz`, kubelet and network probes)
//! -> new requests are still served for the drain delay (endpoints take time to update) -> the
//! data listener closes and every connection is told to finish (HTTP/1: close after the current
//! response; h2: GOAWAY) -> in-flight requests complete, bounded by the revision's timeout
//! (what is left then is cut; websocket tunnels too) -> `/wait-for-drain` answers -> the admin port stops and the
//! process exits 0.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Duration, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::admin::{self, AdminState};
use super::handler::Sidecar;
use super::podstats::Second;
use crate::http1::{self, activity::ConnActivity};

/// Serves the data and admin listeners until `shutdown` completes, then drains (see the module
/// doc) and returns. Runs the readiness prober and the 1 s stats ticker meanwhile. An error
/// only if accepting on the data listener fails persistently.
pub async fn serve(
    sidecar: Arc<Sidecar>,
    data: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let stop = CancellationToken::new();
    let mut background = JoinSet::new();
    background.spawn(super::probe::run(
        sidecar.settings.probe.clone(),
        sidecar.readiness.clone(),
        stop.clone(),
    ));
    let last = Arc::new(Mutex::new(Second::default()));
    background.spawn(tick_stats(sidecar.clone(), last.clone()));
    let (drained_tx, drained) = watch::channel(false);
    let admin_stop = CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        sidecar.clone(),
        AdminState { last, drained },
        admin,
        admin_stop.clone(),
    ));

    let drain = CancellationToken::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            _ = &mut shutdown => break Ok(()),
            Some(_) = conns.join_next() => {}
            accepted = accept(&data) => match accepted {
                Ok((stream, peer)) => spawn_conn(&sidecar, &mut conns, stream, peer, &drain),
                Err(e) => break Err(e),
            },
        }
    };
    sidecar.start_draining();
    let delay = sidecar.settings.drain_delay;
    tracing::info!(
        ?delay,
        in_flight = sidecar.window.current(),
        "draining: not ready; still serving for the drain delay"
    );
    if result.is_ok() {
        let delay = tokio::time::sleep(delay);
        tokio::pin!(delay);
        loop {
            tokio::select! {
                _ = &mut delay => break,
                Some(_) = conns.join_next() => {}
                accepted = accept(&data) => match accepted {
                    Ok((stream, peer)) => spawn_conn(&sidecar, &mut conns, stream, peer, &drain),
                    Err(_) => break,
                },
            }
        }
    }
    drop(data);
    drain.cancel();
    let bound = sidecar.settings.timeouts.total;
    tracing::info!(
        connections = conns.len(),
        in_flight = sidecar.window.current(),
        "draining: finishing in-flight requests"
    );
    sidecar.tunnels.close();
    let finished = tokio::time::timeout(bound, async {
        while conns.join_next().await.is_some() {}
        sidecar.tunnels.wait().await;
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            connections = conns.len(),
            tunnels = sidecar.tunnels.len(),
            "drain: the revision's timeout passed; cutting what is left"
        );
        conns.abort_all();
        sidecar.tunnel_cancel.cancel();
        while conns.join_next().await.is_some() {}
        sidecar.tunnels.wait().await;
    }
    let _ = drained_tx.send(true);
    tracing::info!("drained");
    stop.cancel();
    admin_stop.cancel();
    let _ = admin_task.await;
    background.abort_all();
    while background.join_next().await.is_some() {}
    result
}

fn spawn_conn(
    sidecar: &Arc<Sidecar>,
    conns: &mut JoinSet<()>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    drain: &CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    if let Err(e) = http1::limits::set_tcp_keepalive(&stream) {
        tracing::debug!(error = %e, "cannot set TCP keep-alive on a client connection");
    }
    let activity = Arc::new(ConnActivity::default());
    let task = http1::conn::serve(
        sidecar.clone(),
        stream,
        peer,
        activity,
        sidecar.limits,
        drain.child_token(),
    )
    .instrument(tracing::debug_span!("conn", %peer));
    conns.spawn(task);
}

/// Accepts, retrying transient failures (a reset before accept, out of descriptors).
async fn accept(listener: &TcpListener) -> io::Result<(tokio::net::TcpStream, SocketAddr)> {
    loop {
        match listener.accept().await {
            Ok(pair) => return Ok(pair),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                ) || e.raw_os_error().is_some_and(|c| c == 24 || c == 23) =>
            {
                tracing::warn!(error = %e, "accept failed; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Every second: closes the pod's window into `last` (what `/stats` serves) and the
/// `queue_*` gauges.
async fn tick_stats(sidecar: Arc<Sidecar>, last: Arc<Mutex<Second>>) {
    let mut tick = tokio::time::interval_at(
        Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Read now, not the tick's planned instant: a late tick must not leave events after
        // the end of the interval it closes.
        let s = sidecar.window.take(Instant::now());
        let m = &sidecar.telemetry.queue;
        m.rps.set(s.requests as f64);
        m.proxied_rps.set(s.proxied_requests as f64);
        m.concurrency.set(s.average_concurrency);
        m.proxied_concurrency.set(s.proxied_concurrency);
        *last.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}
