//! Response bodies of the data port: the engine's [`ServedBody`] (the activator's own short
//! answers, and upstream bodies streamed through frame by frame under the revision's idle and
//! total timeouts) holding the request's [`Ticket`].

use super::ticket::Ticket;
use crate::http1::served::ServedBody;
use crate::http1::timed::{BodyGuard, TimedBody};

/// The error type of response bodies.
pub use crate::http1::BoxError;

/// The body of every data-port response.
pub type ActivatorBody = ServedBody<Ticket>;

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
