//! A latency proxy in front of the plane's API server: TLS-terminating (a serving
//! certificate of the plane's CA, for the node's address), an HTTP/1.1 reverse proxy (hyper,
//! rustls) that forwards every request as it came (method, path and query, headers with the
//! caller's `Authorization`, the body streamed) to the real API server over TLS, and streams
//! the answer back (watches included: the body is relayed chunk by chunk as the API server
//! sends it, never buffered whole). What it adds is a delay the test sets while it runs
//! ([`LatencyProxy::set_delay`]): for Lease calls only (paths under `/apis/coordination.k8s.io/`)
//! or for every call. The delay comes before the request is forwarded, as a queue in front of
//! a slow API server: a write lands late. A caller that gives up during the delay (a Lease
//! renewal past its renew deadline) closes its connection and the request goes with it, never
//! forwarded (the drills saw no renewal land after its round had given up); only answered
//! calls are in [`LatencyProxy::lease_calls`].
//!
//! Pods reach it through their kubeconfig ([`super::kubelet::Kubelet::set_pod_server`]).
//! Bounded: [`MAX_CONNECTIONS`] client connections at once (more wait to be accepted), each
//! with exactly one connection to the API server (HTTP/1.1: one request at a time per
//! connection), and [`MAX_SAMPLES`] Lease call timings kept. Not relayed: protocol upgrades
//! (exec, port-forward), which thaw does not use.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::pki::Pki;

/// Client connections served at once; the next ones wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 512;
/// Lease call timings kept (the oldest dropped first).
pub const MAX_SAMPLES: usize = 20_000;
/// Connecting to the API server (TCP and TLS) may take this long; a 502 beyond.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Headers of one hop only, not forwarded either way.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// Which calls the delay applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Calls under `/apis/coordination.k8s.io/` (Leases) only.
    Leases,
    /// Every call.
    Every,
}

/// One Lease call as the caller saw it through the proxy: from its head received to the
/// answer's head sent back (the delay included).
#[derive(Debug, Clone)]
pub struct LeaseCall {
    pub at: Instant,
    pub method: String,
    /// The Lease's name (the last path segment; empty for a list or watch).
    pub lease: String,
    pub took: Duration,
    pub status: u16,
}

/// The proxy; stops serving when dropped.
pub struct LatencyProxy {
    /// `https://NODE_IP:PORT`: what pods' kubeconfigs name.
    pub url: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    /// The delay in force and what it applies to.
    delay: Mutex<Option<(Scope, Duration)>>,
    upstream: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    upstream_name: ServerName<'static>,
    lease_calls: Mutex<VecDeque<LeaseCall>>,
    requests: AtomicU64,
    delayed: AtomicU64,
    /// Requests answered 502 (the API server could not be reached).
    failed: AtomicU64,
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LatencyProxy {
    /// Starts the proxy on `listen` (port 0: any), forwarding to the API server at
    /// `upstream` (its certificate checked against the plane's CA, for the address's name).
    pub async fn start(pki: &Pki, listen: SocketAddr, upstream: SocketAddr) -> LatencyProxy {
        let std::net::IpAddr::V4(ip) = listen.ip() else {
            panic!("the latency proxy listens on IPv4 only: {listen}");
        };
        let pair = pki.server("latency-proxy", &["localhost"], &[ip]);
        let certs = vec![CertificateDer::from_pem_slice(pair.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        // HTTP/1.1 only: each client connection maps onto one connection to the API server.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];

        let listener = TcpListener::bind(listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            delay: Mutex::new(None),
            upstream,
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            upstream_name: ServerName::IpAddress(upstream.ip().into()),
            lease_calls: Mutex::new(VecDeque::new()),
            requests: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        let span = tracing::info_span!("latency_proxy", %addr, %upstream);
        tokio::spawn(
            accept_loop(
                listener,
                tokio_rustls::TlsAcceptor::from(Arc::new(server)),
                shared.clone(),
                stop.clone(),
            )
            .instrument(span),
        );
        LatencyProxy {
            url: format!("https://{addr}"),
            shared,
            stop,
        }
    }

    /// From now on, each request `scope` covers waits `delay` before it is forwarded;
    /// `None` (or a zero delay) forwards at once. Requests already waiting keep their delay.
    pub fn set_delay(&self, delay: Option<(Scope, Duration)>) {
        *self.shared.delay.lock().unwrap() = delay.filter(|(_, d)| !d.is_zero());
    }

    /// The Lease calls completed since `since`, oldest first.
    pub fn lease_calls(&self, since: Instant) -> Vec<LeaseCall> {
        self.shared
            .lease_calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.at >= since)
            .cloned()
            .collect()
    }

    /// Requests received, of which delayed, and answered 502, since the start.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.shared.requests.load(Ordering::Relaxed),
            self.shared.delayed.load(Ordering::Relaxed),
            self.shared.failed.load(Ordering::Relaxed),
        )
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let seats = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let seat = tokio::select! {
            _ = stop.cancelled() => return,
            seat = seats.clone().acquire_owned() => seat.unwrap(),
        };
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(
            async move {
                let _seat = seat;
                let tls = match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake");
                        return;
                    }
                    Err(_) => return,
                };
                // This connection's own connection to the API server, made at its first
                // request and made again when the API server closed it.
                let upstream: Arc<tokio::sync::Mutex<Option<Upstream>>> = Arc::default();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    let upstream = upstream.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(forward(&shared, &upstream, req).await)
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .serve_connection(TokioIo::new(tls), service);
                tokio::select! {
                    _ = stop.cancelled() => {}
                    r = conn => if let Err(e) = r {
                        tracing::debug!(error = %e, "connection");
                    },
                }
            }
            .instrument(tracing::debug_span!("connection", %peer)),
        );
    }
}

type Upstream = hyper::client::conn::http1::SendRequest<Incoming>;
type Body = BoxBody<Bytes, hyper::Error>;

/// Forwards one request after the delay in force; the API server's answer, streamed.
async fn forward(
    shared: &Shared,
    upstream: &tokio::sync::Mutex<Option<Upstream>>,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let received = Instant::now();
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path().to_string();
    let is_lease = path.starts_with("/apis/coordination.k8s.io/");
    let delay = *shared.delay.lock().unwrap();
    if let Some((scope, d)) = delay
        && (scope == Scope::Every || is_lease)
    {
        shared.delayed.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(d).await;
    }
    let method = req.method().to_string();
    for h in HOP_BY_HOP {
        req.headers_mut().remove(h);
    }
    let answer = send(shared, upstream, req).await;
    let response = match answer {
        Ok(mut resp) => {
            for h in HOP_BY_HOP.iter().chain(&["transfer-encoding"]) {
                resp.headers_mut().remove(*h);
            }
            resp.map(BodyExt::boxed)
        }
        Err(e) => {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, %path, "forwarding");
            let mut resp = Response::new(
                Full::new(Bytes::from(format!("latency proxy: {e}\n")))
                    .map_err(|never| match never {})
                    .boxed(),
            );
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp
        }
    };
    if is_lease {
        let lease = path
            .trim_end_matches('/')
            .rsplit_once("/leases/")
            .map(|(_, name)| name.to_string())
            .unwrap_or_default();
        let mut calls = shared.lease_calls.lock().unwrap();
        if calls.len() >= MAX_SAMPLES {
            calls.pop_front();
        }
        calls.push_back(LeaseCall {
            at: received,
            method,
            lease,
            took: received.elapsed(),
            status: response.status().as_u16(),
        });
    }
    response
}

/// Sends `req` on this connection's connection to the API server, made first if there is
/// none or the last one closed.
async fn send(
    shared: &Shared,
    upstream: &tokio::sync::Mutex<Option<Upstream>>,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, String> {
    let mut slot = upstream.lock().await;
    if let Some(s) = slot.as_mut()
        && s.ready().await.is_err()
    {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some(connect(shared).await?);
    }
    let sender = slot.as_mut().expect("just made");
    sender.send_request(req).await.map_err(|e| {
        *slot = None;
        format!("the API server: {e}")
    })
}

async fn connect(shared: &Shared) -> Result<Upstream, String> {
    let dial = async {
        let tcp = tokio::net::TcpStream::connect(shared.upstream)
            .await
            .map_err(|e| format!("connecting to {}: {e}", shared.upstream))?;
        tcp.set_nodelay(true).ok();
        shared
            .connector
            .connect(shared.upstream_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS to {}: {e}", shared.upstream))
    };
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, dial)
        .await
        .map_err(|_| {
            format!(
                "no connection to {} in {CONNECT_TIMEOUT:?}",
                shared.upstream
            )
        })??;
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP/1.1 to {}: {e}", shared.upstream))?;
    tokio::spawn(
        async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection");
            }
        }
        .instrument(tracing::debug_span!("upstream")),
    );
    Ok(sender)
}

/// `n p50 p90 max` of some durations, in seconds.
pub fn summary(mut took: Vec<Duration>) -> String {
    if took.is_empty() {
        return "none".into();
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize].as_secs_f64();
    format!(
        "{} calls, p50 {:.2}s, p90 {:.2}s, max {:.2}s",
        took.len(),
        at(0.5),
        at(0.9),
        at(1.0)
    )
}
