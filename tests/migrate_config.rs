//! `thaw migrate config` as an operator moving from Knative Serving runs it: the real binary on
//! Knative v1.15's own ConfigMaps (tests/fixtures/knative-v1.15, README there says where from),
//! from files and from a cluster (the in-process API server), and the stream it writes checked
//! by `thaw config check` — the same rule for keys on both sides.

mod kube_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const FIXTURES: &str = "tests/fixtures/knative-v1.15";

fn thaw(args: &[&str], kubeconfig: Option<&Path>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    let out = cmd.output().expect("run thaw");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Every fixture file, sorted.
fn fixtures() -> Vec<String> {
    let mut files: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .map(|p| format!("{FIXTURES}/{}", p.file_name().unwrap().to_string_lossy()))
            .collect();
    files.sort();
    files
}

/// Writes each document of a YAML stream to its own file in `dir` (`config check` reads one
/// ConfigMap per file), named by the ConfigMap.
fn split_stream(stream: &str, dir: &Path) -> Vec<String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(stream).unwrap();
    docs.iter()
        .map(|d| {
            let name = d["metadata"]["name"].as_str().unwrap();
            let p = dir.join(format!("{name}.yaml"));
            std::fs::write(&p, serde_saphyr::to_string(d).unwrap()).unwrap();
            p.display().to_string()
        })
        .collect()
}

/// `(config map, key)` of every `warning:` line of `config check`: `warning: FILE: KEY: WHY`
/// for a file named by its ConfigMap, `warning: FILE (CONFIG-MAP): KEY: WHY` in a stream.
fn check_warnings(err: &str) -> BTreeSet<(String, String)> {
    err.lines()
        .filter_map(|l| l.strip_prefix("warning: "))
        .map(|l| {
            let mut parts = l.splitn(3, ": ");
            let file = parts.next().unwrap();
            let key = parts.next().unwrap();
            let cm = match file.rsplit_once(" (") {
                Some((_, name)) => name.trim_end_matches(')').to_string(),
                None => Path::new(file)
                    .file_stem()
                    .unwrap()
                    .to_string_lossy()
                    .to_string(),
            };
            (cm, key.to_string())
        })
        .collect()
}

/// `(config map, key)` of every note of `migrate config --output json` saying a key has no
/// effect in thaw.
fn no_effect_notes(v: &Value) -> BTreeSet<(String, String)> {
    v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            let m = n["message"].as_str().unwrap();
            n["key"].is_string() && !m.starts_with("read as ") && !m.contains("not carried over")
        })
        .map(|n| {
            (
                n["configMap"].as_str().unwrap().to_string(),
                n["key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Migrates `files`, checks the stream with `config check` (exit 0, every ConfigMap thaw
/// reads), and returns the migration's JSON and the check's JSON.
fn migrate_and_check(files: &[String]) -> (Value, Value, String) {
    let mut args = vec!["migrate", "config"];
    args.extend(files.iter().map(String::as_str));
    let (code, stream, notes) = thaw(&args, None);
    assert_eq!(code, 0, "{notes}");
    let mut json_args = args.clone();
    json_args.extend(["--output", "json"]);
    let (code, out, _) = thaw(&json_args, None);
    assert_eq!(code, 0);
    let migration: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(migration["ok"], true, "{migration:#}");
    let streamed: Vec<Value> = serde_saphyr::from_multiple(&stream).unwrap();
    assert_eq!(
        Value::from(streamed),
        migration["configMaps"],
        "the stream and the JSON carry the same ConfigMaps"
    );
    // The stream as written, and each ConfigMap on its own, check clean, with the same
    // warnings: the keys migrate named as having no effect.
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("thaw-config.yaml");
    std::fs::write(&whole, &stream).unwrap();
    let (code, out, err) = thaw(
        &[
            "config",
            "check",
            "--output",
            "json",
            whole.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "thaw config check of the migrated stream:\n{err}");
    let checked: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        check_warnings(&err),
        no_effect_notes(&migration),
        "migrate names exactly the keys config check warns about"
    );
    let single = tempfile::tempdir().unwrap();
    let written = split_stream(&stream, single.path());
    let mut check = vec!["config", "check", "--output", "json"];
    check.extend(written.iter().map(String::as_str));
    let (code, out, err) = thaw(&check, None);
    assert_eq!(
        code, 0,
        "thaw config check of the migrated ConfigMaps:\n{err}"
    );
    let one_by_one: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(check_warnings(&err), no_effect_notes(&migration));
    let values = |v: &Value| -> Vec<Value> {
        v["settings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json!([s["configMap"], s["values"]]))
            .collect()
    };
    assert_eq!(values(&checked), values(&one_by_one));
    (migration, checked, notes)
}

/// Knative v1.15's ConfigMaps as its release ships them, with net-istio's config-istio in the
/// older per-gateway form: every one thaw reads is written to thaw-system, the others are
/// named whole, Knative's queue-proxy image is not carried over, and the older gateway keys
/// are read as the gateways they name.
#[test]
fn knative_v1_15_config_maps_migrate_to_ones_thaw_checks_clean() {
    let (migration, checked, notes) = migrate_and_check(&fixtures());
    for cm in migration["configMaps"].as_array().unwrap() {
        assert_eq!(cm["metadata"]["namespace"], "thaw-system", "{cm:#}");
        assert!(cm["data"].get("_example").is_none(), "{cm:#}");
    }
    let written: BTreeSet<&str> = migration["configMaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        written,
        BTreeSet::from([
            "config-autoscaler",
            "config-certmanager",
            "config-defaults",
            "config-deployment",
            "config-domain",
            "config-features",
            "config-gateway",
            "config-gc",
            "config-istio",
            "config-leader-election",
            "config-network",
        ])
    );
    for unread in ["config-logging", "config-observability", "config-tracing"] {
        assert!(
            notes.contains(&format!(
                "{unread}: a ConfigMap thaw does not read; not carried over"
            )),
            "{notes}"
        );
    }
    assert!(
        notes.contains(
            "config-deployment: queue-sidecar-image: Knative's queue-proxy image, not carried over"
        ),
        "{notes}"
    );
    assert!(
        notes.contains(
            "config-istio: gateway.knative-serving.knative-ingress-gateway: read as external-gateways"
        ),
        "{notes}"
    );
    assert!(
        notes.contains(
            "config-istio: local-gateway.knative-serving.knative-local-gateway: read as local-gateways"
        ),
        "{notes}"
    );
    assert!(
        notes.contains(
            "config-istio: enable-virtualservice-status: known Knative key with no effect in thaw"
        ),
        "{notes}"
    );
    let istio = checked["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["configMap"] == "config-istio")
        .unwrap();
    assert_eq!(
        istio["values"]["external-gateways"],
        json!(["knative-serving/knative-ingress-gateway"])
    );
    assert_eq!(
        istio["values"]["local-gateways"],
        json!(["knative-serving/knative-local-gateway"])
    );
}

/// Each key Knative documents in its ConfigMaps' `_example` blocks, set to the value given
/// there (as an operator uncommenting all of them would): every one migrates, and the result
/// checks clean — each key is either read by thaw (and Knative's documented value is valid for
/// it) or named as having no effect.
#[test]
fn every_key_knative_documents_is_read_or_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut edited = Vec::new();
    let mut documented = 0;
    for f in fixtures() {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&f)).unwrap();
        let mut cm: Value = serde_saphyr::from_str(&text).unwrap();
        let example = cm["data"]["_example"].as_str().unwrap_or("").to_string();
        let keys: BTreeMap<String, Value> = serde_saphyr::from_str(&example).unwrap_or_default();
        let data = cm["data"].as_object_mut().unwrap();
        for (k, v) in keys {
            let text = match v {
                Value::String(s) => s,
                Value::Null => String::new(),
                Value::Object(_) | Value::Array(_) => serde_saphyr::to_string(&v).unwrap(),
                other => other.to_string(),
            };
            documented += 1;
            data.insert(k, Value::from(text));
        }
        let p: PathBuf = dir.path().join(Path::new(&f).file_name().unwrap());
        std::fs::write(&p, serde_saphyr::to_string(&cm).unwrap()).unwrap();
        edited.push(p.display().to_string());
    }
    assert!(
        documented > 100,
        "Knative documents more keys than {documented}"
    );
    let (migration, _, notes) = migrate_and_check(&edited);
    let carried: usize = migration["configMaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["data"].as_object().unwrap().len())
        .sum();
    eprintln!("{documented} keys documented, {carried} carried over; notes:\n{notes}");
    assert!(carried > 100, "{carried} keys carried over");
    // The keys thaw reads of Knative's config-autoscaler all carried over with their values.
    let autoscaler = migration["configMaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metadata"]["name"] == "config-autoscaler")
        .unwrap();
    assert_eq!(autoscaler["data"]["stable-window"], "60s", "{autoscaler:#}");
    assert!(
        !notes.contains("config-autoscaler: stable-window"),
        "{notes}"
    );
    // Every key named is a Knative key thaw knows of: none is unknown to it.
    assert!(!notes.contains("unknown key"), "{notes}");
}

/// `--from-cluster` reads the `config-*` ConfigMaps of knative-serving through a kubeconfig,
/// as the roles' client does, and leaves the others (kube-root-ca.crt) alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_cluster_reads_knative_serving() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ObjectMeta, PostParams};
    let api = kube_support::TestApi::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), "knative-serving");
    let cm = |name: &str, data: &[(&str, &str)]| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("knative-serving".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ConfigMap::default()
    };
    for c in [
        cm(
            "config-istio",
            &[("gateway.edge.public", "public-gw.edge.svc.cluster.local")],
        ),
        cm(
            "config-autoscaler",
            &[("_example", "docs"), ("stable-window", "90s")],
        ),
        cm("config-tracing", &[("backend", "zipkin")]),
        cm("kube-root-ca.crt", &[("ca.crt", "---")]),
    ] {
        cms.create(&PostParams::default(), &c).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    kube_support::write_kubeconfig(&kubeconfig, api.addr(), "default");
    let k = kubeconfig.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        thaw(
            &["migrate", "config", "--from-cluster", "--output", "json"],
            Some(&k),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let written: Vec<(&str, &Value)> = v["configMaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["metadata"]["name"].as_str().unwrap(), &c["data"]))
        .collect();
    assert_eq!(
        written,
        [
            ("config-autoscaler", &json!({"stable-window": "90s"})),
            (
                "config-istio",
                &json!({"gateway.edge.public": "public-gw.edge.svc.cluster.local"})
            ),
        ]
    );
    assert_eq!(
        v["configMaps"][0]["metadata"]["annotations"]["thaw.dev/migrated-from"],
        "knative-serving/config-autoscaler"
    );
    assert!(
        err.contains("config-istio: gateway.edge.public: read as external-gateways"),
        "{err}"
    );
    assert!(
        err.contains("config-tracing: a ConfigMap thaw does not read"),
        "{err}"
    );
    assert!(!err.contains("kube-root-ca.crt"), "{err}");
    // Another namespace is read with --knative-namespace; an empty one gives an empty stream.
    let k = kubeconfig.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        thaw(
            &[
                "migrate",
                "config",
                "--from-cluster",
                "--knative-namespace",
                "elsewhere",
            ],
            Some(&k),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "", "{out}");
    api.stop().await;
}

/// Unreadable input and an invalid value exit 1; files and --from-cluster are exclusive (a
/// usage error, exit 2).
#[test]
fn errors_exit_1_and_usage_errors_exit_2() {
    let (code, _, err) = thaw(&["migrate", "config", "/nonexistent.yaml"], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot read"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("as.yaml");
    std::fs::write(
        &bad,
        "kind: ConfigMap\nmetadata: {name: config-autoscaler, namespace: knative-serving}\n\
         data: {stable-window: 1s}\n",
    )
    .unwrap();
    let (code, out, err) = thaw(&["migrate", "config", bad.to_str().unwrap()], None);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("error: config-autoscaler: stable-window: 1s"),
        "{err}"
    );
    assert!(
        out.contains("stable-window: 1s"),
        "the stream is still written: {out}"
    );
    let (code, _, err) = thaw(&["migrate", "config"], None);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = thaw(
        &["migrate", "config", "--from-cluster", bad.to_str().unwrap()],
        None,
    );
    assert_eq!(code, 2, "{err}");
}
