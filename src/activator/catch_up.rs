//! The catch-up: how long, and how many at once, requests the route check cannot place yet
//! wait before their 404 (SECURITY.md, "Tenancy").
//!
//! A request whose host, Route or revision the activator does not know now may be one a
//! gateway sends a moment before the Route watch (or the catalog) shows it: the Route
//! reconciler writes a Route's status just after its VirtualServices. So such a request waits
//! up to [`CATCH_UP`], woken by each change, and is served as soon as it can be placed. Every
//! request that cannot be placed waits the whole period before its 404, whatever the reason
//! (no Route has the host, the host's Route is another namespace's, the revision does not
//! exist): its timing, like its body, tells nothing about what exists.
//!
//! The waiting is bounded by [`CatchUpSeats`]: at most `cap` requests wait at once
//! (`thaw_activator_route_catch_up_waiting`). Beyond it a request is answered the same 404 at
//! once (`thaw_activator_route_catch_up_full_total`). That reveals nothing either: which
//! requests wait does not depend on what they name (every request that is not placed at once
//! waits, for any reason), so when the seats are full every such request is answered at once
//! alike, and whether the seats are full depends only on how many others wait.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

/// How long a request the route check cannot place waits for the Route watch and the catalog
/// before its 404; no such 404 comes sooner.
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// How many requests may wait in the catch-up at once by default: a burst of new-revision
/// requests a gateway sends ahead of the Route watch fits; each waiting request holds only its
/// connection and a small future.
pub const CATCH_UP_SEATS: u32 = 10_000;

/// The seats of the catch-up (the module doc).
#[derive(Debug)]
pub struct CatchUpSeats {
    waiting: AtomicU32,
    cap: u32,
}

impl CatchUpSeats {
    /// Seats for `cap` waiting requests.
    pub fn new(cap: u32) -> Self {
        Self {
            waiting: AtomicU32::new(0),
            cap,
        }
    }

    /// A seat, counted in `gauge` while held, or `None` when all `cap` are taken.
    pub fn take<'a>(&'a self, gauge: &'a Gauge) -> Option<Seat<'a>> {
        self.waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()?;
        gauge.inc();
        Some(Seat { seats: self, gauge })
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Acquire)
    }
}

impl Default for CatchUpSeats {
    fn default() -> Self {
        Self::new(CATCH_UP_SEATS)
    }
}

/// One waiting request's seat: given back when dropped, however the wait ends (placed, timed
/// out, or the client gone and its future dropped).
#[derive(Debug)]
pub struct Seat<'a> {
    seats: &'a CatchUpSeats,
    gauge: &'a Gauge,
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.seats.waiting.fetch_sub(1, Ordering::AcqRel);
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_are_capped_and_given_back() {
        let seats = CatchUpSeats::new(2);
        let gauge = Gauge::default();
        let a = seats.take(&gauge).expect("first");
        let b = seats.take(&gauge).expect("second");
        assert!(seats.take(&gauge).is_none(), "full");
        assert_eq!((seats.waiting(), gauge.get()), (2, 2));
        drop(a);
        let c = seats
            .take(&gauge)
            .expect("a seat given back is taken again");
        drop((b, c));
        assert_eq!((seats.waiting(), gauge.get()), (0, 0));
    }
}
