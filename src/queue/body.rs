//! The sidecar's response bodies: its own short answers, and the user container's bodies
//! streamed through the engine's [`TimedBody`] holding the request's [`Held`] accounting.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;

use super::podstats::InFlight;
use crate::http1::activity::ConnActive;
use crate::http1::fields::BoxedFields;
use crate::http1::timed::{BodyGuard, TimedBody};
use crate::http1::{BoxError, ResponseBody};
use crate::limiter::Permit;

/// What a proxied request holds until its response body ends: its place under
/// containerConcurrency, its count in the pod's stats and its connection's activity.
#[derive(Debug)]
pub struct Held {
    pub(crate) _permit: Permit,
    pub(crate) _in_flight: InFlight,
    pub(crate) _conn: ConnActive,
    /// `thaw_queue_user_errors_total`, counted when the body is cut.
    pub(crate) user_errors: Counter,
}

impl BodyGuard for Held {
    fn body_failed(&self) {
        self.user_errors.inc();
    }
}

/// The body of every data-port response.
#[derive(Debug)]
pub enum QueueBody {
    /// The sidecar's own answer; `None` once sent.
    Full(Option<Bytes>),
    /// The user container's body in flight.
    Proxied(Box<TimedBody<Held>>),
}

impl QueueBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        QueueBody::Full(Some(bytes.into()).filter(|b| !b.is_empty()))
    }
}

/// A `text/plain` answer of the sidecar's own.
pub fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<QueueBody> {
    let mut resp = Response::new(QueueBody::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

impl ResponseBody for QueueBody {
    fn take_upstream_fields(&mut self) -> Option<BoxedFields> {
        match self {
            QueueBody::Proxied(p) => p.take_upstream_fields(),
            QueueBody::Full(_) => None,
        }
    }
}

impl Body for QueueBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            QueueBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            QueueBody::Proxied(p) => Pin::new(&mut **p).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            QueueBody::Full(b) => b.is_none(),
            QueueBody::Proxied(p) => p.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            QueueBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            QueueBody::Proxied(p) => p.size_hint(),
        }
    }
}
