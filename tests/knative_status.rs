//! The autoscaler's Revision status write, checked on the wire: a server-side apply of only
//! its own fields to `/status`, with its field manager, forced. (The in-process API server
//! used by the other kube tests does not implement server-side apply on subresources, so the
//! request is checked against a recording HTTP server instead.)

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use thaw::knative::duck::{ConditionSeverity, ConditionStatus};
use thaw::knative::status::{Activity, active_condition, apply_autoscaler_status};
use thaw::revision::RevisionKey;

#[derive(Debug, Default, Clone)]
struct Seen {
    method: String,
    uri: String,
    content_type: String,
    body: serde_json::Value,
}

#[tokio::test]
async fn applies_only_the_autoscalers_fields_to_status() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
            let s = s.clone();
            async move {
                let method = req.method().to_string();
                let uri = req.uri().to_string();
                let content_type = req
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let bytes = req.into_body().collect().await.unwrap().to_bytes();
                let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let mut answer = body.clone();
                answer["spec"] = serde_json::json!({"containers": [{"image": "img"}]});
                answer["metadata"]["namespace"] = "default".into();
                *s.lock().unwrap() = Seen {
                    method,
                    uri,
                    content_type,
                    body,
                };
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                    answer.to_string(),
                ))))
            }
        });
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(sock), svc)
            .await;
    });

    let client = {
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_namespace = "default".into();
        kube::Client::try_from(config).unwrap()
    };
    let since: Time = serde_json::from_value(serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
    let rev = apply_autoscaler_status(
        client,
        &RevisionKey::new("default", "hello-00001"),
        Some(0),
        0,
        active_condition(Activity::Inactive, since),
        None,
    )
    .await
    .unwrap();
    assert_eq!(rev.status.unwrap().desired_replicas, Some(0));

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.method, "PATCH");
    assert!(
        seen.uri.starts_with(
            "/apis/serving.knative.dev/v1/namespaces/default/revisions/hello-00001/status?"
        ),
        "{}",
        seen.uri
    );
    assert!(
        seen.uri.contains("fieldManager=autoscaler.thaw.dev"),
        "{}",
        seen.uri
    );
    assert!(seen.uri.contains("force=true"), "{}", seen.uri);
    assert_eq!(seen.content_type, "application/apply-patch+yaml");
    // Only the autoscaler's fields: no spec, no other condition, no observedGeneration.
    assert_eq!(
        seen.body,
        serde_json::json!({
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Revision",
            "metadata": {"name": "hello-00001"},
            "status": {
                "actualReplicas": 0,
                "desiredReplicas": 0,
                "conditions": [{
                    "type": "Active",
                    "status": "False",
                    "severity": "Info",
                    "lastTransitionTime": "2026-11-25T10:00:00Z",
                    "reason": "NoTraffic",
                    "message": "The target is not receiving traffic."
                }]
            }
        })
    );
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
        let cond = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            ["conditions"];
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
    use thaw::knative::Revision;
    use thaw::knative::status::{AutoscalerStatus, initialized_condition};
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
