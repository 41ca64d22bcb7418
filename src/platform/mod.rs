//! Where replicas run: the [`Platform`] trait, and its implementations.
//!
//! A platform scales revisions and publishes, per revision, full endpoint snapshots on a watch
//! channel. The activator and the scaler both subscribe. An endpoint leaves `ready` (moving to
//! `terminating`) before its replica is signalled; the replica is stopped once the activator
//! reports it has nothing in flight ([`EndpointSource::drained`]) or after a bounded grace.
//!
//! Room: the [`Platform`] seam and where replicas run (`local`: child processes; `memory`: a
//! test double). May use: `revision`, `config`, `telemetry`, `clock`; never the activator or
//! the autoscaler, which both use it.

pub mod kubernetes;
pub mod local;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

use crate::revision::RevisionKey;

pub mod memory;

/// A boxed, sendable future (trait methods that must stay object-safe return this).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Whether a revision can serve at all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EndpointStatus {
    #[default]
    Ok,
    /// The revision cannot come up (its replicas keep crashing, it was removed, ...). Held
    /// requests are answered 503 with this reason at once.
    Failing { reason: Arc<str> },
}

/// One revision's endpoints at one moment. Always a full snapshot, never a delta.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointSnapshot {
    /// Endpoints that accept new requests.
    pub ready: Vec<SocketAddr>,
    /// Endpoints that are going away: no new requests, in-flight ones finish.
    pub terminating: Vec<SocketAddr>,
    /// Endpoints of pods that are up but not ready yet in the platform's view (a Kubernetes
    /// EndpointSlice's `ready: false`): never sent to as such. The activator may probe them
    /// and send to the ones that answer before the kubelet marks them ready
    /// (`crate::roles::early_ready`). Sorted.
    pub starting: Vec<SocketAddr>,
    pub status: EndpointStatus,
    /// Requests each ready endpoint may take at once, when that is not containerConcurrency:
    /// set when one endpoint stands for several pods (a private Service in
    /// mesh-compatibility mode, `crate::roles::mesh`). `None`: containerConcurrency.
    pub limit: Option<u32>,
    /// The platform has ready endpoints this view leaves out for now: under
    /// `mesh-compatibility-mode: auto`, until a probe decides whether the revision's pods are
    /// reached at their addresses or through its private Service (`crate::roles::share`). A
    /// request meanwhile waits for that probe, not for a cold start: the revision is not cold.
    pub reach_pending: bool,
    /// Some of the revision's ready or starting pods still run Knative's queue-proxy (a
    /// cluster moved from Knative Serving, before the revision rolls to thaw's sidecar). The
    /// activator then marks what it forwards `K-Proxy-Request: activator`, the one value
    /// queue-proxy counts as proxied, instead of the revision's tag, which only thaw's sidecar
    /// reads (docs/decisions.md, "Pods with Knative's queue-proxy").
    pub queue_proxy: bool,
}

/// A source of per-revision endpoint snapshots (the platform, or a test feeding them directly).
pub trait EndpointSource: Send + Sync + 'static {
    /// The watch of `revision`'s endpoints; created empty (status Ok) for a revision not seen
    /// before. The receiver always holds the latest snapshot.
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>>;

    /// Told by the activator when a terminating endpoint has nothing left in flight, so its
    /// replica can be stopped without cutting a request. Idempotent; may be ignored.
    fn drained(&self, revision: &RevisionKey, addr: SocketAddr);

    /// Whether a terminating endpoint's replica waits for [`EndpointSource::drained`] (up to
    /// a bound) before it stops. Then the activator watches every revision's endpoints from
    /// the start, so it can report a drained endpoint of a revision it never forwarded to;
    /// otherwise it watches a revision's endpoints from its first request on.
    fn needs_drain_reports(&self) -> bool {
        false
    }
}

/// Why a scale request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlatformError {
    #[error("revision {0} is unknown to the platform")]
    UnknownRevision(RevisionKey),
    #[error("scaling {revision} failed: {reason}")]
    Scale {
        revision: RevisionKey,
        reason: String,
    },
}

/// What a scaler finds of a revision it starts to follow: the state a previous scaler (an
/// earlier leader) left in the cluster, which the new one adopts instead of starting over.
/// Nothing is known by default (a fresh platform: `thaw local`, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found {
    /// The replicas the platform is asked for now (the Deployment's `spec.replicas`).
    pub replicas: Option<u32>,
    /// The revision reached its initial scale once (Knative's `ScaleTargetInitialized`):
    /// initial scale no longer applies to it.
    pub initialized: bool,
    /// Whether the activators are in the revision's request path as found (its public
    /// endpoints); `None` when nothing was written yet.
    pub activator_in_path: Option<bool>,
    /// The revision's activity as the earlier scaler recorded it, and since when (Knative's
    /// PodAutoscaler `Active` condition, kept on the Revision's status); `None` when none was
    /// recorded.
    pub activity: Option<FoundActivity>,
}

/// A revision's activity as an earlier scaler recorded it, with the instant (on this
/// process's clock) it entered it: a new leader continues the stable window, the grace period
/// and the activation timeout from there instead of starting them over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundActivity {
    /// Enough pods ready (`Active=True`).
    Active {
        /// Since when.
        since: tokio::time::Instant,
    },
    /// Asked to have pods, fewer ready (`Active=Unknown`).
    Activating {
        /// Since when.
        since: tokio::time::Instant,
    },
    /// No traffic, or the activation timed out (`Active=False`).
    Inactive {
        /// Since when.
        since: tokio::time::Instant,
        /// Whether because the activation timed out (reason `TimedOut`).
        timed_out: bool,
    },
}

/// Where replicas run: child processes (`local`) or Deployments (`kubernetes`).
pub trait Platform: EndpointSource {
    /// Asks for `replicas` replicas of `revision`. Returns once the request is accepted, not
    /// once the replicas are ready (readiness arrives on [`EndpointSource::endpoints`]).
    fn scale(
        &self,
        revision: &RevisionKey,
        replicas: u32,
    ) -> BoxFuture<'_, Result<(), PlatformError>>;

    /// What the platform holds of `revision` from before this scaler followed it.
    fn found(&self, _revision: &RevisionKey) -> Found {
        Found::default()
    }
}
