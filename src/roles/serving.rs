//! The serving-mode swap (Knative's ServerlessService): the autoscaler leader owns each
//! revision's **public** EndpointSlices (the public Service `<revision>` has no selector) and
//! points them at the ready activators (Proxy) or at the revision's ready pods (Serve).
//!
//! - **Serve** only when the scaler says the activator may leave the path (the revision wants
//!   pods and its excess burst capacity is not negative; `target-burst-capacity: -1` never),
//!   the pods are ready in the private slices, and the revision's pod stats flow (else the
//!   autoscaler would be blind to the traffic that bypasses the activators). Otherwise Proxy.
//! - Slices are applied server-side with the field manager `autoscaler.thaw.dev`, labelled
//!   `endpointslice.kubernetes.io/managed-by: autoscaler.thaw.dev` and
//!   `kubernetes.io/service-name: <service>`, owned by the Service, with the Service's port
//!   names, one slice per distinct set of ports (activators in a test listen on different
//!   ports; pods do not). Slices it no longer needs are deleted after the new ones are written.
//! - **Order.** Back to Proxy: the activators' slices are written first; the
//!   "activator in path since" of the revision ([`InPath::confirm`]) starts at that successful
//!   write, and the scaler takes the revision to zero only a grace period after it. To Serve:
//!   [`InPath::clear`] after the pods' slices are written.
//! - Also writes the autoscaler's part of the Revision status (`actualReplicas`,
//!   `desiredReplicas`, `Active`).
//!
//! One task per revision with a public Service, on the leader only; each wakes on its scale
//! state, its endpoints, the activator set, its public Service, and (while it wants pods) each
//! second to see whether its pod stats started flowing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::pull::PodStatsFlow;
use crate::autoscaler::scaler::{InPath, ScaleState, ScaleStates};
use crate::knative::duck::ConditionStatus;
use crate::knative::names::{child_name, labels};
use crate::knative::status::{
    AUTOSCALER_FIELD_MANAGER, Activity, active_condition, initialized_condition,
};
use crate::platform::kubernetes::service_slices::ServiceEndpoints;
use crate::platform::kubernetes::{APP_PROTOCOL_H2C, KubePlatform, PORT_NAME_HTTP2};
use crate::platform::{EndpointSnapshot, EndpointSource, EndpointStatus, Found, Platform};
use crate::revision::{Protocol, RevisionCatalog, RevisionKey};
use crate::telemetry::autoscaler::{AutoscalerMetrics, WriteLabels};

/// A revision's public Service as the swap needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicService {
    pub name: String,
    pub uid: String,
    /// (port name, appProtocol).
    pub ports: Vec<(String, Option<String>)>,
}

/// Where a revision's public endpoints point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Proxy,
    Serve,
}

/// What one public slice holds besides its addresses: IPv6 or not, and its (name, port)s.
type SliceShape = (bool, Vec<(String, u16)>);

/// One endpoint of a public slice: an IP and its port per port name.
pub type Backend = (std::net::IpAddr, BTreeMap<String, u16>);

/// The mode a revision should be in.
pub fn mode(state: &ScaleState, snap: &EndpointSnapshot, stats_flow: bool) -> Mode {
    if state.activator_in_path || snap.ready.is_empty() || !stats_flow {
        Mode::Proxy
    } else {
        Mode::Serve
    }
}

/// The serving mode of a revision of another autoscaler class (Knative's HPA): its pods once
/// one is ready (no pod stats needed: the KPA does not scale it), the activators before.
pub fn hpa_mode(snap: &EndpointSnapshot) -> Mode {
    if snap.ready.is_empty() {
        Mode::Proxy
    } else {
        Mode::Serve
    }
}

/// The autoscaler's status of an HPA-class revision, as Knative's HPA reconciler writes it:
/// always Active, desired the Deployment's replicas (the HPA's), initialized once `ready`
/// reaches max(min-scale, initial-scale).
pub fn hpa_status(
    spec: Option<&crate::revision::RevisionSpec>,
    ready: i32,
    replicas: Option<u32>,
) -> (ScaleState, Activity) {
    let threshold = spec.map_or(1, |s| {
        s.autoscaling.min_scale.max(s.autoscaling.initial_scale)
    });
    let state = ScaleState {
        desired: replicas.map_or(-1, |r| i32::try_from(r).unwrap_or(i32::MAX)),
        decided_at: None,
        activator_in_path: ready == 0,
        initialized: u32::try_from(ready).is_ok_and(|r| r >= threshold),
        activity: None,
    };
    (state, Activity::Active)
}

/// The backends of the public slices: the activators' ports of the same names (Proxy), or the
/// pods' serving port under the port name of the revision's protocol (Serve).
pub fn backends(
    mode: Mode,
    svc: &PublicService,
    protocol: Protocol,
    activators: &ServiceEndpoints,
    snap: &EndpointSnapshot,
) -> Vec<Backend> {
    // Normally one IP is one pod; several listeners on one IP (a test's loopback) are kept
    // apart: an address joins the IP's first backend that has no port of that name yet.
    let mut out: Vec<Backend> = Vec::new();
    for (port_name, app) in &svc.ports {
        let h2c = port_name == PORT_NAME_HTTP2 || app.as_deref() == Some(APP_PROTOCOL_H2C);
        let addrs: &[SocketAddr] = match mode {
            Mode::Proxy => activators.port(port_name),
            Mode::Serve if h2c == (protocol == Protocol::H2c) => &snap.ready,
            Mode::Serve => &[],
        };
        for a in addrs {
            match out
                .iter_mut()
                .find(|(ip, ports)| *ip == a.ip() && !ports.contains_key(port_name))
            {
                Some((_, ports)) => {
                    ports.insert(port_name.clone(), a.port());
                }
                None => out.push((a.ip(), BTreeMap::from([(port_name.clone(), a.port())]))),
            }
        }
    }
    out.sort();
    out
}

/// The slices for `backends`: one per distinct port map (and address family).
/// Endpoints per EndpointSlice at most: the API server refuses a slice with more.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

pub fn slices(
    key: &RevisionKey,
    svc: &PublicService,
    backends: &[Backend],
) -> BTreeMap<String, serde_json::Value> {
    let mut groups: BTreeMap<SliceShape, BTreeSet<std::net::IpAddr>> = BTreeMap::new();
    for (ip, ports) in backends {
        let ports: Vec<(String, u16)> = ports.iter().map(|(k, v)| (k.clone(), *v)).collect();
        groups.entry((ip.is_ipv6(), ports)).or_default().insert(*ip);
    }
    let mut out = BTreeMap::new();
    for ((v6, ports), all_ips) in groups {
        let all_ips: Vec<std::net::IpAddr> = all_ips.into_iter().collect();
        for (chunk, ips) in all_ips.chunks(MAX_ENDPOINTS_PER_SLICE).enumerate() {
            let sig: String = ports
                .iter()
                .map(|(n, p)| format!("{n}{p}"))
                .collect::<Vec<_>>()
                .join("-");
            // The first slice of a shape keeps the name it always had; more are numbered.
            let more = if chunk == 0 {
                String::new()
            } else {
                format!("-{chunk}")
            };
            let name = child_name(
                &svc.name,
                &format!("-{}{:x}{more}", if v6 { "6-" } else { "" }, fnv(&sig)),
            );
            let slice_ports: Vec<serde_json::Value> = ports
                .iter()
                .map(|(n, p)| {
                    let app = svc
                        .ports
                        .iter()
                        .find(|(pn, _)| pn == n)
                        .and_then(|(_, a)| a.clone());
                    let mut v = serde_json::json!({"name": n, "port": p, "protocol": "TCP"});
                    if let Some(a) = app {
                        v["appProtocol"] = a.into();
                    }
                    v
                })
                .collect();
            let endpoints: Vec<serde_json::Value> = ips
                .iter()
                .map(|ip| {
                    serde_json::json!({"addresses": [ip.to_string()],
                    "conditions": {"ready": true, "serving": true, "terminating": false}})
                })
                .collect();
            let body = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "namespace": &*key.namespace,
                    "labels": {
                        labels::ENDPOINTSLICE_SERVICE_NAME: svc.name,
                        labels::ENDPOINTSLICE_MANAGED_BY: labels::MANAGED_BY_AUTOSCALER,
                        labels::REVISION: &*key.name,
                        labels::SERVICE_TYPE: labels::SERVICE_TYPE_PUBLIC,
                    },
                    "ownerReferences": [{
                        "apiVersion": "v1", "kind": "Service", "name": svc.name, "uid": svc.uid,
                        "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "addressType": if v6 { "IPv6" } else { "IPv4" },
                "ports": slice_ports,
                "endpoints": endpoints,
            });
            out.insert(name, body);
        }
    }
    out
}

fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Follows the public Services (label `networking.internal.knative.dev/serviceType=Public`)
/// of every revision in `namespace` (all when `None`).
pub fn watch_public_services(
    client: kube::Client,
    namespace: Option<&str>,
    stop: CancellationToken,
) -> watch::Receiver<Arc<BTreeMap<RevisionKey, PublicService>>> {
    let (tx, rx) = watch::channel(Arc::new(BTreeMap::new()));
    let api: Api<Service> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let cfg = watcher::Config::default().labels(&format!(
        "{}={},{}",
        labels::SERVICE_TYPE,
        labels::SERVICE_TYPE_PUBLIC,
        labels::REVISION
    ));
    tokio::spawn(
        async move {
            let mut s = std::pin::pin!(watch_stream(api, cfg).default_backoff());
            let mut all: BTreeMap<RevisionKey, PublicService> = BTreeMap::new();
            let mut listing: Option<BTreeMap<RevisionKey, PublicService>> = None;
            let parse = |svc: &Service| -> Option<(RevisionKey, PublicService)> {
                let rev = svc.labels().get(labels::REVISION)?;
                let key = RevisionKey::new(svc.namespace()?, rev);
                let ports = svc
                    .spec
                    .as_ref()?
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| Some((p.name.clone()?, p.app_protocol.clone())))
                    .collect();
                Some((
                    key,
                    PublicService {
                        name: svc.name_any(),
                        uid: svc.uid()?,
                        ports,
                    },
                ))
            };
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                match ev {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watch error; resuming");
                        continue;
                    }
                    Some(Ok(Event::Init)) => {
                        listing = Some(BTreeMap::new());
                        continue;
                    }
                    Some(Ok(Event::InitApply(svc))) => {
                        if let (Some(l), Some((k, p))) = (listing.as_mut(), parse(&svc)) {
                            l.insert(k, p);
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => all = listing.take().unwrap_or_default(),
                    Some(Ok(Event::Apply(svc))) => {
                        if let Some((k, p)) = parse(&svc) {
                            all.insert(k, p);
                        }
                    }
                    Some(Ok(Event::Delete(svc))) => {
                        if let Some((k, _)) = parse(&svc) {
                            all.remove(&k);
                        }
                    }
                }
                tx.send_replace(Arc::new(all.clone()));
            }
        }
        .instrument(tracing::info_span!("watch", resource = "services")),
    );
    rx
}

/// What every revision's swap task shares.
pub struct Swap {
    pub client: kube::Client,
    pub platform: KubePlatform,
    pub catalog: Arc<RevisionCatalog>,
    pub states: Arc<ScaleStates>,
    pub in_path: Arc<InPath>,
    pub flow: Arc<PodStatsFlow>,
    pub activators: watch::Receiver<Arc<ServiceEndpoints>>,
    pub services: watch::Receiver<Arc<BTreeMap<RevisionKey, PublicService>>>,
    /// The public slices as the cluster holds them (every replica follows them).
    pub public: watch::Receiver<PublicSlices>,
    /// Writes of public slices and Revision status.
    pub metrics: AutoscalerMetrics,
    /// Slice and status writes made (for the takeover's count).
    pub writes: AtomicU64,
    /// Each revision's mode as last written or found, for `/revisions`.
    pub modes: DashMap<RevisionKey, ModeView>,
    /// Revision tasks of this term that have not finished their first pass.
    pub first_pass_pending: AtomicUsize,
    /// Bounds the slice and status writes in flight at once ([`WRITES_IN_FLIGHT`]), so a
    /// takeover or an activator change over thousands of revisions queues here instead of
    /// flooding the API server (and starving the Lease renewal).
    pub write_permits: tokio::sync::Semaphore,
}

/// Public-slice and status writes the leader has in flight at most.
pub const WRITES_IN_FLIGHT: usize = 32;

/// A revision's serving mode as `/revisions` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeView {
    pub mode: Mode,
    /// Found in the cluster at takeover and not rewritten since.
    pub adopted: bool,
}

impl Swap {
    /// The serving mode `key`'s public slices show now (`None`: none written), judged
    /// against the current activators and ready pods.
    pub fn found_mode(&self, key: &RevisionKey) -> Option<Mode> {
        let found = self.public.borrow().get(key).cloned()?;
        let snap = self.platform.endpoints(key).borrow().clone();
        let acts = self.activators.borrow().clone();
        let svc = self.services.borrow().get(key).cloned()?;
        let protocol = self
            .catalog
            .load()
            .get(key)
            .map_or(Protocol::Http1, |s| s.protocol);
        classify(&found.backends, &svc, protocol, &acts, &snap)
    }

    fn wrote(&self, resource: &'static str) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .api_writes
            .get_or_create(&WriteLabels { resource })
            .inc();
    }
}

/// One revision's public slices as found: their names, owner and backends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FoundSlices {
    pub names: BTreeSet<String>,
    /// The Service that owns them (its uid).
    pub owner: Option<String>,
    pub backends: Vec<Backend>,
}

/// Every revision's public slices written by an autoscaler.
pub type PublicSlices = imbl::OrdMap<RevisionKey, Arc<FoundSlices>>;

/// The mode public slices with `found` backends put a revision in: Serve when they list a
/// ready pod of the revision and no activator, Proxy otherwise; `None` when empty.
pub fn classify(
    found: &[Backend],
    svc: &PublicService,
    protocol: Protocol,
    activators: &ServiceEndpoints,
    snap: &EndpointSnapshot,
) -> Option<Mode> {
    if found.is_empty() {
        return None;
    }
    let proxy = backends(Mode::Proxy, svc, protocol, activators, snap);
    let serve = backends(Mode::Serve, svc, protocol, activators, snap);
    let any_activator = found.iter().any(|b| proxy.contains(b));
    let any_pod = found.iter().any(|b| serve.contains(b));
    Some(if any_pod && !any_activator {
        Mode::Serve
    } else {
        Mode::Proxy
    })
}

/// The backends a public slice lists (ready endpoints, by port name).
fn slice_backends(slice: &EndpointSlice) -> Vec<Backend> {
    let ports: BTreeMap<String, u16> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.port?).ok()?)))
        .collect();
    let mut out = Vec::new();
    for e in &slice.endpoints {
        if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
            continue;
        }
        for a in &e.addresses {
            if let Ok(ip) = a.parse() {
                out.push((ip, ports.clone()));
            }
        }
    }
    out
}

/// Told each revision's public slices as they change (`None`: it has none left): an
/// activator learns its subset from them.
pub type OnPublicChange = Box<dyn Fn(&RevisionKey, Option<&FoundSlices>) + Send + Sync>;

/// Follows the public EndpointSlices an autoscaler wrote (`managed-by`
/// `autoscaler.thaw.dev`) in `namespace` (all when `None`): what a new leader finds, and each
/// activator's subsets (`on_change`). The receiver's second value says whether the first list
/// is done.
pub fn watch_public_slices(
    client: kube::Client,
    namespace: Option<&str>,
    on_change: Option<OnPublicChange>,
    stop: CancellationToken,
) -> (watch::Receiver<PublicSlices>, watch::Receiver<bool>) {
    let (tx, rx) = watch::channel(PublicSlices::new());
    let (synced_tx, synced) = watch::channel(false);
    let api: Api<EndpointSlice> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let cfg = watcher::Config::default().labels(&format!(
        "{}={},{}={}",
        labels::ENDPOINTSLICE_MANAGED_BY,
        labels::MANAGED_BY_AUTOSCALER,
        labels::SERVICE_TYPE,
        labels::SERVICE_TYPE_PUBLIC,
    ));
    tokio::spawn(
        async move {
            let mut s = std::pin::pin!(watch_stream(api, cfg).default_backoff());
            // Per revision, per slice name: the slice's owner and backends.
            type Slices = BTreeMap<RevisionKey, BTreeMap<String, (Option<String>, Vec<Backend>)>>;
            let mut all: Slices = BTreeMap::new();
            let mut listing: Option<Slices> = None;
            let key_of = |sl: &EndpointSlice| -> Option<RevisionKey> {
                Some(RevisionKey::new(
                    sl.namespace()?,
                    sl.labels().get(labels::REVISION)?,
                ))
            };
            let owner_of = |sl: &EndpointSlice| {
                sl.owner_references()
                    .iter()
                    .find(|o| o.kind == "Service")
                    .map(|o| o.uid.clone())
            };
            let found = |m: &BTreeMap<String, (Option<String>, Vec<Backend>)>| {
                let mut f = FoundSlices::default();
                for (name, (owner, b)) in m {
                    f.names.insert(name.clone());
                    f.owner = f.owner.take().or_else(|| owner.clone());
                    f.backends.extend(b.iter().cloned());
                }
                f.backends.sort();
                f.backends.dedup();
                Arc::new(f)
            };
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                let changed: Vec<RevisionKey> = match ev {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "watch error; resuming");
                        continue;
                    }
                    Some(Ok(Event::Init)) => {
                        listing = Some(BTreeMap::new());
                        continue;
                    }
                    Some(Ok(Event::InitApply(sl))) => {
                        if let (Some(l), Some(k)) = (listing.as_mut(), key_of(&sl)) {
                            l.entry(k)
                                .or_default()
                                .insert(sl.name_any(), (owner_of(&sl), slice_backends(&sl)));
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        let before =
                            std::mem::replace(&mut all, listing.take().unwrap_or_default());
                        let map: PublicSlices =
                            all.iter().map(|(k, m)| (k.clone(), found(m))).collect();
                        if let Some(tell) = &on_change {
                            for k in before.keys().filter(|k| !map.contains_key(*k)) {
                                tell(k, None);
                            }
                            for (k, f) in &map {
                                tell(k, Some(f));
                            }
                        }
                        tx.send_replace(map);
                        synced_tx.send_replace(true);
                        continue;
                    }
                    Some(Ok(Event::Apply(sl))) => match key_of(&sl) {
                        Some(k) => {
                            all.entry(k.clone())
                                .or_default()
                                .insert(sl.name_any(), (owner_of(&sl), slice_backends(&sl)));
                            vec![k]
                        }
                        None => continue,
                    },
                    Some(Ok(Event::Delete(sl))) => match key_of(&sl) {
                        Some(k) => {
                            if let Some(m) = all.get_mut(&k) {
                                m.remove(&sl.name_any());
                                if m.is_empty() {
                                    all.remove(&k);
                                }
                            }
                            vec![k]
                        }
                        None => continue,
                    },
                };
                tx.send_modify(|map| {
                    for k in changed {
                        match all.get(&k) {
                            Some(m) => {
                                let f = found(m);
                                if let Some(tell) = &on_change {
                                    tell(&k, Some(&f));
                                }
                                map.insert(k, f);
                            }
                            None => {
                                if let Some(tell) = &on_change {
                                    tell(&k, None);
                                }
                                map.remove(&k);
                            }
                        }
                    }
                });
            }
        }
        .instrument(tracing::info_span!(
            "watch",
            resource = "endpointslices",
            kind = "public"
        )),
    );
    (rx, synced)
}

/// The scaler's platform on Kubernetes: [`KubePlatform`], plus the serving mode each revision
/// was found in (its public slices), so a new leader adopts it.
#[derive(Clone)]
pub struct AdoptingPlatform {
    pub platform: KubePlatform,
    pub swap: Arc<Swap>,
}

impl std::fmt::Debug for AdoptingPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.platform.fmt(f)
    }
}

impl EndpointSource for AdoptingPlatform {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.platform.endpoints(revision)
    }

    fn drained(&self, revision: &RevisionKey, addr: SocketAddr) {
        self.platform.drained(revision, addr);
    }
}

impl Platform for AdoptingPlatform {
    fn scale(
        &self,
        revision: &RevisionKey,
        replicas: u32,
    ) -> crate::platform::BoxFuture<'_, Result<(), crate::platform::PlatformError>> {
        self.platform.scale(revision, replicas)
    }

    fn found(&self, revision: &RevisionKey) -> Found {
        Found {
            activator_in_path: self.swap.found_mode(revision).map(|m| m == Mode::Proxy),
            ..self.platform.found(revision)
        }
    }
}

/// How long after a takeover a revision found served by its pods stays so while its pod
/// stats are not flowing yet (the first pulls of the new leader).
const ADOPTED_SERVE_GRACE: Duration = Duration::from_secs(3);

/// Runs a swap task for each revision that has a public Service, until `stop` (the end of
/// leadership). Tasks start and stop as revisions and Services come and go.
pub async fn run(swap: Arc<Swap>, stop: CancellationToken) {
    let tasks: DashMap<RevisionKey, CancellationToken> = DashMap::new();
    let mut services = swap.services.clone();
    let mut catalog = swap.catalog.subscribe();
    let term_start = Instant::now();
    swap.first_pass_pending.store(0, Ordering::Relaxed);
    loop {
        let svcs = services.borrow_and_update().clone();
        let snapshot = swap.catalog.load();
        for (key, _) in svcs.iter() {
            if snapshot.get(key).is_some() && !tasks.contains_key(key) {
                let token = stop.child_token();
                tasks.insert(key.clone(), token.clone());
                swap.first_pass_pending.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(
                    revision_task(swap.clone(), key.clone(), token, term_start)
                        .instrument(tracing::info_span!("serving_mode", revision = %key)),
                );
            }
        }
        tasks.retain(|key, token| {
            let keep = svcs.contains_key(key) && snapshot.get(key).is_some();
            if !keep {
                token.cancel();
                swap.in_path.clear(key);
                swap.modes.remove(key);
            }
            keep
        });
        tokio::select! {
            _ = stop.cancelled() => return,
            r = services.changed() => if r.is_err() { return },
            r = catalog.changed() => if r.is_err() { return },
        }
    }
}

/// The stored `Active` condition as an [`Activity`].
fn stored_activity(status: ConditionStatus, reason: Option<&str>) -> Activity {
    match (status, reason) {
        (ConditionStatus::True, _) => Activity::Active,
        (ConditionStatus::Unknown, _) => Activity::Activating,
        (ConditionStatus::False, Some("TimedOut")) => Activity::TimedOut,
        (ConditionStatus::False, _) => Activity::Inactive,
    }
}

/// The `Active` condition to write, and since when when the scaler timed it: the scaler's
/// activity (Knative's PodAutoscaler `Active`, which Knative's Revision mirrors) where it is
/// inactive, so `Active=False NoTraffic` is written the moment the revision turns idle, while
/// its last pod waits out the grace period (a new leader continues the grace period from
/// it); otherwise from the pods: active with a ready pod, activating while asked for pods,
/// inactive at zero, timed out when the platform's activation timeout ran out with none ready.
/// The time is the scaler's when its activity is the one written, else the time of writing.
pub fn status_activity(
    status: &EndpointStatus,
    ready: i32,
    state: &ScaleState,
) -> (Activity, Option<Instant>) {
    use crate::autoscaler::lifecycle::{Activity as Scaler, InactiveReason};
    let activity = match (status, ready, state.activity) {
        (EndpointStatus::Failing { reason }, 0, _) if reason.contains("TimedOut") => {
            Activity::TimedOut
        }
        (_, _, Some(Scaler::Inactive { reason, .. })) => match reason {
            InactiveReason::NoTraffic => Activity::Inactive,
            InactiveReason::TimedOut => Activity::TimedOut,
        },
        (_, r, _) if r > 0 => Activity::Active,
        _ if state.desired > 0 => Activity::Activating,
        _ => Activity::Inactive,
    };
    let since = match (activity, state.activity) {
        (Activity::Active, Some(Scaler::Active { since }))
        | (Activity::Activating, Some(Scaler::Activating { since }))
        | (Activity::Inactive | Activity::TimedOut, Some(Scaler::Inactive { since, .. })) => {
            Some(since)
        }
        _ => None,
    };
    (activity, since)
}

/// What the status write covers: (desired, actual, activity, initialized).
type StatusKey = (i32, i32, Activity, bool);

/// Runs `write` unless the term (`stop`) ends first; `None` then (a write under way is
/// abandoned: a replica that lost the Lease must not race the new leader).
async fn fenced<T>(stop: &CancellationToken, write: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        () = stop.cancelled() => None,
        r = write => Some(r),
    }
}

async fn revision_task(
    swap: Arc<Swap>,
    key: RevisionKey,
    stop: CancellationToken,
    term_start: Instant,
) {
    let mut state_rx = swap.states.subscribe(&key);
    let mut endpoints = swap.platform.endpoints(&key);
    let mut activators = swap.activators.clone();
    let mut services = swap.services.clone();
    let api: Api<EndpointSlice> = Api::namespaced(swap.client.clone(), &key.namespace);
    // What the cluster holds already (an earlier leader's writes): adopted, not rewritten.
    let found = swap.public.borrow().get(&key).cloned();
    let mut owned: Option<BTreeSet<String>> = found.as_ref().map(|f| f.names.clone());
    let mut written: Option<(Mode, Option<String>, Vec<Backend>)> = None;
    let mut adopted_serve = false;
    if let (Some(f), Some(mode)) = (found.as_ref(), swap.found_mode(&key)) {
        written = Some((mode, f.owner.clone(), f.backends.clone()));
        adopted_serve = mode == Mode::Serve;
        swap.modes.insert(
            key.clone(),
            ModeView {
                mode,
                adopted: true,
            },
        );
        match mode {
            Mode::Proxy => swap.in_path.confirm(&key, Instant::now()),
            Mode::Serve => swap.in_path.clear(&key),
        }
        tracing::debug!(mode = ?mode, "serving mode adopted as found");
    }
    let stored = swap.platform.stored_status(&key).unwrap_or_default();
    let now_time = || Time(k8s_openapi::jiff::Timestamp::now());
    let mut status_written: Option<StatusKey> =
        match (stored.desired, stored.actual, &stored.active) {
            (Some(d), Some(a), Some((st, reason, _))) => Some((
                d,
                a,
                stored_activity(*st, reason.as_deref()),
                stored.initialized_written.is_some(),
            )),
            _ => None,
        };
    let mut activity_since = stored
        .active
        .as_ref()
        .and_then(|(_, _, t)| t.clone())
        .unwrap_or_else(now_time);
    let mut initialized_since = stored.initialized_written.clone();
    let stored_initialized = stored.initialized;
    let mut retry = Duration::from_millis(100);
    let mut first_pass = true;
    loop {
        let state = state_rx.borrow_and_update().clone();
        let snap = endpoints.borrow_and_update().clone();
        let acts = activators.borrow_and_update().clone();
        let svc = services.borrow_and_update().get(&key).cloned();
        let spec = swap.catalog.load().get(&key).cloned();
        let protocol = spec.as_ref().map_or(Protocol::Http1, |s| s.protocol);
        // Another autoscaler class (Knative's HPA): the KPA does not scale it; its pods serve
        // directly once ready (Knative's SKS in Serve mode) and it is always Active.
        let hpa = spec
            .as_ref()
            .is_some_and(|s| s.autoscaling.class != crate::config::annotations::KPA_CLASS);
        let mut failed = false;
        // A revision found served by its pods keeps that mode for a moment after a takeover,
        // while this leader's first pod-stats pulls come in.
        let in_grace = adopted_serve && term_start.elapsed() < ADOPTED_SERVE_GRACE;
        let stats_flow = swap.flow.flows(&key) || in_grace;
        if let Some(svc) = svc {
            let mode = if hpa {
                hpa_mode(&snap)
            } else {
                mode(&state, &snap, stats_flow)
            };
            let mut want_backends = backends(mode, &svc, protocol, &acts, &snap);
            if mode == Mode::Proxy {
                // Only the revision's subset of the activators (Knative's numActivators).
                let n = spec.as_ref().map_or(usize::MAX, |s| {
                    super::subset::num_activators(&s.autoscaling, snap.ready.len())
                });
                want_backends = super::subset::pick(want_backends, n, &key);
            }
            let want_key = (mode, Some(svc.uid.clone()), want_backends);
            if written.as_ref() != Some(&want_key) {
                let want = slices(&key, &svc, &want_key.2);
                let written_now = fenced(&stop, async {
                    let _permit = swap.write_permits.acquire().await;
                    write(&swap, &api, &key, &svc, &want, &mut owned).await
                });
                match written_now.await {
                    None => return,
                    Some(Ok(())) => {
                        tracing::info!(mode = ?mode, slices = want.len(), "public endpoints written");
                        match mode {
                            Mode::Proxy => swap.in_path.confirm(&key, Instant::now()),
                            Mode::Serve => swap.in_path.clear(&key),
                        }
                        swap.modes.insert(
                            key.clone(),
                            ModeView {
                                mode,
                                adopted: false,
                            },
                        );
                        written = Some(want_key);
                        adopted_serve = false;
                        retry = Duration::from_millis(100);
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "writing public endpoints failed; retrying");
                        failed = true;
                    }
                }
            }
        }
        // The autoscaler's part of the Revision status.
        let ready = i32::try_from(snap.ready.len()).unwrap_or(i32::MAX);
        let (activity, since) = status_activity(&snap.status, ready, &state);
        let (state, activity, since) = if hpa {
            let (state, activity) =
                hpa_status(spec.as_deref(), ready, swap.platform.found(&key).replicas);
            (state, activity, None)
        } else {
            (state, activity, since)
        };
        let initialized = state.initialized || stored_initialized;
        // Without a decision yet the desired count is not written (the one stored stands),
        // but an initialized scale target is: a revision at initial scale 0 has no pods to
        // decide on, and Knative marks it initialized (and so Ready) at once.
        let decided = state.desired >= 0;
        let desired_key = if decided {
            state.desired
        } else {
            status_written.map_or(-1, |(d, _, _, _)| d)
        };
        let status = (desired_key, ready, activity, initialized);
        if (decided || initialized) && status_written != Some(status) {
            if status_written.is_none_or(|(_, _, a, _)| a != activity) {
                activity_since = since.map_or_else(now_time, crate::knative::status::time_of);
            }
            let init = initialized.then(|| {
                initialized_condition(initialized_since.get_or_insert_with(now_time).clone())
            });
            let call = crate::knative::status::apply_autoscaler_status(
                swap.client.clone(),
                &key,
                decided.then_some(state.desired),
                ready,
                active_condition(activity, activity_since.clone()),
                init,
            );
            let call = async {
                let _permit = swap.write_permits.acquire().await;
                swap.wrote("revisionstatus");
                call.await
            };
            match fenced(&stop, call).await {
                None => return,
                Some(Ok(_)) => status_written = Some(status),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "revision status not written; retrying");
                    failed = true;
                }
            }
        }
        if first_pass {
            first_pass = false;
            let _ =
                swap.first_pass_pending
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        let wants_pods =
            !state.activator_in_path && written.as_ref().is_some_and(|w| w.0 == Mode::Proxy);
        let wait = if failed {
            let w = retry;
            retry = (retry * 2).min(Duration::from_secs(10));
            Some(w)
        } else if wants_pods || in_grace {
            Some(Duration::from_secs(1))
        } else {
            None
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            r = state_rx.changed() => if r.is_err() { return },
            r = endpoints.changed() => if r.is_err() { return },
            r = activators.changed() => if r.is_err() { return },
            r = services.changed() => if r.is_err() { return },
            () = async { match wait { Some(w) => tokio::time::sleep(w).await, None => std::future::pending().await } } => {}
        }
    }
}

/// Applies `want` and deletes the other slices this autoscaler owns for the Service.
async fn write(
    swap: &Swap,
    api: &Api<EndpointSlice>,
    key: &RevisionKey,
    svc: &PublicService,
    want: &BTreeMap<String, serde_json::Value>,
    owned: &mut Option<BTreeSet<String>>,
) -> Result<(), kube::Error> {
    if owned.is_none() {
        let lp = ListParams::default().labels(&format!(
            "{}={},{}={}",
            labels::ENDPOINTSLICE_SERVICE_NAME,
            svc.name,
            labels::ENDPOINTSLICE_MANAGED_BY,
            labels::MANAGED_BY_AUTOSCALER
        ));
        *owned = Some(
            api.list(&lp)
                .await?
                .items
                .iter()
                .map(|s| s.name_any())
                .collect(),
        );
    }
    let pp = PatchParams::apply(AUTOSCALER_FIELD_MANAGER).force();
    for (name, body) in want {
        swap.wrote("endpointslices");
        api.patch(name, &pp, &Patch::Apply(body)).await?;
        owned.get_or_insert_default().insert(name.clone());
    }
    let stale: Vec<String> = owned
        .iter()
        .flatten()
        .filter(|n| !want.contains_key(*n))
        .cloned()
        .collect();
    for name in stale {
        swap.wrote("endpointslices");
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
        owned.get_or_insert_default().remove(&name);
    }
    tracing::debug!(revision = %key, "public slices in place");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_slices_split_at_a_thousand_endpoints() {
        let key = RevisionKey::new("default", "big-00001");
        let svc = PublicService {
            name: "big-00001".into(),
            uid: "uid".into(),
            ports: vec![("http".into(), None)],
        };
        let backends: Vec<Backend> = (0..2500u32)
            .map(|i| {
                let ip = std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
                (ip, BTreeMap::from([("http".to_string(), 8012)]))
            })
            .collect();
        let out = slices(&key, &svc, &backends);
        let sizes: Vec<usize> = out
            .values()
            .map(|s| s["endpoints"].as_array().unwrap().len())
            .collect();
        assert_eq!(sizes.len(), 3, "{sizes:?}");
        assert!(sizes.iter().all(|n| *n <= MAX_ENDPOINTS_PER_SLICE));
        assert_eq!(sizes.iter().sum::<usize>(), 2500);
        // Every address once; the first slice keeps the name one slice always had.
        let mut seen = BTreeSet::new();
        for s in out.values() {
            for e in s["endpoints"].as_array().unwrap() {
                assert!(seen.insert(e["addresses"][0].as_str().unwrap().to_string()));
            }
        }
        let small = slices(&key, &svc, &backends[..10]);
        let first = small.keys().next().unwrap();
        assert!(out.contains_key(first));
    }

    /// The `Active` condition written: the scaler's inactivity wins over a pod still ready
    /// (the grace period), with the scaler's time; otherwise the pods say, with the scaler's
    /// time only when its activity is the one written.
    #[test]
    fn the_status_says_inactive_from_the_moment_the_scaler_does() {
        use crate::autoscaler::lifecycle::{Activity as A, InactiveReason};
        let t = Instant::now();
        let ok = EndpointStatus::Ok;
        let state = |desired, activity| ScaleState {
            desired,
            activity,
            ..ScaleState::default()
        };
        let inactive = A::Inactive {
            since: t,
            reason: InactiveReason::NoTraffic,
        };
        assert_eq!(
            status_activity(&ok, 1, &state(1, Some(inactive))),
            (Activity::Inactive, Some(t)),
            "idle, its last pod waiting out the grace period"
        );
        assert_eq!(
            status_activity(&ok, 0, &state(0, Some(inactive))),
            (Activity::Inactive, Some(t))
        );
        assert_eq!(
            status_activity(&ok, 1, &state(1, Some(A::Active { since: t }))),
            (Activity::Active, Some(t))
        );
        assert_eq!(
            status_activity(&ok, 1, &state(3, Some(A::Activating { since: t }))),
            (Activity::Active, None),
            "a pod ready, fewer than the scaler waits for: active since the write"
        );
        assert_eq!(
            status_activity(&ok, 0, &state(1, Some(A::Activating { since: t }))),
            (Activity::Activating, Some(t))
        );
        assert_eq!(
            status_activity(&ok, 1, &state(1, None)),
            (Activity::Active, None),
            "no scaler's activity (a follower's copy)"
        );
        let timed_out = EndpointStatus::Failing {
            reason: "revision unavailable (TimedOut)".into(),
        };
        assert_eq!(
            status_activity(&timed_out, 0, &state(1, Some(A::Activating { since: t }))),
            (Activity::TimedOut, None)
        );
        assert_eq!(
            status_activity(
                &ok,
                0,
                &state(
                    0,
                    Some(A::Inactive {
                        since: t,
                        reason: InactiveReason::TimedOut
                    })
                )
            ),
            (Activity::TimedOut, Some(t))
        );
    }
}
