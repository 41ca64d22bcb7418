//! The sidecar's response bodies: its own short answers, and the user container's bodies
//! streamed through the engine's `TimedBody` holding the request's [`Held`] accounting.

use bytes::Bytes;
use http::{Response, StatusCode};
use prometheus_client::metrics::counter::Counter;

use super::podstats::InFlight;
use crate::http1::activity::ConnActive;
use crate::http1::served::ServedBody;
use crate::http1::timed::BodyGuard;
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

/// The body of every data-port response: the sidecar's own answers, or the user container's
/// body in flight holding [`Held`].
pub type QueueBody = ServedBody<Held>;

/// A `text/plain` answer of the sidecar's own.
pub fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<QueueBody> {
    QueueBody::plain(status, body)
}
