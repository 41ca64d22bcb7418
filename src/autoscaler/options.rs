//! The scaler's inputs and outputs besides the seam types: how it runs
//! ([`ScalerOptions`], [`ActivatorPath`]), why a decision ran ([`Trigger`]), and what it
//! knows about a revision ([`RevisionStatus`]). Re-exported from [`super::scaler`].

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use crate::revision::RevisionKey;

use super::collector::Observed;
use super::lifecycle::Activity;

/// Since when the activator fronts a revision: the "activator in the path" input of the
/// scale-to-zero grace period (docs/architecture.md, "Knative's rules").
#[derive(Debug, Clone)]
pub enum ActivatorPath {
    /// Every request passes the activator (`thaw local`): it has been in the path since
    /// `since` (normally the scaler's start), or since the revision appeared if later. An
    /// inactive revision loses its last pod at once once `since` is a grace period old.
    Always {
        /// When the activator entered the path.
        since: Instant,
    },
    /// The activator is in the path exactly while this scaler publishes
    /// `activator_in_path = true` (the serving side applies it promptly); the grace period
    /// counts from the last switch into the path.
    FollowsDecision,
    /// Kubernetes: the activator is in a revision's path from the moment the writer of the
    /// revision's public endpoints confirms it ([`InPath::confirm`]), not from the decision:
    /// the grace period before scale to zero counts from the successful write.
    Confirmed(Arc<InPath>),
}

/// Since when each revision's public endpoints point at the activators, as confirmed by the
/// writer of those endpoints (the serving-mode swap). A revision never confirmed is not
/// fronted by the activator, so it is never taken to zero.
#[derive(Debug, Default)]
pub struct InPath {
    since: DashMap<RevisionKey, Instant>,
}

impl InPath {
    /// The activators front `revision` since `since` (a successful write).
    pub fn confirm(&self, revision: &RevisionKey, since: Instant) {
        self.since.entry(revision.clone()).or_insert(since);
    }

    /// `revision`'s traffic goes to its pods now (or the revision is gone).
    pub fn clear(&self, revision: &RevisionKey) {
        self.since.remove(revision);
    }

    /// Since when the activators front `revision`, if they do.
    pub fn since(&self, revision: &RevisionKey) -> Option<Instant> {
        self.since.get(revision).map(|s| *s)
    }
}

/// How the scaler runs.
#[derive(Debug, Clone)]
pub struct ScalerOptions {
    /// Since when the activator fronts revisions (the grace period's reference).
    pub activator_path: ActivatorPath,
    /// Interval between decision rounds (Knative: 2 s).
    pub tick: Duration,
    /// The longest one [`crate::platform::Platform::scale`] call may take; a call that takes longer is
    /// abandoned, counted, and retried at the next decision.
    pub scale_timeout: Duration,
    /// Decision rounds (ticks) completed; a takeover is complete after its first.
    pub rounds: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for ScalerOptions {
    /// Local mode: the activator always in the path since now, 2 s ticks, 5 s scale timeout.
    fn default() -> Self {
        Self {
            activator_path: ActivatorPath::Always {
                since: Instant::now(),
            },
            tick: Duration::from_secs(2),
            scale_timeout: Duration::from_secs(5),
            rounds: Arc::default(),
        }
    }
}

/// Why a decision ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The periodic round.
    Tick,
    /// A stat with load for a revision whose answer was 0.
    Poke,
}

impl Trigger {
    /// `tick` or `poke`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tick => "tick",
            Self::Poke => "poke",
        }
    }
}

/// A revision as of its last decision (for `thaw simulate`, tests and admin views).
#[derive(Debug, Clone, PartialEq)]
pub struct RevisionStatus {
    /// Replicas asked of the platform; −1 before the first scale call.
    pub desired: i32,
    /// The decider's latest answer (before bounds and scale-to-zero rules); −1 before its
    /// first.
    pub decided: i32,
    /// Ready pods seen at the last decision.
    pub ready: u32,
    /// Whether the decider is in panic mode.
    pub panicking: bool,
    /// The latest excess burst capacity (negative: the activator stays in the path).
    pub excess_burst_capacity: i64,
    /// Whether the activator must stay in the request path.
    pub activator_in_path: bool,
    /// Knative's PodAutoscaler `Active` condition.
    pub activity: Activity,
    /// The window averages used, `None` when there was no data.
    pub observed: Option<Observed>,
}
