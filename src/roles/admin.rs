//! The admin port of the leader-elected roles: `/metrics`, `/healthz`, `/readyz` (ready once
//! its watches have listed and until it stops), `/leader` (JSON: this replica's identity,
//! whether it leads, and the revisions it scales) and, on the autoscaler, `/revisions` (JSON:
//! each revision's serving mode, whether it was adopted as found, its initialization and pod
//! stats). HTTP/1.1; runs until cancelled.
//!
//! [`serve_starting`] answers on the activator's admin port from the moment the process runs,
//! until the activator's own admin server takes the listener over: `/healthz` 200, `/readyz`
//! 503 saying what it waits for (the stats token, the first sync), `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::telemetry::Telemetry;

/// What the admin port reports.
pub struct AdminState {
    pub telemetry: Arc<Telemetry>,
    /// Ready (the first sync is done and no stop has begun).
    pub ready: tokio::sync::watch::Receiver<bool>,
    /// The JSON of `/leader`.
    pub leader: Box<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// The JSON of `/revisions` (the autoscaler's; none on the controller).
    pub revisions: Option<Box<dyn Fn() -> serde_json::Value + Send + Sync>>,
}

/// Serves `state` on `listener` until `stop`.
pub async fn serve(state: Arc<AdminState>, listener: TcpListener, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

fn route(state: &AdminState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if *state.ready.borrow() => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "not ready\n".into()),
        "/metrics" => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, ct) = state.telemetry.encode_for(accept);
            reply(StatusCode::OK, ct, body)
        }
        "/leader" => reply(
            StatusCode::OK,
            "application/json",
            (state.leader)().to_string(),
        ),
        "/revisions" if state.revisions.is_some() => reply(
            StatusCode::OK,
            "application/json",
            state
                .revisions
                .as_ref()
                .map_or_else(String::new, |f| f().to_string()),
        ),
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
    }
}

/// Serves `listener` while a role starts: `/healthz` answers 200, `/readyz` 503 with what
/// `waiting` says is still missing, `/metrics` the telemetry. Every answer closes its
/// connection, so no client stays on this server after the hand-over. Returns the listener
/// when `done` is cancelled.
pub async fn serve_starting(
    telemetry: Arc<Telemetry>,
    waiting: tokio::sync::watch::Receiver<&'static str>,
    listener: TcpListener,
    done: CancellationToken,
) -> TcpListener {
    const TEXT: &str = "text/plain; charset=utf-8";
    loop {
        let (stream, _) = tokio::select! {
            _ = done.cancelled() => return listener,
            a = listener.accept() => match a {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (telemetry, waiting) = (telemetry.clone(), waiting.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let mut r = match (req.method(), req.uri().path()) {
                    (&Method::GET, "/healthz") => reply(StatusCode::OK, TEXT, "ok\n".into()),
                    (&Method::GET, "/readyz") => reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        TEXT,
                        format!("not ready: waiting for {}\n", *waiting.borrow()),
                    ),
                    (&Method::GET, "/metrics") => {
                        let accept = req
                            .headers()
                            .get(header::ACCEPT)
                            .and_then(|v| v.to_str().ok());
                        let (body, ct) = telemetry.encode_for(accept);
                        reply(StatusCode::OK, ct, body)
                    }
                    (&Method::GET, _) => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
                    _ => reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into()),
                };
                r.headers_mut()
                    .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
                async move { Ok::<_, Infallible>(r) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
