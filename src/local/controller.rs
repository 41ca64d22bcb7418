//! The local controller: Knative's Service -> Configuration -> Revision -> Route chain, in
//! process. It turns a [`LocalModel`] into revisions on the [`LocalPlatform`] and a
//! [`CatalogSnapshot`] with routes.
//!
//! - A service starts at generation 1 (`hello-00001`). A changed revision template creates the
//!   next generation; earlier revisions stay (reachable by their own host) and scale to zero
//!   when idle, as Knative's do.
//! - The route `{service}.{namespace}.{domain}` (and the cluster-local names
//!   `{service}.{namespace}[.svc[.cluster.local]]`) points at the newest revision that became ready
//!   (Knative's latestReadyRevision), or at the newest revision while none has been ready yet,
//!   so the first request is held for it. A revision is ready once it has had a ready endpoint,
//!   or at once when its initial scale is 0 (as Knative marks it).
//! - A removed service's revisions are removed from the platform first (held requests get 503
//!   with the reason), then from the catalog.
//! - ConfigMap changes re-resolve every revision's effective spec; a revision whose spec no
//!   longer resolves keeps its last good spec (and the problem is logged).
//! - Old revisions are collected by `config-gc`'s rules ([`crate::config::gc`]), as Knative's
//!   collector does per Configuration: after every change and every [`GC_PERIOD`]. A routed,
//!   latest created or latest ready revision is never collected. A collected revision leaves
//!   the platform (its replicas stop) and the catalog (so `/revisions`), as a removed one does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::config::{self as local_config, RevisionTemplateSpec, TrafficTarget};
use super::model::{LocalModel, ServiceModel};
use crate::config::gc::{GcCandidate, collectable};
use crate::platform::EndpointSource;
use crate::platform::local::{LocalPlatform, LocalRevision};
use crate::revision::{
    CatalogSnapshot, Protocol, RevisionCatalog, RevisionKey, RevisionSpec, RouteView, TrafficView,
};

/// How often revision garbage collection runs besides after each change (its time rules need
/// time to pass).
pub const GC_PERIOD: Duration = Duration::from_secs(10);

/// Identity of a service: (namespace, name).
type ServiceId = (String, String);

#[derive(Debug)]
struct ServiceState {
    /// The newest generation (the latest created revision).
    generation: u64,
    /// Every generation's template, to re-resolve its spec when ConfigMaps change.
    templates: BTreeMap<u64, RevisionTemplateSpec>,
    /// Every generation's last good effective spec.
    specs: BTreeMap<u64, RevisionSpec>,
    /// The newest generation that has been ready (latestReadyRevision).
    ready: Option<u64>,
    /// Per generation: when it was created and when it was last routed (`None`: routed now or
    /// never), for `config-gc`'s time rules.
    created: BTreeMap<u64, Instant>,
    unrouted_at: BTreeMap<u64, Instant>,
    /// The service's traffic split as local.yaml gives it (empty: all to the latest ready).
    traffic: Vec<TrafficTarget>,
}

impl ServiceState {
    /// The revision name of generation `g` (its template's own name, or `{service}-0000g`).
    fn name_of(&self, service: &str, g: u64) -> String {
        match self.templates.get(&g) {
            Some(t) => super::model::revision_name_of(service, g, t),
            None => super::model::revision_name(service, g),
        }
    }

    /// The generation a traffic target points at: a named revision, or the latest ready one
    /// (the newest while none has been ready, so the first request is held for it).
    fn resolve(&self, service: &str, t: &TrafficTarget) -> Option<u64> {
        match &t.revision_name {
            Some(name) => self
                .templates
                .keys()
                .copied()
                .find(|g| self.name_of(service, *g) == *name),
            None => Some(self.ready.unwrap_or(self.generation)),
        }
    }

    /// The default route's split: (generation, percent) with percents merged per generation
    /// and zero shares left out. Targets naming a revision that does not exist are left out
    /// (Knative's route would say RevisionMissing).
    fn split(&self, service: &str) -> Vec<(u64, u32)> {
        if self.traffic.is_empty() {
            return vec![(self.ready.unwrap_or(self.generation), 100)];
        }
        let mut merged: BTreeMap<u64, u32> = BTreeMap::new();
        for t in &self.traffic {
            let percent = u32::try_from(t.percent.unwrap_or(0)).unwrap_or(0);
            if let Some(g) = self.resolve(service, t)
                && percent > 0
            {
                *merged.entry(g).or_default() += percent;
            }
        }
        merged.into_iter().collect()
    }

    /// Tagged targets: (tag, generation).
    fn tags(&self, service: &str) -> Vec<(String, u64)> {
        self.traffic
            .iter()
            .filter_map(|t| Some((t.tag.clone()?, self.resolve(service, t)?)))
            .collect()
    }

    /// The generations the route sends traffic to (by percent or by tag).
    fn routed_of(&self, service: &str) -> BTreeSet<u64> {
        self.split(service)
            .into_iter()
            .map(|(g, _)| g)
            .chain(self.tags(service).into_iter().map(|(_, g)| g))
            .collect()
    }

    /// The route as operators read it: each target with the revision it resolves to now, its
    /// percent and its tag's host.
    fn view(&self, ns: &str, service: &str, domain: &str, port: u16) -> RouteView {
        let host_of = |name: &str| super::model::route_hosts(name, ns, domain).remove(0);
        let latest = || self.name_of(service, self.ready.unwrap_or(self.generation));
        let traffic = if self.traffic.is_empty() {
            vec![TrafficView {
                revision_name: Some(latest()),
                percent: 100,
                latest_revision: true,
                tag: None,
                tag_host: None,
            }]
        } else {
            self.traffic
                .iter()
                .map(|t| TrafficView {
                    revision_name: self.resolve(service, t).map(|g| self.name_of(service, g)),
                    percent: u32::try_from(t.percent.unwrap_or(0)).unwrap_or(0),
                    latest_revision: t.revision_name.is_none(),
                    tag: t.tag.clone(),
                    tag_host: t
                        .tag
                        .as_ref()
                        .map(|tag| host_of(&format!("{tag}-{service}"))),
                })
                .collect()
        };
        let host = host_of(service);
        RouteView {
            namespace: ns.to_string(),
            service: service.to_string(),
            url: url_of(&host, port),
            host,
            traffic,
        }
    }

    /// Records that the route moved from `before` to the current routed set at `now`.
    fn route_moved(&mut self, service: &str, before: &BTreeSet<u64>, now: Instant) {
        let after = self.routed_of(service);
        for g in before.difference(&after) {
            self.unrouted_at.insert(*g, now);
        }
        for g in &after {
            self.unrouted_at.remove(g);
        }
    }

    /// The generations `config-gc` collects now.
    fn collectable(&self, service: &str, gc: &crate::config::GcConfig, now: Instant) -> Vec<u64> {
        let routed = self.routed_of(service);
        let candidates: Vec<GcCandidate<u64>> = self
            .templates
            .keys()
            .map(|g| {
                let created = self.created.get(g).copied().unwrap_or(now);
                let last_active = if routed.contains(g) {
                    now
                } else {
                    self.unrouted_at.get(g).copied().unwrap_or(created)
                };
                GcCandidate {
                    key: *g,
                    active: routed.contains(g) || *g == self.generation || self.ready == Some(*g),
                    age: now.saturating_duration_since(created),
                    inactive_for: now.saturating_duration_since(last_active),
                }
            })
            .collect();
        collectable(gc, &candidates)
    }
}

#[derive(Debug)]
struct State {
    model: Arc<LocalModel>,
    services: BTreeMap<ServiceId, ServiceState>,
}

/// Applies local.yaml models to the platform and the catalog. Cheap to share (`Arc`).
pub struct LocalController {
    platform: LocalPlatform,
    catalog: Arc<RevisionCatalog>,
    state: Mutex<State>,
    /// The data port, for the routes' URLs (`/routes`, the start-up lines).
    data_port: u16,
}

impl LocalController {
    /// A controller serving `model`: registers its revisions and publishes the catalog. Route
    /// URLs name `data_port` (thaw's data port).
    pub fn start(
        platform: LocalPlatform,
        catalog: Arc<RevisionCatalog>,
        model: Arc<LocalModel>,
        data_port: u16,
    ) -> Arc<Self> {
        let c = Arc::new(Self {
            platform,
            catalog,
            state: Mutex::new(State {
                model: model.clone(),
                services: BTreeMap::new(),
            }),
            data_port,
        });
        c.apply(model);
        let weak = Arc::downgrade(&c);
        tokio::spawn(collect_periodically(weak));
        c
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a new (validated) model: new services and changed templates create revisions,
    /// removed services are removed, every spec is re-resolved, and the catalog is replaced.
    pub fn apply(self: &Arc<Self>, model: Arc<LocalModel>) {
        let mut new_revisions = Vec::new();
        let mut st = self.lock();
        st.model = model.clone();
        let wanted: BTreeMap<ServiceId, &ServiceModel> = model
            .services
            .iter()
            .map(|s| ((s.namespace.clone(), s.name.clone()), s))
            .collect();
        // Removed services.
        let gone: Vec<ServiceId> = st
            .services
            .keys()
            .filter(|id| !wanted.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(svc) = st.services.remove(&id) {
                for g in svc.templates.keys() {
                    let key = RevisionKey::new(&id.0, svc.name_of(&id.1, *g));
                    self.platform.remove(
                        &key,
                        &format!("service {}/{} was removed from local.yaml", id.0, id.1),
                    );
                }
                info!(service = %format!("{}/{}", id.0, id.1), "service removed");
            }
        }
        // New services and new generations.
        for (id, s) in &wanted {
            let svc = st
                .services
                .entry(id.clone())
                .or_insert_with(|| ServiceState {
                    generation: 0,
                    templates: BTreeMap::new(),
                    specs: BTreeMap::new(),
                    ready: None,
                    created: BTreeMap::new(),
                    unrouted_at: BTreeMap::new(),
                    traffic: Vec::new(),
                });
            let before = svc.routed_of(&id.1);
            if svc.templates.get(&svc.generation) != Some(&s.template) {
                let taken = s.template.metadata.name.as_ref().and_then(|want| {
                    svc.templates
                        .keys()
                        .find(|g| svc.name_of(&id.1, **g) == *want)
                        .map(|_| want.clone())
                });
                if let Some(name) = taken {
                    // Knative refuses a changed template that keeps a revision name in use.
                    warn!(service = %format!("{}/{}", id.0, id.1), revision = %name,
                        "the revision template changed but keeps template.metadata.name {name}, \
                         which is taken: no new revision (give it a new name)");
                } else {
                    svc.generation += 1;
                    svc.templates.insert(svc.generation, s.template.clone());
                    svc.created.insert(svc.generation, Instant::now());
                    let key = s.key(svc.generation);
                    info!(revision = %key, "revision created");
                    new_revisions.push(key);
                }
            }
            if svc.traffic != s.traffic {
                warn_pinned_to_new(id, svc, &s.traffic);
            }
            svc.traffic = s.traffic.clone();
            svc.route_moved(&id.1, &before, Instant::now());
        }
        // Specs and platform definitions for every revision under the current ConfigMaps.
        // A sidecar cuts stalled request bodies as the activator does (config-activator's key).
        let sidecar = model
            .sidecar
            .then(|| model.configs.activator.request_body_idle_timeout);
        for (id, svc) in st.services.iter_mut() {
            let Some(s) = wanted.get(id) else { continue };
            for (g, template) in &svc.templates {
                let as_of = ServiceModel {
                    template: template.clone(),
                    ..(*s).clone()
                };
                match as_of.revision_spec(*g, &model.domain, &model.configs) {
                    Ok(spec) => {
                        self.platform
                            .upsert(local_revision(&spec, template, sidecar));
                        svc.specs.insert(*g, spec);
                    }
                    Err(e) => warn!(revision = %as_of.key(*g), problems = %e,
                        "revision no longer valid under the new configuration; keeping its last \
                         good settings"),
                }
            }
        }
        self.collect_garbage(&mut st, Instant::now());
        self.publish(&st);
        drop(st);
        for key in new_revisions {
            self.watch_ready(key);
        }
    }

    /// Applies `config-gc` to every service at `now`: collected revisions leave the platform
    /// and the state. Returns whether any was collected (the caller publishes the catalog).
    fn collect_garbage(&self, st: &mut State, now: Instant) -> bool {
        let gc = st.model.configs.gc.clone();
        let mut any = false;
        for ((ns, name), svc) in st.services.iter_mut() {
            for g in svc.collectable(name, &gc, now) {
                let key = RevisionKey::new(ns, svc.name_of(name, g));
                svc.templates.remove(&g);
                svc.specs.remove(&g);
                svc.created.remove(&g);
                svc.unrouted_at.remove(&g);
                self.platform
                    .remove(&key, "the revision was garbage-collected (config-gc)");
                info!(revision = %key, "revision collected (config-gc)");
                any = true;
            }
        }
        any
    }

    /// Replaces the catalog from the state: every revision, each service's route (its hosts
    /// and their split) and its tag hosts `{tag}-{service}.{namespace}.{domain}`.
    fn publish(&self, st: &State) {
        let mut revisions = Vec::new();
        let mut routes = Vec::new();
        let mut splits = Vec::new();
        let mut views = Vec::new();
        let domain = &st.model.domain;
        for ((ns, name), svc) in &st.services {
            views.push(svc.view(ns, name, domain, self.data_port));
            revisions.extend(svc.specs.values().cloned());
            let key_of = |g: u64| RevisionKey::new(ns, svc.name_of(name, g));
            let missing: Vec<&str> = svc
                .traffic
                .iter()
                .filter(|t| svc.resolve(name, t).is_none())
                .filter_map(|t| t.revision_name.as_deref())
                .collect();
            if !missing.is_empty() {
                warn!(service = %format!("{ns}/{name}"), missing = ?missing,
                    "traffic names revisions that do not exist; their share is left out");
            }
            let split: Vec<(RevisionKey, u32)> = svc
                .split(name)
                .into_iter()
                .map(|(g, p)| (key_of(g), p))
                .collect();
            // The host table holds the largest share (the newest on a tie); the whole split
            // is published beside it for a per-request choice.
            if let Some((key, _)) = split.iter().rev().max_by_key(|(_, p)| *p) {
                for host in super::model::route_hosts(name, ns, domain) {
                    routes.push((host.clone(), key.clone()));
                    if split.len() > 1 {
                        splits.push((host, split.clone()));
                    }
                }
            }
            for (tag, g) in svc.tags(name) {
                for host in super::model::route_hosts(&format!("{tag}-{name}"), ns, domain) {
                    routes.push((host, key_of(g)));
                }
            }
        }
        self.catalog.store(
            CatalogSnapshot::new(revisions, routes)
                .with_splits(splits)
                .with_route_views(views),
        );
    }

    /// Every route as `/routes` shows it.
    pub fn routes(&self) -> Vec<RouteView> {
        self.catalog.load().route_views().to_vec()
    }

    /// Marks `key` ready once it has a ready endpoint (or at once with initial scale 0) and
    /// moves its service's route to it if it is the newest ready generation.
    fn watch_ready(self: &Arc<Self>, key: RevisionKey) {
        let zero_initial = {
            let st = self.lock();
            st.services
                .values()
                .flat_map(|s| s.specs.values())
                .any(|spec| spec.key == key && spec.autoscaling.initial_scale == 0)
        };
        if zero_initial {
            self.mark_ready(&key);
            return;
        }
        let mut rx = self.platform.endpoints(&key);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                if !rx.borrow_and_update().ready.is_empty() {
                    this.mark_ready(&key);
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    fn mark_ready(&self, key: &RevisionKey) {
        let mut st = self.lock();
        let Some((id, generation)) = st.services.iter().find_map(|(id, svc)| {
            svc.specs
                .iter()
                .find(|(_, s)| s.key == *key)
                .map(|(g, _)| (id.clone(), *g))
        }) else {
            return;
        };
        let Some(svc) = st.services.get_mut(&id) else {
            return;
        };
        if svc.ready.is_some_and(|r| r >= generation) {
            return;
        }
        let before = svc.routed_of(&id.1);
        svc.ready = Some(generation);
        svc.route_moved(&id.1, &before, Instant::now());
        let share = svc
            .split(&id.1)
            .into_iter()
            .find(|(g, _)| *g == generation)
            .map_or(0, |(_, p)| p);
        let tags: Vec<String> = svc
            .tags(&id.1)
            .into_iter()
            .filter(|(_, g)| *g == generation)
            .map(|(t, _)| t)
            .collect();
        let route = super::model::route_hosts(&id.1, &id.0, &st.model.domain).remove(0);
        let gets = match (share, tags.is_empty()) {
            (100, _) => format!("{route} sends it all traffic"),
            (0, true) => format!("{route} sends it no traffic (traffic names other revisions)"),
            (0, false) => format!("reached by its tag only ({})", tags.join(", ")),
            (p, _) => format!("{route} sends it {p}% of requests"),
        };
        info!(revision = %key, percent = share, "revision ready; {gets}");
        self.collect_garbage(&mut st, Instant::now());
        self.publish(&st);
    }
}

/// `http://{host}` with the port unless it is 80.
pub fn url_of(host: &str, port: u16) -> String {
    if port == 80 {
        format!("http://{host}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// Warns when `traffic` pins a revision by name (`revisionName`) that this thaw created since
/// it started: revision names restart at `-00001` on every start of `thaw local`, so a pinned
/// name can point at other code than it did before a restart (nothing is stored between
/// starts). Said when the traffic changes, not on every reload.
fn warn_pinned_to_new(id: &ServiceId, svc: &ServiceState, traffic: &[TrafficTarget]) {
    for t in traffic {
        let Some(name) = &t.revision_name else {
            continue;
        };
        let Some(g) = svc.resolve(&id.1, t) else {
            continue;
        };
        // A name of the service's own numbering (not `template.metadata.name`) is the one that
        // restarts.
        if *name == super::model::revision_name(&id.1, g) {
            warn!(service = %format!("{}/{}", id.0, id.1), revision = %name,
                "traffic pins revisionName {name}, a revision numbered at this start of thaw \
                 local: numbers restart at -00001 on every start, so after a restart this name \
                 may run other code. Pin a revision you name yourself (template.metadata.name) \
                 to keep it stable");
        }
    }
}

/// Runs revision garbage collection every [`GC_PERIOD`] while the controller lives.
async fn collect_periodically(controller: Weak<LocalController>) {
    let mut every = tokio::time::interval(GC_PERIOD);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(c) = controller.upgrade() else {
            return;
        };
        let mut st = c.lock();
        if c.collect_garbage(&mut st, Instant::now()) {
            c.publish(&st);
        }
    }
}

/// How the platform runs a revision: its container's command, args, env and readiness probe;
/// with `sidecar` (its request-body idle timeout), behind a `thaw queue` sidecar
/// ([`behind_sidecar`]).
fn local_revision(
    spec: &RevisionSpec,
    template: &RevisionTemplateSpec,
    sidecar: Option<std::time::Duration>,
) -> LocalRevision {
    let def = container_revision(spec, template);
    match sidecar {
        Some(body_idle) => behind_sidecar(spec, def, body_idle),
        None => def,
    }
}

/// The replica as `thaw queue -- COMMAND`: the sidecar is the process the platform starts and
/// probes (it opens `PORT` only once the container answers its own probe, given to it as
/// `SERVING_READINESS_PROBE`), and it starts the container on the declared `containerPort`
/// (else a free port) as `USER_PORT`. Its settings are the revision's, as the controller
/// will set them on Kubernetes. No drain delay: the platform stops a replica only once the
/// activator has nothing in flight to it.
fn behind_sidecar(
    spec: &RevisionSpec,
    mut def: LocalRevision,
    body_idle: std::time::Duration,
) -> LocalRevision {
    use crate::queue::settings as q;
    let mut command = vec!["thaw".to_string(), "queue".into(), "--".into()];
    command.append(&mut def.command);
    def.command = command;
    let secs = |d: std::time::Duration| d.as_secs().to_string();
    let t = spec.timeouts;
    let service = spec.service.as_deref().unwrap_or_default().to_string();
    let mut env = vec![
        (q::SERVING_NAMESPACE, spec.key.namespace.to_string()),
        (q::SERVING_REVISION, spec.key.name.to_string()),
        (q::SERVING_CONFIGURATION, service.clone()),
        (q::SERVING_SERVICE, service),
        (
            q::CONTAINER_CONCURRENCY,
            spec.container_concurrency.to_string(),
        ),
        (q::REVISION_TIMEOUT_SECONDS, secs(t.total)),
        (
            q::REVISION_RESPONSE_START_TIMEOUT_SECONDS,
            secs(t.response_start),
        ),
        (
            q::REVISION_IDLE_TIMEOUT_SECONDS,
            t.idle.map_or("0".into(), secs),
        ),
        (q::THAW_DRAIN_DELAY, "0s".into()),
        (
            q::THAW_REQUEST_BODY_IDLE_TIMEOUT,
            crate::config::parse::format_duration(body_idle),
        ),
    ];
    if let Some(port) = def.port.take() {
        env.push((q::USER_PORT, port.to_string()));
    }
    if spec.protocol == Protocol::H2c {
        env.push((q::THAW_USER_PROTOCOL, "h2c".into()));
    }
    if let Some(service) = def.readiness_grpc.take() {
        // The sidecar runs it against the user port (no port: the user port).
        let probe = serde_json::json!({"grpc": {"service": service}});
        env.push((q::SERVING_READINESS_PROBE, probe.to_string()));
    } else if let Some(path) = def.readiness_path.take() {
        let probe = serde_json::json!({"httpGet": {"path": path}});
        env.push((q::SERVING_READINESS_PROBE, probe.to_string()));
    }
    // The sidecar's own lines at warn and above (the container's output is logged as ever).
    if !def.env.iter().any(|(k, _)| k == "RUST_LOG") {
        env.push(("RUST_LOG", "warn".into()));
    }
    def.env
        .extend(env.into_iter().map(|(k, v)| (k.to_string(), v)));
    def
}

/// The container as the platform runs it without a sidecar.
fn container_revision(spec: &RevisionSpec, template: &RevisionTemplateSpec) -> LocalRevision {
    let Some(c) = local_config::container_of(template) else {
        // Validation guarantees one container; without it every start fails visibly.
        return LocalRevision::new(spec.key.clone(), Vec::<String>::new());
    };
    let mut def = LocalRevision::new(spec.key.clone(), local_config::command_of(c));
    def.env = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    def.readiness_path = local_config::readiness_path_of(c);
    def.readiness_grpc = local_config::readiness_grpc_of(c);
    def.protocol = spec.protocol;
    def.port = local_config::container_port_of(c);
    def.drain_timeout = Some(spec.timeouts.total);
    // Knative's progress deadline: how long a replica may take to become ready.
    def.startup_timeout = Some(spec.autoscaling.progress_deadline);
    def
}
