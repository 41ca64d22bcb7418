//! The Revision's status from what the reconcile saw: its Deployment and its pods (Knative's
//! `PropagateDeploymentStatus` and the pod checks of `reconcileDeployment`). Pure: the time of
//! a transition is passed in.
//!
//! - **ResourcesAvailable** follows the Deployment: `Progressing` and `ReplicaFailure`
//!   (`Available` is ignored, as Knative does, since it waits on `minReadySeconds`); Unknown
//!   `Deploying` until the Deployment reports progress; False `ProgressDeadlineExceeded` when
//!   the Deployment gave up. While pods are wanted and none is available, a pod's problem
//!   overrides it: unschedulable (the `PodScheduled` reason and message), or a
//!   container waiting in `CrashLoopBackOff` ([`FAILING_WAITING_REASONS`], with the kubelet's
//!   message) at once, and any other waiting reason (`ImagePullBackOff`, `ErrImagePull`,
//!   `CreateContainerConfigError`, ...) once the Deployment's progress deadline has passed
//!   (Knative's rule; the data plane holds requests as long). The first pod with a problem explains it (the
//!   pods run the same spec).
//! - **ContainerHealthy**: False `ExitCode<N>` "Container failed with: <message>" when a user
//!   container's last run ended (the message is the termination message, else its reason such
//!   as `OOMKilled`); True once a replica is ready; otherwise as it was (Unknown `Deploying` at
//!   first), so a crash stays reported while the revision is at zero.
//! - **Ready** = both: False with the reason of the failing one (ContainerHealthy first),
//!   Unknown while either is Unknown, True when both are.
//! - `NotOwned` (a child someone else controls) and `InvalidSpec` (the revision cannot be
//!   deployed as written) make ResourcesAvailable and Ready False.
//!
//! - **ScaleTargetInitialized** (the autoscaler's, once the revision reached its initial
//!   scale; Knative's `PropagateAutoscalerStatus`) makes ResourcesAvailable and
//!   ContainerHealthy True unless the Deployment or a pod makes them False now.
//!
//! The autoscaler's fields (`actualReplicas`, `desiredReplicas`, the `Active` and
//! `ScaleTargetInitialized` conditions) and everything else the controller does not compute
//! are kept as read.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::queue::QUEUE_CONTAINER_NAME;
use crate::knative::duck::{Condition, ConditionStatus};
use crate::knative::{Revision, RevisionStatus, condition};
use crate::platform::kubernetes::FAILING_WAITING_REASONS;

/// Reasons the revision controller writes.
pub mod reason {
    /// The Deployment is being created or rolled out.
    pub const DEPLOYING: &str = "Deploying";
    /// The Deployment did not progress within its deadline.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// A child of that name exists and is controlled by someone else.
    pub const NOT_OWNED: &str = "NotOwned";
    /// The revision cannot be deployed as written (thaw's reason: Knative's webhook never
    /// admits such a revision).
    pub const INVALID_SPEC: &str = crate::knative::validate::reason::INVALID_SPEC;
}

/// What the reconcile found, in the order it checks.
#[derive(Debug, Clone, Copy)]
pub enum Observed<'a> {
    /// The revision is invalid: the message names each field.
    Invalid(&'a str),
    /// A child of `kind` named `name` is controlled by someone else.
    NotOwned { kind: &'a str, name: &'a str },
    /// The Deployment was just created.
    Created,
    /// The Deployment as read, and the revision's pods.
    Deployment {
        deployment: &'a Deployment,
        pods: &'a [Pod],
    },
}

/// A condition's new value.
struct Set {
    status: ConditionStatus,
    reason: Option<String>,
    message: Option<String>,
}

impl Set {
    fn new(status: ConditionStatus, reason: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            status,
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: (!message.is_empty()).then_some(message),
        }
    }

    fn into_condition(self, type_: &str) -> Condition {
        Condition {
            reason: self.reason,
            message: self.message,
            ..Condition::new(type_, self.status)
        }
    }

    fn true_() -> Self {
        Self {
            status: ConditionStatus::True,
            reason: None,
            message: None,
        }
    }
}

fn get(conds: &[Condition], type_: &str) -> Option<Set> {
    conds.iter().find(|c| c.type_ == type_).map(|c| Set {
        status: c.status,
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// Knative's `TransformDeploymentStatus`: the Deployment's readiness from `Progressing` and
/// `ReplicaFailure`.
fn deployment_ready(d: &Deployment) -> Set {
    let mut progressing = Set::new(ConditionStatus::Unknown, reason::DEPLOYING, "");
    let mut replica_set = Set::true_();
    for c in d.status.iter().flat_map(|s| s.conditions.iter().flatten()) {
        let status = match c.status.as_str() {
            "True" => ConditionStatus::True,
            "False" => ConditionStatus::False,
            _ => ConditionStatus::Unknown,
        };
        let r = c.reason.as_deref().unwrap_or_default();
        let m = c.message.clone().unwrap_or_default();
        match c.type_.as_str() {
            "Progressing" => {
                progressing = match status {
                    ConditionStatus::True => Set::true_(),
                    s => Set::new(s, r, m),
                }
            }
            "ReplicaFailure" => {
                replica_set = match status {
                    ConditionStatus::True => Set::new(ConditionStatus::False, r, m),
                    ConditionStatus::False => Set::true_(),
                    ConditionStatus::Unknown => Set::new(ConditionStatus::Unknown, r, m),
                }
            }
            _ => {}
        }
    }
    // Ready = Progressing ∧ ReplicaSetReady: a False one decides, then an Unknown one.
    first_not_true([progressing, replica_set])
}

/// The first False of `sets`, else the first Unknown, else True (a Knative condition set's
/// happy condition).
fn first_not_true<const N: usize>(sets: [Set; N]) -> Set {
    let mut sets = Vec::from(sets);
    if let Some(i) = sets.iter().position(|s| s.status == ConditionStatus::False) {
        return sets.swap_remove(i);
    }
    if let Some(i) = sets
        .iter()
        .position(|s| s.status == ConditionStatus::Unknown)
    {
        return sets.swap_remove(i);
    }
    Set::true_()
}

/// Whether the Deployment gave up (`Progressing=False`, `ProgressDeadlineExceeded`).
fn timed_out(d: &Deployment) -> bool {
    d.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some(reason::PROGRESS_DEADLINE_EXCEEDED)
        })
}

/// `ExitCode<N>`, "Container failed with: <message>" for a user container whose last run
/// ended.
fn exit_failure(c: &ContainerStatus) -> Option<Set> {
    let t = c.last_state.as_ref()?.terminated.as_ref()?;
    let what = match (t.message.as_deref(), t.reason.as_deref()) {
        (Some(m), _) if !m.is_empty() => m.to_string(),
        (_, Some(r)) if !r.is_empty() && r != "Error" && r != "Completed" => r.to_string(),
        _ if t.exit_code == 0 => "container exited with no error".to_string(),
        _ => format!("exit code {}", t.exit_code),
    };
    Some(Set::new(
        ConditionStatus::False,
        &format!("ExitCode{}", t.exit_code),
        format!("Container failed with: {what}"),
    ))
}

/// The pod-level problems of the revision's first pod: (ResourcesAvailable, ContainerHealthy)
/// overrides.
fn pod_problems(pod: &Pod, deadline_passed: bool) -> (Option<Set>, Option<Set>) {
    let Some(status) = pod.status.as_ref() else {
        return (None, None);
    };
    let mut resources = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            Set::new(
                ConditionStatus::False,
                c.reason.as_deref().unwrap_or("Unschedulable"),
                c.message.clone().unwrap_or_default(),
            )
        });
    let mut health = None;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter(|c| c.name != QUEUE_CONTAINER_NAME);
    for c in containers {
        if health.is_none() {
            health = exit_failure(c);
        }
        if resources.is_none()
            && let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref())
            && let Some(r) = w.reason.as_deref()
            && (FAILING_WAITING_REASONS.contains(&r) || deadline_passed)
        {
            resources = Some(Set::new(
                ConditionStatus::False,
                r,
                w.message.clone().unwrap_or_default(),
            ));
        }
    }
    (resources, health)
}

/// The revision's status after this reconcile: `rev`'s status with the controller's
/// conditions recomputed from `seen`, `observedGeneration` set, the rest kept.
pub fn revision_status(rev: &Revision, seen: Observed<'_>, now: &Time) -> RevisionStatus {
    let mut status = rev.status.clone().unwrap_or_default();
    let previous_health = get(&status.status.conditions, condition::CONTAINER_HEALTHY);
    let deploying = || Set::new(ConditionStatus::Unknown, reason::DEPLOYING, "");
    let (resources, health) = match seen {
        Observed::Invalid(message) => (
            Set::new(ConditionStatus::False, reason::INVALID_SPEC, message),
            previous_health.unwrap_or_else(deploying),
        ),
        Observed::NotOwned { kind, name } => (
            Set::new(
                ConditionStatus::False,
                reason::NOT_OWNED,
                format!("There is an existing {kind} \"{name}\" that we do not own."),
            ),
            previous_health.unwrap_or_else(deploying),
        ),
        Observed::Created => (deploying(), previous_health.unwrap_or_else(deploying)),
        Observed::Deployment { deployment, pods } => {
            let mut resources = deployment_ready(deployment);
            let mut health = previous_health.unwrap_or_else(deploying);
            let st = deployment.status.as_ref();
            let wanted = deployment
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(1);
            let available = st.and_then(|s| s.available_replicas).unwrap_or(0);
            if wanted > 0 && available == 0 {
                // The first pod with a problem explains them all (they run the same spec).
                let deadline_passed = timed_out(deployment);
                let found = pods
                    .iter()
                    .map(|p| pod_problems(p, deadline_passed))
                    .find(|(r, h)| r.is_some() || h.is_some());
                if let Some((r, h)) = found {
                    if let Some(r) = r {
                        resources = r;
                    }
                    if let Some(h) = h {
                        health = h;
                    }
                }
            }
            if st.and_then(|s| s.ready_replicas).unwrap_or(0) > 0 {
                health = Set::true_();
            }
            // Knative's `PropagateAutoscalerStatus`: once the autoscaler says the revision
            // reached its initial scale, its resources were available and its containers
            // healthy, unless the Deployment or a pod says otherwise now.
            if rev
                .status
                .as_ref()
                .is_some_and(|s| s.status.is_true(condition::SCALE_TARGET_INITIALIZED))
            {
                if resources.status != ConditionStatus::False {
                    resources = Set::true_();
                }
                if health.status != ConditionStatus::False {
                    health = Set::true_();
                }
            }
            (resources, health)
        }
    };
    let st = &mut status.status;
    st.set(
        resources.into_condition(condition::RESOURCES_AVAILABLE),
        now,
    );
    st.set(health.into_condition(condition::CONTAINER_HEALTHY), now);
    // ContainerHealthy first: its reason is the more specific when both fail.
    st.set_ready_from(
        condition::READY,
        &[condition::CONTAINER_HEALTHY, condition::RESOURCES_AVAILABLE],
        now,
    );
    status.status.observed_generation = rev.metadata.generation;
    status
}

#[cfg(test)]
mod tests;
