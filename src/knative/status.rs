//! The part of a Revision's status the autoscaler writes: `desiredReplicas`,
//! `actualReplicas` and the `Active` condition, applied server-side to `/status` with the
//! autoscaler's own field manager, so the controller's fields and conditions are never
//! overwritten (the CRD makes `conditions` a map keyed by `type` for this).

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

/// The server-side apply body of the autoscaler's status fields.
pub fn autoscaler_status(
    name: &str,
    desired: Option<i32>,
    actual: i32,
    active: Condition,
) -> serde_json::Value {
    let mut status = serde_json::json!({
        "actualReplicas": actual,
        "conditions": [active],
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
) -> Result<Revision, kube::Error> {
    let api: Api<Revision> = Api::namespaced(client, &revision.namespace);
    let body = autoscaler_status(&revision.name, desired, actual, active);
    api.patch_status(
        &revision.name,
        &PatchParams::apply(AUTOSCALER_FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
}
