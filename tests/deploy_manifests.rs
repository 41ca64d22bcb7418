//! deploy/: the Kubernetes manifests, checked without a cluster.
//!
//! - Built-in kinds pass `kubernetes-validate -k 1.33.0 --strict` (unknown fields rejected), and
//!   survive a round trip through their k8s-openapi types unchanged (a dropped field is one the
//!   type does not know).
//! - Custom resources (deploy/examples/) pass `check-jsonschema` against the openAPIV3Schema of
//!   their CRD in deploy/crds/ (Knative's kinds) or tests/crds/ (thaw's subsets of Istio's
//!   VirtualService and the Gateway API's HTTPRoute), closed so that unknown fields fail as the
//!   API server's pruning would drop them.
//! - deploy/rbac/ grants each role exactly the calls in deploy/rbac-table.yaml, both ways, and
//!   the table cites the code that makes them.
//! - deploy/config/ holds config/'s ConfigMaps with the same data, in thaw-system.
//! - The activator's Deployment drains within its grace period; the admin port stays off
//!   activator-service; every container is locked down; the Dockerfile builds a nonroot image.
//!
//! The tools come from PyPI (.ci/run installs them). A missing tool fails the test unless
//! THAW_SKIP_MANIFEST_TOOLS is set, which skips the tool's checks with a message.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const SYSTEM_NAMESPACE: &str = "thaw-system";
const K8S_VERSION: &str = "1.33.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// Every YAML document of a file (empty documents skipped).
fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", rel(path)));
    let all: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", rel(path)));
    all.into_iter().filter(|d| !d.is_null()).collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", rel(dir)))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(p);
        }
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn kind(v: &Value) -> (&str, &str) {
    (str_at(v, "/apiVersion"), str_at(v, "/kind"))
}

fn name(v: &Value) -> &str {
    str_at(v, "/metadata/name")
}

fn kustomization() -> Value {
    docs(&deploy().join("kustomization.yaml")).remove(0)
}

/// The files kustomization.yaml lists, in its order.
fn listed() -> Vec<PathBuf> {
    kustomization()["resources"]
        .as_array()
        .expect("kustomization.yaml: resources: a list")
        .iter()
        .map(|r| deploy().join(r.as_str().expect("a resource is a path")))
        .collect()
}

/// Every document applied by `kubectl apply -k deploy/`, with its file.
fn applied() -> Vec<(PathBuf, Value)> {
    listed()
        .into_iter()
        .flat_map(|p| docs(&p).into_iter().map(move |d| (p.clone(), d)))
        .collect()
}

fn examples() -> Vec<PathBuf> {
    let mut out = Vec::new();
    yaml_files(&deploy().join("examples"), &mut out);
    out
}

fn find<'a>(all: &'a [(PathBuf, Value)], kind_: &str, name_: &str) -> &'a Value {
    all.iter()
        .map(|(_, d)| d)
        .find(|d| kind(d).1 == kind_ && name(d) == name_)
        .unwrap_or_else(|| panic!("deploy/: no {kind_} {name_}"))
}

// ---------------------------------------------------------------------------------------
// Round trip through k8s-openapi: what the type drops is an unknown field.

/// `Some(round-tripped JSON)` for a built-in kind thaw knows the type of; `None` otherwise.
fn round_trip(doc: &Value) -> Option<Result<Value, String>> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    fn via<T: serde::de::DeserializeOwned + serde::Serialize>(
        doc: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(&typed).map_err(|e| e.to_string())
    }
    Some(match kind(doc) {
        ("v1", "Namespace") => via::<Namespace>(doc),
        ("v1", "ServiceAccount") => via::<ServiceAccount>(doc),
        ("v1", "ConfigMap") => via::<ConfigMap>(doc),
        ("v1", "Service") => via::<Service>(doc),
        ("apps/v1", "Deployment") => via::<Deployment>(doc),
        ("policy/v1", "PodDisruptionBudget") => via::<PodDisruptionBudget>(doc),
        ("networking.k8s.io/v1", "NetworkPolicy") => via::<NetworkPolicy>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => via::<ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => via::<ClusterRoleBinding>(doc),
        ("rbac.authorization.k8s.io/v1", "Role") => via::<Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => via::<RoleBinding>(doc),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            via::<CustomResourceDefinition>(doc)
        }
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            via::<MutatingWebhookConfiguration>(doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            via::<ValidatingWebhookConfiguration>(doc)
        }
        _ => return None,
    })
}

fn is_built_in(doc: &Value) -> bool {
    round_trip(doc).is_some()
}

/// Paths where `after` differs from `before`.
fn differences(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => differences(va, vb, &p, out),
                    None => out.push(format!("{p}: dropped (unknown field)")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                differences(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        _ if before == after => {}
        _ => out.push(format!("{path}: {before} became {after}")),
    }
}

#[test]
fn every_built_in_manifest_survives_a_k8s_openapi_round_trip() {
    let mut files: Vec<PathBuf> = listed();
    files.extend(examples());
    let mut checked = 0;
    let mut problems = Vec::new();
    for f in &files {
        for d in docs(f) {
            let Some(back) = round_trip(&d) else {
                // Only the custom resources and Istio's kinds are not built in.
                let (api, k) = kind(&d);
                assert!(
                    api.starts_with("serving.knative.dev/")
                        || api.starts_with("networking.istio.io/")
                        || api.starts_with("gateway.networking.k8s.io/")
                        || api.starts_with("cert-manager.io/")
                        || api.starts_with("networking.internal.knative.dev/"),
                    "{}: {api} {k}: a kind this test has no k8s-openapi type for (add it to round_trip)",
                    rel(f)
                );
                continue;
            };
            let back =
                back.unwrap_or_else(|e| panic!("{}: {} {}: {e}", rel(f), kind(&d).1, name(&d)));
            let mut diffs = Vec::new();
            differences(&d, &back, "", &mut diffs);
            for x in diffs {
                problems.push(format!("{} {} {}: {x}", rel(f), kind(&d).1, name(&d)));
            }
            checked += 1;
        }
    }
    assert!(
        problems.is_empty(),
        "round trip changed fields:\n{}",
        problems.join("\n")
    );
    assert!(checked >= 20, "only {checked} built-in documents found");
}

#[test]
fn the_round_trip_detects_an_unknown_field() {
    let mut d = find(&applied(), "Deployment", "activator").clone();
    d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = json!({});
    let back = round_trip(&d).unwrap().unwrap();
    let mut diffs = Vec::new();
    differences(&d, &back, "", &mut diffs);
    assert_eq!(
        diffs,
        [".spec.template.spec.containers[0].readinessProbe.httpGett: dropped (unknown field)"]
    );
}

// ---------------------------------------------------------------------------------------
// The external validators.

/// `Some(version line)` if `tool` runs; `None` (skip) only when it is missing and
/// THAW_SKIP_MANIFEST_TOOLS is set.
fn tool(tool: &str) -> Option<String> {
    match Command::new(tool).arg("--version").output() {
        Ok(out) if out.status.success() => {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        other => {
            let why = match other {
                Ok(out) => format!("exited {}", out.status),
                Err(e) => e.to_string(),
            };
            if std::env::var_os("THAW_SKIP_MANIFEST_TOOLS").is_some() {
                eprintln!("SKIPPED: {tool} not available ({why}); THAW_SKIP_MANIFEST_TOOLS is set");
                None
            } else {
                panic!(
                    "{tool} not available ({why}): `pip install kubernetes-validate==1.37.0 \
                     check-jsonschema==0.39.0` (.ci/run does), or set THAW_SKIP_MANIFEST_TOOLS=1 \
                     to skip these checks"
                );
            }
        }
    }
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The files whose documents are all built-in kinds: what kubernetes-validate checks.
fn built_in_files() -> Vec<PathBuf> {
    let mut files = listed();
    files.extend(examples());
    files.extend(component_files());
    files.retain(|f| {
        let d = docs(f);
        let built_in = d.iter().filter(|d| is_built_in(d)).count();
        assert!(
            built_in == 0 || built_in == d.len(),
            "{}: built-in and custom kinds mixed in one file",
            rel(f)
        );
        built_in > 0
    });
    files
}

#[test]
fn built_in_manifests_pass_kubernetes_validate_strict() {
    let Some(version) = tool("kubernetes-validate") else {
        return;
    };
    eprintln!("kubernetes-validate {version}");
    let files = built_in_files();
    let expected: usize = files.iter().map(|f| docs(f).len()).sum();
    let (ok, out) = run(Command::new("kubernetes-validate")
        .args(["-k", K8S_VERSION, "--strict"])
        .args(&files));
    assert!(ok, "kubernetes-validate --strict failed:\n{out}");
    // Every document was validated (none skipped as unknown).
    let passed = out
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    assert_eq!(passed, expected, "{out}");
}

#[test]
fn kubernetes_validate_strict_rejects_an_unknown_field() {
    let Some(_) = tool("kubernetes-validate") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut d = find(&applied(), "Deployment", "activator").clone();
    d["spec"]["template"]["spec"]["terminationGracePeriod"] = json!(30);
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, serde_json::to_string(&d).unwrap()).unwrap();
    let (ok, out) = run(Command::new("kubernetes-validate")
        .args(["-k", K8S_VERSION, "--strict"])
        .arg(&path));
    assert!(!ok && out.contains("terminationGracePeriod"), "{out}");
}

/// The CRD's schema for `api_version`/`kind`, closed: every object that names its properties
/// and does not preserve unknown fields rejects others (what the API server would prune).
fn closed_crd_schema(api_version: &str, kind_: &str) -> Value {
    let (group, version) = api_version.split_once('/').unwrap();
    let mut crds = Vec::new();
    yaml_files(&deploy().join("crds"), &mut crds);
    yaml_files(&root().join("tests/crds"), &mut crds);
    let crd = crds
        .iter()
        .flat_map(|f| docs(f))
        .find(|c| str_at(c, "/spec/group") == group && str_at(c, "/spec/names/kind") == kind_)
        .unwrap_or_else(|| panic!("deploy/crds: no CRD for {api_version} {kind_}"));
    let v = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("{kind_}: no version {version}"));
    let mut schema = v["schema"]["openAPIV3Schema"].clone();
    fn close(s: &mut Value) {
        let Some(obj) = s.as_object_mut() else { return };
        let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
        if obj.contains_key("properties") && !obj.contains_key("additionalProperties") && !preserve
        {
            obj.insert("additionalProperties".into(), json!(false));
        }
        for (k, child) in obj.iter_mut() {
            match k.as_str() {
                "properties" => child.as_object_mut().unwrap().values_mut().for_each(close),
                "items" | "additionalProperties" | "not" => close(child),
                "allOf" | "anyOf" | "oneOf" => {
                    child.as_array_mut().unwrap().iter_mut().for_each(close)
                }
                _ => {}
            }
        }
    }
    close(&mut schema);
    let props = schema["properties"].as_object_mut().unwrap();
    props.insert("apiVersion".into(), json!({"const": api_version}));
    props.insert("kind".into(), json!({"const": kind_}));
    props.entry("metadata").or_insert(json!({"type": "object"}));
    schema["required"] = json!(["apiVersion", "kind", "metadata"]);
    schema["$schema"] = json!("http://json-schema.org/draft-07/schema#");
    schema
}

fn check_custom(doc: &Value, dir: &Path, label: &str) -> (bool, String) {
    let (api, k) = kind(doc);
    let schema = dir.join(format!("{label}.schema.json"));
    let instance = dir.join(format!("{label}.json"));
    std::fs::write(
        &schema,
        serde_json::to_string(&closed_crd_schema(api, k)).unwrap(),
    )
    .unwrap();
    std::fs::write(&instance, serde_json::to_string(doc).unwrap()).unwrap();
    run(Command::new("check-jsonschema")
        .arg("--schemafile")
        .arg(&schema)
        .arg(&instance))
}

fn custom_resources() -> Vec<(PathBuf, Value)> {
    examples()
        .into_iter()
        .flat_map(|f| docs(&f).into_iter().map(move |d| (f.clone(), d)))
        .filter(|(_, d)| {
            kind(d).0.starts_with("serving.knative.dev/")
                || kind(d).0.starts_with("networking.internal.knative.dev/")
                || kind(d) == ("networking.istio.io/v1", "VirtualService")
                || kind(d) == ("gateway.networking.k8s.io/v1", "HTTPRoute")
                || kind(d) == ("gateway.networking.k8s.io/v1", "Gateway")
                || kind(d) == ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant")
                || kind(d) == ("networking.istio.io/v1", "Gateway")
                || kind(d) == ("cert-manager.io/v1", "Certificate")
        })
        .collect()
}

#[test]
fn custom_resources_pass_their_crd_schemas() {
    let Some(version) = tool("check-jsonschema") else {
        return;
    };
    eprintln!("{version}");
    let dir = tempfile::tempdir().unwrap();
    let crs = custom_resources();
    for (api, k) in [
        ("serving.knative.dev/v1", "Service"),
        ("networking.istio.io/v1", "VirtualService"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("cert-manager.io/v1", "Certificate"),
        ("networking.istio.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"),
    ] {
        assert!(
            crs.iter().any(|(_, d)| kind(d) == (api, k)),
            "deploy/examples/ has no {api} {k}: one per ingress class (and its TLS) is checked"
        );
    }
    for (i, (f, d)) in crs.iter().enumerate() {
        let (ok, out) = check_custom(d, dir.path(), &format!("cr{i}"));
        assert!(
            ok,
            "{} {} {}: not valid against its CRD:\n{out}",
            rel(f),
            kind(d).1,
            name(d)
        );
    }
}

#[test]
fn a_custom_resource_with_an_unknown_or_mistyped_field_fails_its_schema() {
    let Some(_) = tool("check-jsonschema") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, good) = custom_resources()
        .into_iter()
        .find(|(_, d)| kind(d).0.starts_with("serving.knative.dev/"))
        .unwrap();
    let mut unknown = good.clone();
    unknown["spec"]["containers"][0]["imagePullPolice"] = json!("Always");
    let (ok, out) = check_custom(&unknown, dir.path(), "unknown");
    assert!(!ok && out.contains("imagePullPolice"), "{out}");
    let mut mistyped = good.clone();
    mistyped["spec"]["containerConcurrency"] = json!("ten");
    let (ok, out) = check_custom(&mistyped, dir.path(), "mistyped");
    assert!(!ok && out.contains("ten"), "{out}");
}

// ---------------------------------------------------------------------------------------
// kustomization.yaml

#[test]
fn the_kustomization_lists_every_manifest_once_namespace_and_crds_first() {
    let k = kustomization();
    assert_eq!(
        kind(&k),
        ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    );
    let keys: BTreeSet<&str> = k.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["apiVersion", "kind", "resources"]),
        "kustomization.yaml: unexpected keys (a namespace: transformer would also rewrite the \
         ClusterRoleBindings' subjects; an images: transformer breaks Debian's kubectl 1.20, \
         whose kustomize takes the CRDs' `containers` schema for a pod's list)"
    );
    let files = listed();
    for f in &files {
        assert!(
            f.is_file(),
            "kustomization.yaml lists {} which is missing",
            rel(f)
        );
    }
    let unique: BTreeSet<&PathBuf> = files.iter().collect();
    assert_eq!(unique.len(), files.len(), "a file is listed twice");

    // Every manifest under deploy/ is listed, except the examples, the optional components and
    // the RBAC table.
    let mut present = Vec::new();
    yaml_files(&deploy(), &mut present);
    present.retain(|p| {
        !p.starts_with(deploy().join("examples"))
            && !p.starts_with(deploy().join("components"))
            && !p.ends_with("kustomization.yaml")
            && !p.ends_with("rbac-table.yaml")
    });
    let missing: Vec<String> = present
        .iter()
        .filter(|p| !unique.contains(p))
        .map(|p| rel(p))
        .collect();
    assert!(missing.is_empty(), "not in kustomization.yaml: {missing:?}");

    // The Namespace, then every CRD, then the rest.
    let all = applied();
    let order: Vec<&str> = all.iter().map(|(_, d)| kind(d).1).collect();
    assert_eq!(order[0], "Namespace");
    assert_eq!(name(&all[0].1), SYSTEM_NAMESPACE);
    let crds = order
        .iter()
        .filter(|k| **k == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, thaw::knative::crds().len());
    assert!(
        order[1..=crds]
            .iter()
            .all(|k| *k == "CustomResourceDefinition"),
        "the CRDs come right after the Namespace: {order:?}"
    );

    // Everything namespaced lives in thaw-system, but the controller's Role (and its binding)
    // in each gateway namespace the shipped config-istio and config-gateway name.
    let gateway_ns = gateway_namespaces();
    for ns in &gateway_ns {
        for k in ["Role", "RoleBinding"] {
            assert!(
                all.iter().any(|(_, d)| kind(d).1 == k
                    && name(d) == GATEWAY_ROLE
                    && str_at(d, "/metadata/namespace") == ns),
                "no {k} {GATEWAY_ROLE} in the gateway namespace {ns}"
            );
        }
    }
    for (f, d) in &all {
        let cluster_scoped = matches!(
            kind(d).1,
            "Namespace"
                | "CustomResourceDefinition"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
        );
        let ns = str_at(d, "/metadata/namespace");
        let gateway_role = matches!(kind(d).1, "Role" | "RoleBinding")
            && name(d) == GATEWAY_ROLE
            && gateway_ns.contains(ns);
        if gateway_role {
            continue;
        }
        if cluster_scoped {
            assert_eq!(
                ns,
                "",
                "{}: {} {} is cluster-scoped",
                rel(f),
                kind(d).1,
                name(d)
            );
        } else {
            assert_eq!(
                ns,
                SYSTEM_NAMESPACE,
                "{}: {} {}",
                rel(f),
                kind(d).1,
                name(d)
            );
        }
    }

    // One image for every role (an overlay's `images: [{name: thaw, ...}]` retags them all;
    // the controller gives the queue sidecar its own).
    for (_, d) in all.iter().filter(|(_, d)| kind(d).1 == "Deployment") {
        for c in d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            assert_eq!(c["image"].as_str().unwrap(), "thaw:dev", "{}", name(d));
        }
    }
    // config-deployment names no sidecar image, so the controller's own is used.
    let cd = find(&all, "ConfigMap", "config-deployment");
    assert!(
        cd["data"]["queue-sidecar-image"].is_null(),
        "config-deployment sets queue-sidecar-image: the sidecar would not follow the roles' image"
    );
}

// ---------------------------------------------------------------------------------------
// ConfigMaps: deploy/config/ mirrors config/.

/// Rewrites deploy/config/ from config/ (this test alone, so no other test reads a half-written
/// copy).
const BLESS: &str = "THAW_BLESS_DEPLOY=1 cargo test --test deploy_manifests config_maps";

fn deploy_copy_text(source: &Path, text: &str) -> String {
    let file = source.file_name().unwrap().to_string_lossy();
    let mut out = format!(
        "# Generated from config/{file} with the namespace set to {SYSTEM_NAMESPACE}. Edit that\n\
         # file, then: {BLESS}\n"
    );
    for line in text.lines() {
        if line.starts_with("  namespace: ") {
            out.push_str(&format!("  namespace: {SYSTEM_NAMESPACE}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn deploy_config_maps_have_config_dirs_data_in_thaw_system() {
    use thaw::config::load::{check_named, read_manifest};
    let bless = std::env::var_os("THAW_BLESS_DEPLOY").is_some();
    let mut sources = Vec::new();
    yaml_files(&root().join("config"), &mut sources);
    let mut expected = BTreeSet::new();
    for src in sources {
        // config/ also holds local.yaml, which is not a ConfigMap.
        if docs(&src).first().map(kind) != Some(("v1", "ConfigMap")) {
            continue;
        }
        let copy = deploy().join("config").join(src.file_name().unwrap());
        expected.insert(copy.clone());
        if bless {
            let text = std::fs::read_to_string(&src).unwrap();
            std::fs::write(&copy, deploy_copy_text(&src, &text)).unwrap();
        }
        let want = read_manifest(&src).unwrap_or_else(|e| panic!("{}: {e}", rel(&src)));
        // config/ and deploy/config/ agree on the namespace: the one thaw reads.
        assert_eq!(
            want.namespace.as_deref(),
            Some(SYSTEM_NAMESPACE),
            "{}",
            rel(&src)
        );
        let got = read_manifest(&copy).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write the copies: {BLESS}; list a new one in kustomization.yaml)",
                rel(&copy)
            )
        });
        assert_eq!(got.name, want.name, "{}", rel(&copy));
        assert_eq!(
            got.namespace.as_deref(),
            Some(SYSTEM_NAMESPACE),
            "{}",
            rel(&copy)
        );
        assert!(
            got.data == want.data,
            "{}: data differ from {}: refresh with {BLESS}\n  config/: {:?}\n  deploy/: {:?}",
            rel(&copy),
            rel(&src),
            want.data,
            got.data
        );
        let (shown, warnings) = check_named(&got);
        assert!(
            shown.is_ok() && warnings.is_empty(),
            "{}: {shown:?} {warnings:?}",
            rel(&copy)
        );
    }
    assert!(
        expected.len() >= 3,
        "config/ has {} ConfigMaps",
        expected.len()
    );
    let mut present = Vec::new();
    yaml_files(&deploy().join("config"), &mut present);
    let present: BTreeSet<PathBuf> = present.into_iter().collect();
    assert_eq!(
        present, expected,
        "deploy/config/ has a file config/ does not"
    );
}

// ---------------------------------------------------------------------------------------
// RBAC: deploy/rbac/ grants exactly what deploy/rbac-table.yaml lists.

/// The controller's Role in each gateway namespace (the Secret copies, the Gateway API
/// Gateways' listeners).
const GATEWAY_ROLE: &str = "thaw-controller-gateway";

/// The namespaces deploy/config/'s config-istio (its external gateway Services) and
/// config-gateway (its external Gateways) put the shared gateways in: where the controller
/// writes Secret copies and listeners, so where its Role must be.
fn gateway_namespaces() -> BTreeSet<String> {
    use thaw::config::keys::ConfigMap;
    use thaw::config::network::{GatewayConfig, IstioConfig};
    let data = |file: &str| -> std::collections::BTreeMap<String, String> {
        let d = docs(&deploy().join("config").join(file)).remove(0);
        serde_json::from_value(d["data"].clone()).unwrap_or_default()
    };
    let istio = IstioConfig::parse(&data("config-istio.yaml"))
        .unwrap()
        .config;
    let gateway = GatewayConfig::parse(&data("config-gateway.yaml"))
        .unwrap()
        .config;
    let mut out = BTreeSet::new();
    for g in &istio.external_gateways {
        out.insert(g.service.split('.').nth(1).unwrap().to_string());
    }
    for g in &gateway.external_gateways {
        out.insert(g.gateway.namespace.clone());
    }
    out
}

/// One permission: (scope, group, resource, resource name or "*", verb).
type Grant = (String, String, String, String, String);

fn table() -> Value {
    docs(&deploy().join("rbac-table.yaml")).remove(0)
}

fn table_grants(role: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in role["rules"].as_array().unwrap() {
        let names: Vec<String> = match r["resourceNames"].as_array() {
            Some(n) => n.iter().map(|x| x.as_str().unwrap().to_string()).collect(),
            None => vec!["*".into()],
        };
        for verb in r["verbs"].as_array().unwrap() {
            for n in &names {
                out.insert((
                    r["scope"].as_str().unwrap().to_string(),
                    r["group"].as_str().unwrap().to_string(),
                    r["resource"].as_str().unwrap().to_string(),
                    n.clone(),
                    verb.as_str().unwrap().to_string(),
                ));
            }
        }
    }
    out
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: a list"))
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn policy_grants(scope: &str, role: &Value, out: &mut BTreeSet<Grant>) {
    for r in role["rules"].as_array().unwrap() {
        assert!(
            r.get("nonResourceURLs").is_none(),
            "{}: nonResourceURLs",
            name(role)
        );
        let groups = strings(&r["apiGroups"], "apiGroups");
        let resources = strings(&r["resources"], "resources");
        let verbs = strings(&r["verbs"], "verbs");
        let names = match r.get("resourceNames") {
            Some(n) => strings(n, "resourceNames"),
            None => Vec::new(),
        };
        for x in groups.iter().chain(&resources).chain(&verbs).chain(&names) {
            assert!(!x.contains('*'), "{}: wildcard {x:?}", name(role));
        }
        let names = if names.is_empty() {
            vec!["*".to_string()]
        } else {
            names
        };
        for g in &groups {
            for res in &resources {
                for verb in &verbs {
                    for n in &names {
                        out.insert((
                            scope.into(),
                            g.clone(),
                            res.clone(),
                            n.clone(),
                            verb.clone(),
                        ));
                    }
                }
            }
        }
    }
}

/// What the manifests grant the ServiceAccount `sa` in thaw-system, through every binding.
fn manifest_grants(all: &[(PathBuf, Value)], sa: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for (_, b) in all
        .iter()
        .filter(|(_, d)| matches!(kind(d).1, "RoleBinding" | "ClusterRoleBinding"))
    {
        let binds_sa = b["subjects"].as_array().unwrap().iter().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == SYSTEM_NAMESPACE
        });
        if !binds_sa {
            continue;
        }
        let ref_kind = str_at(b, "/roleRef/kind");
        let role = find(all, ref_kind, str_at(b, "/roleRef/name"));
        let scope = match (kind(b).1, ref_kind) {
            ("ClusterRoleBinding", "ClusterRole") => "cluster".to_string(),
            ("RoleBinding", _) => str_at(b, "/metadata/namespace").to_string(),
            other => panic!("{}: binding {other:?}", name(b)),
        };
        policy_grants(&scope, role, &mut out);
    }
    out
}

#[test]
fn each_role_is_granted_exactly_the_calls_in_the_rbac_table() {
    let all = applied();
    let t = table();
    let roles = t["roles"].as_object().unwrap();
    assert_eq!(
        roles.keys().map(String::as_str).collect::<Vec<_>>(),
        ["activator", "autoscaler", "controller", "webhook"]
    );
    let mut service_accounts = BTreeSet::new();
    for (role, spec) in roles {
        let sa = spec["serviceAccount"].as_str().unwrap();
        service_accounts.insert(sa.to_string());
        find(&all, "ServiceAccount", sa);
        let want = table_grants(spec);
        let got = manifest_grants(&all, sa);
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{role}: needed but not granted: {missing:?}\n{role}: granted but not in the table: {extra:?}"
        );
        // The role's Deployment runs as it.
        let dep = find(&all, "Deployment", role);
        assert_eq!(str_at(dep, "/spec/template/spec/serviceAccountName"), sa);
    }
    // No binding grants anything to another subject.
    for (f, b) in all.iter().filter(|(_, d)| kind(d).1.ends_with("Binding")) {
        for s in b["subjects"].as_array().unwrap() {
            assert!(
                s["kind"] == "ServiceAccount"
                    && service_accounts.contains(s["name"].as_str().unwrap()),
                "{}: {} binds {s}",
                rel(f),
                name(b)
            );
        }
    }
}

#[test]
fn the_rbac_table_cites_the_code_that_makes_each_call() {
    let t = table();
    let mut cited: BTreeSet<String> = BTreeSet::new();
    for (role, spec) in t["roles"].as_object().unwrap() {
        for r in spec["rules"].as_array().unwrap() {
            let what = format!("{role}: {} {:?}", r["resource"], r["verbs"]);
            assert!(
                r["why"].as_str().is_some_and(|w| !w.is_empty()),
                "{what}: say why"
            );
            let scope = r["scope"].as_str().unwrap_or_default();
            assert!(
                matches!(scope, "cluster" | SYSTEM_NAMESPACE)
                    || (role == "controller" && gateway_namespaces().contains(scope)),
                "{what}: scope"
            );
            match (r.get("code"), r.get("planned")) {
                (Some(code), None) => {
                    for c in code.as_array().unwrap() {
                        let file = c["file"].as_str().unwrap();
                        let call = c["call"].as_str().unwrap();
                        let text = std::fs::read_to_string(root().join(file))
                            .unwrap_or_else(|e| panic!("{what}: {file}: {e}"));
                        assert!(text.contains(call), "{what}: {file} no longer has `{call}`");
                        cited.insert(file.to_string());
                    }
                }
                (None, Some(p)) => {
                    assert!(
                        p.as_str().unwrap().starts_with("issue "),
                        "{what}: planned: name the issue"
                    )
                }
                _ => panic!("{what}: exactly one of code or planned"),
            }
        }
    }
    // An operator's command (their kubeconfig, not a role's ServiceAccount) is named instead.
    for c in t["operatorCommands"].as_array().unwrap() {
        let file = c["file"].as_str().unwrap();
        for k in ["command", "calls"] {
            assert!(
                c[k].as_str().is_some_and(|v| !v.is_empty()),
                "operatorCommands: {file}: say {k}"
            );
        }
        std::fs::read_to_string(root().join(file))
            .unwrap_or_else(|e| panic!("operatorCommands: {file}: {e}"));
        cited.insert(file.to_string());
    }
    // Every file under src/ that talks to the API server is cited: a new call needs a row.
    let mut files = Vec::new();
    fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rs_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    rs_files(&root().join("src"), &mut files);
    let markers = [
        "kube::api::",
        "kube::Api",
        "k8s_controller::",
        "Api::namespaced(",
        "Api::all(",
        "Api::default_namespaced(",
    ];
    let mut uncited = Vec::new();
    for f in files {
        let r = rel(&f);
        let test_file =
            r.ends_with("tests.rs") || r.contains("/tests/") || r.contains("/testdata/");
        let text = std::fs::read_to_string(&f).unwrap();
        if !test_file && markers.iter().any(|m| text.contains(m)) && !cited.contains(&r) {
            uncited.push(r);
        }
    }
    assert!(
        uncited.is_empty(),
        "these files call the API server but deploy/rbac-table.yaml cites none of their calls: {uncited:?}"
    );
}

// ---------------------------------------------------------------------------------------
// The activator and the autoscaler.

fn arg_value<'a>(container: &'a Value, flag: &str) -> Option<&'a str> {
    container["args"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(flag)?.strip_prefix('='))
}

fn container_port(container: &Value, port_name: &str) -> i64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port_name)
        .unwrap_or_else(|| panic!("no container port {port_name}"))["containerPort"]
        .as_i64()
        .unwrap()
}

fn listen_port(container: &Value, flag: &str) -> i64 {
    let addr = arg_value(container, flag).unwrap_or_else(|| panic!("no {flag}="));
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn every_container_is_locked_down() {
    let all = applied();
    let deps: Vec<&Value> = all
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d).1 == "Deployment")
        .collect();
    assert_eq!(deps.len(), 4);
    let ns = find(&all, "Namespace", SYSTEM_NAMESPACE);
    assert_eq!(
        str_at(ns, "/metadata/labels/pod-security.kubernetes.io~1enforce"),
        "restricted"
    );
    for d in deps {
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{}", name(d));
        assert_eq!(
            str_at(pod, "/securityContext/seccompProfile/type"),
            "RuntimeDefault"
        );
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["runAsNonRoot"], true, "{}", name(d));
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", name(d));
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", name(d));
            assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", name(d));
            assert!(sc["capabilities"].get("add").is_none());
            for r in ["cpu", "memory"] {
                assert!(
                    c["resources"]["requests"][r].is_string(),
                    "{}: requests.{r}",
                    name(d)
                );
                assert!(
                    c["resources"]["limits"][r].is_string(),
                    "{}: limits.{r}",
                    name(d)
                );
            }
            assert_eq!(
                arg_value(c, "--system-namespace"),
                Some("$(SYSTEM_NAMESPACE)")
            );
        }
        assert_eq!(d["spec"]["replicas"], 2, "{}", name(d));
    }
}

#[test]
fn the_activator_drains_within_its_grace_period() {
    use thaw::config::ActivatorConfig;
    use thaw::config::load::from_manifest;
    let all = applied();
    let d = find(&all, "Deployment", "activator");
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let cfg: ActivatorConfig =
        from_manifest(&deploy().join("config/config-activator.yaml")).unwrap();
    let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .expect("a preStop sleep");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let drain = pre_stop + cfg.drain_delay.as_secs() + cfg.drain_timeout.as_secs();
    assert!(
        grace > drain,
        "terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop}s + drain-delay \
         {:?} + drain-timeout {:?}",
        cfg.drain_delay,
        cfg.drain_timeout
    );
    // Readiness is /readyz on the admin port the binary listens on.
    let admin = listen_port(c, "--admin-listen");
    assert_eq!(container_port(c, "admin"), admin);
    assert_eq!(str_at(c, "/readinessProbe/httpGet/path"), "/readyz");
    assert_eq!(str_at(c, "/readinessProbe/httpGet/port"), "admin");
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);

    // The PDB keeps one activator through voluntary disruptions.
    let pdb = find(&all, "PodDisruptionBudget", "activator");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let min = pdb["spec"]["minAvailable"].as_i64().unwrap();
    assert!(min >= 1 && min < d["spec"]["replicas"].as_i64().unwrap());
}

#[test]
fn activator_service_carries_the_data_port_only() {
    use thaw::platform::kubernetes::{APP_PROTOCOL_H2C, PORT_NAME_HTTP, PORT_NAME_HTTP2};
    let all = applied();
    let d = find(&all, "Deployment", "activator");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let data = listen_port(c, "--listen");
    let admin = listen_port(c, "--admin-listen");
    assert_ne!(data, admin);
    assert_eq!(container_port(c, "http"), data);
    let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
    let target = |p: &Value| -> i64 {
        match &p["targetPort"] {
            Value::String(n) => container_port(c, n),
            v => v.as_i64().unwrap(),
        }
    };

    let svc = find(&all, "Service", "activator-service");
    let ports = svc["spec"]["ports"].as_array().unwrap();
    let shape: Vec<(&str, i64, i64, &str)> = ports
        .iter()
        .map(|p| {
            (
                str_at(p, "/name"),
                p["port"].as_i64().unwrap(),
                target(p),
                str_at(p, "/appProtocol"),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (PORT_NAME_HTTP, 80, data, "http"),
            (PORT_NAME_HTTP2, 81, data, APP_PROTOCOL_H2C)
        ]
    );
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v);
    }

    // The admin port is reachable through the metrics Service only.
    for (_, s) in all.iter().filter(|(_, d)| kind(d).1 == "Service") {
        let selects_activator = s["spec"]["selector"]
            .as_object()
            .is_some_and(|sel| sel.iter().all(|(k, v)| &pod_labels[k] == v));
        if !selects_activator {
            continue;
        }
        let to_admin = s["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| target(p) == admin);
        assert_eq!(to_admin, name(s) == "activator-metrics", "{}", name(s));
    }

    // The NetworkPolicy opens the admin port to the autoscaler and labelled (Prometheus)
    // namespaces only.
    let np = find(&all, "NetworkPolicy", "activator");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]));
    let autoscaler = find(&all, "Deployment", "autoscaler");
    let mut admin_from = Vec::new();
    for rule in np["spec"]["ingress"].as_array().unwrap() {
        let ports: Vec<i64> = match rule["ports"].as_array() {
            Some(p) => p.iter().map(|p| p["port"].as_i64().unwrap()).collect(),
            None => vec![data, admin], // no ports: every port
        };
        if !ports.contains(&admin) {
            continue;
        }
        let from = rule["from"]
            .as_array()
            .expect("a rule to the admin port names its peers");
        assert!(!from.is_empty());
        admin_from.extend(from.iter().cloned());
    }
    for peer in &admin_from {
        if let Some(sel) = peer.get("podSelector") {
            assert!(peer.get("namespaceSelector").is_none());
            assert_eq!(
                sel["matchLabels"],
                autoscaler["spec"]["selector"]["matchLabels"]
            );
        } else {
            let labels = peer["namespaceSelector"]["matchLabels"]
                .as_object()
                .expect("by label");
            assert!(
                !labels.is_empty(),
                "an empty namespaceSelector is every namespace"
            );
        }
        assert!(peer.get("ipBlock").is_none());
    }
    assert!(
        admin_from.iter().any(|p| p.get("podSelector").is_some()),
        "the autoscaler"
    );

    // The data port: the container's `http` port, admitted from the namespace of every
    // gateway Service config-istio names (as shipped) and from mesh namespaces, each peer a
    // namespace selected by label (never every pod, never an empty selector).
    let cm = find(&all, "ConfigMap", "config-istio");
    let data_cm: std::collections::BTreeMap<String, String> =
        serde_json::from_value(cm["data"].clone()).unwrap();
    let istio =
        <thaw::config::network::IstioConfig as thaw::config::keys::ConfigMap>::parse(&data_cm)
            .unwrap()
            .config;
    let gateway_namespaces: std::collections::BTreeSet<String> = istio
        .external_gateways
        .iter()
        .chain(&istio.local_gateways)
        .map(|g| g.service.split('.').nth(1).unwrap().to_string())
        .collect();
    assert_eq!(container_port(c, "http"), data);
    let mut data_from = Vec::new();
    for rule in np["spec"]["ingress"].as_array().unwrap() {
        let ports: Vec<i64> = rule["ports"]
            .as_array()
            .expect("every rule names its ports")
            .iter()
            .map(|p| p["port"].as_i64().unwrap())
            .collect();
        if ports.contains(&data) {
            let from = rule["from"]
                .as_array()
                .expect("the data port names its peers");
            data_from.extend(from.iter().cloned());
        }
    }
    let mut admitted = std::collections::BTreeSet::new();
    for peer in &data_from {
        assert!(peer.get("podSelector").is_none() && peer.get("ipBlock").is_none());
        let labels = peer["namespaceSelector"]["matchLabels"]
            .as_object()
            .expect("a namespace by label");
        assert!(
            !labels.is_empty(),
            "an empty namespaceSelector is every namespace"
        );
        if let Some(ns) = labels.get("kubernetes.io/metadata.name") {
            admitted.insert(ns.as_str().unwrap().to_string());
        } else {
            assert_eq!(
                labels.get("istio-injection"),
                Some(&json!("enabled")),
                "the mesh"
            );
        }
    }
    assert_eq!(admitted, gateway_namespaces, "the gateways' namespaces");
}

#[test]
fn the_autoscaler_is_leader_elected_behind_its_stats_service() {
    let all = applied();
    let d = find(&all, "Deployment", "autoscaler");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let stats = listen_port(c, "--stats-listen");
    assert_eq!(container_port(c, "stats"), stats);
    // The Lease's holderIdentity: this pod's own stats address.
    assert_eq!(
        arg_value(c, "--stats-advertise"),
        Some(format!("$(POD_IP):{stats}").as_str())
    );
    let env_ip = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_IP")
        .unwrap();
    assert_eq!(
        str_at(env_ip, "/valueFrom/fieldRef/fieldPath"),
        "status.podIP"
    );
    let svc = find(&all, "Service", "autoscaler");
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["targetPort"], "stats");
    // Its Lease is the one its RBAC names.
    let t = table();
    assert!(
        t["roles"]["autoscaler"]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resource"] == "leases" && r["resourceNames"] == json!(["thaw-autoscaler"]))
    );
}

// ---------------------------------------------------------------------------------------
// Examples and the Dockerfile.

#[test]
fn the_example_revision_s_objects_are_found_by_label() {
    use thaw::knative::names::{DEPLOYMENT_SUFFIX, PRIVATE_SERVICE_SUFFIX, child_name, labels};
    use thaw::platform::kubernetes::PORT_NAME_HTTP;
    let dir = deploy().join("examples/hello");
    let all: Vec<(PathBuf, Value)> = examples()
        .into_iter()
        .filter(|f| f.starts_with(&dir))
        .flat_map(|f| docs(&f).into_iter().map(move |d| (f.clone(), d)))
        .collect();
    let rev = all
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d).1 == "Revision")
        .unwrap();
    let rev_name = name(rev);
    let ns = str_at(rev, "/metadata/namespace");
    let label = format!("/metadata/labels/{}", labels::REVISION.replace('/', "~1"));

    let dep = find(&all, "Deployment", &child_name(rev_name, DEPLOYMENT_SUFFIX));
    assert_eq!(str_at(dep, &label), rev_name);
    assert_eq!(str_at(&dep["spec"]["template"], &label), rev_name);

    // The private Service's labels (copied onto its EndpointSlices) match the watch's selector.
    let private = find(
        &all,
        "Service",
        &child_name(rev_name, PRIVATE_SERVICE_SUFFIX),
    );
    for term in labels::private_endpoint_slices().split(',') {
        match term.split_once('=') {
            Some((k, v)) => assert_eq!(private["metadata"]["labels"][k], v),
            None => assert!(private["metadata"]["labels"][term].is_string()),
        }
    }
    assert_eq!(
        str_at(
            &private["spec"]["selector"],
            &label.replace("/metadata/labels", "")
        ),
        rev_name
    );
    assert_eq!(private["spec"]["ports"][0]["name"], PORT_NAME_HTTP);

    // The public Service has no selector (the autoscaler writes its slices), and the
    // VirtualService routes to it with the revision named for the activator.
    let public = find(&all, "Service", rev_name);
    assert!(public["spec"].get("selector").is_none());
    assert_eq!(
        public["metadata"]["labels"][labels::SERVICE_TYPE],
        labels::SERVICE_TYPE_PUBLIC
    );
    let vs = all
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d).1 == "VirtualService")
        .unwrap();
    let route = &vs["spec"]["http"][0];
    let dest = &route["route"][0]["destination"];
    assert_eq!(
        str_at(dest, "/host"),
        format!("{rev_name}.{ns}.svc.cluster.local")
    );
    let port = dest["port"]["number"].as_i64().unwrap();
    assert!(
        public["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == port)
    );
    let set = &route["headers"]["request"]["set"];
    assert_eq!(set["Knative-Serving-Revision"], rev_name);
    assert_eq!(set["Knative-Serving-Namespace"], ns);
}

#[test]
fn the_dockerfile_builds_a_minimal_nonroot_image_of_thaw() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "two stages: {froms:?}");
    // The builder's Rust is at least the crate's rust-version.
    let builder = froms[0].split_whitespace().next().unwrap();
    let tag = builder
        .strip_prefix("rust:")
        .expect("the builder is rust:<version>");
    let version =
        |s: &str| -> Vec<u32> { s.split(['.', '-']).map_while(|x| x.parse().ok()).collect() };
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let msrv = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        version(tag) >= version(msrv),
        "builder {tag} < rust-version {msrv}"
    );
    assert!(text.contains("cargo build --release --locked --bin thaw"));
    // The commit comes in as a build argument that build.rs reads; the image gets the binary
    // stripped (its size: README).
    assert!(
        text.contains("ARG GIT_COMMIT"),
        "a GIT_COMMIT build argument"
    );
    assert!(text.contains("GIT_COMMIT=\"$GIT_COMMIT\" cargo build --release"));
    assert!(text.contains("strip --strip-all -o /thaw target/release/thaw"));
    let build_rs = std::fs::read_to_string(root().join("build.rs")).unwrap();
    assert!(build_rs.contains("from_env(\"GIT_COMMIT\")"));
    // The runtime is distroless, nonroot, with the binary as its entrypoint.
    assert!(
        froms[1].starts_with("gcr.io/distroless/cc-debian12:nonroot"),
        "{}",
        froms[1]
    );
    assert!(text.contains("COPY --from=build /thaw /usr/local/bin/thaw"));
    assert!(text.contains("ENTRYPOINT [\"/usr/local/bin/thaw\"]"));
    let user = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .unwrap();
    // The Deployments run as that user.
    for (_, d) in applied().iter().filter(|(_, d)| kind(d).1 == "Deployment") {
        let sc = &d["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(
            user,
            format!("{}:{}", sc["runAsUser"], sc["runAsGroup"]),
            "{}",
            name(d)
        );
    }
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l == "target/"),
        ".dockerignore keeps target/ out"
    );
}

// ---------------------------------------------------------------------------------------
// The queue sidecar's sample pod.

#[test]
fn the_sample_sidecar_pod_is_consistent_with_thaw_queues_settings() {
    use thaw::queue::settings::{Settings, reserved_ports};
    let file = deploy().join("examples/hello-sidecar/deployment.yaml");
    let dep = docs(&file).remove(0);
    let pod = &dep["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    let by_name = |n: &str| containers.iter().find(|c| c["name"] == n).unwrap();
    let (user, queue) = (by_name("user-container"), by_name("queue-proxy"));
    assert_eq!(queue["args"][0], "queue");
    // The sidecar accepts its environment as written (values from the downward API stand in).
    let env: std::collections::BTreeMap<String, String> = queue["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let v = e["value"].as_str().unwrap_or("from-the-downward-api");
            (e["name"].as_str().unwrap().to_string(), v.to_string())
        })
        .collect();
    let s = Settings::from_lookup(|k| env.get(k).cloned(), None, None)
        .unwrap_or_else(|e| panic!("{}: the sidecar refuses its settings: {e:?}", rel(&file)));
    // Its ports are the ones the pod names: the data port, and the admin port the autoscaler
    // pulls stats from, probed by the kubelet and waited on by the app's preStop hook.
    let port = |name: &str| {
        queue["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("queue-proxy has no port {name}"))["containerPort"]
            .as_u64()
            .unwrap() as u16
    };
    assert_eq!(port("http1"), s.data.port());
    assert_eq!(port(thaw::stats::POD_STATS_PORT_NAME), s.admin.port());
    assert_eq!(queue["readinessProbe"]["httpGet"]["path"], "/readyz");
    let pre_stop = &user["lifecycle"]["preStop"]["httpGet"];
    assert_eq!(pre_stop["path"], "/wait-for-drain");
    assert_eq!(pre_stop["port"].as_u64(), Some(u64::from(s.admin.port())));
    // The user container is where the sidecar forwards, on no port of the sidecar's.
    let user_port = user["ports"][0]["containerPort"].as_u64().unwrap() as u16;
    assert_eq!(user_port, s.user.port());
    assert!(!reserved_ports(&s).contains(&user_port));
    // The grace period covers the drain delay and the revision's timeout.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace >= (s.drain_delay + s.timeouts.total).as_secs(),
        "terminationGracePeriodSeconds {grace} < drain delay {:?} + timeout {:?}",
        s.drain_delay,
        s.timeouts.total
    );
}

// ---------------------------------------------------------------------------------------
// kubectl: deploy/ renders; the sidecar image follows; the README's sequence; the kit.

/// `Some(version)` if kubectl runs (Debian's `kubernetes-client`, which .ci/run installs);
/// `None` (skip) only when it is missing and THAW_SKIP_MANIFEST_TOOLS is set.
fn kubectl() -> Option<String> {
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(out) if out.status.success() => {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        other => {
            let why = match other {
                Ok(out) => format!("exited {}", out.status),
                Err(e) => e.to_string(),
            };
            assert!(
                std::env::var_os("THAW_SKIP_MANIFEST_TOOLS").is_some(),
                "kubectl not available ({why}): `apt-get install kubernetes-client` (.ci/run \
                 does), or set THAW_SKIP_MANIFEST_TOOLS=1 to skip these checks"
            );
            eprintln!("SKIPPED: kubectl not available ({why}); THAW_SKIP_MANIFEST_TOOLS is set");
            None
        }
    }
}

/// Whether `kubectl version --client`'s answer is 1.21 or later, whose kustomize (v4+) has
/// components, directories as resources and an images transformer that skips CRDs. Debian
/// bookworm's kubernetes-client is 1.20 (kustomize 2.0.3): deploy/ itself renders there.
fn modern_kustomize(version: &str) -> bool {
    let minor = version
        .split("Minor:\"")
        .nth(1)
        .or_else(|| version.split("v1.").nth(1))
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 21)
}

/// `kubectl kustomize dir`'s documents.
fn kustomize(dir: &Path) -> Vec<Value> {
    let (ok, out) = run(Command::new("kubectl").arg("kustomize").arg(dir));
    assert!(ok, "kubectl kustomize {}:\n{out}", dir.display());
    serde_saphyr::from_multiple::<Value>(&out)
        .unwrap_or_else(|e| panic!("kubectl kustomize {}: {e}", dir.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn rendered<'a>(all: &'a [Value], kind_: &str, name_: &str) -> &'a Value {
    all.iter()
        .find(|d| kind(d).1 == kind_ && name(d) == name_)
        .unwrap_or_else(|| panic!("no {kind_} {name_} rendered"))
}

/// A kustomization in a fresh directory under the target dir (an overlay must reach deploy/
/// by a relative path, and may not live inside it), with `body` below its header and `base`
/// standing for the relative path to deploy/.
fn overlay(body: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let from = dir.path().canonicalize().unwrap();
    let to = deploy().canonicalize().unwrap();
    let common = from
        .ancestors()
        .find(|a| to.starts_with(a))
        .expect("a common ancestor");
    let ups = from.strip_prefix(common).unwrap().components().count();
    let base = format!(
        "{}{}",
        "../".repeat(ups),
        to.strip_prefix(common).unwrap().display()
    );
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n{}",
            body.replace("BASE", &base)
        ),
    )
    .unwrap();
    dir
}

fn component_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    yaml_files(&deploy().join("components"), &mut out);
    out.retain(|p| !p.ends_with("kustomization.yaml"));
    out
}

#[test]
fn kubectl_renders_deploy_and_an_overlay_retags_every_role() {
    let Some(version) = kubectl() else {
        return;
    };
    eprintln!("{version}");
    let all = kustomize(&deploy());
    assert_eq!(all.len(), applied().len(), "every listed document rendered");
    let image = |d: &Value| {
        d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for role in ["activator", "autoscaler", "controller", "webhook"] {
        assert_eq!(image(rendered(&all, "Deployment", role)), "thaw:dev");
    }
    // An overlay naming a registry's image (as the README says) retags every role; the
    // sidecar follows through the controller (tests/controller_roles.rs). Needs a kustomize
    // whose images transformer skips CRDs (kubectl 1.21+), unlike Debian's kubectl 1.20.
    let dir = overlay(
        "resources:\n  - BASE\nimages:\n  - name: thaw\n    newName: registry.example/team/thaw\n    newTag: v1.2.3\n",
    );
    if !modern_kustomize(&version) {
        eprintln!("SKIPPED the overlay: this kubectl's kustomize (before 1.21) cannot: {version}");
        return;
    }
    let all = kustomize(dir.path());
    for role in ["activator", "autoscaler", "controller", "webhook"] {
        assert_eq!(
            image(rendered(&all, "Deployment", role)),
            "registry.example/team/thaw:v1.2.3"
        );
    }
}

/// The first `sh` block of the README's section `heading`: its commands, one per line
/// (comments and blank lines dropped, `\` continuations joined).
fn readme_commands(heading: &str) -> (String, Vec<String>) {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("README has no section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (line, more) = match line.strip_suffix('\\') {
            Some(l) => (l.trim_end(), true),
            None => (line, false),
        };
        pending.push_str(line);
        if more {
            pending.push(' ');
        } else {
            out.push(std::mem::take(&mut pending));
        }
    }
    (section.to_string(), out)
}

#[test]
fn the_readme_kubernetes_sequence_applies_in_order_what_deploy_holds() {
    let (section, cmds) = readme_commands("Run on Kubernetes");
    let at = |needle: &str| {
        cmds.iter()
            .position(|c| c.contains(needle))
            .unwrap_or_else(|| panic!("no command with {needle:?}: {cmds:#?}"))
    };
    // The image exists before it is loaded; deploy/ is applied before anything waits on it;
    // a namespace exists before anything goes in it; the Service before it is waited for.
    let build = at("docker build");
    assert!(
        cmds[build].contains("--build-arg GIT_COMMIT="),
        "{}",
        cmds[build]
    );
    assert!(build < at("kind load docker-image thaw:dev"));
    let apply = at("kubectl apply --server-side -k deploy/");
    assert!(at("kind load") < apply);
    assert!(apply < at("-n thaw-system wait deployment --all"));
    assert!(at("create namespace knative-serving") < at("gateway.yaml"));
    assert!(apply < at("helloworld.yaml"));
    assert!(at("helloworld.yaml") < at("kubectl wait ksvc/helloworld-go"));
    assert!(at("kubectl wait ksvc/") < at("curl "));
    // No manual step for the stats token: the autoscaler leader makes it.
    assert!(
        !cmds.iter().any(|c| c.contains("secret")),
        "no Secret step: {cmds:#?}"
    );

    // Every file named exists; every object named is in what those files hold.
    let mut applied_docs: Vec<Value> = applied().into_iter().map(|(_, d)| d).collect();
    for c in &cmds {
        for word in c.split_whitespace() {
            let word = word.trim_matches(|ch| ch == '"' || ch == '\'');
            if word.starts_with("deploy/") {
                let p = root().join(word);
                assert!(p.exists(), "{c}: {word} does not exist");
                if p.is_file() {
                    applied_docs.extend(docs(&p));
                }
            }
        }
    }
    let has = |kind_: &str, name_: &str, ns: &str| {
        applied_docs.iter().any(|d| {
            kind(d).1 == kind_ && name(d) == name_ && str_at(d, "/metadata/namespace") == ns
        })
    };
    let ksvc = at("kubectl wait ksvc/");
    let service = cmds[ksvc]
        .split("ksvc/")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert!(has("Service", service, "default"), "ksvc {service}");
    assert!(cmds[at("kubectl get ksvc")].contains(service));
    let gateway_ns = cmds[at("create namespace")]
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    assert!(has("Gateway", "knative-ingress-gateway", &gateway_ns));
    // The Host sent is the Service's route host under config-domain's default domain.
    let domain = docs(&deploy().join("config/config-domain.yaml"))[0]["data"]
        .as_object()
        .unwrap()
        .keys()
        .find(|k| !k.starts_with('_'))
        .cloned()
        .unwrap_or_else(|| "example.com".into());
    let host = format!("Host: {service}.default.{domain}");
    assert!(cmds[at("curl ")].contains(&host), "curl sends {host:?}");
    // Every role's Deployment is waited for in thaw-system.
    for role in ["activator", "autoscaler", "controller", "webhook"] {
        assert!(has("Deployment", role, SYSTEM_NAMESPACE));
    }

    // The minimum Kubernetes version is stated, and is one with the preStop sleep action.
    let stated = section
        .split("Kubernetes 1.")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse::<u32>().ok())
        .expect("the README's Run on Kubernetes states `Kubernetes 1.N or later`");
    assert!(section.contains(&format!("Kubernetes 1.{stated} or later")));
    let uses_sleep = applied().iter().any(|(_, d)| {
        d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| !c["lifecycle"]["preStop"]["sleep"].is_null())
            })
    });
    assert!(
        !uses_sleep || stated >= 30,
        "preStop sleep needs 1.30, stated 1.{stated}"
    );

    if kubectl().is_some() {
        kustomize(&deploy());
    }
}

#[test]
fn the_roles_answer_health_at_once_and_a_startup_probe_covers_the_first_sync() {
    let all = applied();
    for role in ["activator", "autoscaler"] {
        let d = find(&all, "Deployment", role);
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        let admin = listen_port(c, "--admin-listen");
        assert_eq!(container_port(c, "admin"), admin, "{role}");
        assert_eq!(
            str_at(c, "/livenessProbe/httpGet/path"),
            "/healthz",
            "{role}"
        );
        assert_eq!(
            str_at(c, "/readinessProbe/httpGet/path"),
            "/readyz",
            "{role}"
        );
        // The startup probe waits for what readiness waits for (first sync, token), with room
        // for a slow first sync; liveness then needs no initial delay.
        assert_eq!(str_at(c, "/startupProbe/httpGet/path"), "/readyz", "{role}");
        assert_eq!(str_at(c, "/startupProbe/httpGet/port"), "admin", "{role}");
        let p = &c["startupProbe"];
        let budget = p["periodSeconds"].as_u64().unwrap() * p["failureThreshold"].as_u64().unwrap();
        assert!(budget >= 600, "{role}: startup budget {budget} s");
        assert!(
            c["livenessProbe"]["initialDelaySeconds"].is_null(),
            "{role}"
        );
    }
}

/// The PodMonitor of the monitoring component, and the HPA and patch of the activator-hpa one,
/// checked against the roles as deploy/ defines them.
fn check_kit(all: &[Value], pm: &Value, hpa: &Value, activator_replicas_removed: bool) {
    // The PodMonitor selects every role's pods, in thaw-system, on their admin port.
    assert_eq!(str_at(pm, "/metadata/namespace"), SYSTEM_NAMESPACE);
    let sel = &pm["spec"]["selector"];
    let selects = |labels: &Value| {
        sel["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| labels[k] == *v)
            && sel["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|e| {
                    assert_eq!(e["operator"], "In");
                    e["values"]
                        .as_array()
                        .unwrap()
                        .contains(&labels[e["key"].as_str().unwrap()])
                })
    };
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_array().unwrap();
    assert!(!endpoints.is_empty());
    let mut selected = Vec::new();
    for d in all.iter().filter(|d| kind(d).1 == "Deployment") {
        let tpl = &d["spec"]["template"];
        assert!(
            selects(&tpl["metadata"]["labels"]),
            "the PodMonitor misses {}",
            name(d)
        );
        selected.push(name(d).to_string());
        let c = &tpl["spec"]["containers"][0];
        for ep in endpoints {
            let port = ep["port"].as_str().unwrap();
            assert_eq!(
                container_port(c, port),
                listen_port(c, "--admin-listen"),
                "{}: the scraped port is the admin port",
                name(d)
            );
            assert_eq!(ep["path"], "/metrics");
        }
    }
    selected.sort();
    assert_eq!(
        selected,
        ["activator", "autoscaler", "controller", "webhook"]
    );
    // The roles' NetworkPolicies admit the scrape from a labelled namespace.
    for np in all.iter().filter(|d| kind(d).1 == "NetworkPolicy") {
        let text = serde_json::to_string(np).unwrap();
        assert!(text.contains("metrics.thaw.dev/scrape"), "{}", name(np));
    }

    // The HPA owns the activator's replicas, and stays above the PDB.
    assert_eq!(str_at(hpa, "/metadata/namespace"), SYSTEM_NAMESPACE);
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "activator");
    assert!(
        activator_replicas_removed,
        "the HPA alone sets the activator's replicas"
    );
    let pdb = all
        .iter()
        .find(|d| kind(d).1 == "PodDisruptionBudget" && name(d) == "activator")
        .unwrap();
    let min_available = pdb["spec"]["minAvailable"].as_i64().unwrap();
    let min_replicas = hpa["spec"]["minReplicas"].as_i64().unwrap();
    assert!(
        min_replicas > min_available,
        "minReplicas {min_replicas} must exceed the PDB's minAvailable {min_available}"
    );
    assert!(hpa["spec"]["maxReplicas"].as_i64().unwrap() >= min_replicas);
    // CPU utilization is measured against the container's request.
    let act = all
        .iter()
        .find(|d| kind(d).1 == "Deployment" && name(d) == "activator")
        .unwrap();
    assert!(
        !act["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"].is_null()
    );
}

#[test]
fn the_operator_kit_components_match_the_roles() {
    // As written: the components' files against deploy/'s own.
    let base: Vec<Value> = applied().into_iter().map(|(_, d)| d).collect();
    let comp = |dir: &str| -> (Value, Vec<Value>) {
        let k = docs(
            &deploy()
                .join("components")
                .join(dir)
                .join("kustomization.yaml"),
        )
        .remove(0);
        assert_eq!(
            kind(&k),
            ("kustomize.config.k8s.io/v1alpha1", "Component"),
            "{dir}"
        );
        let docs: Vec<Value> = k["resources"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                docs(
                    &deploy()
                        .join("components")
                        .join(dir)
                        .join(r.as_str().unwrap()),
                )
            })
            .collect();
        (k, docs)
    };
    let (_, monitoring) = comp("monitoring");
    let (hpa_k, hpa_docs) = comp("activator-hpa");
    let pm = monitoring
        .iter()
        .find(|d| kind(d).1 == "PodMonitor")
        .unwrap();
    let hpa = hpa_docs
        .iter()
        .find(|d| kind(d).1 == "HorizontalPodAutoscaler")
        .unwrap();
    let removes_replicas = hpa_k["patches"].as_array().unwrap().iter().any(|p| {
        p["target"]["kind"] == "Deployment"
            && p["target"]["name"] == "activator"
            && p["patch"]
                .as_str()
                .is_some_and(|t| t.contains("op: remove") && t.contains("path: /spec/replicas"))
    });
    check_kit(&base, pm, hpa, removes_replicas);
    assert_eq!(
        find(&applied(), "Deployment", "activator")["spec"]["replicas"],
        2,
        "without the component the activators are a fixed 2"
    );

    // As kustomize renders them (components: kustomize 3.7+, kubectl 1.21+).
    let Some(version) = kubectl() else {
        return;
    };
    let dir = overlay(
        "resources:\n  - BASE\ncomponents:\n  - BASE/components/monitoring\n  - BASE/components/activator-hpa\n",
    );
    if !modern_kustomize(&version) {
        eprintln!(
            "SKIPPED rendering the components: this kubectl's kustomize (before 1.21) has none: {version}"
        );
        return;
    }
    let all = kustomize(dir.path());
    let act = rendered(&all, "Deployment", "activator");
    check_kit(
        &all,
        rendered(&all, "PodMonitor", "thaw"),
        rendered(&all, "HorizontalPodAutoscaler", "activator"),
        act["spec"]["replicas"].is_null(),
    );
}

#[test]
fn thaw_version_names_the_commit_it_was_built_from() {
    let out = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!(
            "thaw {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            env!("THAW_GIT_COMMIT")
        )
    );
}

// ---------------------------------------------------------------------------------------
// The admission webhook.

#[test]
fn the_webhook_is_registered_for_knatives_kinds_and_reachable_through_its_service() {
    use thaw::webhook::server::{DEFAULTING_PATH, VALIDATION_PATH};
    let all = applied();
    let d = find(&all, "Deployment", "webhook");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["args"][0], "webhook");
    let port = listen_port(c, "--listen");
    assert_eq!(container_port(c, "https-webhook"), port);
    assert_eq!(container_port(c, "admin"), listen_port(c, "--admin-listen"));
    let svc = find(&all, "Service", "thaw-webhook");
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https-webhook");
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/name"],
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    );
    for (kind_, hook, path) in [
        (
            "MutatingWebhookConfiguration",
            "webhook.serving.knative.dev",
            DEFAULTING_PATH,
        ),
        (
            "ValidatingWebhookConfiguration",
            "validation.webhook.serving.knative.dev",
            VALIDATION_PATH,
        ),
    ] {
        // The name the role keeps the caBundle of (its default flags).
        let cfg = find(&all, kind_, thaw::roles::webhook::WEBHOOK_NAME);
        let hooks = cfg["webhooks"].as_array().unwrap();
        assert_eq!(hooks.len(), 1, "{kind_}");
        let w = &hooks[0];
        assert_eq!(w["name"], hook);
        assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(w["sideEffects"], "None", "{kind_}");
        assert_eq!(
            w["failurePolicy"], "Fail",
            "{kind_}: Knative's (docs/decisions.md)"
        );
        let t = w["timeoutSeconds"].as_i64().unwrap();
        assert!((1..=30).contains(&t), "{kind_}: timeoutSeconds {t}");
        assert!(
            w["clientConfig"].get("caBundle").is_none(),
            "the role writes it"
        );
        let s = &w["clientConfig"]["service"];
        assert_eq!(s["name"], "thaw-webhook");
        assert_eq!(s["namespace"], SYSTEM_NAMESPACE);
        assert_eq!(s["path"], path);
        assert_eq!(s["port"], 443);
        let excluded = &w["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded["key"], "kubernetes.io/metadata.name");
        assert_eq!(excluded["operator"], "NotIn");
        assert_eq!(excluded["values"], json!([SYSTEM_NAMESPACE, "kube-system"]));
        let rule = &w["rules"][0];
        assert_eq!(rule["apiGroups"], json!(["serving.knative.dev"]));
        assert_eq!(rule["operations"], json!(["CREATE", "UPDATE"]));
        assert_eq!(
            rule["resources"],
            json!(["services", "configurations", "revisions", "routes"])
        );
        // DomainMappings (v1beta1) are validated, not defaulted.
        let rules = w["rules"].as_array().unwrap();
        if kind_ == "ValidatingWebhookConfiguration" {
            assert_eq!(rules.len(), 2);
            assert_eq!(rules[1]["apiVersions"], json!(["v1beta1"]));
            assert_eq!(rules[1]["resources"], json!(["domainmappings"]));
        } else {
            assert_eq!(rules.len(), 1);
        }
    }
    // The NetworkPolicy admits the admission port (the API server) and the scrapes.
    let np = find(&all, "NetworkPolicy", "webhook");
    let ports: Vec<i64> = np["spec"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["ports"].as_array().unwrap().iter())
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, [port, listen_port(c, "--admin-listen")]);
    assert!(
        np["spec"]["ingress"][0].get("from").is_none(),
        "the API server is no pod a policy can select"
    );
}

/// The documents of the kustomize Component in `dir` (its kustomization's resources).
fn component_docs(dir: &Path) -> Vec<Value> {
    let k = docs(&dir.join("kustomization.yaml")).remove(0);
    assert_eq!(kind(&k), ("kustomize.config.k8s.io/v1alpha1", "Component"));
    k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| docs(&dir.join(r.as_str().unwrap())))
        .collect()
}

/// The optional local gateway: config-istio's default local gateway (its Gateway's namespace
/// and name, its Service's host), the Service's port 80 named as the prober reads it and
/// pointing at the port the Gateway serves HTTP on, both selecting the same pods. Every
/// Istio VirtualService shipped in deploy/ is one thaw's VirtualService type reads whole
/// (nothing dropped), and removes every internal header from client requests.
#[test]
fn the_local_gateway_component_is_config_istios_default_and_the_virtual_services_parse() {
    let dir = deploy().join("components/istio-local-gateway");
    let all = component_docs(&dir);
    let gw = all.iter().find(|d| kind(d).1 == "Gateway").unwrap();
    let svc = all.iter().find(|d| kind(d).1 == "Service").unwrap();
    let local = thaw::config::network::IstioConfig::default().local_gateways[0].clone();
    assert_eq!(kind(gw).0, "networking.istio.io/v1");
    assert_eq!(
        (str_at(gw, "/metadata/namespace"), name(gw)),
        (local.namespace.as_str(), local.name.as_str())
    );
    assert_eq!(
        format!(
            "{}.{}.svc.cluster.local",
            name(svc),
            str_at(svc, "/metadata/namespace")
        ),
        local.service
    );
    assert_eq!(gw["spec"]["selector"], svc["spec"]["selector"]);
    let port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == 80)
        .expect("port 80");
    assert_eq!(port["name"], "http2");
    let served = gw["spec"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["port"]["protocol"] == "HTTP")
        .expect("an HTTP server");
    assert_eq!(port["targetPort"], served["port"]["number"]);
    assert_eq!(served["hosts"], json!(["*"]));

    let mut vss = 0;
    for f in examples() {
        for d in docs(&f) {
            if kind(&d) != ("networking.istio.io/v1", "VirtualService") {
                continue;
            }
            vss += 1;
            let vs: thaw::controller::route::virtual_service::VirtualService =
                serde_json::from_value(d.clone()).unwrap_or_else(|e| panic!("{}: {e}", rel(&f)));
            let mut diffs = Vec::new();
            let back = serde_json::to_value(&vs).unwrap();
            differences(&d, &back, "", &mut diffs);
            assert!(
                diffs.is_empty(),
                "{}: fields thaw does not know: {diffs:?}",
                rel(&f)
            );
            for h in &vs.spec.http {
                for ops in h
                    .headers
                    .iter()
                    .chain(h.route.iter().flat_map(|r| r.headers.iter()))
                    .flat_map(|x| x.request.iter())
                {
                    for name in thaw::knative::headers::INTERNAL {
                        assert!(
                            ops.set.contains_key(*name) || ops.remove.iter().any(|r| r == name),
                            "{}: {name} passes from clients",
                            rel(&f)
                        );
                    }
                }
            }
        }
    }
    assert!(vss > 0, "deploy/examples/ has no VirtualService");
}

/// The Gateway API examples: the Gateways are config-gateway's defaults (namespace and name),
/// and the HTTPRoute is one thaw's HTTPRoute type reads whole (nothing dropped) that removes
/// every internal header from client requests but those its backends set.
#[test]
fn the_gateway_api_examples_are_config_gateways_defaults_and_the_http_route_parses() {
    use thaw::controller::route::http_route::HTTPRoute;
    let dir = deploy().join("examples/gateway-api");
    let gws = docs(&dir.join("gateways.yaml"));
    let defaults = thaw::config::network::GatewayConfig::default();
    for (gw, want) in gws
        .iter()
        .zip([&defaults.external_gateways[0], &defaults.local_gateways[0]])
    {
        assert_eq!(kind(gw), ("gateway.networking.k8s.io/v1", "Gateway"));
        assert_eq!(
            (str_at(gw, "/metadata/namespace"), name(gw)),
            (want.gateway.namespace.as_str(), want.gateway.name.as_str())
        );
        assert_eq!(gw["spec"]["listeners"][0]["protocol"], "HTTP");
    }
    let d = docs(&dir.join("httproute.yaml")).remove(0);
    let hr: HTTPRoute = serde_json::from_value(d.clone()).unwrap();
    let mut diffs = Vec::new();
    differences(&d, &serde_json::to_value(&hr).unwrap(), "", &mut diffs);
    assert!(diffs.is_empty(), "fields thaw does not know: {diffs:?}");
    let rule = &hr.spec.rules[0];
    let removed = &rule.filters[0]
        .request_header_modifier
        .as_ref()
        .unwrap()
        .remove;
    for b in &rule.backend_refs {
        let set = &b.filters[0].request_header_modifier.as_ref().unwrap().set;
        for h in thaw::knative::headers::INTERNAL {
            assert!(
                set.iter().any(|s| s.name == *h) || removed.iter().any(|r| r == h),
                "{h} passes from clients"
            );
        }
    }
}

/// The optional mesh component: an Istio AuthorizationPolicy selecting the activator's pods,
/// admitting its data port from the gateways' service account (in the namespace of
/// config-istio's gateway Services) and from mesh principals, and its admin port (left to the
/// NetworkPolicy); the ports are the activator's container ports.
#[test]
fn the_istio_authorization_component_admits_the_gateways_and_the_mesh() {
    let dir = deploy().join("components/istio-authorization");
    let all = component_docs(&dir);
    let ap = all
        .iter()
        .find(|d| kind(d) == ("security.istio.io/v1", "AuthorizationPolicy"))
        .unwrap();
    let applied = applied();
    let d = find(&applied, "Deployment", "activator");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(str_at(ap, "/metadata/namespace"), SYSTEM_NAMESPACE);
    assert_eq!(
        ap["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(ap["spec"]["action"], "ALLOW");
    let port = |p: i64| json!([{"operation": {"ports": [p.to_string()]}}]);
    let (data, admin) = (container_port(c, "http"), container_port(c, "admin"));
    let rules = ap["spec"]["rules"].as_array().unwrap();
    let from_data: Vec<&Value> = rules
        .iter()
        .filter(|r| r["to"] == port(data))
        .flat_map(|r| r["from"].as_array().unwrap())
        .flat_map(|f| f["source"]["principals"].as_array().unwrap())
        .collect();
    let gateway_ns = thaw::config::network::IstioConfig::default().external_gateways[0]
        .service
        .split('.')
        .nth(1)
        .unwrap()
        .to_string();
    assert!(
        from_data.iter().any(|p| p
            .as_str()
            .unwrap()
            .starts_with(&format!("cluster.local/ns/{gateway_ns}/sa/"))),
        "the gateways: {from_data:?}"
    );
    assert!(from_data.contains(&&json!("*")), "the mesh");
    assert!(
        rules.iter().any(|r| r["to"] == port(admin)),
        "the admin port"
    );
    assert_eq!(
        rules
            .iter()
            .filter(|r| r["to"] != port(data) && r["to"] != port(admin))
            .count(),
        0,
        "no other port"
    );
}

/// The TLS examples carry the names thaw gives: the Istio TLS Gateway's and the Gateway API
/// listener's for the route `hello` in `default`, and each object reads whole into thaw's
/// types (nothing dropped).
#[test]
fn the_tls_examples_are_what_thaw_writes() {
    use thaw::controller::route::certificate::Certificate;
    use thaw::controller::route::http_route::{HTTPRoute, ReferenceGrant};
    use thaw::controller::route::virtual_service::Gateway as IstioGateway;
    let dir = deploy().join("examples/tls");
    let istio = docs(&dir.join("istio.yaml"));
    let gw_api = docs(&dir.join("gateway-api.yaml"));
    let whole = |d: &Value, back: Value| {
        let mut diffs = Vec::new();
        differences(d, &back, "", &mut diffs);
        assert!(diffs.is_empty(), "fields thaw does not know: {diffs:?}");
    };
    let cert: Certificate = serde_json::from_value(istio[0].clone()).unwrap();
    whole(&istio[0], serde_json::to_value(&cert).unwrap());
    let g: IstioGateway = serde_json::from_value(istio[1].clone()).unwrap();
    whole(&istio[1], serde_json::to_value(&g).unwrap());
    let config = thaw::config::network::IstioConfig::default();
    assert_eq!(
        name(&istio[1]),
        thaw::controller::route::istio_tls::tls_gateway_name("hello", &config.external_gateways[0])
    );
    // The Route's uid, as its Certificate's name says.
    let uid = cert
        .spec
        .secret_name
        .trim_start_matches("route-")
        .to_string();
    assert_eq!(
        g.spec.servers[0]
            .tls
            .as_ref()
            .unwrap()
            .credential_name
            .as_deref(),
        Some(
            thaw::controller::route::istio_tls::copy_name(&uid, "default", &cert.spec.secret_name)
                .as_str()
        )
    );
    let listener = &gw_api[0]["spec"]["listeners"][1];
    assert_eq!(
        listener["name"],
        thaw::controller::route::tls_owner::listener_name(&uid, "hello.default.example.com")
    );
    let want = &thaw::controller::route::gateway_tls::listeners(&{
        use thaw::controller::route::ingress::{IngressDesc, Tls};
        IngressDesc {
            namespace: "default".into(),
            name: "hello".into(),
            owner_uid: uid.clone(),
            cluster_local: false,
            groups: Vec::new(),
            remove_headers: Vec::new(),
            tls: vec![Tls {
                hosts: vec!["hello.default.example.com".into()],
                secret_namespace: "default".into(),
                secret_name: cert.spec.secret_name.clone(),
            }],
        }
    })[0];
    assert_eq!(listener, &serde_json::to_value(want).unwrap());
    let rg: ReferenceGrant = serde_json::from_value(gw_api[1].clone()).unwrap();
    whole(&gw_api[1], serde_json::to_value(&rg).unwrap());
    let hr: HTTPRoute = serde_json::from_value(gw_api[2].clone()).unwrap();
    whole(&gw_api[2], serde_json::to_value(&hr).unwrap());
}
