//! Whether a child's server-side apply would change anything, decided without asking the API
//! server, so a reconcile of a steady object sends no write (Knative's reconcilers compare
//! before they update; a new controller leader reconciles everything once and must write
//! nothing that is already true).
//!
//! The body the controller applies carries [`APPLIED_ANNOTATION`], a hash of everything else
//! in it ([`applied_body`]). The apply is skipped when the object found holds every field of
//! that body with the same value ([`contains`]): the hash catches a field the controller set
//! before and no longer sets (the apply would remove it), the field-by-field comparison a
//! field someone else changed (the apply would set it back). What the API server adds itself
//! (defaults, status, `metadata` it manages) is not looked at.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The annotation on every child the controller applies: the hash of the applied body.
pub const APPLIED_ANNOTATION: &str = "controller.thaw.dev/applied-hash";

/// `desired` as the apply body: with `apiVersion` and `kind`, and [`APPLIED_ANNOTATION`] set
/// to the hash of the rest (any value it had is replaced).
pub fn applied_body(mut desired: Value, api_version: &str, kind: &str) -> Value {
    desired["apiVersion"] = api_version.into();
    desired["kind"] = kind.into();
    if let Some(meta) = desired["metadata"].as_object_mut() {
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(APPLIED_ANNOTATION);
        }
        // No annotations and an empty map of them are the same body.
        if meta.get("annotations").is_some_and(is_empty) {
            meta.remove("annotations");
        }
    }
    // serde_json's maps are ordered by key: the text, and so the hash, is canonical.
    let digest = Sha256::digest(desired.to_string().as_bytes());
    let hash: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let meta = &mut desired["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = Value::Object(Default::default());
    }
    meta["annotations"][APPLIED_ANNOTATION] = hash.into();
    desired
}

/// The [`APPLIED_ANNOTATION`] value of `desired`'s apply body: what an object created
/// another way (a POST) carries so that its first reconcile finds it applied already.
pub fn applied_hash<K>(desired: &K) -> Result<String, serde_json::Error>
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize,
{
    let body = applied_body(
        serde_json::to_value(desired)?,
        &K::api_version(&()),
        &K::kind(&()),
    );
    Ok(body["metadata"]["annotations"][APPLIED_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Whether `have` holds everything `want` says: each key of an object with a value `have`
/// contains, an array element by element with the same length, anything else equal. A key
/// whose wanted value is empty or zero (`null`, `{}`, `[]`, `false`, `0`, `""`) may be absent:
/// the API server drops those (Go's `omitempty`, e.g. a container's `stdin: false`). So a
/// zero value someone else removed from a field that keeps it (a pointer, e.g.
/// `enableServiceLinks: false`) is not put back until the body changes.
pub fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| match h.get(k) {
            Some(hv) => contains(hv, wv),
            None => is_empty(wv),
        }),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| contains(hv, wv))
        }
        (h, w) => h == w || (h.is_null() && is_empty(w)),
    }
}

/// The first place where `have` does not hold what `want` says ([`contains`]), as a JSON
/// path with what each side has there: why an apply is sent.
pub fn first_difference(have: &Value, want: &Value) -> Option<String> {
    fn walk(have: &Value, want: &Value, path: &mut String) -> Option<String> {
        match (have, want) {
            (Value::Object(h), Value::Object(w)) => {
                for (k, wv) in w {
                    let len = path.len();
                    path.push('.');
                    path.push_str(k);
                    let found = match h.get(k) {
                        Some(hv) => walk(hv, wv, path),
                        None if is_empty(wv) => None,
                        None => Some(format!("{path}: absent, wanted {wv}")),
                    };
                    if found.is_some() {
                        return found;
                    }
                    path.truncate(len);
                }
                None
            }
            (Value::Array(h), Value::Array(w)) if h.len() == w.len() => {
                for (i, (hv, wv)) in h.iter().zip(w).enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    if let Some(d) = walk(hv, wv, path) {
                        return Some(d);
                    }
                    path.truncate(len);
                }
                None
            }
            (h, w) if contains(h, w) => None,
            (h, w) => Some(format!("{path}: {h}, wanted {w}")),
        }
    }
    walk(have, want, &mut String::new())
}

/// Empty or zero: what a Go `omitempty` field drops.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(ports: Value) -> Value {
        json!({"metadata": {"name": "s", "labels": {"app": "a"}}, "spec": {"ports": ports}})
    }

    #[test]
    fn the_hash_names_the_body_and_ignores_its_own_value() {
        let a = applied_body(service(json!([{"port": 80}])), "v1", "Service");
        let again = applied_body(a.clone(), "v1", "Service");
        assert_eq!(a, again, "re-hashing an applied body changes nothing");
        let b = applied_body(service(json!([{"port": 81}])), "v1", "Service");
        assert_ne!(
            a["metadata"]["annotations"][APPLIED_ANNOTATION],
            b["metadata"]["annotations"][APPLIED_ANNOTATION]
        );
        assert_eq!(a["kind"], "Service");
        assert_eq!(a["metadata"]["labels"]["app"], "a");
    }

    #[test]
    fn what_the_server_adds_is_not_a_change() {
        let want = applied_body(
            service(json!([{"port": 80, "name": "http"}])),
            "v1",
            "Service",
        );
        let mut have = want.clone();
        have["metadata"]["uid"] = "u".into();
        have["metadata"]["resourceVersion"] = "7".into();
        have["spec"]["clusterIP"] = "10.96.0.9".into();
        have["spec"]["ports"][0]["protocol"] = "TCP".into();
        have["status"] = json!({"loadBalancer": {}});
        assert!(contains(&have, &want));
    }

    #[test]
    fn a_changed_or_dropped_field_is_a_change() {
        let want = applied_body(service(json!([{"port": 80}])), "v1", "Service");
        // Someone else changed a field the controller sets.
        let mut have = want.clone();
        have["spec"]["ports"][0]["port"] = 81.into();
        assert!(!contains(&have, &want));
        // Someone else removed a label the controller sets.
        let mut have = want.clone();
        have["metadata"]["labels"] = json!({});
        assert!(!contains(&have, &want));
        // An extra list element (the controller would apply the list it wants).
        let mut have = want.clone();
        have["spec"]["ports"] = json!([{"port": 80}, {"port": 90}]);
        assert!(!contains(&have, &want));
    }

    #[test]
    fn a_field_no_longer_set_is_a_change_through_the_hash() {
        // Applied before with a label the controller no longer sets: the server still has it,
        // and every field wanted now is there, but the hash differs.
        let mut before = service(json!([{"port": 80}]));
        before["metadata"]["labels"]["old"] = "x".into();
        let have = applied_body(before, "v1", "Service");
        let want = applied_body(service(json!([{"port": 80}])), "v1", "Service");
        assert!(!contains(&have, &want));
        // An object applied by an earlier version, without the annotation, is applied again.
        let mut unannotated = want.clone();
        unannotated["metadata"]["annotations"] = json!({});
        assert!(!contains(&unannotated, &want));
    }

    #[test]
    fn the_first_difference_is_named() {
        let want = json!({"spec": {"ports": [{"port": 80}], "x": "a"}});
        let have = json!({"spec": {"ports": [{"port": 81}], "x": "a"}});
        assert_eq!(
            first_difference(&have, &want).as_deref(),
            Some(".spec.ports[0].port: 81, wanted 80")
        );
        assert_eq!(first_difference(&want, &want), None);
        assert_eq!(
            first_difference(&json!({}), &json!({"a": 1})).as_deref(),
            Some(".a: absent, wanted 1")
        );
    }

    #[test]
    fn empty_and_zero_values_may_be_absent() {
        // kube-apiserver returns a container's `stdin: false` as nothing.
        let want = json!({"spec": {"env": [], "selector": {}, "x": null, "n": 0, "stdin": false, "s": ""}});
        assert!(contains(&json!({"spec": {}}), &want));
        assert!(contains(&json!({"spec": {"n": 0, "stdin": false}}), &want));
        assert!(!contains(&json!({"spec": {"n": 1}}), &want), "1 is not 0");
        assert!(
            !contains(&json!({}), &json!({"tty": true})),
            "true is a value"
        );
    }
}
