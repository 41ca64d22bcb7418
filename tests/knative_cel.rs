//! The CEL `x-kubernetes-validations` of the generated CRDs (`thaw::knative::cel`): present
//! where each rule belongs, with the expected rule and message, in the generated CRDs and in
//! deploy/crds/. The in-process API server enforces no CEL, so the rules' effect is tested
//! against a real cluster: `tests/real_plane.rs` runs it on the control plane built from
//! Kubernetes' modules; here it is `#[ignore = "needs a cluster"]` (run with
//! `cargo test --test knative_cel -- --ignored` and a KUBECONFIG whose user may create CRDs).

mod knative_cel_live;
mod kube_support;

use serde_json::{Value, json};
use thaw::knative::cel::{self, Rule};

/// The generated CRD of `kind`, as JSON.
fn crd(kind: &str) -> Value {
    let c = thaw::knative::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap();
    serde_json::to_value(c).unwrap()
}

/// The schema at `path` (property names from `spec`) of `kind`'s CRD; `[]` steps into items.
fn schema<'a>(crd: &'a Value, path: &[&str]) -> &'a Value {
    let mut s = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for p in path {
        s = if *p == "[]" {
            &s["items"]
        } else {
            &s["properties"][*p]
        };
        assert!(!s.is_null(), "{path:?}: no schema at {p}");
    }
    s
}

fn rules(rules: &[Rule]) -> Value {
    Value::Array(
        rules
            .iter()
            .map(|(rule, message)| json!({"rule": rule, "message": message}))
            .collect(),
    )
}

fn validations(s: &Value) -> &Value {
    &s["x-kubernetes-validations"]
}

#[test]
fn traffic_rules_are_on_routes_and_services() {
    for (kind, sum, one_of) in [
        ("Route", cel::ROUTE_SUM, cel::ROUTE_ONE_OF),
        ("Service", cel::SERVICE_SUM, cel::SERVICE_NO_CONFIGURATION),
    ] {
        let c = crd(kind);
        let traffic = schema(&c, &["spec", "traffic"]);
        assert_eq!(validations(traffic), &rules(&[sum]), "{kind}");
        assert_eq!(traffic["maxItems"], json!(cel::MAX_TRAFFIC_TARGETS));
        let item = schema(&c, &["spec", "traffic", "[]"]);
        assert_eq!(
            validations(item),
            &rules(&[one_of, cel::LATEST_REVISION]),
            "{kind}"
        );
        let percent = schema(&c, &["spec", "traffic", "[]", "percent"]);
        assert_eq!(validations(percent), &rules(&[cel::PERCENT]));
        let tag = schema(&c, &["spec", "traffic", "[]", "tag"]);
        assert_eq!(validations(tag), &rules(&[cel::TAG]));
        assert_eq!(tag["maxLength"], json!(63));
        // The status's traffic (same Rust type) carries no spec rule.
        let status = schema(&c, &["status", "traffic", "[]"]);
        assert!(validations(status).is_null(), "{kind}: {status}");
    }
    assert_eq!(cel::PERCENT.0, "self >= 0 && self <= 100");
    assert_eq!(
        cel::ROUTE_SUM.0,
        "self.map(t, has(t.percent) ? t.percent : 0).sum() == 100"
    );
    assert_eq!(
        cel::ROUTE_ONE_OF.0,
        "has(self.revisionName) != has(self.configurationName)"
    );
    assert_eq!(cel::TAG.0, "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')");
}

#[test]
fn revision_spec_rules_are_on_every_template_and_the_revision() {
    for (kind, path) in [
        ("Service", &["spec", "template", "spec"][..]),
        ("Configuration", &["spec", "template", "spec"][..]),
        ("Revision", &["spec"][..]),
    ] {
        let c = crd(kind);
        let spec = schema(&c, path);
        for (field, rule) in [
            ("containerConcurrency", cel::CONTAINER_CONCURRENCY),
            ("timeoutSeconds", cel::TIMEOUT_SECONDS),
            (
                "responseStartTimeoutSeconds",
                cel::RESPONSE_START_TIMEOUT_SECONDS,
            ),
            ("idleTimeoutSeconds", cel::IDLE_TIMEOUT_SECONDS),
        ] {
            assert_eq!(
                validations(&spec["properties"][field]),
                &rules(&[rule]),
                "{kind} {field}"
            );
        }
    }
    assert_eq!(cel::CONTAINER_CONCURRENCY.0, "self >= 0 && self <= 1000");
    assert_eq!(cel::TIMEOUT_SECONDS.0, "self >= 0");
}

/// Each message names the field it is about, and each rule's parentheses and quotes balance.
#[test]
fn messages_name_their_field_and_rules_are_balanced() {
    for (rule, message) in [
        cel::PERCENT,
        cel::ROUTE_SUM,
        cel::SERVICE_SUM,
        cel::ROUTE_ONE_OF,
        cel::SERVICE_NO_CONFIGURATION,
        cel::LATEST_REVISION,
        cel::TAG,
        cel::CONTAINER_CONCURRENCY,
        cel::TIMEOUT_SECONDS,
        cel::RESPONSE_START_TIMEOUT_SECONDS,
        cel::IDLE_TIMEOUT_SECONDS,
    ] {
        assert!(
            message.starts_with("spec.traffic")
                || message.starts_with("containerConcurrency")
                || message.contains("TimeoutSeconds")
                || message.starts_with("timeoutSeconds"),
            "{message}"
        );
        let mut depth = 0i32;
        let mut quoted = false;
        for ch in rule.chars() {
            match ch {
                '\'' => quoted = !quoted,
                '(' if !quoted => depth += 1,
                ')' if !quoted => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0, "{rule}");
        }
        assert!(depth == 0 && !quoted, "{rule}");
    }
}

/// The CRDs carrying rules and bounds are still served by the API double, which accepts the
/// helloworld Service (its schema check knows the new keywords or ignores them).
#[tokio::test]
async fn the_api_double_serves_the_crds_with_rules() {
    use kube::api::{Api, PostParams};
    let api = kube_support::TestApi::start().await;
    let services: Api<thaw::knative::Service> = Api::namespaced(api.client(), "default");
    let svc: thaw::knative::Service = serde_json::from_value(json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "template": {"spec": {"containerConcurrency": 10,
                                  "containers": [{"image": "ghcr.io/knative/helloworld-go"}]}},
            "traffic": [{"tag": "current", "latestRevision": true, "percent": 100}]
        }
    }))
    .unwrap();
    let created = services.create(&PostParams::default(), &svc).await.unwrap();
    assert_eq!(created.spec, svc.spec);
}

// ---------------------------------------------------------------------------------------------
// Against a real cluster (CEL enforced): the CRDs are applied, then each invalid object is
// created with a server-side dry run (nothing is stored) and must be refused with the rule's
// message; the valid one must pass.

async fn cluster_with_crds() -> kube::Client {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let client = kube::Client::try_default()
        .await
        .expect("a cluster (KUBECONFIG)");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in thaw::knative::crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(
            &name,
            &PatchParams::apply("thaw-cel-test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name}: {e}"));
    }
    // Wait (bounded) until each CRD is Established.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    for crd in thaw::knative::crds() {
        let name = crd.metadata.name.unwrap();
        loop {
            let c = crds.get(&name).await.unwrap();
            let established = c
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} not Established"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    client
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_cluster_refuses_what_the_rules_forbid() {
    let client = cluster_with_crds().await;
    knative_cel_live::refuses_what_the_rules_forbid(&client, "default").await;
}
