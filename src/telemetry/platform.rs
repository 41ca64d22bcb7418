//! Metrics of the platforms: the process platform (`platform::local`: replicas by state,
//! spawn-to-ready time, exits and restarts) and the Kubernetes platform
//! (`platform::kubernetes`: watch events and errors, scale patches by outcome).

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Labels: one revision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RevisionLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name (`hello-00001`).
    pub revision: String,
}

/// Where a replica is in its life (label values: `starting`, `ready`, `backoff`,
/// `terminating`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaStateLabel {
    /// Spawned, not yet answering its readiness probe.
    Starting,
    /// Answering; its endpoint is in the snapshot's `ready` list.
    Ready,
    /// Waiting to be restarted after an exit it was not asked for.
    Backoff,
    /// Being stopped (draining, then SIGTERM, then SIGKILL).
    Terminating,
}

/// Labels: one revision and one replica state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReplicaStateLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name.
    pub revision: String,
    /// The replicas' state.
    pub state: ReplicaStateLabel,
}

/// Why a replica process ended (label values in snake case: `stopped`, `port_taken`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExitReason {
    /// Stopped because thaw asked it to (scale down, removal, shutdown).
    Stopped,
    /// Exited on its own before it ever became ready.
    Crashed,
    /// Exited on its own after it had been ready.
    Exited,
    /// Did not become ready within the startup timeout, so thaw killed it.
    StartupTimeout,
    /// Could not be spawned at all (program missing, not executable, ...).
    SpawnFailed,
    /// Exited before ready because its port was taken meanwhile; retried on a new port.
    PortTaken,
}

impl ReplicaStateLabel {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Backoff => "backoff",
            Self::Terminating => "terminating",
        }
    }
}

impl EncodeLabelValue for ReplicaStateLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl ExitReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Crashed => "crashed",
            Self::Exited => "exited",
            Self::StartupTimeout => "startup_timeout",
            Self::SpawnFailed => "spawn_failed",
            Self::PortTaken => "port_taken",
        }
    }
}

impl EncodeLabelValue for ExitReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels: one revision and one exit reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ExitLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name.
    pub revision: String,
    /// Why the process ended.
    pub reason: ExitReason,
}

/// Labels: one watched kind (`endpointslices`, `pods`, `deployments`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WatchLabels {
    /// The plural of the watched kind.
    pub resource: String,
}

/// Labels: what the Kubernetes platform ignored and why. `kind`: `deployment`, `service`,
/// `endpointslice` or `endpoint`; `reason`: see `platform::kubernetes::Ignored`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct IgnoredLabels {
    /// What was ignored.
    pub kind: String,
    /// Why (snake case).
    pub reason: String,
}

/// How one `/scale` patch ended (label values: `ok`, `retried`, `missing`, `failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleOutcome {
    /// Accepted by the API server.
    Ok,
    /// A 409, 429, 5xx or transport error: retried with backoff.
    Retried,
    /// The revision's Deployment was not there (yet): retried.
    Missing,
    /// Rejected (another 4xx): retried at the longest backoff, logged.
    Failed,
}

impl ScaleOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Retried => "retried",
            Self::Missing => "missing",
            Self::Failed => "failed",
        }
    }
}

impl EncodeLabelValue for ScaleOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels: one revision and one scale outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ScaleLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name.
    pub revision: String,
    /// How the patch ended.
    pub outcome: ScaleOutcome,
}

type HistogramFamily = Family<RevisionLabels, Histogram, fn() -> Histogram>;

fn startup_histogram() -> Histogram {
    // 1 ms .. ~65 s: sample apps start in milliseconds, JVMs in tens of seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every family of the process platform. Cheap to clone (handles share their series).
#[derive(Debug, Clone)]
pub struct PlatformMetrics {
    /// `thaw_platform_replicas{namespace,revision,state}`: replicas per state, set on every
    /// change of the revision's replica set.
    pub replicas: Family<ReplicaStateLabels, Gauge>,
    /// `thaw_platform_replica_startup_seconds{namespace,revision}`: spawn to first successful
    /// readiness probe.
    pub startup: HistogramFamily,
    /// `thaw_platform_replica_exits_total{namespace,revision,reason}`.
    pub exits: Family<ExitLabels, Counter>,
    /// `thaw_platform_replica_restarts_total{namespace,revision}`: replacements started after an
    /// exit thaw did not ask for.
    pub restarts: Family<RevisionLabels, Counter>,
    /// `thaw_platform_watch_events_total{resource}`: events the Kubernetes platform's watches
    /// received (applied, deleted, listed).
    pub watch_events: Family<WatchLabels, Counter>,
    /// `thaw_platform_watch_errors_total{resource}`: watch errors (each followed by a resumed
    /// watch after backoff, or a re-list after a 410).
    pub watch_errors: Family<WatchLabels, Counter>,
    /// `thaw_platform_scale_patches_total{namespace,revision,outcome}`: `/scale` patches of
    /// revisions' Deployments and how each ended.
    pub scale_patches: Family<ScaleLabels, Counter>,
    /// `thaw_platform_revisions_rejected_total{namespace,revision}`: Revisions (or their
    /// re-resolution after a ConfigMap change) found invalid and skipped; the revision's last
    /// valid spec, if any, stays in force.
    pub revisions_rejected: Family<RevisionLabels, Counter>,
    /// `thaw_platform_foreign_endpoints_total{namespace,revision}`: endpoints of a revision's
    /// private slices whose pod does not belong to the revision's Deployment (or that name no
    /// pod), left out; counted each time a slice carrying them is received.
    pub foreign_endpoints: Family<RevisionLabels, Counter>,
    /// `thaw_platform_owners_refused_total{resource}`: pods or ReplicaSets the ownership index
    /// refused because it was full (their endpoints stay pending).
    pub owners_refused: Family<WatchLabels, Counter>,
    /// `thaw_platform_ignored_total{kind,reason}`: objects carrying a revision's labels that
    /// are not its own (a Deployment or private Service not named for it or not controlled by
    /// it, a slice not of its private Service) and endpoints not bound to its pods, each
    /// counted once when it is found so (a change of reason counts again).
    pub ignored: Family<IgnoredLabels, Counter>,
}

impl Default for PlatformMetrics {
    fn default() -> Self {
        Self {
            replicas: Family::default(),
            startup: Family::new_with_constructor(startup_histogram),
            exits: Family::default(),
            restarts: Family::default(),
            watch_events: Family::default(),
            watch_errors: Family::default(),
            scale_patches: Family::default(),
            revisions_rejected: Family::default(),
            foreign_endpoints: Family::default(),
            owners_refused: Family::default(),
            ignored: Family::default(),
        }
    }
}

impl PlatformMetrics {
    /// Registers every family in `reg` (unprefixed names; the registry adds `thaw_`).
    pub fn register(reg: &mut Registry) -> Self {
        Self::register_scoped(reg, super::Scope::Cluster)
    }

    /// As [`PlatformMetrics::register`]; [`super::Scope::Local`] leaves out the Kubernetes
    /// platform's families (watches, `/scale` patches, rejected Revisions).
    pub fn register_scoped(reg: &mut Registry, scope: super::Scope) -> Self {
        let m = Self::default();
        reg.register(
            "platform_replicas",
            "Replica processes per revision and state",
            super::Listed(m.replicas.clone()),
        );
        reg.register_with_unit(
            "platform_replica_startup",
            "Time from spawning a replica to its first successful readiness probe",
            Unit::Seconds,
            super::Listed(m.startup.clone()),
        );
        reg.register(
            "platform_replica_exits",
            "Replica processes that ended, by reason",
            super::Listed(m.exits.clone()),
        );
        reg.register(
            "platform_replica_restarts",
            "Replicas started to replace one that exited on its own",
            super::Listed(m.restarts.clone()),
        );
        if scope == super::Scope::Local {
            return m;
        }
        reg.register(
            "platform_watch_events",
            "Events received by the Kubernetes platform's watches",
            m.watch_events.clone(),
        );
        reg.register(
            "platform_watch_errors",
            "Errors of the Kubernetes platform's watches (each is retried)",
            m.watch_errors.clone(),
        );
        reg.register(
            "platform_scale_patches",
            "Scale patches of revisions' Deployments, by outcome",
            m.scale_patches.clone(),
        );
        reg.register(
            "platform_revisions_rejected",
            "Revisions found invalid and skipped (the last valid spec stays)",
            super::Listed(m.revisions_rejected.clone()),
        );
        reg.register(
            "platform_foreign_endpoints",
            "Endpoints of a revision's private slices whose pod is not the revision's Deployment's, left out",
            super::Listed(m.foreign_endpoints.clone()),
        );
        reg.register(
            "platform_owners_refused",
            "Pods or ReplicaSets the ownership index refused because it was full",
            m.owners_refused.clone(),
        );
        reg.register(
            "platform_ignored",
            "Objects and endpoints carrying a revision's labels that are not its own, by kind and reason",
            m.ignored.clone(),
        );
        m
    }
}
