//! Why a revision's pod cannot serve, read from its container statuses, and which sidecar it
//! runs, read from its spec. Pure; the pod watch calls both on every pod event.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::stats::PodStatsWire;

/// The sidecar's container name, Knative's and thaw's alike.
pub const SIDECAR_CONTAINER: &str = "queue-proxy";
/// The port Knative's queue-proxy declares for its admin server (8022); thaw's sidecar
/// declares none of that name.
pub const QUEUE_PROXY_ADMIN_PORT_NAME: &str = "http-queueadm";
/// Knative's queue-proxy serves its autoscaler stats on this port, whatever it declares
/// (`networking.AutoscalingQueueMetricsPort`, fixed in its code).
pub const QUEUE_PROXY_METRICS_PORT: u16 = 9090;

/// Which sidecar `pod` runs, and the port its stats are pulled at when that is not the one the
/// private slices name (`Some` for Knative's queue-proxy, [`QUEUE_PROXY_METRICS_PORT`]).
///
/// Knative's queue-proxy is told from thaw's sidecar by the pod's own spec, not by its
/// Deployment: both containers are named [`SIDECAR_CONTAINER`] (thaw kept Knative's name), but
/// only Knative's revision reconciler declares [`QUEUE_PROXY_ADMIN_PORT_NAME`] on it. The pod
/// is what runs, so a pod of an older ReplicaSet still carrying queue-proxy while its revision
/// rolls to thaw's sidecar is read right, whatever the Deployment's template says by then.
pub fn stats_wire(pod: &Pod) -> (PodStatsWire, Option<u16>) {
    let knative = pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| {
            c.name == SIDECAR_CONTAINER
                && c.ports
                    .iter()
                    .flatten()
                    .any(|p| p.name.as_deref() == Some(QUEUE_PROXY_ADMIN_PORT_NAME))
        })
    });
    if knative {
        (PodStatsWire::QueueProxy, Some(QUEUE_PROXY_METRICS_PORT))
    } else {
        (PodStatsWire::Thaw, None)
    }
}

/// Waiting reasons that fail a revision at once: the container ran and keeps crashing.
pub const FAILING_WAITING_REASONS: &[&str] = &["CrashLoopBackOff"];

/// Waiting reasons that count against the progress deadline, as in Knative: an image still
/// being pulled (or a registry briefly away, a Secret created a moment later) may yet come
/// up, so requests stay held up to the activation timeout (the progress deadline plus a
/// buffer) and the Revision turns `ResourcesAvailable=False` only once the Deployment's
/// deadline has passed.
pub const DEADLINE_WAITING_REASONS: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "InvalidImageName",
];

/// A pod that cannot serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    /// A Kubernetes reason word (`CrashLoopBackOff`, `OOMKilled`, `ExitCode1`): shown to
    /// clients, so it names no pod, image or message.
    pub reason: String,
    /// For the logs: container, message, exit code.
    pub detail: String,
}

/// The first failing container of `pod` (init containers first), if any:
/// - a container waiting for one of [`FAILING_WAITING_REASONS`];
/// - a container that has restarted at least `restart_limit` times and whose last run ended:
///   reason its termination reason (`OOMKilled`, `Error`, ...) or `ExitCode<N>`.
pub fn pod_failure(pod: &Pod, restart_limit: i32) -> Option<PodFailure> {
    let status = pod.status.as_ref()?;
    let all = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    all.filter_map(|c| container_failure(c, restart_limit))
        .next()
}

fn container_failure(c: &ContainerStatus, restart_limit: i32) -> Option<PodFailure> {
    if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref())
        && let Some(reason) = w.reason.as_deref()
        && FAILING_WAITING_REASONS.contains(&reason)
    {
        return Some(PodFailure {
            reason: reason.to_string(),
            detail: format!(
                "container {} waiting: {reason}: {}",
                c.name,
                w.message.as_deref().unwrap_or("")
            ),
        });
    }
    if c.restart_count >= restart_limit
        && let Some(t) = c.last_state.as_ref().and_then(|s| s.terminated.as_ref())
    {
        let reason = match t.reason.as_deref() {
            Some(r) if r != "Error" && r != "Completed" => r.to_string(),
            _ => format!("ExitCode{}", t.exit_code),
        };
        return Some(PodFailure {
            detail: format!(
                "container {} restarted {} times, last exit {} ({}): {}",
                c.name,
                c.restart_count,
                t.exit_code,
                t.reason.as_deref().unwrap_or("-"),
                t.message.as_deref().unwrap_or("")
            ),
            reason,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"containerStatuses": statuses}
        }))
        .unwrap()
    }

    fn status(
        state: serde_json::Value,
        restarts: i32,
        last: serde_json::Value,
    ) -> serde_json::Value {
        serde_json::json!({
            "name": "user-container", "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts, "state": state, "lastState": last
        })
    }

    fn with_sidecar(ports: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "user-container", "ports": [{"name": "user-port", "containerPort": 8080}]},
                {"name": "queue-proxy", "ports": ports}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn knatives_queue_proxy_is_told_from_thaws_sidecar_by_its_ports() {
        // As Knative's revision reconciler (v1.15) declares them.
        let knative = with_sidecar(serde_json::json!([
            {"name": "queue-port", "containerPort": 8012},
            {"name": "http-queueadm", "containerPort": 8022},
            {"name": "http-autometric", "containerPort": 9090},
            {"name": "http-usermetric", "containerPort": 9091}
        ]));
        assert_eq!(stats_wire(&knative), (PodStatsWire::QueueProxy, Some(9090)));
        // As thaw's controller declares them (controller/revision/queue.rs).
        let thaw = with_sidecar(serde_json::json!([
            {"name": "http1", "containerPort": 8012},
            {"name": "http-autometric", "containerPort": 9091}
        ]));
        assert_eq!(stats_wire(&thaw), (PodStatsWire::Thaw, None));
        // The port on another container is not the sidecar's.
        let elsewhere: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "user-container", "ports": [{"name": "http-queueadm", "containerPort": 8022}]}
            ]}
        }))
        .unwrap();
        assert_eq!(stats_wire(&elsewhere), (PodStatsWire::Thaw, None));
    }

    #[test]
    fn a_crash_loop_fails_at_once() {
        let p = pod(serde_json::json!([status(
            serde_json::json!({"waiting": {"reason": "CrashLoopBackOff", "message": "secret detail"}}),
            0,
            serde_json::json!({})
        )]));
        let f = pod_failure(&p, 3).unwrap();
        assert_eq!(f.reason, "CrashLoopBackOff");
        assert!(f.detail.contains("secret detail"));
        assert!(!f.reason.contains("secret"));
    }

    #[test]
    fn image_pull_and_config_errors_count_against_the_progress_deadline() {
        // Held requests wait (up to the activation timeout) instead of failing at once.
        for reason in DEADLINE_WAITING_REASONS {
            let p = pod(serde_json::json!([status(
                serde_json::json!({"waiting": {"reason": reason, "message": "m"}}),
                0,
                serde_json::json!({})
            )]));
            assert_eq!(pod_failure(&p, 3), None, "{reason}");
        }
    }

    #[test]
    fn starting_pods_do_not_fail() {
        let p = pod(serde_json::json!([status(
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}}),
            0,
            serde_json::json!({})
        )]));
        assert_eq!(pod_failure(&p, 3), None);
        let p = pod(serde_json::json!([status(
            serde_json::json!({"running": {}}),
            0,
            serde_json::json!({})
        )]));
        assert_eq!(pod_failure(&p, 3), None);
    }

    #[test]
    fn repeated_terminations_fail_with_their_reason() {
        let last = |reason: &str, code: i32| serde_json::json!({"terminated": {"reason": reason, "exitCode": code}});
        let running = serde_json::json!({"running": {}});
        let p = pod(serde_json::json!([status(
            running.clone(),
            2,
            last("OOMKilled", 137)
        )]));
        assert_eq!(pod_failure(&p, 3), None, "under the restart limit");
        let p = pod(serde_json::json!([status(
            running.clone(),
            3,
            last("OOMKilled", 137)
        )]));
        assert_eq!(pod_failure(&p, 3).unwrap().reason, "OOMKilled");
        let p = pod(serde_json::json!([status(running, 5, last("Error", 1))]));
        assert_eq!(pod_failure(&p, 3).unwrap().reason, "ExitCode1");
    }
}
