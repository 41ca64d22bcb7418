//! Activator subsetting (Knative's): each revision's public slices, while the activators front
//! it, list only a subset of the ready activators, so one activator joining or leaving
//! rewrites only the slices of the revisions whose subset it enters or leaves.
//!
//! - **Size** ([`num_activators`]): Knative's `numActivators`: 2 when target-burst-capacity
//!   is 0; otherwise enough activators to cover the ready pods' capacity and the burst
//!   capacity at `activator-capacity` each, at least 2.
//! - **Choice** ([`choose_subset`]): Knative's `ChooseSubset`: the activators are placed on a
//!   ring by a hash salted by the revision; a walk that starts and steps by two more
//!   revision hashes picks the first free activator at or after each angle. The walk for
//!   `n + 1` extends the walk for `n`, and an activator that is not picked changes no pick,
//!   so an activator joining or leaving moves only the subsets it is in. Knative's ring has
//!   2,048 angles and rehashes a name whose angle is taken, so a joining activator can move
//!   another's angle (about 1 revision in 200 with 10 activators); thaw's ring is the whole
//!   64-bit hash, where two names on one angle are ordered by name.
//! - **Place** ([`Place`], [`super::share::next_place`]): each activator learns from the
//!   revision's public slices whether it is listed, its index among the listed activators
//!   (sorted) and their count (Knative's `inferIndex`), and takes its part of the pods.
//!
//! An activator is identified by its `http` port's address as activator-service lists it
//! (`ip:port`; on a cluster each activator has its own IP, in a test on one host they may
//! share one).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use crate::config::AutoscalingSpec;
use crate::revision::RevisionKey;

use super::serving::Backend;
use super::share::ACTIVATOR_PORT;

/// The fewest activators in a subset (Knative's `minActivators`).
pub const MIN_ACTIVATORS: usize = 2;

/// How many activators front a revision with `ready` ready pods (Knative's `numActivators`):
/// target-burst-capacity 0 → 2; otherwise max(2, ceil((ready × total value + max(TBC, 0)) /
/// activator-capacity)). A negative TBC (-1: the activators always stay) adds nothing.
pub fn num_activators(spec: &AutoscalingSpec, ready: usize) -> usize {
    let tbc = spec.target_burst_capacity;
    if tbc == 0.0 {
        return MIN_ACTIVATORS;
    }
    let cover = ready as f64 * spec.total_value + tbc.max(0.0);
    let per = spec.activator_capacity.max(1.0);
    let n = (cover / per).ceil();
    if n.is_finite() && n < usize::MAX as f64 {
        (n as usize).max(MIN_ACTIVATORS)
    } else {
        usize::MAX
    }
}

/// FNV-1a, 64 bits, over `parts` in order, then MurmurHash3's 64-bit finalizer: FNV alone
/// keeps the order of names that differ in a few bytes nearly the same for every revision, so
/// one activator would front far more revisions than another.
fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The indices into `from` (distinct names) of the `n` chosen for `target`: all of them when
/// `n >= from.len()`. The result depends on the set of names, not their order.
pub fn choose_subset(from: &[String], n: usize, target: &str) -> BTreeSet<usize> {
    if n >= from.len() {
        return (0..from.len()).collect();
    }
    let start = fnv64(&[target.as_bytes(), b"start-angle-salt"]);
    let step = fnv64(&[target.as_bytes(), b"step-angle-salt"]);
    // Each name's angle on the whole 64-bit ring, salted by the target (ties, which are
    // practically never, go by name).
    let mut ring: Vec<(u64, &str, usize)> = from
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (
                fnv64(&[name.as_bytes(), target.as_bytes()]),
                name.as_str(),
                i,
            )
        })
        .collect();
    ring.sort_unstable();
    let mut picked = vec![false; ring.len()];
    let mut out = BTreeSet::new();
    let mut angle = start;
    while out.len() < n {
        let mut at = ring.partition_point(|(a, _, _)| *a < angle);
        if at == ring.len() {
            at = 0;
        }
        while picked[at] {
            at = (at + 1) % ring.len();
        }
        picked[at] = true;
        out.insert(ring[at].2);
        angle = angle.wrapping_add(step);
    }
    out
}

/// The salt of a revision's subset.
fn target(key: &RevisionKey) -> String {
    format!("{}/{}", key.namespace, key.name)
}

/// A backend's identity: its `http` address (`None`: no `http` port).
fn identity(b: &Backend) -> Option<SocketAddr> {
    b.1.get(ACTIVATOR_PORT).map(|p| SocketAddr::new(b.0, *p))
}

/// The activators' backends (one per activator, as [`super::serving::backends`] builds them
/// in Proxy mode) that front `key` with `n` activators.
pub fn pick(backends: Vec<Backend>, n: usize, key: &RevisionKey) -> Vec<Backend> {
    if n >= backends.len() {
        return backends;
    }
    let names: Vec<String> = backends
        .iter()
        .map(|b| match identity(b) {
            Some(a) => a.to_string(),
            None => b.0.to_string(),
        })
        .collect();
    let chosen = choose_subset(&names, n, &target(key));
    backends
        .into_iter()
        .enumerate()
        .filter(|(i, _)| chosen.contains(i))
        .map(|(_, b)| b)
        .collect()
}

/// Where an activator stands in a revision's subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Its position among the listed activators, sorted by address.
    pub index: usize,
    /// How many activators are listed.
    pub of: usize,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("10.0.{}.{}:8012", i / 200, i % 200 + 1))
            .collect()
    }

    fn spec(tbc: f64, total: f64, cap: f64) -> AutoscalingSpec {
        AutoscalingSpec {
            target_burst_capacity: tbc,
            total_value: total,
            activator_capacity: cap,
            ..AutoscalingSpec::default()
        }
    }

    #[test]
    fn the_subset_size_is_knatives() {
        // TBC 0: two.
        assert_eq!(num_activators(&spec(0.0, 100.0, 100.0), 50), 2);
        // Defaults (TBC 211, total 100, capacity 100): ceil(2.11) = 3 at zero pods.
        assert_eq!(num_activators(&spec(211.0, 100.0, 100.0), 0), 3);
        assert_eq!(num_activators(&spec(211.0, 100.0, 100.0), 1), 4);
        assert_eq!(num_activators(&spec(211.0, 100.0, 100.0), 10), 13);
        // cc 1: the pods add little.
        assert_eq!(num_activators(&spec(211.0, 1.0, 100.0), 1), 3);
        // TBC -1: the pods alone, at least two.
        assert_eq!(num_activators(&spec(-1.0, 100.0, 100.0), 0), 2);
        assert_eq!(num_activators(&spec(-1.0, 100.0, 100.0), 5), 5);
        assert_eq!(num_activators(&spec(-1.0, 100.0, 1000.0), 5), 2);
    }

    #[test]
    fn a_subset_has_the_size_asked_and_ignores_order() {
        let from = names(10);
        for n in 0..=12 {
            let s = choose_subset(&from, n, "ns/r");
            assert_eq!(s.len(), n.min(10));
            let mut rev = from.clone();
            rev.reverse();
            let back: BTreeSet<&String> = choose_subset(&rev, n, "ns/r")
                .iter()
                .map(|i| &rev[*i])
                .collect();
            let fwd: BTreeSet<&String> = s.iter().map(|i| &from[*i]).collect();
            assert_eq!(fwd, back, "n={n}");
        }
    }

    #[test]
    fn a_larger_subset_contains_the_smaller() {
        let from = names(20);
        for r in 0..200 {
            let t = format!("ns/r-{r}");
            for n in 1..20 {
                let small = choose_subset(&from, n, &t);
                let big = choose_subset(&from, n + 1, &t);
                assert!(small.is_subset(&big), "{t} n={n}");
            }
        }
    }

    /// One activator joining (10 → 11) or leaving changes exactly the subsets it is in.
    #[test]
    fn a_joining_or_leaving_activator_moves_only_its_subsets() {
        let ten = names(10);
        let mut eleven = ten.clone();
        eleven.push("10.0.9.9:8012".into());
        let pick_names = |from: &[String], t: &str| -> BTreeSet<String> {
            choose_subset(from, 3, t)
                .into_iter()
                .map(|i| from[i].clone())
                .collect()
        };
        let (mut moved, mut joined) = (0, 0);
        for r in 0..1000 {
            let t = format!("ns/r-{r}");
            let before = pick_names(&ten, &t);
            let after = pick_names(&eleven, &t);
            if before != after {
                moved += 1;
            }
            if after.contains("10.0.9.9:8012") {
                joined += 1;
                assert_eq!(after.len(), 3);
            }
            assert_eq!(
                before != after,
                after.contains("10.0.9.9:8012"),
                "{t}: a subset changed without the new activator in it"
            );
            // Leaving: the reverse.
            let mut without_first = ten.clone();
            let gone = without_first.remove(0);
            let left = pick_names(&without_first, &t);
            assert_eq!(before != left, before.contains(&gone), "{t}");
        }
        assert_eq!(moved, joined);
        // About 3 / 11 of the revisions (273).
        assert!((223..323).contains(&joined), "{joined} of 1000 joined");
    }

    /// Over many revisions the subsets spread over the activators.
    #[test]
    fn subsets_spread_over_the_activators() {
        let from = names(10);
        let mut count = vec![0usize; 10];
        for r in 0..3000 {
            for i in choose_subset(&from, 2, &format!("ns/r-{r}")) {
                count[i] += 1;
            }
        }
        // 600 each on average (a binomial's spread is about ±25).
        for c in &count {
            assert!((500..700).contains(c), "{count:?}");
        }
    }

    #[test]
    fn pick_keeps_n_backends_and_the_same_ones() {
        let b = |ip: [u8; 4], port: u16| -> Backend {
            (
                std::net::IpAddr::from(ip),
                BTreeMap::from([(ACTIVATOR_PORT.to_string(), port)]),
            )
        };
        let all: Vec<Backend> = (1..=6).map(|i| b([10, 0, 0, i], 8012)).collect();
        let key = RevisionKey::new("ns", "r");
        let two = pick(all.clone(), 2, &key);
        assert_eq!(two.len(), 2);
        assert_eq!(pick(all.clone(), 2, &key), two);
        assert_eq!(pick(all.clone(), 9, &key), all);
        // Activators sharing an IP (a test on one host) are told apart by port.
        let shared: Vec<Backend> = (1..=6).map(|p| b([127, 0, 0, 1], 9000 + p)).collect();
        assert_eq!(pick(shared, 3, &key).len(), 3);
    }
}
