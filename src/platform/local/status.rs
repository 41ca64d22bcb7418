//! Read-only views of a revision's replicas, for the admin API and load tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::telemetry::platform::ReplicaStateLabel;

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaState {
    /// Process spawned, readiness probe not yet passed.
    Starting = 0,
    /// Probe passed; the endpoint is in the snapshot's `ready`.
    Ready = 1,
    /// No process: waiting for the first spawn or to replace one that exited.
    Backoff = 2,
    /// Being stopped: draining (endpoint in `terminating`), then SIGTERM, then SIGKILL.
    Terminating = 3,
}

impl ReplicaState {
    /// `starting`, `ready`, `backoff` or `terminating` (as in the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Starting => "starting",
            ReplicaState::Ready => "ready",
            ReplicaState::Backoff => "backoff",
            ReplicaState::Terminating => "terminating",
        }
    }
}

impl From<ReplicaState> for ReplicaStateLabel {
    fn from(s: ReplicaState) -> Self {
        match s {
            ReplicaState::Starting => ReplicaStateLabel::Starting,
            ReplicaState::Ready => ReplicaStateLabel::Ready,
            ReplicaState::Backoff => ReplicaStateLabel::Backoff,
            ReplicaState::Terminating => ReplicaStateLabel::Terminating,
        }
    }
}

/// One replica at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaStatus {
    /// The replica's number within its revision (log lines carry it), never reused.
    pub index: u32,
    /// Where the replica is in its life.
    pub state: ReplicaState,
    /// The process id (also its process group id) while a process runs.
    pub pid: Option<u32>,
    /// The loopback address its process was told to listen on (`PORT`).
    pub addr: Option<SocketAddr>,
    /// When its current process was spawned.
    pub started_at: Option<Instant>,
    /// Spawn to first successful readiness probe of its current process.
    pub ready_after: Option<Duration>,
    /// Processes started in this slot to replace ones that exited on their own.
    pub restarts: u32,
}

/// One revision's replicas at one moment ([`super::LocalPlatform::status`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionStatus {
    /// The replica count last asked for by `scale`.
    pub desired: u32,
    /// Every slot, terminating ones included, by index.
    pub replicas: Vec<ReplicaStatus>,
    /// Spawn-to-ready time of the most recent replica to become ready; the cold-start load
    /// test subtracts it from a request's total latency.
    pub last_startup: Option<Duration>,
    /// The `Failing` reason, if the revision is failing or removed.
    pub failing: Option<Arc<str>>,
    /// Exits before ready since a replica was last ready (or since scale to 0).
    pub consecutive_crashes: u32,
    /// Replacement processes started since the revision was first seen.
    pub restarts: u64,
}

impl RevisionStatus {
    /// Replicas whose endpoint is ready.
    pub fn ready(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Ready)
            .count()
    }

    /// A JSON view (durations in seconds as floats, `started_at` as age in seconds), for the
    /// admin `/revisions` endpoint.
    pub fn to_json(&self, now: Instant) -> serde_json::Value {
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        serde_json::json!({
            "desired": self.desired,
            "ready": self.ready(),
            "last_startup_seconds": secs(self.last_startup),
            "failing": self.failing.as_deref(),
            "consecutive_crashes": self.consecutive_crashes,
            "restarts": self.restarts,
            "replicas": self.replicas.iter().map(|r| serde_json::json!({
                "index": r.index,
                "state": r.state.as_str(),
                "pid": r.pid,
                "addr": r.addr.map(|a| a.to_string()),
                "age_seconds": secs(r.started_at.map(|t| now.saturating_duration_since(t))),
                "ready_after_seconds": secs(r.ready_after),
                "restarts": r.restarts,
            })).collect::<Vec<_>>(),
        })
    }
}
