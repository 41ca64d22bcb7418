use super::*;
use kube::core::admission::AdmissionReview;

fn settings() -> Settings {
    crate::roles::controller::snapshot(&crate::config::live::LiveConfig::default(), None)
}

fn request(
    kind: &str,
    op: &str,
    object: Value,
    old: Option<Value>,
) -> AdmissionRequest<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": GROUP, "version": "v1", "kind": kind},
            "resource": {"group": GROUP, "version": "v1", "resource": "x"},
            "name": "hello", "namespace": "default", "operation": op,
            "userInfo": {"username": "alice@example.com"},
            "object": object, "oldObject": old, "dryRun": false,
        }
    }))
    .unwrap();
    review.try_into().unwrap()
}

fn service(image: &str, name: Option<&str>) -> Value {
    let mut t = serde_json::json!({"spec": {"containers": [{"image": image}]}});
    if let Some(n) = name {
        t["metadata"] = serde_json::json!({"name": n});
    }
    serde_json::json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {"template": t},
    })
}

fn patched(v: &Verdict, mut obj: Value) -> Value {
    let p: json_patch::Patch = serde_json::from_slice(v.response.patch.as_ref().unwrap()).unwrap();
    json_patch::patch(&mut obj, &p).unwrap();
    obj
}

#[test]
fn defaulting_writes_the_controllers_defaults_traffic_and_creator() {
    let s = settings();
    let obj = service("ghcr.io/x", None);
    let v = admit(
        Hook::Defaulting,
        &request("Service", "CREATE", obj.clone(), None),
        &s,
    );
    assert!(v.response.allowed);
    let out: Service = serde_json::from_value(patched(&v, obj.clone())).unwrap();
    let sent: Service = serde_json::from_value(obj).unwrap();
    assert_eq!(
        out.spec.configuration.template.spec,
        defaulted_spec(&sent.spec.configuration.template.spec, &s.defaults)
    );
    assert_eq!(out.spec.route.traffic[0].latest_revision, Some(true));
    assert_eq!(out.spec.route.traffic[0].percent, Some(100));
    let ann = out.metadata.annotations.unwrap();
    assert_eq!(ann[CREATOR_ANNOTATION], "alice@example.com");
    assert_eq!(ann[LAST_MODIFIER_ANNOTATION], "alice@example.com");
}

/// A Service's Configuration and Route carry the Service's creator and lastModifier (the
/// controller copies them): the webhook neither overwrites them with the controller's
/// identity nor refuses the controller's update that copies a new lastModifier; a
/// Configuration a user made keeps both rules.
#[test]
fn owned_configurations_and_routes_keep_their_services_user_info() {
    let s = settings();
    let owner = serde_json::json!([{"apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "name": "hello", "uid": "u-svc", "controller": true, "blockOwnerDeletion": true}]);
    let cfg = |modifier: &str, image: &str, owned: bool| {
        let mut c = serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Configuration",
            "metadata": {"name": "hello", "namespace": "default", "annotations": {
                CREATOR_ANNOTATION: "bob", LAST_MODIFIER_ANNOTATION: modifier}},
            "spec": {"template": {"spec": {"containers": [{"image": image}]}}},
        });
        if owned {
            c["metadata"]["ownerReferences"] = owner.clone();
        }
        c
    };
    let route = |modifier: &str, owned: bool| {
        let mut r = serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Route",
            "metadata": {"name": "hello", "namespace": "default", "annotations": {
                CREATOR_ANNOTATION: "bob", LAST_MODIFIER_ANNOTATION: modifier}},
            "spec": {"traffic": [{"configurationName": "hello", "percent": 100}]},
        });
        if owned {
            r["metadata"]["ownerReferences"] = owner.clone();
        }
        r
    };
    for (kind, obj) in [
        ("Configuration", cfg("bob", "ghcr.io/x", true)),
        ("Route", route("bob", true)),
    ] {
        let v = admit(
            Hook::Defaulting,
            &request(kind, "CREATE", obj.clone(), None),
            &s,
        );
        assert!(v.response.allowed);
        let ann = patched(&v, obj)["metadata"]["annotations"].clone();
        assert_eq!(ann[CREATOR_ANNOTATION], "bob", "{kind}");
        assert_eq!(ann[LAST_MODIFIER_ANNOTATION], "bob", "{kind}");
    }
    let v = admit(
        Hook::Validation,
        &request(
            "Configuration",
            "UPDATE",
            cfg("carol", "ghcr.io/y", true),
            Some(cfg("bob", "ghcr.io/x", true)),
        ),
        &s,
    );
    assert!(v.response.allowed, "{}", v.response.result.message);
    let v = admit(
        Hook::Validation,
        &request(
            "Route",
            "UPDATE",
            route("carol", true),
            Some(route("bob", true)),
        ),
        &s,
    );
    assert!(v.response.allowed, "{}", v.response.result.message);

    // Made by a user: the defaulting writes who did it, and creator stays immutable.
    let mine = cfg("bob", "ghcr.io/x", false);
    let v = admit(
        Hook::Defaulting,
        &request("Configuration", "CREATE", mine.clone(), None),
        &s,
    );
    assert_eq!(
        patched(&v, mine)["metadata"]["annotations"][CREATOR_ANNOTATION],
        "alice@example.com"
    );
    let mut edited = cfg("bob", "ghcr.io/x", false);
    edited["metadata"]["annotations"][CREATOR_ANNOTATION] = "mallory".into();
    let v = admit(
        Hook::Validation,
        &request(
            "Configuration",
            "UPDATE",
            edited,
            Some(cfg("bob", "ghcr.io/x", false)),
        ),
        &s,
    );
    assert!(!v.response.allowed);
    assert!(
        v.response
            .result
            .message
            .contains("annotation value is immutable"),
        "{}",
        v.response.result.message
    );
}

#[test]
fn validation_refuses_with_knatives_messages() {
    let s = settings();
    let mut bad = service("ghcr.io/x", None);
    bad["spec"]["traffic"] = serde_json::json!([{"latestRevision": true, "percent": 150}]);
    let v = admit(
        Hook::Validation,
        &request("Service", "CREATE", bad, None),
        &s,
    );
    assert!(!v.response.allowed);
    assert_eq!(v.response.result.code, 400);
    assert!(
        v.response.result.message.starts_with("validation failed: "),
        "{}",
        v.response.result.message
    );
    assert!(
        v.response
            .result
            .message
            .contains("spec.traffic[0].percent")
    );

    // A named template changed without a new name.
    let old = service("ghcr.io/x", Some("hello-v1"));
    let new = service("ghcr.io/y", Some("hello-v1"));
    let v = admit(
        Hook::Validation,
        &request("Service", "UPDATE", new, Some(old)),
        &s,
    );
    assert!(!v.response.allowed);
    let m = &v.response.result.message;
    assert!(
        m.contains("Saw the following changes without a name change (-old +new): spec.template.metadata.name"),
        "{m}"
    );
    assert!(m.contains("ghcr.io/y"), "{m}");
    // With a new name it passes.
    let v = admit(
        Hook::Validation,
        &request(
            "Service",
            "UPDATE",
            service("ghcr.io/y", Some("hello-v2")),
            Some(service("ghcr.io/x", Some("hello-v1"))),
        ),
        &s,
    );
    assert!(v.response.allowed, "{}", v.response.result.message);
}

#[test]
fn short_diff_names_the_fields_and_is_bounded() {
    let a = serde_json::json!({"a": {"b": 1}, "c": "x".repeat(500)});
    let b = serde_json::json!({"a": {"b": 2}, "c": "y"});
    let d = short_diff(&a, &b);
    assert!(d.contains("a.b:\n\t-: 1\n\t+: 2"), "{d}");
    assert!(d.len() < 600, "{d}");
}
