//! The part of a Revision's status the autoscaler writes: `desiredReplicas`,
//! `actualReplicas`, the `Active` condition and, once the revision reached its initial scale,
//! `ScaleTargetInitialized`, applied server-side to `/status` with the autoscaler's own field
//! manager, so the controller's fields and conditions are never overwritten (the CRD makes
//! `conditions` a map keyed by `type` for this). [`AutoscalerStatus::of`] reads them back, so a
//! new leader writes nothing that is already true.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};

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

/// The server-side apply body of the autoscaler's status fields. Once `initialized` is given
/// it must be given in every later apply (a field left out of an apply is removed).
pub fn autoscaler_status(
    name: &str,
    desired: Option<i32>,
    actual: i32,
    active: Condition,
    initialized: Option<Condition>,
) -> serde_json::Value {
    let mut conditions = vec![active];
    conditions.extend(initialized);
    let mut status = serde_json::json!({
        "actualReplicas": actual,
        "conditions": conditions,
    });
    if let Some(d) = desired {
        status["desiredReplicas"] = d.into();
    }
    serde_json::json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Revision",
        "metadata": { "name": name },
        "status": status,
    })
}

/// Applies the autoscaler's status fields to `revision`'s `/status` (server-side apply,
/// [`AUTOSCALER_FIELD_MANAGER`], forced: these fields are the autoscaler's alone).
pub async fn apply_autoscaler_status(
    client: kube::Client,
    revision: &RevisionKey,
    desired: Option<i32>,
    actual: i32,
    active: Condition,
    initialized: Option<Condition>,
) -> Result<Revision, kube::Error> {
    let api: Api<Revision> = Api::namespaced(client, &revision.namespace);
    let body = autoscaler_status(&revision.name, desired, actual, active, initialized);
    api.patch_status(
        &revision.name,
        &PatchParams::apply(AUTOSCALER_FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
}
