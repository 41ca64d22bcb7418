//! From the decider's answer to the replica count: min/max/initial-scale bounds and Knative's
//! scale-to-zero rules (docs/architecture.md, "Knative's rules"; Knative's `kpa/scaler.go` and
//! `computeActiveCondition`).
//!
//! A revision is [`Activity::Activating`] (asked to have pods, not enough ready),
//! [`Activity::Active`] or [`Activity::Inactive`] (no traffic; the activator fronts it). When
//! the (bounded) answer is 0:
//!
//! - with `enable-scale-to-zero: false` the answer is 1;
//! - activating: hold the current replicas until `activation-timeout`, then 0;
//! - active for less than a stable window: 1; after that, the revision becomes inactive;
//! - inactive: the last replica goes once the activator is in the path and either the
//!   revision has been inactive for max(grace period, pod retention) or — retention being
//!   over — the activator has been in the path for the grace period.
//!
//! With the activator always in the path (local mode), that means the last replica goes as
//! soon as the revision turns inactive: a stable window after its last request.
//!
//! Pure: the scaler passes the clock and the facts in ([`Facts`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::config::AutoscalingSpec;

/// How long a revision [`Lifecycle::adopted`] active stays active at least, however long ago
/// it became active: the new leader's first seconds of stats may lack a reporter that has not
/// found it yet (an activator following the Lease, the first pod-stats pulls), and a window
/// of only the reporters that did could read idle. Knative's default panic window, the
/// shortest window the KPA decides on.
pub const RESUME_SETTLE: Duration = Duration::from_secs(6);

/// Why a revision is inactive (Knative's `Active=False` reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InactiveReason {
    /// No traffic for a stable window.
    NoTraffic,
    /// It was activating for longer than the activation timeout.
    TimedOut,
}

/// The revision's activity (Knative's PodAutoscaler `Active` condition), with the time it
/// entered that state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Asked to have pods, fewer ready than needed (Knative's `Active=Unknown`, Queued).
    Activating {
        /// When it started activating.
        since: Instant,
    },
    /// Enough pods ready (Knative's `Active=True`).
    Active {
        /// When it became active.
        since: Instant,
    },
    /// No traffic, or activation gave up (Knative's `Active=False`).
    Inactive {
        /// When it became inactive.
        since: Instant,
        /// Why.
        reason: InactiveReason,
    },
}

/// What the scaler knows at one decision besides the spec.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// Pods ready now.
    pub ready: u32,
    /// Whether a route sends traffic to the revision (min-scale and pod retention apply only
    /// then).
    pub reachable: bool,
    /// Since when the activator has been in the request path, if it is.
    pub activator_since: Option<Instant>,
    /// The decision's time.
    pub now: Instant,
}

/// Why the scaler answered what it did; logged with each change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A non-zero answer within min/max-scale.
    Decided,
    /// The decider has no answer yet and the revision is not activating: leave it alone.
    NoDecisionYet,
    /// 0 with scale-to-zero disabled: keep one pod.
    ScaleToZeroDisabled,
    /// 0 while activating: hold the replicas until the activation timeout.
    Activating,
    /// Activating for longer than the activation timeout: give up, 0.
    ActivationTimedOut,
    /// 0 while active for less than a stable window: keep one pod.
    StableWindowNotOver,
    /// 0 after a stable window of activity: the revision turns inactive.
    Deactivating,
    /// Inactive, but the activator is not in the path yet.
    ActivatorNotInPath,
    /// Inactive for max(grace, retention): the last pod goes.
    InactiveLongEnough,
    /// Inactive for less than the pod retention period: keep the pod.
    PodRetention,
    /// The activator has been in the path for the grace period: the last pod goes.
    GraceElapsed,
    /// Waiting out the rest of the grace period.
    GracePending,
}

impl Why {
    /// The rule in plain words, for the scale-decision log line.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Decided => "the KPA's answer for the observed load",
            Why::NoDecisionYet => "no decision yet",
            Why::ScaleToZeroDisabled => "idle, but enable-scale-to-zero is false: keep one",
            Why::Activating => "activating: holding replicas until the activation timeout",
            Why::ActivationTimedOut => "activation timed out: giving up",
            Why::StableWindowNotOver => "idle, but active for less than a stable window",
            Why::Deactivating => "idle for a stable window: revision inactive",
            Why::ActivatorNotInPath => "inactive, waiting for the activator to be in the path",
            Why::InactiveLongEnough => "inactive for the grace and pod retention periods",
            Why::PodRetention => "inactive, keeping the last replica for the retention period",
            Why::GraceElapsed => {
                "idle for a stable window; activator in the path for the grace \
                                  period: the last replica goes"
            }
            Why::GracePending => "inactive, waiting out the scale-to-zero grace period",
        }
    }
}

/// The scaler's answer for one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Knative's `want`: the replicas the revision should have; −1 when unknown. It drives the
    /// activity and the activator-in-path decision even when not applied.
    pub want: i32,
    /// Whether `want` is to be applied to the platform now.
    pub apply: bool,
    /// The rule that produced the answer.
    pub why: Why,
}

/// One revision's activity and whether its initial scale was ever reached.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    activity: Activity,
    /// Knative's `ScaleTargetInitialized`: ready pods once reached max(min, initial) scale;
    /// initial-scale stops acting as a lower bound from then on.
    initialized: bool,
}

impl Lifecycle {
    /// A new revision: activating toward its initial scale, or inactive when it starts at 0.
    pub fn new(spec: &AutoscalingSpec, reachable: bool, now: Instant) -> Self {
        let mut l = Self {
            activity: Activity::Activating { since: now },
            initialized: false,
        };
        if l.min_ready(spec, reachable) == 0 {
            l.activity = Activity::Inactive {
                since: now,
                reason: InactiveReason::NoTraffic,
            };
        }
        l
    }

    /// A revision initialized before this scaler followed it (a leader change), with `ready`
    /// pods ready and `replicas` asked for: active when enough pods are ready, inactive at
    /// zero, activating otherwise.
    ///
    /// `recorded` is the activity the earlier scaler recorded (Knative's PodAutoscaler
    /// `Active` condition and its last transition). The revision continues it, from its
    /// `since`, when the facts agree with it: active with enough pods ready, activating with
    /// too few, inactive with its last pods waiting out the grace period or at zero (a
    /// Knative PodAutoscaler stays inactive until it wants pods again). So the stable window
    /// of activity, the grace period and the activation timeout run on across leaders. An
    /// active revision stays active for [`RESUME_SETTLE`] into the term at least (a stable
    /// window at most, as with nothing recorded): this leader's first seconds of stats may
    /// lack a reporter that has not found it yet. An activity the facts contradict (none
    /// recorded, a write the old leader did not finish) starts from `now`.
    pub fn adopted(
        spec: &AutoscalingSpec,
        reachable: bool,
        ready: u32,
        replicas: Option<u32>,
        recorded: Option<Activity>,
        now: Instant,
    ) -> Self {
        let mut l = Self {
            activity: Activity::Activating { since: now },
            initialized: true,
        };
        let min_ready = l.min_ready(spec, reachable);
        if ready >= min_ready && ready > 0 {
            l.activity = Activity::Active { since: now };
        } else if replicas == Some(0) || min_ready == 0 && ready == 0 {
            l.activity = Activity::Inactive {
                since: now,
                reason: InactiveReason::NoTraffic,
            };
        }
        let since_now = |since: Instant| since.min(now);
        // Active for a stable window at the earliest RESUME_SETTLE into the term.
        let settled = (now + RESUME_SETTLE.min(spec.stable_window)).checked_sub(spec.stable_window);
        l.activity = match (recorded, l.activity) {
            (Some(Activity::Active { since }), Activity::Active { .. }) => Activity::Active {
                since: since_now(since).max(settled.unwrap_or(since)),
            },
            (Some(Activity::Activating { since }), Activity::Activating { .. }) => {
                Activity::Activating {
                    since: since_now(since),
                }
            }
            (
                Some(Activity::Inactive { since, reason }),
                Activity::Active { .. } | Activity::Inactive { .. },
            ) => Activity::Inactive {
                since: since_now(since),
                reason,
            },
            (_, found) => found,
        };
        l
    }

    /// The current activity.
    pub fn activity(&self) -> Activity {
        self.activity
    }

    /// Whether the revision has reached its initial scale once.
    pub fn initialized(&self) -> bool {
        self.initialized
    }

    /// (min, max) replicas: min-scale (ignored when unreachable), raised to initial-scale
    /// until it was reached when initial-scale > 1; max 0 means unbounded.
    pub fn bounds(&self, spec: &AutoscalingSpec, reachable: bool) -> (u32, u32) {
        let mut min = if reachable { spec.min_scale } else { 0 };
        if spec.initial_scale > 1 && !self.initialized {
            min = min.max(spec.initial_scale);
        }
        (min, spec.max_scale)
    }

    /// Ready pods needed to count as active: max(min, initial) before initialisation, then
    /// max(min, 1).
    pub fn min_ready(&self, spec: &AutoscalingSpec, reachable: bool) -> u32 {
        let min = if reachable { spec.min_scale } else { 0 };
        if self.initialized {
            min.max(1)
        } else {
            min.max(spec.initial_scale)
        }
    }

    /// Turns the decider's answer (`decided`, −1 when it has none) into the replica count.
    pub fn verdict(&self, spec: &AutoscalingSpec, decided: i32, facts: &Facts) -> Verdict {
        let activating = matches!(self.activity, Activity::Activating { .. });
        if decided < 0 && !activating {
            return verdict(decided, false, Why::NoDecisionYet);
        }
        let (min, max) = self.bounds(spec, facts.reachable);
        let mut desired = u32::try_from(decided).unwrap_or(0).max(min);
        if max != 0 {
            desired = desired.min(max);
        }
        if desired != 0 {
            return verdict(
                i32::try_from(desired).unwrap_or(i32::MAX),
                true,
                Why::Decided,
            );
        }
        if !spec.enable_scale_to_zero {
            return verdict(1, true, Why::ScaleToZeroDisabled);
        }
        let now = facts.now;
        match self.activity {
            Activity::Activating { since } => {
                if now.saturating_duration_since(since) > spec.activation_timeout() {
                    verdict(0, true, Why::ActivationTimedOut)
                } else {
                    verdict(-1, false, Why::Activating)
                }
            }
            Activity::Active { since } => {
                if now.saturating_duration_since(since) >= spec.stable_window {
                    verdict(0, false, Why::Deactivating)
                } else {
                    verdict(1, true, Why::StableWindowNotOver)
                }
            }
            Activity::Inactive { since, .. } => {
                let Some(proxy_since) = facts.activator_since else {
                    return verdict(0, false, Why::ActivatorNotInPath);
                };
                let retention = if facts.reachable {
                    spec.scale_to_zero_pod_retention_period
                } else {
                    Duration::ZERO
                };
                let grace = spec.scale_to_zero_grace_period;
                let inactive_for = now.saturating_duration_since(since);
                if inactive_for >= grace.max(retention) {
                    verdict(0, true, Why::InactiveLongEnough)
                } else if !retention.is_zero() && inactive_for < retention {
                    verdict(0, false, Why::PodRetention)
                } else if now.saturating_duration_since(proxy_since) >= grace {
                    verdict(0, true, Why::GraceElapsed)
                } else {
                    verdict(0, false, Why::GracePending)
                }
            }
        }
    }

    /// Updates the activity from the verdict's `want` and the ready pods (Knative's
    /// `computeActiveCondition`). Returns true when the revision has just turned inactive.
    pub fn observe(&mut self, spec: &AutoscalingSpec, want: i32, facts: &Facts) -> bool {
        let min_ready = self.min_ready(spec, facts.reachable);
        if facts.ready >= min_ready {
            self.initialized = true;
        }
        let now = facts.now;
        let inactive = matches!(self.activity, Activity::Inactive { .. });
        if want == 0 || min_ready == 0 {
            if inactive {
                return false;
            }
            let reason = match self.activity {
                Activity::Activating { .. } if min_ready > 0 => InactiveReason::TimedOut,
                _ => InactiveReason::NoTraffic,
            };
            self.activity = Activity::Inactive { since: now, reason };
            return true;
        }
        if want <= 0 && inactive {
            return false;
        }
        if facts.ready < min_ready {
            if !matches!(self.activity, Activity::Activating { .. }) {
                self.activity = Activity::Activating { since: now };
            }
        } else if !matches!(self.activity, Activity::Active { .. }) {
            self.activity = Activity::Active { since: now };
        }
        false
    }
}

fn verdict(want: i32, apply: bool, why: Why) -> Verdict {
    Verdict { want, apply, why }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
