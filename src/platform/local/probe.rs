//! Readiness probing: a TCP connect, or `GET path` answering 2xx, retried with exponential
//! backoff. The caller bounds the whole wait (startup timeout) and races it with the child's
//! exit.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tracing::Instrument;

use crate::revision::Protocol;

/// How readiness is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Delay after the first failed attempt; doubles per attempt.
    pub initial_backoff: Duration,
    /// Cap of the delay between attempts (bounds how late a ready replica is noticed).
    pub max_backoff: Duration,
    /// Bound of one attempt (connect, and the HTTP exchange when a path is probed).
    pub attempt_timeout: Duration,
}

impl Default for ProbeOptions {
    /// 250 us doubling to 5 ms; 1 s per attempt.
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_micros(250),
            max_backoff: Duration::from_millis(5),
            attempt_timeout: Duration::from_secs(1),
        }
    }
}

/// What a readiness probe checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// The port accepts a TCP connection.
    Tcp,
    /// `GET path` over `protocol` answers 2xx.
    Http { path: String, protocol: Protocol },
}

/// Returns once `addr` passes the probe. Never returns otherwise: the caller bounds it.
pub(crate) async fn wait_ready(addr: SocketAddr, kind: &ProbeKind, opts: &ProbeOptions) {
    let span = tracing::debug_span!("readiness_probe", %addr);
    async {
        let mut delay = opts.initial_backoff;
        let mut attempts: u64 = 0;
        loop {
            attempts += 1;
            let ok = tokio::time::timeout(opts.attempt_timeout, probe_once(addr, kind))
                .await
                .unwrap_or(false);
            if ok {
                tracing::debug!(attempts, "replica ready");
                return;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(opts.max_backoff);
        }
    }
    .instrument(span)
    .await
}

async fn probe_once(addr: SocketAddr, kind: &ProbeKind) -> bool {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return false;
    };
    match kind {
        ProbeKind::Tcp => true,
        ProbeKind::Http { path, protocol } => http_get_ok(stream, addr, path, *protocol).await,
    }
}

async fn http_get_ok(stream: TcpStream, addr: SocketAddr, path: &str, protocol: Protocol) -> bool {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(stream);
    let req = match protocol {
        Protocol::Http1 => http::Request::get(path).header(http::header::HOST, addr.to_string()),
        Protocol::H2c => http::Request::get(format!("http://{addr}{path}")),
    }
    .header(http::header::USER_AGENT, "thaw-probe")
    .body(Empty::<Bytes>::new());
    let Ok(req) = req else {
        return false;
    };
    let status = match protocol {
        Protocol::Http1 => {
            let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(io).await else {
                return false;
            };
            // The connection task ends when `send` is dropped (at the end of this attempt).
            tokio::spawn(conn);
            send.send_request(req).await.map(|r| r.status())
        }
        Protocol::H2c => {
            let Ok((mut send, conn)) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await
            else {
                return false;
            };
            tokio::spawn(conn);
            send.send_request(req).await.map(|r| r.status())
        }
    };
    matches!(status, Ok(s) if s.is_success())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::server::conn::auto;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::net::TcpListener;

    /// A server that answers 503 to its first `failures` requests, then 200.
    async fn flaky_server(failures: u32) -> (SocketAddr, Arc<AtomicU32>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicU32::new(0));
        let seen2 = seen.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let seen = seen2.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let n = seen.fetch_add(1, Ordering::SeqCst);
                        let code = if n < failures || req.uri().path() != "/ready" {
                            503
                        } else {
                            200
                        };
                        async move {
                            http::Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::from_static(b"x")))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn http_probe_waits_for_a_2xx_over_both_protocols() {
        for protocol in [Protocol::Http1, Protocol::H2c] {
            let (addr, seen) = flaky_server(3).await;
            let kind = ProbeKind::Http {
                path: "/ready".into(),
                protocol,
            };
            tokio::time::timeout(
                Duration::from_secs(10),
                wait_ready(addr, &kind, &ProbeOptions::default()),
            )
            .await
            .expect("probe passes once the server answers 200");
            assert_eq!(seen.load(Ordering::SeqCst), 4, "{protocol:?}");
        }
    }

    #[tokio::test]
    async fn tcp_probe_passes_once_something_listens() {
        // Reserve a port, release it, and start listening only after the probe began.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let probe = tokio::spawn(async move {
            wait_ready(addr, &ProbeKind::Tcp, &ProbeOptions::default()).await
        });
        tokio::task::yield_now().await;
        assert!(!probe.is_finished());
        let _listener = TcpListener::bind(addr).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), probe)
            .await
            .expect("probe passes")
            .unwrap();
    }
}
