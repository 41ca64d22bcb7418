//! `thaw config check` as operators run it: the real binary on real files.

use std::path::Path;
use std::process::Command;

fn thaw(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run thaw");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `--output json`'s settings of the ConfigMap `name`: its values, after checking the shape
/// every report has (`ok`, `errors`, `warnings`, `settings`) and that every value is the
/// default.
fn defaults_of<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v:#}");
    assert!(v["warnings"].is_array(), "{v:#}");
    let s = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["configMap"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v:#}"));
    assert_eq!(s["nonDefault"], serde_json::json!([]), "{v:#}");
    &s["values"]
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn shipped_autoscaler_config_is_valid_and_all_default() {
    let (code, out, err) = thaw(&["config", "check", "config/config-autoscaler.yaml"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<_> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 20, "every config-autoscaler key:\n{out}");
    for l in &lines {
        assert!(l.contains(" default "), "not a default: {l}");
    }
    assert!(out.contains("stable-window") && out.contains("60s"));
}

#[test]
fn json_output_uses_knative_names_and_units() {
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-autoscaler.yaml",
        "config/config-defaults.yaml",
        "config/config-activator.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let a = defaults_of(&v, "config-autoscaler");
    assert_eq!(a["stable-window"], 60);
    assert_eq!(a["container-concurrency-target-percentage"], 70);
    assert_eq!(a["scale-to-zero-grace-period"], 30);
    assert_eq!(
        defaults_of(&v, "config-defaults")["revision-timeout-seconds"],
        300
    );
    assert_eq!(defaults_of(&v, "config-activator")["queue-depth"], 10000);
}

#[test]
fn three_bad_keys_exit_1_and_are_all_named() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n  \
         stable-window: \"60\"\n  max-scale-up-rate: \"0.5\"\n  panic-threshold-percentage: \"50\"\n  \
         min-scale: \"2\"\n  unknown-thing: \"1\"\n",
    );
    let (code, out, err) = thaw(&["config", "check", &f]);
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    let problems: Vec<_> = err.lines().filter(|l| !l.starts_with("warning:")).collect();
    assert_eq!(
        problems,
        [
            format!("{f}: max-scale-up-rate: 0.5: must be greater than 1.0"),
            format!("{f}: panic-threshold-percentage: 50: must be in [110, 1000]"),
            format!(
                "{f}: stable-window: 60: not a duration (a number with a unit: ns, us, ms, s, m \
                 or h, e.g. 60s); missing unit"
            ),
        ]
    );
    assert!(err.contains("warning: ") && err.contains("unknown-thing: unknown key, ignored"));
}

#[test]
fn set_values_are_marked_and_files_recognised_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "whatever-name.yaml",
        "kind: ConfigMap\nmetadata:\n  name: config-defaults\ndata:\n  revision-timeout-seconds: \"120\"\n",
    );
    let (code, out, err) = thaw(&["config", "check", &f]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("revision-timeout-seconds"))
        .unwrap();
    assert!(line.contains("120") && line.contains(" set "), "{line}");
}

#[test]
fn malformed_yaml_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "broken.yaml",
        "kind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n  stable-window: [60s\n",
    );
    let (code, _, err) = thaw(&["config", "check", &f]);
    assert_eq!(code, 1);
    assert!(err.contains(&f) && err.contains("line "), "{err}");
}

#[test]
fn checks_local_yaml_too() {
    // A file of the test's own: config/local.yaml is the users' to edit.
    let dir = tempfile::tempdir().unwrap();
    let ok = write(
        dir.path(),
        "local.yaml",
        "services:\n  - metadata: {name: hello}\n    spec:\n      template:\n        spec:\n          \
         containers: [{command: [thaw, sample-app]}]\n",
    );
    let (code, out, err) = thaw(&["config", "check", &ok]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("default/hello host=hello.default.example.com revision=hello-00001"),
        "{out}"
    );

    let f = write(
        dir.path(),
        "local.yaml",
        "services:\n  - metadata: {name: hello}\n    spec:\n      template:\n        spec:\n          \
         containers: [{command: [thaw, sample-app], ports: [{name: grpc}]}]\n",
    );
    let (code, _, err) = thaw(&["config", "check", &f]);
    assert_eq!(code, 1);
    assert!(
        err.contains("services[0].spec.template.spec.containers[0].ports[0].name: grpc: must be"),
        "{err}"
    );
}

#[test]
fn shipped_gc_config_is_knatives_defaults() {
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-gc.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v = defaults_of(&v, "config-gc");
    assert_eq!(v["retain-since-create-time"], 48 * 3600);
    assert_eq!(v["retain-since-last-active-time"], 15 * 3600);
    assert_eq!(v["min-non-active-revisions"], 20);
    assert_eq!(v["max-non-active-revisions"], 1000);
}

/// With several files, every problem names its file (a ConfigMap reached through local.yaml
/// names the ConfigMap's file); `--output json` prints them on stdout too; exit code 1.
#[test]
fn every_problem_of_several_files_names_its_file_and_json_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let cm = write(
        dir.path(),
        "as.yaml",
        "kind: ConfigMap\nmetadata: {name: config-autoscaler}\ndata: {stable-window: \"1s\"}\n",
    );
    let gc = write(
        dir.path(),
        "gc.yaml",
        "kind: ConfigMap\nmetadata: {name: config-gc}\ndata: {min-non-active-revisions: \"-1\"}\n",
    );
    let local = write(
        dir.path(),
        "local.yaml",
        "configMaps: {autoscaler: as.yaml}\nservices: []\n",
    );
    let (code, out, err) = thaw(&["config", "check", "--output", "json", &gc, &local]);
    assert_eq!(code, 1, "{err}");
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!("{gc}: min-non-active-revisions: -1: ")),
        "{err}"
    );
    assert!(
        lines[1].starts_with(&format!("{cm}: stable-window: 1s: ")),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"][0]["file"], gc.as_str());
    assert_eq!(v["errors"][0]["key"], "min-non-active-revisions");
    assert_eq!(v["errors"][0]["value"], "-1");
    assert_eq!(v["errors"][1]["file"], cm.as_str());
    assert_eq!(v["errors"][1]["value"], "1s");
    assert_eq!(v["errors"][1]["reason"], "must be in [6s, 1h]");
    assert_eq!(v["settings"], serde_json::json!([]));
}

/// One shape for `--output json` whatever the outcome: a valid file's settings are listed
/// beside another file's errors, and an error in local.yaml carries the value found (not only
/// the reason), as the text line does once.
#[test]
fn json_has_one_shape_and_every_error_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let local = write(
        dir.path(),
        "local.yaml",
        "services:\n  - metadata: {name: hello}\n    spec:\n      template:\n        spec:\n          \
         containerConcurrency: lots\n          containers: [{command: [x], colour: red}]\n",
    );
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        &local,
        "config/config-gc.yaml",
    ]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["errors", "ok", "settings", "warnings"], "{v:#}");
    assert_eq!(v["ok"], false);
    let errors = v["errors"].as_array().unwrap();
    let cc = errors
        .iter()
        .find(|e| e["key"] == "services[0].spec.template.spec.containerConcurrency")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(cc["value"], "lots", "{v:#}");
    assert_eq!(cc["reason"], "expected a whole number ≥ 0, got \"lots\"");
    let colour = errors
        .iter()
        .find(|e| e["key"] == "services[0].spec.template.spec.containers[0].colour")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(colour["value"], "red", "{v:#}");
    // The text line names the value once.
    assert!(
        err.contains(
            "services[0].spec.template.spec.containerConcurrency: expected a whole number ≥ 0, \
             got \"lots\"\n"
        ),
        "{err}"
    );
    assert!(
        err.contains("services[0].spec.template.spec.containers[0].colour: red: unknown field"),
        "{err}"
    );
    assert_eq!(v["settings"][0]["configMap"], "config-gc", "{v:#}");
    assert_eq!(v["settings"][0]["values"]["min-non-active-revisions"], 20);
}

/// Exit codes are the same for every subcommand and documented in --help: 2 for usage.
#[test]
fn exit_codes_are_documented_and_usage_errors_exit_2() {
    let (code, out, _) = thaw(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("Exit codes") && out.contains("2  usage"),
        "{out}"
    );
    for args in [
        &["config", "check"][..],
        &["config", "check", "--output", "yaml", "x"],
        &["local", "--listen", "nowhere"],
        &["simulate"],
        &["frobnicate"],
    ] {
        let (code, _, err) = thaw(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    let (code, _, err) = thaw(&["simulate", "--trace", "/nonexistent.csv"]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn shipped_network_configs_are_knatives_defaults() {
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-network.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v = defaults_of(&v, "config-network");
    assert_eq!(v["domain-template"], "{{.Name}}.{{.Namespace}}.{{.Domain}}");
    assert_eq!(v["tag-template"], "{{.Tag}}-{{.Name}}");
    assert_eq!(v["ingress-class"], "istio.ingress.networking.knative.dev");
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-istio.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        defaults_of(&v, "config-istio")["external-gateways"],
        serde_json::json!(["knative-serving/knative-ingress-gateway"])
    );
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-gateway.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        defaults_of(&v, "config-gateway")["local-gateways"],
        serde_json::json!(["istio-system/knative-local-gateway"])
    );
    // A class thaw does not write is refused, naming the key.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config-network.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-network\ndata:\n  \
         ingress-class: kourier.ingress.networking.knative.dev\n",
    )
    .unwrap();
    let (code, out, err) = thaw(&["config", "check", bad.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("ingress-class") || out.contains("ingress-class"),
        "{out}{err}"
    );
    // config-domain's keys are the domains: shown as one entry, `domains`.
    let (code, out, err) = thaw(&["config", "check", "config/config-domain.yaml"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("domains"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("example.com") && line.contains(" default "),
        "{line}"
    );
    let dir = tempfile::tempdir().unwrap();
    let domains = write(
        dir.path(),
        "domain.yaml",
        "kind: ConfigMap\nmetadata: {name: config-domain}\ndata:\n  example.org: \"\"\n  \
         internal.example.org: \"selector:\\n  app: internal\\n\"\n",
    );
    let (code, out, err) = thaw(&["config", "check", "--output", "json", &domains]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["settings"][0]["values"]["domains"],
        serde_json::json!({"example.org": {}, "internal.example.org": {"app": "internal"}}),
        "{v:#}"
    );
    assert_eq!(
        v["settings"][0]["nonDefault"],
        serde_json::json!(["domains"])
    );
    // A template with an action Knative's templates do not offer is named with its key.
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "net.yaml",
        "kind: ConfigMap\nmetadata: {name: config-network}\ndata: {domain-template: \"{{.Name}}.{{.Foo}}\"}\n",
    );
    let (code, _, err) = thaw(&["config", "check", &bad]);
    assert_eq!(code, 1);
    assert!(err.contains("domain-template"), "{err}");
    assert!(err.contains("unsupported template action"), "{err}");
}

/// config/config-features.yaml sets every key thaw reads, each at Knative's default, with a
/// comment above it; a value that is no flag keeps the key's default, as Knative, and is named
/// (exit 1 only with `--strict`).
#[test]
fn shipped_features_config_documents_every_key_at_knatives_default() {
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-features.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("unknown key"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v = defaults_of(&v, "config-features");
    assert_eq!(v["kubernetes.podspec-volumes-emptydir"], "enabled");
    assert_eq!(v["kubernetes.podspec-hostnetwork"], "disabled");
    let text = std::fs::read_to_string("config/config-features.yaml").unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for k in thaw::config::features::KEYS {
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with(&format!("{}:", k.name)))
            .unwrap_or_else(|| panic!("{} is not in config/config-features.yaml", k.name));
        assert!(
            lines[at - 1].trim_start().starts_with('#'),
            "{} has no comment above it",
            k.name
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "features.yaml",
        "kind: ConfigMap\nmetadata: {name: config-features}\ndata: {kubernetes.podspec-hostnetwork: \"yes\"}\n",
    );
    let (code, out, err) = thaw(&["config", "check", "--output", "json", &bad]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: ") && err.contains("kubernetes.podspec-hostnetwork: \"yes\""),
        "{err}"
    );
    assert!(
        err.contains("expected enabled, allowed or disabled"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["settings"][0]["values"]["kubernetes.podspec-hostnetwork"], "disabled",
        "the default stays: {v:#}"
    );
    let (code, _, err) = thaw(&["config", "check", "--strict", &bad]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--strict: 1 key(s) with no effect"), "{err}");
}

/// The one rule for keys: an unknown key, a Knative key thaw does not implement and an unknown
/// flag value are accepted and named (`warning:` lines, exit 0; exit 1 with `--strict`, and
/// `ok: false` in JSON then); an invalid value of an implemented key fails with or without it.
#[test]
fn keys_without_effect_fail_only_with_strict_and_invalid_values_always() {
    let dir = tempfile::tempdir().unwrap();
    let inert = write(
        dir.path(),
        "deployment.yaml",
        "kind: ConfigMap\nmetadata: {name: config-deployment}\ndata:\n  digest-resolution-timeout: 10s\n  progress-deadline: 300s\n  nope: x\n",
    );
    let (code, out, err) = thaw(&["config", "check", &inert]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("progress-deadline"), "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(warnings[0].contains("digest-resolution-timeout: known Knative key with no effect"));
    assert!(warnings[1].contains("nope: unknown key"));
    let (code, out, err) = thaw(&["config", "check", "--strict", "--output", "json", &inert]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], false, "{v:#}");
    assert_eq!(v["errors"], serde_json::json!([]), "{v:#}");
    assert_eq!(v["warnings"].as_array().unwrap().len(), 2, "{v:#}");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "kind: ConfigMap\nmetadata: {name: config-deployment}\ndata:\n  progress-deadline: soon\n  nope: x\n",
    );
    for args in [
        &["config", "check", &bad][..],
        &["config", "check", "--strict", &bad],
    ] {
        let (code, _, err) = thaw(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("progress-deadline: soon"), "{err}");
    }
}

/// config/config-certmanager.yaml is net-certmanager's default issuer; a bad `issuerRef` is
/// refused naming the key; Knative's other issuer keys are warned about.
#[test]
fn shipped_certmanager_config_and_a_bad_issuer_ref() {
    let (code, out, err) = thaw(&[
        "config",
        "check",
        "--output",
        "json",
        "config/config-certmanager.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        defaults_of(&v, "config-certmanager")["issuerRef"],
        serde_json::json!({"kind": "ClusterIssuer", "name": "knative-selfsigned-issuer"})
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "cm.yaml",
        "kind: ConfigMap\nmetadata: {name: config-certmanager}\ndata:\n  issuerRef: \"kind: Secret\\nname: x\\n\"\n  systemInternalIssuerRef: \"kind: ClusterIssuer\\nname: y\\n\"\n",
    );
    let (code, _, err) = thaw(&["config", "check", &bad]);
    assert_eq!(code, 1);
    assert!(
        err.contains("issuerRef") && err.contains("not Issuer or ClusterIssuer"),
        "{err}"
    );
    let ok = write(
        dir.path(),
        "ok.yaml",
        "kind: ConfigMap\nmetadata: {name: config-certmanager}\ndata:\n  issuerRef: \"kind: Issuer\\nname: letsencrypt\\n\"\n  systemInternalIssuerRef: \"kind: ClusterIssuer\\nname: y\\n\"\n",
    );
    let (code, out, err) = thaw(&["config", "check", &ok]);
    assert_eq!(code, 0, "{err}");
    assert!(
        format!("{out}{err}").contains("systemInternalIssuerRef"),
        "{out}{err}"
    );
}
