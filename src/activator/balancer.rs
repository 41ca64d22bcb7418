//! Endpoint choice by containerConcurrency (Knative's `activator/net/lb_policy.go`).
//!
//! | containerConcurrency | policy | why |
//! |---|---|---|
//! | 0 | random choice of two by in-flight count | no per-pod limit; spreads load, O(1) |
//! | 1-3 | first available, in address order | packs pods so low-cc pods stay warm and spare pods can go |
//! | > 3 | round-robin over endpoints with a free slot | even spread, O(1) on average |
//!
//! A pick *reserves* a slot ([`Endpoint::try_reserve`]), so the choice and the accounting cannot
//! race. Every policy falls back to a full scan before answering `None`, so `None` means that no
//! endpoint it may use had room at that moment — the throttler's wake-up logic relies on it.
//!
//! Ejected endpoints ([`Endpoint::is_ejected`]: a recent failed connect) are passed over while
//! the set has any endpoint that is not ejected, even a full one (the request then waits for a
//! slot on it rather than failing a connect); if every endpoint is ejected, the pick is made
//! among them all as if none were. When an ejection ends, the throttler dispatches its held
//! requests again (`Throttler::dispatch_after`), so a request queued meanwhile can take it.
//!
//! Costs: random-choice-of-two and round-robin are O(1) expected (round-robin scans from where
//! the last pick ended, so at half occupancy it looks at ~2 endpoints). First-available is O(n)
//! in the worst case: with every endpoint but the last one full it reads all n in-flight counts
//! (about 1-2 ns each, so ~1-2 µs at 1,000 endpoints). It is only used for cc <= 3, where packing
//! is the point.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use rand::Rng;

use super::endpoint::Endpoint;

/// Which endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// containerConcurrency 0.
    RandomChoiceOfTwo,
    /// containerConcurrency 1-3.
    FirstAvailable,
    /// containerConcurrency > 3.
    RoundRobin,
}

impl Policy {
    /// The policy Knative uses for `container_concurrency`.
    pub fn for_concurrency(container_concurrency: u32) -> Self {
        match container_concurrency {
            0 => Policy::RandomChoiceOfTwo,
            1..=3 => Policy::FirstAvailable,
            _ => Policy::RoundRobin,
        }
    }
}

/// A policy plus the little state it keeps (the round-robin cursor). Cheap to share.
#[derive(Debug)]
pub struct Balancer {
    policy: Policy,
    /// Round-robin: where the next scan starts. Racy on purpose (two pickers may start at the
    /// same place); reservation is atomic, so a race costs one extra probe, never a double slot.
    next: AtomicUsize,
}

impl Balancer {
    /// A balancer for `policy` (round-robin starts at the first endpoint).
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            next: AtomicUsize::new(0),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Picks an endpoint of `endpoints` and reserves one slot on it; `None` when none has room.
    /// `endpoints` must be sorted by address (first-available depends on it).
    #[inline]
    pub fn pick<'a, E: Deref<Target = Endpoint>>(&self, endpoints: &'a [E]) -> Option<&'a E> {
        let picked = self.pick_among(endpoints, Skip::Ejected);
        if picked.is_none() && !endpoints.is_empty() && endpoints.iter().all(|e| e.is_ejected()) {
            return self.pick_among(endpoints, Skip::Nothing);
        }
        picked
    }

    #[inline]
    fn pick_among<'a, E: Deref<Target = Endpoint>>(
        &self,
        endpoints: &'a [E],
        skip: Skip,
    ) -> Option<&'a E> {
        match self.policy {
            Policy::RandomChoiceOfTwo => random_choice_of_two(endpoints, skip),
            Policy::FirstAvailable => first_available(endpoints, skip),
            Policy::RoundRobin => self.round_robin(endpoints, skip),
        }
    }

    fn round_robin<'a, E: Deref<Target = Endpoint>>(
        &self,
        endpoints: &'a [E],
        skip: Skip,
    ) -> Option<&'a E> {
        let n = endpoints.len();
        if n == 0 {
            return None;
        }
        let start = self.next.load(Relaxed) % n;
        for k in 0..n {
            let i = if start + k >= n {
                start + k - n
            } else {
                start + k
            };
            let e = &endpoints[i];
            if skip.has_room(e) && e.try_reserve() {
                self.next.store(i + 1, Relaxed);
                return Some(e);
            }
        }
        None
    }
}

/// Which endpoints a pass of a policy leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// Ejected endpoints (the first pass).
    Ejected,
    /// None (every endpoint is ejected).
    Nothing,
}

impl Skip {
    /// Whether `e` looks free and is not left out.
    #[inline]
    fn has_room(self, e: &Endpoint) -> bool {
        e.has_room() && !(self == Skip::Ejected && e.is_ejected())
    }

    /// Reserves a slot on `e` unless it is left out.
    #[inline]
    fn try_reserve(self, e: &Endpoint) -> bool {
        !(self == Skip::Ejected && e.is_ejected()) && e.try_reserve()
    }
}

/// The first endpoint, in address order, with a free slot.
fn first_available<E: Deref<Target = Endpoint>>(endpoints: &[E], skip: Skip) -> Option<&E> {
    endpoints
        .iter()
        .find(|e| skip.has_room(e) && e.try_reserve())
}

/// Two distinct random endpoints; the one with fewer in flight wins (a coin flip on ties). If
/// neither can take the request (warm-up limits), any endpoint with room does.
fn random_choice_of_two<E: Deref<Target = Endpoint>>(endpoints: &[E], skip: Skip) -> Option<&E> {
    let n = endpoints.len();
    match n {
        0 => return None,
        1 => return skip.try_reserve(&endpoints[0]).then(|| &endpoints[0]),
        _ => {}
    }
    let r = rand::rng().next_u64();
    // Lemire's multiply-shift maps 32 random bits onto 0..n without a division.
    let i = (((r & 0xffff_ffff) * n as u64) >> 32) as usize;
    let mut j = (((r >> 32) * (n as u64 - 1)) >> 32) as usize;
    if j >= i {
        j += 1;
    }
    let (a, b) = (&endpoints[i], &endpoints[j]);
    let (fa, fb) = (a.in_flight(), b.in_flight());
    let a_first = fa < fb || (fa == fb && r & 1 == 0);
    let (first, second) = if a_first { (a, b) } else { (b, a) };
    if skip.try_reserve(first) {
        return Some(first);
    }
    if skip.try_reserve(second) {
        return Some(second);
    }
    // Both are at a warm-up limit, terminating or ejected: scan from the first choice onward.
    (0..n)
        .map(|k| &endpoints[(i + k) % n])
        .find(|e| skip.has_room(e) && e.try_reserve())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activator::endpoint::UNLIMITED;
    use std::sync::Arc;

    fn endpoints(n: u16, limit: u32) -> Vec<Arc<Endpoint>> {
        (0..n)
            .map(|p| Arc::new(Endpoint::new(([127, 0, 0, 1], 1000 + p).into(), limit)))
            .collect()
    }

    fn port(e: &Endpoint) -> u16 {
        e.addr().port() - 1000
    }

    #[test]
    fn policy_follows_container_concurrency() {
        assert_eq!(Policy::for_concurrency(0), Policy::RandomChoiceOfTwo);
        assert_eq!(Policy::for_concurrency(1), Policy::FirstAvailable);
        assert_eq!(Policy::for_concurrency(3), Policy::FirstAvailable);
        assert_eq!(Policy::for_concurrency(4), Policy::RoundRobin);
    }

    #[test]
    fn first_available_packs_in_address_order() {
        let eps = endpoints(3, 2);
        let b = Balancer::new(Policy::FirstAvailable);
        let picks: Vec<u16> = (0..6).map(|_| port(b.pick(&eps).unwrap())).collect();
        assert_eq!(picks, [0, 0, 1, 1, 2, 2]);
        assert!(b.pick(&eps).is_none(), "all full");
        eps[1].release();
        assert_eq!(port(b.pick(&eps).unwrap()), 1, "the freed slot is found");
    }

    #[test]
    fn round_robin_rotates_and_skips_full_endpoints() {
        let eps = endpoints(4, 5);
        let b = Balancer::new(Policy::RoundRobin);
        let picks: Vec<u16> = (0..8).map(|_| port(b.pick(&eps).unwrap())).collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
        for _ in 0..3 {
            assert!(eps[2].try_reserve()); // endpoint 2 is now full (5)
        }
        let picks: Vec<u16> = (0..6).map(|_| port(b.pick(&eps).unwrap())).collect();
        assert!(!picks.contains(&2), "{picks:?}");
        let total: u32 = eps.iter().map(|e| e.in_flight()).sum();
        assert_eq!(total, 8 + 3 + 6);
    }

    #[test]
    fn random_choice_of_two_prefers_the_less_loaded() {
        let eps = endpoints(2, UNLIMITED);
        for _ in 0..10 {
            assert!(eps[0].try_reserve());
        }
        let b = Balancer::new(Policy::RandomChoiceOfTwo);
        for _ in 0..10 {
            assert_eq!(port(b.pick(&eps).unwrap()), 1);
        }
        // Now equal: both get picked over many tries (coin flip on ties).
        let mut seen = [0u32; 2];
        for _ in 0..200 {
            let e = b.pick(&eps).unwrap();
            seen[port(e) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        let (a, c) = (eps[0].in_flight(), eps[1].in_flight());
        assert!(a.abs_diff(c) <= 2, "loads stay balanced: {a} vs {c}");
    }

    #[test]
    fn random_choice_of_two_falls_back_to_any_endpoint_with_room() {
        let eps = endpoints(50, UNLIMITED);
        for e in &eps {
            e.set_limit(0, true);
        }
        eps[37].set_limit(1, true);
        let b = Balancer::new(Policy::RandomChoiceOfTwo);
        assert_eq!(port(b.pick(&eps).unwrap()), 37);
        assert!(b.pick(&eps).is_none());
    }

    #[test]
    fn ejected_endpoints_are_passed_over_unless_all_are() {
        for p in [
            Policy::RandomChoiceOfTwo,
            Policy::FirstAvailable,
            Policy::RoundRobin,
        ] {
            let b = Balancer::new(p);
            let eps = endpoints(4, 2);
            eps[0].connect_failed().unwrap();
            eps[2].connect_failed().unwrap();
            let mut seen = Vec::new();
            while let Some(e) = b.pick(&eps) {
                seen.push(port(e));
            }
            seen.sort();
            // Both slots of each live endpoint, none of the ejected while those have room; then,
            // with the live ones full, nothing (the request waits for a live slot).
            assert_eq!(seen, [1, 1, 3, 3], "{p:?}");
            // All ejected: picked as if none were.
            let eps = endpoints(2, 1);
            for e in &eps {
                e.connect_failed().unwrap();
            }
            let mut seen: Vec<u16> = std::iter::from_fn(|| b.pick(&eps).map(|e| port(e))).collect();
            seen.sort();
            assert_eq!(seen, [0, 1], "{p:?}");
        }
    }

    #[test]
    fn no_endpoints_no_pick_and_terminating_gets_nothing() {
        for p in [
            Policy::RandomChoiceOfTwo,
            Policy::FirstAvailable,
            Policy::RoundRobin,
        ] {
            let b = Balancer::new(p);
            assert!(b.pick::<Arc<Endpoint>>(&[]).is_none());
            let eps = endpoints(1, 10);
            eps[0].terminate();
            assert!(b.pick(&eps).is_none(), "{p:?}");
        }
    }
}
