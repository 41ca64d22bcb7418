//! The autoscaler's Revision status write: only its own fields, as a read-modify-PUT of
//! `/status` carrying the resourceVersion read (the in-process API server enforces it), and
//! what a new leader reads back.

mod kube_support;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_support::TestApi;
use thaw::knative::Revision;
use thaw::knative::duck::{ConditionSeverity, ConditionStatus};
use thaw::knative::status::{
    Activity, active_condition, apply_autoscaler_status, initialized_condition,
};
use thaw::revision::RevisionKey;

/// The write against the in-process API server: the controller's conditions and fields stay
/// as they were, the autoscaler's are set (conditions sorted by type), and a second writer's
/// update in between is not lost (the PUT carries the resourceVersion read).
#[tokio::test]
async fn writes_only_the_autoscalers_fields_with_a_precondition() {
    let api = TestApi::start().await;
    let client = api.client();
    let revs: Api<Revision> = Api::namespaced(client.clone(), "default");
    revs.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": "hello-00001"},
            "spec": {"containers": [{"image": "img"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    revs.patch_status(
        "hello-00001",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"status": {"observedGeneration": 1, "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ResourcesAvailable", "status": "True"},
            ]}}),
        ),
    )
    .await
    .unwrap();
    let since: Time = serde_json::from_value(serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
    let key = RevisionKey::new("default", "hello-00001");
    let rev = apply_autoscaler_status(
        client.clone(),
        &key,
        Some(0),
        0,
        active_condition(Activity::Inactive, since.clone()),
        Some(initialized_condition(since.clone())),
    )
    .await
    .unwrap();
    let st = rev.status.unwrap();
    assert_eq!(
        (st.desired_replicas, st.actual_replicas),
        (Some(0), Some(0))
    );
    assert_eq!(st.status.observed_generation, Some(1));
    let types: Vec<&str> = st
        .status
        .conditions
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "Active",
            "Ready",
            "ResourcesAvailable",
            "ScaleTargetInitialized"
        ]
    );
    let active = st.status.condition("Active").unwrap();
    assert_eq!(active.reason.as_deref(), Some("NoTraffic"));
    assert_eq!(active.severity, Some(ConditionSeverity::Info));

    // The controller writes after the autoscaler read: the next write keeps its change.
    revs.patch_status(
        "hello-00001",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"observedGeneration": 2}})),
    )
    .await
    .unwrap();
    let rev = apply_autoscaler_status(
        client,
        &key,
        Some(1),
        0,
        active_condition(Activity::Activating, since.clone()),
        Some(initialized_condition(since)),
    )
    .await
    .unwrap();
    let st = rev.status.unwrap();
    assert_eq!(st.status.observed_generation, Some(2));
    assert_eq!(st.desired_replicas, Some(1));
    assert_eq!(
        st.status.condition("Active").unwrap().status,
        ConditionStatus::Unknown
    );
    api.stop().await;
}

/// A write from a stale read is refused by the API server (the precondition), never applied.
#[tokio::test]
async fn a_stale_resource_version_is_refused() {
    let api = TestApi::start().await;
    let revs: Api<Revision> = Api::namespaced(api.client(), "default");
    revs.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": "r"}, "spec": {"containers": [{"image": "img"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let mut stale = revs.get_status("r").await.unwrap();
    revs.patch_status(
        "r",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"observedGeneration": 5}})),
    )
    .await
    .unwrap();
    let since: Time = serde_json::from_value(serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
    thaw::knative::status::set_autoscaler_status(
        &mut stale,
        Some(3),
        3,
        &active_condition(Activity::Active, since),
        None,
    );
    match revs
        .replace_status("r", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409),
        other => panic!("a stale write went through: {other:?}"),
    }
    let st = revs.get_status("r").await.unwrap().status.unwrap();
    assert_eq!(st.desired_replicas, None);
    api.stop().await;
}

#[test]
fn active_conditions_follow_knative() {
    let t: Time = serde_json::from_value(serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
    let c = active_condition(Activity::Active, t.clone());
    assert_eq!(
        (c.status, c.severity, c.reason),
        (ConditionStatus::True, None, None)
    );
    let c = active_condition(Activity::Activating, t.clone());
    assert_eq!(c.status, ConditionStatus::Unknown);
    assert_eq!(c.reason.as_deref(), Some("Queued"));
    let c = active_condition(Activity::TimedOut, t);
    assert_eq!(c.status, ConditionStatus::False);
    assert_eq!(c.reason.as_deref(), Some("TimedOut"));
    assert_eq!(c.severity, Some(ConditionSeverity::Info));
}

#[test]
fn conditions_are_a_map_keyed_by_type_in_every_crd() {
    for crd in thaw::knative::crds() {
        let v = serde_json::to_value(&crd).unwrap();
        let status = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        // ClusterDomainClaim has no status (as Knative's).
        if crd.spec.names.kind == "ClusterDomainClaim" {
            assert!(status.is_null());
            continue;
        }
        let cond = &status["properties"]["conditions"];
        assert_eq!(
            cond["x-kubernetes-list-type"], "map",
            "{:?}",
            crd.metadata.name
        );
        assert_eq!(
            cond["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }
}

/// What a new autoscaler leader reads back: `ScaleTargetInitialized` once written; a Revision
/// from before the condition existed counts as initialized when it is Ready; the condition
/// written False (never, by thaw) or a revision not Ready does not.
#[test]
fn initialization_is_read_back_with_the_upgrade_rule() {
    use thaw::knative::status::AutoscalerStatus;
    let t: Time = serde_json::from_value(serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
    let rev = |conditions: serde_json::Value| -> Revision {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": "r", "namespace": "default"},
            "spec": {"containers": [{"image": "app"}]},
            "status": {"desiredReplicas": 0, "actualReplicas": 0, "conditions": conditions},
        }))
        .unwrap()
    };
    let ready = serde_json::json!({"type": "Ready", "status": "True"});
    let active = serde_json::to_value(active_condition(Activity::Inactive, t.clone())).unwrap();
    let init = serde_json::to_value(initialized_condition(t.clone())).unwrap();

    let upgraded = AutoscalerStatus::of(&rev(serde_json::json!([ready, active])));
    assert!(upgraded.initialized);
    assert_eq!(
        upgraded.initialized_written, None,
        "still to be written once"
    );
    assert_eq!(upgraded.desired, Some(0));
    assert_eq!(
        upgraded.active,
        Some((
            ConditionStatus::False,
            Some("NoTraffic".into()),
            Some(t.clone())
        ))
    );

    let written = AutoscalerStatus::of(&rev(serde_json::json!([active, init])));
    assert!(written.initialized);
    assert_eq!(written.initialized_written, Some(t));

    let deploying =
        serde_json::json!({"type": "Ready", "status": "Unknown", "reason": "Deploying"});
    assert!(!AutoscalerStatus::of(&rev(serde_json::json!([deploying]))).initialized);
    let said_no = serde_json::json!({"type": "ScaleTargetInitialized", "status": "False"});
    assert!(!AutoscalerStatus::of(&rev(serde_json::json!([ready, said_no]))).initialized);
}
