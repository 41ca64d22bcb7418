//! Readiness of the user container: probed by TCP connect, `GET path` or a gRPC health check
//! (`grpc.health.v1.Health/Check` over h2c; Knative's `SERVING_READINESS_PROBE`), aggressively while it is not ready and once a second while it
//! is, and at once when a request finds it gone.
//!
//! Backoff while not ready (the local platform's rule): 250 µs doubling, capped at 1 ms for the
//! first 20 ms, then at 5 % of the time spent waiting, at most 25 ms. So a container that
//! starts listening is seen within about a millisecond early on, and a slow starter costs a
//! few dozen connects a second at most. Each attempt is bounded by 1 s (Kubernetes' default
//! probe timeout).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::settings::UserProbe;

/// One attempt's bound.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a ready container is probed again.
pub const READY_PERIOD: Duration = Duration::from_secs(1);

/// Whether the user container answers its probe; shared by the prober, the request path and
/// the admin port.
#[derive(Debug, Default)]
pub struct Readiness {
    ready: AtomicBool,
    /// Wakes the prober at once (a request found the container gone).
    recheck: Notify,
}

impl Readiness {
    /// Whether the last probe passed.
    pub fn is_ready(&self) -> bool {
        self.ready.load(SeqCst)
    }

    /// A request could not reach the container: it is not ready until a probe passes again.
    pub fn lost(&self) {
        if self.ready.swap(false, SeqCst) {
            tracing::warn!("user container not reachable: not ready until its probe passes");
        }
        self.recheck.notify_one();
    }

    /// A request saw something odd (a closed connection): probe now.
    pub fn recheck(&self) {
        self.recheck.notify_one();
    }
}

/// The delay before the next attempt, `waited` after probing began (see the module doc).
pub fn next_delay(previous: Duration, waited: Duration) -> Duration {
    let cap = if waited < Duration::from_millis(20) {
        Duration::from_millis(1)
    } else {
        waited.mul_f64(0.05).min(Duration::from_millis(25))
    };
    (previous * 2).min(cap).max(Duration::from_micros(250))
}

/// One probe attempt.
pub async fn probe_once(probe: &UserProbe) -> bool {
    tokio::time::timeout(ATTEMPT_TIMEOUT, attempt(probe))
        .await
        .unwrap_or(false)
}

async fn attempt(probe: &UserProbe) -> bool {
    let Ok(mut stream) = TcpStream::connect(probe.addr()).await else {
        return false;
    };
    let (path, headers) = match probe {
        UserProbe::Tcp { .. } => return true,
        UserProbe::Grpc { service, .. } => return grpc_health(stream, probe.addr(), service).await,
        UserProbe::Http { path, headers, .. } => (path, headers),
    };
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: Knative-Queue-Proxy-Probe\r\nK-Network-Probe: queue\r\nConnection: close\r\n",
        probe.addr()
    );
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    if stream.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    // The status line is all that matters: `HTTP/1.1 NNN`.
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match stream.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => return false,
            Ok(k) => n += k,
        }
    }
    let code = std::str::from_utf8(&buf[9..12])
        .ok()
        .and_then(|c| c.parse::<u16>().ok());
    buf.starts_with(b"HTTP/1.") && code.is_some_and(|c| (200..400).contains(&c))
}

/// The gRPC health-checking protocol's method.
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// One `grpc.health.v1.Health/Check` for `service` over h2c on `stream`: ready when the call
/// ends with `grpc-status` 0 and its answer's `status` (field 1) is SERVING. The messages are
/// a string field out and a varint field back, encoded and read here.
pub(crate) async fn grpc_health(
    stream: TcpStream,
    addr: std::net::SocketAddr,
    service: &str,
) -> bool {
    use http_body_util::BodyExt;
    let io = hyper_util::rt::TokioIo::new(stream);
    let executor = hyper_util::rt::TokioExecutor::new();
    let Ok((mut send, conn)) = hyper::client::conn::http2::handshake(executor, io).await else {
        return false;
    };
    let exchange = async move {
        let req = http::Request::post(format!("http://{addr}{HEALTH_CHECK}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(http::header::USER_AGENT, "Knative-Queue-Proxy-Probe")
            .body(http_body_util::Full::new(health_request(service)))
            .ok()?;
        let resp = send.send_request(req).await.ok()?;
        if resp.status() != http::StatusCode::OK {
            return None;
        }
        let (head, body) = resp.into_parts();
        let body = body.collect().await.ok()?;
        // Trailers, or the head of a trailers-only answer.
        let status = body
            .trailers()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| head.headers.get("grpc-status"))?;
        (status == "0").then_some(())?;
        health_status(&body.to_bytes()).filter(|s| *s == SERVING)
    };
    tokio::select! {
        served = exchange => served.is_some(),
        _ = conn => false,
    }
}

/// A framed `HealthCheckRequest { service }` (field 1, a string; nothing for the empty name).
fn health_request(service: &str) -> bytes::Bytes {
    let mut msg = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        msg.push(0x0a);
        let mut n = service.len();
        while n >= 0x80 {
            msg.push((n as u8) | 0x80);
            n >>= 7;
        }
        msg.push(n as u8);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(5 + msg.len());
    framed.push(0);
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    framed.into()
}

/// `HealthCheckResponse.status` (field 1, a varint) from one framed, uncompressed message;
/// absent, it is 0 (UNKNOWN). `None` when the bytes are not such a message.
fn health_status(framed: &[u8]) -> Option<u64> {
    let (&[0], rest) = framed.split_at_checked(1)? else {
        return None;
    };
    let (len, mut msg) = rest.split_at_checked(4)?;
    if u32::from_be_bytes(len.try_into().ok()?) as usize != msg.len() {
        return None;
    }
    let mut status = 0;
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        match key & 7 {
            0 => {
                let v = varint(&mut msg)?;
                if key >> 3 == 1 {
                    status = v;
                }
            }
            1 => msg = msg.get(8..)?,
            2 => {
                let n = usize::try_from(varint(&mut msg)?).ok()?;
                msg = msg.get(n..)?;
            }
            5 => msg = msg.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

/// A protobuf varint from the front of `b`.
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Probes until `stop`: fast with backoff while not ready, every [`READY_PERIOD`] (or at once on
/// [`Readiness::lost`]/[`Readiness::recheck`]) while ready.
pub async fn run(probe: UserProbe, readiness: std::sync::Arc<Readiness>, stop: CancellationToken) {
    let mut began = Instant::now();
    let mut delay = Duration::from_micros(250);
    let mut failures = 0u32;
    loop {
        let ok = tokio::select! {
            ok = probe_once(&probe) => ok,
            _ = stop.cancelled() => return,
        };
        let was = readiness.ready.swap(ok, SeqCst);
        match (was, ok) {
            (false, true) => {
                tracing::info!(
                    addr = %probe.addr(),
                    after_ms = began.elapsed().as_secs_f64() * 1000.0,
                    "user container ready"
                );
                failures = 0;
            }
            (true, false) => {
                tracing::warn!(addr = %probe.addr(), "user container failed its probe: not ready");
                began = Instant::now();
                delay = Duration::from_micros(250);
            }
            (false, false) => {
                failures += 1;
                if failures.is_multiple_of(1000) {
                    tracing::info!(addr = %probe.addr(), waited = ?began.elapsed(), "user container not ready yet");
                }
            }
            (true, true) => {}
        }
        let wait = if ok {
            READY_PERIOD
        } else {
            delay = next_delay(delay, began.elapsed());
            delay
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = readiness.recheck.notified() => {}
            _ = stop.cancelled() => return,
        }
        if !readiness.is_ready() && ok {
            // `lost` since the probe passed: start the fast probing afresh.
            began = Instant::now();
            delay = Duration::from_micros(250);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_under_a_millisecond_and_stays_bounded() {
        let mut d = Duration::from_micros(250);
        d = next_delay(d, Duration::from_millis(1));
        assert_eq!(d, Duration::from_micros(500));
        d = next_delay(d, Duration::from_millis(2));
        assert_eq!(d, Duration::from_millis(1));
        d = next_delay(d, Duration::from_millis(10));
        assert_eq!(d, Duration::from_millis(1), "1 ms cap early");
        d = next_delay(d, Duration::from_millis(100));
        assert_eq!(d, Duration::from_millis(2));
        for _ in 0..20 {
            d = next_delay(d, Duration::from_secs(60));
        }
        assert_eq!(d, Duration::from_millis(25));
    }

    #[test]
    fn health_messages_are_encoded_and_read() {
        assert_eq!(&health_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &health_request("ab")[..],
            &[0, 0, 0, 0, 4, 0x0a, 2, b'a', b'b']
        );
        let long = "s".repeat(200);
        assert_eq!(&health_request(&long)[5..8], &[0x0a, 0xc8, 0x01]);
        assert_eq!(health_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(SERVING));
        assert_eq!(health_status(&[0, 0, 0, 0, 2, 0x08, 2]), Some(2));
        assert_eq!(health_status(&[0, 0, 0, 0, 0]), Some(0), "absent: UNKNOWN");
        // An unknown field before it is skipped.
        assert_eq!(
            health_status(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 1]),
            Some(SERVING)
        );
        assert_eq!(health_status(&[1, 0, 0, 0, 2, 0x08, 1]), None, "compressed");
        assert_eq!(health_status(&[0, 0, 0, 0, 3, 0x08, 1]), None, "short");
        assert_eq!(health_status(&[]), None);
    }

    #[tokio::test]
    async fn tcp_and_http_probes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            // Answers 200 on /ok and 500 elsewhere.
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let status =
                    if head.starts_with("GET /ok ") && head.contains("K-Network-Probe: queue") {
                        "200 OK"
                    } else {
                        "500 Internal Server Error"
                    };
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let host = std::net::IpAddr::from([127, 0, 0, 1]);
        assert!(probe_once(&UserProbe::Tcp { host, port }).await);
        let http = |path: &str| UserProbe::Http {
            host,
            port,
            path: path.into(),
            headers: vec![],
        };
        assert!(probe_once(&http("/ok")).await);
        assert!(!probe_once(&http("/bad")).await);
        server.abort();
        let _ = server.await;
        // Nothing listens any more on a fresh port.
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = gone.local_addr().unwrap().port();
        drop(gone);
        assert!(!probe_once(&UserProbe::Tcp { host, port }).await);
    }
}
