//! Several activators, one revision: each activator takes its own part of the revision's
//! pods, so a pod never gets more than containerConcurrency requests at once from all the
//! activators together (no coordination between them: each computes the same split from the
//! same inputs, the ready pods of the private EndpointSlices and the ready activators of
//! `activator-service`).
//!
//! The split ([`share`]), with `A` activators, `P` ready pods and containerConcurrency `cc`:
//! - `P >= A`: the pods are dealt out, pod `p` to activator `p mod A`: each pod has exactly one
//!   activator, which may send it `cc` at once (Knative's subsetting).
//! - `P < A`: activator `i` shares pod `i mod P` with the other activators dealt that pod, and
//!   the pod's `cc` is divided among them (the first `cc mod s` of the `s` sharers get one
//!   more): the shares of one pod add up to exactly `cc`. An activator whose share is 0 gets
//!   no pod at all and holds its requests; the autoscaler keeps at least ceil(A / cc) pods for
//!   an active revision, so every activator's share is at least 1 once those pods are ready.
//!
//! The deal is rotated by a hash of the revision, so single-pod revisions land on different
//! activators. containerConcurrency 0 (unlimited) and a single activator need no split.
//! While the activator set changes, activators that have not yet seen the change may briefly
//! disagree; the queue sidecar in each pod enforces containerConcurrency regardless.

use std::net::SocketAddr;
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::watch;
use tracing::Instrument;

use crate::platform::kubernetes::service_slices::ServiceEndpoints;
use crate::platform::{EndpointSnapshot, EndpointSource};
use crate::revision::{RevisionCatalog, RevisionKey};

/// The port name of `activator-service` whose endpoints are the activator set.
pub const ACTIVATOR_PORT: &str = "http";

/// This activator's part of a revision's ready pods (`ready` sorted): the pods it may use and,
/// when it shares them, its per-pod capacity (`None`: the whole containerConcurrency).
pub fn share(
    ready: &[SocketAddr],
    cc: u32,
    activators: &[SocketAddr],
    me: SocketAddr,
    revision: &RevisionKey,
) -> (Vec<SocketAddr>, Option<u32>) {
    let n_act = activators.len();
    let Some(index) = activators.iter().position(|a| *a == me) else {
        // Not (yet) in the set: act alone, as a single activator would.
        return (ready.to_vec(), None);
    };
    if n_act <= 1 || cc == 0 || ready.is_empty() {
        return (ready.to_vec(), None);
    }
    let rotated = (index + (fnv(revision) % n_act as u64) as usize) % n_act;
    let pods = ready.len();
    if pods >= n_act {
        let mine = ready
            .iter()
            .enumerate()
            .filter(|(p, _)| p % n_act == rotated)
            .map(|(_, a)| *a)
            .collect();
        return (mine, None);
    }
    let pod = rotated % pods;
    let sharers = (0..n_act).filter(|j| j % pods == pod).count() as u32;
    let rank = (rotated / pods) as u32;
    let part = cc / sharers + u32::from(rank < cc % sharers);
    if part == 0 {
        (Vec::new(), None)
    } else {
        (vec![ready[pod]], Some(part))
    }
}

/// FNV-1a of the revision key: the same on every activator (unlike the std hasher's seed).
fn fnv(key: &RevisionKey) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key
        .namespace
        .bytes()
        .chain(std::iter::once(b'/'))
        .chain(key.name.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// An [`EndpointSource`] that hands the activator its share of each revision's pods: the
/// platform's snapshots, split by [`share`] as the activator set and the revision's
/// containerConcurrency change. Terminating endpoints and the status pass through.
pub struct SharedEndpoints {
    inner: Arc<dyn EndpointSource>,
    activators: watch::Receiver<Arc<ServiceEndpoints>>,
    me: SocketAddr,
    catalog: Arc<RevisionCatalog>,
    channels: DashMap<RevisionKey, watch::Sender<Arc<EndpointSnapshot>>>,
}

impl SharedEndpoints {
    /// `me` is this activator's address as `activator-service`'s slices list it (port
    /// [`ACTIVATOR_PORT`]).
    pub fn new(
        inner: Arc<dyn EndpointSource>,
        activators: watch::Receiver<Arc<ServiceEndpoints>>,
        me: SocketAddr,
        catalog: Arc<RevisionCatalog>,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            activators,
            me,
            catalog,
            channels: DashMap::new(),
        })
    }

    fn split(&self, key: &RevisionKey, snap: &EndpointSnapshot) -> EndpointSnapshot {
        let cc = self
            .catalog
            .load()
            .get(key)
            .map_or(0, |s| s.container_concurrency);
        let set = self.activators.borrow().clone();
        let (ready, capacity) = share(&snap.ready, cc, set.port(ACTIVATOR_PORT), self.me, key);
        EndpointSnapshot {
            ready,
            terminating: snap.terminating.clone(),
            status: snap.status.clone(),
            capacity,
        }
    }
}

impl EndpointSource for Arc<SharedEndpoints> {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        if let Some(tx) = self.channels.get(revision) {
            return tx.subscribe();
        }
        let mut platform = self.inner.endpoints(revision);
        let first = Arc::new(self.split(revision, &platform.borrow_and_update()));
        let entry = self.channels.entry(revision.clone());
        let tx = match entry {
            dashmap::Entry::Occupied(o) => return o.get().subscribe(),
            dashmap::Entry::Vacant(v) => v.insert(watch::channel(first).0).clone(),
        };
        let rx = tx.subscribe();
        let me = self.clone();
        let key = revision.clone();
        let mut activators = self.activators.clone();
        let mut catalog = self.catalog.subscribe();
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        r = platform.changed() => if r.is_err() { return },
                        r = activators.changed() => if r.is_err() { return },
                        r = catalog.changed() => if r.is_err() { return },
                    }
                    let snap = platform.borrow_and_update().clone();
                    let next = me.split(&key, &snap);
                    tx.send_if_modified(|cur| {
                        if **cur == next {
                            false
                        } else {
                            *cur = Arc::new(next);
                            true
                        }
                    });
                }
            }
            .instrument(tracing::debug_span!("share", revision = %revision)),
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

    fn addrs(n: u16, base: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], base + i)))
            .collect()
    }

    /// Over many shapes: the activators' shares of every pod add up to exactly cc, and every
    /// activator gets a share of at least one once there are ceil(A / cc) pods.
    #[test]
    fn shares_of_a_pod_add_up_to_its_concurrency() {
        for a in 1..=5u16 {
            for p in 1..=7u16 {
                for cc in 1..=4u32 {
                    let acts = addrs(a, 8000);
                    let pods = addrs(p, 9000);
                    let key = RevisionKey::new("ns", format!("r-{a}-{p}-{cc}"));
                    let mut per_pod = std::collections::HashMap::new();
                    let mut served = 0;
                    for me in &acts {
                        let (mine, cap) = share(&pods, cc, &acts, *me, &key);
                        if !mine.is_empty() {
                            served += 1;
                        }
                        for pod in mine {
                            *per_pod.entry(pod).or_insert(0) += cap.unwrap_or(cc);
                        }
                    }
                    for (pod, total) in &per_pod {
                        assert!(*total <= cc, "a={a} p={p} cc={cc}: {pod} gets {total}");
                    }
                    if u32::from(p) >= u32::from(a).div_ceil(cc) {
                        assert_eq!(served, a, "a={a} p={p} cc={cc}: an activator without pods");
                    }
                    if a == 1 {
                        assert_eq!(per_pod.len(), usize::from(p));
                    }
                }
            }
        }
    }

    #[test]
    fn alone_or_unlimited_takes_every_pod() {
        let pods = addrs(3, 9000);
        let me = SocketAddr::from(([10, 0, 0, 1], 8000));
        let key = RevisionKey::new("ns", "r");
        assert_eq!(share(&pods, 1, &[me], me, &key), (pods.clone(), None));
        assert_eq!(
            share(&pods, 0, &addrs(3, 8000), me, &key),
            (pods.clone(), None)
        );
        let stranger = SocketAddr::from(([10, 0, 0, 9], 1));
        assert_eq!(
            share(&pods, 1, &addrs(3, 8000), stranger, &key),
            (pods, None)
        );
    }
}
