//! The pod's stats for the autoscaler: time-weighted average concurrency (Σ concurrency × dt /
//! Σ dt, Knative's queue-proxy and activator formula) and arrivals over each second, and the
//! share of both that came through an activator (`K-Proxy-Request`).
//!
//! A request counts from its arrival at the sidecar (queued time included, as the autoscaler
//! needs) until its response body ends, through an [`InFlight`] guard. A pure accumulator under
//! one lock: the caller passes `now`, so tests drive it with plain instants.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::stats::PodStats;

/// One second's figures (see [`PodStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Second {
    pub average_concurrency: f64,
    pub requests: u64,
    pub proxied_concurrency: f64,
    pub proxied_requests: u64,
}

impl Second {
    /// The pull format, with the pod's name.
    pub fn to_pod_stats(self, pod: &str) -> PodStats {
        PodStats {
            pod: pod.to_string(),
            average_concurrency: self.average_concurrency,
            requests: self.requests,
            proxied_concurrency: self.proxied_concurrency,
            proxied_requests: self.proxied_requests,
        }
    }
}

#[derive(Debug)]
struct Acc {
    /// Start of the open interval.
    start: Instant,
    /// When the counts last changed (or the interval was taken).
    last: Instant,
    current: u32,
    current_proxied: u32,
    /// Σ concurrency × ns, all requests and the proxied ones.
    area: u128,
    area_proxied: u128,
    requests: u64,
    proxied_requests: u64,
}

impl Acc {
    fn advance(&mut self, now: Instant) {
        if now > self.last {
            let dt = now.duration_since(self.last).as_nanos();
            self.area += dt * u128::from(self.current);
            self.area_proxied += dt * u128::from(self.current_proxied);
            self.last = now;
        }
    }
}

/// The pod's concurrency window. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct PodWindow {
    acc: Mutex<Acc>,
}

/// A request present in the pod: counted until dropped.
#[derive(Debug)]
pub struct InFlight {
    window: Arc<PodWindow>,
    proxied: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.window.depart(self.proxied, Instant::now());
    }
}

impl PodWindow {
    /// An empty window whose first interval starts at `now`.
    pub fn new(now: Instant) -> Arc<Self> {
        Arc::new(Self {
            acc: Mutex::new(Acc {
                start: now,
                last: now,
                current: 0,
                current_proxied: 0,
                area: 0,
                area_proxied: 0,
                requests: 0,
                proxied_requests: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Acc> {
        // Every change under the lock is a few additions: a poisoned lock is still consistent.
        self.acc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request arrived at `now` (`proxied`: it carried `K-Proxy-Request`); it counts until
    /// the guard drops.
    pub fn arrive(self: &Arc<Self>, proxied: bool, now: Instant) -> InFlight {
        let mut a = self.lock();
        a.advance(now);
        a.current += 1;
        a.requests += 1;
        if proxied {
            a.current_proxied += 1;
            a.proxied_requests += 1;
        }
        InFlight {
            window: self.clone(),
            proxied,
        }
    }

    fn depart(&self, proxied: bool, now: Instant) {
        let mut a = self.lock();
        a.advance(now);
        a.current = a.current.saturating_sub(1);
        if proxied {
            a.current_proxied = a.current_proxied.saturating_sub(1);
        }
    }

    /// Requests present now.
    pub fn current(&self) -> u32 {
        self.lock().current
    }

    /// Closes the interval at `now` and starts the next one.
    pub fn take(&self, now: Instant) -> Second {
        let mut a = self.lock();
        a.advance(now);
        let span = now.saturating_duration_since(a.start).as_nanos();
        let avg = |area: u128, current: u32| {
            if span == 0 {
                f64::from(current)
            } else {
                area as f64 / span as f64
            }
        };
        let s = Second {
            average_concurrency: avg(a.area, a.current),
            requests: a.requests,
            proxied_concurrency: avg(a.area_proxied, a.current_proxied),
            proxied_requests: a.proxied_requests,
        };
        a.start = now;
        a.last = now;
        a.area = 0;
        a.area_proxied = 0;
        a.requests = 0;
        a.proxied_requests = 0;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn time_weighted_with_the_proxied_share() {
        let t0 = Instant::now();
        let w = PodWindow::new(t0);
        let ms = |n| t0 + Duration::from_millis(n);
        // Two requests the whole second (one proxied), one direct for its second half.
        let a = w.arrive(true, t0);
        let b = w.arrive(false, t0);
        let c = w.arrive(false, ms(500));
        drop(c);
        let s = w.take(ms(1000));
        assert_eq!(s.requests, 3);
        assert_eq!(s.proxied_requests, 1);
        // c departed at "now" (the real clock, paused at t0): it counted 0 s.
        assert!((s.average_concurrency - 2.0).abs() < 1e-9, "{s:?}");
        assert!((s.proxied_concurrency - 1.0).abs() < 1e-9, "{s:?}");
        // The next second: still two present, no arrivals.
        let s = w.take(ms(2000));
        assert_eq!((s.requests, s.proxied_requests), (0, 0));
        assert!((s.average_concurrency - 2.0).abs() < 1e-9);
        drop((a, b));
        assert_eq!(w.current(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_half_second_request_averages_a_half() {
        let t0 = Instant::now();
        let w = PodWindow::new(t0);
        let r = w.arrive(true, t0);
        tokio::time::advance(Duration::from_millis(500)).await;
        drop(r);
        let s = w.take(t0 + Duration::from_secs(1));
        assert!((s.average_concurrency - 0.5).abs() < 1e-6, "{s:?}");
        assert!((s.proxied_concurrency - 0.5).abs() < 1e-6, "{s:?}");
        assert_eq!(s.to_pod_stats("p").pod, "p");
    }
}
