//! `local.yaml`: the services `thaw local` runs, in the shape of Knative's Service, with a
//! command instead of an image.
//!
//! ```yaml
//! domain: example.com                 # hosts are {service}.{namespace}.{domain}
//! configMaps:                         # paths relative to this file's folder
//!   autoscaler: config-autoscaler.yaml
//!   defaults: config-defaults.yaml    # optional
//!   activator: config-activator.yaml  # optional
//!   gc: config-gc.yaml                # optional: Knative's revision garbage collection
//! services:
//!   - apiVersion: serving.knative.dev/v1
//!     kind: Service
//!     metadata: {name: hello, namespace: default}
//!     spec:
//!       template:
//!         metadata:
//!           annotations: {autoscaling.knative.dev/window: "10s"}
//!         spec:
//!           containerConcurrency: 0
//!           containers:
//!             - command: [thaw, sample-app]   # first word `thaw` = this executable
//!               args: []
//!               env: [{name: TARGET, value: thaw}]
//!               ports: [{name: http1}]        # h2c = HTTP/2 cleartext
//!               readinessProbe: {httpGet: {path: /healthz}}   # optional; else TCP connect
//! ```
//!
//! Unknown fields are errors (naming the field's path), so a typo cannot silently fall back to a
//! default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::parse::{Problem, Problems};

/// The parsed file, before validation against the ConfigMaps.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalFile {
    /// The domain of route hosts.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// ConfigMap manifests, relative to the file's folder.
    #[serde(default)]
    pub config_maps: ConfigMapPaths,
    #[serde(default)]
    pub services: Vec<Service>,
}

fn default_domain() -> String {
    "example.com".into()
}

/// Where the ConfigMaps live. Absent ones take every key's default.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMapPaths {
    pub autoscaler: Option<PathBuf>,
    pub defaults: Option<PathBuf>,
    pub activator: Option<PathBuf>,
    pub gc: Option<PathBuf>,
}

/// A Knative Service (serving.knative.dev/v1), as far as local mode needs it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Service {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub metadata: ObjectMeta,
    pub spec: ServiceSpec,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

fn default_namespace() -> String {
    "default".into()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    pub template: RevisionTemplate,
}

/// The revision template: editing it creates the service's next revision.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevisionTemplate {
    #[serde(default)]
    pub metadata: TemplateMeta,
    pub spec: TemplateSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateMeta {
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TemplateSpec {
    pub container_concurrency: Option<u32>,
    pub timeout_seconds: Option<u64>,
    pub response_start_timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub containers: Vec<Container>,
}

/// The one container of a revision: a local command.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Container {
    pub name: Option<String>,
    /// Program and leading arguments; a first word `thaw` runs the current thaw executable.
    pub command: Vec<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub ports: Vec<Port>,
    pub readiness_probe: Option<Probe>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// The container's port: `h2c` as the name selects HTTP/2 cleartext; `containerPort` is the
/// `PORT` the replica gets (a free port when absent, or when another replica holds it).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Port {
    pub name: Option<String>,
    pub container_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Probe {
    pub http_get: Option<HttpGet>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpGet {
    #[serde(default = "root_path")]
    pub path: String,
}

fn root_path() -> String {
    "/".into()
}

/// The built-in demo services (`src/local/builtin.yaml`), used when no file is given and none
/// is found. Every ConfigMap key takes its default. A file of its own, not `config/local.yaml`,
/// so that editing the file users are told to edit changes neither the binary nor the tests.
pub const BUILTIN: &str = include_str!("builtin.yaml");

/// Parses local.yaml text in two steps: YAML syntax (an error names the line and column), then
/// the shape (an error names the field path, `services[0].spec.template.spec.
/// containerConcurrency: expected a whole number ≥ 0, got "lots"`). `origin` names the input.
pub fn parse(text: &str, origin: &str) -> Result<LocalFile, Problems> {
    let tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!("line {} column {}", l.line(), l.column()))
            .unwrap_or_else(|| "(no position)".into());
        let msg = e.to_string();
        let first = msg.lines().next().unwrap_or("invalid").to_string();
        Problems(vec![Problem::new(
            origin,
            at,
            format!("invalid YAML: {first}"),
        )])
    })?;
    // An empty file is an empty mapping: no services.
    let tree = if tree.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        tree
    };
    let file: LocalFile = serde_path_to_error::deserialize(tree)
        .map_err(|e| Problems(vec![shape_problem(&e.path().to_string(), e.inner())]))?;
    validate(&file).map(|()| file)
}

/// A shape error as an operator reads it: the field path, what was expected in words (no Rust
/// type names) and what was found.
fn shape_problem(path: &str, e: &serde_json::Error) -> Problem {
    let msg = e.to_string();
    let path = if path == "." { "" } else { path };
    let join = |field: &str| {
        if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        }
    };
    if let Some(rest) = msg.strip_prefix("missing field `") {
        let field = rest.split('`').next().unwrap_or(rest);
        return Problem::new(join(field), "", "required, but missing");
    }
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        let (_, known) = rest.split_once("expected ").unwrap_or(("", ""));
        let known = known.trim_start_matches("one of ");
        // serde_path_to_error's path already ends with the unknown field.
        return Problem::new(path, "", format!("unknown field (known here: {known})"));
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(prefix)
            && let Some((got, expected)) = rest.rsplit_once(", expected ")
        {
            return Problem::new(
                path,
                "",
                format!(
                    "expected {}, got {}",
                    expected_words(expected),
                    got_words(got)
                ),
            );
        }
    }
    Problem::new(path, "", msg)
}

/// serde's name of an expected type, in words.
fn expected_words(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a whole number ≥ 0".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list".into(),
        "a map" => "a mapping (key: value)".into(),
        e if e.starts_with("struct ") => "a mapping (key: value)".into(),
        e => e.to_string(),
    }
}

/// serde's description of the value found (`string "lots"`, ``integer `-1` ``), as written.
fn got_words(got: &str) -> String {
    if let Some(s) = got.strip_prefix("string ") {
        return s.to_string();
    }
    for kind in ["integer ", "floating point ", "boolean "] {
        if let Some(v) = got.strip_prefix(kind) {
            return v.trim_matches('`').to_string();
        }
    }
    match got {
        "sequence" => "a list".into(),
        "map" => "a mapping".into(),
        "unit value" | "null" => "nothing (null)".into(),
        g => g.to_string(),
    }
}

/// Reads and parses a local.yaml file.
pub fn read(path: &Path) -> Result<LocalFile, Problems> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Problems(vec![Problem::new(&origin, "", format!("cannot read: {e}"))]))?;
    parse(&text, &origin)
}

/// Whether `s` is a DNS-1035 label of at most `max` characters (Knative's rule for names).
fn dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn validate(f: &LocalFile) -> Result<(), Problems> {
    let mut p = Vec::new();
    if f.domain.is_empty()
        || !f
            .domain
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        p.push(Problem::new(
            "domain",
            &f.domain,
            "must be a DNS name such as example.com",
        ));
    }
    let mut seen = BTreeSet::new();
    // containerPort -> the service that declared it first.
    let mut ports: BTreeMap<u16, String> = BTreeMap::new();
    for (i, s) in f.services.iter().enumerate() {
        let at = format!("services[{i}]");
        if let Some(kind) = &s.kind
            && kind != "Service"
        {
            p.push(Problem::new(format!("{at}.kind"), kind, "must be Service"));
        }
        if let Some(v) = &s.api_version
            && v != "serving.knative.dev/v1"
        {
            p.push(Problem::new(
                format!("{at}.apiVersion"),
                v,
                "must be serving.knative.dev/v1",
            ));
        }
        // Revision names append "-00001": keep the whole name a valid 63-character label.
        if !dns_label(&s.metadata.name, 57) {
            p.push(Problem::new(
                format!("{at}.metadata.name"),
                &s.metadata.name,
                "must be a DNS label: lower-case letters, digits and '-', starting with a letter, \
                 at most 57 characters",
            ));
        }
        if !dns_label(&s.metadata.namespace, 63) {
            p.push(Problem::new(
                format!("{at}.metadata.namespace"),
                &s.metadata.namespace,
                "must be a DNS label",
            ));
        }
        if !seen.insert((&s.metadata.namespace, &s.metadata.name)) {
            p.push(Problem::new(
                format!("{at}.metadata.name"),
                &s.metadata.name,
                format!("duplicate service in namespace {}", s.metadata.namespace),
            ));
        }
        let spec = &s.spec.template.spec;
        if spec.containers.len() != 1 {
            p.push(Problem::new(
                format!("{at}.spec.template.spec.containers"),
                spec.containers.len().to_string(),
                "must hold exactly one container",
            ));
            continue;
        }
        let c = &spec.containers[0];
        let cat = format!("{at}.spec.template.spec.containers[0]");
        if c.command.first().is_none_or(|w| w.trim().is_empty()) {
            p.push(Problem::new(
                format!("{cat}.command"),
                "[]",
                "must name a program",
            ));
        }
        for (j, e) in c.env.iter().enumerate() {
            let ok = !e.name.is_empty()
                && !e.name.starts_with(|ch: char| ch.is_ascii_digit())
                && e.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                p.push(Problem::new(
                    format!("{cat}.env[{j}].name"),
                    &e.name,
                    "not a variable name",
                ));
            } else if e.name == "PORT" {
                p.push(Problem::new(
                    format!("{cat}.env[{j}].name"),
                    "PORT",
                    "reserved: thaw sets PORT to the port it chose",
                ));
            }
        }
        if c.ports.len() > 1 {
            p.push(Problem::new(
                format!("{cat}.ports"),
                c.ports.len().to_string(),
                "at most one port",
            ));
        }
        if let Some(port) = c.ports.first().and_then(|pt| pt.container_port) {
            let at = format!("{cat}.ports[0].containerPort");
            let me = format!("{}/{}", s.metadata.namespace, s.metadata.name);
            if port == 0 {
                p.push(Problem::new(at, "0", "must be in [1, 65535]"));
            } else if let Some(other) = ports.get(&port) {
                p.push(Problem::new(
                    at,
                    port.to_string(),
                    format!(
                        "service {other} declares it too: locally every replica shares one \
                         network, so two services cannot listen on one port"
                    ),
                ));
            } else {
                ports.insert(port, me);
            }
        }
        if let Some(name) = c.ports.first().and_then(|pt| pt.name.as_deref())
            && !matches!(name, "http1" | "h2c" | "http")
        {
            p.push(Problem::new(
                format!("{cat}.ports[0].name"),
                name,
                "must be http1 or h2c",
            ));
        }
        if let Some(path) = c
            .readiness_probe
            .as_ref()
            .and_then(|r| r.http_get.as_ref())
            .map(|h| &h.path)
            && !path.starts_with('/')
        {
            p.push(Problem::new(
                format!("{cat}.readinessProbe.httpGet.path"),
                path,
                "must start with /",
            ));
        }
    }
    if p.is_empty() {
        Ok(())
    } else {
        Err(Problems(p))
    }
}

impl LocalFile {
    /// A ConfigMap path resolved against the folder of the local.yaml file.
    pub fn resolve_path(&self, base: &Path, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_copy_parses() {
        let f = parse(BUILTIN, "builtin").unwrap();
        assert_eq!(f.domain, "example.com");
        assert_eq!(f.services[0].metadata.name, "hello");
        assert_eq!(f.services[0].metadata.namespace, "default");
    }

    #[test]
    fn unknown_field_is_named_by_its_path() {
        let e = parse(
            "services:\n  - metadata: {name: a}\n    spec:\n      template:\n        spec:\n          \
             containerConcurency: 1\n          containers: [{command: [x]}]\n",
            "f",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("services[0].spec.template.spec.containerConcurency: unknown field"),
            "{s}"
        );
        assert!(
            s.contains("containerConcurrency"),
            "the known fields are listed: {s}"
        );
    }

    /// A type error names the field path and says what was expected in words, without the
    /// position or Rust's type names.
    #[test]
    fn type_errors_name_the_path_in_words() {
        let svc = |spec: &str| {
            format!(
                "services:\n  - metadata: {{name: a}}\n    spec:\n      template:\n        spec:\n          {spec}\n          containers: [{{command: [x]}}]\n"
            )
        };
        let cases = [
            (
                svc("containerConcurrency: lots"),
                "services[0].spec.template.spec.containerConcurrency: expected a whole number ≥ 0, \
                 got \"lots\"",
            ),
            (
                svc("containerConcurrency: -1"),
                "services[0].spec.template.spec.containerConcurrency: expected a whole number ≥ 0, \
                 got -1",
            ),
            (
                svc("timeoutSeconds: [1]"),
                "services[0].spec.template.spec.timeoutSeconds: expected a whole number ≥ 0, got \
                 a list",
            ),
            (
                "services:\n  - metadata: {name: a}\n".to_string(),
                "services[0].spec: required, but missing",
            ),
            (
                "services: {a: 1}\n".to_string(),
                "services: expected a list, got a mapping",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text, "f").unwrap_err();
            assert_eq!(e.to_string(), want);
            assert!(!e.to_string().contains("line "), "{e}");
        }
        // Syntax errors still name the line.
        let e = parse("services: [\n", "f.yaml").unwrap_err();
        assert!(e.to_string().starts_with("f.yaml: line "), "{e}");
        // An empty file is no services.
        assert!(parse("", "f").unwrap().services.is_empty());
    }

    /// Replicas share the machine's loopback network: two services cannot declare one port.
    #[test]
    fn two_services_on_one_container_port_are_refused() {
        let svc = |name: &str| {
            format!(
                "  - metadata: {{name: {name}}}\n    spec:\n      template:\n        spec:\n          containers: [{{command: [x], ports: [{{containerPort: 8081}}]}}]\n"
            )
        };
        let e = parse(&format!("services:\n{}{}", svc("a"), svc("b")), "f").unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert_eq!(
            e.0[0].key,
            "services[1].spec.template.spec.containers[0].ports[0].containerPort"
        );
        assert!(
            e.0[0].reason.contains("service default/a declares it too"),
            "{e}"
        );
    }

    #[test]
    fn invalid_fields_are_all_named() {
        let e = parse(
            "domain: \"bad domain\"\nservices:\n  - metadata: {name: Hello}\n    spec:\n      template:\n        spec:\n          containers:\n            - command: []\n              env: [{name: PORT, value: '1'}]\n              ports: [{name: grpc}]\n",
            "f",
        )
        .unwrap_err();
        let keys: Vec<_> = e.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "domain",
                "services[0].metadata.name",
                "services[0].spec.template.spec.containers[0].command",
                "services[0].spec.template.spec.containers[0].env[0].name",
                "services[0].spec.template.spec.containers[0].ports[0].name",
            ]
        );
    }
}
