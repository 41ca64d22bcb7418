//! Several activators, one revision: each activator the revision's public slices list (its
//! subset, [`super::subset`]) takes its own part of the revision's pods, so that together
//! they send a pod no more than containerConcurrency at once when there are enough pods.
//!
//! The split ([`share`]), for the activator at index `i` of the `n` listed and `P` ready pods:
//! - `P >= n`: the pods are dealt out, pod `p` to the activator `(p + h) mod n` (`h` a hash
//!   of the revision, so single-pod shapes land on different activators): each pod has
//!   exactly one activator, which may send it containerConcurrency at once.
//! - `P < n`: every listed activator takes every pod at the whole containerConcurrency, and
//!   the pods are overcommitted (Knative's assignment); the queue sidecar in each pod holds
//!   what exceeds containerConcurrency in its bounded queue (`THAW_QUEUE_DEPTH`).
//! - Not listed: the activator keeps the place it last had (a gateway that has not seen the
//!   new subset may still send it a request, which is served, not held); one never listed
//!   takes every pod, as a lone activator does (Knative's index -1). A listing that includes
//!   the revision's pods (served by them, or a swap under way: slices are written and deleted
//!   one by one) says nothing about the subset and keeps the last place too.
//! - containerConcurrency 0 (unlimited) or one activator: every pod.
//!
//! While the subsets change, activators that have not yet seen the change may briefly
//! disagree; the queue sidecar in each pod enforces containerConcurrency regardless.

use std::net::SocketAddr;
use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::watch;
use tracing::Instrument;

use crate::platform::{EndpointSnapshot, EndpointSource};
use crate::revision::{RevisionCatalog, RevisionKey};

use super::mesh::{Mesh, ProbeClient, Reach, detect, probe_client, through_service};
use super::serving::Backend;
use super::subset::Place;
use crate::config::network::MeshMode;
use crate::platform::kubernetes::{PORT_NAME_HTTP, PORT_NAME_HTTP2};
use crate::revision::Protocol;

/// How long an `auto` revision whose probes decided nothing waits before the next probe.
const DETECT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The port name of `activator-service` whose endpoints are the activator set.
pub const ACTIVATOR_PORT: &str = "http";

/// This activator's part of a revision's ready pods (`ready` sorted), given its place in the
/// revision's subset (`None`: never listed).
pub fn share(
    ready: &[SocketAddr],
    cc: u32,
    place: Option<Place>,
    revision: &RevisionKey,
) -> Vec<SocketAddr> {
    let Some(Place { index, of }) = place else {
        return ready.to_vec();
    };
    if of <= 1 || cc == 0 || ready.len() < of {
        return ready.to_vec();
    }
    let rotated = (index + (fnv(revision) % of as u64) as usize) % of;
    ready
        .iter()
        .enumerate()
        .filter(|(p, _)| p % of == rotated)
        .map(|(_, a)| *a)
        .collect()
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

/// The activators each revision's public slices list (their `http` addresses, sorted;
/// [`Subsets::update`]); a revision's receiver is created on first use.
pub struct Subsets {
    me: SocketAddr,
    listings: DashMap<RevisionKey, watch::Sender<Arc<Vec<SocketAddr>>>>,
}

impl Subsets {
    /// `me`: this activator's `http` address as activator-service's slices list it.
    pub fn new(me: SocketAddr) -> Arc<Self> {
        Arc::new(Self {
            me,
            listings: DashMap::new(),
        })
    }

    /// `revision`'s listing as last seen (empty: none).
    pub fn subscribe(&self, revision: &RevisionKey) -> watch::Receiver<Arc<Vec<SocketAddr>>> {
        if let Some(tx) = self.listings.get(revision) {
            return tx.subscribe();
        }
        self.listings
            .entry(revision.clone())
            .or_insert_with(|| watch::channel(Arc::default()).0)
            .subscribe()
    }

    /// The revision's public slices changed (`None`: it has none now).
    pub fn update(&self, revision: &RevisionKey, listed: Option<&[Backend]>) {
        let Some(listed) = listed else {
            // Gone: forget it unless a revision task still follows it.
            self.listings
                .remove_if(revision, |_, tx| tx.receiver_count() == 0);
            return;
        };
        let next = listing(listed);
        if let Some(tx) = self.listings.get(revision) {
            tx.send_if_modified(|cur| {
                if **cur == next {
                    false
                } else {
                    *cur = Arc::new(next);
                    true
                }
            });
        } else if next.contains(&self.me) {
            // Kept only for revisions that list this activator or that a task follows.
            self.listings
                .insert(revision.clone(), watch::channel(Arc::new(next)).0);
        }
    }
}

/// A listing's addresses, sorted and without repeats.
fn listing(listed: &[Backend]) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = listed
        .iter()
        .filter_map(|(ip, ports)| Some(SocketAddr::new(*ip, *ports.get(ACTIVATOR_PORT)?)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// This activator's place after `listing` is seen with the revision's pods `snap`, given its
/// `last` place: a listing of activators only that names this one sets it; anything else (no
/// listing, the pods listed: the revision served by them or a swap under way, or others only)
/// keeps the last.
pub fn next_place(
    listing: &[SocketAddr],
    snap: &EndpointSnapshot,
    me: SocketAddr,
    last: Option<Place>,
) -> Option<Place> {
    let has_pod = listing
        .iter()
        .any(|a| snap.ready.contains(a) || snap.terminating.contains(a));
    if has_pod {
        return last;
    }
    match listing.binary_search(&me) {
        Ok(index) => Some(Place {
            index,
            of: listing.len(),
        }),
        Err(_) => last,
    }
}

/// An [`EndpointSource`] that hands the activator its share of each revision's pods: the
/// platform's snapshots, split by [`share`] as the revision's subset and containerConcurrency
/// change. Terminating endpoints and the status pass through.
pub struct SharedEndpoints {
    inner: Arc<dyn EndpointSource>,
    subsets: Arc<Subsets>,
    catalog: Arc<RevisionCatalog>,
    channels: DashMap<RevisionKey, watch::Sender<Arc<EndpointSnapshot>>>,
    /// mesh-compatibility-mode (`None`: `disabled`).
    mesh: Option<(Arc<Mesh>, ProbeClient)>,
}

impl SharedEndpoints {
    pub fn new(
        inner: Arc<dyn EndpointSource>,
        subsets: Arc<Subsets>,
        catalog: Arc<RevisionCatalog>,
        mesh: Option<Arc<Mesh>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            subsets,
            catalog,
            channels: DashMap::new(),
            mesh: mesh
                .filter(|m| m.mode() != MeshMode::Disabled)
                .map(|m| (m, probe_client())),
        })
    }

    /// How the revision's pods are reached, without probing (`Pods` when the mesh mode is
    /// `disabled`).
    fn reach(&self, key: &RevisionKey) -> Reach {
        self.mesh
            .as_ref()
            .map_or(Reach::Pods, |(m, _)| m.reach(key))
    }

    /// Under `auto`, decides how an undecided revision with ready pods is reached by probing
    /// (bounded by [`super::mesh::PROBE_TIMEOUT`] per probe); the reach after it.
    async fn detect(&self, key: &RevisionKey, snap: &EndpointSnapshot) -> Reach {
        let reach = self.reach(key);
        let (Some((mesh, client)), Reach::Unknown, Some(pod)) =
            (&self.mesh, reach, snap.ready.first())
        else {
            return reach;
        };
        let found = detect(client, *pod, mesh.service_addr(key, self.port_name(key))).await;
        mesh.decide(key, found);
        mesh.reach(key)
    }

    fn port_name(&self, key: &RevisionKey) -> &'static str {
        match self.catalog.load().get(key).map(|s| s.protocol) {
            Some(Protocol::H2c) => PORT_NAME_HTTP2,
            _ => PORT_NAME_HTTP,
        }
    }

    /// The activator's view of the revision's pods `snap`: its share of them, reached as
    /// `reach` says (`Unknown`: not probed yet, so nothing while pods are ready).
    fn split(
        &self,
        key: &RevisionKey,
        snap: &EndpointSnapshot,
        place: Option<Place>,
        reach: Reach,
    ) -> EndpointSnapshot {
        let cc = self
            .catalog
            .load()
            .get(key)
            .map_or(0, |s| s.container_concurrency);
        match (&self.mesh, reach) {
            (Some((mesh, _)), Reach::Service) => through_service(
                snap,
                mesh.service_addr(key, self.port_name(key)),
                cc,
                place.map_or(1, |p| p.of),
            ),
            // Not probed yet: nothing is sent before the probe tells how, and a request waits
            // for the probe, not for a cold start.
            (Some(_), Reach::Unknown) if !snap.ready.is_empty() => EndpointSnapshot {
                ready: Vec::new(),
                terminating: snap.terminating.clone(),
                starting: Vec::new(),
                status: snap.status.clone(),
                limit: None,
                reach_pending: true,
                queue_proxy: snap.queue_proxy,
            },
            _ => EndpointSnapshot {
                ready: share(&snap.ready, cc, place, key),
                terminating: snap.terminating.clone(),
                starting: Vec::new(),
                status: snap.status.clone(),
                limit: None,
                reach_pending: false,
                queue_proxy: snap.queue_proxy,
            },
        }
    }
}

impl EndpointSource for Arc<SharedEndpoints> {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        if let Some(tx) = self.channels.get(revision) {
            return tx.subscribe();
        }
        let mut platform = self.inner.endpoints(revision);
        let mut listed = self.subsets.subscribe(revision);
        let me_addr = self.subsets.me;
        let snap = platform.borrow_and_update().clone();
        let mut place = next_place(&listed.borrow_and_update(), &snap, me_addr, None);
        let first = Arc::new(self.split(revision, &snap, place, self.reach(revision)));
        let entry = self.channels.entry(revision.clone());
        let tx = match entry {
            dashmap::Entry::Occupied(o) => return o.get().subscribe(),
            dashmap::Entry::Vacant(v) => v.insert(watch::channel(first).0).clone(),
        };
        let rx = tx.subscribe();
        let me = self.clone();
        let key = revision.clone();
        let mut catalog = self.catalog.subscribe();
        let mut services = self.mesh.as_ref().map(|(m, _)| m.subscribe());
        tokio::spawn(
            async move {
                // Under `auto`, an undecided revision with ready pods is probed at once, and
                // again each second while the probes decide nothing.
                let mut undecided = !snap.ready.is_empty() && me.reach(&key) == Reach::Unknown;
                loop {
                    if !undecided {
                        tokio::select! {
                            r = platform.changed() => if r.is_err() { return },
                            r = listed.changed() => if r.is_err() { return },
                            r = catalog.changed() => if r.is_err() { return },
                            Some(r) = async { Some(services.as_mut()?.changed().await) } => {
                                if r.is_err() { return }
                            }
                        }
                    }
                    let snap = platform.borrow_and_update().clone();
                    let mut reach = me.detect(&key, &snap).await;
                    undecided = reach == Reach::Unknown && !snap.ready.is_empty();
                    if undecided {
                        // Probed without a decision: the pods as Kubernetes sees them.
                        reach = Reach::Pods;
                    }
                    let next_p = next_place(&listed.borrow_and_update(), &snap, me_addr, place);
                    if next_p != place {
                        tracing::debug!(
                            index = next_p.map(|p| p.index),
                            of = next_p.map(|p| p.of),
                            "subset place"
                        );
                        place = next_p;
                    }
                    let next = me.split(&key, &snap, place, reach);
                    tx.send_if_modified(|cur| {
                        if **cur == next {
                            false
                        } else {
                            *cur = Arc::new(next);
                            true
                        }
                    });
                    if undecided {
                        tokio::time::sleep(DETECT_RETRY).await;
                    }
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

    /// Over 140 shapes: with at least as many pods as listed activators, every pod has
    /// exactly one activator and every activator at least one pod; with fewer, every
    /// activator takes every pod (overcommit, as Knative).
    #[test]
    fn each_pod_has_one_activator_when_there_are_enough_pods() {
        for n in 1..=5usize {
            for p in 1..=7u16 {
                for cc in 1..=4u32 {
                    let pods = addrs(p, 9000);
                    let key = RevisionKey::new("ns", format!("r-{n}-{p}-{cc}"));
                    let mut per_pod = std::collections::HashMap::new();
                    for index in 0..n {
                        let mine = share(&pods, cc, Some(Place { index, of: n }), &key);
                        assert!(
                            !mine.is_empty(),
                            "n={n} p={p}: activator {index} has no pod"
                        );
                        for pod in mine {
                            *per_pod.entry(pod).or_insert(0usize) += 1;
                        }
                    }
                    assert_eq!(per_pod.len(), usize::from(p), "every pod is served");
                    let want = if usize::from(p) >= n { 1 } else { n };
                    for (pod, k) in &per_pod {
                        assert_eq!(*k, want, "n={n} p={p} cc={cc}: {pod} has {k} activators");
                    }
                }
            }
        }
    }

    #[test]
    fn alone_unlimited_or_never_listed_takes_every_pod() {
        let pods = addrs(3, 9000);
        let key = RevisionKey::new("ns", "r");
        assert_eq!(share(&pods, 1, Some(Place { index: 0, of: 1 }), &key), pods);
        assert_eq!(share(&pods, 0, Some(Place { index: 1, of: 3 }), &key), pods);
        assert_eq!(share(&pods, 1, None, &key), pods);
        assert_eq!(
            share(&pods, 1, Some(Place { index: 1, of: 3 }), &key).len(),
            1
        );
    }

    /// A listing of activators that names this one sets its place; one naming others, or
    /// listing the revision's pods (served by them, or a swap under way), keeps the last.
    #[test]
    fn the_place_follows_listings_of_activators_only() {
        let a = |last: u8| SocketAddr::from(([10, 0, 0, last], 8012));
        let me = a(2);
        let pods = EndpointSnapshot {
            ready: vec![SocketAddr::from(([10, 1, 0, 1], 8012))],
            ..EndpointSnapshot::default()
        };
        let p = next_place(&[a(1), a(2), a(3)], &pods, me, None);
        assert_eq!(p, Some(Place { index: 1, of: 3 }));
        assert_eq!(next_place(&[a(1), a(3)], &pods, me, p), p, "others only");
        assert_eq!(next_place(&[], &pods, me, p), p, "none");
        // A swap to the pods deletes the activators' slices one by one: never "alone".
        let mixed = [a(2), pods.ready[0]];
        assert_eq!(next_place(&mixed, &pods, me, p), p, "pods listed");
        assert_eq!(
            next_place(&[a(2), a(3)], &pods, me, p),
            Some(Place { index: 0, of: 2 })
        );
        assert_eq!(next_place(&[a(1)], &pods, me, None), None, "never listed");
    }

    /// Under `mesh-compatibility-mode: auto`, a revision whose pods are ready but not probed
    /// yet is handed out with no ready endpoint (nothing is sent before the probe) and
    /// `reach_pending`, so its first request waits for the probe without counting as a cold
    /// start; without a mesh, its pods at once.
    #[tokio::test]
    async fn ready_pods_awaiting_the_reach_probe_are_pending_not_cold() {
        let key = RevisionKey::new("ns", "r");
        // A port nobody listens on: the probe finds nothing and decides nothing.
        let pod = SocketAddr::from(([127, 0, 0, 1], 1));
        let platform = crate::activator::testing::StaticEndpoints::new();
        platform.set_ready(&key, vec![pod]);
        let me = SocketAddr::from(([10, 0, 0, 2], 8012));
        let shared = |mode| {
            SharedEndpoints::new(
                platform.clone(),
                Subsets::new(me),
                Arc::new(RevisionCatalog::default()),
                Some(Mesh::new(mode)),
            )
        };
        let first = shared(MeshMode::Auto).endpoints(&key).borrow().clone();
        assert!(first.ready.is_empty(), "{first:?}");
        assert!(first.reach_pending, "{first:?}");
        let first = shared(MeshMode::Disabled).endpoints(&key).borrow().clone();
        assert_eq!(first.ready, vec![pod]);
        assert!(!first.reach_pending, "{first:?}");
    }

    #[test]
    fn listings_keep_only_activator_addresses() {
        use std::collections::BTreeMap;
        let b = |last: u8, port: Option<u16>| -> Backend {
            (
                std::net::IpAddr::from([10, 0, 0, last]),
                port.map(|p| BTreeMap::from([(ACTIVATOR_PORT.to_string(), p)]))
                    .unwrap_or_default(),
            )
        };
        let subsets = Subsets::new(SocketAddr::from(([10, 0, 0, 2], 8012)));
        let key = RevisionKey::new("ns", "r");
        // Not followed and not listing this activator: not kept.
        subsets.update(&key, Some(&[b(1, Some(8012))]));
        assert!(subsets.listings.get(&key).is_none());
        let rx = subsets.subscribe(&key);
        subsets.update(
            &key,
            Some(&[b(3, Some(8012)), b(2, Some(8012)), b(4, None)]),
        );
        assert_eq!(
            **rx.borrow(),
            vec![
                SocketAddr::from(([10, 0, 0, 2], 8012)),
                SocketAddr::from(([10, 0, 0, 3], 8012))
            ]
        );
        subsets.update(&key, None);
        assert!(subsets.listings.get(&key).is_some(), "followed");
        drop(rx);
        subsets.update(&key, None);
        assert!(subsets.listings.get(&key).is_none());
    }
}
