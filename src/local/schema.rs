//! Checks a Service in local.yaml against the Service CRD's structural schema (generated from
//! `crate::knative`), as the Kubernetes API server would, but reporting instead of pruning:
//! every unknown field and every value of the wrong type, each named by its path
//! (`services[0].spec.template.spec.containerConcurrency: expected a whole number, got
//! "lots"`). Knative's types ignore unknown fields when deserialising, so without this a typo
//! would silently fall back to a default.

use std::sync::LazyLock;

use serde_json::Value;

use crate::config::parse::Problem;

/// The Service CRD's `openAPIV3Schema`, as JSON.
static SERVICE_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    let crd = crate::knative::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "Service")
        .expect("the Service CRD is generated");
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the Service CRD has a schema");
    // Plain data: serialising it cannot fail.
    serde_json::to_value(schema).expect("a schema serialises")
});

/// Fields whose values must also be ≥ 0 (for the wording of a type error).
const NON_NEGATIVE: &[&str] = &[
    "containerConcurrency",
    "timeoutSeconds",
    "responseStartTimeoutSeconds",
    "idleTimeoutSeconds",
    "containerPort",
    "percent",
];

/// Every unknown field and wrongly typed value of `service` (a Service manifest as a JSON
/// tree), named under `path` (e.g. `services[0]`).
pub fn check_service(service: &Value, path: &str) -> Vec<Problem> {
    let mut out = Vec::new();
    let Some(top) = service.as_object() else {
        out.push(type_problem(path, "a mapping (a Knative Service)", service));
        return out;
    };
    // The root's apiVersion, kind and metadata are Kubernetes', not in the CRD's schema.
    // apiVersion and kind may be left out locally; when given they must be Knative's.
    for (k, want) in [
        ("apiVersion", "serving.knative.dev/v1"),
        ("kind", "Service"),
    ] {
        if let Some(v) = top.get(k)
            && v.as_str() != Some(want)
        {
            out.push(Problem::new(
                format!("{path}.{k}"),
                v.as_str().map_or_else(|| v.to_string(), String::from),
                format!("must be {want}"),
            ));
        }
    }
    if let Some(meta) = top.get("metadata") {
        walk(meta, &OBJECT_META, &format!("{path}.metadata"), &mut out);
    }
    let rest: serde_json::Map<String, Value> = top
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    walk(&Value::Object(rest), &SERVICE_SCHEMA, path, &mut out);
    out
}

/// Kubernetes' ObjectMeta schema (as the template's `metadata` carries it in the CRD).
static OBJECT_META: LazyLock<Value> = LazyLock::new(|| {
    SERVICE_SCHEMA
        .pointer("/properties/spec/properties/template/properties/metadata")
        .cloned()
        .unwrap_or(Value::Null)
});

fn walk(v: &Value, schema: &Value, path: &str, out: &mut Vec<Problem>) {
    if v.is_null() || schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
    {
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            out.push(type_problem(path, "a whole number or a string", v));
        }
        return;
    }
    // A schema may be a combination (`anyOf`/`allOf`) without a type of its own: not checked.
    let Some(kind) = schema.get("type").and_then(Value::as_str) else {
        return;
    };
    match kind {
        "object" => {
            let Some(map) = v.as_object() else {
                out.push(type_problem(path, "a mapping (key: value)", v));
                return;
            };
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for (k, child) in map {
                let child_path = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) => walk(child, s, &child_path, out),
                    (None, Some(Value::Object(s))) => {
                        walk(child, &Value::Object(s.clone()), &child_path, out)
                    }
                    (None, Some(Value::Bool(true))) => {}
                    // An object schema with neither properties nor additionalProperties
                    // (e.g. the top-level metadata of a CRD) takes anything.
                    (None, None) if props.is_none() => {}
                    _ => {
                        let known: Vec<&str> = props
                            .map(|p| p.keys().map(String::as_str).collect())
                            .unwrap_or_default();
                        let value = match child {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        out.push(Problem::new(
                            child_path,
                            value,
                            format!("unknown field (known here: {})", known.join(", ")),
                        ));
                    }
                }
            }
        }
        "array" => {
            let Some(items) = v.as_array() else {
                out.push(type_problem(path, "a list", v));
                return;
            };
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(item, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        "integer" => {
            let last = path.rsplit(['.', ']']).next().unwrap_or("");
            let words = if NON_NEGATIVE.contains(&last) {
                "a whole number ≥ 0"
            } else {
                "a whole number"
            };
            let negative = NON_NEGATIVE.contains(&last) && v.as_i64().is_some_and(|n| n < 0);
            if !(v.is_i64() || v.is_u64()) || negative {
                out.push(type_problem(path, words, v));
            }
        }
        "number" if !v.is_number() => out.push(type_problem(path, "a number", v)),
        "boolean" if !v.is_boolean() => out.push(type_problem(path, "true or false", v)),
        "string" if !v.is_string() => out.push(type_problem(path, "a string", v)),
        _ => {}
    }
}

/// A wrong type: the value as written (a string unquoted, anything else as JSON) and what was
/// expected.
fn type_problem(path: &str, expected: &str, got: &Value) -> Problem {
    let (value, words) = match got {
        Value::String(s) => (s.clone(), format!("{s:?}")),
        Value::Array(_) => (got.to_string(), "a list".into()),
        Value::Object(_) => (got.to_string(), "a mapping".into()),
        other => (other.to_string(), other.to_string()),
    };
    Problem::new(path, value, format!("expected {expected}, got {words}"))
}
