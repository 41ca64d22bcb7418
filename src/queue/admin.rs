//! The sidecar's admin port: `/metrics` (Prometheus: OpenMetrics or the classic text format),
//! `/healthz` (the process serves), `/readyz` (the user container answers its probe and the
//! sidecar is not draining: the kubelet's readiness probe), `/stats` (the pod's last complete
//! second as JSON [`crate::stats::PodStats`], for the autoscaler to pull) and
//! `/wait-for-drain` (answers only once the sidecar has drained: the user container's `preStop`
//! hook waits on it; when no drain starts within 5 s, as on a lone restart of the user
//! container, it answers `not draining`). HTTP/1.1 only; connections are watched so a stop
//! lets open requests finish.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;

use super::body::{QueueBody, plain};
use super::handler::Sidecar;
use super::podstats::Second;
use crate::stats::POD_STATS_PATH;

/// What the admin port reads besides the sidecar.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The last complete second (written by the stats ticker).
    pub last: Arc<Mutex<Second>>,
    /// Becomes true once the sidecar has drained.
    pub drained: watch::Receiver<bool>,
}

/// Serves the admin API on `listener` until `stop`; then stops accepting and lets open requests
/// finish (at most 1 s).
pub async fn serve(
    sidecar: Arc<Sidecar>,
    state: AdminState,
    listener: TcpListener,
    stop: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (sidecar, state) = (sidecar.clone(), state.clone());
        let service = service_fn(move |req| {
            let (sidecar, state) = (sidecar.clone(), state.clone());
            async move { Ok::<_, Infallible>(route(&sidecar, state, req).await) }
        });
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10));
        let conn = b
            .http1_only()
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "admin connection error");
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
}

/// How long `/wait-for-drain` waits for a drain to start before answering that none did.
pub const DRAIN_START_WAIT: Duration = Duration::from_secs(5);

/// Whether the sidecar is draining, or starts to within [`DRAIN_START_WAIT`].
async fn started_draining(sidecar: &Sidecar) -> bool {
    let started = sidecar.drain_started.notified();
    tokio::pin!(started);
    // Registered before the check, so a drain starting in between is not missed.
    started.as_mut().enable();
    if sidecar.is_draining() {
        return true;
    }
    tokio::time::timeout(DRAIN_START_WAIT, started)
        .await
        .is_ok()
        || sidecar.is_draining()
}

async fn route(
    sidecar: &Sidecar,
    mut state: AdminState,
    req: Request<Incoming>,
) -> Response<QueueBody> {
    if req.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    let json = |body: String| {
        let mut r = plain(StatusCode::OK, body);
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    match req.uri().path() {
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" if sidecar.is_draining() => {
            plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        }
        "/readyz" if !sidecar.readiness.is_ready() => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "user container not ready\n",
        ),
        "/readyz" => plain(StatusCode::OK, "ok\n"),
        POD_STATS_PATH => {
            let second = *state.last.lock().unwrap_or_else(|p| p.into_inner());
            let stats = second.to_pod_stats(&sidecar.settings.pod);
            json(serde_json::to_string(&stats).expect("stats serialise"))
        }
        "/wait-for-drain" => {
            // The kubelet runs the preStop hook as it signals every container, so a drain
            // starts within moments; a hook with no drain is a lone restart of the user
            // container, which must not wait for the whole grace period.
            if !started_draining(sidecar).await {
                return plain(StatusCode::OK, "not draining\n");
            }
            // Answers once drained; a closed sender (the sidecar stopping) counts as drained.
            let _ = state.drained.wait_for(|d| *d).await;
            plain(StatusCode::OK, "drained\n")
        }
        "/metrics" => {
            let m = &sidecar.telemetry.queue;
            m.queue_depth.set(sidecar.limiter.queued() as i64);
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, content_type) = sidecar.telemetry.encode_for(accept);
            let mut r = plain(StatusCode::OK, body);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "try /metrics, /healthz, /readyz, /stats or /wait-for-drain\n",
        ),
    }
}
