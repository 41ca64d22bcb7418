//! One-second buckets over a window, and Knative's two window averages
//! (docs/architecture.md, "Knative's rules", Knative's `aggregation/bucketing.go`).
//!
//! A [`Window`] is a ring of `n` one-second buckets addressed by absolute second (the seconds
//! of [`crate::clock`]). It remembers the first and the last second written, which is what the
//! linear average needs to avoid diluting fresh samples with stale zeros:
//!
//! - the first samples after a window with no writes are averaged over the seconds seen so far,
//!   not over the whole window;
//! - trailing seconds with no writes are dropped from both the sum and the denominator;
//! - a window with no write for at least its length averages to 0.
//!
//! The weighted-exponential average weighs the newest bucket by α and each older one by a
//! further (1−α), with α = max(1 − 0.0001^(1/n), 0.2).
//!
//! Values in one bucket are summed: the bucket holds the revision's total. Keeping one reporter
//! from being counted twice in a second is the collector's job ([`super::collector`]).
//!
//! Memory is fixed at `n` `f64`s; every operation is O(1) except the averages over a gap
//! (O(gap)), the weighted average (O(n)) and [`Window::resize`] (O(n)).

use std::time::Duration;

use crate::config::Aggregation;

/// Knative rounds linear averages down to this many decimal digits (`roundToNDigits`).
const LINEAR_DIGITS: i32 = 6;
/// The weights of the exponential average must sum to at least this (Knative's
/// `weightPrecision`).
const WEIGHT_PRECISION: f64 = 0.9999;
/// The smallest α of the exponential average (Knative's `minExponent`): with long windows the
/// average would otherwise become an almost plain mean.
const MIN_ALPHA: f64 = 0.2;

/// The number of one-second buckets for a window: whole seconds, rounded up, at least 1.
pub fn buckets_for(window: Duration) -> usize {
    let secs = window.as_secs() + u64::from(window.subsec_nanos() > 0);
    usize::try_from(secs.max(1)).unwrap_or(usize::MAX)
}

/// α of the weighted-exponential average over `n` buckets.
pub fn smoothing_coefficient(n: usize) -> f64 {
    (1.0 - (1.0 - WEIGHT_PRECISION).powf(1.0 / n as f64)).max(MIN_ALPHA)
}

/// A ring of one-second buckets covering the last `n` seconds.
#[derive(Debug, Clone)]
pub struct Window {
    /// Bucket for second `s` lives at `s % len`.
    buckets: Vec<f64>,
    /// The first second written since the window was last idle for a whole window; the
    /// linear average never divides by seconds before it.
    first_write: Option<u64>,
    /// The newest second written; seconds after it have no data yet.
    last_write: Option<u64>,
    /// Sum of every bucket (including ones a gap has made stale; the averages correct for
    /// them).
    total: f64,
    /// α for the weighted-exponential average, cached because `powf` is not free.
    alpha: f64,
}

impl Window {
    /// An empty window of `window` (rounded up to whole seconds, at least 1s).
    pub fn new(window: Duration) -> Self {
        let n = buckets_for(window);
        Self {
            buckets: vec![0.0; n],
            first_write: None,
            last_write: None,
            total: 0.0,
            alpha: smoothing_coefficient(n),
        }
    }

    /// The newest second written, if any.
    pub fn last_write(&self) -> Option<u64> {
        self.last_write
    }

    /// The number of one-second buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Always false: a window has at least one bucket (see [`Window::is_empty_at`] for data).
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    fn n(&self) -> u64 {
        self.buckets.len() as u64
    }

    fn index(&self, second: u64) -> usize {
        (second % self.n()) as usize
    }

    /// Adds `value` to the bucket of `second`.
    ///
    /// Seconds between the last write and `second` become zeros. After a whole window with no
    /// write the window starts afresh, so the next averages are over the new samples only. A
    /// value for a second more than a window older than the newest write is ignored (returns
    /// false). `value` may be negative: the collector uses that to replace a reporter's earlier
    /// value for the same second.
    pub fn record(&mut self, second: u64, value: f64) -> bool {
        let n = self.n();
        match self.last_write {
            None => {
                self.first_write = Some(second);
                self.last_write = Some(second);
            }
            Some(last) if second != last => {
                if second + n <= last {
                    // Older than anything the window still covers.
                    return false;
                }
                if self.first_write.is_none_or(|first| first > second) {
                    self.first_write = Some(second);
                }
                if second > last {
                    if second - last >= n {
                        // A whole window without writes: start afresh.
                        self.first_write = Some(second);
                        self.buckets.fill(0.0);
                        self.total = 0.0;
                    } else {
                        for s in last + 1..=second {
                            let i = self.index(s);
                            self.total -= self.buckets[i];
                            self.buckets[i] = 0.0;
                        }
                    }
                    self.last_write = Some(second);
                }
            }
            Some(_) => {}
        }
        let i = self.index(second);
        self.buckets[i] += value;
        self.total += value;
        true
    }

    /// True when nothing was written for more than a window before `now` (Knative's
    /// `IsEmpty`). The scaler uses this to tell "no data" from "zero load".
    pub fn is_empty_at(&self, now: u64) -> bool {
        self.last_write
            .is_none_or(|last| now.saturating_sub(last) > self.n())
    }

    /// The average chosen by `aggregation` at second `now`.
    pub fn average(&self, now: u64, aggregation: Aggregation) -> f64 {
        match aggregation {
            Aggregation::Linear => self.linear_average(now),
            Aggregation::WeightedExponential => self.weighted_average(now),
        }
    }

    /// The linear average at second `now` (Knative's `TimedFloat64Buckets.WindowAverage`):
    /// the sum of the valid buckets over their number, rounded down to 6 digits. Valid buckets
    /// run from `max(first write, now - n + 1)` to the last write; trailing seconds with no
    /// write are left out of both. 0 once a whole window passed without writes.
    pub fn linear_average(&self, now: u64) -> f64 {
        let (Some(first), Some(last)) = (self.first_write, self.last_write) else {
            return 0.0;
        };
        let n = self.n();
        let seen = (last.saturating_sub(first) + 1) as f64;
        if now <= last {
            let valid = seen.min(n as f64);
            return round_down(self.total / valid, LINEAR_DIGITS);
        }
        let gap = now - last;
        if gap >= n {
            return 0.0;
        }
        // The buckets of seconds last+1..=now hold data older than the window: drop them.
        let mut sum = self.total;
        for s in last + 1..=now {
            sum -= self.buckets[self.index(s)];
        }
        let valid = seen.min((n - gap) as f64);
        round_down(sum / valid, LINEAR_DIGITS)
    }

    /// The weighted-exponential average at second `now` (Knative's
    /// `WeightedFloat64Buckets.WindowAverage`): Σ α(1−α)^i · bucket[now−i] over the window,
    /// trailing seconds with no write counting as zeros. 0 once more than a window passed
    /// without writes.
    pub fn weighted_average(&self, now: u64) -> f64 {
        let Some(last) = self.last_write else {
            return 0.0;
        };
        let n = self.n();
        if now.saturating_sub(last) > n {
            return 0.0;
        }
        let mut weight = self.alpha;
        let mut count = n;
        if now > last {
            let zeros = now - last;
            weight *= (1.0 - self.alpha).powi(i32::try_from(zeros).unwrap_or(i32::MAX));
            count -= zeros;
        }
        let newest = last % n;
        let mut sum = 0.0;
        for i in 0..count {
            let idx = ((newest + n - i) % n) as usize;
            sum += self.buckets[idx] * weight;
            weight *= 1.0 - self.alpha;
        }
        sum
    }

    /// Changes the window length (a live settings change), keeping the newest
    /// `min(old, new)` seconds of data when the window still holds any at `now`.
    ///
    /// Unlike Knative's `ResizeWindow`, which moves the first-write second back a whole old
    /// window, the first-write second only moves forward to the oldest second kept, so a young
    /// window is not suddenly diluted by zeros it never saw.
    pub fn resize(&mut self, window: Duration, now: u64) {
        let new_n = buckets_for(window);
        if new_n == self.buckets.len() {
            return;
        }
        let old_n = self.n();
        let mut buckets = vec![0.0; new_n];
        let mut total = 0.0;
        match self.last_write {
            Some(last) if now.saturating_sub(last) <= old_n => {
                let keep = (new_n as u64).min(old_n);
                for back in 0..keep {
                    let Some(s) = last.checked_sub(back) else {
                        break;
                    };
                    let v = self.buckets[self.index(s)];
                    buckets[(s % new_n as u64) as usize] = v;
                    total += v;
                }
                // Only `keep` seconds survived: never count seconds before them as valid.
                let oldest_kept = (last + 1).saturating_sub(keep);
                self.first_write = self.first_write.map(|f| f.max(oldest_kept));
            }
            _ => {
                self.first_write = None;
                self.last_write = None;
            }
        }
        self.buckets = buckets;
        self.total = total;
        self.alpha = smoothing_coefficient(new_n);
    }
}

/// Rounds `v` down to `digits` decimal digits, as Knative's `roundToNDigits` does.
fn round_down(v: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (v * p).floor() / p
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
