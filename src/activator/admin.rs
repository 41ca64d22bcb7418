//! The admin port: `/metrics` (OpenMetrics), `/healthz` (liveness: the process serves),
//! `/readyz` (readiness: fails once draining), `/revisions` (JSON state per revision) and
//! `/routes` (JSON: each route's traffic).
//! HTTP/1.1 only; runs until cancelled, then stops accepting (open connections finish).

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;

use super::body::ActivatorBody;
use super::core::Activator;
use super::error::plain;
use crate::platform::EndpointStatus;

/// Serves the admin API on `listener` until `stop` is cancelled.
pub(crate) async fn serve(act: Arc<Activator>, listener: TcpListener, stop: CancellationToken) {
    tracing::info!(addr = ?listener.local_addr().ok(), "admin serving");
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let act = act.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let act = act.clone();
                async move { Ok::<_, Infallible>(route(&act, req)) }
            });
            let mut b = auto::Builder::new(TokioExecutor::new());
            b.http1()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let b = b.http1_only();
            if let Err(e) = b.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(error = %e, "admin connection error");
            }
        });
    }
}

fn route(act: &Activator, req: Request<Incoming>) -> Response<ActivatorBody> {
    if req.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/readyz" if act.is_draining() => plain(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" => plain(StatusCode::OK, "ok\n"),
        "/metrics" => {
            // OpenMetrics when the scraper asks for it, the classic text format otherwise.
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, content_type) = act.deps.telemetry.encode_for(accept);
            let mut r = plain(StatusCode::OK, body);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        "/revisions" => json_response(&revisions(act)),
        "/routes" => json_response(&routes(act)),
        _ => plain(
            StatusCode::NOT_FOUND,
            "try /metrics, /healthz, /readyz, /revisions or /routes\n",
        ),
    }
}

fn json_response(v: &Value) -> Response<ActivatorBody> {
    let mut r = plain(StatusCode::OK, v.to_string());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `{"routes": [{namespace, service, host, url, traffic: [{revisionName, percent,
/// latestRevision, tag, tagHost}]}]}`: each route as `kn service describe` shows it, from the
/// catalog (empty where no controller publishes routes into it).
pub(crate) fn routes(act: &Activator) -> Value {
    json!({ "routes": act.deps.catalog.load().route_views() })
}

/// The revision's effective autoscaler settings that operators tune, with Knative's key names
/// and durations as Knative writes them (`"60s"`), so a live ConfigMap or annotation change can
/// be checked here.
fn autoscaling_json(a: &crate::config::AutoscalingSpec) -> Value {
    let d = crate::config::parse::format_duration;
    json!({
        "target": a.target_value,
        "target-burst-capacity": a.target_burst_capacity,
        "stable-window": d(a.stable_window),
        "panic-window": d(a.panic_window),
        "min-scale": a.min_scale,
        "max-scale": a.max_scale,
        "initial-scale": a.initial_scale,
        "scale-down-delay": d(a.scale_down_delay),
        "scale-to-zero-grace-period": d(a.scale_to_zero_grace_period),
    })
}

/// `{"draining": bool, "held": n, "revisions": [...]}`, revisions sorted by namespace and name;
/// keys in Knative's camelCase (`containerConcurrency`, `inFlight`), autoscaler settings under
/// their ConfigMap names.
pub(crate) fn revisions(act: &Activator) -> Value {
    let mut known = act.known();
    known.sort_by(|a, b| a.key().cmp(b.key()));
    let list: Vec<Value> = known
        .iter()
        .map(|k| match k.state() {
            Some(s) => revision_json(act, k.key(), &s.spec.load(), &s.snapshot(), Some(s)),
            // Never requested here: no state; the platform's snapshot says what is there.
            None => {
                let snap = act.deps.endpoints.endpoints(k.key()).borrow().clone();
                revision_json(act, k.key(), &k.spec(), &snap, None)
            }
        })
        .collect();
    json!({
        "draining": act.is_draining(),
        "held": act.held_requests(),
        "revisions": list,
    })
}

/// One revision's entry of `/revisions`. A revision without a state (never requested here) has
/// nothing held or in flight; its endpoints are the platform's ready and terminating ones.
fn revision_json(
    act: &Activator,
    key: &crate::revision::RevisionKey,
    spec: &crate::revision::RevisionSpec,
    snap: &crate::platform::EndpointSnapshot,
    state: Option<&std::sync::Arc<super::rev_state::RevisionState>>,
) -> Value {
    // `null` until the autoscaler has decided (or when none runs).
    let desired = act
        .deps
        .scale_states
        .as_ref()
        .and_then(|ss| ss.get(key))
        .map(|st| st.desired)
        .filter(|d| *d >= 0);
    let (endpoints, held) = match state {
        Some(s) => (
            s.throttler
                .endpoints()
                .iter()
                .map(|e| {
                    json!({
                        "address": e.addr.to_string(),
                        "inFlight": e.in_flight,
                        "limit": e.limit,
                        "terminating": e.terminating,
                        "ejected": e.ejected,
                    })
                })
                .collect::<Vec<_>>(),
            s.throttler.held(),
        ),
        None => {
            let limit = (spec.container_concurrency > 0).then_some(spec.container_concurrency);
            let entry = |a: &std::net::SocketAddr, terminating: bool| {
                json!({
                    "address": a.to_string(),
                    "inFlight": 0,
                    "limit": limit,
                    "terminating": terminating,
                    "ejected": false,
                })
            };
            let list = snap
                .ready
                .iter()
                .map(|a| entry(a, false))
                .chain(snap.terminating.iter().map(|a| entry(a, true)))
                .collect();
            (list, 0)
        }
    };
    let in_flight: u64 = endpoints
        .iter()
        .map(|e| e["inFlight"].as_u64().unwrap_or(0))
        .sum();
    let (status, reason) = match &snap.status {
        EndpointStatus::Ok => ("ok", None),
        EndpointStatus::Failing { reason } => ("failing", Some(reason.to_string())),
    };
    let state = match (&snap.status, snap.ready.is_empty(), held > 0) {
        (EndpointStatus::Failing { .. }, _, _) => "failing",
        (_, true, true) => "activating",
        (_, true, false) => "cold",
        (_, false, _) => "ready",
    };
    json!({
        "namespace": &*key.namespace,
        "name": &*key.name,
        "desired": desired,
        "containerConcurrency": spec.container_concurrency,
        "ready": {
            "count": snap.ready.len(),
            "addresses": snap.ready.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        },
        "terminating": snap.terminating.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "held": held,
        "inFlight": in_flight,
        "endpoints": endpoints,
        "status": status,
        "reason": reason,
        "state": state,
        "service": spec.service.as_deref(),
        "autoscaling": autoscaling_json(&spec.autoscaling),
    })
}
