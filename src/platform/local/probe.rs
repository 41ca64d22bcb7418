//! Readiness probing: a TCP connect, or `GET path` answering 2xx, retried with exponential
//! backoff. The caller bounds the whole wait (startup timeout) and races it with the child's
//! exit.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::Instrument;

use crate::revision::Protocol;

/// How readiness is probed: exponential backoff whose cap grows with the time already spent
/// starting, so a fast replica is noticed within about a millisecond and a slow one is not
/// probed a thousand times a second.
///
/// The delay after attempt n is `min(initial * 2^n, clamp(elapsed / 20, early_cap, max_backoff))`:
/// the replica is noticed at most `early_cap` (or 5 % of its start-up time, at most
/// `max_backoff`) after it starts listening, plus one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Delay after the first failed attempt; doubles per attempt.
    pub initial_backoff: Duration,
    /// Cap of the delay while the replica has been starting for less than `20 * early_cap`.
    pub early_cap: Duration,
    /// Hard cap of the delay between attempts.
    pub max_backoff: Duration,
    /// Bound of one attempt (connect, and the HTTP exchange when a path is probed).
    pub attempt_timeout: Duration,
}

impl Default for ProbeOptions {
    /// 250 us doubling, capped at 1 ms for the first 20 ms, then at 5 % of the time spent
    /// starting, at most 25 ms; 1 s per attempt.
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_micros(250),
            early_cap: Duration::from_millis(1),
            max_backoff: Duration::from_millis(25),
            attempt_timeout: Duration::from_secs(1),
        }
    }
}

impl ProbeOptions {
    /// The delay after a failed attempt, given the previous delay (`None` before the first)
    /// and the time since the process was spawned.
    pub fn next_delay(&self, prev: Option<Duration>, elapsed: Duration) -> Duration {
        let grown = prev.map_or(self.initial_backoff, |p| p.saturating_mul(2));
        let cap = (elapsed / 20).clamp(self.early_cap, self.max_backoff.max(self.early_cap));
        grown.min(cap)
    }
}

/// What a readiness probe checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// The port accepts a TCP connection.
    Tcp,
    /// `GET path` over `protocol` answers 2xx.
    Http { path: String, protocol: Protocol },
    /// `grpc.health.v1.Health/Check` for `service` over h2c answers SERVING (Kubernetes'
    /// `grpc` probe, run as the queue sidecar runs it).
    Grpc { service: String },
}

/// Returns once `addr` passes the probe. Never returns otherwise: the caller bounds it.
/// `started_at` is when the process was spawned (it sets the backoff cap).
pub(crate) async fn wait_ready(
    addr: SocketAddr,
    kind: &ProbeKind,
    opts: &ProbeOptions,
    started_at: Instant,
) {
    let span = tracing::debug_span!("readiness_probe", %addr);
    async {
        // tokio's timer ticks in whole milliseconds, so sub-millisecond backoff needs a thread
        // that sleeps precisely: the first 20 early caps (20 ms) of TCP probing run on the
        // blocking pool. If the future is dropped meanwhile, that thread still finishes its
        // phase (bounded by the phase plus one attempt timeout).
        let o = *opts;
        let early = tokio::task::spawn_blocking(move || tcp_early_phase(addr, &o, started_at));
        if early.await.unwrap_or(false) && *kind == ProbeKind::Tcp {
            tracing::debug!("replica ready (early phase)");
            return;
        }
        let mut delay = Some(opts.early_cap / 2);
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
            let d = opts.next_delay(delay, started_at.elapsed());
            delay = Some(d);
            tokio::time::sleep(d).await;
        }
    }
    .instrument(span)
    .await
}

/// At most this many attempts in the early phase (about 25 fit in it at the defaults).
const EARLY_ATTEMPTS: u32 = 64;

/// Connects to `addr` with precise sub-millisecond backoff (a blocking thread) until it
/// accepts (true) or the process has been starting for `20 * early_cap` (false).
/// Also bounded by [`EARLY_ATTEMPTS`], should tokio's clock be paused (it would not advance).
fn tcp_early_phase(addr: SocketAddr, o: &ProbeOptions, started_at: Instant) -> bool {
    let mut delay = None;
    for _ in 0..EARLY_ATTEMPTS {
        if std::net::TcpStream::connect_timeout(&addr, o.attempt_timeout).is_ok() {
            return true;
        }
        let elapsed = started_at.elapsed();
        if elapsed >= o.early_cap * 20 {
            return false;
        }
        let d = o.next_delay(delay, elapsed);
        delay = Some(d);
        std::thread::sleep(d);
    }
    false
}

async fn probe_once(addr: SocketAddr, kind: &ProbeKind) -> bool {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return false;
    };
    match kind {
        ProbeKind::Tcp => true,
        ProbeKind::Http { path, protocol } => http_get_ok(stream, addr, path, *protocol).await,
        ProbeKind::Grpc { service } => {
            crate::queue::probe::grpc_health(stream, addr, service).await
        }
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
                wait_ready(addr, &kind, &ProbeOptions::default(), Instant::now()),
            )
            .await
            .expect("probe passes once the server answers 200");
            assert_eq!(seen.load(Ordering::SeqCst), 4, "{protocol:?}");
        }
    }

    #[test]
    fn backoff_doubles_under_a_cap_that_grows_with_the_start_up_time() {
        let o = ProbeOptions::default();
        let ms = Duration::from_millis;
        assert_eq!(o.next_delay(None, ms(0)), Duration::from_micros(250));
        assert_eq!(
            o.next_delay(Some(Duration::from_micros(250)), ms(1)),
            ms(1) / 2
        );
        assert_eq!(o.next_delay(Some(ms(1) / 2), ms(2)), ms(1));
        assert_eq!(o.next_delay(Some(ms(1)), ms(10)), ms(1), "early cap");
        assert_eq!(o.next_delay(Some(ms(1)), ms(100)), ms(2));
        assert_eq!(o.next_delay(Some(ms(2)), ms(100)), ms(4), "5% of 100 ms");
        assert_eq!(o.next_delay(Some(ms(4)), ms(100)), ms(5));
        assert_eq!(o.next_delay(Some(ms(16)), ms(60_000)), ms(25), "hard cap");
    }

    /// A gRPC health server over h2c: NOT_SERVING to its first `failures` checks, then
    /// SERVING; it records the service names asked for.
    async fn health_server(failures: u32) -> (SocketAddr, Arc<std::sync::Mutex<Vec<Bytes>>>) {
        use http_body_util::{BodyExt, StreamBody};
        use hyper::body::Frame;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let asked: Arc<std::sync::Mutex<Vec<Bytes>>> = Arc::default();
        let seen = Arc::new(AtomicU32::new(0));
        let asked2 = asked.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                let (seen, asked) = (seen.clone(), asked2.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (seen, asked) = (seen.clone(), asked.clone());
                        async move {
                            assert_eq!(req.uri().path(), "/grpc.health.v1.Health/Check");
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            asked.lock().unwrap().push(body.slice(5..));
                            let status = if seen.fetch_add(1, Ordering::SeqCst) < failures {
                                2
                            } else {
                                1
                            };
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                            let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
                                Ok(Frame::data(Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]))),
                                Ok(Frame::trailers(trailers)),
                            ];
                            http::Response::builder()
                                .header("content-type", "application/grpc")
                                .body(StreamBody::new(futures::stream::iter(frames)))
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (addr, asked)
    }

    #[tokio::test]
    async fn grpc_probe_waits_for_serving() {
        let (addr, asked) = health_server(2).await;
        let kind = ProbeKind::Grpc {
            service: "thaw.Ready".into(),
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            wait_ready(addr, &kind, &ProbeOptions::default(), Instant::now()),
        )
        .await
        .expect("probe passes once the server answers SERVING");
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 3, "two NOT_SERVING, then SERVING");
        // HealthCheckRequest { service: "thaw.Ready" }: field 1, length 10.
        assert_eq!(&asked[0][..], b"\x0a\x0athaw.Ready");
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
            wait_ready(
                addr,
                &ProbeKind::Tcp,
                &ProbeOptions::default(),
                Instant::now(),
            )
            .await
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
