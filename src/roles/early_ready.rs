//! Pods the activator sends to before the kubelet marks them ready, as Knative's activator
//! does: a cold start on a cluster otherwise waits for the kubelet's next readiness probe
//! (period at least 1 s) and the EndpointSlice update after it, long after the queue sidecar
//! could answer.
//!
//! [`EarlyReady`] sits between the platform's endpoint snapshots and the activator's share of
//! them. A revision's *starting* endpoints (listed in its EndpointSlices with `ready: false`,
//! never ready before) are probed with `K-Network-Probe: queue` (the sidecar answers 200
//! `queue` once the user container passes its readiness probe; [`super::mesh::probe`]); one
//! that answers is added to the revision's ready endpoints at once.
//!
//! - **The kubelet still decides when a pod leaves.** A pod is probed only until the platform
//!   has seen it ready once; from then on only the platform's view counts, so a ready pod that
//!   fails its readiness probe leaves as before. A pod that answered leaves when its endpoint
//!   turns terminating or disappears, and when a re-probe (each [`REPROBE_EVERY`]) finds it no
//!   longer answering.
//! - **Bounded.** At most `pod-probe-budget` pods of a revision are probed at once (the
//!   others wait for a place; 0 turns early probing off), one probe per pod at a time, each
//!   bounded by [`super::mesh::PROBE_TIMEOUT`], and a pod that keeps not answering is probed
//!   less and less often ([`probe_interval`]).
//!
//! One task per revision the activator follows, as [`super::share::SharedEndpoints`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use dashmap::DashMap;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use super::mesh::{ProbeClient, ProbeResult, probe, probe_client};
use crate::platform::{EndpointSnapshot, EndpointSource};
use crate::revision::RevisionKey;

/// How often a pod that answered is probed again until the platform marks it ready.
pub const REPROBE_EVERY: Duration = Duration::from_secs(1);

/// How long after a pod was first probed it is probed again: every 25 ms for its first 10 s
/// (a sidecar's first answer is then seen within 25 ms), every 250 ms to a minute, then each
/// second (a slow starter costs one probe a second).
pub fn probe_interval(probing_for: Duration) -> Duration {
    if probing_for < Duration::from_secs(10) {
        Duration::from_millis(25)
    } else if probing_for < Duration::from_secs(60) {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    }
}

/// What [`EarlyReady`] counts.
#[derive(Clone, Default)]
pub struct EarlyReadyMetrics {
    /// Probes sent to pods that were not ready yet.
    pub probes: Counter,
    /// Pods sent to on their own answer, before the platform marked them ready.
    pub early: Counter,
}

/// An [`EndpointSource`] that adds the starting pods that answer their probe to each
/// revision's ready endpoints (module docs).
pub struct EarlyReady {
    inner: Arc<dyn EndpointSource>,
    /// `pod-probe-budget`, read at each decision (0: off).
    budget: Box<dyn Fn() -> u32 + Send + Sync>,
    client: ProbeClient,
    metrics: EarlyReadyMetrics,
    channels: DashMap<RevisionKey, watch::Sender<Arc<EndpointSnapshot>>>,
}

/// One starting pod being probed.
#[derive(Debug, Clone, Copy)]
struct Starting {
    /// When it was first seen starting.
    since: Instant,
    /// When its next probe is due.
    next: Instant,
    /// Its last probe was answered: it is sent to.
    answered: bool,
    /// A probe of it is in flight.
    probing: bool,
}

/// A revision's starting pods as the probes found them. Pure bookkeeping: the task does the
/// probing and the waiting.
#[derive(Debug, Default)]
struct Tracker {
    /// Pods the platform has listed as ready at some point (never probed again while listed).
    seen_ready: BTreeSet<SocketAddr>,
    pods: BTreeMap<SocketAddr, Starting>,
}

impl Tracker {
    /// Takes the platform's latest snapshot in: forgets pods that became ready, terminating or
    /// gone; starts tracking new starting ones.
    fn update(&mut self, snap: &EndpointSnapshot, now: Instant) {
        let listed = |a: &SocketAddr| {
            snap.ready.binary_search(a).is_ok()
                || snap.starting.binary_search(a).is_ok()
                || snap.terminating.contains(a)
        };
        self.seen_ready.extend(snap.ready.iter().copied());
        self.seen_ready.retain(listed);
        let seen = &self.seen_ready;
        self.pods
            .retain(|a, _| snap.starting.binary_search(a).is_ok() && !seen.contains(a));
        for a in &snap.starting {
            if !self.seen_ready.contains(a) {
                self.pods.entry(*a).or_insert(Starting {
                    since: now,
                    next: now,
                    answered: false,
                    probing: false,
                });
            }
        }
    }

    /// Probes in flight to pods not answering yet (what the budget bounds).
    fn busy(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p.probing && !p.answered)
            .count()
    }

    /// The pods to probe now, at most `budget` not-yet-answered ones probed at once (answered
    /// ones are re-probed outside the budget); marks them in flight.
    fn due(&mut self, budget: u32, now: Instant) -> Vec<SocketAddr> {
        let mut places = (budget as usize).saturating_sub(self.busy());
        let mut out = Vec::new();
        for (a, p) in &mut self.pods {
            if p.probing || p.next > now {
                continue;
            }
            if !p.answered {
                if places == 0 {
                    continue;
                }
                places -= 1;
            }
            p.probing = true;
            out.push(*a);
        }
        out
    }

    /// Records a probe's result; whether the pod's answered state changed.
    fn probed(&mut self, addr: SocketAddr, result: ProbeResult, now: Instant) -> bool {
        let Some(p) = self.pods.get_mut(&addr) else {
            return false;
        };
        p.probing = false;
        let answered = result == ProbeResult::Answered;
        let changed = answered != p.answered;
        p.answered = answered;
        p.next = now
            + if answered {
                REPROBE_EVERY
            } else {
                probe_interval(now.saturating_duration_since(p.since))
            };
        changed
    }

    /// When the next probe (of a pod not in flight) is due, if any may be sent: within the
    /// budget, or a re-probe.
    fn next_due(&self, budget: u32) -> Option<Instant> {
        let busy = self.busy();
        self.pods
            .values()
            .filter(|p| !p.probing && (p.answered || busy < budget as usize))
            .map(|p| p.next)
            .min()
    }

    /// `snap` with the answered pods added to its ready endpoints (and taken out of its
    /// starting ones).
    fn view(&self, snap: &EndpointSnapshot) -> EndpointSnapshot {
        let answered: BTreeSet<SocketAddr> = self
            .pods
            .iter()
            .filter(|(_, p)| p.answered)
            .map(|(a, _)| *a)
            .collect();
        if answered.is_empty() {
            return snap.clone();
        }
        let mut ready: BTreeSet<SocketAddr> = snap.ready.iter().copied().collect();
        ready.extend(answered.iter().copied());
        EndpointSnapshot {
            ready: ready.into_iter().collect(),
            terminating: snap.terminating.clone(),
            starting: snap
                .starting
                .iter()
                .filter(|a| !answered.contains(a))
                .copied()
                .collect(),
            status: snap.status.clone(),
            limit: snap.limit,
            reach_pending: snap.reach_pending,
            queue_proxy: snap.queue_proxy,
        }
    }
}

impl EarlyReady {
    pub fn new(
        inner: Arc<dyn EndpointSource>,
        budget: impl Fn() -> u32 + Send + Sync + 'static,
        metrics: EarlyReadyMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            budget: Box::new(budget),
            client: probe_client(),
            metrics,
            channels: DashMap::new(),
        })
    }

    /// Follows one revision: probes its starting pods and publishes the view.
    async fn run(
        self: Arc<Self>,
        mut platform: watch::Receiver<Arc<EndpointSnapshot>>,
        tx: watch::Sender<Arc<EndpointSnapshot>>,
    ) {
        let mut tracker = Tracker::default();
        let mut probes = FuturesUnordered::new();
        loop {
            let now = Instant::now();
            let snap = platform.borrow_and_update().clone();
            tracker.update(&snap, now);
            let budget = (self.budget)();
            for addr in tracker.due(budget, now) {
                self.metrics.probes.inc();
                let client = self.client.clone();
                probes.push(async move { (addr, probe(&client, addr).await) });
            }
            let next = tracker.view(&snap);
            tx.send_if_modified(|cur| {
                if **cur == next {
                    false
                } else {
                    *cur = Arc::new(next);
                    true
                }
            });
            let wake = tracker.next_due(budget);
            tokio::select! {
                r = platform.changed() => if r.is_err() { return },
                Some((addr, result)) = probes.next(), if !probes.is_empty() => {
                    let was = tracker.pods.get(&addr).is_some_and(|p| p.answered);
                    if tracker.probed(addr, result, Instant::now()) && !was {
                        self.metrics.early.inc();
                        tracing::debug!(%addr, "a starting pod answered its probe: sent to");
                    }
                }
                () = sleep_until(wake) => {}
            }
        }
    }
}

/// Sleeps until `at`, or forever when `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl EndpointSource for Arc<EarlyReady> {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        if let Some(tx) = self.channels.get(revision) {
            return tx.subscribe();
        }
        let mut platform = self.inner.endpoints(revision);
        let first = platform.borrow_and_update().clone();
        let tx = match self.channels.entry(revision.clone()) {
            dashmap::Entry::Occupied(o) => return o.get().subscribe(),
            dashmap::Entry::Vacant(v) => v.insert(watch::channel(first).0).clone(),
        };
        let rx = tx.subscribe();
        // The first pass reads the snapshot again.
        platform.mark_changed();
        tokio::spawn(
            self.clone()
                .run(platform, tx)
                .instrument(tracing::debug_span!("early_ready", revision = %revision)),
        );
        rx
    }

    fn drained(&self, revision: &RevisionKey, addr: SocketAddr) {
        self.inner.drained(revision, addr);
    }

    fn needs_drain_reports(&self) -> bool {
        self.inner.needs_drain_reports()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8012))
    }

    fn snap(ready: &[u8], starting: &[u8], terminating: &[u8]) -> EndpointSnapshot {
        let v = |x: &[u8]| x.iter().map(|l| a(*l)).collect::<Vec<_>>();
        EndpointSnapshot {
            ready: v(ready),
            starting: v(starting),
            terminating: v(terminating),
            ..EndpointSnapshot::default()
        }
    }

    #[test]
    fn an_answering_starting_pod_is_ready_until_the_platform_takes_over() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let s = snap(&[1], &[2, 3], &[]);
        t.update(&s, t0);
        assert_eq!(t.due(8, t0), [a(2), a(3)]);
        assert!(t.due(8, t0).is_empty(), "one probe per pod at a time");
        assert!(t.probed(a(2), ProbeResult::Answered, t0));
        assert!(!t.probed(a(3), ProbeResult::Other, t0));
        let v = t.view(&s);
        assert_eq!(v.ready, [a(1), a(2)]);
        assert_eq!(v.starting, [a(3)]);
        // The platform marks 2 ready, then it fails its readiness probe: starting again in
        // the platform's view, and not probed any more (the kubelet decides).
        t.update(&snap(&[1, 2], &[3], &[]), t0);
        t.update(&snap(&[1], &[2, 3], &[]), t0);
        assert_eq!(t.view(&snap(&[1], &[2, 3], &[])).ready, [a(1)]);
        assert!(!t.pods.contains_key(&a(2)));
        // An answered pod that turns terminating leaves at once.
        t.probed(a(3), ProbeResult::Answered, t0);
        assert!(t.view(&snap(&[1], &[3], &[])).ready.contains(&a(3)));
        t.update(&snap(&[1], &[], &[3]), t0);
        assert_eq!(t.view(&snap(&[1], &[], &[3])).ready, [a(1)]);
    }

    #[test]
    fn the_budget_bounds_pods_probed_at_once_and_zero_is_off() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let s = snap(&[], &[1, 2, 3, 4], &[]);
        t.update(&s, t0);
        assert!(t.due(0, t0).is_empty(), "off");
        assert_eq!(t.next_due(0), None, "nothing to wake for");
        assert_eq!(t.due(2, t0), [a(1), a(2)]);
        assert!(t.due(2, t0).is_empty(), "the budget is spent");
        // 1 answers: its re-probe is outside the budget, so 3 takes its place.
        t.probed(a(1), ProbeResult::Answered, t0);
        assert_eq!(t.due(2, t0), [a(3)]);
        // A re-probe that finds 1 no longer answering takes it out.
        let later = t0 + REPROBE_EVERY;
        assert_eq!(t.due(2, later), [a(1)]);
        assert!(t.probed(a(1), ProbeResult::MeshRefused, later));
        assert!(t.view(&s).ready.is_empty());
    }

    #[test]
    fn a_pod_that_keeps_not_answering_is_probed_less_often() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.update(&snap(&[], &[1], &[]), t0);
        t.due(1, t0);
        t.probed(a(1), ProbeResult::Other, t0);
        assert_eq!(t.next_due(1), Some(t0 + Duration::from_millis(25)));
        let late = t0 + Duration::from_secs(30);
        t.due(1, late);
        t.probed(a(1), ProbeResult::Other, late);
        assert_eq!(t.next_due(1), Some(late + Duration::from_millis(250)));
        let later = t0 + Duration::from_secs(90);
        t.due(1, later);
        t.probed(a(1), ProbeResult::Other, later);
        assert_eq!(t.next_due(1), Some(later + Duration::from_secs(1)));
    }
}
