//! Early hold: a new HTTP/1 connection's first request, bound for a cold revision, is held
//! before hyper reads it.
//!
//! hyper gives every HTTP/1 connection an 8 KiB read buffer (and an 8 KiB write buffer) once it
//! starts reading, and a held request keeps its connection's hyper state alive for the whole
//! cold start. A cold start is exactly when thousands of new connections arrive at once, so the
//! first request of a connection is looked at without consuming it: its head is peeked from the
//! socket and parsed (`httparse`, hyper's own parser), and if it routes to a revision with no
//! ready endpoints, the request waits in the revision's throttler right here — same queue, same
//! limits, same poke, same metrics as the pipeline's hold (`pipeline::hold`) — while its bytes
//! stay in the kernel's socket buffer. Once the throttler answers, hyper reads the request and
//! the pipeline carries on with the admission (or the rejection) it is handed.
//!
//! Anything unusual goes the ordinary way (hyper reads it, the pipeline holds it): a head that
//! did not arrive whole in the first segment, a probe, an upgrade, a head over the header
//! limits, a request that does not route, a warm or failing revision. A request on a reused
//! keep-alive connection is held by the pipeline too.
//!
//! A client that gives up while held is noticed within a second (its FIN, polled) and its place
//! in the queue is freed.

use std::io;
use std::os::fd::AsFd;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use super::core::{Activator, Placed};
use super::headers::{check_limits, is_upgrade};
use super::pipeline::{self, EarlyHold, HoldTerms};
use super::routing;
use super::ticket::Ticket;
use crate::http1::FirstRequest;

/// The most head bytes looked at; a longer head goes the ordinary way.
const PEEK_BYTES: usize = 8 * 1024;
/// The most headers parsed; more goes the ordinary way.
const MAX_HEADERS: usize = 64;

/// What became of a connection's first request: not held (`Pass`: the engine reads it and the
/// pipeline does the rest), held here with the throttler's answer, or the client gone meanwhile.
pub type Early = FirstRequest<EarlyHold>;

/// Holds the connection's first request if it is bound for a cold revision (see the module doc).
/// The request's bytes are not consumed.
pub async fn first_request(act: &Activator, stream: &TcpStream) -> Early {
    let Some(state) = cold_target(act, stream) else {
        return Early::Pass;
    };
    let span = tracing::debug_span!("early_hold", revision = %state.key);
    // Boxed: only held connections pay for the holding state.
    Box::pin(
        async move {
            let started = Instant::now();
            let ticket = Ticket::arrive(state.clone(), None, started);
            let (max_held, max_held_namespace) = {
                let c = act.deps.config.load();
                (c.max_held_requests, c.namespace_held_cap())
            };
            let terms = HoldTerms::new(&state.spec.load(), max_held, max_held_namespace);
            tokio::select! {
                (cold, outcome) = pipeline::hold(act, &state, terms, started) => {
                    Early::Held(EarlyHold { state: state.clone(), ticket, started, cold, outcome })
                }
                _ = client_gone(stream) => {
                    tracing::debug!("client closed its connection while held");
                    Early::ClientGone
                }
            }
        }
        .instrument(span),
    )
    .await
}

/// The revision of the first request's head if that revision is cold (no ready endpoints, not
/// failing) and the request is an ordinary one; `None` otherwise.
fn cold_target(
    act: &Activator,
    stream: &TcpStream,
) -> Option<crate::percore::LocalArc<super::rev_state::RevisionState>> {
    let mut buf = vec![0u8; PEEK_BYTES];
    let n = stream
        .try_io(Interest::READABLE, || {
            nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(stream),
                &mut buf,
                nix::sys::socket::MsgFlags::MSG_PEEK,
            )
            .map_err(io::Error::from)
        })
        .ok()?;
    let head = Head::parse(&buf[..n])?;
    drop(buf);
    let cfg = act.deps.config.load();
    let seen = routing::Seen::scan(&head.headers);
    if routing::probe(&seen).is_some()
        || is_upgrade(&head.headers)
        || head.method == Method::CONNECT
        || check_limits(&head.headers, cfg.max_header_count, cfg.max_header_bytes).is_err()
    {
        return None;
    }
    let trusted = !seen.asks_for_trust()
        || stream
            .peer_addr()
            .is_ok_and(|p| act.is_gateway(p.ip(), &seen));
    let target = routing::target(&seen, &head.uri, head.version, trusted).ok()?;
    // Only what the route check places now is held early; the rest is left to the pipeline.
    let host = routing::request_host(&seen, &head.uri);
    let Ok(Placed::Ready(state)) = act.place(target, host) else {
        return None;
    };
    let cold = state.throttler.is_cold();
    cold.then_some(state)
}

/// The parts of a request head that routing looks at.
struct Head {
    method: Method,
    uri: Uri,
    version: http::Version,
    headers: HeaderMap,
}

impl Head {
    /// A whole, valid request head at the start of `bytes`, else `None`.
    fn parse(bytes: &[u8]) -> Option<Self> {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut slots);
        if !req.parse(bytes).ok()?.is_complete() {
            return None;
        }
        let method = Method::from_bytes(req.method?.as_bytes()).ok()?;
        let version = match req.version? {
            1 => http::Version::HTTP_11,
            _ => http::Version::HTTP_10,
        };
        let uri = Uri::try_from(req.path?).ok()?;
        let mut headers = HeaderMap::with_capacity(req.headers.len());
        for h in req.headers.iter() {
            headers.append(
                HeaderName::from_bytes(h.name.as_bytes()).ok()?,
                HeaderValue::from_bytes(h.value).ok()?,
            );
        }
        Some(Self {
            method,
            uri,
            version,
            headers,
        })
    }
}

/// How often a held connection is checked for a client that went away.
const CLIENT_CHECK: Duration = Duration::from_secs(1);

/// Resolves when the peer has closed its side or the socket failed, checked every
/// [`CLIENT_CHECK`] with a non-blocking `poll(POLLRDHUP)`. Not through the reactor: the stream's
/// readiness must stay set (its head is waiting) for hyper's first read, and a second
/// registration would need a duplicate descriptor per held connection, doubling the
/// descriptors a cold start uses.
async fn client_gone(stream: &TcpStream) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut tick = tokio::time::interval(CLIENT_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // nix has no name for Linux's POLLRDHUP ("peer closed its writing side").
    let rdhup = PollFlags::from_bits_retain(nix::libc::POLLRDHUP);
    tick.tick().await;
    loop {
        tick.tick().await;
        let mut fds = [PollFd::new(stream.as_fd(), rdhup)];
        let gone = match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .is_none_or(|r| r.intersects(rdhup | PollFlags::POLLHUP | PollFlags::POLLERR)),
            Err(nix::errno::Errno::EINTR) => false,
            Err(_) => true,
        };
        if gone {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_whole_head_only() {
        let whole = b"GET /a?b=1 HTTP/1.1\r\nHost: hello.default.example.com\r\nX-A: 1\r\n\r\nbody";
        let head = Head::parse(whole).expect("whole head");
        assert_eq!(head.method, Method::GET);
        assert_eq!(head.uri.path(), "/a");
        assert_eq!(head.headers["host"], "hello.default.example.com");
        assert_eq!(head.headers.len(), 2);
        assert!(Head::parse(&whole[..30]).is_none(), "partial head");
        assert!(
            Head::parse(b"\x16\x03\x01garbage\r\n\r\n").is_none(),
            "not HTTP"
        );
    }

    #[test]
    fn too_many_headers_are_left_to_hyper() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            head.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        assert!(Head::parse(&head).is_none());
    }
}
