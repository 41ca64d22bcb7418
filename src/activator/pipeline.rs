//! The request path, composed in one place. Each step is a type or function of its own file;
//! the order is the contract:
//!
//! 1. probes (`routing::probe`): kubelet and Knative probes are answered before anything else,
//!    so health never depends on a revision;
//! 2. header limits (`headers::check_limits`): 431 before any work is spent on the request;
//! 3. routing (`Activator::place`): in `thaw local` the catalog, 404 with a reason; on
//!    Kubernetes the route check (`route_check`): a gateway's choice only through a host whose
//!    Route is of the revision's namespace and routes it, any other request by its host's
//!    Route; what cannot be placed waits up to a second for the Route watch and the catalog
//!    (`catch_up`), then 404 without detail, whatever the reason;
//! 4. accounting (`Ticket`): from here the request counts as concurrency — held time included,
//!    as the autoscaler needs — until its response body ends;
//! 5. cold-start poke (`ColdStart`): a revision without ready endpoints pokes the scaler now;
//! 6. throttler (`Throttler::acquire`): wait for a slot (bounded queue, cold-wait deadline);
//! 7. proxy (`proxy::forward`): forward with connect retries and the response-start timeout;
//! 8. response (`ProxiedBody`): streamed under idle/total timeouts, slot released at its end;
//!    `Server-Timing` tells a held client how long it waited.
//!
//! Every error goes through `ActivatorError::into_response`, the one place that maps errors to
//! status codes (and, for a gRPC call, to a trailers-only gRPC error: `http1::grpc`). A gRPC
//! call is held and forwarded under the shorter of its `grpc-timeout` and the revision's
//! timeout; to a revision that speaks HTTP/1.1 only it is refused before any hold.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use tokio::time::Instant;
use tracing::Instrument;

use super::body::{ActivatorBody, ProxiedBody};
use super::cold_start::PokeAction;
use super::core::{Activator, Placed};
use super::error::{ActivatorError, plain};
use super::headers::{self as hdr, NextHop, SERVER_TIMING, X_REQUEST_ID};
use super::proxy::{self, AttemptLimits, Outbound};
use super::request_fields::{Prepare, Scan};
use super::rev_state::RevisionState;
use super::routing::{self, FieldRef, Probe};
use super::throttler::{Admission, HoldLimits, Rejection};
use super::ticket::Ticket;
use crate::clock;
use crate::config::ActivatorConfig;
use crate::http1::activity::ConnActive;
use crate::http1::fields::{ClientHeaders, Known};
use crate::http1::grpc;
use crate::http1::{ClientRequest, FirstRequest, Handler, ResponseBody};
use crate::percore::LocalArc;
use crate::revision::{Protocol, RevisionSpec};
use crate::stats::Stat;

/// The activator is the HTTP/1 engine's handler: the engine serves connections, the pipeline
/// answers each request (see the module doc for the order of its steps).
impl Handler for Activator {
    type Body = ActivatorBody;
    type Early = EarlyHold;

    fn first_request<'a>(
        &'a self,
        stream: &'a tokio::net::TcpStream,
    ) -> impl Future<Output = FirstRequest<EarlyHold>> + Send + 'a {
        super::early::first_request(self, stream)
    }

    /// `handle` for any [`ClientRequest`], borrowing the activator (the fast lane calls this once per
    /// request without touching the shared `Arc`'s count).
    ///
    /// A plain function returning the future (here and in `proxy_request`): an `async fn` keeps a
    /// second copy of each argument in its state, and this state is moved for every request.
    #[allow(clippy::manual_async_fn)] // see the doc: no second copy of the arguments
    fn respond<'a, B: ClientRequest + Send + 'static>(
        act: &'a Arc<Self>,
        peer: SocketAddr,
        conn: ConnActive,
        req: Request<B>,
        early: Option<EarlyHold>,
    ) -> impl Future<Output = Response<ActivatorBody>> + Send + 'a {
        async move {
            let started = early.as_ref().map_or_else(Instant::now, |e| e.started);
            // The few live-config values a request needs, copied out: no `Arc` clone of the config
            // (its refcount would bounce between the workers' cores on every request).
            let cfg = RequestConfig::from(&**act.deps.config.load());
            // For logs: the method and the URI (a refcount on the request's own buffer, no copy).
            let (method, uri) = (req.method().clone(), req.uri().clone());
            let path = uri.path();
            // Probes, limits and routing read the headers found in one pass (in a block: a held
            // request's future does not keep that pass's findings).
            let routed = {
                let fields = B::fields(&req);
                let seen = fields.scan();
                if let Some(p) = routing::probe(&seen) {
                    return answer_probe(p, act.is_draining());
                }
                if let Err((what, actual, limit)) =
                    fields.check_limits(cfg.max_header_count, cfg.max_header_bytes)
                {
                    act.deps.telemetry.activator.unmatched(431);
                    let err = ActivatorError::HeadersTooLarge {
                        what,
                        actual,
                        limit,
                    };
                    let grpc = grpc::is_call(req.version(), fields);
                    return err.into_response(cfg.retry_after, grpc);
                }
                if let Err(e) = supported(act, req.method(), fields) {
                    act.deps.telemetry.activator.unmatched(e.status().as_u16());
                    let grpc = grpc::is_call(req.version(), fields);
                    return e.into_response(cfg.retry_after, grpc);
                }
                // An early hold routed this request already: it stays with the revision it was held
                // for, as a request held here would, even if the catalog changed meanwhile.
                match &early {
                    Some(e) => Ok(Placed::Ready(e.state.clone())),
                    None => {
                        // The peer is looked up only for a request that carries something
                        // believed from gateways alone.
                        let trusted = !seen.asks_for_trust() || act.is_gateway(peer.ip(), &seen);
                        routing::target(&seen, req.uri(), req.version(), trusted)
                            .and_then(|t| act.place(t, routing::request_host(&seen, req.uri())))
                    }
                }
            };
            let routed = match routed {
                Ok(Placed::Ready(state)) => Ok(state),
                // Boxed: a rare wait, kept out of every request future's size.
                Ok(Placed::Wait(pending)) => {
                    let wait = async move { act.place_after_catch_up(&pending).await };
                    match Box::pin(wait).await {
                        Some(state) => Ok(state),
                        None => Err(not_routed(act)),
                    }
                }
                Err(e) => Err(e),
            };
            let state = match routed {
                Ok(state) => state,
                Err(e) => {
                    act.deps.telemetry.activator.unmatched(e.status().as_u16());
                    tracing::debug!(%method, %path, error = %e, "not routed");
                    let grpc = grpc::is_call(req.version(), B::fields(&req));
                    return e.into_response(cfg.retry_after, grpc);
                }
            };
            let span = tracing::debug_span!("request", revision = %state.key, %method, %path);
            // A gRPC call's deadline and error form (an HTTP/1.x request: a version compare).
            let call = grpc::call(req.version(), B::fields(&req));
            let result = proxy_request(act, &state, peer, conn, req, started, &cfg, early, call)
                .instrument(span)
                .await;
            let resp = result.unwrap_or_else(|e| {
                if matches!(
                    e,
                    ActivatorError::UpstreamConnect { .. }
                        | ActivatorError::Upstream { .. }
                        | ActivatorError::ResponseStartTimeout { .. }
                ) {
                    state.metrics.upstream_errors.inc();
                } else if matches!(e, ActivatorError::ClientBody { .. }) {
                    state.metrics.client_errors.inc();
                }
                e.into_response(cfg.retry_after, call.is_some())
            });
            let code = resp.status().as_u16();
            let elapsed = started.elapsed();
            state.metrics.answered(code, elapsed.as_secs_f64());
            tracing::debug!(
                revision = %state.key,
                %method,
                %path,
                status = resp.status().as_u16(),
                ms = elapsed.as_millis() as u64,
                "access"
            );
            resp
        }
    }

    /// Handles one data-port request end to end. Never fails: every error becomes a response (the
    /// `Result` is the shape hyper's service wants; returning it from here, rather than wrapping
    /// this future in another, keeps one copy of the request's state per held request).
    ///
    /// `early` is the outcome of holding this request before hyper read it (`super::early`): the
    /// hold is then not repeated, and the request's clock starts when the hold did.
    async fn handle(
        act: Arc<Self>,
        peer: SocketAddr,
        conn: ConnActive,
        req: Request<Incoming>,
        early: Option<EarlyHold>,
    ) -> Result<Response<ActivatorBody>, std::convert::Infallible> {
        let mut resp = Self::respond(&act, peer, conn, req, early).await;
        // hyper's server writes the head from the map alone.
        if let Some(fields) = resp.body_mut().take_upstream_fields() {
            fields.merge_into(resp.headers_mut());
        }
        Ok(resp)
    }
}

/// A request the route check could not place within the catch-up: counted, and answered 404
/// without saying why (no Route has its host, the host's Route is another namespace's or does
/// not route the revision, or the revision does not exist all read alike: nothing is echoed).
fn not_routed(act: &Activator) -> ActivatorError {
    act.deps.telemetry.activator.route_refused.inc();
    ActivatorError::NotFound("not found".into())
}

/// `HTTP2-Settings`, sent with `Upgrade: h2c`.
const HTTP2_SETTINGS: http::HeaderName = http::HeaderName::from_static("http2-settings");

/// Whether an `Upgrade` value asks for h2c alone (served over HTTP/1.1 instead).
fn only_h2c(protocols: &[u8]) -> bool {
    crate::http1::fields::tokens(protocols).all(|t| t.eq_ignore_ascii_case(b"h2c"))
}

/// Refuses what the activator does not do (501): `CONNECT` (it is not a forward proxy), and an
/// upgrade to a protocol outside `allowed-upgrades` (h2c aside: served over HTTP/1.1).
fn supported(
    act: &Activator,
    method: &http::Method,
    fields: crate::http1::fields::HeadersRef<'_>,
) -> Result<(), ActivatorError> {
    if method == http::Method::CONNECT {
        return Err(ActivatorError::NotImplemented(
            "CONNECT is not supported".to_string(),
        ));
    }
    let Some(protocols) = fields.upgrade_protocols() else {
        return Ok(());
    };
    let cfg = act.deps.config.load();
    let refused = crate::http1::fields::tokens(protocols).find(|t| {
        !t.eq_ignore_ascii_case(b"h2c")
            && !cfg
                .allowed_upgrades
                .iter()
                .any(|a| t.eq_ignore_ascii_case(a.as_bytes()))
    });
    match refused {
        Some(p) => Err(ActivatorError::NotImplemented(format!(
            "upgrade to {:?} is not supported",
            String::from_utf8_lossy(p)
        ))),
        None => Ok(()),
    }
}

fn answer_probe(probe: Probe, draining: bool) -> Response<ActivatorBody> {
    match probe {
        Probe::Health if draining => plain(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        Probe::Health => plain(StatusCode::OK, "ok\n"),
        Probe::Activator => plain(StatusCode::OK, "activator"),
        Probe::Network(Some(hash)) => {
            let mut r = plain(StatusCode::OK, hash.as_bytes().to_vec());
            r.headers_mut().insert(hdr::K_NETWORK_HASH, hash);
            r
        }
        Probe::Network(None) => ActivatorError::BadRequest("K-Network-Hash header is missing")
            .into_response(Default::default(), false),
        Probe::Unknown => ActivatorError::BadRequest("unexpected K-Network-Probe value")
            .into_response(Default::default(), false),
    }
}

/// A request held before hyper read it (`super::early`): its revision, its accounting since it
/// arrived, and what the throttler answered.
#[derive(Debug)]
pub struct EarlyHold {
    /// The revision it was held for.
    pub state: LocalArc<RevisionState>,
    /// Counted as present since `started` (no connection guard yet: [`Ticket::attach_conn`]).
    pub ticket: Ticket,
    /// When the hold began.
    pub started: Instant,
    /// Whether the revision was cold when it arrived (`Server-Timing: cold-start`).
    pub cold: bool,
    /// The throttler's answer.
    pub outcome: Result<Admission, Rejection>,
}

/// Steps 5 and 6: poke the scaler if the revision is cold, then wait for a slot. Returns whether
/// it was cold, and the throttler's answer.
pub(crate) async fn hold(
    act: &Activator,
    state: &RevisionState,
    terms: HoldTerms,
    started: Instant,
) -> (bool, Result<Admission, Rejection>) {
    let cold = state.throttler.is_cold();
    if cold {
        poke_if_needed(act, state, started);
    }
    let limits = HoldLimits {
        queue_depth: terms.queue_depth,
        max_held: terms.max_held,
        max_held_namespace: terms.max_held_namespace,
    };
    let hold_deadline = started + terms.timeouts.cold_wait.min(terms.timeouts.total);
    (cold, state.throttler.acquire(limits, hold_deadline).await)
}

/// What bounds one request's hold: the revision's queue depth and timeouts, and the
/// activator's cap on held requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldTerms {
    /// The revision's queue depth.
    pub queue_depth: u32,
    /// The revision's timeouts (`cold_wait`, `total`).
    pub timeouts: crate::revision::Timeouts,
    /// `max-held-requests`.
    pub max_held: u32,
    /// One namespace's share of it.
    pub max_held_namespace: u32,
}

impl HoldTerms {
    /// The terms from the revision's spec and the live config.
    pub(crate) fn new(spec: &RevisionSpec, max_held: u32, max_held_namespace: u32) -> Self {
        Self {
            queue_depth: spec.queue_depth,
            timeouts: spec.timeouts,
            max_held,
            max_held_namespace,
        }
    }
}

/// The live-config values one request reads, copied once at its start.
#[derive(Debug, Clone, Copy)]
struct RequestConfig {
    retry_after: std::time::Duration,
    max_header_count: u32,
    max_header_bytes: u32,
    max_held_requests: u32,
    max_held_namespace: u32,
    connect_retries: u32,
    request_body_idle: std::time::Duration,
}

impl From<&ActivatorConfig> for RequestConfig {
    fn from(c: &ActivatorConfig) -> Self {
        Self {
            retry_after: c.retry_after,
            max_header_count: c.max_header_count,
            max_header_bytes: c.max_header_bytes,
            max_held_requests: c.max_held_requests,
            max_held_namespace: c.namespace_held_cap(),
            connect_retries: c.connect_retries,
            request_body_idle: c.request_body_idle_timeout,
        }
    }
}

/// Counts a rejection and turns it into the request's error.
fn rejected(state: &RevisionState, rejection: Rejection) -> ActivatorError {
    match &rejection {
        Rejection::QueueFull { .. }
        | Rejection::HeldCapReached { .. }
        | Rejection::NamespaceShareReached { .. } => {
            state.metrics.overflow.inc();
        }
        Rejection::HoldTimeout { waited } => {
            state.metrics.hold_timeouts.inc();
            state.metrics.hold_seconds.observe(waited.as_secs_f64());
        }
        Rejection::Failing(_) | Rejection::Removed => {}
    };
    ActivatorError::Rejected {
        revision: state.key.clone(),
        rejection,
    }
}

#[allow(clippy::too_many_arguments)]
#[allow(clippy::manual_async_fn)] // see the doc: no second copy of the arguments
fn proxy_request<'a, B: ClientRequest + Send + 'a>(
    act: &'a Arc<Activator>,
    state: &'a LocalArc<RevisionState>,
    peer: SocketAddr,
    conn: ConnActive,
    mut req: Request<B>,
    started: Instant,
    cfg: &'a RequestConfig,
    early: Option<EarlyHold>,
    call: Option<grpc::Call>,
) -> impl Future<Output = Result<Response<ActivatorBody>, ActivatorError>> + Send + 'a {
    async move {
        // The spec's values this request needs, read through a short-lived guard (no `Arc` clone).
        let (mut terms, protocol) = {
            let spec = state.spec.load();
            (
                HoldTerms::new(&spec, cfg.max_held_requests, cfg.max_held_namespace),
                spec.protocol,
            )
        };
        // Whether the call's own deadline, not the revision's cold wait, ends its hold.
        let mut call_ends_hold = false;
        if call.is_some() {
            if protocol == Protocol::Http1 {
                return Err(ActivatorError::GrpcToHttp1 {
                    revision: state.key.clone(),
                });
            }
            // The call's deadline bounds its hold and its whole exchange.
            let t = &mut terms.timeouts;
            let bound = grpc::Call::bound(call, t.total);
            call_ends_hold = bound < t.cold_wait.min(t.total);
            t.total = bound;
        }
        let timeouts = terms.timeouts;
        let deadline = started + timeouts.total;
        // Arrived on this request's head (no early hold): `started` is a fresh reading.
        let arrived_now = early.is_none();
        let (mut ticket, cold, outcome) = match early {
            Some(e) => {
                let mut ticket = e.ticket;
                ticket.attach_conn(conn);
                (ticket, e.cold, e.outcome)
            }
            None => {
                let ticket = Ticket::arrive(state.clone(), Some(conn), started);
                let (cold, outcome) = hold(act, state, terms, started).await;
                (ticket, cold, outcome)
            }
        };
        let admission = outcome.map_err(|r| match rejected(state, r) {
            ActivatorError::Rejected {
                revision,
                rejection: Rejection::HoldTimeout { waited },
            } if call_ends_hold => ActivatorError::CallDeadline { revision, waited },
            e => e,
        })?;
        if let Some(held) = admission.held_for {
            state.metrics.hold_seconds.observe(held.as_secs_f64());
        }
        let held_for = admission.held_for;
        ticket.set_slot(admission.in_flight);

        let (asks_upgrade, h2c_upgrade) = match B::fields(&req).upgrade_protocols() {
            Some(p) => (true, only_h2c(p)),
            None => (false, false),
        };
        let upgrade = req.version() == Version::HTTP_11 && asks_upgrade && !h2c_upgrade;
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let (mut headers, body) = B::split(parts.headers, body);
        let body = body.stall_after(
            cfg.request_body_idle,
            &act.deps.telemetry.activator.request_body_timeouts,
        );
        if h2c_upgrade && let ClientHeaders::Map(map) = &mut headers {
            // `Upgrade: h2c` is not followed (RFC 9113 deprecates it): the request is served
            // over HTTP/1.1, without the upgrade's fields (hop-by-hop by RFC 9113 §3.2.1 too).
            map.remove(HTTP2_SETTINGS);
        }
        // One pass over the (few) headers again rather than keeping what the first pass found in
        // the state of every held request; scoped, so only its results outlive it.
        let (original_host, request_id, generated, trusted) = {
            let seen = headers.view().scan();
            // An absolute-form target's authority (h2's `:authority`) replaces `Host` (RFC 9112
            // §3.2.2); routing used the same one.
            let original_host = match parts.uri.authority() {
                Some(a) => HeaderValue::from_str(a.as_str()).ok(),
                None => seen.host.and_then(FieldRef::to_value),
            };
            let trusted = !seen.forwarding || act.is_gateway(peer.ip(), &seen);
            // The sidecar's mesh identity goes on to the revision; anyone else's is removed.
            let keep_cert = seen.client_cert.is_some() && act.keeps_client_cert(peer.ip());
            let trust = (trusted, keep_cert);
            match seen.request_id.and_then(FieldRef::to_value) {
                Some(id) => (original_host, id, false, trust),
                None => (original_host, hdr::new_request_id(), true, trust),
            }
        };
        let (trusted, keep_cert) = trusted;
        // A sidecar gets the host in `K-Original-Host`, the container as its `Host`.
        let next_hop = act.deps.next_hop;
        let (original_host, host) = match next_hop {
            NextHop::Sidecar => (original_host, None),
            NextHop::Container => (None, original_host),
        };
        if held_for.is_some()
            && call.is_some_and(|c| c.timeout.is_some())
            && let ClientHeaders::Map(map) = &mut headers
        {
            // A held call's deadline moved closer: the replica is told what is left of it.
            let left = deadline.saturating_duration_since(Instant::now());
            map.insert(grpc::GRPC_TIMEOUT, grpc::timeout_value(left));
        }
        let mut additions = headers.prepare(
            next_hop,
            original_host,
            Some(peer.ip()),
            upgrade,
            trusted,
            keep_cert,
        );
        // Knative's queue-proxy counts a request as proxied only for `activator` (the value
        // `prepare` wrote): pods that still run it get that, not the tag.
        if next_hop == NextHop::Sidecar
            && !state.queue_proxy()
            && let Some(tag) = act.proxy_tag(state)
        {
            hdr::set_proxy_tag(&mut additions, tag);
        }
        if generated {
            additions.push((X_REQUEST_ID, request_id.clone()));
        }
        let out = Outbound {
            method: parts.method,
            path_and_query: parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
            host,
            headers,
            additions,
            body,
            protocol: if upgrade { Protocol::Http1 } else { protocol },
            upgrade,
        };
        let attempt_limits = AttemptLimits {
            connect_retries: cfg.connect_retries,
            response_start: timeouts.response_start,
            deadline,
            started,
            // Admitted at once: the first attempt starts microseconds after `started`.
            first_attempt_at: (arrived_now && held_for.is_none()).then_some(started),
        };
        // Boxed: the upstream call's state is the largest part of this future, and a held request
        // (thousands at a cold start) should carry only the small holding state.
        let upstream = act.upstream();
        let (mut resp, addr, conn) =
            proxy::forward(&upstream, &mut ticket, out, attempt_limits).await?;
        if state.cold.awaiting_first_byte() {
            let m = &act.deps.telemetry.activator;
            state.cold.on_first_byte(Instant::now(), m, &state.key);
        }
        tracing::debug!(%addr, status = resp.status().as_u16(), "upstream answered");

        // A length next to Transfer-Encoding is stale (RFC 9112 §6.3): hyper's client read the
        // body by its chunks, and the client must not be told the old length.
        if resp.headers().contains_key(http::header::TRANSFER_ENCODING) {
            resp.headers_mut().remove(http::header::CONTENT_LENGTH);
        }
        // A 304 goes out without the length of the body it stands for, whichever path wrote it
        // (hyper's server drops it; the lane writes what is left), as the differential tests
        // require.
        if resp.status() == StatusCode::NOT_MODIFIED {
            resp.headers_mut().remove(http::header::CONTENT_LENGTH);
            if let Some(f) = resp.body_mut().upstream_fields_mut() {
                f.drop_all(Known::ContentLength);
            }
        }
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching && !upgrade {
            // A 101 nobody asked for (the direct client refuses one as well): the upstream broke
            // the exchange; its connection is not reused.
            return Err(ActivatorError::Upstream {
                revision: state.key.clone(),
                endpoint: addr,
                source: "101 Switching Protocols without an upgrade".into(),
            });
        }
        hdr::strip_hop_by_hop(resp.headers_mut(), switching);
        // The upstream's own id stands; else the request's (one hashed lookup, not two).
        match resp.body_mut().upstream_fields_mut() {
            Some(f) if f.has(Known::RequestId) => {}
            Some(f) => f.echo_request_id(request_id),
            None => {
                resp.headers_mut().entry(X_REQUEST_ID).or_insert(request_id);
            }
        }
        let h = resp.headers_mut();
        if let Some(held) = held_for {
            let name = if cold { "cold-start" } else { "queue" };
            let timing = format!("{name};dur={:.1}", held.as_secs_f64() * 1000.0);
            h.append(
                SERVER_TIMING,
                HeaderValue::from_str(&timing).expect("ascii"),
            );
        }
        if switching {
            let upstream_upgrade = hyper::upgrade::on(&mut resp);
            if let Some(client_upgrade) = client_upgrade {
                spawn_tunnel(act, client_upgrade, upstream_upgrade, ticket, timeouts.idle);
            }
            return Ok(resp.map(|_| ActivatorBody::empty()));
        }
        let (head, incoming) = resp.into_parts();
        let body =
            ProxiedBody::new(incoming, timeouts.idle, deadline, ticket, conn).grpc(call.is_some());
        Ok(Response::from_parts(
            head,
            ActivatorBody::Proxied(Box::new(body)),
        ))
    }
}

/// Pokes the scaler for a cold revision: at once on the first request of a cold start, again
/// each second while it stays cold.
fn poke_if_needed(act: &Activator, state: &RevisionState, now: Instant) {
    let action = state.cold.on_cold_request(now);
    if action == PokeAction::None {
        return;
    }
    if action == PokeAction::Begin {
        state.metrics.cold_starts.inc();
        tracing::info!(revision = %state.key, "cold request: poking the autoscaler");
    }
    let current = state.window().current();
    act.deps.stats.poke(Stat {
        revision: state.key.clone(),
        source: act.deps.source_name.clone(),
        at: clock::second_of(now),
        average_concurrency: f64::from(current.max(1)),
        requests: 1,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    });
}

/// Runs the upgraded connection as a tunnel (`http1::tunnel::run`: until either side closes,
/// drain cancels it, or — when the revision has an idle timeout (`idleTimeoutSeconds`) — no
/// byte has moved either way for that long). The total timeout does not apply. The ticket
/// (slot and concurrency) lives as long as the tunnel, so the idle timeout is also what frees
/// the slot of a tunnel whose peer vanished.
fn spawn_tunnel(
    act: &Activator,
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    ticket: Ticket,
    idle: Option<std::time::Duration>,
) {
    let cancel = act.tunnel_cancel.clone();
    let span = tracing::debug_span!("tunnel", revision = %ticket.state().key);
    act.tunnels.spawn(
        async move {
            let _ticket = ticket;
            crate::http1::tunnel::run(client, upstream, idle, cancel).await;
        }
        .instrument(span),
    );
}

#[cfg(test)]
mod size_tests {
    /// Every held request keeps its future alive, so its size is memory per held request. The
    /// upstream call is boxed to keep the holding state small; this guards that (debug build
    /// sizes; 2,728 bytes when written, 3,808 before the box).
    #[test]
    fn a_held_request_future_stays_small() {
        fn size<F: std::future::Future>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let f = async {
            let act: Option<std::sync::Arc<super::Activator>> = None;
            let (Some(act), Some(req)) = (act, None::<http::Request<hyper::body::Incoming>>) else {
                return;
            };
            let conn = std::sync::Arc::new(crate::http1::activity::ConnActivity::default()).begin();
            let _ = <crate::activator::Activator as crate::http1::Handler>::handle(
                act,
                "127.0.0.1:1".parse().unwrap(),
                conn,
                req,
                None,
            )
            .await;
        };
        assert!(
            size(&f) <= 3 * 1024,
            "request future grew to {} bytes",
            size(&f)
        );
    }
}
