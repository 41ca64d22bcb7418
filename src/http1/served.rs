//! The body of every response a data port serves, the activator's and the queue sidecar's
//! alike: a short answer of its own, or an upstream body streamed through a [`TimedBody`]
//! holding the request's accounting (`G`: the activator's ticket, the sidecar's permit).
//!
//! Generic rather than boxed: each server gets its own monomorphized enum, as large and as fast
//! as the two hand-written copies it replaces (no allocation or dynamic dispatch per request).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::fields::BoxedFields;
use super::timed::{BodyGuard, TimedBody};
use super::{BoxError, ResponseBody};

/// A served response's body.
#[derive(Debug)]
pub enum ServedBody<G: BodyGuard> {
    /// A complete body (the server's own answers); `None` once sent.
    Full(Option<Bytes>),
    /// An upstream body in flight, holding `G` until it ends.
    Proxied(Box<TimedBody<G>>),
}

impl<G: BodyGuard> ServedBody<G> {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()).filter(|b| !b.is_empty()))
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::Full(None)
    }

    /// A `text/plain` answer of the server's own.
    pub fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Self> {
        let mut resp = Response::new(Self::full(body));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}

impl<G: BodyGuard> ResponseBody for ServedBody<G> {
    fn take_upstream_fields(&mut self) -> Option<BoxedFields> {
        match self {
            Self::Proxied(p) => p.take_upstream_fields(),
            Self::Full(_) => None,
        }
    }
}

impl<G: BodyGuard> Body for ServedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Self::Proxied(p) => Pin::new(&mut **p).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(b) => b.is_none(),
            Self::Proxied(p) => p.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Proxied(p) => p.size_hint(),
        }
    }
}
