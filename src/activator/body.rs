//! Response bodies: the activator's own short answers, and upstream bodies streamed through
//! frame by frame (never buffered whole) under the revision's idle and total timeouts.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Duration, Instant, Sleep};

use super::ticket::Ticket;
use crate::http1::fields::BoxedFields;
use crate::http1::pool::{RespBody, Reusable};

/// The error type of response bodies.
pub use crate::http1::BoxError;

/// The body of every data-port response.
#[derive(Debug)]
pub enum ActivatorBody {
    /// A complete body (the activator's own answers); `None` once sent.
    Full(Option<Bytes>),
    /// An upstream body in flight.
    Proxied(Box<ProxiedBody>),
}

impl ActivatorBody {
    /// A complete body.
    pub fn full(bytes: Bytes) -> Self {
        ActivatorBody::Full(Some(bytes).filter(|b| !b.is_empty()))
    }

    /// An empty body.
    pub fn empty() -> Self {
        ActivatorBody::Full(None)
    }

    /// A direct upstream response's header fields, which its map does not hold (see
    /// `super::fields::UpstreamFields`): whoever writes the response head takes them.
    pub fn take_upstream_fields(&mut self) -> Option<BoxedFields> {
        match self {
            ActivatorBody::Proxied(p) => p.inner.take_upstream_fields(),
            ActivatorBody::Full(_) => None,
        }
    }
}

impl Body for ActivatorBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ActivatorBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ActivatorBody::Proxied(p) => Pin::new(&mut **p).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ActivatorBody::Full(b) => b.is_none(),
            ActivatorBody::Proxied(p) => p.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ActivatorBody::Full(b) => {
                SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
            ActivatorBody::Proxied(p) => p.size_hint(),
        }
    }
}

/// Why a proxied body was cut.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("upstream sent nothing for {0:?} (idle timeout)")]
    /// Nothing arrived for the revision's idle timeout.
    Idle(Duration),
    /// The request's total deadline passed mid-stream.
    #[error("request exceeded its total timeout")]
    Total,
}

/// An upstream response body, forwarded frame by frame.
///
/// Guarantees: each frame is passed on as soon as it arrives (no buffering); the stream is cut
/// with an error when the upstream is silent for the revision's idle timeout or the request's
/// total deadline passes; the request's [`Ticket`] (its endpoint slot and concurrency count) is
/// released the moment the body ends, fails or is dropped — whichever comes first. The upstream
/// HTTP/1.1 connection goes back to its pool only when the body has ended (seen by a poll, or
/// `is_end_stream` at drop); a body cut or dropped early closes it instead.
#[derive(Debug)]
pub struct ProxiedBody {
    inner: RespBody,
    /// Fires at the earlier of the total deadline and the idle deadline. Armed only when the
    /// upstream first makes the body wait: a body that is already complete when forwarded (most
    /// small answers) never registers a timer.
    timer: Option<Pin<Box<Sleep>>>,
    idle: Option<Duration>,
    deadline: Instant,
    /// When the idle clock last started: creation, then each frame. Kept only with an idle
    /// timeout (otherwise it is never read).
    last_frame: Instant,
    /// The request's accounting, until the body ends; also how a failure reaches the
    /// revision's `upstream_errors` (no counter handle of its own: cloning one would move a
    /// shared refcount on every request).
    ticket: Option<Ticket>,
    conn: Option<Reusable>,
}

impl ProxiedBody {
    /// Wraps `inner`; the idle timer starts now, the stream is cut at `deadline`, and `ticket`
    /// is released when the body ends; a cut or failed body counts in the revision's
    /// `upstream_errors`. `conn`,
    /// the HTTP/1.1 connection the body arrives on, is given back to its pool when it ends.
    pub fn new(
        inner: RespBody,
        idle: Option<Duration>,
        deadline: Instant,
        ticket: Ticket,
        conn: Option<Reusable>,
    ) -> Self {
        Self {
            inner,
            timer: None,
            idle,
            deadline,
            // Read only when an idle timeout uses it (one clock read less per warm request).
            last_frame: if idle.is_some() {
                Instant::now()
            } else {
                deadline
            },
            ticket: Some(ticket),
            conn,
        }
    }

    /// The earlier of the total deadline and the idle deadline.
    fn wake_at(&self) -> Instant {
        self.idle
            .map_or(self.deadline, |d| self.deadline.min(self.last_frame + d))
    }

    fn fail(&mut self, err: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Only a body still in progress fails: the ticket is taken when it ends.
        if let Some(ticket) = self.ticket.take() {
            ticket.state().metrics.upstream_errors.inc();
        }
        self.conn = None;
        Poll::Ready(Some(Err(err)))
    }

    /// The body ended: the slot is free and the connection can serve another request.
    fn ended(&mut self) {
        self.ticket = None;
        if let Some(conn) = self.conn.take() {
            conn.give_back();
        }
    }
}

impl Drop for ProxiedBody {
    fn drop(&mut self) {
        // hyper drops a body as soon as `is_end_stream` says it is done, without a last poll.
        if self.conn.is_some() && self.inner.is_end_stream() {
            self.ended();
        }
    }
}

impl Body for ProxiedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ticket.is_none() && this.inner.is_end_stream() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(mut frame))) => {
                // Framing, routing, authentication and Content-* fields never pass as trailers.
                if let Some(trailers) = frame.trailers_mut() {
                    crate::http1::fields::strip_forbidden_trailers(trailers);
                }
                if this.idle.is_some() {
                    this.last_frame = Instant::now();
                    let next = this.wake_at();
                    if let Some(timer) = this.timer.as_mut() {
                        timer.as_mut().reset(next);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.fail(e),
            Poll::Ready(None) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let at = this.wake_at();
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                ready!(timer.as_mut().poll(cx));
                let err: BoxError = if Instant::now() >= this.deadline {
                    Box::new(BodyError::Total)
                } else {
                    Box::new(BodyError::Idle(this.idle.unwrap_or_default()))
                };
                this.fail(err)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
