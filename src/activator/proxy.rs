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

use std::net::SocketAddr;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use tokio::time::{Duration, Instant};

use super::endpoint::Endpoint;
use super::error::ActivatorError;
use super::headers::{Additions, set_target_host};
use super::ticket::Ticket;
use crate::revision::Protocol;

use super::pool::SendError;
pub use super::pool::{ReqBody, RespBody, Reusable, Upstream};

/// A request prepared for forwarding.
#[derive(Debug)]
pub struct Outbound {
    /// The client's method.
    pub method: Method,
    /// The client's path and query (the authority becomes the endpoint's).
    pub path_and_query: PathAndQuery,
    /// The client's headers, already rewritten by [`super::headers::upstream_additions`] (no
    /// `Host`).
    pub headers: HeaderMap,
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
    /// The upstream request. Its target is set per attempt by [`aim`].
    fn into_request(self) -> Request<ReqBody> {
        let mut req = Request::new(self.body);
        *req.method_mut() = self.method;
        *req.uri_mut() = Uri::from(self.path_and_query);
        *req.version_mut() = match self.protocol {
            Protocol::Http1 => Version::HTTP_11,
            Protocol::H2c => Version::HTTP_2,
        };
        *req.headers_mut() = self.headers;
        req
    }
}

/// Points `req` at `endpoint`. HTTP/1.1: origin-form target (path and query) and `Host` set to
/// the endpoint. h2c: absolute URI (`:scheme`, `:authority` = the endpoint).
fn aim(req: &mut Request<ReqBody>, endpoint: &Endpoint, protocol: Protocol) {
    set_target_host(req.headers_mut(), endpoint.host_value(), protocol);
    if protocol == Protocol::H2c {
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(endpoint.authority().clone())
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
}

/// What [`forward`] returns: the response head, the endpoint that answered, and the HTTP/1.1
/// connection to give back to the pool once the response body has ended.
pub type Forwarded = (Response<RespBody>, SocketAddr, Option<Reusable>);

/// Sends `out` to the endpoint of `ticket`'s slot; on a connect failure moves the ticket to
/// another endpoint and tries again (see the module doc). The request's headers are moved into
/// the request once, never copied per attempt.
pub async fn forward(
    upstream: &Upstream,
    ticket: &mut Ticket,
    mut out: Outbound,
    limits: AttemptLimits,
) -> Result<Forwarded, ActivatorError> {
    let protocol = out.protocol;
    // Bodiless HTTP/1.1 requests go over a direct connection (see `super::direct`).
    let direct = protocol == Protocol::Http1 && !out.upgrade && matches!(out.body, ReqBody::Empty);
    // Hyper's client takes the additions in the request's map; a direct connection writes
    // them after the map's headers, so the map never grows for them.
    let mut additions = std::mem::take(&mut out.additions);
    if !direct {
        out.headers.extend(additions.drain(..));
    }
    let mut req = out.into_request();
    let mut tried: Vec<SocketAddr> = Vec::new();
    loop {
        let slot = ticket.slot().expect("forward needs an admitted ticket");
        let endpoint = slot.endpoint();
        let addr = endpoint.addr();
        let start_deadline = limits.deadline.min(Instant::now() + limits.response_start);
        // A pooled connection is had at once; only opening one waits (under the deadline).
        let pooled = upstream.pooled_now(addr, direct, protocol);
        let connected = match pooled {
            Some(conn) => Ok(Ok(conn)),
            None => {
                let connecting = async {
                    if direct {
                        upstream.connect_direct(addr).await
                    } else {
                        upstream.connect(addr, protocol).await
                    }
                };
                Box::pin(tokio::time::timeout_at(start_deadline, connecting)).await
            }
        };
        let conn = match connected {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tried.push(addr);
                let attempts = tried.len() as u32;
                let next = (attempts <= limits.connect_retries)
                    .then(|| ticket.state().throttler.try_acquire_avoiding(&tried))
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
                continue;
            }
            Err(_) => return Err(timeout_error(ticket, addr, &limits)),
        };
        let reused = conn.reused();
        aim(&mut req, endpoint, protocol);
        // The response-start deadline is the connection's to keep (a direct connection
        // reuses its timer across requests).
        match conn.send(req, &additions, start_deadline).await {
            Ok((resp, reusable)) => return Ok((resp, addr, reusable)),
            Err(SendError::Unsent(back, e)) if reused => {
                tracing::debug!(%addr, error = %e, "pooled connection was closed; sending on a new one");
                req = *back;
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
