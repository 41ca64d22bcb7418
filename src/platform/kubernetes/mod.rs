//! The Kubernetes platform: a revision's replicas are its Deployment's pods.
//!
//! [`KubePlatform`] implements [`Platform`] and [`EndpointSource`] with five watches, each
//! one for all revisions, selected by label; labels prove nothing, so what each watch finds is
//! then checked against the revision's names and UIDs:
//! - **Deployments** and **private Services** carrying `serving.knative.dev/revision`: the
//!   revision's own are the ones named for it (`{revision}-deployment`, `{revision}-private`)
//!   **and** controlled by the Revision's UID ([`children`]); the others are ignored (never
//!   scaled, never read), counted once by reason in `thaw_platform_ignored_total{kind,reason}`
//!   and logged once. Services are watched metadata-only.
//! - **EndpointSlices** labelled `networking.internal.knative.dev/serviceType=Private` and
//!   carrying `serving.knative.dev/revision`. A slice counts only when its
//!   `kubernetes.io/service-name` is the revision's private Service and that Service is the
//!   revision's own; an endpoint of it only when it is bound to one of the revision's pods
//!   ([`owners`]: the pod is its Deployment's, each address is one of the pod's `podIPs`, the
//!   pod runs; a pod being deleted keeps its endpoint as terminating, never ready). Merged per
//!   revision across all its slices, deduplicated, `ready`/`terminating` from the slice
//!   conditions, the port chosen by the revision's protocol (`http`, or `http2` / appProtocol
//!   `kubernetes.io/h2c`). Each event goes straight onto the revision's watch channel.
//! - **Pods** carrying `serving.knative.dev/revision`: each pod's controlling ReplicaSet (by
//!   UID), IPs, phase and deletion go into the ownership index, and every change of those
//!   judges the revision's endpoints again (a slice that arrives before its pod's `podIPs` is
//!   served as soon as they do). A container waiting in `CrashLoopBackOff`, or restarted
//!   [`KubeOptions::restart_limit`] times, makes the revision `Failing` while it has no ready
//!   endpoint. Image pull and container config errors do not ([`DEADLINE_WAITING_REASONS`]):
//!   as in Knative they count against the progress deadline, so requests stay held until the
//!   activation timeout.
//! - **ReplicaSets** carrying `serving.knative.dev/revision`, metadata only: each one's
//!   controlling Deployment (by UID), for the ownership index.
//!
//! The Revisions themselves are followed by [`revisions::follow_revisions`] (a sixth watch,
//! into the catalog, [`KubePlatform::upsert`] / [`KubePlatform::remove`], and each Revision's
//! UID into [`KubePlatform::observe_uid`]).
//!
//! [`Platform::scale`] records the latest replica count and returns at once; the revision's
//! own scaler task applies it as a merge patch of the Deployment's `/scale` subresource. A
//! 409, 429, 5xx or transport error is retried with backoff in that task, so one revision's
//! trouble never holds another's decision up, and a newer count replaces an older one not yet
//! applied. Only the revision's own Deployment is ever patched. A Deployment not there yet
//! (or not the revision's own) is waited for and reported failing (`DeploymentMissing`) only
//! after [`KubeOptions::missing_deployment_grace`].
//!
//! **Activation timeout** (Knative's): after a scale-up from zero, a revision with no ready
//! endpoint within its progress deadline + 30 s is `Failing` with reason `TimedOut`, until an
//! endpoint is ready or it is scaled to zero.
//!
//! Client-facing reasons are generic (`revision unavailable (CrashLoopBackOff)`); pod names,
//! messages and exit codes go to the logs.
//!
//! Watches resume from their last resourceVersion after an error (kube-runtime's watcher,
//! with backoff) and re-list only after a 410. [`EndpointSource::drained`] is ignored: on
//! Kubernetes the pod's preStop hook waits for its own drain.

mod children;
mod owners;
mod pods;
pub mod revisions;
mod scaler;
pub mod service_slices;
mod slices;
mod state;
mod watch;

pub use children::{ChildKind, Ignored};
pub use owners::Foreign;
pub use pods::{
    DEADLINE_WAITING_REASONS, FAILING_WAITING_REASONS, PodFailure, QUEUE_PROXY_ADMIN_PORT_NAME,
    QUEUE_PROXY_METRICS_PORT, SIDECAR_CONTAINER, pod_failure, stats_wire,
};
pub use revisions::{FollowedRevisions, follow_revisions};
pub use slices::{APP_PROTOCOL_H2C, PORT_NAME_HTTP, PORT_NAME_HTTP2, SliceEndpoints};

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::ResourceExt;

use crate::knative::names::labels;
use crate::knative::status::AutoscalerStatus;
use crate::platform::{
    BoxFuture, EndpointSnapshot, EndpointSource, Found, FoundActivity, Platform, PlatformError,
};
use crate::revision::{Protocol, RevisionKey};
use crate::stats::StatsTarget;
use crate::telemetry::platform::{IgnoredLabels, PlatformMetrics, RevisionLabels};
use children::{Child, Judged};
use slices::Ownership;
use state::{News, RevEntry};

/// A revision's own Deployment ([`children`]) as the watch last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentRef {
    pub name: String,
    /// Its `spec.replicas` (what the scale subresource holds).
    pub replicas: Option<u32>,
    /// Its UID: the revision's pods are those of its ReplicaSets ([`owners`]).
    pub uid: Option<String>,
}

/// When `/scale` may be written.
#[derive(Debug, Clone, Default)]
pub enum Fence {
    /// Always (a platform nobody fences: tests, tools).
    #[default]
    Open,
    /// While this leadership term lasts (not cancelled); a patch under way when it ends is
    /// abandoned, and nothing is written until the next term.
    Term(CancellationToken),
}

impl Fence {
    /// The term, if writes are fenced by one; `Err` when writing is not allowed now.
    fn term(&self) -> Result<Option<&CancellationToken>, ()> {
        match self {
            Fence::Open => Ok(None),
            Fence::Term(t) if t.is_cancelled() => Err(()),
            Fence::Term(t) => Ok(Some(t)),
        }
    }
}

/// Settings of the Kubernetes platform, fixed at construction.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Watch only this namespace; `None`: all namespaces.
    pub namespace: Option<String>,
    /// A revision's Deployment may be missing this long after a scale request before the
    /// revision is reported failing (default 60 s; it keeps being retried).
    pub missing_deployment_grace: Duration,
    /// First retry delay of a failed scale patch; doubles per failure (default 100 ms).
    pub retry_initial: Duration,
    /// Longest retry delay of a failed scale patch (default 10 s).
    pub retry_max: Duration,
    /// Progress deadline of revisions that set none (Knative's `progress-deadline`, 600 s);
    /// the activation timeout is this + 30 s.
    pub progress_deadline: Duration,
    /// Restarts after which a container whose last run ended counts as failing (default 3).
    pub restart_limit: i32,
    /// Added to the progress deadline to make the activation timeout (Knative: 30 s).
    pub activation_buffer: Duration,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            missing_deployment_grace: Duration::from_secs(60),
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            progress_deadline: Duration::from_secs(600),
            restart_limit: 3,
            activation_buffer: ACTIVATION_TIMEOUT_BUFFER,
        }
    }
}

/// Knative's buffer on top of the progress deadline before an activation counts as failed
/// (the default of [`KubeOptions::activation_buffer`]).
pub const ACTIVATION_TIMEOUT_BUFFER: Duration = Duration::from_secs(30);

/// What the platform needs to know of a revision beyond its key (from the catalog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeRevision {
    pub key: RevisionKey,
    /// Chooses the slice port: `http` for HTTP/1, `http2` / `kubernetes.io/h2c` for h2c.
    pub protocol: Protocol,
    /// The revision's progress deadline (`serving.knative.dev/progress-deadline`); `None`:
    /// [`KubeOptions::progress_deadline`].
    pub progress_deadline: Option<Duration>,
}

/// Deployments and EndpointSlices through the Kubernetes API. Cheap to clone.
///
/// Must be created inside a tokio runtime: [`KubePlatform::start`] spawns the watches. They
/// and every scaler task stop on [`KubePlatform::shutdown`] (or when the runtime ends).
#[derive(Clone)]
pub struct KubePlatform {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub client: kube::Client,
    pub opts: KubeOptions,
    pub metrics: PlatformMetrics,
    /// Every revision seen (subscribed to, scaled, or found in a watch). Bounded by the
    /// revisions in the watched namespaces, plus those asked about.
    pub revisions: DashMap<RevisionKey, Arc<RevEntry>>,
    /// Every Deployment and private Service carrying a revision label, by name (their
    /// watches); a revision's own is found by name and Revision UID ([`children`]).
    pub children: children::Children,
    /// Objects found not to be the revision's their labels name, so each is counted once.
    pub ignored: children::IgnoredSet,
    /// Each Revision's UID (the Revision watch, [`KubePlatform::observe_uid`]): its own
    /// Deployment and private Service are the ones it controls.
    pub revision_uids: DashMap<RevisionKey, String>,
    /// The autoscaler's part of each Revision's stored status (from the Revision watch).
    pub statuses: DashMap<RevisionKey, AutoscalerStatus>,
    /// Whether `/scale` may be written now ([`KubePlatform::fence`]).
    pub fence: ArcSwap<Fence>,
    /// `/scale` patches sent (every attempt).
    pub writes: AtomicU64,
    /// The current term's number (1 before any fence); each [`KubePlatform::fence`] adds one.
    pub term_id: AtomicU64,
    /// Bumped on every change of the Deployments or the Revisions' UIDs, so scalers waiting
    /// for their Deployment wake up.
    pub deployments_changed: tokio_watch::Sender<u64>,
    /// Set once each watch has finished its first list.
    pub synced: tokio_watch::Sender<u8>,
    pub shutdown: CancellationToken,
    /// Pods (their ReplicaSet, IPs, phase) and ReplicaSets by UID: which endpoints are the
    /// revisions' own.
    pub owners: owners::Owners,
}

impl fmt::Debug for KubePlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubePlatform")
            .field("opts", &self.inner.opts)
            .field("revisions", &self.inner.revisions.len())
            .finish_non_exhaustive()
    }
}

/// The five watches; [`KubePlatform::wait_synced`] waits for all of them.
const WATCHES: u8 = 5;

impl KubePlatform {
    /// Starts the five watches on `client`. `metrics` are the registered families
    /// (`Telemetry::platform`).
    pub fn start(client: kube::Client, opts: KubeOptions, metrics: PlatformMetrics) -> Self {
        let inner = Arc::new(Inner {
            client,
            opts,
            metrics,
            revisions: DashMap::new(),
            children: children::Children::default(),
            ignored: children::IgnoredSet::default(),
            revision_uids: DashMap::new(),
            statuses: DashMap::new(),
            fence: ArcSwap::from_pointee(Fence::Open),
            writes: AtomicU64::new(0),
            term_id: AtomicU64::new(1),
            deployments_changed: tokio_watch::channel(0).0,
            synced: tokio_watch::channel(0).0,
            shutdown: CancellationToken::new(),
            owners: owners::Owners::default(),
        });
        tokio::spawn(watch::endpoint_slices(inner.clone()));
        tokio::spawn(watch::replica_sets(inner.clone()));
        tokio::spawn(watch::pods(inner.clone()));
        tokio::spawn(watch::deployments(inner.clone()));
        tokio::spawn(watch::private_services(inner.clone()));
        Self { inner }
    }

    /// Returns once every watch has listed its objects once (the first snapshot is complete).
    pub async fn wait_synced(&self) {
        let mut rx = self.inner.synced.subscribe();
        let _ = rx.wait_for(|n| *n >= WATCHES).await;
    }

    /// Registers or updates what the platform needs of a revision (protocol, progress
    /// deadline). A protocol change re-reads the revision's slices for the other port.
    pub fn upsert(&self, rev: KubeRevision) {
        let entry = self.inner.entry(&rev.key);
        let timeout = rev
            .progress_deadline
            .unwrap_or(self.inner.opts.progress_deadline)
            + self.inner.opts.activation_buffer;
        let judge = self.inner.judge_of(&rev.key);
        let news = entry.update(|st| {
            st.activation_timeout = Some(timeout);
            st.set_protocol(rev.protocol, &judge)
        });
        self.inner.count_news(&rev.key, news);
    }

    /// Records the UID of Revision `revision` (`None`: it has none): its own Deployment and
    /// private Service are those it controls. A change judges its children and endpoints
    /// again (a Revision deleted and made again under its name has a new UID).
    pub fn observe_uid(&self, revision: &RevisionKey, uid: Option<&str>) {
        let known = self.inner.revision_uids.get(revision).map(|u| u.clone());
        if known.as_deref() == uid {
            return;
        }
        match uid {
            Some(uid) => {
                self.inner
                    .revision_uids
                    .insert(revision.clone(), uid.to_string());
            }
            None => {
                self.inner.revision_uids.remove(revision);
            }
        }
        self.inner.revision_changed(revision);
    }

    /// Forgets a revision deleted from the cluster: its subscribers get `Failing` (reason
    /// `revision unavailable (Removed)`, so held requests are answered 503 at once), its scaler
    /// task ends, and a later subscription or scale starts from a fresh entry. Unknown
    /// revisions: no-op.
    pub fn remove(&self, key: &RevisionKey) {
        self.inner.statuses.remove(key);
        if self.inner.revision_uids.remove(key).is_some() {
            self.inner.revision_changed(key);
        }
        if let Some((_, entry)) = self.inner.revisions.remove(key) {
            tracing::info!(revision = %key, "revision removed");
            entry.update(|st| st.removed = true);
            entry.desired.send_replace(None);
        }
    }

    /// Where `revision`'s ready pods serve their stats (the queue sidecar's admin port): each
    /// ready, non-terminating endpoint bound to one of its pods ([`owners`]) of its private
    /// Service's slices that has a port named
    /// [`crate::stats::POD_STATS_PORT_NAME`], with its pod's name (from the endpoint's
    /// `targetRef`, else its address) and its sidecar ([`stats_wire`]). A pod that runs
    /// Knative's queue-proxy is pulled at that sidecar's own fixed port instead of the slices'.
    /// Empty when the slices carry no such port.
    pub fn stats_targets(&self, revision: &RevisionKey) -> Vec<StatsTarget> {
        let Some(entry) = self.inner.revisions.get(revision).map(|e| e.clone()) else {
            return Vec::new();
        };
        let judge = self.inner.judge_of(revision);
        entry.read(|st| {
            let mut out: Vec<StatsTarget> = Vec::new();
            for (slice, _) in st.slices.values() {
                if judge.slice(slice) != Judged::Genuine {
                    continue;
                }
                let Some(port) = slice
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(crate::stats::POD_STATS_PORT_NAME))
                    .and_then(|p| u16::try_from(p.port?).ok())
                else {
                    continue;
                };
                for ep in &slice.endpoints {
                    let cond = ep.conditions.as_ref();
                    if judge.endpoint(ep) != owners::Verdict::Owned
                        || !cond.and_then(|c| c.ready).unwrap_or(true)
                        || cond.and_then(|c| c.terminating).unwrap_or(false)
                    {
                        continue;
                    }
                    let name = ep.target_ref.as_ref().and_then(|r| r.name.clone());
                    let (wire, own_port) = name
                        .as_deref()
                        .map_or_else(Default::default, |n| judge.stats_wire(n));
                    for a in &ep.addresses {
                        let Ok(ip) = a.parse::<std::net::IpAddr>() else {
                            continue;
                        };
                        let addr = SocketAddr::new(ip, own_port.unwrap_or(port));
                        let pod = name.clone().unwrap_or_else(|| addr.to_string());
                        out.push(StatsTarget { pod, addr, wire });
                    }
                }
            }
            out.sort();
            out.dedup();
            out
        })
    }

    /// Lets `/scale` be written only while `term` lasts (a leader's term: writes stop the
    /// moment it ends, so a replica that lost the Lease cannot race the new leader). Before
    /// the first call every write is allowed.
    pub fn fence(&self, term: CancellationToken) {
        // Counts asked for in an earlier term are not this term's to write: withdrawn before
        // the new term opens, so a scaler task that sees the new term sees the withdrawal too.
        for e in &self.inner.revisions {
            e.desired.send_replace(None);
        }
        self.inner.term_id.fetch_add(1, Ordering::Relaxed);
        self.inner.fence.store(Arc::new(Fence::Term(term)));
        // Scaler tasks waiting for a term look again.
        self.inner.deployments_changed.send_modify(|n| *n += 1);
    }

    /// `/scale` patches sent so far (every attempt, answered or not).
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }

    /// Records the autoscaler's part of `revision`'s stored status (the Revision watch).
    pub fn observe_status(&self, revision: &RevisionKey, status: AutoscalerStatus) {
        // (The read guard must be gone before the insert: both lock the same shard.)
        let same = self
            .inner
            .statuses
            .get(revision)
            .is_some_and(|s| *s == status);
        if !same {
            self.inner.statuses.insert(revision.clone(), status);
        }
    }

    /// The autoscaler's part of `revision`'s stored status, as last seen.
    pub fn stored_status(&self, revision: &RevisionKey) -> Option<AutoscalerStatus> {
        self.inner.statuses.get(revision).map(|s| s.clone())
    }

    /// Stops the watches and every scaler task. Scale requests not yet applied are dropped.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

impl Inner {
    pub fn entry(&self, key: &RevisionKey) -> Arc<RevEntry> {
        if let Some(e) = self.revisions.get(key) {
            return e.clone();
        }
        self.revisions
            .entry(key.clone())
            .or_insert_with(|| Arc::new(RevEntry::new(key.clone())))
            .clone()
    }

    /// Whose `key`'s slices and endpoints are, as the platform knows it now ([`Judge`]).
    pub fn judge_of(&self, key: &RevisionKey) -> Judge<'_> {
        let uid = self.revision_uids.get(key).map(|u| u.clone());
        let service = self
            .children
            .of(ChildKind::Service, key, uid.as_deref())
            .map_or(Judged::Pending, |(_, _, j)| j);
        let deployment = match self.children.of(ChildKind::Deployment, key, uid.as_deref()) {
            Some((_, child, Judged::Genuine)) => child.uid,
            _ => None,
        };
        Judge {
            owners: &self.owners,
            namespace: key.namespace.clone(),
            service_name: ChildKind::Service.name_for(&key.name),
            service,
            deployment,
        }
    }

    /// `key`'s own Deployment: named for it and controlled by its Revision's UID. `None` when
    /// there is none, or the Revision's UID is not known yet.
    pub fn deployment(&self, key: &RevisionKey) -> Option<DeploymentRef> {
        let uid = self.revision_uids.get(key).map(|u| u.clone());
        match self
            .children
            .of(ChildKind::Deployment, key, uid.as_deref())?
        {
            (name, child, Judged::Genuine) => Some(DeploymentRef {
                name,
                replicas: child.replicas,
                uid: child.uid,
            }),
            _ => None,
        }
    }

    /// Judges `kind` `namespace/name` again (it changed, or its revision's UID did); counts and
    /// logs it if it is newly ignored.
    pub fn judge_child(&self, kind: ChildKind, namespace: &str, name: &str) {
        let child: Option<Child> = self.children.get(kind, namespace, name);
        let reason = child.as_ref().and_then(|c| {
            let uid = self
                .revision_uids
                .get(&RevisionKey::new(namespace, &c.revision))
                .map(|u| u.clone());
            match children::judge(kind, name, c, uid.as_deref()) {
                Judged::Ignored(why) => Some(why),
                Judged::Genuine | Judged::Pending => None,
            }
        });
        if self.ignored.note(kind, namespace, name, reason)
            && let (Some(why), Some(c)) = (reason, child)
        {
            tracing::warn!(
                kind = kind.as_str(),
                namespace,
                name,
                revision = %c.revision,
                reason = why.as_str(),
                "carries a revision's label but is not its own: ignored"
            );
            self.count_ignored(kind.as_str(), why.as_str(), 1);
        }
    }

    fn count_ignored(&self, kind: &str, reason: &str, n: u64) {
        self.metrics
            .ignored
            .get_or_create(&IgnoredLabels {
                kind: kind.to_string(),
                reason: reason.to_string(),
            })
            .inc_by(n);
    }

    /// Counts and logs what judging `key`'s slices found newly not its own.
    pub fn count_news(&self, key: &RevisionKey, news: News) {
        if news.is_empty() {
            return;
        }
        let foreign = news.foreign.total();
        if foreign > 0 {
            for f in owners::Foreign::ALL {
                let n = news.foreign.get(f);
                if n > 0 {
                    self.count_ignored("endpoint", f.as_str(), u64::from(n));
                }
            }
            self.metrics
                .foreign_endpoints
                .get_or_create(&RevisionLabels {
                    namespace: key.namespace.to_string(),
                    revision: key.name.to_string(),
                })
                .inc_by(u64::from(foreign));
            tracing::warn!(
                revision = %key,
                no_pod = news.foreign.get(owners::Foreign::NoPod),
                pod_not_owned = news.foreign.get(owners::Foreign::NotTheRevisions),
                address_not_the_pods = news.foreign.get(owners::Foreign::Address),
                "endpoints not bound to the revision's pods: left out"
            );
        }
        for (slice, why) in news.slices {
            tracing::warn!(
                revision = %key,
                slice = %slice,
                reason = why.as_str(),
                "EndpointSlice not of the revision's private Service: ignored"
            );
            self.count_ignored("endpointslice", why.as_str(), 1);
        }
    }

    /// `key`'s Revision UID changed (or it was removed): its children and endpoints are
    /// judged again, and scalers waiting for its Deployment look again.
    pub fn revision_changed(&self, key: &RevisionKey) {
        for kind in [ChildKind::Deployment, ChildKind::Service] {
            self.judge_child(kind, &key.namespace, &kind.name_for(&key.name));
        }
        self.refilter(key);
        self.deployments_changed.send_modify(|n| *n += 1);
    }

    /// Re-reduces `key`'s slices after its ownership changed (a pod, ReplicaSet, Deployment,
    /// private Service or the Revision's UID seen, changed or gone). Revisions not known yet:
    /// nothing to do.
    pub fn refilter(&self, key: &RevisionKey) {
        let Some(entry) = self.revisions.get(key).map(|e| e.clone()) else {
            return;
        };
        let judge = self.judge_of(key);
        let news = entry.update(|st| st.refilter(&judge));
        self.count_news(key, news);
    }

    /// Re-reduces every revision's slices (a watch listed anew).
    pub fn refilter_all(&self) {
        let keys: Vec<RevisionKey> = self.revisions.iter().map(|e| e.key().clone()).collect();
        for key in keys {
            self.refilter(&key);
        }
    }

    /// The activation timeout of `entry`.
    pub fn activation_timeout(&self, entry: &RevEntry) -> Duration {
        entry
            .read(|st| st.activation_timeout)
            .unwrap_or(self.opts.progress_deadline + self.opts.activation_buffer)
    }
}

/// Whose a revision's slices and endpoints are, as the platform knew it when made
/// ([`Inner::judge_of`]).
pub(crate) struct Judge<'a> {
    owners: &'a owners::Owners,
    namespace: Arc<str>,
    /// `{revision}-private`: the `kubernetes.io/service-name` of the revision's slices.
    service_name: String,
    /// What the Service of that name is to the revision.
    service: Judged,
    /// The UID of the revision's own Deployment; `None`: none known (yet).
    deployment: Option<String>,
}

impl Ownership for Judge<'_> {
    /// The revision's private Service's slice: named for it by `kubernetes.io/service-name`,
    /// and that Service is the revision's own (pending while it is not known).
    fn slice(&self, slice: &EndpointSlice) -> Judged {
        if slice.labels().get(labels::ENDPOINTSLICE_SERVICE_NAME) != Some(&self.service_name) {
            return Judged::Ignored(Ignored::NotThePrivateService);
        }
        match self.service {
            Judged::Genuine => Judged::Genuine,
            Judged::Pending => Judged::Pending,
            Judged::Ignored(_) => Judged::Ignored(Ignored::NotThePrivateService),
        }
    }

    fn endpoint(&self, ep: &Endpoint) -> owners::Verdict {
        self.owners
            .verdict(&self.namespace, self.deployment.as_deref(), ep)
    }

    fn sidecar(&self, ep: &Endpoint) -> crate::stats::PodStatsWire {
        ep.target_ref
            .as_ref()
            .and_then(|r| r.name.as_deref())
            .map_or(crate::stats::PodStatsWire::Thaw, |n| self.stats_wire(n).0)
    }
}

impl Judge<'_> {
    /// How the revision's pod `name` serves its stats ([`owners::Owners::stats_wire`]).
    fn stats_wire(&self, name: &str) -> (crate::stats::PodStatsWire, Option<u16>) {
        self.owners.stats_wire(&self.namespace, name)
    }
}

impl EndpointSource for KubePlatform {
    fn endpoints(&self, revision: &RevisionKey) -> tokio_watch::Receiver<Arc<EndpointSnapshot>> {
        self.inner.entry(revision).subscribe()
    }

    /// Ignored: the pod's preStop hook waits for its drain, and Kubernetes stops it.
    fn drained(&self, _revision: &RevisionKey, _addr: SocketAddr) {}
}

impl Platform for KubePlatform {
    /// Accepted at once: the revision's scaler task patches `/scale` (retrying as needed);
    /// the latest count wins. Fails only after [`KubePlatform::shutdown`].
    fn scale(
        &self,
        revision: &RevisionKey,
        replicas: u32,
    ) -> BoxFuture<'_, Result<(), PlatformError>> {
        let revision = revision.clone();
        Box::pin(async move {
            if self.inner.shutdown.is_cancelled() {
                return Err(PlatformError::Scale {
                    revision,
                    reason: "the platform is shutting down".into(),
                });
            }
            let entry = self.inner.entry(&revision);
            entry.desired.send_replace(Some(replicas));
            if !entry.scaler_started.swap(true, Ordering::SeqCst) {
                tokio::spawn(scaler::run(self.inner.clone(), entry));
            }
            Ok(())
        })
    }

    /// The Deployment's `spec.replicas`, whether the Revision's status says it was
    /// initialized (`ScaleTargetInitialized`, or `Ready=True` from before the condition), and
    /// its `Active` condition with the condition's last transition.
    fn found(&self, revision: &RevisionKey) -> Found {
        let (initialized, activity) = self
            .inner
            .statuses
            .get(revision)
            .map(|s| (s.initialized, found_activity(&s)))
            .unwrap_or_default();
        Found {
            replicas: self.inner.deployment(revision).and_then(|d| d.replicas),
            initialized,
            activator_in_path: None,
            activity,
        }
    }
}

/// The stored `Active` condition as a [`FoundActivity`]; `None` without the condition or its
/// last transition time.
fn found_activity(status: &AutoscalerStatus) -> Option<FoundActivity> {
    use crate::knative::duck::ConditionStatus;
    let (state, reason, time) = status.active.as_ref()?;
    let since = crate::knative::status::instant_of(time.as_ref()?);
    Some(match state {
        ConditionStatus::True => FoundActivity::Active { since },
        ConditionStatus::Unknown => FoundActivity::Activating { since },
        ConditionStatus::False => FoundActivity::Inactive {
            since,
            timed_out: reason.as_deref() == Some("TimedOut"),
        },
    })
}

// The integrator holds the platform as `Arc<dyn Platform>` beside the activator and scaler.
const _: fn(KubePlatform) -> Arc<dyn Platform> = |p| Arc::new(p);
