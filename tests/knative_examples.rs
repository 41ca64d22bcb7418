//! deploy/examples/: every Knative resource passes the controller's validation and survives a
//! round trip through thaw's typed structs with every field it writes (the API server's
//! schema check against deploy/crds/ is tests/deploy_manifests.rs's
//! `custom_resources_pass_their_crd_schemas`, which covers these files too).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use thaw::config::{AutoscalerConfig, DefaultsConfig, FeaturesConfig};
use thaw::knative::validate::{self, render};
use thaw::knative::{Configuration, DomainMapping, Revision, Route, Service};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml") {
            out.push(p);
        }
    }
}

/// Every document of every example, with its file.
fn documents() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&examples_dir(), &mut files);
    files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let name = f
                .strip_prefix(examples_dir())
                .unwrap()
                .display()
                .to_string();
            docs.into_iter().map(move |d| (name.clone(), d))
        })
        .collect()
}

fn kind(d: &Value) -> (&str, &str) {
    (
        d["apiVersion"].as_str().unwrap_or(""),
        d["kind"].as_str().unwrap_or(""),
    )
}

/// Fields the round trip lost or changed. Added fields are allowed only where Knative's Go
/// types read them as unset: a container's empty `name` and a probe's port 0
/// (see `thaw::knative`'s serde conventions).
fn lost(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(vb) => lost(va, vb, &p, out),
                    None => out.push(format!("{p}: dropped")),
                }
            }
            for (k, vb) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
                let zero_name = k == "name" && path.contains("containers[") && vb == "";
                let zero_port = k == "port" && vb == 0;
                if !(zero_name || zero_port) {
                    out.push(format!("{path}.{k}: added as {vb}"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                lost(va, vb, &format!("{path}[{i}]"), out);
            }
        }
        _ if before == after => {}
        _ => out.push(format!("{path}: {before} became {after}")),
    }
}

/// Parses `doc` as `T`, validates it, and returns what its round trip lost.
fn check<T>(doc: &Value, validate: impl Fn(&T) -> Vec<validate::FieldError>) -> Vec<String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(doc.clone()).expect("parses as its type");
    let errors = validate(&typed);
    assert!(errors.is_empty(), "invalid:\n{}", render(&errors));
    let back = serde_json::to_value(&typed).unwrap();
    let mut out = Vec::new();
    lost(doc, &back, "", &mut out);
    out
}

#[test]
fn every_knative_example_is_valid_and_round_trips_whole() {
    let d = DefaultsConfig::default();
    let a = AutoscalerConfig::default();
    let f = FeaturesConfig::default();
    let mut checked = Vec::new();
    for (file, doc) in documents() {
        let (api, k) = kind(&doc);
        if !api.starts_with("serving.knative.dev/") {
            continue;
        }
        let lost = match k {
            "Service" => check::<Service>(&doc, |s| validate::service(s, &d, &a, &f)),
            "Configuration" => {
                check::<Configuration>(&doc, |c| validate::configuration(c, &d, &a, &f))
            }
            "Revision" => check::<Revision>(&doc, |r| validate::revision(r, &d, &a, &f)),
            "Route" => check::<Route>(&doc, validate::route),
            "DomainMapping" => check::<DomainMapping>(&doc, |_: &DomainMapping| Vec::new()),
            other => panic!("{file}: no typed struct for {other}"),
        };
        assert!(
            lost.is_empty(),
            "{file} {k}: the round trip lost\n{}",
            lost.join("\n")
        );
        checked.push(format!("{file} {k}"));
    }
    for want in [
        "knative/helloworld.yaml Service",
        "knative/traffic-split.yaml Service",
        "knative/tagged-revision.yaml Route",
        "knative/domainmapping.yaml DomainMapping",
    ] {
        assert!(
            checked.iter().any(|c| c == want),
            "{want} not checked: {checked:?}"
        );
    }
}

#[test]
fn the_helloworld_service_has_what_the_issue_names_and_keeps_every_container_field() {
    let docs = documents();
    let (_, doc) = docs
        .iter()
        .find(|(f, _)| f == "knative/helloworld.yaml")
        .expect("deploy/examples/knative/helloworld.yaml");
    let tpl = &doc["spec"]["template"];
    assert!(tpl["spec"]["containerConcurrency"].is_i64());
    assert!(
        tpl["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("autoscaling.knative.dev/"))
    );
    let traffic = doc["spec"]["traffic"].as_array().unwrap();
    assert!(traffic.iter().any(|t| t["latestRevision"] == true));
    assert!(traffic.iter().filter(|t| t["tag"].is_string()).count() >= 2);

    // Typed and back: each field the user wrote on the container is there, unchanged (a
    // probe's unset port comes back as Knative's zero value, 0).
    let svc: Service = serde_json::from_value(doc.clone()).unwrap();
    let back = serde_json::to_value(&svc).unwrap();
    let written = tpl["spec"]["containers"][0].as_object().unwrap();
    let kept = &back["spec"]["template"]["spec"]["containers"][0];
    assert!(written.len() >= 5, "{written:?}");
    // The typed pod spec is what the Deployment gets: it holds them too.
    let pod = serde_json::to_value(&svc.spec.configuration.template.spec.pod_spec).unwrap();
    for (field, value) in written {
        for (what, got) in [
            ("round trip", &kept[field]),
            ("pod spec", &pod["containers"][0][field]),
        ] {
            let mut out = Vec::new();
            lost(value, got, &format!("containers[0].{field}"), &mut out);
            assert!(out.is_empty(), "{what}: {out:?}");
        }
    }
    assert_eq!(
        kept["env"],
        json!([{"name": "TARGET", "value": "Go Sample v1"}])
    );
}

#[test]
fn the_split_and_the_gateway() {
    let docs = documents();
    let split = &docs
        .iter()
        .find(|(f, _)| f == "knative/traffic-split.yaml")
        .unwrap()
        .1;
    let shares: Vec<i64> = split["spec"]["traffic"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["percent"].as_i64().unwrap())
        .collect();
    assert_eq!(shares, [50, 50]);
    let gw = &docs
        .iter()
        .find(|(f, _)| f == "knative/gateway.yaml")
        .unwrap()
        .1;
    assert_eq!(kind(gw), ("networking.istio.io/v1", "Gateway"));
    assert_eq!(gw["spec"]["servers"][0]["port"]["number"], 80);
}

#[test]
fn the_round_trip_check_sees_a_lost_field() {
    let doc = serde_json::json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Route",
        "metadata": {"name": "r"},
        "spec": {"traffic": [{"configurationName": "c", "percent": 100, "weight": 3}]}
    });
    assert_eq!(
        check::<Route>(&doc, validate::route),
        [".spec.traffic[0].weight: dropped"]
    );
}
