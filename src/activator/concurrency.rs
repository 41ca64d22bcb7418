//! Time-weighted average concurrency (knative-dataplane.md §1.7): Σ(concurrency × dt) / Σdt over
//! each report interval, from arrival and departure events. A pure accumulator: the caller passes
//! `now`, so tests drive it with plain instants.

use tokio::time::{Duration, Instant};

/// One revision's concurrency over the current report interval. Held requests count: a request
/// is counted from its arrival (before the throttler) to the end of its response.
#[derive(Debug, Clone)]
pub struct ConcurrencyWindow {
    /// Requests present now.
    current: u32,
    /// When `current` last changed (or the window was last advanced).
    last: Instant,
    /// Start of the current interval.
    start: Instant,
    /// Σ concurrency × nanoseconds since `start`.
    area: u128,
    /// Arrivals since `start`.
    requests: u64,
}

/// What one interval looked like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowReport {
    /// Time-weighted average concurrency over the interval (0 for an empty interval).
    pub average: f64,
    /// Arrivals in the interval.
    pub requests: u64,
    /// Requests present at the end of the interval.
    pub current: u32,
}

impl ConcurrencyWindow {
    /// An empty window whose first interval starts at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            current: 0,
            last: now,
            start: now,
            area: 0,
            requests: 0,
        }
    }

    fn advance(&mut self, now: Instant) {
        if now > self.last {
            let dt = now.duration_since(self.last).as_nanos();
            self.area += dt * u128::from(self.current);
            self.last = now;
        }
    }

    /// A request arrived at `now`.
    pub fn arrive(&mut self, now: Instant) {
        self.advance(now);
        self.current += 1;
        self.requests += 1;
    }

    /// A request finished (answered, failed or cancelled) at `now`.
    pub fn depart(&mut self, now: Instant) {
        self.advance(now);
        self.current = self.current.saturating_sub(1);
    }

    /// Requests present now.
    pub fn current(&self) -> u32 {
        self.current
    }

    /// Closes the interval at `now` and starts the next one.
    pub fn take(&mut self, now: Instant) -> WindowReport {
        self.advance(now);
        let span = now.saturating_duration_since(self.start);
        let average = if span.is_zero() {
            f64::from(self.current)
        } else {
            self.area as f64 / span.as_nanos() as f64
        };
        let report = WindowReport {
            average,
            requests: self.requests,
            current: self.current,
        };
        self.start = now;
        self.last = now;
        self.area = 0;
        self.requests = 0;
        report
    }

    /// The length of the open interval so far.
    pub fn open_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn averages_concurrency_over_time() {
        let t0 = Instant::now();
        let mut w = ConcurrencyWindow::new(t0);
        // One request for the whole second, a second one for its last half.
        w.arrive(t0);
        w.arrive(t0 + ms(500));
        let r = w.take(t0 + ms(1000));
        assert!((r.average - 1.5).abs() < 1e-9, "{r:?}");
        assert_eq!((r.requests, r.current), (2, 2));
    }

    #[test]
    fn carries_open_requests_into_the_next_interval() {
        let t0 = Instant::now();
        let mut w = ConcurrencyWindow::new(t0);
        w.arrive(t0 + ms(900));
        w.take(t0 + ms(1000));
        w.depart(t0 + ms(1250));
        let r = w.take(t0 + ms(2000));
        assert!((r.average - 0.25).abs() < 1e-9, "{r:?}");
        assert_eq!((r.requests, r.current), (0, 0));
    }

    #[test]
    fn idle_interval_reports_zero() {
        let t0 = Instant::now();
        let mut w = ConcurrencyWindow::new(t0);
        let r = w.take(t0 + ms(1000));
        assert_eq!(
            r,
            WindowReport {
                average: 0.0,
                requests: 0,
                current: 0
            }
        );
    }

    #[test]
    fn short_request_inside_one_interval() {
        let t0 = Instant::now();
        let mut w = ConcurrencyWindow::new(t0);
        for i in 0..10 {
            w.arrive(t0 + ms(i * 100));
            w.depart(t0 + ms(i * 100 + 10));
        }
        let r = w.take(t0 + ms(1000));
        assert!((r.average - 0.1).abs() < 1e-9, "{r:?}");
        assert_eq!(r.requests, 10);
    }
}
