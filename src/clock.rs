//! The process clock: whole seconds on tokio's monotonic clock.
//!
//! Stats carry the second they describe (`Stat::at`). Both ends of an in-process channel read the
//! same epoch, and tokio's clock follows `tokio::time::pause()` in tests, so windows and timeouts
//! are testable without sleeping. Across processes the receiver stamps stats on arrival, as
//! Knative's autoscaler does, so the epoch never has to be shared over the wire.

use std::sync::OnceLock;
use tokio::time::{Duration, Instant};

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// The instant the process clock counts from (fixed at first use).
pub fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Whole seconds from [`epoch`] to `t` (0 for instants before the epoch).
pub fn second_of(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_secs()
}

/// The current whole second on the process clock.
pub fn now_second() -> u64 {
    second_of(Instant::now())
}

/// The instant at which second `s` starts.
pub fn instant_of(s: u64) -> Instant {
    epoch() + Duration::from_secs(s)
}

/// The first instant at or after `now` that lies `offset` (less than a second) into a second of
/// the process clock.
pub fn next_at_offset(now: Instant, offset: Duration) -> Instant {
    let candidate = instant_of(second_of(now)) + offset;
    if candidate >= now {
        candidate
    } else {
        candidate + Duration::from_secs(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_offset_is_within_a_second_and_at_the_offset() {
        let offset = Duration::from_millis(500);
        for after in [0u64, 1, 499, 500, 501, 999] {
            let now = instant_of(7) + Duration::from_millis(after);
            let next = next_at_offset(now, offset);
            assert!(
                next >= now && next - now < Duration::from_secs(1),
                "{after}"
            );
            assert_eq!(next.duration_since(epoch()).subsec_millis(), 500, "{after}");
        }
    }
}
