//! What can go wrong with a request, as typed errors, and the one function that turns each into
//! the answer a client sees (ARCHITECTURE.md, "What a client sees when things go wrong").

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::body::ActivatorBody;
use super::throttler::Rejection;
use crate::revision::RevisionKey;

/// Why the activator answered a request itself instead of forwarding a response.
#[derive(Debug, thiserror::Error)]
pub enum ActivatorError {
    /// No route: the headers or Host named no revision in the catalog.
    #[error("{0}")]
    NotFound(String),
    /// The request's headers exceed `config-activator` limits.
    #[error("request headers too large: {what} {actual} exceeds the limit of {limit}")]
    HeadersTooLarge {
        what: &'static str,
        actual: usize,
        limit: usize,
    },
    /// A malformed Knative probe.
    #[error("{0}")]
    BadRequest(&'static str),
    /// The throttler did not admit the request.
    #[error("revision {revision}: {rejection}")]
    Rejected {
        revision: RevisionKey,
        rejection: Rejection,
    },
    /// Connecting failed on every endpoint tried; nothing was sent, so this is safe to retry.
    #[error("revision {revision}: could not connect to {endpoint} ({attempts} attempts): {source}")]
    UpstreamConnect {
        revision: RevisionKey,
        endpoint: SocketAddr,
        attempts: u32,
        #[source]
        source: crate::http1::pool::ConnectError,
    },
    /// The upstream failed after the request was (or may have been) sent; never retried.
    #[error("revision {revision}: upstream {endpoint} failed: {source}")]
    Upstream {
        revision: RevisionKey,
        endpoint: SocketAddr,
        #[source]
        source: crate::http1::pool::BoxError,
    },
    /// The upstream sent no response head within the revision's response-start timeout.
    #[error("revision {revision}: upstream {endpoint} sent no response within {waited:?}")]
    ResponseStartTimeout {
        revision: RevisionKey,
        endpoint: SocketAddr,
        waited: Duration,
    },
    /// The revision's total timeout passed before a response head arrived.
    #[error("revision {revision}: request timed out after {waited:?}")]
    TotalTimeout {
        revision: RevisionKey,
        waited: Duration,
    },
}

impl ActivatorError {
    /// The status code this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Rejected { rejection, .. } => match rejection {
                Rejection::HoldTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                Rejection::QueueFull { .. }
                | Rejection::HeldCapReached { .. }
                | Rejection::Failing(_)
                | Rejection::Removed => StatusCode::SERVICE_UNAVAILABLE,
            },
            Self::UpstreamConnect { .. } | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::ResponseStartTimeout { .. } | Self::TotalTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// The answer: the status, a one-line reason as the body, and `Retry-After` on 503s.
    pub fn into_response(self, retry_after: Duration) -> Response<ActivatorBody> {
        let status = self.status();
        let mut resp = plain(status, format!("{self}\n"));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            let secs = retry_after.as_secs().max(1);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A `text/plain` response with `body`.
pub fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<ActivatorBody> {
    let mut resp = Response::new(ActivatorBody::full(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_each_error_to_its_answer() {
        let rev = RevisionKey::new("ns", "r");
        let queue_full = ActivatorError::Rejected {
            revision: rev.clone(),
            rejection: Rejection::QueueFull { depth: 3 },
        }
        .into_response(Duration::from_secs(2));
        assert_eq!(queue_full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(queue_full.headers()[header::RETRY_AFTER], "2");
        let timeout = ActivatorError::Rejected {
            revision: rev,
            rejection: Rejection::HoldTimeout {
                waited: Duration::from_secs(5),
            },
        }
        .into_response(Duration::from_secs(2));
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(timeout.headers().get(header::RETRY_AFTER).is_none());
        let nf = ActivatorError::NotFound("no route".into()).into_response(Duration::ZERO);
        assert_eq!(nf.status(), StatusCode::NOT_FOUND);
    }
}
