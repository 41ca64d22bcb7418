//! Forwarding: one request's attempts over thaw's upstream pool ([`super::pool`]), with the
//! connect-failure retry.
//!
//! Retry contract: an attempt whose connection could not be established is retried on another
//! endpoint (up to `connect-retries` times). The connection is had before the request is handed
//! to it, so at that point nothing of the request — head or body — has been sent or read. A
//! pooled connection found closed before the request was written gets the request back whole,
//! which is sent again on a fresh connection to the same endpoint (not counted as a retry).
//! Anything else — a failure after the first byte may have left, a response-start timeout — is
//! never retried.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use http::header::HeaderValue;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version};
use tokio::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::error::ActivatorError;
use super::headers::{Additions, set_target_host};
use super::ticket::Ticket;
use crate::http1::fields::ClientHeaders;
use crate::revision::Protocol;

use crate::http1::direct::{self, DirectError, ExchangeError};
use crate::http1::pool::{ClientBodyError, ConnectError, SendError};
pub use crate::http1::pool::{ReqBody, RespBody, Reusable, Upstream};

/// A request prepared for forwarding.
#[derive(Debug)]
pub struct Outbound {
    /// The client's method.
    pub method: Method,
    /// The client's path and query (the authority becomes the endpoint's).
    pub path_and_query: PathAndQuery,
    /// The `Host` sent to whichever endpoint serves the request (the client's, when the next
    /// hop is the container itself); `None`: each endpoint's own address.
    pub host: Option<HeaderValue>,
    /// The client's headers, already rewritten by [`ClientHeaders::prepare`] (no `Host`).
    pub headers: ClientHeaders,
    /// What the activator adds (see [`super::headers::Additions`]).
    pub additions: Additions,
    /// The client's body.
    pub body: ReqBody,
    /// How it is sent (h2c revisions; upgrades always HTTP/1.1).
    pub protocol: Protocol,
    /// A protocol upgrade (websocket): goes through hyper's client, which hands over the
    /// upgraded connection.
    pub upgrade: bool,
}

impl Outbound {
    /// The upstream request, the additions merged into its map. Its target is set per attempt
    /// by [`aim`].
    fn into_request(self) -> Request<ReqBody> {
        let mut headers = self.headers.into_map();
        headers.extend(self.additions);
        let mut req = Request::new(self.body);
        *req.method_mut() = self.method;
        *req.uri_mut() = Uri::from(self.path_and_query);
        *req.version_mut() = match self.protocol {
            Protocol::Http1 => Version::HTTP_11,
            Protocol::H2c => Version::HTTP_2,
        };
        *req.headers_mut() = headers;
        req
    }
}

/// Points `req` at `endpoint`. HTTP/1.1: origin-form target (path and query) and `Host` set to
/// `host`, else the endpoint. h2c: absolute URI (`:scheme`, `:authority` = `host` if it is a
/// valid authority, else the endpoint).
fn aim(
    req: &mut Request<ReqBody>,
    endpoint: &Endpoint,
    protocol: Protocol,
    host: Option<&HeaderValue>,
) {
    set_target_host(
        req.headers_mut(),
        host.unwrap_or(endpoint.host_value()),
        protocol,
    );
    if protocol == Protocol::H2c {
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let authority = host
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .unwrap_or_else(|| endpoint.authority().clone());
        *req.uri_mut() = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(authority)
            .path_and_query(path)
            .build()
            .expect("scheme, authority and path are valid");
    }
}

/// Per-attempt limits.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimits {
    /// Other endpoints tried after a connect failure.
    pub connect_retries: u32,
    /// Longest wait for a response head per attempt (connect included).
    pub response_start: Duration,
    /// The request's total deadline (hold included).
    pub deadline: Instant,
    /// When the request arrived (for the timeout message).
    pub started: Instant,
    /// When the first attempt starts, if the caller read the clock for it already: a request
    /// admitted at once, microseconds after it arrived, starts at `started`. `None` after a
    /// hold, and every later attempt reads the clock.
    pub first_attempt_at: Option<Instant>,
}

impl AttemptLimits {
    /// The response-start deadline of the attempt starting now (the first attempt's reading of
    /// the clock is used once, then taken).
    fn next_start_deadline(&mut self) -> Instant {
        let now = self.first_attempt_at.take().unwrap_or_else(Instant::now);
        self.deadline.min(now + self.response_start)
    }
}

/// What [`forward`] returns: the response head, the endpoint that answered, and the HTTP/1.1
/// connection to give back to the pool once the response body has ended.
pub type Forwarded = (Response<RespBody>, SocketAddr, Option<Reusable>);

/// Sends `out` to the endpoint of `ticket`'s slot; on a connect failure moves the ticket to
/// another endpoint and tries again (see the module doc). The request's headers are never copied
/// per attempt: hyper's path moves them into the request once, the direct path encodes them
/// once per endpoint.
///
/// Boxed: a held request carries only this pointer, and each path's state is only its own.
/// Bodiless HTTP/1.1 requests go over a direct connection (see `super::direct`), the rest
/// through hyper's client.
pub fn forward<'a>(
    upstream: &'a Upstream,
    ticket: &'a mut Ticket,
    out: Outbound,
    limits: AttemptLimits,
) -> Pin<Box<dyn Future<Output = Result<Forwarded, ActivatorError>> + Send + 'a>> {
    if out.protocol == Protocol::Http1 && !out.upgrade && matches!(out.body, ReqBody::Empty) {
        Box::pin(forward_direct(upstream, ticket, out, limits))
    } else {
        Box::pin(forward_hyper(upstream, ticket, out, limits))
    }
}

/// [`forward`] over a direct connection. The head is encoded once per endpoint, with the
/// endpoint's `Host` and the additions written after the client's headers (the map is never
/// touched); a pooled connection found closed gets the same bytes again on a new one.
///
/// A plain function returning the future: an `async fn` would keep a second copy of `out` in
/// its state, and this state is allocated and moved for every warm request.
#[allow(clippy::manual_async_fn)] // see the doc: no second copy of the arguments
fn forward_direct<'a>(
    upstream: &'a Upstream,
    ticket: &'a mut Ticket,
    out: Outbound,
    mut limits: AttemptLimits,
) -> impl Future<Output = Result<Forwarded, ActivatorError>> + Send + 'a {
    async move {
        let head_only = out.method == Method::HEAD;
        let mut tried: Vec<SocketAddr> = Vec::new();
        // A head given back unsent, and the endpoint it was written for.
        let mut unsent: Option<(SocketAddr, Vec<u8>)> = None;
        loop {
            let slot = ticket.slot().expect("forward needs an admitted ticket");
            let addr = slot.addr();
            let start_deadline = limits.next_start_deadline();
            // A pooled connection is had at once; only opening one waits (under the deadline).
            let (conn, reused) = match upstream.idle_direct(addr) {
                Some(conn) => (conn, true),
                None => {
                    let opening =
                        tokio::time::timeout_at(start_deadline, upstream.open_direct(addr));
                    match Box::pin(opening).await {
                        Ok(Ok(conn)) => {
                            slot.endpoint().connect_succeeded();
                            (conn, false)
                        }
                        Ok(Err(e)) => {
                            retry_elsewhere(ticket, &mut tried, addr, e, &limits)?;
                            continue;
                        }
                        Err(_) => return Err(timeout_error(ticket, addr, &limits)),
                    }
                }
            };
            let head = match unsent.take() {
                Some((a, head)) if a == addr => head,
                _ => {
                    let target = out.path_and_query.as_str();
                    let endpoint_host = || ticket.slot().map(|s| s.endpoint().host_value());
                    let host = out.host.as_ref().or_else(endpoint_host);
                    direct::encode_head(&out.method, target, host, &out.headers, &out.additions)
                }
            };
            let home = upstream.home(addr);
            // The response-start deadline is the connection's to keep (it reuses its timer
            // across requests).
            match conn.exchange(head, head_only, home, start_deadline).await {
                Ok(resp) => return Ok((resp.map(RespBody::Direct), addr, None)),
                Err(ExchangeError::Unsent(head, e)) if reused => {
                    tracing::debug!(%addr, error = %e, "pooled connection was closed; sending on a new one");
                    unsent = Some((addr, head));
                }
                Err(ExchangeError::Failed(DirectError::TimedOut)) => {
                    return Err(timeout_error(ticket, addr, &limits));
                }
                Err(ExchangeError::Unsent(_, e) | ExchangeError::Failed(e)) => {
                    return Err(ActivatorError::Upstream {
                        revision: ticket.state().key.clone(),
                        endpoint: addr,
                        source: e.into(),
                    });
                }
            }
        }
    }
}

/// [`forward`] through hyper's client (a body, an upgrade, or h2c).
async fn forward_hyper(
    upstream: &Upstream,
    ticket: &mut Ticket,
    out: Outbound,
    mut limits: AttemptLimits,
) -> Result<Forwarded, ActivatorError> {
    let protocol = out.protocol;
    let host = out.host.clone();
    let mut req = out.into_request();
    let mut tried: Vec<SocketAddr> = Vec::new();
    loop {
        let slot = ticket.slot().expect("forward needs an admitted ticket");
        let endpoint = slot.endpoint();
        let addr = endpoint.addr();
        let start_deadline = limits.next_start_deadline();
        // A pooled connection is had at once; only opening one waits (under the deadline).
        let connected = match upstream.pooled_now(addr, protocol) {
            Some(conn) => Ok(Ok(conn)),
            None => {
                let connecting = upstream.connect(addr, protocol);
                Box::pin(tokio::time::timeout_at(start_deadline, connecting)).await
            }
        };
        let conn = match connected {
            Ok(Ok(conn)) => {
                if !conn.reused() {
                    endpoint.connect_succeeded();
                }
                conn
            }
            Ok(Err(e)) => {
                retry_elsewhere(ticket, &mut tried, addr, e, &limits)?;
                continue;
            }
            Err(_) => return Err(timeout_error(ticket, addr, &limits)),
        };
        let reused = conn.reused();
        aim(&mut req, endpoint, protocol, host.as_ref());
        match conn.send(req, start_deadline).await {
            Ok((resp, reusable)) => return Ok((resp, addr, reusable)),
            Err(SendError::Unsent(back, e)) if reused => {
                tracing::debug!(%addr, error = %e, "pooled connection was closed; sending on a new one");
                req = *back;
            }
            Err(SendError::Unsent(_, e) | SendError::Failed(e)) if ClientBodyError::is_in(&*e) => {
                return Err(ActivatorError::ClientBody {
                    revision: ticket.state().key.clone(),
                    source: e,
                });
            }
            Err(SendError::Unsent(_, e) | SendError::Failed(e)) => {
                return Err(ActivatorError::Upstream {
                    revision: ticket.state().key.clone(),
                    endpoint: addr,
                    source: e,
                });
            }
            Err(SendError::TimedOut) => return Err(timeout_error(ticket, addr, &limits)),
        }
    }
}

/// After a failed connect to `addr`: moves the ticket to another endpoint (not tried yet) if
/// the retries allow and one has room, else the request's error.
fn retry_elsewhere(
    ticket: &mut Ticket,
    tried: &mut Vec<SocketAddr>,
    addr: SocketAddr,
    e: ConnectError,
    limits: &AttemptLimits,
) -> Result<(), ActivatorError> {
    tried.push(addr);
    eject(ticket, addr, &e);
    let attempts = tried.len() as u32;
    let next = (attempts <= limits.connect_retries)
        .then(|| ticket.state().throttler.try_acquire_avoiding(tried))
        .flatten();
    let Some(next) = next else {
        return Err(ActivatorError::UpstreamConnect {
            revision: ticket.state().key.clone(),
            endpoint: addr,
            attempts,
            source: e,
        });
    };
    tracing::debug!(%addr, next = %next.addr(), error = %e, "connect failed; retrying");
    ticket.state().metrics.retries.inc();
    ticket.release_slot();
    ticket.set_slot(next);
    Ok(())
}

/// Ejects the endpoint of `ticket`'s slot after a failed connect (see
/// [`Endpoint::connect_failed`]); logs and counts each ejection once.
fn eject(ticket: &Ticket, addr: SocketAddr, e: &ConnectError) {
    let Some(slot) = ticket.slot() else { return };
    if let Some(length) = slot.endpoint().connect_failed() {
        let state = ticket.state();
        state.metrics.ejections.inc();
        // Requests held meanwhile (the live endpoints full) may go to it once the ejection ends.
        state.throttler.dispatch_after(length);
        tracing::warn!(
            revision = %state.key,
            endpoint = %addr,
            error = %e,
            ejected_for = ?length,
            "connect failed: endpoint ejected"
        );
    }
}

fn timeout_error(ticket: &Ticket, addr: SocketAddr, limits: &AttemptLimits) -> ActivatorError {
    let revision = ticket.state().key.clone();
    if Instant::now() >= limits.deadline {
        ActivatorError::TotalTimeout {
            revision,
            waited: limits.started.elapsed(),
        }
    } else {
        ActivatorError::ResponseStartTimeout {
            revision,
            endpoint: addr,
            waited: limits.response_start,
        }
    }
}
