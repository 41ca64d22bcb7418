//! One upstream endpoint as the throttler and balancer see it: its address, its in-flight count
//! and its current limit, all atomics so picking and releasing never take a lock.
//!
//! **Ejection.** An endpoint that refused or timed out a connect is passed over by the balancer
//! for a while ([`Endpoint::connect_failed`]): 1 s after the first failure, doubling with each
//! failure that follows an ejection's end, up to 30 s; a successful connect clears it. The
//! platform removes a dead replica's endpoint in time, but until it does (a Kubernetes
//! Endpoints update takes a second or more, a blackholed node much longer) every request that
//! picked it would pay a failed connect (up to `connect-timeout`) before its retry elsewhere.
//! Ejected endpoints are only passed over while the revision has an endpoint that is not
//! ejected; when all are, picks use them as before (Envoy's panic threshold at 100 %), so an
//! ejection never holds a request that an endpoint could take.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use tokio::time::Instant;

use http::HeaderValue;
use http::uri::Authority;

/// The limit of an endpoint without one (containerConcurrency 0 after warm-up).
pub const UNLIMITED: u32 = u32::MAX;

/// How long a first failed connect ejects an endpoint; each later ejection doubles it.
pub const EJECT_BASE: Duration = Duration::from_secs(1);
/// The longest ejection.
pub const EJECT_MAX: Duration = Duration::from_secs(30);

/// Milliseconds on a process-wide monotonic clock, never 0 (0 means "not ejected").
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// An endpoint's live accounting. Shared (`Arc`) between every endpoint set that lists it, so
/// counts survive snapshot updates.
///
/// Orderings are `SeqCst` on purpose: [`Endpoint::try_reserve`] and the throttler's
/// terminate/release paths form store-then-load pairs (Dekker style) whose correctness needs a
/// single total order — a request is never admitted to an endpoint after the platform was told
/// it drained.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    /// `addr` as a URI authority and a Host value, formatted once.
    authority: Authority,
    host: HeaderValue,
    in_flight: AtomicU32,
    /// The most requests this endpoint may have in flight: containerConcurrency, a warm-up
    /// burst, or [`UNLIMITED`].
    limit: AtomicU32,
    /// Set while the endpoint is in a warm-up burst (containerConcurrency 0 only).
    warming: AtomicBool,
    /// Set when the endpoint left `ready` (terminating or gone): nothing new is admitted.
    terminating: AtomicBool,
    /// Set once the platform was told this terminating endpoint drained (told at most once per
    /// termination).
    drained_told: AtomicBool,
    /// Ejections since the last successful connect (sets the next ejection's length).
    ejections: AtomicU32,
    /// Until when (`now_ms`) the endpoint is ejected; 0 when it is not.
    ejected_until: AtomicU64,
}

impl Endpoint {
    /// A ready endpoint with `limit` slots (`UNLIMITED` for none).
    pub fn new(addr: SocketAddr, limit: u32) -> Self {
        let text = addr.to_string();
        Self {
            addr,
            authority: Authority::try_from(text.as_str())
                .expect("a socket address is an authority"),
            host: HeaderValue::try_from(text).expect("a socket address is a header value"),
            in_flight: AtomicU32::new(0),
            limit: AtomicU32::new(limit),
            warming: AtomicBool::new(false),
            terminating: AtomicBool::new(false),
            drained_told: AtomicBool::new(false),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
        }
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as a URI authority (`127.0.0.1:8080`, `[::1]:8080`).
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The address as a `Host` header value.
    pub fn host_value(&self) -> &HeaderValue {
        &self.host
    }

    /// Requests in flight to this endpoint now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(SeqCst)
    }

    /// The current limit (`UNLIMITED` for none).
    pub fn limit(&self) -> u32 {
        self.limit.load(SeqCst)
    }

    /// Whether a slot looks free (a hint; [`Endpoint::try_reserve`] decides).
    #[inline]
    pub fn has_room(&self) -> bool {
        self.in_flight.load(SeqCst) < self.limit.load(SeqCst)
    }

    /// Takes one slot if the endpoint is below its limit and not terminating. Lock-free; the
    /// caller owns the slot and must give it back with [`Endpoint::release`] (the throttler's
    /// `InFlight` guard does).
    #[inline]
    pub fn try_reserve(&self) -> bool {
        let limit = self.limit.load(SeqCst);
        let taken = if limit == UNLIMITED {
            self.in_flight.fetch_add(1, SeqCst);
            true
        } else {
            self.in_flight
                .fetch_update(SeqCst, SeqCst, |n| (n < limit).then_some(n + 1))
                .is_ok()
        };
        if !taken {
            return false;
        }
        // Checked after the increment: see the type's doc on ordering.
        if self.terminating.load(SeqCst) {
            self.release();
            return false;
        }
        true
    }

    /// Gives one slot back. Returns true when this made a terminating endpoint idle and the
    /// platform has not been told yet (the caller tells it).
    #[inline]
    pub fn release(&self) -> bool {
        let before = self.in_flight.fetch_sub(1, SeqCst);
        before == 1 && self.terminating.load(SeqCst) && !self.drained_told.swap(true, SeqCst)
    }

    /// Marks the endpoint as leaving. Returns true when it is already idle and the platform has
    /// not been told yet (the caller tells it).
    pub fn terminate(&self) -> bool {
        self.terminating.store(true, SeqCst);
        self.in_flight.load(SeqCst) == 0 && !self.drained_told.swap(true, SeqCst)
    }

    /// Stops new admissions without ever reporting it drained (the endpoint vanished from the
    /// snapshot altogether; the platform did not ask).
    pub fn retire(&self) {
        self.drained_told.store(true, SeqCst);
        self.terminating.store(true, SeqCst);
    }

    /// Returns a terminating endpoint to service (it came back to `ready`).
    pub fn revive(&self) {
        self.terminating.store(false, SeqCst);
        self.drained_told.store(false, SeqCst);
    }

    /// Whether the endpoint left `ready`.
    pub fn is_terminating(&self) -> bool {
        self.terminating.load(SeqCst)
    }

    /// Records a failed connect. Ejects the endpoint unless it already is (requests that picked
    /// it before the ejection fail too; they do not lengthen it) and returns the ejection's
    /// length: [`EJECT_BASE`] doubled per earlier ejection since the last successful connect,
    /// at most [`EJECT_MAX`].
    pub fn connect_failed(&self) -> Option<Duration> {
        let now = now_ms();
        let until = self.ejected_until.load(SeqCst);
        if until > now {
            return None;
        }
        let earlier = self.ejections.load(SeqCst).min(5);
        let length = EJECT_BASE.saturating_mul(1 << earlier).min(EJECT_MAX);
        // One of several failures seen at once wins; the others find it ejected.
        self.ejected_until
            .compare_exchange(until, now + length.as_millis() as u64, SeqCst, SeqCst)
            .ok()?;
        self.ejections.fetch_add(1, SeqCst);
        Some(length)
    }

    /// Records a successful connect: the endpoint is no longer ejected and the next ejection
    /// starts again at [`EJECT_BASE`]. Costs one load when there is nothing to clear.
    pub fn connect_succeeded(&self) {
        if self.ejections.load(Relaxed) != 0 || self.ejected_until.load(Relaxed) != 0 {
            self.ejected_until.store(0, SeqCst);
            self.ejections.store(0, SeqCst);
        }
    }

    /// Whether the endpoint is ejected now. One load when it is not.
    #[inline]
    pub fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Relaxed);
        if until == 0 {
            return false;
        }
        if now_ms() < until {
            return true;
        }
        // Ran out: cleared, so later picks pay one load again instead of reading the clock (the
        // count stays and sets the next ejection's length until a connect succeeds).
        let _ = self
            .ejected_until
            .compare_exchange(until, 0, SeqCst, SeqCst);
        false
    }

    /// Sets the limit; `warming` marks a containerConcurrency-0 warm-up burst that
    /// [`Endpoint::end_warm_up`] lifts later.
    pub fn set_limit(&self, limit: u32, warming: bool) {
        self.warming.store(warming, SeqCst);
        self.limit.store(limit, SeqCst);
    }

    /// Whether a containerConcurrency-0 warm-up limit is in force.
    pub fn is_warming(&self) -> bool {
        self.warming.load(SeqCst)
    }

    /// Lifts a warm-up burst limit (no-op when not warming).
    pub fn end_warm_up(&self) {
        if self.warming.swap(false, SeqCst) {
            self.limit.store(UNLIMITED, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(limit: u32) -> Endpoint {
        Endpoint::new("127.0.0.1:1".parse().unwrap(), limit)
    }

    #[test]
    fn reserve_respects_limit_and_release_gives_back() {
        let e = ep(2);
        assert!(e.try_reserve());
        assert!(e.try_reserve());
        assert!(!e.try_reserve());
        assert!(!e.release());
        assert!(e.try_reserve());
        assert_eq!(e.in_flight(), 2);
    }

    #[test]
    fn terminating_admits_nothing_and_reports_drained_once() {
        let e = ep(UNLIMITED);
        assert!(e.try_reserve());
        assert!(!e.terminate(), "one in flight: not drained yet");
        assert!(!e.try_reserve());
        assert!(e.release(), "last one out reports drained");
        assert!(!e.terminate(), "told only once");
    }

    #[test]
    fn idle_endpoint_drains_at_terminate_and_retired_never_reports() {
        assert!(ep(1).terminate());
        let e = ep(1);
        assert!(e.try_reserve());
        e.retire();
        assert!(!e.release());
    }

    #[test]
    fn a_failed_connect_ejects_and_repeats_double_up_to_the_cap() {
        let e = ep(UNLIMITED);
        assert!(!e.is_ejected());
        assert_eq!(e.connect_failed(), Some(EJECT_BASE));
        assert!(e.is_ejected());
        // Failures of requests that picked it before do not lengthen the ejection.
        assert_eq!(e.connect_failed(), None);
        let mut lengths = Vec::new();
        for _ in 0..7 {
            e.ejected_until.store(now_ms(), SeqCst); // the ejection ran out
            assert!(!e.is_ejected());
            assert_eq!(
                e.ejected_until.load(SeqCst),
                0,
                "cleared once seen to have run out"
            );
            lengths.push(e.connect_failed().unwrap().as_secs());
        }
        assert_eq!(lengths, [2, 4, 8, 16, 30, 30, 30]);
        e.connect_succeeded();
        assert!(!e.is_ejected());
        assert_eq!(
            e.connect_failed(),
            Some(EJECT_BASE),
            "a success starts over"
        );
    }

    #[test]
    fn warm_up_limit_lifts() {
        let e = ep(UNLIMITED);
        e.set_limit(1, true);
        assert!(e.try_reserve());
        assert!(!e.try_reserve());
        e.end_warm_up();
        assert!(e.try_reserve());
        assert_eq!(e.limit(), UNLIMITED);
    }
}
