//! Revisions: their identity ([`RevisionKey`]), their effective spec ([`RevisionSpec`]) and the
//! [`RevisionCatalog`] that routing, the throttler and the scaler all read.
//!
//! The catalog is an immutable [`CatalogSnapshot`] behind an `ArcSwap`: readers take a snapshot
//! without locking, writers (local.yaml today, Kubernetes informers later) build a complete new
//! snapshot and swap it in.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
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

/// An immutable view of every known revision (including those at zero) and the host table.
#[derive(Debug, Clone, Default)]
pub struct CatalogSnapshot {
    revisions: HashMap<RevisionKey, Arc<RevisionSpec>>,
    /// Host (lower-case, without port) -> the revision it routes to. Holds both route hosts
    /// (`{service}.{namespace}.{domain}` -> the service's current revision) and each revision's
    /// own hosts. A host with a traffic split maps to its largest share here.
    hosts: HashMap<String, RevisionKey>,
    /// Route hosts whose traffic is split between revisions: (revision, percent), percents
    /// adding up to 100 (Knative's Route traffic). See [`CatalogSnapshot::pick`].
    splits: HashMap<String, Vec<(RevisionKey, u32)>>,
}

impl CatalogSnapshot {
    /// Builds a snapshot from revisions and route hosts (`host -> revision`). Each revision's
    /// own `hosts` are added to the table; an explicit route entry wins over them.
    pub fn new(
        revisions: impl IntoIterator<Item = RevisionSpec>,
        routes: impl IntoIterator<Item = (String, RevisionKey)>,
    ) -> Self {
        let mut snap = Self::default();
        for spec in revisions {
            for h in &spec.hosts {
                snap.hosts.insert(h.to_ascii_lowercase(), spec.key.clone());
            }
            snap.revisions.insert(spec.key.clone(), Arc::new(spec));
        }
        for (host, key) in routes {
            snap.hosts.insert(host.to_ascii_lowercase(), key);
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
            self.splits.insert(host.to_ascii_lowercase(), split);
        }
        self
    }

    /// The traffic split of a route host, if it has one.
    pub fn split(&self, host: &str) -> Option<&[(RevisionKey, u32)]> {
        self.splits.get(&*normalize_host(host)).map(Vec::as_slice)
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
        let key = self.hosts.get(&*normalize_host(host))?;
        self.revisions.get(key)
    }

    /// Every traffic split: a route host (lower-case) and its (revision, percent) shares.
    pub fn splits(&self) -> impl Iterator<Item = (&str, &[(RevisionKey, u32)])> {
        self.splits.iter().map(|(h, s)| (h.as_str(), s.as_slice()))
    }

    /// Every routed host (lower-case, without port) and the revision it routes to.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, &RevisionKey)> {
        self.hosts.iter().map(|(h, k)| (h.as_str(), k))
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

/// The live catalog: a [`CatalogSnapshot`] swapped atomically. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct RevisionCatalog {
    current: ArcSwap<CatalogSnapshot>,
    /// Bumped on every swap so watchers (throttlers, the scaler) can notice changes.
    changed: tokio::sync::watch::Sender<u64>,
}

impl RevisionCatalog {
    pub fn new(snapshot: CatalogSnapshot) -> Self {
        Self {
            current: ArcSwap::from_pointee(snapshot),
            changed: Default::default(),
        }
    }

    /// The current snapshot. Hold it for one request, not across long waits.
    pub fn load(&self) -> Arc<CatalogSnapshot> {
        self.current.load_full()
    }

    /// Replaces the whole catalog and notifies [`RevisionCatalog::subscribe`]rs.
    pub fn store(&self, snapshot: CatalogSnapshot) {
        self.current.store(Arc::new(snapshot));
        self.changed.send_modify(|v| *v += 1);
    }

    /// A receiver that changes whenever the catalog is replaced.
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
}
