//! Time-weighted average concurrency (Knative's `activator/handler/concurrency_reporter.go`):
//! Σ(concurrency × dt) / Σdt over each report interval, from arrival and departure events. A pure
//! accumulator: the caller passes `now`, so tests drive it with plain instants.
//!
//! [`ShardedWindow`] keeps one window per data worker so the workers never share a lock or a
//! cache line per request; the reporter sums the shards (time-weighted averages over the same
//! interval add up, as do counts).

use std::sync::{Mutex, MutexGuard};

use crate::percore::handles::{Padded, local_shard, shard_count};

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

/// A revision's concurrency window, split into per-worker shards. Each request arrives and
/// departs on one shard (the one [`ShardedWindow::arrive`] returns), so a shard's count never
/// goes negative even if a request were to finish on another thread; reading sums every shard.
#[derive(Debug)]
pub struct ShardedWindow {
    shards: Box<[Padded<Mutex<ConcurrencyWindow>>]>,
}

impl ShardedWindow {
    /// Empty shards (one per core plus one) whose first interval starts at `now`.
    pub fn new(now: Instant) -> Self {
        Self::with_shards(now, shard_count())
    }

    /// Empty window with `n` (at least 1) shards.
    pub fn with_shards(now: Instant, n: usize) -> Self {
        let shards = (0..n.max(1))
            .map(|_| Padded(Mutex::new(ConcurrencyWindow::new(now))))
            .collect();
        Self { shards }
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, ConcurrencyWindow> {
        self.shards[i].0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The calling thread's shard: its data worker's, or 0 off the workers.
    fn local(&self) -> usize {
        local_shard(self.shards.len())
    }

    /// A request arrived at `now`; returns the shard to pass to [`ShardedWindow::depart`].
    pub fn arrive(&self, now: Instant) -> usize {
        let i = self.local();
        self.arrive_on(i, now);
        i
    }

    /// A request arrived at `now` on shard `i` (modulo the shard count).
    pub fn arrive_on(&self, i: usize, now: Instant) -> usize {
        let i = i % self.shards.len();
        self.shard(i).arrive(now);
        i
    }

    /// The request that arrived on `shard` finished at `now`.
    pub fn depart(&self, shard: usize, now: Instant) {
        self.shard(shard % self.shards.len()).depart(now);
    }

    /// Requests present now, over all shards.
    pub fn current(&self) -> u32 {
        (0..self.shards.len())
            .map(|i| self.shard(i).current())
            .sum()
    }

    /// Closes every shard's interval at `now` and sums them: averages over the same interval
    /// add up, as do arrivals and requests present.
    pub fn take(&self, now: Instant) -> WindowReport {
        let mut sum = WindowReport {
            average: 0.0,
            requests: 0,
            current: 0,
        };
        for i in 0..self.shards.len() {
            let r = self.shard(i).take(now);
            sum.average += r.average;
            sum.requests += r.requests;
            sum.current += r.current;
        }
        sum
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

    #[test]
    fn shards_sum_to_one_window_over_the_same_events() {
        let t0 = Instant::now();
        let sharded = ShardedWindow::with_shards(t0, 3);
        let mut whole = ConcurrencyWindow::new(t0);
        // Requests spread over the shards, overlapping, one crossing the interval end:
        // (shard, arrival ms, departure ms), fed in time order.
        let requests = [
            (0, 0, 300),
            (1, 100, 700),
            (2, 250, 1400),
            (1, 800, 950),
            (0, 900, 990),
        ];
        let mut events: Vec<(u64, Option<usize>)> = Vec::new();
        for (i, &(_, from, to)) in requests.iter().enumerate() {
            events.push((from, None));
            if to < 1000 {
                events.push((to, Some(i)));
            }
        }
        events.sort_by_key(|&(t, depart)| (t, depart.is_none()));
        let mut arrived = vec![usize::MAX; requests.len()];
        let mut next = 0;
        for (t, depart) in events {
            match depart {
                Some(i) => {
                    sharded.depart(arrived[i], t0 + ms(t));
                    whole.depart(t0 + ms(t));
                }
                None => {
                    arrived[next] = sharded.arrive_on(requests[next].0, t0 + ms(t));
                    whole.arrive(t0 + ms(t));
                    next += 1;
                }
            }
        }
        assert_eq!(sharded.current(), 1);
        let shards = arrived;
        let (s, w) = (sharded.take(t0 + ms(1000)), whole.take(t0 + ms(1000)));
        assert!((s.average - w.average).abs() < 1e-9, "{s:?} vs {w:?}");
        assert!((s.average - 1.89).abs() < 1e-9, "{s:?}");
        assert_eq!((s.requests, s.current), (5, 1));
        // The open request carries into the next interval, on its own shard.
        sharded.depart(shards[2], t0 + ms(1400));
        let next = sharded.take(t0 + ms(2000));
        assert!((next.average - 0.4).abs() < 1e-9, "{next:?}");
        assert_eq!((next.requests, next.current), (0, 0));
    }

    #[test]
    fn a_departure_lands_on_its_arrival_shard() {
        let t0 = Instant::now();
        let w = ShardedWindow::with_shards(t0, 2);
        let a = w.arrive_on(1, t0);
        let b = w.arrive_on(0, t0);
        w.depart(a, t0 + ms(10));
        assert_eq!(w.current(), 1);
        assert_eq!(
            w.shard(b).current(),
            1,
            "the other shard still counts its request"
        );
        assert_eq!(w.shard(a).current(), 0);
    }
}
