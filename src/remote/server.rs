//! The autoscaler's stats port: `POST /stats` (the activators' pushes, into the scaler's stats
//! channel) and `GET /decisions` (the decision feed), both behind the shared token, both only
//! on the leader; and `/healthz`. HTTP/1.1, keep-alive; runs until cancelled.
//!
//! Answers: 401 without the token (before anything else, so a stranger learns nothing, not
//! even who leads), 503 on a replica that does not lead, 400 for a malformed batch, 413 past
//! [`MAX_BATCH_BYTES`], 202 for an accepted batch. Accepting never waits on the scaler: stats
//! go into its bounded channel with `try_send`, and what does not fit is counted as dropped.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::token::Tokens;
use super::wire::{
    CONTENT_TYPE, DECISIONS_PATH, MAX_BATCH_BYTES, STATS_PATH, StatsBatch, WireDecision,
};
use crate::autoscaler::scaler::{ScaleState, ScaleStates};
use crate::revision::RevisionKey;
use crate::stats::StatMessage;
use crate::telemetry::remote::RemoteMetrics;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the stats port serves from.
pub struct StatsPort {
    /// The token in force (and the one it replaced, in its grace period).
    pub token: Tokens,
    /// True while this replica leads.
    pub leading: watch::Receiver<bool>,
    /// The scaler's stats channel (bounded).
    pub stats: mpsc::Sender<StatMessage>,
    /// The scaler's decisions.
    pub states: Arc<ScaleStates>,
    pub metrics: RemoteMetrics,
    /// Stats that did not fit the scaler's channel (`thaw_autoscaler_stats_rejected_total`).
    pub dropped: prometheus_client::metrics::counter::Counter,
}

/// Serves the stats port on `listener` until `stop`.
pub async fn serve(port: Arc<StatsPort>, listener: TcpListener, stop: CancellationToken) {
    tracing::info!(addr = ?listener.local_addr().ok(), "stats port serving");
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "stats port accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let port = port.clone();
        let stop = stop.clone();
        tokio::spawn(
            async move {
                let service = service_fn(move |req| {
                    let port = port.clone();
                    let stop = stop.clone();
                    async move { Ok::<_, Infallible>(route(&port, req, stop).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "stats connection error");
                }
            }
            .instrument(tracing::debug_span!("stats_conn", %peer)),
        );
    }
}

fn text(code: StatusCode, msg: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())).boxed_unsync());
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn route(
    port: &StatsPort,
    req: Request<Incoming>,
    stop: CancellationToken,
) -> Response<Body> {
    let path: &'static str = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok\n"),
        (&Method::POST, STATS_PATH) => "stats",
        (&Method::GET, DECISIONS_PATH) => "decisions",
        (_, STATS_PATH | DECISIONS_PATH) => {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        _ => return text(StatusCode::NOT_FOUND, "not found\n"),
    };
    let resp = if !port.token.accepts(req.headers().get(header::AUTHORIZATION)) {
        text(StatusCode::UNAUTHORIZED, "unauthorized\n")
    } else if !*port.leading.borrow() {
        text(StatusCode::SERVICE_UNAVAILABLE, "not the leader\n")
    } else if path == "stats" {
        accept_stats(port, req).await
    } else {
        decisions(port, stop)
    };
    port.metrics.answered(path, resp.status().as_u16());
    resp
}

async fn accept_stats(port: &StatsPort, req: Request<Incoming>) -> Response<Body> {
    let body = match Limited::new(req.into_body(), MAX_BATCH_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, "batch too large\n");
        }
        Err(_) => return text(StatusCode::BAD_REQUEST, "body not read\n"),
    };
    let batch: StatsBatch = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "malformed stats batch");
            return text(StatusCode::BAD_REQUEST, "malformed batch\n");
        }
    };
    let source: Arc<str> = Arc::from(batch.source.as_str());
    let at = crate::clock::now_second();
    for s in &batch.stats {
        let stat = s.to_stat(&source, at);
        let msg = if s.poke {
            StatMessage::Poke(stat)
        } else {
            StatMessage::Record(stat)
        };
        if port.stats.try_send(msg).is_err() {
            port.dropped.inc();
        }
    }
    text(StatusCode::ACCEPTED, "accepted\n")
}

/// The feed: every state, then each change; ends when leadership is lost or the port stops,
/// so followers reconnect to the new leader.
fn decisions(port: &StatsPort, stop: CancellationToken) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let states = port.states.clone();
    let mut changes = states.changes();
    let mut leading = port.leading.clone();
    tokio::spawn(
        async move {
            if tx.send(lines(&states.all())).await.is_err() {
                return;
            }
            loop {
                let key = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = leading.wait_for(|l| !*l) => { let _ = r; return; }
                    () = tx.closed() => return,
                    k = changes.recv() => k,
                };
                let out = match key {
                    Ok(key) => {
                        let state = states.get(&key);
                        line(&key, state.as_ref())
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => lines(&states.all()),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(out).await.is_err() {
                    return;
                }
            }
        }
        .instrument(tracing::debug_span!("decision_feed")),
    );
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream.boxed())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(CONTENT_TYPE),
    );
    r
}

fn wire(key: &RevisionKey, state: Option<&ScaleState>) -> WireDecision {
    WireDecision {
        namespace: key.namespace.to_string(),
        name: key.name.to_string(),
        desired: state.and_then(|s| u32::try_from(s.desired).ok()),
        activator_in_path: state.is_none_or(|s| s.activator_in_path),
        removed: state.is_none(),
    }
}

fn line(key: &RevisionKey, state: Option<&ScaleState>) -> Bytes {
    let mut v = serde_json::to_vec(&wire(key, state)).expect("decisions serialize");
    v.push(b'\n');
    Bytes::from(v)
}

fn lines(all: &[(RevisionKey, ScaleState)]) -> Bytes {
    let mut v = Vec::with_capacity(all.len() * 96);
    for (k, s) in all {
        serde_json::to_writer(&mut v, &wire(k, Some(s))).expect("decisions serialize");
        v.push(b'\n');
    }
    Bytes::from(v)
}
