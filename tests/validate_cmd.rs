//! `thaw validate` as an operator runs it before an upgrade: `kubectl get ... -o yaml` piped in
//! (a `List`), checked under a `config-features` file; every object the controller would refuse
//! is named with its problems, and the exit code says whether there was one.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `thaw validate args...` with `stdin`; exit code, stdout, stderr.
fn validate(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .arg("validate")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What `kubectl get revisions,ksvc -A -o yaml` prints for three objects: a plain revision, one
/// on the node's network, and a Service whose template adds SYS_ADMIN; and a Deployment, which
/// is not checked.
const LIST: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: serving.knative.dev/v1
  kind: Revision
  metadata: {name: plain-00001, namespace: team-a}
  spec:
    containers: [{image: registry.example/app}]
- apiVersion: serving.knative.dev/v1
  kind: Revision
  metadata: {name: sniffer-00001, namespace: team-b}
  spec:
    hostNetwork: true
    containers: [{image: registry.example/sniffer}]
- apiVersion: serving.knative.dev/v1
  kind: Service
  metadata: {name: admin, namespace: team-b}
  spec:
    template:
      spec:
        containers:
        - image: registry.example/admin
          securityContext: {capabilities: {add: [SYS_ADMIN]}}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: other, namespace: team-a}
  spec: {hostNetwork: true}
"#;

#[test]
fn lists_every_object_the_controller_would_refuse() {
    let (code, out, err) = validate(&["-"], LIST);
    assert_eq!(code, 1, "{out}{err}");
    assert!(!out.contains("plain-00001"), "{out}");
    assert!(!out.contains("Deployment"), "{out}");
    assert!(
        out.contains(
            "Revision team-b/sniffer-00001:\n  must not set the field(s): spec.hostNetwork\n  \
             closed by config-features; \"kubernetes.podspec-hostnetwork: enabled\""
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "Service team-b/admin:\n  must not set the field(s): \
             spec.template.spec.containers[0].securityContext.capabilities.add"
        ),
        "{out}"
    );
}

#[test]
fn the_config_features_file_in_force_opens_what_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let features = dir.path().join("config-features.yaml");
    std::fs::write(
        &features,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-features}\ndata:\n  \
         kubernetes.podspec-hostnetwork: enabled\n  kubernetes.containerspec-addcapabilities: allowed\n",
    )
    .unwrap();
    let (code, out, err) = validate(&["--features", features.to_str().unwrap(), "-"], LIST);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");

    // A file that is not config-features, or an unreadable input, is an error naming it.
    let (code, _, err) = validate(&["--features", "config/config-gc.yaml", "-"], LIST);
    assert_eq!(code, 1);
    assert!(
        err.contains("expected the config-features ConfigMap"),
        "{err}"
    );
    let (code, _, err) = validate(&["/nonexistent.yaml"], "");
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent.yaml"), "{err}");
}
