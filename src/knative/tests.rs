use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Knative's helloworld Service, with what users add to it: labels, annotations, a chosen
/// revision name, env, ports, containerConcurrency, autoscaling annotations, tagged traffic
/// and `latestRevision`, and a field this version does not know.
const HELLOWORLD: &str = include_str!("testdata/helloworld.yaml");

#[test]
fn helloworld_service_deserialises() {
    let svc: Service = serde_saphyr::from_str(HELLOWORLD).expect("helloworld parses");
    assert_eq!(svc.metadata.name.as_deref(), Some("helloworld-go"));
    assert_eq!(
        svc.metadata.labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "hello"
    );
    assert_eq!(
        svc.metadata.annotations.as_ref().unwrap()["example.com/owner"],
        "team-a"
    );
    let tpl = &svc.spec.configuration.template;
    assert_eq!(tpl.metadata.name.as_deref(), Some("helloworld-go-world"));
    let ann = tpl.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["autoscaling.knative.dev/min-scale"], "1");
    assert_eq!(ann["autoscaling.knative.dev/target"], "10");
    assert_eq!(tpl.spec.container_concurrency, Some(50));
    assert_eq!(tpl.spec.timeout_seconds, Some(300));
    assert_eq!(
        tpl.spec.pod_spec.service_account_name.as_deref(),
        Some("hello")
    );
    let c = &tpl.spec.pod_spec.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("ghcr.io/knative/helloworld-go:latest")
    );
    let port = &c.ports.as_ref().unwrap()[0];
    assert_eq!(port.container_port, 8080);
    assert_eq!(port.name.as_deref(), Some("http1"));
    let env = &c.env.as_ref().unwrap()[0];
    assert_eq!(
        (env.name.as_str(), env.value.as_deref()),
        ("TARGET", Some("World"))
    );
    assert!(c.resources.as_ref().unwrap().limits.is_some());
    assert!(c.readiness_probe.is_some());

    let traffic = &svc.spec.route.traffic;
    assert_eq!(traffic.len(), 2);
    assert_eq!(traffic[0].tag.as_deref(), Some("current"));
    assert_eq!(
        traffic[0].revision_name.as_deref(),
        Some("helloworld-go-world")
    );
    assert_eq!(traffic[0].percent, Some(100));
    assert_eq!(traffic[1].latest_revision, Some(true));
    assert_eq!(traffic[1].percent, Some(0));
}

#[test]
fn helloworld_round_trips_without_the_unknown_field() {
    let svc: Service = serde_saphyr::from_str(HELLOWORLD).unwrap();
    let mut input: serde_json::Value = serde_saphyr::from_str(HELLOWORLD).unwrap();
    // The one field no Knative version defines is dropped; everything else comes back.
    let spec = &mut input["spec"]["template"]["spec"];
    spec.as_object_mut().unwrap().remove("someFutureField");
    // Knative's optional container name and probe port come back as the zero values Knative
    // reads as unset.
    spec["containers"][0]["name"] = "".into();
    spec["containers"][0]["readinessProbe"]["httpGet"]["port"] = 0.into();
    let output = serde_json::to_value(&svc).unwrap();
    assert_eq!(output, input);
}

#[test]
fn revision_status_round_trips_in_knative_shape() {
    let json = serde_json::json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Revision",
        "metadata": {"name": "hello-00001", "namespace": "default"},
        "spec": {
            "containers": [{"image": "img"}],
            "containerConcurrency": 1,
            "responseStartTimeoutSeconds": 10,
            "idleTimeoutSeconds": 20,
            "enableServiceLinks": false
        },
        "status": {
            "observedGeneration": 3,
            "conditions": [
                {"type": "Ready", "status": "True",
                 "lastTransitionTime": "2026-11-25T10:00:00Z"},
                {"type": "Active", "status": "False", "severity": "Info",
                 "reason": "NoTraffic", "message": "The target is not receiving traffic."}
            ],
            "annotations": {"a": "b"},
            "logUrl": "http://logs/hello-00001",
            "containerStatuses": [{"name": "user-container", "imageDigest": "img@sha256:00"}],
            "initContainerStatuses": [{"name": "init", "imageDigest": "init@sha256:11"}],
            "actualReplicas": 2,
            "desiredReplicas": 3
        }
    });
    let rev: Revision = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(rev.spec.pod_spec.enable_service_links, Some(false));
    assert_eq!(rev.spec.response_start_timeout_seconds, Some(10));
    let st = rev.status.as_ref().unwrap();
    assert_eq!(st.status.observed_generation, Some(3));
    let active = st.status.condition(condition::ACTIVE).unwrap();
    assert_eq!(active.status, duck::ConditionStatus::False);
    assert_eq!(active.severity, Some(duck::ConditionSeverity::Info));
    assert_eq!(active.reason.as_deref(), Some("NoTraffic"));
    let ready = st.status.condition(condition::READY).unwrap();
    assert_eq!(ready.status, duck::ConditionStatus::True);
    assert!(matches!(ready.last_transition_time, Some(Time(_))));
    assert_eq!(st.actual_replicas, Some(2));
    assert_eq!(st.desired_replicas, Some(3));
    assert_eq!(st.init_container_statuses.len(), 1);
    let mut expected = json;
    expected["spec"]["containers"][0]["name"] = "".into();
    assert_eq!(serde_json::to_value(&rev).unwrap(), expected);
}

#[test]
fn schemas_leave_knative_optional_fields_optional() {
    let rev = serde_json::to_value(&crds()[2]).unwrap();
    let spec = &rev["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let container = &spec["properties"]["containers"]["items"];
    let required = container["required"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!required.contains(&"name".into()), "{required:?}");
    let http_get = &container["properties"]["readinessProbe"]["properties"]["httpGet"];
    let required = http_get["required"].as_array().cloned().unwrap_or_default();
    assert!(!required.contains(&"port".into()), "{required:?}");
    // Kubernetes' other required fields stay required.
    assert_eq!(spec["required"], serde_json::json!(["containers"]));
}

#[test]
fn service_status_carries_configuration_and_route_fields() {
    let json = serde_json::json!({
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "Unknown", "reason": "Deploying"}],
        "url": "http://hello.default.example.com",
        "address": {"url": "http://hello.default.svc.cluster.local"},
        "latestCreatedRevisionName": "hello-00002",
        "latestReadyRevisionName": "hello-00001",
        "traffic": [{"revisionName": "hello-00001", "latestRevision": true, "percent": 100}]
    });
    let st: ServiceStatus = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(
        st.configuration.latest_created_revision_name.as_deref(),
        Some("hello-00002")
    );
    assert_eq!(st.route.traffic[0].percent, Some(100));
    assert_eq!(
        st.route.address.as_ref().unwrap().url.as_deref(),
        Some("http://hello.default.svc.cluster.local")
    );
    assert_eq!(serde_json::to_value(&st).unwrap(), json);
}

#[test]
fn crds_have_status_subresource_printer_columns_and_full_schemas() {
    let all = crds();
    let names: Vec<_> = all
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "services.serving.knative.dev",
            "configurations.serving.knative.dev",
            "revisions.serving.knative.dev",
            "routes.serving.knative.dev",
            "domainmappings.serving.knative.dev",
            "clusterdomainclaims.networking.internal.knative.dev"
        ]
    );
    // ClusterDomainClaim has no status and no columns (as Knative's).
    for crd in all
        .iter()
        .filter(|c| c.spec.names.kind != "ClusterDomainClaim")
    {
        let v = &crd.spec.versions[0];
        assert!(
            v.subresources.as_ref().unwrap().status.is_some(),
            "{names:?}"
        );
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert!(
            cols.contains(&"Ready") && cols.contains(&"Reason"),
            "{cols:?}"
        );
    }
    let rev = serde_json::to_value(&all[2]).unwrap();
    let schema = &rev["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let spec = &schema["spec"]["properties"];
    for field in [
        "containers",
        "volumes",
        "serviceAccountName",
        "containerConcurrency",
        "timeoutSeconds",
        "responseStartTimeoutSeconds",
        "idleTimeoutSeconds",
    ] {
        assert!(
            spec.get(field).is_some(),
            "revision spec schema lacks {field}"
        );
    }
    let status = &schema["status"]["properties"];
    for field in [
        "observedGeneration",
        "conditions",
        "annotations",
        "logUrl",
        "containerStatuses",
        "initContainerStatuses",
        "actualReplicas",
        "desiredReplicas",
    ] {
        assert!(
            status.get(field).is_some(),
            "revision status schema lacks {field}"
        );
    }
    let cond = &status["conditions"]["items"]["properties"];
    for field in [
        "type",
        "status",
        "severity",
        "lastTransitionTime",
        "reason",
        "message",
    ] {
        assert!(cond.get(field).is_some(), "condition schema lacks {field}");
    }
    let svc = serde_json::to_value(&all[0]).unwrap();
    let svc_schema = &svc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    assert!(svc_schema["spec"]["properties"].get("template").is_some());
    assert!(svc_schema["spec"]["properties"].get("traffic").is_some());
    for field in ["url", "address", "traffic", "latestReadyRevisionName"] {
        assert!(
            svc_schema["status"]["properties"].get(field).is_some(),
            "{field}"
        );
    }
}

#[test]
fn crd_yaml_parses_back_to_the_same_crd() {
    for crd in crds() {
        let text = crd_yaml(&crd);
        assert!(text.starts_with(CRD_HEADER));
        let back: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(back, crd);
    }
}
