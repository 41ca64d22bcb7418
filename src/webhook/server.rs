//! The webhook's TLS listener: the API server POSTs `AdmissionReview`s to `/defaulting` and
//! `/resource-validation` (Knative's paths) over HTTPS, HTTP/1.1 only (ALPN `http/1.1`, as
//! knative.dev/pkg's webhook since CVE-2023-44487: one request per connection at a time, so an
//! open connection either carries a request or is idle, and nothing keeps an idle one open).
//!
//! Bounded everywhere: at most `max_connections` open at once ([`Seats`]: at the limit a new
//! connection takes the seat of the oldest one with no request in flight, which is closed and
//! counted; only when every open connection has a request in flight is the new one closed at
//! once, and counted), the TLS handshake within `handshake_timeout`, each request head within
//! `handshake_timeout` of the connection's previous exchange (so an idle connection closes
//! then), a body of at most `max_body` bytes (413 otherwise) received within `request_timeout`
//! (408 and the connection closed otherwise), and each admission within `request_timeout`. The
//! certificate served is whatever [`CertSlot`] holds at the handshake, so a rotated certificate
//! is served from the next connection on; before the first one is loaded every handshake fails
//! (and `/readyz` says not ready).

use std::convert::Infallible;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::admit::{Hook, admit};
use super::seats::{Busy, Seat, Seats, Taken};
use crate::controller::Settings;
use crate::telemetry::webhook::WebhookMetrics;

/// Knative's path of the defaulting (mutating) webhook.
pub const DEFAULTING_PATH: &str = "/defaulting";
/// Knative's path of the validating webhook.
pub const VALIDATION_PATH: &str = "/resource-validation";

/// The certificate every new TLS connection is served; swapped whole on rotation.
#[derive(Debug, Default)]
pub struct CertSlot(ArcSwapOption<CertifiedKey>);

impl CertSlot {
    /// Loads a PEM certificate and key; the previous one stays on error.
    pub fn load(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the serving certificate does not parse: {e}"))?;
        if certs.is_empty() {
            return Err("no serving certificate".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| format!("the serving key does not parse: {e}"))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("the serving key is not usable: {e}"))?;
        self.0
            .store(Some(Arc::new(CertifiedKey::new(certs, signer))));
        Ok(())
    }

    /// Whether a certificate is loaded.
    pub fn loaded(&self) -> bool {
        self.0.load().is_some()
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.load_full()
    }
}

/// The TLS configuration serving `slot`'s certificate (TLS 1.2 and 1.3, ring, ALPN
/// `http/1.1` only: an API server offering `h2` too speaks HTTP/1.1, a client offering only
/// `h2` fails the handshake).
pub fn tls_config(slot: Arc<CertSlot>) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_no_client_auth()
    .with_cert_resolver(slot);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once ([`Seats`]).
    pub max_connections: usize,
    /// Largest request body (413 beyond).
    pub max_body: usize,
    /// Time for the TLS handshake, and for each request head after the connection's previous
    /// exchange (an idle connection is closed then).
    pub handshake_timeout: Duration,
    /// Time for a request's body, from its head on (408 and the connection closed beyond).
    pub request_timeout: Duration,
}

/// What a request is admitted against.
pub struct Admitter {
    /// The settings in force (swapped on each ConfigMap change).
    pub settings: Arc<arc_swap::ArcSwap<Settings>>,
    pub metrics: WebhookMetrics,
    pub limits: Limits,
}

/// Serves `listener` until `stop`: TLS from `tls`, admission by `admitter`. Each connection
/// runs in its own task; on `stop` every connection is dropped.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    admitter: Arc<Admitter>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let seats = Seats::new(admitter.limits.max_connections);
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => match a {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // The seat is taken at accept, before the handshake: a connection still shaking hands
        // counts, and is the newest, so the last to lose its seat.
        let seat = match seats.take() {
            Ok((seat, Taken::Free)) => seat,
            Ok((seat, Taken::Evicted)) => {
                admitter.metrics.closed("evicted");
                tracing::debug!(peer = %peer, "at the connection limit: the oldest idle connection closes for this one");
                seat
            }
            Err(Busy) => {
                admitter.metrics.refuse("connections");
                tracing::debug!(peer = %peer, "every connection has a request in flight: refused");
                drop(stream);
                continue;
            }
        };
        let span = tracing::debug_span!("webhook_connection", peer = %peer);
        tokio::spawn(
            connection(
                stream,
                seat,
                acceptor.clone(),
                admitter.clone(),
                stop.clone(),
            )
            .instrument(span),
        );
    }
}

/// Counts an open connection in `thaw_webhook_connections` while it lives.
struct Open(prometheus_client::metrics::gauge::Gauge);

impl Open {
    fn new(g: &prometheus_client::metrics::gauge::Gauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One connection on `seat`: the TLS handshake, then HTTP/1.1 requests until the client closes,
/// a request head does not come in time, the seat is taken (closed at once: it has no request
/// in flight then) or `stop`.
async fn connection(
    stream: TcpStream,
    seat: Seat,
    acceptor: tokio_rustls::TlsAcceptor,
    admitter: Arc<Admitter>,
    stop: CancellationToken,
) {
    let _open = Open::new(&admitter.metrics.connections);
    let seat = Arc::new(seat);
    let limits = admitter.limits;
    let work = {
        let seat = seat.clone();
        async move {
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    admitter.metrics.refuse("tls");
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    admitter.metrics.refuse("tls");
                    return;
                }
            };
            let metrics = admitter.metrics.clone();
            let service = service_fn(move |req| {
                let (admitter, seat) = (admitter.clone(), seat.clone());
                async move {
                    // While `_in_flight` lives the seat cannot be taken; a seat taken already
                    // lets no request begin (the connection is being closed).
                    let Some(_in_flight) = seat.begin() else {
                        admitter.metrics.refuse("closing");
                        return Ok::<_, Infallible>(closing(reply(
                            StatusCode::SERVICE_UNAVAILABLE,
                            Bytes::from_static(b"the webhook is closing this connection\n"),
                            false,
                        )));
                    };
                    Ok(handle(&admitter, req).await)
                }
            });
            // HTTP/1.1 only; `header_read_timeout` runs from the connection's start and from
            // each response's end, so an idle connection is closed after it.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.handshake_timeout)
                .serve_connection(TokioIo::new(tls), service);
            match conn.await {
                Ok(()) => {}
                Err(e) if e.is_timeout() => metrics.closed("idle"),
                Err(e) => tracing::debug!(error = %e, "connection ended"),
            }
        }
    };
    tokio::select! {
        _ = work => {}
        _ = seat.evicted() => tracing::debug!("closed: its seat went to a newer connection"),
        _ = stop.cancelled() => {}
    }
}

/// `r` with `Connection: close`: sent when the request's body was not read to its end, so the
/// connection cannot carry another request (and a trickling body holds it no longer).
fn closing(mut r: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    r.headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

fn reply(code: StatusCode, body: Bytes, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(if json {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        }),
    );
    r
}

async fn handle(admitter: &Admitter, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let m = &admitter.metrics;
    let hook = match req.uri().path() {
        DEFAULTING_PATH => Hook::Defaulting,
        VALIDATION_PATH => Hook::Validation,
        _ => {
            m.refuse("not_found");
            return closing(reply(
                StatusCode::NOT_FOUND,
                Bytes::from_static(b"not found\n"),
                false,
            ));
        }
    };
    if req.method() != Method::POST {
        m.refuse("method");
        return closing(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            Bytes::from_static(b"POST an AdmissionReview\n"),
            false,
        ));
    }
    let limit = admitter.limits.max_body;
    let body = match tokio::time::timeout(
        admitter.limits.request_timeout,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => {
            m.refuse("body_too_large");
            return closing(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from(format!("an AdmissionReview is at most {limit} bytes\n")),
                false,
            ));
        }
        Err(_) => {
            // The body trickles: the request ends here and the connection with it.
            m.refuse("timeout");
            return closing(reply(
                StatusCode::REQUEST_TIMEOUT,
                Bytes::from_static(b"the request body did not arrive in time\n"),
                false,
            ));
        }
    };
    let review = match review_of(&body) {
        Ok(r) => r,
        Err(why) => {
            m.refuse("bad_review");
            // The client learns what was wrong with its input, never anything of thaw's.
            let r = AdmissionResponse::invalid(why).into_review();
            return reply(
                StatusCode::BAD_REQUEST,
                Bytes::from(serde_json::to_vec(&r).unwrap_or_default()),
                true,
            );
        }
    };
    let hook_label = match hook {
        Hook::Defaulting => "defaulting",
        Hook::Validation => "validation",
    };
    let span = tracing::info_span!(
        "admission",
        webhook = hook_label,
        uid = %review.uid,
        kind = %review.kind.kind,
        operation = ?review.operation,
        namespace = review.namespace.as_deref().unwrap_or(""),
        name = %review.name,
        allowed = tracing::field::Empty,
    );
    let _enter = span.enter();
    let start = tokio::time::Instant::now();
    let settings = admitter.settings.load();
    let verdict = admit(hook, &review, &settings);
    let allowed = verdict.response.allowed;
    span.record("allowed", allowed);
    if !allowed {
        tracing::info!(message = %verdict.response.result.message, "denied");
    }
    m.admitted(
        hook_label,
        verdict.kind,
        verdict.operation,
        allowed,
        start.elapsed().as_secs_f64(),
    );
    reply(
        StatusCode::OK,
        Bytes::from(review_json(verdict.response)),
        true,
    )
}

/// The AdmissionReview answering with `response`, as JSON. The patch is written base64, as
/// Kubernetes' Go types write `[]byte` (kube-core writes a number array, which an API server
/// also reads; base64 is what every webhook client expects).
fn review_json(response: AdmissionResponse) -> Vec<u8> {
    let patch = response.patch.clone();
    let mut v = serde_json::to_value(response.into_review()).unwrap_or_default();
    if let Some(p) = patch
        && let Some(r) = v.get_mut("response").and_then(|r| r.as_object_mut())
    {
        r.insert(
            "patch".into(),
            serde_json::to_value(k8s_openapi::ByteString(p)).unwrap_or_default(),
        );
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The request of an `admission.k8s.io/v1` AdmissionReview body, or what is wrong with it.
fn review_of(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    review
        .try_into()
        .map_err(|_| "the AdmissionReview carries no request".to_string())
}
