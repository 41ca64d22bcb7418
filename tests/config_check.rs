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
    assert_eq!(v["stable-window"], 60);
    assert_eq!(v["container-concurrency-target-percentage"], 70);
    assert_eq!(v["scale-to-zero-grace-period"], 30);
    assert_eq!(v["revision-timeout-seconds"], 300);
    assert_eq!(v["queue-depth"], 10000);
    assert_eq!(v["_non_default"], serde_json::json!([]));
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
    assert_eq!(v["retain-since-create-time"], 48 * 3600);
    assert_eq!(v["retain-since-last-active-time"], 15 * 3600);
    assert_eq!(v["min-non-active-revisions"], 20);
    assert_eq!(v["max-non-active-revisions"], 1000);
    assert_eq!(v["_non_default"], serde_json::json!([]));
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
    assert_eq!(v["errors"][0]["file"], gc.as_str());
    assert_eq!(v["errors"][0]["key"], "min-non-active-revisions");
    assert_eq!(v["errors"][1]["file"], cm.as_str());
    assert_eq!(v["errors"][1]["reason"], "must be in [6s, 1h]");
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
    assert_eq!(v["domain-template"], "{{.Name}}.{{.Namespace}}.{{.Domain}}");
    assert_eq!(v["tag-template"], "{{.Tag}}-{{.Name}}");
    assert_eq!(v["_non_default"], serde_json::json!([]));
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
        v["external-gateways"],
        serde_json::json!(["knative-serving/knative-ingress-gateway"])
    );
    assert_eq!(v["_non_default"], serde_json::json!([]));
    let (code, _, err) = thaw(&["config", "check", "config/config-domain.yaml"]);
    assert_eq!(code, 0, "{err}");
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
/// comment above it; a value that is no flag is refused naming the key.
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
    assert_eq!(v["_non_default"], serde_json::json!([]));
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
    let (code, _, err) = thaw(&["config", "check", &bad]);
    assert_eq!(code, 1);
    assert!(err.contains("kubernetes.podspec-hostnetwork"), "{err}");
    assert!(
        err.contains("expected enabled, allowed or disabled"),
        "{err}"
    );
}
