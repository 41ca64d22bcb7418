//! Helpers the whole-stack cases on the plane share (tests/real_stack/): the Service they apply,
//! polling with a deadline, a revision's scale, the roles' pods.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use super::Plane;

/// Where thaw's roles run.
pub const SYSTEM: &str = "thaw-system";

/// Knative's helloworld-go as a Service `name` with `autoscaling.knative.dev/` annotations.
pub fn service(name: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: String = annotations
        .iter()
        .map(|(k, v)| format!("        autoscaling.knative.dev/{k}: \"{v}\"\n"))
        .collect();
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        format!("    metadata:\n      annotations:\n{annotations}")
    };
    format!(
        r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: {name}
spec:
  template:
{annotations}    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "{name}"
"#
    )
}

/// Polls `f` every 250 ms until it gives something; panics naming `what` after `within`.
pub async fn until<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Revision `{svc}-00001`'s Deployment's `spec.replicas`.
pub async fn scale_of(plane: &Plane, ns: &str, svc: &str) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(plane.admin.clone(), ns);
    api.get_opt(&format!("{svc}-00001-deployment"))
        .await
        .ok()??
        .spec?
        .replicas
}

/// The names of `role`'s pods in thaw-system, terminating ones included.
pub async fn role_pods(plane: &Plane, role: &str) -> Vec<String> {
    role_pod_objects(plane, role)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect()
}

pub async fn role_pod_objects(plane: &Plane, role: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), SYSTEM);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={role}"));
    api.list(&lp).await.map(|l| l.items).unwrap_or_default()
}
