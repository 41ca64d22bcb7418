//! The Kubernetes platform: a revision's replicas are its Deployment's pods.
//!
//! [`KubePlatform`] implements [`Platform`] and [`EndpointSource`] with four watches, each
//! one for all revisions, selected by label (never by recomputed names):
//! - **EndpointSlices** labelled `networking.internal.knative.dev/serviceType=Private` and
//!   carrying `serving.knative.dev/revision`: the revision's private Service's slices. Merged
//!   per revision across all its slices, deduplicated, `ready`/`terminating` from the slice
//!   conditions, the port chosen by the revision's protocol (`http`, or `http2` / appProtocol
//!   `kubernetes.io/h2c`). Each event goes straight onto the revision's watch channel. Only
//!   endpoints whose pod belongs to the revision's Deployment count ([`owners`]).
//! - **Pods** carrying `serving.knative.dev/revision`: a container waiting in
//!   `CrashLoopBackOff`, or restarted [`KubeOptions::restart_limit`] times, makes the revision
//!   `Failing` while it has no ready endpoint. Image pull and container config errors do not
//!   ([`DEADLINE_WAITING_REASONS`]): as in Knative they count against the progress deadline,
//!   so requests stay held until the activation timeout. Each pod's controlling ReplicaSet
//!   (by UID) goes into the ownership index.
//! - **Deployments** carrying `serving.knative.dev/revision`: which Deployment scales which
//!   revision (its UID: the one whose pods are the revision's).
//! - **ReplicaSets** carrying `serving.knative.dev/revision`, metadata only: each one's
//!   controlling Deployment (by UID), for the ownership index.
//!
//! The Revisions themselves are followed by [`revisions::follow_revisions`] (a fifth watch,
//! into the catalog and [`KubePlatform::upsert`] / [`KubePlatform::remove`]).
//!
//! [`Platform::scale`] records the latest replica count and returns at once; the revision's
//! own scaler task applies it as a merge patch of the Deployment's `/scale` subresource. A
//! 409, 429, 5xx or transport error is retried with backoff in that task, so one revision's
//! trouble never holds another's decision up, and a newer count replaces an older one not yet
//! applied. A Deployment not there yet is waited for and reported failing
//! (`DeploymentMissing`) only after [`KubeOptions::missing_deployment_grace`].
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

mod owners;
mod pods;
pub mod revisions;
mod scaler;
pub mod service_slices;
mod slices;
mod state;
mod watch;

pub use pods::{DEADLINE_WAITING_REASONS, FAILING_WAITING_REASONS, PodFailure, pod_failure};
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

use crate::knative::status::AutoscalerStatus;
use crate::platform::{
    BoxFuture, EndpointSnapshot, EndpointSource, Found, Platform, PlatformError,
};
use crate::revision::{Protocol, RevisionKey};
use crate::telemetry::platform::PlatformMetrics;
use state::RevEntry;

/// A revision's Deployment as the watch last saw it.
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
    /// Revision -> its Deployment (from the Deployment watch).
    pub deployments: DashMap<RevisionKey, DeploymentRef>,
    /// The autoscaler's part of each Revision's stored status (from the Revision watch).
    pub statuses: DashMap<RevisionKey, AutoscalerStatus>,
    /// Whether `/scale` may be written now ([`KubePlatform::fence`]).
    pub fence: ArcSwap<Fence>,
    /// `/scale` patches sent (every attempt).
    pub writes: AtomicU64,
    /// The current term's number (1 before any fence); each [`KubePlatform::fence`] adds one.
    pub term_id: AtomicU64,
    /// Bumped on every change of `deployments`, so scalers waiting for one wake up.
    pub deployments_changed: tokio_watch::Sender<u64>,
    /// Set once each watch has finished its first list.
    pub synced: tokio_watch::Sender<u8>,
    pub shutdown: CancellationToken,
    /// Pods and ReplicaSets by UID: which endpoints are the revisions' own.
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

/// The four watches; [`KubePlatform::wait_synced`] waits for all of them.
const WATCHES: u8 = 4;

impl KubePlatform {
    /// Starts the four watches on `client`. `metrics` are the registered families
    /// (`Telemetry::platform`).
    pub fn start(client: kube::Client, opts: KubeOptions, metrics: PlatformMetrics) -> Self {
        let inner = Arc::new(Inner {
            client,
            opts,
            metrics,
            revisions: DashMap::new(),
            deployments: DashMap::new(),
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
        let verdict = self.inner.verdict_of(&rev.key);
        entry.update(|st| {
            st.set_protocol(rev.protocol, &verdict);
            st.activation_timeout = Some(timeout);
        });
    }

    /// Forgets a revision deleted from the cluster: its subscribers get `Failing` (reason
    /// `revision unavailable (Removed)`, so held requests are answered 503 at once), its scaler
    /// task ends, and a later subscription or scale starts from a fresh entry. Unknown
    /// revisions: no-op.
    pub fn remove(&self, key: &RevisionKey) {
        self.inner.statuses.remove(key);
        if let Some((_, entry)) = self.inner.revisions.remove(key) {
            tracing::info!(revision = %key, "revision removed");
            entry.update(|st| st.removed = true);
            entry.desired.send_replace(None);
        }
    }

    /// Where `revision`'s ready pods serve their stats (the queue sidecar's admin port): each
    /// ready, non-terminating endpoint of its private slices that has a port named
    /// [`crate::stats::POD_STATS_PORT_NAME`], with its pod's name (from the endpoint's
    /// `targetRef`, else its address). Empty when the slices carry no such port.
    pub fn stats_targets(&self, revision: &RevisionKey) -> Vec<(String, SocketAddr)> {
        let Some(entry) = self.inner.revisions.get(revision).map(|e| e.clone()) else {
            return Vec::new();
        };
        let verdict = self.inner.verdict_of(revision);
        entry.read(|st| {
            let mut out: Vec<(String, SocketAddr)> = Vec::new();
            for (slice, _) in st.slices.values() {
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
                    if verdict(ep) != owners::Verdict::Owned
                        || !cond.and_then(|c| c.ready).unwrap_or(true)
                        || cond.and_then(|c| c.terminating).unwrap_or(false)
                    {
                        continue;
                    }
                    for a in &ep.addresses {
                        let Ok(ip) = a.parse::<std::net::IpAddr>() else {
                            continue;
                        };
                        let addr = SocketAddr::new(ip, port);
                        let pod = ep
                            .target_ref
                            .as_ref()
                            .and_then(|r| r.name.clone())
                            .unwrap_or_else(|| addr.to_string());
                        out.push((pod, addr));
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

    /// What an endpoint of `key`'s slices is to it: owned by its Deployment, foreign, or not
    /// known yet ([`owners`]).
    pub fn verdict_of(
        &self,
        key: &RevisionKey,
    ) -> impl Fn(&k8s_openapi::api::discovery::v1::Endpoint) -> owners::Verdict + '_ {
        let deployment = self.deployments.get(key).and_then(|d| d.uid.clone());
        let namespace = key.namespace.to_string();
        move |ep| self.owners.verdict(&namespace, deployment.as_deref(), ep)
    }

    /// Re-reduces `key`'s slices after its ownership changed (a pod, ReplicaSet or Deployment
    /// seen, changed or gone). Revisions not known yet: nothing to do.
    pub fn refilter(&self, key: &RevisionKey) {
        let Some(entry) = self.revisions.get(key).map(|e| e.clone()) else {
            return;
        };
        let verdict = self.verdict_of(key);
        entry.update(|st| st.refilter(&verdict));
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

    /// The Deployment's `spec.replicas` and whether the Revision's status says it was
    /// initialized (`ScaleTargetInitialized`, or `Ready=True` from before the condition).
    fn found(&self, revision: &RevisionKey) -> Found {
        Found {
            replicas: self
                .inner
                .deployments
                .get(revision)
                .and_then(|d| d.replicas),
            initialized: self
                .inner
                .statuses
                .get(revision)
                .is_some_and(|s| s.initialized),
            activator_in_path: None,
        }
    }
}

// The integrator holds the platform as `Arc<dyn Platform>` beside the activator and scaler.
const _: fn(KubePlatform) -> Arc<dyn Platform> = |p| Arc::new(p);
