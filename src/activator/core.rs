//! The [`Activator`]: its dependencies, the per-revision state table kept in step with the
//! catalog, and routing a request to a revision's state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::error::ActivatorError;
use super::headers::NextHop;
use super::proxy::Upstream;
use super::rev_state::RevisionState;
use super::routing::Target;
use super::throttler::HeldBudget;
use crate::autoscaler::scaler::ScaleStates;
use crate::config::ActivatorConfig;
use crate::percore::{LocalArc, PerCoreArc};
use crate::platform::EndpointSource;
use crate::revision::RevisionCatalog;
use crate::stats::StatSink;
use crate::telemetry::Telemetry;

/// What the activator needs from the rest of thaw.
pub struct ActivatorDeps {
    /// Routing and each revision's spec (containerConcurrency, timeouts, queue depth, initial
    /// burst, protocol). Watched: revisions added or removed take effect at once.
    pub catalog: Arc<RevisionCatalog>,
    /// Per-revision endpoint snapshots; told when a terminating endpoint drained.
    pub endpoints: Arc<dyn EndpointSource>,
    /// Where the 1 s reports and cold-start pokes go. Never blocks the activator.
    pub stats: Arc<dyn StatSink>,
    /// The scaler's decisions, when it runs in the same process: `desired` on `/revisions` and
    /// the poke -> decision cold-start phase.
    pub scale_states: Option<Arc<ScaleStates>>,
    /// Live-reloaded limits. Read per request (header limits, queue cap, retries) or per
    /// connection (listener limits); `connect-timeout` is read once, at [`Activator::new`].
    pub config: Arc<ArcSwap<ActivatorConfig>>,
    /// The registry the activator's metrics live in (`/metrics` encodes it).
    pub telemetry: Arc<Telemetry>,
    /// This activator's name in [`crate::stats::Stat::source`].
    pub source_name: Arc<str>,
    /// Whom requests are forwarded to: a queue sidecar (Kubernetes) or, in `thaw local`, the
    /// replica itself; decides how the client's `Host` travels.
    pub next_hop: NextHop,
}

/// The request path's hash maps: foldhash, seeded per process, instead of SipHash (a lookup is
/// a few dozen instructions instead of a few hundred; the keys are the catalog's own, and the
/// per-process seed keeps lookups with crafted names from being predictable).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Revision states by namespace then name, and by routed host, so a lookup by header values
/// allocates nothing and takes one map lookup per level.
#[derive(Default)]
struct RevisionTable {
    /// The catalog version this table was built from.
    version: u64,
    /// Each state with a handle per core: a request's lookup and ticket clone their core's
    /// handle, not the state's shared count (`super::percore`).
    by_ns: FastMap<Box<str>, FastMap<Box<str>, PerCoreArc<RevisionState>>>,
    /// Host (lower-case, no port) -> the state of the revision it routes to, from the same
    /// catalog snapshot.
    by_host: FastMap<Box<str>, PerCoreArc<RevisionState>>,
    /// Route hosts whose traffic is split by percent: each request draws its revision from
    /// the shares (in order, each taking its percent of 0..100). Checked before `by_host`.
    splits: FastMap<Box<str>, Vec<(PerCoreArc<RevisionState>, u32)>>,
}

/// The share a `roll` in 0..100 falls in: the shares in order, each taking its percent; the
/// last share takes what is left (percents that sum below 100).
fn pick_share(
    shares: &[(PerCoreArc<RevisionState>, u32)],
    roll: u32,
) -> Option<&PerCoreArc<RevisionState>> {
    let mut upto = 0;
    for (state, percent) in shares {
        upto += percent;
        if roll < upto {
            return Some(state);
        }
    }
    shares.last().map(|(s, _)| s)
}

impl RevisionTable {
    fn get(&self, namespace: &str, name: &str) -> Option<&PerCoreArc<RevisionState>> {
        self.by_ns.get(namespace)?.get(name)
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<RevisionState>> {
        self.by_ns
            .values()
            .flat_map(|m| m.values())
            .map(PerCoreArc::shared)
    }
}

/// The activator: routing, holding, balancing and forwarding, with its admin API. Create with
/// [`Activator::new`], run with [`Activator::serve`].
pub struct Activator {
    pub(crate) deps: ActivatorDeps,
    table: ArcSwap<RevisionTable>,
    /// Serialises table rebuilds (the catalog task and request-path misses).
    sync_lock: Mutex<()>,
    catalog_version: watch::Receiver<u64>,
    budget: Arc<HeldBudget>,
    pub(crate) upstream: Arc<Upstream>,
    /// Per-core data-plane runtimes, when [`Activator::use_workers`] was called.
    pub(crate) workers: std::sync::OnceLock<Arc<crate::percore::Workers>>,
    draining: AtomicBool,
    /// Upgraded (websocket) tunnels: tracked so drain can wait for them, cancelled after the
    /// drain timeout.
    pub(crate) tunnels: TaskTracker,
    pub(crate) tunnel_cancel: CancellationToken,
}

impl Activator {
    /// Builds the activator and a state for every revision in the catalog (each subscribes to
    /// its endpoints). Must be called inside a tokio runtime.
    pub fn new(deps: ActivatorDeps) -> Arc<Self> {
        let connect_timeout = deps.config.load().connect_timeout;
        let act = Arc::new(Self {
            catalog_version: deps.catalog.subscribe(),
            deps,
            table: ArcSwap::from_pointee(RevisionTable::default()),
            sync_lock: Mutex::new(()),
            budget: Arc::new(HeldBudget::default()),
            upstream: Arc::new(Upstream::new(connect_timeout)),
            workers: std::sync::OnceLock::new(),
            draining: AtomicBool::new(false),
            tunnels: TaskTracker::new(),
            tunnel_cancel: CancellationToken::new(),
        });
        act.sync();
        act
    }

    /// Serves data-port connections on `workers` (one single-threaded runtime per core)
    /// instead of the runtime that calls [`Activator::serve`]. Call before `serve`; a second
    /// call is ignored. Stop the workers only after `serve` has returned.
    pub fn use_workers(&self, workers: Arc<crate::percore::Workers>) {
        let _ = self.workers.set(workers);
    }

    /// The upstream clients for the current thread: a worker's own pool when workers are in
    /// use (so pooled connections stay on the thread that uses them), else the shared one.
    pub(crate) fn upstream(&self) -> Arc<Upstream> {
        if self.workers.get().is_some() {
            self.upstream.for_this_thread()
        } else {
            self.upstream.clone()
        }
    }

    /// Brings the state table in line with the catalog: new revisions get a state, changed
    /// specs are swapped in, removed revisions' held requests are answered 503.
    pub fn sync(&self) {
        let _guard = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        let version = *self.catalog_version.borrow();
        let snapshot = self.deps.catalog.load();
        let old = self.table.load_full();
        let mut next = RevisionTable {
            version,
            ..RevisionTable::default()
        };
        for spec in snapshot.revisions() {
            let key = &spec.key;
            let state = match old.get(&key.namespace, &key.name) {
                Some(state) => {
                    if **state.shared().spec.load() != **spec {
                        state.shared().update_spec(spec.clone());
                    }
                    state.clone()
                }
                None => {
                    tracing::debug!(revision = %key, "revision added");
                    PerCoreArc::new(RevisionState::spawn(
                        spec.clone(),
                        &self.deps.endpoints,
                        self.budget.clone(),
                        &self.deps.telemetry.activator,
                        self.deps.scale_states.clone(),
                    ))
                }
            };
            next.by_ns
                .entry(Box::from(&*key.namespace))
                .or_default()
                .insert(Box::from(&*key.name), state);
        }
        for (host, key) in snapshot.hosts() {
            if let Some(state) = next.get(&key.namespace, &key.name).cloned() {
                next.by_host.insert(Box::from(host), state);
            }
        }
        for (host, split) in snapshot.splits() {
            let shares: Vec<_> = split
                .iter()
                .filter_map(|(key, percent)| {
                    Some((next.get(&key.namespace, &key.name)?.clone(), *percent))
                })
                .collect();
            if !shares.is_empty() {
                next.splits.insert(Box::from(host), shares);
            }
        }
        for state in old.iter() {
            if next.get(&state.key.namespace, &state.key.name).is_none() {
                tracing::info!(revision = %state.key, "revision removed; held requests answered 503");
                state.remove();
            }
        }
        self.table.store(Arc::new(next));
    }

    /// The revision a request goes to, or a 404 reason.
    pub(crate) fn resolve(
        &self,
        target: Target<'_>,
    ) -> Result<LocalArc<RevisionState>, ActivatorError> {
        if let Some(state) = self.lookup(target) {
            return Ok(state);
        }
        // The catalog may have changed since the table was built.
        if *self.catalog_version.borrow() != self.table.load().version {
            self.sync();
            if let Some(state) = self.lookup(target) {
                return Ok(state);
            }
        }
        Err(ActivatorError::NotFound(match target {
            Target::Named { namespace, name } => format!("revision {namespace}/{name} not found"),
            Target::Host(host) => format!("no revision routes host {host}"),
        }))
    }

    fn lookup(&self, target: Target<'_>) -> Option<LocalArc<RevisionState>> {
        let table = self.table.load();
        match target {
            Target::Named { namespace, name } => table.get(namespace, name),
            Target::Host(host) => {
                let host = crate::revision::normalize_host(host);
                // Most hosts have no split: one emptiness check on the warm path.
                match (!table.splits.is_empty())
                    .then(|| table.splits.get(&*host))
                    .flatten()
                {
                    Some(shares) => pick_share(shares, rand::random_range(0..100)),
                    None => table.by_host.get(&*host),
                }
            }
        }
        .map(PerCoreArc::local)
    }

    /// Every revision's state (for the reporter and the admin API).
    pub(crate) fn states(&self) -> Vec<Arc<RevisionState>> {
        self.table.load().iter().cloned().collect()
    }

    /// Whether `peer` is a trusted proxy (`trusted-proxies`; by default every peer on
    /// Kubernetes, where requests come through the ingress and the mesh, and none in `thaw
    /// local`, where thaw is itself the ingress).
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        let role_default = self.deps.next_hop == NextHop::Sidecar;
        self.deps
            .config
            .load()
            .trusted_proxies
            .trusts(peer, role_default)
    }

    /// Whether drain has begun (readiness fails from then on).
    pub fn is_draining(&self) -> bool {
        self.draining.load(SeqCst)
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, SeqCst);
    }

    /// Requests held across all revisions now.
    pub fn held_requests(&self) -> u32 {
        self.budget.held()
    }

    /// Keeps the table in step with the catalog until the catalog is dropped.
    pub(crate) async fn watch_catalog(self: Arc<Self>) {
        let mut rx = self.deps.catalog.subscribe();
        while rx.changed().await.is_ok() {
            rx.borrow_and_update();
            self.sync();
        }
    }
}
