//! Which revisions a request may reach, and whose routing headers are believed, on Kubernetes
//! (SECURITY.md, "Tenancy: routing, trust and the NetworkPolicy").
//!
//! - [`RouteBook`]: every Route's hosts, the revisions it routes and each host's traffic
//!   split. A gateway's request (its routing headers name the revision) reaches a revision
//!   only if its host belongs to a Route in the revision's namespace that routes it now, or
//!   stopped routing it less than `routing-grace` ago ([`RouteBook::allows`]). Any other
//!   request is routed by its host: the host's Route draws a revision from its split, a tag's
//!   host its tag's revision ([`RouteBook::pick`]). The kube side (`roles::routes`) feeds it
//!   each Route's hosts per traffic group (as the Route reconciler builds them) and
//!   `status.traffic`.
//! - [`GatewayPeers`]: the ready endpoints of the gateway Services, the peers
//!   `trusted-proxies`' default believes on Kubernetes; [`GatewayIdentities`] their mesh
//!   identities, believed from the activator's own sidecar (`super::mesh_identity`).
//!
//! The request path reads one persistent map (host -> its Route's entry and traffic group): a
//! hash of the normalised host, then a namespace comparison and a scan of a handful of names,
//! or a draw from the group's split (one random number, only for a split of two or more). No
//! allocation, no lock, no clock reading unless the revision is in its grace. The writer keeps
//! one record per Route and changes only that Route's hosts in the map, so a change costs
//! O(hosts × log n) whatever the number of Routes; revisions past their grace are dropped on
//! every change and on [`RouteBook::prune`], so the book holds what the Routes name and no
//! more.
//!
//! A host claimed by two Routes (a tag's host that is another Route's default host, or one
//! domain template that leaves the namespace out) goes to a tag's claim first, then to the
//! Route first by namespace and name: the same answer on every activator, whatever order the
//! Routes were seen in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;

pub use super::catch_up::{CATCH_UP, CATCH_UP_SEATS, CatchUpSeats};
pub use super::mesh_identity::GatewayIdentities;
use crate::revision::{PersistentMap, RevisionKey, normalize_host};

/// One revision of a route's entry: `None` while routed, else when it stopped being routed.
type Routed = (Box<str>, Option<Instant>);

/// A traffic group's split: (revision, percent), percents above 0, and their sum.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Split {
    targets: Box<[(Box<str>, u32)]>,
    total: u32,
}

/// What the request path reads for one Route: its namespace, revisions and groups' splits.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    namespace: Box<str>,
    route: Box<str>,
    revisions: Box<[Routed]>,
    groups: Box<[Split]>,
}

/// What the map holds for one host: its Route's entry and the host's traffic group.
#[derive(Debug, Clone)]
struct HostRef {
    entry: Arc<Entry>,
    group: u16,
}

/// A Route's `(namespace, name)`.
type RouteKey = (Box<str>, Box<str>);

/// One Route's claim to a host: tags' claims (rank 0) before default ones (rank 1), then by
/// Route.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    rank: u8,
    route: RouteKey,
    group: u16,
}

/// One Route as the writer keeps it.
#[derive(Debug)]
struct Record {
    /// (host, group, rank).
    hosts: Vec<(Box<str>, u16, u8)>,
    groups: Box<[Split]>,
    revisions: BTreeMap<Box<str>, Option<Instant>>,
    /// The Route was deleted: the record goes once its revisions' grace has passed.
    deleted: bool,
    /// What its hosts point at.
    entry: Arc<Entry>,
}

/// The writer's state.
#[derive(Debug, Default)]
struct Writer {
    records: HashMap<RouteKey, Record>,
    /// Each host's claims, sorted: the first one is what the map holds.
    claims: HashMap<Box<str>, Vec<Claim>>,
}

/// One traffic group of a Route as the kube side reads it: the default group (`tag: None`) or
/// a tag's, its hosts (external and cluster-local) and what a request to them draws from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInput {
    pub tag: Option<String>,
    pub hosts: Vec<String>,
    /// (revision, percent): the default group's targets with a percent above 0, or the tag's
    /// revision at 100.
    pub split: Vec<(String, u32)>,
}

/// One Route as the kube side reads it: its traffic groups, and every revision its
/// `status.traffic` names (whatever the percent or tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInput {
    pub namespace: String,
    pub name: String,
    pub groups: Vec<GroupInput>,
    pub revisions: Vec<String>,
}

/// Every Route's hosts, routed revisions and splits (the module doc).
pub struct RouteBook {
    table: ArcSwap<PersistentMap<Box<str>, HostRef>>,
    writer: Mutex<Writer>,
    /// Bumped at each change of the table (the catch-up waits on it).
    version: watch::Sender<u64>,
    /// The Routes have been listed once.
    synced: watch::Sender<bool>,
}

impl Default for RouteBook {
    fn default() -> Self {
        Self {
            table: ArcSwap::default(),
            writer: Mutex::default(),
            version: watch::Sender::new(0),
            synced: watch::Sender::new(false),
        }
    }
}

impl RouteBook {
    /// An empty book (every host unknown until Routes are set).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Whether `host` may reach `key` (a gateway's choice): the host's Route is of `key`'s
    /// namespace and routes it, or did within the grace. `grace` gives the time now and
    /// `routing-grace`; it is called only for a revision its Route no longer routes.
    pub fn allows(
        &self,
        host: &str,
        key: &RevisionKey,
        grace: impl FnOnce() -> (Instant, Duration),
    ) -> bool {
        let host = normalize_host(host);
        let table = self.table.load();
        let Some(h) = table.get(&*host) else {
            return false;
        };
        if *h.entry.namespace != *key.namespace {
            return false;
        }
        match h.entry.revisions.iter().find(|(n, _)| **n == *key.name) {
            Some((_, None)) => true,
            Some((_, Some(unrouted_at))) => {
                let (now, grace) = grace();
                now < *unrouted_at + grace
            }
            None => false,
        }
    }

    /// Routes by `host` alone: its Route's namespace and the revision its traffic group draws
    /// (`roll(total)` must give a number below `total`; called only for a split of two or
    /// more), handed to `f`. `None` when no Route has the host or its group routes nothing.
    pub fn pick<R>(
        &self,
        host: &str,
        roll: impl FnOnce(u32) -> u32,
        f: impl FnOnce(&str, &str) -> R,
    ) -> Option<R> {
        let host = normalize_host(host);
        let table = self.table.load();
        let h = table.get(&*host)?;
        let split = h.entry.groups.get(usize::from(h.group))?;
        let name = match &*split.targets {
            [] => return None,
            [(only, _)] => only,
            targets => {
                let at = roll(split.total);
                let mut upto = 0;
                targets
                    .iter()
                    .find(|(_, percent)| {
                        upto += percent;
                        at < upto
                    })
                    .or(targets.last())
                    .map(|(n, _)| n)?
            }
        };
        Some(f(&h.entry.namespace, name))
    }

    /// Changes each time the table does (the catch-up waits on it).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Sets one Route; revisions it routed before and not now start their grace at `now`.
    pub fn set(&self, route: RouteInput, now: Instant, grace: Duration) {
        let mut w = self.lock();
        let key: RouteKey = (route.namespace.into(), route.name.into());
        let old = w.records.remove(&key);
        let old_hosts = old.as_ref().map(|r| r.hosts.clone()).unwrap_or_default();
        let mut revisions = old.map(|r| r.revisions).unwrap_or_default();
        for since in revisions.values_mut() {
            since.get_or_insert(now);
        }
        for r in route.revisions {
            revisions.insert(r.into(), None);
        }
        let mut hosts = Vec::new();
        let mut groups = Vec::new();
        for (i, g) in route.groups.into_iter().enumerate() {
            let Ok(group) = u16::try_from(i) else {
                break;
            };
            let rank = u8::from(g.tag.is_none());
            for h in g.hosts {
                hosts.push((Box::from(h.to_ascii_lowercase()), group, rank));
            }
            let targets: Box<[(Box<str>, u32)]> = g
                .split
                .into_iter()
                .filter(|(_, p)| *p > 0)
                .map(|(n, p)| (n.into(), p))
                .collect();
            let total = targets.iter().map(|(_, p)| *p).sum();
            groups.push(Split { targets, total });
        }
        // A host in two of the Route's groups keeps its tag's claim.
        hosts.sort_by(|a, b| (&a.0, a.2, a.1).cmp(&(&b.0, b.2, b.1)));
        hosts.dedup_by(|a, b| a.0 == b.0);
        let record = Record {
            hosts,
            groups: groups.into(),
            revisions,
            deleted: false,
            entry: Arc::new(Entry::placeholder()),
        };
        self.publish(&mut w, key, &old_hosts, record, now, grace);
    }

    /// A Route was deleted: its revisions start their grace at `now` (the record goes after);
    /// its hosts keep their last split for that long.
    pub fn delete(&self, namespace: &str, name: &str, now: Instant, grace: Duration) {
        let mut w = self.lock();
        let key: RouteKey = (namespace.into(), name.into());
        let Some(mut record) = w.records.remove(&key) else {
            return;
        };
        for since in record.revisions.values_mut() {
            since.get_or_insert(now);
        }
        record.deleted = true;
        let hosts = record.hosts.clone();
        self.publish(&mut w, key, &hosts, record, now, grace);
    }

    /// After a full list: every Route in `routes` is set, every other one deleted, and the
    /// book counts as synced.
    pub fn replace_all(&self, routes: Vec<RouteInput>, now: Instant, grace: Duration) {
        let listed: HashSet<(&str, &str)> = routes
            .iter()
            .map(|r| (r.namespace.as_str(), r.name.as_str()))
            .collect();
        let gone: Vec<RouteKey> = self
            .lock()
            .records
            .keys()
            .filter(|(ns, n)| !listed.contains(&(&**ns, &**n)))
            .cloned()
            .collect();
        for (ns, n) in gone {
            self.delete(&ns, &n, now, grace);
        }
        for r in routes {
            self.set(r, now, grace);
        }
        self.synced.send_replace(true);
    }

    /// Drops the revisions whose grace has passed (and deleted Routes left with none).
    pub fn prune(&self, now: Instant, grace: Duration) {
        let mut w = self.lock();
        let expired: Vec<RouteKey> = w
            .records
            .iter()
            .filter(|(_, r)| {
                r.revisions
                    .values()
                    .any(|s| s.is_some_and(|s| now >= s + grace))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if let Some(record) = w.records.remove(&key) {
                let hosts = record.hosts.clone();
                self.publish(&mut w, key, &hosts, record, now, grace);
            }
        }
    }

    /// Resolves once the Routes have been listed.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// How many Routes the book holds (deleted ones in their grace included).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether the book holds no Route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `record` under `key` (pruned of expired revisions; dropped when deleted and
    /// empty), moves its claims from `old_hosts` to its hosts, and points every host whose
    /// claims changed at its first claim's entry.
    fn publish(
        &self,
        w: &mut Writer,
        key: RouteKey,
        old_hosts: &[(Box<str>, u16, u8)],
        mut record: Record,
        now: Instant,
        grace: Duration,
    ) {
        record
            .revisions
            .retain(|_, since| since.is_none_or(|s| now < s + grace));
        let keep = !(record.deleted && record.revisions.is_empty());
        for (h, _, _) in old_hosts {
            if let Some(claims) = w.claims.get_mut(h) {
                claims.retain(|c| c.route != key);
                if claims.is_empty() {
                    w.claims.remove(h);
                }
            }
        }
        if keep {
            for (h, group, rank) in &record.hosts {
                let claims = w.claims.entry(h.clone()).or_default();
                let claim = Claim {
                    rank: *rank,
                    route: key.clone(),
                    group: *group,
                };
                let at = claims.partition_point(|c| *c < claim);
                claims.insert(at, claim);
            }
            record.entry = Arc::new(Entry {
                namespace: key.0.clone(),
                route: key.1.clone(),
                revisions: record
                    .revisions
                    .iter()
                    .map(|(n, s)| (n.clone(), *s))
                    .collect(),
                groups: record.groups.clone(),
            });
        }
        let hosts = if keep {
            record.hosts.clone()
        } else {
            Vec::new()
        };
        if keep {
            w.records.insert(key, record);
        }
        let mut table = PersistentMap::clone(&self.table.load());
        for (h, _, _) in old_hosts.iter().chain(&hosts) {
            let first = w.claims.get(h).and_then(|c| c.first());
            match first.and_then(|c| Some((w.records.get(&c.route)?, c.group))) {
                Some((r, group)) => {
                    table.insert(
                        h.clone(),
                        HostRef {
                            entry: r.entry.clone(),
                            group,
                        },
                    );
                }
                None => {
                    table.remove(h);
                }
            }
        }
        self.table.store(Arc::new(table));
        self.version.send_modify(|v| *v += 1);
    }
}

impl Entry {
    /// Stands in until [`RouteBook::publish`] builds the record's entry.
    fn placeholder() -> Self {
        Self {
            namespace: Box::default(),
            route: Box::default(),
            revisions: Box::default(),
            groups: Box::default(),
        }
    }
}

/// The ready endpoints of the gateway Services: the peers believed by default.
#[derive(Default)]
pub struct GatewayPeers {
    /// Sorted, canonical (an IPv4-mapped IPv6 address as IPv4).
    addrs: ArcSwap<Box<[IpAddr]>>,
}

impl GatewayPeers {
    /// No gateway known yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Replaces the set.
    pub fn set(&self, addrs: impl IntoIterator<Item = IpAddr>) {
        let mut v: Vec<IpAddr> = addrs.into_iter().map(|a| a.to_canonical()).collect();
        v.sort();
        v.dedup();
        tracing::info!(gateways = ?v, "gateway endpoints (trusted by default)");
        self.addrs.store(Arc::new(v.into_boxed_slice()));
    }

    /// Whether `peer` is a gateway endpoint now.
    pub fn contains(&self, peer: IpAddr) -> bool {
        self.addrs
            .load()
            .binary_search(&peer.to_canonical())
            .is_ok()
    }

    /// The endpoints now.
    pub fn list(&self) -> Vec<IpAddr> {
        self.addrs.load().to_vec()
    }
}

/// What a Kubernetes activator checks requests against ([`crate::activator::Activator::guard_routes`]).
pub struct RouteGuard {
    pub routes: Arc<RouteBook>,
    /// The gateways' addresses (`trusted-proxies`' default).
    pub gateways: Arc<GatewayPeers>,
    /// The gateways' mesh identities, believed from the activator's own sidecar.
    pub identities: Arc<GatewayIdentities>,
    /// At most this many requests wait in the catch-up at once.
    pub catch_up_seats: u32,
}

impl RouteGuard {
    /// An empty book and no gateway known, with the default catch-up seats.
    pub fn new() -> Self {
        Self {
            routes: RouteBook::new(),
            gateways: GatewayPeers::new(),
            identities: GatewayIdentities::new(),
            catch_up_seats: CATCH_UP_SEATS,
        }
    }
}

impl Default for RouteGuard {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
#[path = "route_check_tests.rs"]
mod tests;
