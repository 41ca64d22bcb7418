//! The webhook's TLS listener: the API server POSTs `AdmissionReview`s to `/defaulting` and
//! `/resource-validation` (Knative's paths) over HTTPS, HTTP/1.1 or HTTP/2 (ALPN).
//!
//! Bounded everywhere: at most `max_connections` at once (one more is closed at once and
//! counted), the TLS handshake and the request head each within `handshake_timeout`, a body of
//! at most `max_body` bytes (413 otherwise), 32 HTTP/2 streams per connection, and each
//! admission within `request_timeout`. The certificate served is whatever [`CertSlot`] holds
//! at the handshake, so a rotated certificate is served from the next connection on; before the
//! first one is loaded every handshake fails (and `/readyz` says not ready).

use std::convert::Infallible;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::admit::{Hook, admit};
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

/// The TLS configuration serving `slot`'s certificate (TLS 1.2 and 1.3, ring, ALPN h2 and
/// http/1.1).
pub fn tls_config(slot: Arc<CertSlot>) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_no_client_auth()
    .with_cert_resolver(slot);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub max_body: usize,
    pub handshake_timeout: Duration,
    pub request_timeout: Duration,
}

/// What a request is admitted against.
pub struct Admitter {
    /// The settings in force (swapped on each ConfigMap change).
    pub settings: Arc<arc_swap::ArcSwap<Settings>>,
    pub metrics: WebhookMetrics,
    pub limits: Limits,
}

/// Serves `listener` until `stop`: TLS from `tls`, admission by `admitter`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    admitter: Arc<Admitter>,
    stop: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let permits = Arc::new(Semaphore::new(admitter.limits.max_connections));
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            admitter.metrics.refuse("connections");
            drop(stream);
            continue;
        };
        let (acceptor, admitter, stop) = (acceptor.clone(), admitter.clone(), stop.clone());
        let span = tracing::debug_span!("webhook_connection", peer = %peer);
        tokio::spawn(
            async move {
                let _permit = permit;
                let limits = admitter.limits;
                let tls =
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
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
                let service = service_fn(move |req| {
                    let admitter = admitter.clone();
                    async move { Ok::<_, Infallible>(handle(&admitter, req).await) }
                });
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.handshake_timeout);
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .max_concurrent_streams(32);
                let conn = builder.serve_connection(TokioIo::new(tls), service);
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            }
            .instrument(span),
        );
    }
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
            return reply(
                StatusCode::NOT_FOUND,
                Bytes::from_static(b"not found\n"),
                false,
            );
        }
    };
    if req.method() != Method::POST {
        m.refuse("method");
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            Bytes::from_static(b"POST an AdmissionReview\n"),
            false,
        );
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
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from(format!("an AdmissionReview is at most {limit} bytes\n")),
                false,
            );
        }
        Err(_) => {
            m.refuse("timeout");
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                Bytes::from_static(b"the request body did not arrive in time\n"),
                false,
            );
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
