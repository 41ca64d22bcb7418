//! The part of a Revision's status the autoscaler writes: `desiredReplicas`,
//! `actualReplicas`, the `Active` condition and, once the revision reached its initial scale,
//! `ScaleTargetInitialized`, written to `/status` with the autoscaler's own field manager as a
//! read-modify-PUT carrying the `resourceVersion` read, so the controller's fields and
//! conditions are never overwritten and a write that crosses another is refused (409) rather
//! than lost. [`AutoscalerStatus::of`] reads them back, so a new leader writes nothing that is
//! already true.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use super::duck::{Condition, ConditionSeverity, ConditionStatus};
use super::{Revision, condition};
use crate::revision::RevisionKey;

/// The autoscaler's field manager (it also owns every revision Deployment's `/scale`).
pub const AUTOSCALER_FIELD_MANAGER: &str = "autoscaler.thaw.dev";

/// Whether a revision serves, in Knative's terms (the PodAutoscaler's `Active`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Has ready pods: `Active=True`.
    Active,
    /// Scaling up from zero, requests held: `Active=Unknown`, reason `Queued`.
    Activating,
    /// At zero: `Active=False`, reason `NoTraffic`.
    Inactive,
    /// No ready pod within the activation timeout: `Active=False`, reason `TimedOut`.
    TimedOut,
}

/// Knative's `Active` condition for `activity`, last changed at `since`. Not-True values
/// carry severity Info (`Active` is outside the Ready set: a Ready revision may be at zero).
pub fn active_condition(activity: Activity, since: Time) -> Condition {
    let (status, reason, message) = match activity {
        Activity::Active => (ConditionStatus::True, None, None),
        Activity::Activating => (
            ConditionStatus::Unknown,
            Some("Queued"),
            Some("Requests to the target are being buffered as resources are provisioned."),
        ),
        Activity::Inactive => (
            ConditionStatus::False,
            Some("NoTraffic"),
            Some("The target is not receiving traffic."),
        ),
        Activity::TimedOut => (
            ConditionStatus::False,
            Some("TimedOut"),
            Some("The target could not be activated."),
        ),
    };
    Condition {
        type_: condition::ACTIVE.into(),
        status,
        severity: (status != ConditionStatus::True).then_some(ConditionSeverity::Info),
        last_transition_time: Some(since),
        reason: reason.map(Into::into),
        message: message.map(Into::into),
    }
}

/// `ScaleTargetInitialized=True` (severity Info: outside Ready), set at `since`.
pub fn initialized_condition(since: Time) -> Condition {
    Condition {
        type_: condition::SCALE_TARGET_INITIALIZED.into(),
        status: ConditionStatus::True,
        severity: Some(ConditionSeverity::Info),
        last_transition_time: Some(since),
        reason: None,
        message: None,
    }
}

/// The autoscaler's part of a Revision's status as stored: what a leader compares with before
/// it writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AutoscalerStatus {
    pub desired: Option<i32>,
    pub actual: Option<i32>,
    /// The `Active` condition's status, reason and last transition.
    pub active: Option<(ConditionStatus, Option<String>, Option<Time>)>,
    /// `ScaleTargetInitialized=True` is stored (since then).
    pub initialized_written: Option<Time>,
    /// The revision counts as initialized: `ScaleTargetInitialized=True`, or (a revision from
    /// before the condition existed) no such condition and `Ready=True`.
    pub initialized: bool,
}

impl AutoscalerStatus {
    /// Reads `rev`'s stored status.
    pub fn of(rev: &Revision) -> Self {
        let Some(st) = rev.status.as_ref() else {
            return Self::default();
        };
        let conds = &st.status;
        let initialized_cond = conds.condition(condition::SCALE_TARGET_INITIALIZED);
        let written = initialized_cond.is_some_and(|c| c.status == ConditionStatus::True);
        Self {
            desired: st.desired_replicas,
            actual: st.actual_replicas,
            active: conds
                .condition(condition::ACTIVE)
                .map(|c| (c.status, c.reason.clone(), c.last_transition_time.clone())),
            initialized_written: initialized_cond
                .filter(|_| written)
                .map(|c| c.last_transition_time.clone().unwrap_or_else(epoch)),
            initialized: written || (initialized_cond.is_none() && conds.is_true(condition::READY)),
        }
    }
}

fn epoch() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// The wall-clock time of `at` on this process's monotonic clock: what a condition's
/// `lastTransitionTime` records of a transition the scaler timed with [`Instant`]s.
pub fn time_of(at: Instant) -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    let ago = Instant::now().saturating_duration_since(at);
    let ago = k8s_openapi::jiff::SignedDuration::try_from(ago).unwrap_or_default();
    Time(now.checked_sub(ago).unwrap_or(now))
}

/// The instant on this process's monotonic clock at which an earlier leader's `time` was, as
/// far as the two replicas' wall clocks agree (Knative's leaders compare stored condition
/// times with their own clocks alike). A time in the future is now. A time further back than
/// the monotonic clock reaches (it starts near the host's boot) is taken at least half as
/// far back: old enough for every judgment of seconds to hours made on it.
pub fn instant_of(time: &Time) -> Instant {
    let now = Instant::now();
    let ago = k8s_openapi::jiff::Timestamp::now().duration_since(time.0);
    let Ok(mut ago) = Duration::try_from(ago) else {
        return now;
    };
    // Bounded: at most 64 halvings of a u64 count of seconds.
    loop {
        if let Some(at) = now.checked_sub(ago) {
            return at;
        }
        ago /= 2;
    }
}

/// Writes the autoscaler's status fields to `revision`'s `/status`: reads the Revision,
/// sets `desiredReplicas`, `actualReplicas` and the given conditions (by type, leaving every
/// other field and condition as read), and PUTs it back with the `resourceVersion` read, as
/// [`AUTOSCALER_FIELD_MANAGER`]. The resourceVersion is the write's precondition: a write
/// crossing another (the controller's, or a stale leader's) is refused with 409 and made again
/// from a fresh read (a few times; then the error is returned and the caller retries later).
pub async fn apply_autoscaler_status(
    client: kube::Client,
    revision: &RevisionKey,
    desired: Option<i32>,
    actual: i32,
    active: Condition,
    initialized: Option<Condition>,
) -> Result<Revision, kube::Error> {
    let api: Api<Revision> = Api::namespaced(client, &revision.namespace);
    let pp = PostParams {
        field_manager: Some(AUTOSCALER_FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let mut conflicts = 0;
    loop {
        let mut rev = api.get_status(&revision.name).await?;
        set_autoscaler_status(&mut rev, desired, actual, &active, initialized.as_ref());
        rev.metadata.managed_fields = None;
        match api.replace_status(&revision.name, &pp, &rev).await {
            Err(kube::Error::Api(e)) if e.code == 409 && conflicts < 3 => conflicts += 1,
            r => return r,
        }
    }
}

/// Sets the autoscaler's fields of `rev`'s status (conditions replaced by type, kept sorted
/// by type as Knative keeps them); everything else stays.
pub fn set_autoscaler_status(
    rev: &mut Revision,
    desired: Option<i32>,
    actual: i32,
    active: &Condition,
    initialized: Option<&Condition>,
) {
    let st = rev.status.get_or_insert_default();
    st.actual_replicas = Some(actual);
    if desired.is_some() {
        st.desired_replicas = desired;
    }
    let conds = &mut st.status.conditions;
    for c in std::iter::once(active).chain(initialized) {
        match conds.iter_mut().find(|o| o.type_ == c.type_) {
            Some(o) => *o = c.clone(),
            None => conds.push(c.clone()),
        }
    }
    conds.sort_by(|a, b| a.type_.cmp(&b.type_));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transition timed on the monotonic clock, written as a condition time and read back
    /// by another leader, is the same instant (to the clock reads in between); a time ahead of
    /// the reader's clock is now.
    #[test]
    fn condition_times_round_trip_through_the_wall_clock() {
        let at = Instant::now() - Duration::from_secs(90);
        let back = instant_of(&time_of(at));
        let off = back.max(at) - back.min(at);
        assert!(off < Duration::from_secs(1), "{off:?}");
        let ahead = Time(k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(3600));
        let before = Instant::now();
        let read = instant_of(&ahead);
        assert!(read >= before && read <= Instant::now());
    }
}
