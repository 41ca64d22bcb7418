//! The [`Activator`]: its dependencies, the table of known revisions kept in step with the
//! catalog, and routing a request to a revision's state.
//!
//! Every revision in the catalog has a small [`Known`] entry in the table (its spec and a slot);
//! its [`RevisionState`] (throttler, concurrency window, endpoint subscription task, metric
//! series) is created on first use, by the first request routed to it, so thousands of
//! revisions that are never requested cost a few hundred bytes each. The table follows the
//! catalog one changed revision at a time (persistent maps: O(log n) per change, whatever the
//! number of revisions), and in full only when the catalog was replaced whole or this
//! activator fell behind its change log. A platform that must hear when a terminating endpoint
//! drained ([`EndpointSource::needs_drain_reports`], `thaw local`) gets a state for every
//! revision at once instead, as it needs the endpoint watch of each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use arc_swap::ArcSwap;
use http::HeaderValue;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::catch_up::{CATCH_UP, CatchUpSeats};
use super::error::ActivatorError;
use super::headers::NextHop;
use super::mesh_identity::is_sidecar_peer;
use super::proxy::Upstream;
use super::rev_state::RevisionState;
use super::route_check::RouteGuard;
use super::routing::{Seen, Target};
use super::throttler::HeldBudget;
use crate::autoscaler::scaler::ScaleStates;
use crate::config::ActivatorConfig;
use crate::knative::proxy_tag::Tagger;
use crate::percore::{LocalArc, PerCoreArc};
use crate::platform::EndpointSource;
use crate::revision::{
    CatalogSnapshot, Delta, PersistentMap, RevisionCatalog, RevisionKey, RevisionSpec,
};
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

/// The request path's maps: persistent (`imbl`), hashed with foldhash, seeded per process. A
/// lookup is a hash and a few node steps; a change copies only the path to the changed entry,
/// so the table follows the catalog in O(log n) per revision.
type Map<K, V> = PersistentMap<K, V>;

/// One revision the activator knows of: its spec, and its state once a request used it.
pub(crate) struct Known {
    key: RevisionKey,
    /// Set once, by the first request routed here (or at once with eager states).
    state: OnceLock<PerCoreArc<RevisionState>>,
    /// The spec and whether the revision left the catalog; the lock orders a state's creation
    /// against the revision's removal and spec changes.
    life: Mutex<Life>,
}

struct Life {
    spec: Arc<RevisionSpec>,
    /// Left the catalog: no state may be created any more.
    removed: bool,
}

impl Known {
    fn new(spec: Arc<RevisionSpec>) -> Self {
        Self {
            key: spec.key.clone(),
            state: OnceLock::new(),
            life: Mutex::new(Life {
                spec,
                removed: false,
            }),
        }
    }

    fn life(&self) -> MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current spec.
    pub(crate) fn spec(&self) -> Arc<RevisionSpec> {
        self.life().spec.clone()
    }

    /// The state, if a request has used the revision.
    pub(crate) fn state(&self) -> Option<&Arc<RevisionState>> {
        self.state.get().map(PerCoreArc::shared)
    }

    pub(crate) fn key(&self) -> &RevisionKey {
        &self.key
    }
}

/// Known revisions by namespace then name, and by routed host, so a lookup by header values
/// allocates nothing and takes one map lookup per level.
#[derive(Clone, Default)]
struct RevisionTable {
    /// The catalog version this table follows.
    version: u64,
    by_ns: Map<Box<str>, Map<Box<str>, Arc<Known>>>,
    /// Host (lower-case, no port) -> the revision it routes to, as the catalog's host table.
    by_host: Map<Box<str>, Arc<Known>>,
    /// Route hosts whose traffic is split by percent: each request draws its revision from
    /// the shares (in order, each taking its percent of 0..100). Checked before `by_host`.
    splits: Map<Box<str>, Shares>,
}

/// A split host's shares: (revision, percent), in order.
type Shares = Arc<[(Arc<Known>, u32)]>;

/// The share a `roll` in 0..100 falls in: the shares in order, each taking its percent; the
/// last share takes what is left (percents that sum below 100).
fn pick_share(shares: &[(Arc<Known>, u32)], roll: u32) -> Option<&Arc<Known>> {
    let mut upto = 0;
    for (known, percent) in shares {
        upto += percent;
        if roll < upto {
            return Some(known);
        }
    }
    shares.last().map(|(k, _)| k)
}

impl RevisionTable {
    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Known>> {
        self.by_ns.get(namespace)?.get(name)
    }

    fn insert(&mut self, known: Arc<Known>) {
        let ns: &str = &known.key.namespace;
        let mut names = self.by_ns.get(ns).cloned().unwrap_or_default();
        names.insert(Box::from(&*known.key.name), known.clone());
        self.by_ns.insert(Box::from(ns), names);
    }

    fn remove(&mut self, key: &RevisionKey) -> Option<Arc<Known>> {
        let mut names = self.by_ns.get(&*key.namespace)?.clone();
        let known = names.remove(&*key.name)?;
        if names.is_empty() {
            self.by_ns.remove(&*key.namespace);
        } else {
            self.by_ns.insert(Box::from(&*key.namespace), names);
        }
        Some(known)
    }

    /// Points `host` (normalised) where `snap` routes it now, or drops it.
    fn point_host(&mut self, snap: &CatalogSnapshot, host: &str) {
        match snap
            .host_key(host)
            .and_then(|k| self.get(&k.namespace, &k.name))
            .cloned()
        {
            Some(known) => {
                self.by_host.insert(Box::from(host), known);
            }
            None => {
                self.by_host.remove(host);
            }
        }
    }

    /// Rebuilds the traffic splits from `snap` (local mode's routes; few).
    fn rebuild_splits(&mut self, snap: &CatalogSnapshot) {
        self.splits = Map::default();
        for (host, split) in snap.splits() {
            let shares: Vec<_> = split
                .iter()
                .filter_map(|(key, percent)| {
                    Some((self.get(&key.namespace, &key.name)?.clone(), *percent))
                })
                .collect();
            if !shares.is_empty() {
                self.splits.insert(Box::from(host), shares.into());
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<Known>> {
        self.by_ns.values().flat_map(|m| m.values())
    }
}

/// The activator: routing, holding, balancing and forwarding, with its admin API. Create with
/// [`Activator::new`], run with [`Activator::serve`].
pub struct Activator {
    pub(crate) deps: ActivatorDeps,
    table: ArcSwap<RevisionTable>,
    /// Serialises table changes (the catalog task and request-path misses).
    sync_lock: Mutex<()>,
    catalog_version: watch::Receiver<u64>,
    /// The states created so far (the reporter, the admin API and drain walk these, not
    /// every known revision).
    used: Mutex<HashMap<RevisionKey, Arc<RevisionState>, foldhash::fast::RandomState>>,
    /// Where states' endpoint tasks run: the runtime that created the activator, not the data
    /// worker whose request happened to create the state.
    runtime: tokio::runtime::Handle,
    /// Create every revision's state at once ([`EndpointSource::needs_drain_reports`]).
    eager: bool,
    budget: Arc<HeldBudget>,
    pub(crate) upstream: Arc<Upstream>,
    /// Per-core data-plane runtimes, when [`Activator::use_workers`] was called.
    pub(crate) workers: std::sync::OnceLock<Arc<crate::percore::Workers>>,
    draining: AtomicBool,
    /// Upgraded (websocket) tunnels: tracked so drain can wait for them, cancelled after the
    /// drain timeout.
    pub(crate) tunnels: TaskTracker,
    pub(crate) tunnel_cancel: CancellationToken,
    /// Kubernetes: the Routes requests are checked against and the gateways believed by
    /// default ([`Activator::guard_routes`]), with the catch-up's seats.
    guard: OnceLock<(RouteGuard, CatchUpSeats)>,
    /// The revisions' `K-Proxy-Request` tags, when [`Activator::use_proxy_tags`] was called.
    proxy_tags: OnceLock<Arc<Tagger>>,
}

impl Activator {
    /// Builds the activator and its table of the catalog's revisions (with a state for each
    /// only when the endpoint source needs drain reports). Must be called inside a tokio
    /// runtime, whose handle later runs the states' endpoint tasks.
    pub fn new(deps: ActivatorDeps) -> Arc<Self> {
        let connect_timeout = deps.config.load().connect_timeout;
        let eager = deps.endpoints.needs_drain_reports();
        let act = Arc::new(Self {
            catalog_version: deps.catalog.subscribe(),
            deps,
            table: ArcSwap::from_pointee(RevisionTable::default()),
            sync_lock: Mutex::new(()),
            used: Mutex::default(),
            runtime: tokio::runtime::Handle::current(),
            eager,
            budget: Arc::new(HeldBudget::default()),
            upstream: Arc::new(Upstream::new(connect_timeout)),
            workers: std::sync::OnceLock::new(),
            draining: AtomicBool::new(false),
            tunnels: TaskTracker::new(),
            tunnel_cancel: CancellationToken::new(),
            guard: OnceLock::new(),
            proxy_tags: OnceLock::new(),
        });
        {
            let _guard = act.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
            let snapshot = act.deps.catalog.load();
            let table = act.resync(&snapshot);
            act.table.store(Arc::new(table));
        }
        act
    }

    /// Serves data-port connections on `workers` (one single-threaded runtime per core)
    /// instead of the runtime that calls [`Activator::serve`]. Call before `serve`; a second
    /// call is ignored. Stop the workers only after `serve` has returned.
    pub fn use_workers(&self, workers: Arc<crate::percore::Workers>) {
        let _ = self.workers.set(workers);
    }

    /// Checks every request against `guard` from now on (`thaw activator`, see
    /// [`super::route_check`]): a gateway's choice reaches a revision only through a host of a
    /// Route of its namespace that routes it, any other request is routed by its host's Route,
    /// and `trusted-proxies`' default believes the gateways (by address, or by mesh identity
    /// from the activator's own sidecar). Call before `serve`; a second call is ignored.
    pub fn guard_routes(&self, guard: RouteGuard) {
        let seats = CatchUpSeats::new(guard.catch_up_seats);
        let _ = self.guard.set((guard, seats));
    }

    /// Where a request for `target` with `host` goes. Without a guard (`thaw local` and
    /// embeddings, where the catalog's host table is the routes') the catalog answers, with a
    /// 404 naming what it did not find. With one: a named revision (a gateway's choice) only
    /// if `host`'s Route allows it, a host by its Route's split; anything else waits for the
    /// catch-up ([`Placed::Wait`]), whatever the reason.
    pub(crate) fn place(
        &self,
        target: Target<'_>,
        host: Option<&str>,
    ) -> Result<Placed, ActivatorError> {
        let Some((g, _)) = self.guard.get() else {
            return self.resolve(target).map(Placed::Ready);
        };
        let state = match target {
            Target::Named { .. } => host.and_then(|host| {
                self.find(target)
                    .filter(|s| g.routes.allows(host, &s.key, || self.grace_now()))
            }),
            Target::Host(host) => g
                .routes
                .pick(
                    host,
                    |total| rand::random_range(0..total),
                    |namespace, name| self.find(Target::Named { namespace, name }),
                )
                .flatten(),
        };
        Ok(match state {
            Some(state) => Placed::Ready(state),
            None => Placed::Wait(Pending::of(target, host)),
        })
    }

    /// Waits (up to [`CATCH_UP`], in one of the catch-up's seats) for `pending` to be
    /// placed, tried again at each change of the Routes or the catalog; `None` once the period
    /// is over, at once when every seat is taken, and without a guard
    /// ([`super::catch_up`]).
    pub(crate) async fn place_after_catch_up(
        &self,
        pending: &Pending,
    ) -> Option<LocalArc<RevisionState>> {
        let (g, seats) = self.guard.get()?;
        let m = &self.deps.telemetry.activator;
        let Some(_seat) = seats.take(&m.route_catch_up_waiting) else {
            m.route_catch_up_full.inc();
            return None;
        };
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        let mut routes = g.routes.subscribe();
        let mut catalog = self.deps.catalog.subscribe();
        let mut watching = true;
        loop {
            if let Ok(Placed::Ready(state)) = self.place(pending.target(), pending.host()) {
                return Some(state);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                r = routes.changed(), if watching => watching = r.is_ok(),
                r = catalog.changed(), if watching => watching = r.is_ok(),
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Whether a request from `peer` with the fields `seen` comes from a gateway, whose
    /// routing and forwarding headers are believed: `trusted-proxies`, whose default is, on
    /// Kubernetes, a gateway endpoint's address or, from the activator's own sidecar, one
    /// `X-Forwarded-Client-Cert` naming a gateway's identity; every peer for a
    /// sidecar-facing activator without a guard; none in `thaw local`, where thaw is itself
    /// the ingress.
    pub(crate) fn is_gateway(&self, peer: std::net::IpAddr, seen: &Seen<'_>) -> bool {
        self.deps.config.load().trusted_proxies.trusts(peer, |p| {
            self.deps.next_hop == NextHop::Sidecar
                && self.guard.get().is_none_or(|(g, _)| {
                    g.gateways.contains(p)
                        || (is_sidecar_peer(p)
                            && seen.client_cert_count == 1
                            && seen
                                .client_cert
                                .is_some_and(|v| g.identities.vouch(v.as_bytes())))
                })
        })
    }

    /// Whether the `X-Forwarded-Client-Cert` of a request from `peer` goes on to the
    /// revision: only on Kubernetes, from the activator's own sidecar (which wrote it).
    pub(crate) fn keeps_client_cert(&self, peer: std::net::IpAddr) -> bool {
        self.guard.get().is_some() && is_sidecar_peer(peer)
    }

    fn grace_now(&self) -> (tokio::time::Instant, std::time::Duration) {
        (
            tokio::time::Instant::now(),
            self.deps.config.load().routing_grace,
        )
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

    /// Brings the table in line with the catalog: each revision changed since the table's
    /// version is applied on its own (added: a known entry; changed: the spec swapped into its
    /// state, if any; removed: its held requests answered 503), O(log n) each. A catalog
    /// replaced whole, or a change log that no longer reaches back, is compared in full.
    pub fn sync(&self) {
        let _guard = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = self.deps.catalog.load();
        let old = self.table.load_full();
        if old.version == snapshot.version() {
            return;
        }
        let next = match self.deps.catalog.delta(old.version, snapshot.version()) {
            Delta::Revisions(keys) => {
                let mut next = RevisionTable::clone(&old);
                next.version = snapshot.version();
                let mut splits_touched = false;
                for key in &keys {
                    splits_touched |= self.apply(&mut next, &snapshot, key);
                }
                if splits_touched {
                    next.rebuild_splits(&snapshot);
                }
                next
            }
            Delta::Resync => {
                tracing::debug!(
                    from = old.version,
                    to = snapshot.version(),
                    "catalog replaced or change log passed; comparing every revision"
                );
                self.resync(&snapshot)
            }
        };
        self.table.store(Arc::new(next));
    }

    /// Applies one revision's change to `t`. Returns whether a traffic split may name it.
    fn apply(&self, t: &mut RevisionTable, snap: &CatalogSnapshot, key: &RevisionKey) -> bool {
        let old = t.get(&key.namespace, &key.name).cloned();
        let old_spec = old.as_ref().map(|k| k.spec());
        match (snap.get(key), old) {
            (Some(spec), Some(known)) => self.set_spec(&known, spec),
            (Some(spec), None) => {
                tracing::debug!(revision = %key, "revision added");
                let known = Arc::new(Known::new(spec.clone()));
                if self.eager {
                    self.state_of(&known);
                }
                t.insert(known);
            }
            (None, Some(_)) => {
                if let Some(known) = t.remove(key) {
                    self.retire(&known);
                }
            }
            (None, None) => return false,
        }
        // Every host the revision listed before or lists now goes where the catalog routes it.
        let new_hosts = snap
            .get(key)
            .map(|s| s.hosts.as_slice())
            .unwrap_or_default();
        let old_hosts = old_spec.as_ref().map_or(&[][..], |s| s.hosts.as_slice());
        for host in old_hosts.iter().chain(new_hosts) {
            t.point_host(snap, &host.to_ascii_lowercase());
        }
        !t.splits.is_empty() || snap.splits().next().is_some()
    }

    /// A table of every revision in `snap`, reusing the known entries (and states) of the
    /// current table; revisions no longer there are retired. O(n).
    fn resync(&self, snap: &CatalogSnapshot) -> RevisionTable {
        let old = self.table.load_full();
        let mut next = RevisionTable {
            version: snap.version(),
            ..RevisionTable::default()
        };
        for spec in snap.revisions() {
            let key = &spec.key;
            let known = match old.get(&key.namespace, &key.name) {
                Some(known) => {
                    self.set_spec(known, spec);
                    known.clone()
                }
                None => {
                    tracing::debug!(revision = %key, "revision added");
                    Arc::new(Known::new(spec.clone()))
                }
            };
            if self.eager {
                self.state_of(&known);
            }
            next.insert(known);
        }
        for (host, key) in snap.hosts() {
            if let Some(known) = next.get(&key.namespace, &key.name).cloned() {
                next.by_host.insert(Box::from(host), known);
            }
        }
        next.rebuild_splits(snap);
        for known in old.iter() {
            if next.get(&known.key.namespace, &known.key.name).is_none() {
                self.retire(known);
            }
        }
        next
    }

    /// Swaps a changed spec into a known revision (and its state, if it has one).
    fn set_spec(&self, known: &Known, spec: &Arc<RevisionSpec>) {
        let mut life = known.life();
        if Arc::ptr_eq(&life.spec, spec) || *life.spec == **spec {
            return;
        }
        life.spec = spec.clone();
        if let Some(state) = known.state.get() {
            state.update_spec(spec.clone());
        }
    }

    /// The revision left the catalog: no state will be created for it; an existing one
    /// answers its held requests 503 and stops its endpoint task.
    fn retire(&self, known: &Known) {
        let mut life = known.life();
        life.removed = true;
        if let Some(state) = known.state.get() {
            tracing::info!(revision = %known.key, "revision removed; held requests answered 503");
            state.remove();
            self.used_lock().remove(&known.key);
        } else {
            tracing::debug!(revision = %known.key, "revision removed (never used here)");
        }
    }

    /// The revision's state, created now if this is its first use; `None` once it was removed.
    fn state_of<'k>(&self, known: &'k Known) -> Option<&'k PerCoreArc<RevisionState>> {
        if let Some(state) = known.state.get() {
            return Some(state);
        }
        let life = known.life();
        if life.removed {
            return None;
        }
        Some(known.state.get_or_init(|| {
            tracing::debug!(revision = %known.key, "first use: creating the revision's state");
            let state = RevisionState::spawn(
                life.spec.clone(),
                &self.deps.endpoints,
                self.budget.clone(),
                &self.deps.telemetry.activator,
                self.deps.scale_states.clone(),
                &self.runtime,
            );
            self.used_lock().insert(known.key.clone(), state.clone());
            PerCoreArc::new(state)
        }))
    }

    fn used_lock(
        &self,
    ) -> MutexGuard<'_, HashMap<RevisionKey, Arc<RevisionState>, foldhash::fast::RandomState>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The revision the catalog routes `target` to, if any.
    fn find(&self, target: Target<'_>) -> Option<LocalArc<RevisionState>> {
        if let Some(state) = self.lookup(target) {
            return Some(state);
        }
        // The catalog may have changed since the table was last brought in line.
        if *self.catalog_version.borrow() != self.table.load().version {
            self.sync();
            return self.lookup(target);
        }
        None
    }

    /// The revision a request goes to, or a 404 reason.
    pub(crate) fn resolve(
        &self,
        target: Target<'_>,
    ) -> Result<LocalArc<RevisionState>, ActivatorError> {
        if let Some(state) = self.find(target) {
            return Ok(state);
        }
        Err(ActivatorError::NotFound(match target {
            Target::Named { namespace, name } => format!("revision {namespace}/{name} not found"),
            Target::Host(host) => format!("no revision routes host {host}"),
        }))
    }

    fn lookup(&self, target: Target<'_>) -> Option<LocalArc<RevisionState>> {
        let table = self.table.load();
        let known = match target {
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
        }?;
        self.state_of(known).map(PerCoreArc::local)
    }

    /// The states created so far (for the reporter and drain): revisions never requested
    /// have none.
    pub(crate) fn states(&self) -> Vec<Arc<RevisionState>> {
        self.used_lock().values().cloned().collect()
    }

    /// Every known revision, used or not (the admin API).
    pub(crate) fn known(&self) -> Vec<Arc<Known>> {
        self.table.load().iter().cloned().collect()
    }

    /// How many revisions the table knows, and how many of them have a state.
    pub fn revision_counts(&self) -> (usize, usize) {
        let known = self.table.load().by_ns.values().map(|m| m.len()).sum();
        (known, self.used_lock().len())
    }

    /// Tags what it forwards to a queue sidecar with the revision's tag from `tagger`
    /// ([`crate::knative::proxy_tag`]); without one, `K-Proxy-Request` says `activator`, which
    /// no sidecar counts as proxied. Set once, before serving; later calls are ignored.
    pub fn use_proxy_tags(&self, tagger: Arc<Tagger>) {
        let _ = self.proxy_tags.set(tagger);
    }

    /// The `K-Proxy-Request` value for `state`'s revision: computed once per revision, UID
    /// and key, cached in the state.
    pub(crate) fn proxy_tag(&self, state: &RevisionState) -> Option<HeaderValue> {
        let tagger = self.proxy_tags.get()?;
        let (key, spec) = (&state.key, state.spec.load());
        tagger.value(
            &state.proxy_tag,
            &key.namespace,
            &key.name,
            spec.uid.as_ref(),
        )
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

/// Where the route check puts a request ([`Activator::place`]).
pub(crate) enum Placed {
    /// The revision it goes to.
    Ready(LocalArc<RevisionState>),
    /// Nowhere yet: it waits for the catch-up ([`Activator::place_after_catch_up`]).
    Wait(Pending),
}

/// A request's target and host, owned, for the catch-up to try again (only requests that
/// wait pay for the copy).
#[derive(Debug)]
pub(crate) struct Pending {
    host: Option<Box<str>>,
    /// The revision a gateway named, `(namespace, name)`; else the host routes.
    named: Option<(Box<str>, Box<str>)>,
}

impl Pending {
    fn of(target: Target<'_>, host: Option<&str>) -> Self {
        match target {
            Target::Named { namespace, name } => Self {
                host: host.map(Box::from),
                named: Some((namespace.into(), name.into())),
            },
            Target::Host(h) => Self {
                host: Some(h.into()),
                named: None,
            },
        }
    }

    fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    fn target(&self) -> Target<'_> {
        match &self.named {
            Some((namespace, name)) => Target::Named { namespace, name },
            None => Target::Host(self.host.as_deref().unwrap_or_default()),
        }
    }
}
