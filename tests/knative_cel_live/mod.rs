//! The CRDs' CEL rules on a real API server: each invalid object is created with a server-side
//! dry run (nothing is stored) and must be refused with the rule's message; the valid one must
//! pass. Shared by `tests/knative_cel.rs` (any cluster, ignored by default) and
//! `tests/real_plane.rs` (the control plane built from Kubernetes' modules).

use serde_json::{Value, json};
use thaw::knative::cel;

/// Every rule's refusal, in `namespace`, through `client` (which may create Services and
/// Routes there). Panics naming the object and the server's answer.
pub async fn refuses_what_the_rules_forbid(client: &kube::Client, namespace: &str) {
    let ok = service(
        json!([{"latestRevision": true, "percent": 100, "tag": "current"}]),
        json!({"containers": container(), "containerConcurrency": 10, "timeoutSeconds": 0}),
    );
    dry_run_create(client, namespace, ok)
        .await
        .expect("a valid Service");
    let cases = [
        (
            service(
                json!([{"latestRevision": true, "percent": 150}]),
                json!({"containers": container()}),
            ),
            cel::PERCENT.1,
        ),
        (
            service(
                json!([{"latestRevision": true, "percent": 90}]),
                json!({"containers": container()}),
            ),
            cel::SERVICE_SUM.1,
        ),
        (
            service(
                json!([{"configurationName": "x", "percent": 100}]),
                json!({"containers": container()}),
            ),
            cel::SERVICE_NO_CONFIGURATION.1,
        ),
        (
            service(
                json!([{"revisionName": "r", "latestRevision": true, "percent": 100}]),
                json!({"containers": container()}),
            ),
            cel::LATEST_REVISION.1,
        ),
        (
            service(
                json!([{"latestRevision": true, "percent": 100, "tag": "Bad_Tag"}]),
                json!({"containers": container()}),
            ),
            cel::TAG.1,
        ),
        (
            service(
                json!([]),
                json!({"containers": container(), "containerConcurrency": 1001}),
            ),
            cel::CONTAINER_CONCURRENCY.1,
        ),
        (
            service(
                json!([]),
                json!({"containers": container(), "timeoutSeconds": -1}),
            ),
            cel::TIMEOUT_SECONDS.1,
        ),
        (
            json!({
                "apiVersion": "serving.knative.dev/v1", "kind": "Route",
                "metadata": {"name": "cel-test"},
                "spec": {"traffic": [{"revisionName": "a", "configurationName": "b", "percent": 100}]}
            }),
            cel::ROUTE_ONE_OF.1,
        ),
    ];
    for (obj, message) in cases {
        let err = dry_run_create(client, namespace, obj.clone())
            .await
            .expect_err(&format!("refused: {obj}"));
        assert!(err.contains(message), "{obj}: {err}");
    }
}

async fn dry_run_create(client: &kube::Client, namespace: &str, obj: Value) -> Result<(), String> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let kind = obj["kind"].as_str().unwrap();
    let gvk = GroupVersionKind::gvk("serving.knative.dev", "v1", kind);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk(&gvk));
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    api.create(&pp, &obj)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn service(traffic: Value, template_spec: Value) -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "cel-test"},
        "spec": {"template": {"spec": template_spec}, "traffic": traffic}
    })
}

fn container() -> Value {
    json!([{"image": "ghcr.io/knative/helloworld-go"}])
}
