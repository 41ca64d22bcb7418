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
