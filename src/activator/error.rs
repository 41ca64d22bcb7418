//! What can go wrong with a request, as typed errors, and the one function that turns each into
//! the answer a client sees (docs/architecture.md, "What a client sees when things go wrong").
//!
//! The client is told what happened in general terms (not found, overloaded, unavailable,
//! upstream failed, timed out) and a request id; the detail — a replica's output, an upstream's
//! address and port, a parser's or connector's error text — goes to the log under that id, and
//! to the admin port's `/revisions` where it is state, never into a client's body.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::body::ActivatorBody;
use super::headers::{X_REQUEST_ID, new_request_id};
use super::throttler::Rejection;
use crate::http1::grpc;
use crate::http1::pool::ClientBodyError;
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
    /// A malformed Knative probe, or an ambiguous or missing host.
    #[error("{0}")]
    BadRequest(&'static str),
    /// Something the activator does not do: `CONNECT`, an upgrade to a protocol not in
    /// `allowed-upgrades`.
    #[error("{0}")]
    NotImplemented(String),
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
    /// The client's own request body failed while it was forwarded (malformed framing, cut
    /// short): the client's fault, answered 400 and counted apart from upstream failures; a
    /// body that sent nothing for the request-body idle timeout is 408.
    #[error("revision {revision}: the request body failed: {source}")]
    ClientBody {
        revision: RevisionKey,
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
    /// The revision's total timeout (or a gRPC call's shorter `grpc-timeout`) passed before a
    /// response head arrived.
    #[error("revision {revision}: request timed out after {waited:?}")]
    TotalTimeout {
        revision: RevisionKey,
        waited: Duration,
    },
    /// A gRPC call to a revision whose container speaks HTTP/1.1 only: it cannot carry the
    /// call (no trailers, no streams), so it is refused rather than broken.
    #[error(
        "revision {revision} serves HTTP/1.1 only: a gRPC call needs an h2c port (ports[].name: h2c)"
    )]
    GrpcToHttp1 { revision: RevisionKey },
    /// A gRPC call's own deadline (`grpc-timeout`, shorter than the revision's cold wait)
    /// passed while it was held for a replica.
    #[error(
        "revision {revision}: the call's deadline passed after {waited:?} waiting for a replica"
    )]
    CallDeadline {
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
            Self::ClientBody { source, .. } if ClientBodyError::is_stall_in(&**source) => {
                StatusCode::REQUEST_TIMEOUT
            }
            Self::BadRequest(_) | Self::ClientBody { .. } => StatusCode::BAD_REQUEST,
            Self::NotImplemented(_) | Self::GrpcToHttp1 { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::Rejected { rejection, .. } => match rejection {
                Rejection::HoldTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                Rejection::QueueFull { .. }
                | Rejection::HeldCapReached { .. }
                | Rejection::NamespaceShareReached { .. }
                | Rejection::Failing(_)
                | Rejection::Removed => StatusCode::SERVICE_UNAVAILABLE,
            },
            Self::UpstreamConnect { .. } | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::ResponseStartTimeout { .. }
            | Self::TotalTimeout { .. }
            | Self::CallDeadline { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The gRPC status a gRPC call is answered with: the one mapped from [`Self::status`],
    /// except that a revision that did not become ready within its cold wait is UNAVAILABLE
    /// (no replica; worth retrying), not the client's deadline.
    pub fn grpc_code(&self) -> grpc::Code {
        match self {
            Self::Rejected {
                rejection: Rejection::HoldTimeout { .. },
                ..
            } => grpc::Code::Unavailable,
            _ => grpc::code_for(self.status()),
        }
    }

    /// What the client is told: what happened, in general terms, with nothing internal.
    pub fn public_reason(&self) -> String {
        match self {
            // What the client sent (its host, its headers) and the configured limits.
            Self::NotFound(_)
            | Self::HeadersTooLarge { .. }
            | Self::BadRequest(_)
            | Self::NotImplemented(_)
            | Self::GrpcToHttp1 { .. } => self.to_string(),
            Self::Rejected {
                revision,
                rejection,
            } => match rejection {
                Rejection::QueueFull { .. } => {
                    format!("revision {revision} is overloaded: its queue is full")
                }
                Rejection::HeldCapReached { .. } => "the activator is overloaded".to_string(),
                Rejection::NamespaceShareReached { .. } => {
                    "the namespace's cold requests fill its share of the activator".to_string()
                }
                Rejection::Failing(_) | Rejection::Removed => {
                    format!("revision {revision} is unavailable")
                }
                Rejection::HoldTimeout { waited } => {
                    format!("revision {revision} did not become ready within {waited:?}")
                }
            },
            Self::UpstreamConnect { revision, .. } | Self::Upstream { revision, .. } => {
                format!("revision {revision}: upstream failed")
            }
            Self::ResponseStartTimeout {
                revision, waited, ..
            } => format!("revision {revision}: upstream sent no response within {waited:?}"),
            Self::TotalTimeout { .. } | Self::CallDeadline { .. } => self.to_string(),
            Self::ClientBody { source, .. } if ClientBodyError::is_stall_in(&**source) => {
                "the request body stalled".to_string()
            }
            Self::ClientBody { .. } => "the request body is malformed or incomplete".to_string(),
        }
    }

    /// The answer: the status, [`Self::public_reason`] and a fresh request id as the body (the
    /// id also in `X-Request-Id`), and `Retry-After` on 503s. The full error is logged under
    /// that id. To a gRPC call (`grpc`, [`crate::http1::grpc`]) the same reason and id go as
    /// a trailers-only gRPC error, its status mapped from the HTTP status.
    pub fn into_response(self, retry_after: Duration, grpc: bool) -> Response<ActivatorBody> {
        let status = self.status();
        let id = new_request_id();
        let id_text = id.to_str().unwrap_or_default();
        tracing::debug!(request_id = id_text, status = status.as_u16(), grpc, error = %self, "answered by the activator");
        let text = format!("{} (request id {id_text})\n", self.public_reason());
        let mut resp = if grpc {
            grpc::trailers_only(self.grpc_code(), &text, ActivatorBody::empty())
        } else {
            plain(status, text)
        };
        resp.headers_mut().insert(X_REQUEST_ID, id);
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
    ActivatorBody::plain(status, body)
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
        .into_response(Duration::from_secs(2), false);
        assert_eq!(queue_full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(queue_full.headers()[header::RETRY_AFTER], "2");
        let timeout = ActivatorError::Rejected {
            revision: rev,
            rejection: Rejection::HoldTimeout {
                waited: Duration::from_secs(5),
            },
        }
        .into_response(Duration::from_secs(2), false);
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(timeout.headers().get(header::RETRY_AFTER).is_none());
        let nf = ActivatorError::NotFound("no route".into()).into_response(Duration::ZERO, false);
        assert_eq!(nf.status(), StatusCode::NOT_FOUND);
    }

    /// To a gRPC call the answer is a trailers-only gRPC error with the same reason and id.
    #[test]
    fn a_grpc_call_gets_a_trailers_only_grpc_error() {
        use crate::http1::grpc::{GRPC_MESSAGE, GRPC_STATUS};
        let rev = RevisionKey::new("ns", "r");
        let cases = [
            (
                ActivatorError::Rejected {
                    revision: rev.clone(),
                    rejection: Rejection::QueueFull { depth: 3 },
                },
                "14",
            ),
            (
                ActivatorError::TotalTimeout {
                    revision: rev.clone(),
                    waited: Duration::from_secs(1),
                },
                "4",
            ),
            (ActivatorError::NotFound("no route".into()), "12"),
            (
                ActivatorError::Rejected {
                    revision: rev.clone(),
                    rejection: Rejection::HoldTimeout {
                        waited: Duration::from_secs(5),
                    },
                },
                "14",
            ),
            (
                ActivatorError::CallDeadline {
                    revision: rev.clone(),
                    waited: Duration::from_secs(1),
                },
                "4",
            ),
            (
                ActivatorError::HeadersTooLarge {
                    what: "header count",
                    actual: 200,
                    limit: 100,
                },
                "8",
            ),
        ];
        for (e, code) in cases {
            let reason = e.public_reason();
            let resp = e.into_response(Duration::from_secs(2), true);
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/grpc");
            assert_eq!(resp.headers()[GRPC_STATUS], code);
            let id = resp.headers()[X_REQUEST_ID].to_str().unwrap();
            let message = resp.headers()[GRPC_MESSAGE].to_str().unwrap();
            assert_eq!(message, format!("{reason} (request id {id})"));
            assert!(
                matches!(resp.into_body(), ActivatorBody::Full(None)),
                "no body"
            );
        }
    }

    /// Finding 3: no replica output, upstream address or connector text reaches the client.
    #[test]
    fn client_reasons_carry_nothing_internal() {
        let rev = RevisionKey::new("ns", "r");
        let endpoint: SocketAddr = "10.1.2.3:8012".parse().unwrap();
        let errors = [
            ActivatorError::Rejected {
                revision: rev.clone(),
                rejection: Rejection::Failing(
                    "replicas keep crashing: exit status 1 (last output: 'db password=hunter2')"
                        .into(),
                ),
            },
            ActivatorError::Upstream {
                revision: rev.clone(),
                endpoint,
                source: "parse error: invalid header at byte 17".into(),
            },
            ActivatorError::ResponseStartTimeout {
                revision: rev.clone(),
                endpoint,
                waited: Duration::from_secs(1),
            },
        ];
        for e in errors {
            let detail = e.to_string();
            let reason = e.public_reason();
            for secret in ["hunter2", "10.1.2.3", "8012", "parse error"] {
                assert!(!reason.contains(secret), "{reason} (from {detail})");
            }
            let resp = e.into_response(Duration::from_secs(1), false);
            let id = resp.headers()[X_REQUEST_ID].to_str().unwrap().to_string();
            let ActivatorBody::Full(Some(body)) = resp.into_body() else {
                panic!("a full body");
            };
            let body = String::from_utf8(body.to_vec()).unwrap();
            assert!(body.contains(&id), "{body} names the request id {id}");
        }
    }
}
