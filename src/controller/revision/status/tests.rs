use super::*;
use crate::controller::revision::fixtures::{
    RevisionFixture, deployment, pod, terminated, waiting,
};
use crate::knative::duck::ConditionSeverity;
use k8s_openapi::api::core::v1::ContainerState;

fn t(s: &str) -> Time {
    Time(s.parse().unwrap())
}

fn cond<'a>(s: &'a RevisionStatus, type_: &str) -> &'a Condition {
    s.status.condition(type_).unwrap()
}

fn summary(s: &RevisionStatus, type_: &str) -> (ConditionStatus, Option<String>) {
    let c = cond(s, type_);
    (c.status, c.reason.clone())
}

const PROGRESSING: (&str, &str, &str) = ("Progressing", "True", "NewReplicaSetAvailable");
const DEADLINE: (&str, &str, &str) = ("Progressing", "False", "ProgressDeadlineExceeded");

fn running() -> ContainerState {
    ContainerState {
        running: Some(Default::default()),
        ..ContainerState::default()
    }
}

#[test]
fn a_new_deployment_is_deploying() {
    let rev = RevisionFixture::new("r").build();
    let s = revision_status(&rev, Observed::Created, &t("2026-01-01T00:00:00Z"));
    for c in [
        condition::READY,
        condition::RESOURCES_AVAILABLE,
        condition::CONTAINER_HEALTHY,
    ] {
        assert_eq!(
            summary(&s, c),
            (ConditionStatus::Unknown, Some("Deploying".into())),
            "{c}"
        );
    }
    assert_eq!(s.status.observed_generation, Some(1));
}

#[test]
fn ready_once_a_replica_is_ready_and_the_deployment_progressed() {
    let rev = RevisionFixture::new("r").build();
    let d = deployment(
        1,
        1,
        1,
        &[
            PROGRESSING,
            ("Available", "True", "MinimumReplicasAvailable"),
        ],
    );
    let seen = Observed::Deployment {
        deployment: &d,
        pods: &[],
    };
    let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
    assert_eq!(summary(&s, condition::READY), (ConditionStatus::True, None));
    assert_eq!(
        summary(&s, condition::CONTAINER_HEALTHY),
        (ConditionStatus::True, None)
    );
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (ConditionStatus::True, None)
    );
}

#[test]
fn a_deployment_without_progress_is_still_deploying() {
    let rev = RevisionFixture::new("r").build();
    let d = deployment(1, 0, 0, &[]);
    let pods = [pod(waiting("ContainerCreating", ""), None)];
    let seen = Observed::Deployment {
        deployment: &d,
        pods: &pods,
    };
    let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
    assert_eq!(
        summary(&s, condition::READY),
        (ConditionStatus::Unknown, Some("Deploying".into()))
    );
}

#[test]
fn image_pull_errors_wait_for_the_progress_deadline_and_a_crash_loop_does_not() {
    // Before the deadline an image pull error is still Deploying (it may yet come up).
    let rev = RevisionFixture::new("r").build();
    let d = deployment(1, 0, 0, &[("Progressing", "True", "ReplicaSetUpdated")]);
    for reason in [
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
    ] {
        let pods = [pod(waiting(reason, "m"), None)];
        let seen = Observed::Deployment {
            deployment: &d,
            pods: &pods,
        };
        let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
        assert_ne!(
            cond(&s, condition::RESOURCES_AVAILABLE).status,
            ConditionStatus::False,
            "{reason}"
        );
        assert_ne!(cond(&s, condition::READY).status, ConditionStatus::False);
    }
    for (reason, message, progressing) in [
        (
            "ImagePullBackOff",
            "Back-off pulling image \"nope:latest\"",
            DEADLINE,
        ),
        (
            "CrashLoopBackOff",
            "back-off 10s restarting failed container",
            ("Progressing", "True", "ReplicaSetUpdated"),
        ),
    ] {
        let rev = RevisionFixture::new("r").build();
        let d = deployment(1, 0, 0, &[progressing]);
        let pods = [pod(waiting(reason, message), None)];
        let seen = Observed::Deployment {
            deployment: &d,
            pods: &pods,
        };
        let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
        let ra = cond(&s, condition::RESOURCES_AVAILABLE);
        assert_eq!(ra.status, ConditionStatus::False);
        assert_eq!(ra.reason.as_deref(), Some(reason));
        assert_eq!(ra.message.as_deref(), Some(message));
        let ready = cond(&s, condition::READY);
        assert_eq!(
            (
                ready.status,
                ready.reason.as_deref(),
                ready.message.as_deref()
            ),
            (ConditionStatus::False, Some(reason), Some(message))
        );
    }
}

#[test]
fn other_waiting_reasons_only_after_the_deadline() {
    let rev = RevisionFixture::new("r").build();
    let pods = [pod(waiting("ContainerCreating", "pulling"), None)];
    let d = deployment(1, 0, 0, &[DEADLINE]);
    let seen = Observed::Deployment {
        deployment: &d,
        pods: &pods,
    };
    let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (ConditionStatus::False, Some("ContainerCreating".into()))
    );
    // Without pods, the Deployment's own reason.
    let seen = Observed::Deployment {
        deployment: &d,
        pods: &[],
    };
    let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (
            ConditionStatus::False,
            Some("ProgressDeadlineExceeded".into())
        )
    );
    assert_eq!(
        summary(&s, condition::READY).1.as_deref(),
        Some("ProgressDeadlineExceeded")
    );
}

#[test]
fn exits_are_container_health_with_knatives_message() {
    let rev = RevisionFixture::new("r").build();
    let d = deployment(1, 0, 0, &[("Progressing", "True", "ReplicaSetUpdated")]);
    let cases = [
        (
            terminated(137, "OOMKilled", ""),
            "ExitCode137",
            "Container failed with: OOMKilled",
        ),
        (
            terminated(1, "Error", "panic: no config"),
            "ExitCode1",
            "Container failed with: panic: no config",
        ),
        (
            terminated(0, "Completed", ""),
            "ExitCode0",
            "Container failed with: container exited with no error",
        ),
    ];
    for (last, reason, message) in cases {
        let pods = [pod(running(), Some(last))];
        let seen = Observed::Deployment {
            deployment: &d,
            pods: &pods,
        };
        let s = revision_status(&rev, seen, &t("2026-01-01T00:00:00Z"));
        let ch = cond(&s, condition::CONTAINER_HEALTHY);
        assert_eq!(
            (ch.status, ch.reason.as_deref(), ch.message.as_deref()),
            (ConditionStatus::False, Some(reason), Some(message))
        );
        let ready = cond(&s, condition::READY);
        assert_eq!(ready.reason.as_deref(), Some(reason));
    }
}

#[test]
fn a_crash_stays_reported_at_zero_and_clears_once_ready() {
    let d = deployment(1, 0, 0, &[("Progressing", "True", "ReplicaSetUpdated")]);
    let pods = [pod(
        waiting("CrashLoopBackOff", "back-off"),
        Some(terminated(2, "Error", "")),
    )];
    let rev = RevisionFixture::new("r").build();
    let s = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &d,
            pods: &pods,
        },
        &t("2026-01-01T00:00:00Z"),
    );
    assert_eq!(
        summary(&s, condition::CONTAINER_HEALTHY),
        (ConditionStatus::False, Some("ExitCode2".into()))
    );
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (ConditionStatus::False, Some("CrashLoopBackOff".into()))
    );
    assert_eq!(
        summary(&s, condition::READY).1.as_deref(),
        Some("ExitCode2"),
        "ContainerHealthy's reason first"
    );
    // Scaled to zero: the crash stays on ContainerHealthy.
    let rev = RevisionFixture::new("r")
        .with(|r| r.status = Some(s.clone()))
        .build();
    let zero = deployment(0, 0, 0, &[PROGRESSING]);
    let s2 = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &zero,
            pods: &[],
        },
        &t("2026-01-01T00:01:00Z"),
    );
    assert_eq!(
        summary(&s2, condition::CONTAINER_HEALTHY),
        (ConditionStatus::False, Some("ExitCode2".into()))
    );
    assert_eq!(
        cond(&s2, condition::CONTAINER_HEALTHY).last_transition_time,
        Some(t("2026-01-01T00:00:00Z")),
        "no transition, the time is kept"
    );
    // A ready replica clears it.
    let rev = RevisionFixture::new("r")
        .with(|r| r.status = Some(s2))
        .build();
    let up = deployment(1, 1, 1, &[PROGRESSING]);
    let s3 = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &up,
            pods: &[],
        },
        &t("2026-01-01T00:02:00Z"),
    );
    assert_eq!(
        summary(&s3, condition::READY),
        (ConditionStatus::True, None)
    );
    assert_eq!(
        cond(&s3, condition::CONTAINER_HEALTHY).last_transition_time,
        Some(t("2026-01-01T00:02:00Z"))
    );
}

#[test]
fn unschedulable_pods_and_replica_failures() {
    let rev = RevisionFixture::new("r").build();
    let d = deployment(1, 0, 0, &[PROGRESSING]);
    let mut p = pod(waiting("ContainerCreating", ""), None);
    p.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(serde_json::json!({
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient cpu."
        }))
        .unwrap(),
    ]);
    let pods = [p];
    let s = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &d,
            pods: &pods,
        },
        &t("2026-01-01T00:00:00Z"),
    );
    let ra = cond(&s, condition::RESOURCES_AVAILABLE);
    assert_eq!(ra.reason.as_deref(), Some("Unschedulable"));
    assert!(ra.message.as_deref().unwrap().contains("Insufficient cpu"));
    let d = deployment(
        1,
        0,
        0,
        &[PROGRESSING, ("ReplicaFailure", "True", "FailedCreate")],
    );
    let s = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &d,
            pods: &[],
        },
        &t("2026-01-01T00:00:00Z"),
    );
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (ConditionStatus::False, Some("FailedCreate".into()))
    );
}

#[test]
fn not_owned_and_invalid() {
    let rev = RevisionFixture::new("r").build();
    let s = revision_status(
        &rev,
        Observed::NotOwned {
            kind: "Deployment",
            name: "r-deployment",
        },
        &t("2026-01-01T00:00:00Z"),
    );
    let ready = cond(&s, condition::READY);
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason.as_deref(), Some("NotOwned"));
    assert_eq!(
        ready.message.as_deref(),
        Some("There is an existing Deployment \"r-deployment\" that we do not own.")
    );
    let s = revision_status(
        &rev,
        Observed::Invalid("spec.containerConcurrency: 5000: must be in [0, 1000]"),
        &t("2026-01-01T00:00:00Z"),
    );
    let ready = cond(&s, condition::READY);
    assert_eq!(ready.reason.as_deref(), Some("InvalidSpec"));
    assert!(
        ready
            .message
            .as_deref()
            .unwrap()
            .contains("spec.containerConcurrency")
    );
}

#[test]
fn the_autoscalers_fields_are_kept() {
    let active = crate::knative::status::active_condition(
        crate::knative::status::Activity::Inactive,
        t("2026-01-01T00:00:00Z"),
    );
    let rev = RevisionFixture::new("r")
        .with(|r| {
            r.status = Some(RevisionStatus {
                actual_replicas: Some(0),
                desired_replicas: Some(0),
                status: crate::knative::duck::Status {
                    conditions: vec![active.clone()],
                    ..Default::default()
                },
                ..RevisionStatus::default()
            })
        })
        .build();
    let d = deployment(0, 0, 0, &[PROGRESSING]);
    let s = revision_status(
        &rev,
        Observed::Deployment {
            deployment: &d,
            pods: &[],
        },
        &t("2026-01-01T00:05:00Z"),
    );
    assert_eq!(s.actual_replicas, Some(0));
    assert_eq!(s.desired_replicas, Some(0));
    let a = cond(&s, condition::ACTIVE);
    assert_eq!(a, &active);
    assert_eq!(a.severity, Some(ConditionSeverity::Info));
}

/// Knative's `PropagateAutoscalerStatus`: a revision the autoscaler marked initialized is
/// available and healthy while its Deployment has not reported progress (a controller
/// restarted during a rollout of the cluster), but a problem the Deployment reports now wins.
#[test]
fn scale_target_initialized_marks_resources_and_health() {
    let initialized = crate::knative::status::initialized_condition(t("2026-01-01T00:00:00Z"));
    let rev = |conds: Vec<Condition>| {
        RevisionFixture::new("r")
            .with(|r| {
                r.status = Some(RevisionStatus {
                    status: crate::knative::duck::Status {
                        conditions: conds,
                        ..Default::default()
                    },
                    ..RevisionStatus::default()
                })
            })
            .build()
    };
    let no_progress = deployment(0, 0, 0, &[]);
    let seen = Observed::Deployment {
        deployment: &no_progress,
        pods: &[],
    };
    let now = t("2026-01-01T00:05:00Z");
    let without = revision_status(&rev(vec![]), seen, &now);
    assert_eq!(
        summary(&without, condition::READY),
        (ConditionStatus::Unknown, Some("Deploying".into()))
    );
    let with = revision_status(&rev(vec![initialized.clone()]), seen, &now);
    assert_eq!(
        summary(&with, condition::READY),
        (ConditionStatus::True, None)
    );
    // Info severity: outside Ready, kept as the autoscaler wrote it.
    assert_eq!(
        cond(&with, condition::SCALE_TARGET_INITIALIZED),
        &initialized
    );

    let gave_up = deployment(1, 0, 0, &[DEADLINE]);
    let seen = Observed::Deployment {
        deployment: &gave_up,
        pods: &[],
    };
    let s = revision_status(&rev(vec![initialized]), seen, &now);
    assert_eq!(
        summary(&s, condition::RESOURCES_AVAILABLE),
        (
            ConditionStatus::False,
            Some("ProgressDeadlineExceeded".into())
        )
    );
}
