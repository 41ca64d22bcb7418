//! An upstream response body streamed through frame by frame (never buffered whole) under a
//! request's idle and total timeouts, holding the request's accounting until it ends: the
//! activator's and the queue sidecar's proxied bodies are this one type, each with its own
//! [`BodyGuard`].

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Duration, Instant, Sleep};

use super::BoxError;
use super::fields::BoxedFields;
use super::pool::{RespBody, Reusable};

/// What a [`TimedBody`] holds for its request until the body ends (a slot, a concurrency
/// count: released by dropping it), and who hears of a body cut or failed.
pub trait BodyGuard: Send + Unpin + std::fmt::Debug + 'static {
    /// The body failed or was cut by a timeout (called once, just before the guard is dropped).
    fn body_failed(&self);
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
pub struct TimedBody<G: BodyGuard> {
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
    /// The request's accounting, until the body ends; also how a failure is counted (no
    /// counter handle of its own: cloning one would move a shared refcount on every request).
    ticket: Option<G>,
    conn: Option<Reusable>,
    /// A gRPC call's body: a timeout ends it with `grpc-status` 4 in trailers rather than an
    /// error (a reset stream), so the client reads why ([`Self::grpc`]).
    grpc: bool,
    /// Ended by a gRPC status of its own: nothing more is read from the upstream.
    cut: bool,
}

impl<G: BodyGuard> TimedBody<G> {
    /// Wraps `inner`; the idle timer starts now, the stream is cut at `deadline`, and `ticket`
    /// is released when the body ends; a cut or failed body calls its
    /// [`BodyGuard::body_failed`] first. `conn`, the HTTP/1.1 connection the body arrives on,
    /// is given back to its pool when it ends.
    pub fn new(
        inner: RespBody,
        idle: Option<Duration>,
        deadline: Instant,
        ticket: G,
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
            grpc: false,
            cut: false,
        }
    }

    /// The body of a gRPC call: cut by a timeout, it ends with trailers carrying
    /// `grpc-status: 4` (DEADLINE_EXCEEDED) and the reason, and the upstream stream is dropped.
    pub fn grpc(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// The earlier of the total deadline and the idle deadline.
    fn wake_at(&self) -> Instant {
        self.idle
            .map_or(self.deadline, |d| self.deadline.min(self.last_frame + d))
    }

    fn fail(&mut self, err: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.give_up();
        Poll::Ready(Some(Err(err)))
    }

    /// The body failed or was cut: counted, its accounting released, its connection not reused.
    fn give_up(&mut self) {
        // Only a body still in progress fails: the ticket is taken when it ends.
        if let Some(ticket) = self.ticket.take() {
            ticket.body_failed();
        }
        self.conn = None;
    }

    /// A direct upstream response's header fields, while not taken (see
    /// [`RespBody::take_upstream_fields`]).
    pub fn take_upstream_fields(&mut self) -> Option<BoxedFields> {
        self.inner.take_upstream_fields()
    }

    /// The body ended: the slot is free and the connection can serve another request.
    fn ended(&mut self) {
        self.ticket = None;
        if let Some(conn) = self.conn.take() {
            conn.give_back();
        }
    }
}

impl<G: BodyGuard> Drop for TimedBody<G> {
    fn drop(&mut self) {
        // hyper drops a body as soon as `is_end_stream` says it is done, without a last poll.
        if self.conn.is_some() && self.inner.is_end_stream() {
            self.ended();
        }
    }
}

impl<G: BodyGuard> Body for TimedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ticket.is_none() && (this.cut || this.inner.is_end_stream()) {
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
                let err = if Instant::now() >= this.deadline {
                    BodyError::Total
                } else {
                    BodyError::Idle(this.idle.unwrap_or_default())
                };
                if this.grpc {
                    // Counted as cut, the upstream stream dropped; the client is told why.
                    this.give_up();
                    this.cut = true;
                    let status = super::grpc::status_fields(
                        super::grpc::Code::DeadlineExceeded,
                        &err.to_string(),
                    );
                    return Poll::Ready(Some(Ok(Frame::trailers(status))));
                }
                this.fail(Box::new(err))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.cut || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
