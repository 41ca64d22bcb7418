//! Which revisions a request may reach, and whose routing headers are believed, on Kubernetes
//! (SECURITY.md, "Tenancy: routing, trust and the NetworkPolicy").
//!
//! - [`RouteBook`]: every Route's hosts and the revisions it routes. A request reaches a
//!   revision only if its host (the `Host`, or an absolute target's authority) belongs to a
//!   Route in the revision's namespace that routes the revision now, or stopped routing it less
//!   than `routing-grace` ago (a deleted Route's revisions likewise), whichever peer sent it
//!   and whatever `Knative-Serving-*` headers named. The kube side (`roles::routes`) feeds it
//!   each Route's hosts (as the Route reconciler builds them) and `status.traffic`.
//! - [`GatewayPeers`]: the ready endpoints of config-istio's gateway Services, the peers
//!   `trusted-proxies`' default believes on Kubernetes.
//!
//! The request path reads one persistent map (host -> the route's entry: its namespace and a
//! few revision names): a hash of the normalised host, a namespace comparison and a scan of a
//! handful of names, no allocation and no clock reading unless the revision is in its grace.
//! The writer keeps one record per Route and changes only that Route's hosts in the map, so a
//! change costs O(hosts × log n) whatever the number of Routes; revisions past their grace are
//! dropped on every change and on [`RouteBook::prune`], so the book holds what the Routes name
//! and no more.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::revision::{PersistentMap, RevisionKey, normalize_host};

/// What the book says of a request's host and revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The host's Route, in the revision's namespace, routes it (or did, within the grace).
    Allowed,
    /// The host belongs to a Route of another namespace: no later change makes this right.
    Refused,
    /// The host is no Route's, or its Route does not route the revision: a Route written a
    /// moment ago may still change that ([`RouteBook::catch_up`]).
    Unknown,
}

/// How long a request whose host or revision the book does not know (yet) waits for the
/// Route watch to catch up before its 404: the Route reconciler writes a Route's status just
/// after its VirtualServices, so a gateway may send a new revision's first requests before
/// the activator has seen the status that routes it.
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// One revision of a route's entry: `None` while routed, else when it stopped being routed.
type Routed = (Box<str>, Option<Instant>);

/// What the request path reads for one host: its Route's namespace and revisions.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    namespace: Box<str>,
    route: Box<str>,
    revisions: Box<[Routed]>,
}

/// A Route's `(namespace, name)`.
type RouteKey = (Box<str>, Box<str>);
/// The writer's records, by Route.
type Records = HashMap<RouteKey, Record>;

/// One Route as the writer keeps it.
#[derive(Debug, Default)]
struct Record {
    hosts: Vec<Box<str>>,
    revisions: BTreeMap<Box<str>, Option<Instant>>,
    /// The Route was deleted: the record goes once its revisions' grace has passed.
    deleted: bool,
}

/// One Route as the kube side reads it: its hosts (every group's: the default and each tag's,
/// external and cluster-local) and the revisions its `status.traffic` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInput {
    pub namespace: String,
    pub name: String,
    pub hosts: Vec<String>,
    pub revisions: Vec<String>,
}

/// Every Route's hosts and routed revisions (the module doc).
pub struct RouteBook {
    table: ArcSwap<PersistentMap<Box<str>, Arc<Entry>>>,
    records: Mutex<Records>,
    /// Bumped at each change of the table (the catch-up waits on it).
    version: watch::Sender<u64>,
    /// The Routes have been listed once.
    synced: watch::Sender<bool>,
}

impl Default for RouteBook {
    fn default() -> Self {
        Self {
            table: ArcSwap::default(),
            records: Mutex::default(),
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

    /// Whether `host` may reach `key`. `grace` gives the time now and `routing-grace`; it is
    /// called only for a revision its Route no longer routes.
    pub fn check(
        &self,
        host: &str,
        key: &RevisionKey,
        grace: impl FnOnce() -> (Instant, Duration),
    ) -> Verdict {
        let host = normalize_host(host);
        let table = self.table.load();
        let Some(entry) = table.get(&*host) else {
            return Verdict::Unknown;
        };
        if *entry.namespace != *key.namespace {
            return Verdict::Refused;
        }
        match entry.revisions.iter().find(|(n, _)| **n == *key.name) {
            Some((_, None)) => Verdict::Allowed,
            Some((_, Some(unrouted_at))) => {
                let (now, grace) = grace();
                if now < *unrouted_at + grace {
                    Verdict::Allowed
                } else {
                    Verdict::Unknown
                }
            }
            None => Verdict::Unknown,
        }
    }

    /// Waits up to [`CATCH_UP`] for the book to say [`Verdict::Allowed`] for `host` and
    /// `key` (each change re-checked); the last verdict.
    pub async fn catch_up(
        &self,
        host: &str,
        key: &RevisionKey,
        grace: impl Fn() -> (Instant, Duration),
    ) -> Verdict {
        let mut rx = self.version.subscribe();
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let v = self.check(host, key, &grace);
            if v != Verdict::Unknown {
                return v;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return self.check(host, key, &grace),
            }
        }
    }

    /// Sets one Route (its hosts and routed revisions); revisions it routed before and not
    /// now start their grace at `now`.
    pub fn set(&self, route: RouteInput, now: Instant, grace: Duration) {
        let mut records = self.lock();
        let key = (Box::from(route.namespace), Box::from(route.name));
        let old = records.remove(&key).unwrap_or_default();
        let mut revisions = old.revisions;
        for (_, since) in revisions.iter_mut() {
            since.get_or_insert(now);
        }
        for r in route.revisions {
            revisions.insert(r.into(), None);
        }
        let mut hosts: Vec<Box<str>> = route
            .hosts
            .iter()
            .map(|h| Box::from(h.to_ascii_lowercase()))
            .collect();
        hosts.sort();
        hosts.dedup();
        let record = Record {
            hosts,
            revisions,
            deleted: false,
        };
        self.publish(&mut records, key, Some(old.hosts), record, now, grace);
    }

    /// A Route was deleted: its revisions start their grace at `now` (the record goes after).
    pub fn delete(&self, namespace: &str, name: &str, now: Instant, grace: Duration) {
        let mut records = self.lock();
        let key = (Box::from(namespace), Box::from(name));
        let Some(mut record) = records.remove(&key) else {
            return;
        };
        for since in record.revisions.values_mut() {
            since.get_or_insert(now);
        }
        record.deleted = true;
        let hosts = record.hosts.clone();
        self.publish(&mut records, key, Some(hosts), record, now, grace);
    }

    /// After a full list: every Route in `routes` is set, every other one deleted, and the
    /// book counts as synced.
    pub fn replace_all(&self, routes: Vec<RouteInput>, now: Instant, grace: Duration) {
        let listed: std::collections::HashSet<(String, String)> = routes
            .iter()
            .map(|r| (r.namespace.clone(), r.name.clone()))
            .collect();
        let gone: Vec<RouteKey> = self
            .lock()
            .keys()
            .filter(|(ns, n)| !listed.contains(&(ns.to_string(), n.to_string())))
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
        let mut records = self.lock();
        let expired: Vec<RouteKey> = records
            .iter()
            .filter(|(_, r)| {
                r.revisions
                    .values()
                    .any(|s| s.is_some_and(|s| now >= s + grace))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            if let Some(record) = records.remove(&key) {
                let hosts = record.hosts.clone();
                self.publish(&mut records, key, Some(hosts), record, now, grace);
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
        self.lock().len()
    }

    /// Whether the book holds no Route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `record` under `key` (pruned of expired revisions; dropped when deleted and
    /// empty) and points its hosts at its new entry, removing the `old_hosts` it no longer
    /// has (and only where they still point at this Route).
    fn publish(
        &self,
        records: &mut Records,
        key: RouteKey,
        old_hosts: Option<Vec<Box<str>>>,
        mut record: Record,
        now: Instant,
        grace: Duration,
    ) {
        record
            .revisions
            .retain(|_, since| since.is_none_or(|s| now < s + grace));
        let keep = !(record.deleted && record.revisions.is_empty());
        let mut table = PersistentMap::clone(&self.table.load());
        let ours = |e: &Arc<Entry>| e.namespace == key.0 && e.route == key.1;
        for h in old_hosts.iter().flatten() {
            if (!keep || !record.hosts.contains(h)) && table.get(h).is_some_and(ours) {
                table.remove(h);
            }
        }
        if keep {
            let entry = Arc::new(Entry {
                namespace: key.0.clone(),
                route: key.1.clone(),
                revisions: record
                    .revisions
                    .iter()
                    .map(|(n, s)| (n.clone(), *s))
                    .collect(),
            });
            for h in &record.hosts {
                table.insert(h.clone(), entry.clone());
            }
            records.insert(key, record);
        }
        self.table.store(Arc::new(table));
        self.version.send_modify(|v| *v += 1);
    }
}

/// The ready endpoints of config-istio's gateway Services: the peers believed by default.
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
}

/// What a Kubernetes activator checks requests against ([`crate::activator::Activator::guard_routes`]).
pub struct RouteGuard {
    pub routes: Arc<RouteBook>,
    pub gateways: Arc<GatewayPeers>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(ns: &str, name: &str, hosts: &[&str], revs: &[&str]) -> RouteInput {
        RouteInput {
            namespace: ns.into(),
            name: name.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            revisions: revs.iter().map(|r| r.to_string()).collect(),
        }
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_host_reaches_only_its_routes_revisions_in_its_namespace() {
        let book = RouteBook::default();
        let t0 = Instant::now();
        book.set(
            route(
                "team-a",
                "web",
                &["web.team-a.example.com", "web.team-a"],
                &["web-1"],
            ),
            t0,
            GRACE,
        );
        book.set(
            route("team-b", "db", &["db.team-b.example.com"], &["db-1"]),
            t0,
            GRACE,
        );
        let at = || (t0, GRACE);
        let a = RevisionKey::new("team-a", "web-1");
        let b = RevisionKey::new("team-b", "db-1");
        assert_eq!(
            book.check("web.team-a.example.com", &a, at),
            Verdict::Allowed
        );
        assert_eq!(
            book.check("WEB.team-a.example.com:80", &a, at),
            Verdict::Allowed
        );
        assert_eq!(book.check("web.team-a", &a, at), Verdict::Allowed);
        assert_eq!(
            book.check("web.team-a.example.com", &b, at),
            Verdict::Refused
        );
        assert_eq!(
            book.check(
                "web.team-a.example.com",
                &RevisionKey::new("team-a", "other"),
                at
            ),
            Verdict::Unknown
        );
        assert_eq!(book.check("nobody.example.com", &a, at), Verdict::Unknown);
    }

    #[test]
    fn an_unrouted_revision_is_served_within_the_grace_then_dropped() {
        let book = RouteBook::default();
        let t0 = Instant::now();
        book.set(route("ns", "r", &["r.ns"], &["r-1"]), t0, GRACE);
        book.set(route("ns", "r", &["r.ns"], &["r-2"]), t0, GRACE);
        let old = RevisionKey::new("ns", "r-1");
        let within = t0 + GRACE - Duration::from_millis(1);
        assert_eq!(
            book.check("r.ns", &old, || (within, GRACE)),
            Verdict::Allowed
        );
        assert_eq!(
            book.check("r.ns", &old, || (t0 + GRACE, GRACE)),
            Verdict::Unknown
        );
        // The grace is read at each request: a shorter one applies at once.
        assert_eq!(
            book.check("r.ns", &old, || (
                t0 + Duration::from_secs(2),
                Duration::from_secs(1)
            )),
            Verdict::Unknown
        );
        book.prune(t0 + GRACE, GRACE);
        let table = book.table.load();
        assert_eq!(
            &*table.get("r.ns").unwrap().revisions,
            &[("r-2".into(), None)]
        );
        // A deleted route keeps its revisions for the grace, then leaves the book.
        book.delete("ns", "r", t0 + GRACE, GRACE);
        let new = RevisionKey::new("ns", "r-2");
        assert_eq!(
            book.check("r.ns", &new, || (t0 + GRACE, GRACE)),
            Verdict::Allowed
        );
        book.prune(t0 + GRACE * 2, GRACE);
        assert!(book.is_empty());
        assert!(book.table.load().is_empty());
    }

    #[test]
    fn a_relist_deletes_what_it_no_longer_lists_and_hosts_follow_their_route() {
        let book = RouteBook::default();
        let t0 = Instant::now();
        book.set(route("ns", "a", &["a.ns", "old.ns"], &["a-1"]), t0, GRACE);
        book.set(route("ns", "b", &["b.ns"], &["b-1"]), t0, GRACE);
        book.replace_all(vec![route("ns", "a", &["a.ns"], &["a-1"])], t0, GRACE);
        let table = book.table.load();
        assert!(table.get("old.ns").is_none(), "a host the route dropped");
        assert!(table.get("b.ns").is_some(), "a deleted route in its grace");
        drop(table);
        book.prune(t0 + GRACE, GRACE);
        assert!(book.table.load().get("b.ns").is_none());
        assert_eq!(book.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn catch_up_sees_a_route_written_a_moment_later() {
        let book = Arc::new(RouteBook::default());
        let key = RevisionKey::new("ns", "r-2");
        let writer = book.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            writer.set(route("ns", "r", &["r.ns"], &["r-2"]), Instant::now(), GRACE);
        });
        let v = book
            .catch_up("r.ns", &key, || (Instant::now(), GRACE))
            .await;
        assert_eq!(v, Verdict::Allowed);
        let started = Instant::now();
        let v = book
            .catch_up("r.ns", &RevisionKey::new("ns", "nope"), || {
                (Instant::now(), GRACE)
            })
            .await;
        assert_eq!((v, started.elapsed()), (Verdict::Unknown, CATCH_UP));
    }

    #[test]
    fn gateway_peers_are_matched_canonically() {
        let g = GatewayPeers::default();
        assert!(!g.contains("10.0.0.1".parse().unwrap()));
        g.set(["10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap()]);
        assert!(g.contains("10.0.0.1".parse().unwrap()));
        assert!(g.contains("::ffff:10.0.0.2".parse().unwrap()));
        assert!(!g.contains("10.0.0.3".parse().unwrap()));
    }
}
