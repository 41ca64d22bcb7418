//! The rules of [`super::validate`] that CEL can express, as `x-kubernetes-validations` in the
//! generated CRDs, so that an API server with CEL (Kubernetes 1.25+) rejects such objects at
//! admission, as Knative's webhook would. The controller's own validation stays the contract:
//! it also covers what CEL cannot see (`config-defaults`' values per namespace, the
//! autoscaling annotations, reserved ports and env vars, the revision name's prefix).
//!
//! | where | rule |
//! |---|---|
//! | `spec.traffic[].percent` | in [0, 100] |
//! | `spec.traffic` | percents sum to 100 (a Service's empty list: 100 % to the latest) |
//! | `spec.traffic[]` (Route) | exactly one of `revisionName` and `configurationName` |
//! | `spec.traffic[]` (Service) | no `configurationName` |
//! | `spec.traffic[]` | `latestRevision` is true exactly when `revisionName` is unset |
//! | `spec.traffic[].tag` | a DNS-1035 label |
//! | `containerConcurrency` | in [0, 1000] (Knative's default `container-concurrency-max-limit`; the controller checks the configured one) |
//! | `timeoutSeconds`, `responseStartTimeoutSeconds`, `idleTimeoutSeconds` | at least 0 |
//!
//! Cost bounds: the API server estimates each rule's worst-case cost from the schema and
//! refuses a CRD whose rules could run too long over unbounded lists and strings, so the
//! spec's traffic list carries `maxItems` ([`MAX_TRAFFIC_TARGETS`]) and a tag `maxLength` 63
//! (longer is invalid anyway).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// The most traffic targets a spec may list (bounds the sum rule's cost; Knative sets none).
pub const MAX_TRAFFIC_TARGETS: u64 = 1000;

/// One `x-kubernetes-validations` entry: `(rule, message)`.
pub type Rule = (&'static str, &'static str);

/// `spec.traffic[].percent`.
pub const PERCENT: Rule = (
    "self >= 0 && self <= 100",
    "spec.traffic[].percent must be in [0, 100]",
);
/// `spec.traffic` of a Route.
pub const ROUTE_SUM: Rule = (
    "self.map(t, has(t.percent) ? t.percent : 0).sum() == 100",
    "spec.traffic: the percents must sum to 100",
);
/// `spec.traffic` of a Service (empty: 100 % to the latest revision).
pub const SERVICE_SUM: Rule = (
    "size(self) == 0 || self.map(t, has(t.percent) ? t.percent : 0).sum() == 100",
    "spec.traffic: the percents must sum to 100",
);
/// `spec.traffic[]` of a Route.
pub const ROUTE_ONE_OF: Rule = (
    "has(self.revisionName) != has(self.configurationName)",
    "spec.traffic[]: set exactly one of revisionName and configurationName",
);
/// `spec.traffic[]` of a Service.
pub const SERVICE_NO_CONFIGURATION: Rule = (
    "!has(self.configurationName)",
    "spec.traffic[].configurationName must not be set in a Service (its own configuration is \
     the target)",
);
/// `spec.traffic[]`.
pub const LATEST_REVISION: Rule = (
    "!has(self.latestRevision) || self.latestRevision != has(self.revisionName)",
    "spec.traffic[].latestRevision must be true exactly when revisionName is not set",
);
/// `spec.traffic[].tag`.
pub const TAG: Rule = (
    "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "spec.traffic[].tag must be a DNS-1035 label (lower-case letters, digits and '-', starting \
     with a letter, ending with a letter or digit)",
);
/// `containerConcurrency`.
pub const CONTAINER_CONCURRENCY: Rule = (
    "self >= 0 && self <= 1000",
    "containerConcurrency must be in [0, 1000]",
);
/// `timeoutSeconds`.
pub const TIMEOUT_SECONDS: Rule = ("self >= 0", "timeoutSeconds must not be negative");
/// `responseStartTimeoutSeconds`.
pub const RESPONSE_START_TIMEOUT_SECONDS: Rule = (
    "self >= 0",
    "responseStartTimeoutSeconds must not be negative",
);
/// `idleTimeoutSeconds`.
pub const IDLE_TIMEOUT_SECONDS: Rule = ("self >= 0", "idleTimeoutSeconds must not be negative");

/// The CRD with its kind's rules added (a CRD of another kind comes back unchanged).
pub fn with_validations(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let kind = crd.spec.names.kind.clone();
    // The CRD is plain data: converting it to JSON and back cannot fail.
    let mut v = serde_json::to_value(&crd).expect("a CRD serialises");
    for version in v["spec"]["versions"].as_array_mut().into_iter().flatten() {
        let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        match kind.as_str() {
            "Service" => {
                traffic(spec, false);
                revision_spec(&mut spec["properties"]["template"]["properties"]["spec"]);
            }
            "Configuration" => {
                revision_spec(&mut spec["properties"]["template"]["properties"]["spec"])
            }
            "Revision" => revision_spec(spec),
            "Route" => traffic(spec, true),
            _ => {}
        }
    }
    serde_json::from_value(v).expect("the CRD with rules deserialises")
}

fn add(schema: &mut Value, rules: &[Rule]) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let list = obj
        .entry("x-kubernetes-validations")
        .or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        list.extend(
            rules
                .iter()
                .map(|(rule, message)| json!({"rule": rule, "message": message})),
        );
    }
}

fn traffic(spec: &mut Value, route: bool) {
    let list = &mut spec["properties"]["traffic"];
    if !list.is_object() {
        return;
    }
    list["maxItems"] = json!(MAX_TRAFFIC_TARGETS);
    add(list, &[if route { ROUTE_SUM } else { SERVICE_SUM }]);
    let item = &mut list["items"];
    add(
        item,
        &[
            if route {
                ROUTE_ONE_OF
            } else {
                SERVICE_NO_CONFIGURATION
            },
            LATEST_REVISION,
        ],
    );
    add(&mut item["properties"]["percent"], &[PERCENT]);
    let tag = &mut item["properties"]["tag"];
    tag["maxLength"] = json!(63);
    add(tag, &[TAG]);
}

fn revision_spec(spec: &mut Value) {
    let props = &mut spec["properties"];
    add(&mut props["containerConcurrency"], &[CONTAINER_CONCURRENCY]);
    add(&mut props["timeoutSeconds"], &[TIMEOUT_SECONDS]);
    add(
        &mut props["responseStartTimeoutSeconds"],
        &[RESPONSE_START_TIMEOUT_SECONDS],
    );
    add(&mut props["idleTimeoutSeconds"], &[IDLE_TIMEOUT_SECONDS]);
}
