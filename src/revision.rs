//! Revisions: their identity ([`RevisionKey`]), their effective spec ([`RevisionSpec`]) and the
//! [`RevisionCatalog`] that routing, the throttler and the scaler all read.
//!
//! The catalog is an immutable [`CatalogSnapshot`] behind an `ArcSwap`: readers take a snapshot
//! without locking. Its maps are persistent (`imbl`: a new version shares all but the changed
//! path with the old one), so a writer applies one revision ([`RevisionCatalog::upsert`],
//! [`RevisionCatalog::remove`]) in O(log n) and swaps the new snapshot in; a whole new catalog
//! ([`RevisionCatalog::store`], local mode's model) replaces it in one swap. Every change bumps
//! the catalog's version and is written to a bounded change log, so a subscriber learns which
//! revisions changed ([`RevisionCatalog::delta`]) without scanning them all; one that fell
//! further behind than the log reaches does one full resync.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::AutoscalingSpec;

/// A revision's identity: namespace and name, as Knative's `Knative-Serving-Namespace` and
/// `Knative-Serving-Revision` headers carry them. Cheap to clone (two `Arc<str>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RevisionKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl RevisionKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: Arc::from(namespace.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }
}

impl fmt::Display for RevisionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The protocol a revision's container speaks: h2c when its port is named `h2c` (as in Knative),
/// HTTP/1.1 otherwise.
/// (The engine's type: the pool dials by it.)
pub use crate::http1::Protocol;

/// Per-revision request timeouts (docs/architecture.md, "Knative's rules"), enforced by the activator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole request, hold included (`timeoutSeconds`).
    pub total: Duration,
    /// Time to the first response byte (`responseStartTimeoutSeconds`).
    pub response_start: Duration,
    /// Longest gap between response bytes, or bytes either way on a websocket tunnel
    /// (`idleTimeoutSeconds`); `None` = no limit.
    pub idle: Option<Duration>,
    /// The longest a request may be held waiting for a cold start; defaults to `total`.
    pub cold_wait: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            total: Duration::from_secs(300),
            response_start: Duration::from_secs(300),
            idle: None,
            cold_wait: Duration::from_secs(300),
        }
    }
}

/// Everything the data plane needs to know about one revision, already merged from its own
/// settings, its annotations and the ConfigMaps. Always valid.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionSpec {
    pub key: RevisionKey,
    /// The Knative Service (and Configuration) this revision belongs to, if any.
    pub service: Option<Arc<str>>,
    /// Maximum in-flight requests per replica; 0 = unlimited.
    pub container_concurrency: u32,
    pub protocol: Protocol,
    pub timeouts: Timeouts,
    /// Requests this revision may hold while it has no capacity.
    pub queue_depth: u32,
    /// Requests released at once to each new endpoint when containerConcurrency is 0.
    pub initial_burst: u32,
    /// Host names that route to this revision directly (its own host, e.g.
    /// `hello-00001.default.example.com`, and `hello-00001.default.svc.cluster.local`).
    pub hosts: Vec<String>,
    /// Effective autoscaler settings.
    pub autoscaling: Arc<AutoscalingSpec>,
    /// The Revision's `metadata.uid` on Kubernetes (its `K-Proxy-Request` tag covers it,
    /// [`crate::knative::proxy_tag`]); `None` elsewhere.
    pub uid: Option<Arc<str>>,
}

impl RevisionSpec {
    /// A spec with defaults everywhere, for tests and fixtures: `RevisionSpec::test("ns", "rev")`
    /// then adjust fields.
    pub fn test(namespace: &str, name: &str) -> Self {
        Self {
            key: RevisionKey::new(namespace, name),
            service: None,
            container_concurrency: 0,
            protocol: Protocol::Http1,
            timeouts: Timeouts::default(),
            queue_depth: 10_000,
            initial_burst: 100,
            hosts: Vec::new(),
            autoscaling: Arc::new(AutoscalingSpec::default()),
            uid: None,
        }
    }
}

/// A `Host` header value as the host table keys it: without a numeric port, lower-case
/// (borrowed when it already is).
pub fn normalize_host(host: &str) -> std::borrow::Cow<'_, str> {
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// A persistent hash map (`imbl`'s HAMT) with foldhash: cloning is O(1), an insert or removal
/// copies only the path to the changed entry.
pub type PersistentMap<K, V> =
    imbl::GenericHashMap<K, V, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// What a host routes to, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostEntry {
    key: RevisionKey,
    /// An explicit route entry ([`CatalogSnapshot::new`]'s `routes`): wins over a revision's
    /// own hosts, and is not removed with a revision.
    route: bool,
}

/// An immutable view of every known revision (including those at zero) and the host table, at
/// one catalog version. Cloning is O(1) (persistent maps).
#[derive(Debug, Clone, Default)]
pub struct CatalogSnapshot {
    /// The catalog version this snapshot is (0 until stored in a catalog).
    version: u64,
    revisions: PersistentMap<RevisionKey, Arc<RevisionSpec>>,
    /// Host (lower-case, without port) -> the revision it routes to. Holds both route hosts
    /// (`{service}.{namespace}.{domain}` -> the service's current revision) and each revision's
    /// own hosts. A host with a traffic split maps to its largest share here.
    hosts: PersistentMap<String, HostEntry>,
    /// Route hosts whose traffic is split between revisions: (revision, percent), percents
    /// adding up to 100 (Knative's Route traffic). See [`CatalogSnapshot::pick`].
    splits: PersistentMap<String, Arc<[(RevisionKey, u32)]>>,
    /// Each route as an operator reads it (the admin port's `/routes`); empty where no
    /// controller publishes routes into this catalog.
    route_views: Arc<[RouteView]>,
}

/// One route as `kn service describe` shows it: its host and where its traffic goes. Read by
/// people and tests (the admin port's `/routes`), never on the request path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteView {
    pub namespace: String,
    pub service: String,
    /// `{service}.{namespace}.{domain}`: the Host that reaches the split.
    pub host: String,
    /// The route's URL: its host and thaw's data port.
    pub url: String,
    /// Every traffic target, in the order the Service lists them (one target, the latest ready
    /// revision at 100 %, when it lists none).
    pub traffic: Vec<TrafficView>,
}

/// One traffic target of a [`RouteView`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficView {
    /// The revision it resolves to now (`None`: a named revision that does not exist).
    pub revision_name: Option<String>,
    /// Its share of the route host's requests (0 for a tag-only target).
    pub percent: u32,
    /// Whether it follows the latest ready revision (Knative's `latestRevision: true`).
    pub latest_revision: bool,
    pub tag: Option<String>,
    /// The tag's own host `{tag}-{service}.{namespace}.{domain}`, which reaches this target
    /// alone.
    pub tag_host: Option<String>,
}

impl CatalogSnapshot {
    /// Builds a snapshot from revisions and route hosts (`host -> revision`). Each revision's
    /// own `hosts` are added to the table; an explicit route entry wins over them.
    pub fn new(
        revisions: impl IntoIterator<Item = RevisionSpec>,
        routes: impl IntoIterator<Item = (String, RevisionKey)>,
    ) -> Self {
        let mut snap = Self::default();
        for (host, key) in routes {
            snap.hosts
                .insert(host.to_ascii_lowercase(), HostEntry { key, route: true });
        }
        for spec in revisions {
            snap.put(Arc::new(spec));
        }
        snap
    }

    /// Adds traffic splits: per route host, (revision, percent) with percents adding up to
    /// 100. A host with one target needs none.
    pub fn with_splits(
        mut self,
        splits: impl IntoIterator<Item = (String, Vec<(RevisionKey, u32)>)>,
    ) -> Self {
        for (host, split) in splits {
            self.splits.insert(host.to_ascii_lowercase(), split.into());
        }
        self
    }

    /// Sets the routes as operators read them ([`RouteView`]).
    pub fn with_route_views(mut self, views: Vec<RouteView>) -> Self {
        self.route_views = views.into();
        self
    }

    /// Every route as operators read it, sorted as published.
    pub fn route_views(&self) -> &[RouteView] {
        &self.route_views
    }

    /// Adds or replaces one revision and its own hosts (those of its previous spec that it no
    /// longer lists leave the table). Returns false when the spec is the one already there.
    /// A host already held by an explicit route entry keeps routing there. O(log n) per host.
    fn put(&mut self, spec: Arc<RevisionSpec>) -> bool {
        if let Some(old) = self.revisions.get(&spec.key) {
            if **old == *spec {
                return false;
            }
            let old = old.clone();
            self.drop_hosts(&old);
        }
        for host in &spec.hosts {
            let host = host.to_ascii_lowercase();
            if !self.hosts.get(&host).is_some_and(|e| e.route) {
                let key = spec.key.clone();
                self.hosts.insert(host, HostEntry { key, route: false });
            }
        }
        self.revisions.insert(spec.key.clone(), spec);
        true
    }

    /// Removes one revision and the hosts it brought (not route entries naming it). Returns
    /// the removed spec.
    fn take(&mut self, key: &RevisionKey) -> Option<Arc<RevisionSpec>> {
        let old = self.revisions.remove(key)?;
        self.drop_hosts(&old);
        Some(old)
    }

    /// Removes `spec`'s own hosts that still route to it.
    fn drop_hosts(&mut self, spec: &RevisionSpec) {
        for host in &spec.hosts {
            let host = host.to_ascii_lowercase();
            if self
                .hosts
                .get(&host)
                .is_some_and(|e| !e.route && e.key == spec.key)
            {
                self.hosts.remove(&host);
            }
        }
    }

    /// The catalog version of this snapshot.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The traffic split of a route host, if it has one.
    pub fn split(&self, host: &str) -> Option<&[(RevisionKey, u32)]> {
        self.splits.get(&*normalize_host(host)).map(|s| &**s)
    }

    /// The revision a request to `host` goes to, given `roll` drawn uniformly from 0..100:
    /// the split's shares in order, each taking `percent` of the rolls; a host without a split
    /// routes as [`CatalogSnapshot::route_host`] does.
    pub fn pick(&self, host: &str, roll: u32) -> Option<&Arc<RevisionSpec>> {
        let Some(split) = self.split(host) else {
            return self.route_host(host);
        };
        let mut upto = 0;
        for (key, percent) in split {
            upto += percent;
            if roll < upto {
                return self.revisions.get(key);
            }
        }
        split.last().and_then(|(k, _)| self.revisions.get(k))
    }

    pub fn get(&self, key: &RevisionKey) -> Option<&Arc<RevisionSpec>> {
        self.revisions.get(key)
    }

    /// The revision a `Host` header routes to. The port, if any, is ignored; case-insensitive.
    pub fn route_host(&self, host: &str) -> Option<&Arc<RevisionSpec>> {
        let key = self.host_key(&normalize_host(host))?;
        self.revisions.get(key)
    }

    /// The revision a normalised host (lower-case, no port) routes to, known or not.
    pub fn host_key(&self, host: &str) -> Option<&RevisionKey> {
        self.hosts.get(host).map(|e| &e.key)
    }

    /// Every traffic split: a route host (lower-case) and its (revision, percent) shares.
    pub fn splits(&self) -> impl Iterator<Item = (&str, &[(RevisionKey, u32)])> {
        self.splits.iter().map(|(h, s)| (h.as_str(), &**s))
    }

    /// Every routed host (lower-case, without port) and the revision it routes to.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &RevisionKey)> {
        self.hosts.iter().map(|(h, e)| (h.as_str(), &e.key))
    }

    pub fn revisions(&self) -> impl Iterator<Item = &Arc<RevisionSpec>> {
        self.revisions.values()
    }

    pub fn len(&self) -> usize {
        self.revisions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revisions.is_empty()
    }
}

/// How many changes the catalog remembers for subscribers ([`RevisionCatalog::delta`]). A
/// subscriber further behind resyncs in full. 4,096 entries of 40 bytes: 160 KiB at most.
pub const CHANGE_LOG_CAPACITY: usize = 4096;

/// One entry of the change log.
#[derive(Debug, Clone)]
enum Change {
    /// This revision was added, changed or removed.
    Revision(RevisionKey),
    /// The whole catalog was replaced ([`RevisionCatalog::store`]).
    All,
}

/// What changed in the catalog between two versions ([`RevisionCatalog::delta`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// These revisions (each once, in the order of their first change) were added, changed or
    /// removed: the newer snapshot says which (present: added or changed; absent: removed).
    Revisions(Vec<RevisionKey>),
    /// Too much changed, or the log no longer reaches back (the subscriber lagged), or the
    /// whole catalog was replaced: compare every revision.
    Resync,
}

/// The live catalog: a [`CatalogSnapshot`] swapped atomically, changed one revision at a time
/// or replaced whole. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct RevisionCatalog {
    current: ArcSwap<CatalogSnapshot>,
    /// Serialises writers (each reads the current snapshot, changes it and swaps it in) and
    /// holds the last [`CHANGE_LOG_CAPACITY`] changes, oldest first, with their versions.
    log: Mutex<VecDeque<(u64, Change)>>,
    /// The current version, sent on every change so watchers (the activator's table, the
    /// scaler) can wake up and ask [`RevisionCatalog::delta`] what changed.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for RevisionCatalog {
    fn default() -> Self {
        Self::new(CatalogSnapshot::default())
    }
}

impl RevisionCatalog {
    pub fn new(mut snapshot: CatalogSnapshot) -> Self {
        snapshot.version = 0;
        Self {
            current: ArcSwap::from_pointee(snapshot),
            log: Mutex::new(VecDeque::new()),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    /// The current snapshot. Hold it for one request, not across long waits.
    pub fn load(&self) -> Arc<CatalogSnapshot> {
        self.current.load_full()
    }

    /// The current version (bumped by every change).
    pub fn version(&self) -> u64 {
        self.current.load().version
    }

    /// Replaces the whole catalog and notifies [`RevisionCatalog::subscribe`]rs; their next
    /// [`RevisionCatalog::delta`] across this change is [`Delta::Resync`]. O(1) here; each
    /// subscriber's resync is O(n).
    pub fn store(&self, snapshot: CatalogSnapshot) {
        self.write(|cur| {
            *cur = snapshot;
            Some(Change::All)
        });
    }

    /// Adds `spec` (or replaces the revision's spec), with its own hosts. Returns false, and
    /// changes nothing, when the catalog already holds that exact spec. O(log n).
    pub fn upsert(&self, spec: RevisionSpec) -> bool {
        let key = spec.key.clone();
        self.write(|cur| cur.put(Arc::new(spec)).then_some(Change::Revision(key)))
    }

    /// Removes a revision and the hosts it brought. Returns false when it was not there.
    /// O(log n).
    pub fn remove(&self, key: &RevisionKey) -> bool {
        self.write(|cur| {
            cur.take(key)?;
            Some(Change::Revision(key.clone()))
        })
    }

    /// Applies `f` to a copy of the current snapshot (O(1): persistent maps) and, when it
    /// reports a change, logs it, swaps the copy in with the next version and notifies.
    fn write(&self, f: impl FnOnce(&mut CatalogSnapshot) -> Option<Change>) -> bool {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = CatalogSnapshot::clone(&self.current.load());
        let version = next.version + 1;
        let Some(change) = f(&mut next) else {
            return false;
        };
        next.version = version;
        if log.len() == CHANGE_LOG_CAPACITY {
            log.pop_front();
        }
        log.push_back((version, change));
        // Logged before the swap: whoever sees this version finds its change in the log.
        self.current.store(Arc::new(next));
        drop(log);
        self.changed.send_replace(version);
        true
    }

    /// What changed after version `since` up to and including `until` (normally a snapshot's
    /// [`CatalogSnapshot::version`] just loaded). [`Delta::Resync`] when the log no longer
    /// reaches back to `since` or the catalog was replaced whole in between.
    pub fn delta(&self, since: u64, until: u64) -> Delta {
        if until <= since {
            return Delta::Revisions(Vec::new());
        }
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        // The log must hold every version in (since, until].
        match log.front() {
            Some((first, _)) if *first <= since + 1 => {}
            _ => return Delta::Resync,
        }
        let mut keys = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (_, change) in log.iter().filter(|(v, _)| *v > since && *v <= until) {
            match change {
                Change::All => return Delta::Resync,
                Change::Revision(key) => {
                    if seen.insert(key.clone()) {
                        keys.push(key.clone());
                    }
                }
            }
        }
        Delta::Revisions(keys)
    }

    /// A receiver of the current version: it changes on every change of the catalog.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_host_ignoring_port_and_case() {
        let mut a = RevisionSpec::test("default", "hello-00001");
        a.hosts = vec!["hello-00001.default.example.com".into()];
        let b = RevisionSpec::test("default", "hello-00002");
        let snap = CatalogSnapshot::new(
            [a, b],
            [(
                "hello.default.example.com".to_string(),
                RevisionKey::new("default", "hello-00002"),
            )],
        );
        assert_eq!(
            &*snap
                .route_host("Hello.Default.example.com:8080")
                .unwrap()
                .key
                .name,
            "hello-00002"
        );
        assert_eq!(
            &*snap
                .route_host("hello-00001.default.example.com")
                .unwrap()
                .key
                .name,
            "hello-00001"
        );
        assert!(snap.route_host("nope.default.example.com").is_none());
        assert!(
            snap.get(&RevisionKey::new("default", "hello-00001"))
                .is_some()
        );
    }

    /// A 90/10 split: rolls 0..90 go to the first revision, 90..100 to the second, whatever
    /// the host's case or port; a host without a split routes as before.
    #[test]
    fn a_split_host_picks_by_percent() {
        let (a, b) = (
            RevisionSpec::test("default", "hello-00001"),
            RevisionSpec::test("default", "hello-00002"),
        );
        let (ka, kb) = (a.key.clone(), b.key.clone());
        let host = "hello.default.example.com".to_string();
        let snap = CatalogSnapshot::new([a, b], [(host.clone(), kb.clone())])
            .with_splits([(host, vec![(kb.clone(), 90), (ka.clone(), 10)])]);
        let picks: Vec<_> = (0..100)
            .map(|roll| {
                snap.pick("Hello.default.example.com:80", roll)
                    .unwrap()
                    .key
                    .clone()
            })
            .collect();
        assert_eq!(picks.iter().filter(|k| **k == kb).count(), 90);
        assert_eq!(picks[89], kb);
        assert_eq!(picks[90], ka);
        assert_eq!(snap.pick("other", 5).map(|s| s.key.clone()), None);
        assert_eq!(
            snap.route_host("hello.default.example.com").unwrap().key,
            kb,
            "the host table holds the largest share"
        );
    }

    fn spec(name: &str, hosts: &[&str]) -> RevisionSpec {
        let mut s = RevisionSpec::test("ns", name);
        s.hosts = hosts.iter().map(|h| h.to_string()).collect();
        s
    }

    /// Single changes: a revision comes with its hosts, a changed spec moves them, a removal
    /// takes them away; a route entry wins over a revision's own host and survives it.
    #[test]
    fn upsert_and_remove_carry_the_revisions_hosts() {
        let route = "a.ns.example.com".to_string();
        let cat = RevisionCatalog::new(CatalogSnapshot::new(
            [],
            [(route.clone(), RevisionKey::new("ns", "b"))],
        ));
        assert!(cat.upsert(spec("a", &["a.ns", "A.ns.svc", "a.ns.example.com"])));
        assert!(
            !cat.upsert(spec("a", &["a.ns", "A.ns.svc", "a.ns.example.com"])),
            "same spec"
        );
        let snap = cat.load();
        assert_eq!(snap.version(), 1);
        assert_eq!(&*snap.route_host("a.ns.svc:80").unwrap().key.name, "a");
        assert!(
            snap.route_host(&route).is_none(),
            "the route names b, not yet known"
        );
        assert_eq!(snap.host_key(&route).unwrap().name.as_ref(), "b");

        assert!(cat.upsert(spec("a", &["a.ns", "a2.ns"])));
        let snap = cat.load();
        assert!(
            snap.route_host("a.ns.svc").is_none(),
            "a host it no longer lists"
        );
        assert_eq!(&*snap.route_host("a2.ns").unwrap().key.name, "a");

        assert!(cat.upsert(spec("b", &[])));
        assert!(cat.remove(&RevisionKey::new("ns", "a")));
        assert!(!cat.remove(&RevisionKey::new("ns", "a")), "already gone");
        let snap = cat.load();
        assert!(snap.route_host("a.ns").is_none() && snap.route_host("a2.ns").is_none());
        assert_eq!(
            &*snap.route_host(&route).unwrap().key.name,
            "b",
            "route entry kept"
        );
        assert_eq!((snap.len(), snap.version()), (1, 4));
    }

    /// A reader's snapshot does not change under it: a persistent map, not a shared one.
    #[test]
    fn a_loaded_snapshot_is_unaffected_by_later_changes() {
        let cat = RevisionCatalog::default();
        cat.upsert(spec("a", &["a.ns"]));
        let before = cat.load();
        cat.remove(&RevisionKey::new("ns", "a"));
        cat.upsert(spec("c", &["a.ns"]));
        assert_eq!(&*before.route_host("a.ns").unwrap().key.name, "a");
        assert_eq!(&*cat.load().route_host("a.ns").unwrap().key.name, "c");
    }

    /// The change log names each changed revision once; a whole-catalog store, and a
    /// subscriber further behind than the log reaches, get a resync.
    #[test]
    fn delta_names_the_changed_revisions_or_asks_for_a_resync() {
        let cat = RevisionCatalog::default();
        cat.upsert(spec("a", &[]));
        cat.upsert(spec("b", &[]));
        let mut a2 = spec("a", &[]);
        a2.container_concurrency = 3;
        cat.upsert(a2);
        cat.remove(&RevisionKey::new("ns", "b"));
        let v = cat.version();
        assert_eq!(v, 4);
        let keys = |names: &[&str]| {
            Delta::Revisions(names.iter().map(|n| RevisionKey::new("ns", n)).collect())
        };
        assert_eq!(cat.delta(0, v), keys(&["a", "b"]));
        assert_eq!(cat.delta(2, v), keys(&["a", "b"]));
        assert_eq!(cat.delta(3, 3), keys(&[]));
        assert_eq!(cat.delta(3, v), keys(&["b"]));
        cat.store(CatalogSnapshot::new([spec("z", &[])], []));
        assert_eq!(cat.delta(v, cat.version()), Delta::Resync);
        for i in 0..CHANGE_LOG_CAPACITY + 1 {
            cat.upsert(spec(&format!("r{i}"), &[]));
        }
        let now = cat.version();
        assert_eq!(cat.delta(v + 1, now), Delta::Resync, "lagged past the log");
        assert_eq!(
            cat.delta(now - 1, now),
            keys(&[&format!("r{CHANGE_LOG_CAPACITY}")])
        );
    }

    /// Subscribers are woken by each change, with the new version.
    #[tokio::test]
    async fn subscribers_see_each_version() {
        let cat = RevisionCatalog::default();
        let mut rx = cat.subscribe();
        cat.upsert(spec("a", &[]));
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 1);
        assert!(!cat.upsert(spec("a", &[])));
        assert!(!rx.has_changed().unwrap(), "an unchanged spec wakes nobody");
    }
}
