//! Forwarding: two pooled hyper clients (HTTP/1.1, and h2c with prior knowledge), and one
//! request's attempts with the connect-failure retry.
//!
//! Retry contract: an attempt whose connection could not be established, and whose request body
//! hyper never started to read, is retried on another endpoint (up to `connect-retries` times).
//! Anything else — a failure after the first byte may have left, a response-start timeout — is
//! never retried.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::{Duration, Instant};

use super::error::ActivatorError;
use super::headers::set_target_host;
use super::ticket::Ticket;
use crate::revision::Protocol;

/// Idle pooled connections kept per endpoint (Knative: 100).
const MAX_IDLE_PER_HOST: usize = 100;
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The pooled upstream clients. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Upstream {
    h1: Client<HttpConnector, ReqBody>,
    h2: Client<HttpConnector, ReqBody>,
    connect_timeout: Duration,
}

thread_local! {
    /// This thread's own clients (see [`Upstream::for_this_thread`]).
    static THREAD_UPSTREAM: std::cell::OnceCell<Arc<Upstream>> = const { std::cell::OnceCell::new() };
}

impl Upstream {
    /// Clients whose TCP connects give up after `connect_timeout`. Pools are bounded
    /// (100 idle connections per endpoint, closed after 90 s idle).
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        let mut b = Client::builder(TokioExecutor::new());
        b.pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
            .set_host(false);
        let h1 = b.build(connector.clone());
        b.http2_only(true).timer(TokioTimer::new());
        let h2 = b.build(connector);
        Self {
            h1,
            h2,
            connect_timeout,
        }
    }

    /// Clients with the same settings whose pool belongs to the calling thread: a client
    /// spawns its connections' tasks on the runtime that opens them, so on a single-threaded
    /// worker runtime the pooled connections and the requests using them share one thread.
    /// Built on first use per thread (the connect timeout is the one at construction).
    pub fn for_this_thread(&self) -> Arc<Self> {
        THREAD_UPSTREAM.with(|u| {
            u.get_or_init(|| Arc::new(Self::new(self.connect_timeout)))
                .clone()
        })
    }

    fn client(&self, protocol: Protocol) -> &Client<HttpConnector, ReqBody> {
        match protocol {
            Protocol::Http1 => &self.h1,
            Protocol::H2c => &self.h2,
        }
    }
}

/// A request prepared for forwarding; each attempt is built from it.
#[derive(Debug)]
pub struct Outbound {
    /// The client's method.
    pub method: Method,
    /// The client's path and query (the authority becomes the endpoint's).
    pub path_and_query: PathAndQuery,
    /// Already rewritten by [`super::headers::prepare_upstream`] (no `Host`).
    pub headers: HeaderMap,
    /// The client's body.
    pub body: BodySlot,
    /// Which client sends it (h2c revisions; upgrades always HTTP/1.1).
    pub protocol: Protocol,
}

/// Per-attempt limits.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimits {
    /// Other endpoints tried after a connect failure.
    pub connect_retries: u32,
    /// Longest wait for a response head per attempt.
    pub response_start: Duration,
    /// The request's total deadline (hold included).
    pub deadline: Instant,
    /// When the request arrived (for the timeout message).
    pub started: Instant,
}

/// Sends `out` to the endpoint of `ticket`'s slot; on a retryable connect failure moves the
/// ticket to another endpoint and tries again. Returns the response head and the endpoint that
/// answered.
pub async fn forward(
    upstream: &Upstream,
    ticket: &mut Ticket,
    out: Outbound,
    limits: AttemptLimits,
) -> Result<(Response<Incoming>, SocketAddr), ActivatorError> {
    let revision = ticket.state().key.clone();
    let mut tried: Vec<SocketAddr> = Vec::new();
    loop {
        let slot = ticket.slot().expect("forward needs an admitted ticket");
        let endpoint = slot.endpoint();
        let addr = endpoint.addr();
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(endpoint.authority().clone())
            .path_and_query(out.path_and_query.clone())
            .build()
            .expect("scheme, authority and path are valid");
        let mut headers = out.headers.clone();
        set_target_host(&mut headers, endpoint.host_value(), out.protocol);
        let mut req = Request::new(out.body.attempt());
        *req.method_mut() = out.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = match out.protocol {
            Protocol::Http1 => Version::HTTP_11,
            Protocol::H2c => Version::HTTP_2,
        };
        *req.headers_mut() = headers;
        let start_deadline = limits.deadline.min(Instant::now() + limits.response_start);
        let sent =
            tokio::time::timeout_at(start_deadline, upstream.client(out.protocol).request(req));
        match sent.await {
            Ok(Ok(resp)) => return Ok((resp, addr)),
            Ok(Err(e)) if e.is_connect() && out.body.reclaim() => {
                tried.push(addr);
                let attempts = tried.len() as u32;
                let next = (attempts <= limits.connect_retries)
                    .then(|| ticket.state().throttler.try_acquire_avoiding(&tried))
                    .flatten();
                match next {
                    Some(next) => {
                        tracing::debug!(%addr, next = %next.addr(), error = %e, "connect failed; retrying");
                        ticket.state().metrics.retries.inc();
                        ticket.release_slot();
                        ticket.set_slot(next);
                    }
                    None => {
                        return Err(ActivatorError::UpstreamConnect {
                            revision,
                            endpoint: addr,
                            attempts,
                            source: e,
                        });
                    }
                }
            }
            Ok(Err(e)) if e.is_connect() => {
                return Err(ActivatorError::UpstreamConnect {
                    revision,
                    endpoint: addr,
                    attempts: tried.len() as u32 + 1,
                    source: e,
                });
            }
            Ok(Err(e)) => {
                return Err(ActivatorError::Upstream {
                    revision,
                    endpoint: addr,
                    source: e,
                });
            }
            Err(_) if Instant::now() >= limits.deadline => {
                return Err(ActivatorError::TotalTimeout {
                    revision,
                    waited: limits.started.elapsed(),
                });
            }
            Err(_) => {
                return Err(ActivatorError::ResponseStartTimeout {
                    revision,
                    endpoint: addr,
                    waited: limits.response_start,
                });
            }
        }
    }
}

/// The client's request body, handed to one attempt at a time. An attempt takes the body on its
/// first read; if the attempt fails before that (connect refused), `BodySlot::reclaim` sees it
/// untouched and the next attempt may use it.
#[derive(Debug, Clone)]
pub enum BodySlot {
    /// No body (or an empty one): every attempt can send it.
    Empty,
    /// A body with data: taken by the first attempt that reads it.
    Shared(Arc<Mutex<Option<Incoming>>>),
}

impl BodySlot {
    /// Holds the client's body for the attempts.
    pub fn new(body: Incoming) -> Self {
        if body.is_end_stream() {
            BodySlot::Empty
        } else {
            BodySlot::Shared(Arc::new(Mutex::new(Some(body))))
        }
    }

    fn attempt(&self) -> ReqBody {
        match self {
            BodySlot::Empty => ReqBody::Empty,
            BodySlot::Shared(slot) => ReqBody::Shared {
                slot: slot.clone(),
                taken: None,
            },
        }
    }

    /// Whether the body is still unread, so a new attempt can send it whole.
    fn reclaim(&self) -> bool {
        match self {
            BodySlot::Empty => true,
            BodySlot::Shared(slot) => slot.lock().unwrap_or_else(|p| p.into_inner()).is_some(),
        }
    }
}

/// The body of one upstream attempt.
#[derive(Debug)]
pub enum ReqBody {
    /// Nothing to send.
    Empty,
    /// The client's body, taken from the slot on first read.
    Shared {
        /// Shared with the request's [`BodySlot`].
        slot: Arc<Mutex<Option<Incoming>>>,
        /// The body once this attempt started reading it.
        taken: Option<Incoming>,
    },
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Empty => Poll::Ready(None),
            ReqBody::Shared { slot, taken } => {
                if taken.is_none() {
                    *taken = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                }
                match taken {
                    Some(body) => Pin::new(body).poll_frame(cx),
                    None => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Empty => true,
            ReqBody::Shared { taken: Some(b), .. } => b.is_end_stream(),
            ReqBody::Shared { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Empty => SizeHint::with_exact(0),
            ReqBody::Shared { taken: Some(b), .. } => b.size_hint(),
            ReqBody::Shared { slot, .. } => slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map_or_else(SizeHint::default, |b| b.size_hint()),
        }
    }
}
