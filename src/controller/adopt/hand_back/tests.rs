use std::collections::BTreeMap;

use super::*;

#[test]
fn each_child_goes_back_along_knatives_chain() {
    let reown = |c, p| match rule(c, p) {
        Some(Handling::Reown { parent, above }) => Some((parent.kind, above.len())),
        _ => None,
    };
    // Service ← ServerlessService ← PodAutoscaler ← Revision.
    assert_eq!(reown("Service", "Revision"), Some(("ServerlessService", 1)));
    assert_eq!(
        reown("Endpoints", "Revision"),
        Some(("ServerlessService", 1))
    );
    assert_eq!(
        reown("HorizontalPodAutoscaler", "Revision"),
        Some(("PodAutoscaler", 0))
    );
    for p in ["Route", "DomainMapping"] {
        assert_eq!(reown("VirtualService", p), Some(("Ingress", 0)));
        assert_eq!(reown("HTTPRoute", p), Some(("Ingress", 0)));
        assert_eq!(reown("Certificate", p), Some(("Certificate", 0)));
    }
    // What Knative's reconcilers take as they are: the same parent controls it in both.
    assert_eq!(rule("Deployment", "Revision"), Some(Handling::Keep));
    assert_eq!(rule("Service", "Route"), Some(Handling::Keep));
    // Nothing Knative writes.
    assert_eq!(rule("Deployment", "Route"), None);
    assert_eq!(rule("VirtualService", "Revision"), None);
    assert_eq!(rule("Service", "DomainMapping"), None);
}

#[test]
fn the_knative_parent_is_named_as_knative_names_it() {
    let n = knative_parent_name;
    assert_eq!(
        n("Service", "hello-00001", "Revision", "hello-00001").unwrap(),
        "hello-00001"
    );
    assert_eq!(
        n("Service", "hello-00001-private", "Revision", "hello-00001").unwrap(),
        "hello-00001"
    );
    assert_eq!(
        n("Endpoints", "hello-00001", "Revision", "hello-00001").unwrap(),
        "hello-00001"
    );
    assert_eq!(
        n(
            "HorizontalPodAutoscaler",
            "hello-00001",
            "Revision",
            "hello-00001"
        )
        .unwrap(),
        "hello-00001"
    );
    // A Service of another name is not the ServerlessService's: Knative would not write it.
    assert!(n("Service", "other", "Revision", "hello-00001").is_err());
    assert!(
        n(
            "Endpoints",
            "hello-00001-private",
            "Revision",
            "hello-00001"
        )
        .is_err()
    );
    // The KIngress is `kmeta.ChildName(route, "")`: the route's name, or hashed when long.
    assert_eq!(
        n("VirtualService", "hello-ingress", "Route", "hello").unwrap(),
        "hello"
    );
    let long = "r".repeat(70);
    assert_eq!(
        n("HTTPRoute", "x.example.com", "Route", &long).unwrap(),
        child_name(&long, "")
    );
    // cert-manager's Certificate is named after Knative's.
    assert_eq!(
        n("Certificate", "route-u-1", "Route", "hello").unwrap(),
        "route-u-1"
    );
}

fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)], finalizers: &[&str]) -> ObjectMeta {
    let map = |kv: &[(&str, &str)]| {
        Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    ObjectMeta {
        uid: Some("u".into()),
        labels: map(labels),
        annotations: map(annotations),
        finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
        ..ObjectMeta::default()
    }
}

#[test]
fn only_thaws_marks_are_stripped_each_guarded_by_its_value() {
    let m = meta(
        &[
            ("controller.thaw.dev/template-held", "true"),
            ("serving.knative.dev/revision", "hello-00001"),
        ],
        &[
            ("controller.thaw.dev/applied-hash", "h1"),
            ("serving.knative.dev/creator", "alice"),
        ],
        &[
            "domainmappings.serving.knative.dev",
            "cleanup.controller.thaw.dev",
        ],
    );
    let ops = strip_ops(&m);
    assert_eq!(
        ops,
        vec![
            json!({"op": "test", "path": "/metadata/labels/controller.thaw.dev~1template-held", "value": "true"}),
            json!({"op": "remove", "path": "/metadata/labels/controller.thaw.dev~1template-held"}),
            json!({"op": "test", "path": "/metadata/annotations/controller.thaw.dev~1applied-hash", "value": "h1"}),
            json!({"op": "remove", "path": "/metadata/annotations/controller.thaw.dev~1applied-hash"}),
            json!({"op": "test", "path": "/metadata/finalizers",
                "value": ["domainmappings.serving.knative.dev", "cleanup.controller.thaw.dev"]}),
            json!({"op": "replace", "path": "/metadata/finalizers",
                "value": ["domainmappings.serving.knative.dev"]}),
        ]
    );
    // Knative's own marks, and a finalizer Knative holds under the same name thaw uses, stay.
    let knatives = meta(
        &[("serving.knative.dev/revision", "r")],
        &[],
        &[
            "domainmappings.serving.knative.dev",
            "example.com/thaw.dev-like",
        ],
    );
    assert!(strip_ops(&knatives).is_empty());
    assert!(is_thaws("thaw.dev/x"));
    assert!(is_thaws("a.thaw.dev"));
    assert!(!is_thaws("notthaw.dev"));
}

#[test]
fn the_reown_patch_puts_knatives_controller_in_place_of_thaws() {
    let found = ObjectMeta {
        uid: Some("svc".into()),
        owner_references: Some(vec![OwnerReference {
            api_version: "serving.knative.dev/v1".into(),
            kind: "Revision".into(),
            name: "hello-00001".into(),
            uid: "rev".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    };
    let owner = controller_ref(SERVERLESS_SERVICE, "hello-00001", "sks");
    let ops = super::super::reown_patch(&found, &[owner], None);
    assert_eq!(
        ops[0],
        json!({"op": "test", "path": "/metadata/uid", "value": "svc"})
    );
    assert_eq!(ops[1]["value"][0]["uid"], "rev");
    assert_eq!(
        ops[2]["value"],
        json!([{"apiVersion": "networking.internal.knative.dev/v1alpha1",
            "kind": "ServerlessService", "name": "hello-00001", "uid": "sks",
            "controller": true, "blockOwnerDeletion": true}])
    );
}

#[test]
fn only_serving_parents_are_thaws_parents() {
    let by = |api_version: &str, kind: &str| ObjectMeta {
        owner_references: Some(vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "n".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        ..ObjectMeta::default()
    };
    assert!(serving_parent(&by("serving.knative.dev/v1", "Revision")).is_some());
    assert!(serving_parent(&by("serving.knative.dev/v1beta1", "DomainMapping")).is_some());
    // Knative's own children and a look-alike group are not thaw's.
    assert!(
        serving_parent(&by(
            "networking.internal.knative.dev/v1alpha1",
            "ServerlessService"
        ))
        .is_none()
    );
    assert!(serving_parent(&by("example.com/v1", "Revision")).is_none());
    assert!(serving_parent(&ObjectMeta::default()).is_none());
}

fn line(outcome: Outcome, dry_run: bool) -> Line {
    Line {
        kind: "Service".into(),
        namespace: "default".into(),
        name: "hello-00001".into(),
        outcome,
        dry_run,
    }
}

#[test]
fn lines_and_the_verdict() {
    let chain = "Service hello-00001 ← ServerlessService hello-00001 ← Revision hello-00001";
    assert_eq!(
        line(Outcome::Reowned(chain.into()), false).to_string(),
        format!("re-owned Service default/hello-00001: {chain}")
    );
    assert_eq!(
        line(Outcome::Reowned(chain.into()), true).to_string(),
        format!("would be re-owned Service default/hello-00001: {chain}")
    );
    // Waiting is not an action: a dry run says it as it is.
    assert_eq!(
        line(Outcome::Waiting("w".into()), true).to_string(),
        "waiting Service default/hello-00001: w"
    );
    let report = |outcomes: Vec<Outcome>| Report {
        lines: outcomes.into_iter().map(|o| line(o, false)).collect(),
    };
    assert_eq!(report(vec![]).verdict(), Verdict::HandedBack);
    assert_eq!(
        report(vec![
            Outcome::Reowned("c".into()),
            Outcome::Left("l".into())
        ])
        .verdict(),
        Verdict::HandedBack
    );
    assert_eq!(
        report(vec![
            Outcome::Reowned("c".into()),
            Outcome::Waiting("w".into())
        ])
        .verdict(),
        Verdict::Waiting
    );
    assert_eq!(
        report(vec![
            Outcome::Waiting("w".into()),
            Outcome::Refused("r".into())
        ])
        .verdict(),
        Verdict::Incomplete
    );
    assert_eq!(
        report(vec![Outcome::Failed("f".into())]).verdict(),
        Verdict::Incomplete
    );
}
