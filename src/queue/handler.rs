//! The sidecar's request path, the HTTP/1 engine's handler. The order is the contract:
//!
//! 1. probes: `K-Network-Probe: queue` is answered `queue` (200) while the user container is
//!    ready and the sidecar not draining, else 503; `K-Network-Probe: probe` (the ingress
//!    prober, as the activator answers it) is 200 echoing `K-Network-Hash` (400 without one);
//!    any other `K-Network-Probe` value is 400 (a probe meant for an activator must not find
//!    one here); kubelet probes on the data port
//!    (`K-Kubelet-Probe`, `User-Agent: kube-probe/...`) get the readiness answer;
//! 2. header limits (431), `CONNECT` (501), and the host rule the activator applies
//!    (`http1::host`): two `Host` fields, none on HTTP/1.1, or an h2 `host` that differs from
//!    `:authority` are 400;
//! 3. accounting ([`PodWindow::arrive`]): from here the request counts in the pod's stats,
//!    queued time included, until its response body ends;
//! 4. containerConcurrency ([`Limiter`]): a place at once, else a wait in the bounded queue
//!    (503 with a reason when it is full, 504 past the revision's timeout);
//! 5. header hygiene: hop-by-hop fields, `K-Proxy-Request`, `K-Original-Host` and
//!    `K-Network-Hash` removed; exactly one `Host`: `K-Original-Host`'s when the request is
//!    proxied (below), else the target's authority (absolute form, h2's `:authority`), else
//!    the client's one `Host`; when no `Forwarded` field came, one built from the first
//!    `X-Forwarded-For`, `-Proto` and `-Host` fields, if any came ([`forwarded_shim`], Knative's
//!    queue-proxy `ForwardedShimHandler`: the runtime contract's `Forwarded` MUST);
//! 6. forward to 127.0.0.1:`USER_PORT` over the engine's pool (a bodiless HTTP/1.1 request on a
//!    direct connection, anything else through hyper's client), the response head within the
//!    response-start timeout;
//!    The client's body is forwarded under the request-body idle timeout: a body that sends
//!    nothing for that long is cut, answered 408 (or, once the response has started, its
//!    connection closed), and its place freed;
//! 7. the body streamed under the idle and total timeouts ([`TimedBody`]); the place and the
//!    count are released when it ends. An upgrade (websocket) answered 101 becomes a tunnel
//!    (`http1::tunnel`) holding the place and the count while it lives (idle timeout only).
//!
//! A request is proxied (through an activator: counted apart in the pod's stats, its
//! `K-Original-Host` believed) only when `K-Proxy-Request` carries the revision's tag
//! ([`crate::knative::proxy_tag`], `THAW_PROXY_TAG`, or during this release the previous
//! form's, `THAW_PROXY_TAG_LEGACY`). Without it the request is direct, its
//! `Host` is its own, and `thaw_queue_untagged_proxy_requests_total` counts the attempt; either
//! header is removed all the same.
//!
//! Errors are answered here, generically (the log has the detail): 502 when the user container
//! refused or dropped the connection (and it is probed at once), 504 on a timeout.
//!
//! A gRPC call (`http1::grpc`: HTTP/2, `content-type: application/grpc*`) gets each of these
//! answers as a trailers-only gRPC error with the same reason, runs under the shorter of its
//! `grpc-timeout` and the revision's timeout (queueing included), ends with `grpc-status` 4 in
//! trailers when a timeout cuts its response body, and is refused (UNIMPLEMENTED) when the
//! user container speaks HTTP/1.1 only.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use http::header::{self, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::body::{Held, QueueBody, plain};
use super::podstats::PodWindow;
use super::probe::Readiness;
use super::settings::Settings;
use crate::http1::activity::ConnActive;
use crate::http1::direct::{self, DirectError, ExchangeError};
use crate::http1::fields::{ClientHeaders, HeadersRef, Known};
use crate::http1::grpc;
use crate::http1::host::{self, HostError, HostFields, HostSource};
use crate::http1::pool::{
    BoxError, ClientBodyError, ConnectError, ReqBody, RespBody, Reusable, SendError, Upstream,
};
use crate::http1::timed::TimedBody;
use crate::http1::{ClientRequest, Handler, Limits, Protocol, ResponseBody};
use crate::knative::proxy_tag::Accepted;
use crate::limiter::{Limiter, Rejected};
use crate::telemetry::queue::QueueTelemetry;

/// `K-Network-Probe`.
pub const K_NETWORK_PROBE: HeaderName = HeaderName::from_static("k-network-probe");
/// `K-Proxy-Request`: the request came through an activator.
pub const K_PROXY_REQUEST: HeaderName = HeaderName::from_static("k-proxy-request");
/// `K-Original-Host`: the client's Host, moved aside by the activator.
pub const K_ORIGINAL_HOST: HeaderName = HeaderName::from_static("k-original-host");
/// `K-Kubelet-Probe`.
pub const K_KUBELET_PROBE: HeaderName = HeaderName::from_static("k-kubelet-probe");
/// `K-Network-Hash`: the ingress prober's hash, echoed on `K-Network-Probe: probe`.
pub const K_NETWORK_HASH: HeaderName = HeaderName::from_static("k-network-hash");
/// `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`: what [`forwarded_shim`] reads.
const X_FORWARDED: [HeaderName; 3] = [
    HeaderName::from_static("x-forwarded-for"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-host"),
];

/// The sidecar: its settings, the containerConcurrency limiter, the pod's stats window, the
/// pool to the user container, readiness and drain state, and its metrics.
#[derive(Debug)]
pub struct Sidecar {
    pub settings: Settings,
    pub limiter: Limiter,
    pub window: Arc<PodWindow>,
    upstream: Upstream,
    pub readiness: Arc<Readiness>,
    draining: AtomicBool,
    /// Woken when draining starts (`/wait-for-drain` waits for it).
    pub drain_started: tokio::sync::Notify,
    pub telemetry: QueueTelemetry,
    /// Upgraded (websocket) tunnels: drain waits for them within the revision's timeout,
    /// then cancels what is left.
    pub tunnels: TaskTracker,
    pub tunnel_cancel: CancellationToken,
    /// The engine's per-connection limits (config-activator's defaults).
    pub limits: Limits,
    max_header_count: u32,
    max_header_bytes: u32,
}

impl Sidecar {
    /// A sidecar for `settings`, its metrics in `telemetry`.
    pub fn new(settings: Settings, telemetry: QueueTelemetry) -> Self {
        let defaults = crate::config::ActivatorConfig::default();
        let limits = Limits {
            header_read_timeout: defaults.header_read_timeout,
            keep_alive_timeout: defaults.keep_alive_timeout,
            max_header_bytes: defaults.max_header_bytes,
            max_header_count: defaults.max_header_count,
            h2_max_concurrent_streams: defaults.h2_max_concurrent_streams,
            lane: true,
        };
        Self {
            limiter: Limiter::new(
                settings.container_concurrency,
                settings.queue_depth as usize,
            ),
            window: PodWindow::new(Instant::now()),
            upstream: Upstream::new(defaults.connect_timeout),
            readiness: Arc::default(),
            draining: AtomicBool::new(false),
            drain_started: tokio::sync::Notify::new(),
            telemetry,
            tunnels: TaskTracker::new(),
            tunnel_cancel: CancellationToken::new(),
            limits,
            max_header_count: defaults.max_header_count,
            max_header_bytes: defaults.max_header_bytes,
            settings,
        }
    }

    /// Whether SIGTERM has been received.
    pub fn is_draining(&self) -> bool {
        self.draining.load(SeqCst)
    }

    /// Readiness fails from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, SeqCst);
        self.drain_started.notify_waiters();
    }

    /// Ready: the user container answers its probe and the sidecar is not draining.
    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.readiness.is_ready()
    }

    fn answer_probe(&self, value: &[u8], hash: Option<HeaderValue>) -> Response<QueueBody> {
        if value == b"probe" {
            // The ingress prober (Knative's netprobe handler): the hash the ingress set.
            let Some(hash) = hash else {
                return plain(
                    StatusCode::BAD_REQUEST,
                    "K-Network-Hash header is missing\n",
                );
            };
            let mut resp = plain(StatusCode::OK, "");
            resp.headers_mut().insert(K_NETWORK_HASH, hash);
            return resp;
        }
        if value != b"queue" {
            return plain(
                StatusCode::BAD_REQUEST,
                "unexpected K-Network-Probe value\n",
            );
        }
        if self.is_draining() {
            plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        } else if self.readiness.is_ready() {
            plain(StatusCode::OK, "queue")
        } else {
            plain(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
        }
    }

    /// One request, end to end (see the module doc). Never fails: errors are answers.
    async fn answer<B: ClientRequest + Send + 'static>(
        &self,
        conn: ConnActive,
        req: Request<B>,
    ) -> Response<QueueBody> {
        let started = Instant::now();
        let mut seen = Seen::read(
            B::fields(&req),
            req.uri(),
            req.version(),
            &self.settings.proxy_tags,
        );
        if seen.untagged {
            // Direct, whatever it says: its `K-Original-Host` is not believed either.
            self.telemetry.queue.untagged_proxy.inc();
            seen.original_host = None;
        }
        if let Some(p) = seen.network_probe {
            return self.answer_probe(p.as_bytes(), seen.network_hash);
        }
        if seen.kubelet_probe {
            return readiness_answer(self.is_ready());
        }
        let fields = B::fields(&req);
        if let Err((what, actual, limit)) =
            fields.check_limits(self.max_header_count, self.max_header_bytes)
        {
            tracing::debug!(what, actual, limit, "request headers too large");
            return self.count(
                started,
                own(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    format!("request headers too large ({what})\n"),
                    grpc::is_call(req.version(), fields),
                ),
            );
        }
        if req.method() == Method::CONNECT {
            return self.count(
                started,
                own(
                    StatusCode::NOT_IMPLEMENTED,
                    "CONNECT is not supported\n",
                    grpc::is_call(req.version(), fields),
                ),
            );
        }
        if let Err(e) = seen.host {
            tracing::debug!(error = %e, "refused: the request's host");
            let grpc = grpc::is_call(req.version(), fields);
            return self.count(
                started,
                own(StatusCode::BAD_REQUEST, format!("{e}\n"), grpc),
            );
        }
        // A tagged `K-Original-Host` (an untagged one was dropped above) becomes the
        // application's `Host`: it must be one field holding one authority.
        if let Some(h) = &seen.original_host
            && (seen.original_host_count > 1 || !host::one_authority(h.as_bytes()))
        {
            tracing::debug!(
                count = seen.original_host_count,
                "refused: K-Original-Host is not one authority"
            );
            let grpc = grpc::is_call(req.version(), fields);
            return self.count(
                started,
                own(
                    StatusCode::BAD_REQUEST,
                    "K-Original-Host must be one authority\n",
                    grpc,
                ),
            );
        }
        let span =
            tracing::debug_span!("request", method = %req.method(), path = %req.uri().path());
        // A gRPC call's deadline and error form (an HTTP/1.x request: a version compare).
        let call = grpc::call(req.version(), fields);
        let resp = match self
            .proxy(conn, req, seen, started, call)
            .instrument(span)
            .await
        {
            Ok(resp) => resp,
            Err(e) => self.failed(e, call.is_some()),
        };
        self.count(started, resp)
    }

    /// Counts an answer in `revision_request_count` and its latency.
    fn count(&self, started: Instant, resp: Response<QueueBody>) -> Response<QueueBody> {
        let m = &self.telemetry.queue;
        m.requests.inc(resp.status().as_u16());
        m.latency_ms
            .observe(started.elapsed().as_secs_f64() * 1000.0);
        resp
    }

    /// The answer for an error (generic: the log has the detail), counted; a gRPC error to a
    /// gRPC call (`grpc`).
    fn failed(&self, e: Failure, grpc: bool) -> Response<QueueBody> {
        let m = &self.telemetry.queue;
        let (status, text) = match &e {
            Failure::QueueFull { .. } => {
                m.overflow.inc();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded: the request queue is full\n",
                )
            }
            Failure::QueueTimeout => {
                m.timeouts.inc();
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "timed out waiting for the application\n",
                )
            }
            Failure::Timeout => {
                m.timeouts.inc();
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "the application did not answer in time\n",
                )
            }
            Failure::Connect(_) => {
                m.user_errors.inc();
                self.readiness.lost();
                (StatusCode::BAD_GATEWAY, "the application did not answer\n")
            }
            Failure::Upstream(_) => {
                m.user_errors.inc();
                self.readiness.recheck();
                (StatusCode::BAD_GATEWAY, "the application did not answer\n")
            }
            Failure::ClientBody(e) if ClientBodyError::is_stall_in(&**e) => {
                (StatusCode::REQUEST_TIMEOUT, "the request body stalled\n")
            }
            Failure::ClientBody(_) => (StatusCode::BAD_REQUEST, "malformed request body\n"),
            Failure::GrpcToHttp1 => (
                StatusCode::NOT_IMPLEMENTED,
                "the application serves HTTP/1.1 only: a gRPC call needs an h2c port (ports[].name: h2c)\n",
            ),
        };
        // Overflow is expected under load: not logged per request (it is counted).
        if !matches!(e, Failure::QueueFull { .. }) {
            tracing::info!(error = %e, status = status.as_u16(), "request failed");
        }
        let mut r = own(status, text, grpc);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }

    /// Steps 3 to 7.
    async fn proxy<B: ClientRequest + Send + 'static>(
        &self,
        conn: ConnActive,
        mut req: Request<B>,
        seen: Seen,
        started: Instant,
        call: Option<grpc::Call>,
    ) -> Result<Response<QueueBody>, Failure> {
        if call.is_some() && self.settings.user_protocol == Protocol::Http1 {
            return Err(Failure::GrpcToHttp1);
        }
        // A protocol upgrade (websocket) is forwarded over HTTP/1.1 and becomes a tunnel;
        // `Upgrade: h2c` is not followed (served over HTTP/1.1 without it).
        let upgrade = req.version() == Version::HTTP_11
            && B::fields(&req).upgrade_protocols().is_some_and(|p| {
                !crate::http1::fields::tokens(p).all(|t| t.eq_ignore_ascii_case(b"h2c"))
            });
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let t = self.settings.timeouts;
        // A gRPC call's own deadline, when shorter, bounds its queueing and its exchange.
        let deadline = started + grpc::Call::bound(call, t.total);
        let in_flight = self.window.arrive(seen.proxied, started);
        let permit = match self.limiter.try_acquire() {
            Some(p) => p,
            None => self.limiter.acquire(deadline).await.map_err(|r| match r {
                Rejected::QueueFull { depth } => Failure::QueueFull { depth },
                Rejected::Timeout { .. } => Failure::QueueTimeout,
            })?,
        };
        let protocol = match upgrade {
            true => Protocol::Http1,
            false => self.settings.user_protocol,
        };
        let (parts, body) = req.into_parts();
        let (mut headers, body) = B::split(parts.headers, body);
        let body = body.stall_after(
            self.settings.request_body_idle,
            &self.telemetry.queue.request_body_timeouts,
        );
        let host = prepare(
            &mut headers,
            host_override(seen.original_host, seen.host, parts.uri.authority()),
            protocol,
            upgrade,
        );
        let forwarded = match seen.forwarded {
            true => None,
            false => forwarded_shim(&seen.x_forwarded).map(|v| (header::FORWARDED, v)),
        };
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let app_started = Instant::now();
        let start_deadline = deadline.min(app_started + t.response_start);
        let upstream = self.upstream.for_this_thread();
        let user = self.settings.user;
        let direct = protocol == Protocol::Http1 && !upgrade && matches!(body, ReqBody::Empty);
        let (mut resp, reusable) = if direct {
            let head_only = parts.method == Method::HEAD;
            let head = direct::encode_head(
                &parts.method,
                path.as_str(),
                host.as_ref(),
                &headers,
                forwarded.as_slice(),
            );
            forward_direct(&upstream, user, head, head_only, start_deadline).await?
        } else {
            let mut map = headers.into_map();
            if let Some((name, value)) = forwarded {
                map.insert(name, value);
            }
            let uri = match protocol {
                Protocol::Http1 => {
                    if let Some(h) = host {
                        map.insert(header::HOST, h);
                    }
                    Uri::from(path)
                }
                Protocol::H2c => {
                    let authority = host
                        .or_else(|| map.remove(header::HOST))
                        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
                        .unwrap_or_else(|| {
                            Authority::try_from(user.to_string())
                                .expect("an address is an authority")
                        });
                    map.remove(header::HOST);
                    Uri::builder()
                        .scheme(Scheme::HTTP)
                        .authority(authority)
                        .path_and_query(path)
                        .build()
                        .expect("scheme, authority and path are valid")
                }
            };
            let mut up = Request::new(body);
            *up.method_mut() = parts.method;
            *up.uri_mut() = uri;
            *up.version_mut() = match protocol {
                Protocol::Http1 => Version::HTTP_11,
                Protocol::H2c => Version::HTTP_2,
            };
            *up.headers_mut() = map;
            forward_hyper(&upstream, user, protocol, up, start_deadline).await?
        };
        let m = &self.telemetry.queue;
        m.app_requests.inc(resp.status().as_u16());
        m.app_latency_ms
            .observe(app_started.elapsed().as_secs_f64() * 1000.0);
        // A length next to Transfer-Encoding is stale (RFC 9112 §6.3); a 304 goes out without
        // the length of the body it stands for (as the activator does).
        if resp.headers().contains_key(header::TRANSFER_ENCODING) {
            resp.headers_mut().remove(header::CONTENT_LENGTH);
        }
        if resp.status() == StatusCode::NOT_MODIFIED {
            resp.headers_mut().remove(header::CONTENT_LENGTH);
            if let Some(f) = resp.body_mut().upstream_fields_mut() {
                f.drop_all(Known::ContentLength);
            }
        }
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let held = Held {
            _permit: permit,
            _in_flight: in_flight,
            _conn: conn,
            user_errors: m.user_errors.clone(),
        };
        match (switching, client_upgrade) {
            (true, None) => {
                // A 101 nobody asked for: the application broke the exchange.
                return Err(Failure::Upstream(
                    "101 Switching Protocols without an upgrade".into(),
                ));
            }
            (true, Some(client)) => {
                crate::http1::fields::strip_hop_by_hop(resp.headers_mut(), true);
                let upstream = hyper::upgrade::on(&mut resp);
                let (cancel, idle) = (self.tunnel_cancel.clone(), t.idle);
                // The place under containerConcurrency and the count last as long as the tunnel.
                self.tunnels.spawn(
                    async move {
                        let _held = held;
                        crate::http1::tunnel::run(client, upstream, idle, cancel).await;
                    }
                    .instrument(tracing::debug_span!("tunnel")),
                );
                return Ok(resp.map(|_| QueueBody::Full(None)));
            }
            (false, _) => {}
        }
        crate::http1::fields::strip_hop_by_hop(resp.headers_mut(), false);
        let (head, incoming) = resp.into_parts();
        let body = TimedBody::new(incoming, t.idle, deadline, held, reusable).grpc(call.is_some());
        Ok(Response::from_parts(
            head,
            QueueBody::Proxied(Box::new(body)),
        ))
    }
}

/// An answer of the sidecar's own: `text/plain`, or to a gRPC call (`grpc`) a trailers-only
/// gRPC error with the same text ([`crate::http1::grpc`]).
fn own(status: StatusCode, text: impl Into<bytes::Bytes>, grpc: bool) -> Response<QueueBody> {
    if grpc {
        let text = text.into();
        let message = std::str::from_utf8(&text).unwrap_or_default();
        grpc::trailers_only(grpc::code_for(status), message, QueueBody::empty())
    } else {
        plain(status, text)
    }
}

fn readiness_answer(ready: bool) -> Response<QueueBody> {
    if ready {
        plain(StatusCode::OK, "ok\n")
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Why a request was not answered by the user container.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("queue full ({depth} waiting)")]
    QueueFull { depth: usize },
    #[error("no place under containerConcurrency before the revision's timeout")]
    QueueTimeout,
    #[error("cannot connect to the user container: {0}")]
    Connect(ConnectError),
    #[error("the user container failed the exchange: {0}")]
    Upstream(BoxError),
    #[error("the client's body failed: {0}")]
    ClientBody(BoxError),
    #[error("no response head before the response-start or total timeout")]
    Timeout,
    #[error("a gRPC call to an application that serves HTTP/1.1 only")]
    GrpcToHttp1,
}

/// What the sidecar reads of a request's fields, in one pass.
#[derive(Debug)]
struct Seen {
    network_probe: Option<HeaderValue>,
    /// Read only when present (a probe's, or one to strip): no allocation otherwise.
    network_hash: Option<HeaderValue>,
    kubelet_probe: bool,
    /// `K-Proxy-Request` carried the revision's tag.
    proxied: bool,
    /// `K-Proxy-Request` or `K-Original-Host` came without the revision's tag.
    untagged: bool,
    original_host: Option<HeaderValue>,
    /// How many `K-Original-Host` fields came (a tagged one must come once).
    original_host_count: u8,
    /// Where the host the application gets comes from, or why the request is refused
    /// (`http1::host`, the activator's rule).
    host: Result<HostSource, HostError>,
    /// A `Forwarded` field came: [`forwarded_shim`] builds none.
    forwarded: bool,
    /// The first `X-Forwarded-For`, `-Proto` and `-Host` fields ([`X_FORWARDED`]'s order).
    x_forwarded: [Option<HeaderValue>; 3],
}

impl Seen {
    /// Reads `fields`; `K-Proxy-Request` counts only when its first field carries one of
    /// `tags`.
    fn read(fields: HeadersRef<'_>, uri: &Uri, version: Version, tags: &Accepted) -> Self {
        let tagged = |v: &[u8]| tags.accepts(v);
        let mut proxy: Option<bool> = None;
        let mut s = Seen {
            network_probe: None,
            network_hash: None,
            kubelet_probe: false,
            proxied: false,
            untagged: false,
            original_host: None,
            original_host_count: 0,
            host: Ok(HostSource::None),
            forwarded: false,
            x_forwarded: [None, None, None],
        };
        let mut hosts = HostFields::default();
        match fields {
            HeadersRef::Raw(raw) => {
                for (known, _, value) in raw.known() {
                    match known {
                        Known::Host => hosts.saw(value),
                        Known::NetworkProbe => {
                            s.network_probe = s.network_probe.or_else(|| raw.value(value));
                        }
                        Known::NetworkHash => {
                            s.network_hash = s.network_hash.or_else(|| raw.value(value));
                        }
                        Known::KubeletProbe => s.kubelet_probe = true,
                        Known::UserAgent => s.kubelet_probe |= value.starts_with(b"kube-probe/"),
                        Known::ProxyRequest => {
                            proxy = proxy.or_else(|| Some(tagged(value)));
                        }
                        Known::OriginalHost => {
                            s.original_host_count = s.original_host_count.saturating_add(1);
                            s.original_host = s.original_host.or_else(|| raw.value(value));
                        }
                        Known::Forwarded => s.forwarded = true,
                        Known::ForwardedFor | Known::ForwardedProto | Known::ForwardedHost => {
                            let i = match known {
                                Known::ForwardedFor => 0,
                                Known::ForwardedProto => 1,
                                _ => 2,
                            };
                            if s.x_forwarded[i].is_none() {
                                s.x_forwarded[i] = raw.value(value);
                            }
                        }
                        _ => {}
                    }
                }
            }
            HeadersRef::Map(map) => {
                s.network_probe = map.get(K_NETWORK_PROBE).cloned();
                s.network_hash = map.get(K_NETWORK_HASH).cloned();
                s.kubelet_probe = map.contains_key(K_KUBELET_PROBE)
                    || map
                        .get(header::USER_AGENT)
                        .is_some_and(|v| v.as_bytes().starts_with(b"kube-probe/"));
                proxy = map.get(K_PROXY_REQUEST).map(|v| tagged(v.as_bytes()));
                s.original_host = map.get(K_ORIGINAL_HOST).cloned();
                if s.original_host.is_some() {
                    let n = map.get_all(K_ORIGINAL_HOST).iter().count();
                    s.original_host_count = u8::try_from(n).unwrap_or(u8::MAX);
                }
                s.forwarded = map.contains_key(header::FORWARDED);
                s.x_forwarded = X_FORWARDED.map(|n| map.get(n).cloned());
                for value in map.get_all(header::HOST) {
                    hosts.saw(value.as_bytes());
                }
            }
        }
        s.host = host::source(hosts, uri.authority().map(Authority::as_str), version);
        s.proxied = proxy == Some(true);
        s.untagged = proxy == Some(false) || (!s.proxied && s.original_host.is_some());
        s
    }
}

/// Knative's queue-proxy `ForwardedShimHandler` (RFC 7239): the `Forwarded` field the
/// application gets when the request brought none, built from the first `X-Forwarded-For`,
/// `-Proto` and `-Host` fields (`x`, in [`X_FORWARDED`]'s order); none when all three are
/// absent or empty. The first `X-Forwarded-For` node carries `host=` and `proto=`, each
/// further node is an element of its own (`, for=`), an IPv6 node (one with a `:`) quoted in
/// brackets: `for=10.0.0.1;host=example.com;proto=http, for="[::1]"`.
fn forwarded_shim(x: &[Option<HeaderValue>; 3]) -> Option<HeaderValue> {
    let get = |i: usize| x[i].as_ref().map_or(&b""[..], HeaderValue::as_bytes);
    let (xff, xfp, xfh) = (get(0), get(1), get(2));
    if xff.is_empty() && xfp.is_empty() && xfh.is_empty() {
        return None;
    }
    let node = |out: &mut Vec<u8>, n: &[u8]| {
        let v6 = n.contains(&b':');
        if v6 {
            out.extend_from_slice(b"\"[");
        }
        out.extend_from_slice(n);
        if v6 {
            out.extend_from_slice(b"]\"");
        }
    };
    let mut out = Vec::with_capacity(xff.len() + xfp.len() + xfh.len() + 32);
    // The nodes as Knative splits them: at ',', trimmed; a last ',' ends the list.
    let list = xff.strip_suffix(b",").unwrap_or(xff);
    let mut nodes = list.split(|&b| b == b',').map(<[u8]>::trim_ascii);
    let first = nodes.next().filter(|_| !xff.is_empty()).unwrap_or_default();
    if !xff.is_empty() {
        out.extend_from_slice(b"for=");
        node(&mut out, first);
    }
    if !xfh.is_empty() {
        if !first.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(b"host=");
        out.extend_from_slice(xfh);
    }
    if !xfp.is_empty() {
        if !first.is_empty() || !xfh.is_empty() {
            out.push(b';');
        }
        out.extend_from_slice(b"proto=");
        out.extend_from_slice(xfp);
    }
    if !xff.is_empty() {
        for n in nodes {
            out.extend_from_slice(b", for=");
            node(&mut out, n);
        }
    }
    HeaderValue::from_bytes(&out).ok()
}

/// The `Host` the application gets in place of the client's `Host` fields, if not the one
/// `Host` field: `K-Original-Host`'s value, else the target's authority when it wins
/// (`http1::host`: absolute form, h2's `:authority`).
fn host_override(
    original_host: Option<HeaderValue>,
    source: Result<HostSource, HostError>,
    authority: Option<&Authority>,
) -> Option<HeaderValue> {
    original_host.or_else(|| match source {
        Ok(HostSource::Authority) => authority.and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
        _ => None,
    })
}

/// Header hygiene (step 5). Returns the `Host` to send when it is not (or no longer) among the
/// forwarded fields: `host` ([`host_override`]), else the client's one `Host` (the map form).
fn prepare(
    headers: &mut ClientHeaders,
    host: Option<HeaderValue>,
    protocol: Protocol,
    upgrade: bool,
) -> Option<HeaderValue> {
    match headers {
        ClientHeaders::Raw(raw) => {
            let mut skip = raw.hop_by_hop(upgrade);
            let replace_host = host.is_some();
            for (i, (known, _, _)) in raw.known().enumerate() {
                let drop = match known {
                    Known::ProxyRequest | Known::OriginalHost | Known::NetworkHash => true,
                    Known::Host => replace_host,
                    _ => false,
                };
                if drop {
                    skip |= 1u128 << i;
                }
            }
            raw.skip(skip);
            host
        }
        ClientHeaders::Map(map) => {
            crate::http1::fields::strip_hop_by_hop(map, upgrade);
            map.remove(K_PROXY_REQUEST);
            map.remove(K_ORIGINAL_HOST);
            map.remove(K_NETWORK_HASH);
            let host = host.or_else(|| map.remove(header::HOST));
            if protocol == Protocol::Http1 {
                // Written by the caller on either path.
                map.remove(header::HOST);
            }
            host
        }
    }
}

/// A bodiless HTTP/1.1 exchange over a direct connection; a pooled connection found closed
/// before the head was written gets the head again on a new one.
async fn forward_direct(
    upstream: &Upstream,
    addr: SocketAddr,
    head: Vec<u8>,
    head_only: bool,
    deadline: Instant,
) -> Result<(Response<RespBody>, Option<Reusable>), Failure> {
    let mut head = head;
    let mut fresh_only = false;
    loop {
        let pooled = if fresh_only {
            None
        } else {
            upstream.idle_direct(addr)
        };
        let (conn, reused) = match pooled {
            Some(c) => (c, true),
            None => match tokio::time::timeout_at(deadline, upstream.open_direct(addr)).await {
                Ok(Ok(c)) => (c, false),
                Ok(Err(e)) => return Err(Failure::Connect(e)),
                Err(_) => return Err(Failure::Timeout),
            },
        };
        match conn
            .exchange(head, head_only, upstream.home(addr), deadline)
            .await
        {
            Ok(resp) => return Ok((resp.map(RespBody::Direct), None)),
            Err(ExchangeError::Unsent(back, e)) if reused => {
                tracing::debug!(error = %e, "pooled connection was closed; sending on a new one");
                head = back;
                fresh_only = true;
            }
            Err(ExchangeError::Failed(DirectError::TimedOut)) => return Err(Failure::Timeout),
            Err(ExchangeError::Unsent(_, e) | ExchangeError::Failed(e)) => {
                return Err(Failure::Upstream(e.into()));
            }
        }
    }
}

/// An exchange through hyper's client (a body, or h2c); a pooled connection found closed
/// before the request was written gets it again on a new one.
async fn forward_hyper(
    upstream: &Upstream,
    addr: SocketAddr,
    protocol: Protocol,
    req: Request<ReqBody>,
    deadline: Instant,
) -> Result<(Response<RespBody>, Option<Reusable>), Failure> {
    let mut req = req;
    loop {
        let conn = match upstream.pooled_now(addr, protocol) {
            Some(c) => c,
            None => {
                let connecting = upstream.connect(addr, protocol);
                match Box::pin(tokio::time::timeout_at(deadline, connecting)).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return Err(Failure::Connect(e)),
                    Err(_) => return Err(Failure::Timeout),
                }
            }
        };
        let reused = conn.reused();
        match conn.send(req, deadline).await {
            Ok((resp, reusable)) => return Ok((resp, reusable)),
            Err(SendError::Unsent(back, e)) if reused => {
                tracing::debug!(error = %e, "pooled connection was closed; sending on a new one");
                req = *back;
            }
            Err(SendError::Unsent(_, e) | SendError::Failed(e)) if ClientBodyError::is_in(&*e) => {
                return Err(Failure::ClientBody(e));
            }
            Err(SendError::Unsent(_, e) | SendError::Failed(e)) => {
                return Err(Failure::Upstream(e));
            }
            Err(SendError::TimedOut) => return Err(Failure::Timeout),
        }
    }
}

/// The sidecar is the HTTP/1 engine's handler (see the module doc for its steps).
impl Handler for Sidecar {
    type Body = QueueBody;
    type Early = ();

    fn respond<'a, B: ClientRequest + Send + 'static>(
        this: &'a Arc<Self>,
        _peer: SocketAddr,
        conn: ConnActive,
        req: Request<B>,
        _early: Option<()>,
    ) -> impl Future<Output = Response<QueueBody>> + Send + 'a {
        this.answer(conn, req)
    }

    async fn handle(
        this: Arc<Self>,
        peer: SocketAddr,
        conn: ConnActive,
        req: Request<Incoming>,
        early: Option<()>,
    ) -> Result<Response<QueueBody>, Infallible> {
        let mut resp = Self::respond(&this, peer, conn, req, early).await;
        // hyper's server writes the head from the map alone.
        if let Some(fields) = resp.body_mut().take_upstream_fields() {
            fields.merge_into(resp.headers_mut());
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim(xff: &str, xfp: &str, xfh: &str) -> Option<String> {
        let v = |s: &str| (!s.is_empty()).then(|| HeaderValue::from_str(s).unwrap());
        forwarded_shim(&[v(xff), v(xfp), v(xfh)]).map(|h| h.to_str().unwrap().to_string())
    }

    /// Knative's `pkg/queue/forwarded_shim_test.go` cases (the existing-`Forwarded` one is
    /// `Seen::forwarded`).
    #[test]
    fn forwarded_is_built_as_knatives_queue_proxy_builds_it() {
        for (xff, xfh, xfp, want) in [
            (
                "127.0.0.1, ::1",
                "h",
                "p",
                r#"for=127.0.0.1;host=h;proto=p, for="[::1]""#,
            ),
            ("127.0.0.1", "h", "p", "for=127.0.0.1;host=h;proto=p"),
            ("127.0.0.1, ::1", "", "", r#"for=127.0.0.1, for="[::1]""#),
            (
                "127.0.0.1, ::1",
                "",
                "p",
                r#"for=127.0.0.1;proto=p, for="[::1]""#,
            ),
            (
                "127.0.0.1, ::1",
                "h",
                "",
                r#"for=127.0.0.1;host=h, for="[::1]""#,
            ),
            ("", "h", "", "host=h"),
            ("", "", "p", "proto=p"),
            ("", "h", "p", "host=h;proto=p"),
            (",,,", "", "", "for=, for=, for="),
        ] {
            assert_eq!(
                shim(xff, xfp, xfh).as_deref(),
                Some(want),
                "{xff:?} {xfh:?} {xfp:?}"
            );
        }
        assert_eq!(shim("", "", ""), None);
    }
}
