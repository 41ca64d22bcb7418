//! Response bodies: the activator's own short answers, and upstream bodies streamed through
//! frame by frame (never buffered whole) under the revision's idle and total timeouts.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::ticket::Ticket;
use crate::http1::fields::BoxedFields;
use crate::http1::timed::{BodyGuard, TimedBody};

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
            ActivatorBody::Proxied(p) => p.take_upstream_fields(),
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

/// An upstream body in flight through the activator: the engine's [`TimedBody`] holding the
/// request's [`Ticket`] (its endpoint slot and concurrency count) until the body ends.
pub type ProxiedBody = TimedBody<Ticket>;

/// Why a proxied body was cut.
pub use crate::http1::timed::BodyError;

impl BodyGuard for Ticket {
    /// A cut or failed body counts in the revision's `upstream_errors`.
    fn body_failed(&self) {
        self.state().metrics.upstream_errors.inc();
    }
}
