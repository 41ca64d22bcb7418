//! Readiness of the user container: probed by TCP connect or `GET path` (Knative's
//! `SERVING_READINESS_PROBE`), aggressively while it is not ready and once a second while it
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
    let UserProbe::Http { path, headers, .. } = probe else {
        return true;
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
