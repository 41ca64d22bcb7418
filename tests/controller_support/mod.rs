//! Helpers shared by the controller tests (`tests/controller_*.rs`): polling the API server
//! with a deadline, and playing kubelet and the Deployment controller for a revision.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};

/// Generous: the suite shares 2 cores with other test binaries.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `get` every 20 ms until `ok` holds of its result, or fails the test after
/// [`DEADLINE`] naming `what` and showing the last value.
pub async fn wait_for<T: std::fmt::Debug, F, Fut>(
    what: &str,
    mut get: F,
    ok: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let v = get().await;
        if ok(&v) {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; last: {v:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Deployment's status with one ready, available replica, as the Deployment controller
/// writes it once kubelet reports the pod ready.
pub fn one_ready_replica() -> serde_json::Value {
    serde_json::json!({
        "replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
        ]
    })
}

/// Plays kubelet and the Deployment controller: waits for `revision`'s Deployment (the
/// Revision reconciler's) in `deps`' namespace and gives it one available replica.
pub async fn mark_deployment_ready(deps: &Api<Deployment>, revision: &str) {
    let name = thaw::knative::names::child_name(revision, "-deployment");
    wait_for(
        "the revision's Deployment",
        || async { deps.get_opt(&name).await.ok().flatten() },
        Option::is_some,
    )
    .await;
    deps.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": one_ready_replica() })),
    )
    .await
    .expect("deployment status");
}
