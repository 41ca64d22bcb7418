//! `local.yaml`: the services `thaw local` runs, as Knative Services (`serving.knative.dev/v1`,
//! the types of [`crate::knative`], the same the Kubernetes controller reads), with a
//! `command` to run instead of an image to pull.
//!
//! ```yaml
//! domain: example.com                 # hosts are {service}.{namespace}.{domain}
//! sidecar: false                      # true: a `thaw queue` sidecar in front of every replica
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
//!               ports: [{name: http1, containerPort: 8080}]   # h2c = HTTP/2 cleartext
//!               readinessProbe: {httpGet: {path: /healthz}}   # optional; else TCP connect
//!       traffic:                      # optional; default: 100 % to the latest ready revision
//!         - {latestRevision: true, percent: 90}
//!         - {revisionName: hello-00001, percent: 10, tag: old}   # old-hello.default.example.com
//! ```
//!
//! `traffic` follows Knative's Route rules: targets name a revision (`revisionName`, or the
//! latest ready one), percents add up to 100, and each `tag` gets the hosts
//! `{tag}-{service}.{namespace}.{domain}` (and the cluster-local forms). The split is published
//! in the catalog ([`crate::revision::CatalogSnapshot::split`]); until the activator draws
//! each request's revision from it ([`crate::revision::CatalogSnapshot::pick`]), a split
//! route's host sends everything to its largest share.
//!
//! A real Knative manifest is accepted as it is: fields that mean nothing locally (`image`
//! beside a `command`, `resources`, pod-level settings such as `serviceAccountName`) are
//! accepted with one warning each. Unknown fields and wrongly typed values are errors naming
//! the field's path ([`super::schema`]), so a typo cannot silently fall back to a default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::parse::{Problem, Problems};
pub use crate::knative::{RevisionTemplateSpec, Service, TrafficTarget};
use k8s_openapi::api::core::v1::Container;

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
    /// Runs every replica behind its own `thaw queue` sidecar, as a revision pod on Kubernetes
    /// runs (containerConcurrency enforced in the replica too, pod stats, drain). Off by
    /// default: locally the activator is always in the path and enforces containerConcurrency
    /// itself, so the sidecar is there to see and measure it.
    #[serde(default)]
    pub sidecar: bool,
    #[serde(default)]
    pub services: Vec<Service>,
}

/// The queue sidecar's data and admin ports: a user container may not declare them when
/// `sidecar: true` (as the controller will refuse them on Kubernetes).
pub const SIDECAR_PORTS: [u16; 2] = [
    crate::queue::settings::DEFAULT_DATA_PORT,
    crate::queue::settings::DEFAULT_ADMIN_PORT,
];

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

/// The namespace a service without one lives in.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A service's name (`""` when missing: validation reports it).
pub fn name_of(s: &Service) -> &str {
    s.metadata.name.as_deref().unwrap_or("")
}

/// A service's namespace (`default` when not given).
pub fn namespace_of(s: &Service) -> &str {
    s.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
}

/// A revision template's annotations (none when not given).
pub fn annotations_of(t: &RevisionTemplateSpec) -> BTreeMap<String, String> {
    t.metadata.annotations.clone().unwrap_or_default()
}

/// The template's one container (validation guarantees exactly one).
pub fn container_of(t: &RevisionTemplateSpec) -> Option<&Container> {
    t.spec.pod_spec.containers.first()
}

/// The container's program and arguments (`command` then `args`).
pub fn command_of(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// The container's declared port, if any (validated to 1..=65535).
pub fn container_port_of(c: &Container) -> Option<u16> {
    c.ports
        .as_ref()
        .and_then(|p| p.first())
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p > 0)
}

/// The container's port name (`h2c` selects HTTP/2 cleartext).
pub fn port_name_of(c: &Container) -> Option<String> {
    c.ports
        .as_ref()
        .and_then(|p| p.first())
        .and_then(|p| p.name.clone())
}

/// The readiness probe's HTTP path (`/` when the probe has `httpGet` without a path); `None`:
/// a TCP connect.
/// The service name of the container's `grpc` readiness probe, if it has one (`""`: the
/// server as a whole). Its port is the container's: a local replica has one port.
pub fn readiness_grpc_of(c: &Container) -> Option<String> {
    c.readiness_probe
        .as_ref()
        .and_then(|p| p.grpc.as_ref())
        .map(|g| g.service.clone().unwrap_or_default())
}

pub fn readiness_path_of(c: &Container) -> Option<String> {
    c.readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|h| h.path.clone().unwrap_or_else(|| "/".into()))
}

/// The built-in demo services (`src/local/builtin.yaml`), used when no file is given and none
/// is found. Every ConfigMap key takes its default. A file of its own, not `config/local.yaml`,
/// so that editing the file users are told to edit changes neither the binary nor the tests.
pub const BUILTIN: &str = include_str!("builtin.yaml");

/// Parses local.yaml text in three steps: YAML syntax (an error names the line and column),
/// the shape of each Service against Knative's schema ([`super::schema`]: unknown fields and
/// wrong types, named by path), then the rules (names, ports, traffic). `origin` names the
/// input.
pub fn parse(text: &str, origin: &str) -> Result<LocalFile, Problems> {
    let mut tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| {
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
    if tree.is_null() {
        tree = serde_json::Value::Object(Default::default());
    }
    let mut shape = Vec::new();
    if let Some(services) = tree.get("services").and_then(|s| s.as_array()) {
        for (i, s) in services.iter().enumerate() {
            shape.extend(super::schema::check_service(s, &format!("services[{i}]")));
        }
    }
    if !shape.is_empty() {
        return Err(Problems(shape));
    }
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
            let got = got_words(got);
            let value = got.trim_matches('"').to_string();
            return Problem::new(
                path,
                value,
                format!("expected {}, got {got}", expected_words(expected)),
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

/// Container fields thaw local uses; any other field set is warned about.
const CONTAINER_USED: &[&str] = &[
    "name",
    "command",
    "args",
    "env",
    "ports",
    "readinessProbe",
    "image",
    "resources",
];

/// Warnings for fields that mean nothing locally, one per field: `image` beside a command,
/// `resources`, other container fields, pod-level fields, and annotations' warnings are added
/// by the model.
pub fn warnings(f: &LocalFile) -> Vec<String> {
    let mut out = Vec::new();
    for (i, s) in f.services.iter().enumerate() {
        let tpl = &s.spec.configuration.template;
        let at = format!("services[{i}].spec.template.spec");
        if let Ok(serde_json::Value::Object(pod)) = serde_json::to_value(&tpl.spec.pod_spec) {
            for k in pod.keys().filter(|k| *k != "containers") {
                out.push(format!("{at}.{k}: no effect in thaw local, ignored"));
            }
        }
        for (j, c) in tpl.spec.pod_spec.containers.iter().enumerate() {
            let cat = format!("{at}.containers[{j}]");
            if c.image.is_some() && c.command.is_some() {
                out.push(format!(
                    "{cat}.image: ignored in thaw local, which runs the command instead"
                ));
            }
            if c.resources.is_some() {
                out.push(format!(
                    "{cat}.resources: no effect in thaw local (replicas are plain processes)"
                ));
            }
            if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(c) {
                for (k, v) in &fields {
                    // k8s-openapi writes a missing container name as "".
                    if !CONTAINER_USED.contains(&k.as_str()) && !v.is_null() {
                        out.push(format!("{cat}.{k}: no effect in thaw local, ignored"));
                    }
                }
            }
        }
    }
    out
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
        let (name, namespace) = (name_of(s), namespace_of(s));
        // Revision names append "-00001": keep the whole name a valid 63-character label.
        if !dns_label(name, 57) {
            p.push(Problem::new(
                format!("{at}.metadata.name"),
                name,
                "must be a DNS label: lower-case letters, digits and '-', starting with a letter, \
                 at most 57 characters",
            ));
        }
        if !dns_label(namespace, 63) {
            p.push(Problem::new(
                format!("{at}.metadata.namespace"),
                namespace,
                "must be a DNS label",
            ));
        }
        if !seen.insert((namespace, name)) {
            p.push(Problem::new(
                format!("{at}.metadata.name"),
                name,
                format!("duplicate service in namespace {namespace}"),
            ));
        }
        let tpl = &s.spec.configuration.template;
        if let Some(rev) = &tpl.metadata.name
            && (!rev.starts_with(&format!("{name}-")) || !dns_label(rev, 63))
        {
            p.push(Problem::new(
                format!("{at}.spec.template.metadata.name"),
                rev,
                format!("a revision name must start with the service's name and '-' ({name}-...) and be a DNS label"),
            ));
        }
        let spec = &tpl.spec;
        let sat = format!("{at}.spec.template.spec");
        for (field, v) in [
            ("containerConcurrency", spec.container_concurrency),
            ("timeoutSeconds", spec.timeout_seconds),
            (
                "responseStartTimeoutSeconds",
                spec.response_start_timeout_seconds,
            ),
            ("idleTimeoutSeconds", spec.idle_timeout_seconds),
        ] {
            if let Some(v) = v
                && u32::try_from(v).is_err()
            {
                p.push(Problem::new(
                    format!("{sat}.{field}"),
                    v.to_string(),
                    "must be in [0, 4294967295]",
                ));
            }
        }
        let containers = &spec.pod_spec.containers;
        if containers.len() != 1 {
            p.push(Problem::new(
                format!("{sat}.containers"),
                containers.len().to_string(),
                "must hold exactly one container",
            ));
            continue;
        }
        let c = &containers[0];
        let cat = format!("{sat}.containers[0]");
        match (&c.command, &c.image) {
            (Some(cmd), _) if cmd.first().is_some_and(|w| !w.trim().is_empty()) => {}
            (_, Some(image)) => p.push(Problem::new(
                format!("{cat}.command"),
                "",
                format!(
                    "missing: thaw local runs a command, it does not pull images ({image}); \
                     give the command that starts the app"
                ),
            )),
            _ => p.push(Problem::new(
                format!("{cat}.command"),
                "[]",
                "must name a program",
            )),
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
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
                    "reserved: thaw sets PORT to the containerPort (or a port it chose)",
                ));
            }
            if e.value_from.is_some() {
                p.push(Problem::new(
                    format!("{cat}.env[{j}].valueFrom"),
                    "",
                    "not available in thaw local (no Secrets or ConfigMaps to read): give a value",
                ));
            }
        }
        let port_list = c.ports.as_deref().unwrap_or_default();
        if port_list.len() > 1 {
            p.push(Problem::new(
                format!("{cat}.ports"),
                port_list.len().to_string(),
                "at most one port",
            ));
        }
        if let Some(pt) = port_list.first() {
            let at = format!("{cat}.ports[0].containerPort");
            let me = format!("{namespace}/{name}");
            match u16::try_from(pt.container_port) {
                // k8s-openapi reads a missing containerPort as 0: no port declared.
                Ok(0) => {}
                Err(_) => p.push(Problem::new(
                    at,
                    pt.container_port.to_string(),
                    "must be in [1, 65535]",
                )),
                Ok(port) if f.sidecar && SIDECAR_PORTS.contains(&port) => p.push(Problem::new(
                    at,
                    port.to_string(),
                    format!(
                        "reserved for the queue sidecar (its ports are {} and {}; sidecar: true)",
                        SIDECAR_PORTS[0], SIDECAR_PORTS[1]
                    ),
                )),
                Ok(port) => {
                    if let Some(other) = ports.get(&port) {
                        p.push(Problem::new(
                            at,
                            port.to_string(),
                            format!(
                                "service {other} declares it too: locally every replica shares \
                                 one network, so two services cannot listen on one port"
                            ),
                        ));
                    } else {
                        ports.insert(port, me);
                    }
                }
            }
            if let Some(pname) = pt.name.as_deref()
                && !matches!(pname, "http1" | "h2c" | "http")
            {
                p.push(Problem::new(
                    format!("{cat}.ports[0].name"),
                    pname,
                    "must be http1 or h2c",
                ));
            }
        }
        if let Some(path) = readiness_path_of(c)
            && !path.starts_with('/')
        {
            p.push(Problem::new(
                format!("{cat}.readinessProbe.httpGet.path"),
                path,
                "must start with /",
            ));
        }
        p.extend(traffic_problems(&at, name, &s.spec.route.traffic));
    }
    if p.is_empty() {
        Ok(())
    } else {
        Err(Problems(p))
    }
}

/// Knative's rules for a Service's `traffic`: each target names one revision (`revisionName`,
/// or the latest ready one: `latestRevision: true` or this service's `configurationName`),
/// percents in [0, 100] adding up to 100, tags distinct DNS labels.
fn traffic_problems(at: &str, service: &str, traffic: &[TrafficTarget]) -> Vec<Problem> {
    let mut p = Vec::new();
    if traffic.is_empty() {
        return p;
    }
    let mut tags = BTreeSet::new();
    let mut sum: i64 = 0;
    for (k, t) in traffic.iter().enumerate() {
        let tat = format!("{at}.spec.traffic[{k}]");
        let latest = t.latest_revision == Some(true);
        match (&t.revision_name, &t.configuration_name, latest) {
            (Some(_), None, false) => {}
            (None, Some(c), _) if c == service => {}
            (None, Some(c), _) => p.push(Problem::new(
                format!("{tat}.configurationName"),
                c,
                format!("must be the service's own configuration, {service}"),
            )),
            (None, None, true) => {}
            (Some(r), _, true) => p.push(Problem::new(
                format!("{tat}.latestRevision"),
                "true",
                format!("cannot be true beside revisionName {r}"),
            )),
            _ => p.push(Problem::new(
                tat.clone(),
                "",
                "must name a revision: revisionName, or latestRevision: true",
            )),
        }
        let percent = t.percent.unwrap_or(0);
        if !(0..=100).contains(&percent) {
            p.push(Problem::new(
                format!("{tat}.percent"),
                percent.to_string(),
                "must be in [0, 100]",
            ));
        }
        sum += percent;
        if let Some(tag) = &t.tag {
            if !dns_label(tag, 63) {
                p.push(Problem::new(
                    format!("{tat}.tag"),
                    tag,
                    "must be a DNS label",
                ));
            } else if !tags.insert(tag.as_str()) {
                p.push(Problem::new(format!("{tat}.tag"), tag, "duplicate tag"));
            }
        }
    }
    if sum != 100 {
        p.push(Problem::new(
            format!("{at}.spec.traffic"),
            sum.to_string(),
            "the percents must add up to 100",
        ));
    }
    p
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
        // The demo's domain reaches loopback by itself (`*.localhost`).
        assert_eq!(f.domain, "localhost");
        assert_eq!(name_of(&f.services[0]), "hello");
        assert_eq!(namespace_of(&f.services[0]), "default");
    }

    /// Knative's helloworld manifest, as users have it (labels, annotations, a chosen revision
    /// name, image, resources, serviceAccountName, tagged traffic, latestRevision), plus the
    /// command thaw local runs: accepted, with one warning per field that means nothing
    /// locally; a field Knative does not define is named by its path.
    #[test]
    fn a_real_knative_manifest_is_accepted_with_one_warning_per_local_no_op() {
        let manifest = include_str!("../knative/testdata/helloworld.yaml");
        let as_local = |m: &str| {
            let indented: String = m.lines().map(|l| format!("    {l}\n")).collect();
            format!("services:\n  -{}", &indented[3..])
        };
        // As shipped it carries a field no Knative version defines.
        let e = parse(&as_local(manifest), "f").unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert!(
            e.to_string()
                .starts_with("services[0].spec.template.spec.someFutureField: true: unknown field"),
            "{e}"
        );
        let fixed = manifest.replace("      someFutureField: true\n", "").replace(
            "        - image: ghcr.io/knative/helloworld-go:latest\n",
            "        - image: ghcr.io/knative/helloworld-go:latest\n          command: [thaw, sample-app]\n",
        );
        let f = parse(&as_local(&fixed), "f").unwrap();
        let svc = &f.services[0];
        assert_eq!(name_of(svc), "helloworld-go");
        assert_eq!(svc.spec.route.traffic.len(), 2);
        let w = warnings(&f);
        let at = "services[0].spec.template.spec";
        assert_eq!(
            w,
            [
                format!("{at}.serviceAccountName: no effect in thaw local, ignored"),
                format!(
                    "{at}.containers[0].image: ignored in thaw local, which runs the command instead"
                ),
                format!(
                    "{at}.containers[0].resources: no effect in thaw local (replicas are plain processes)"
                ),
            ]
        );
        // Without a command there is nothing to run.
        let e = parse(
            &as_local(&manifest.replace("      someFutureField: true\n", "")),
            "f",
        )
        .unwrap_err();
        assert_eq!(
            e.0[0].key,
            "services[0].spec.template.spec.containers[0].command"
        );
        assert!(e.0[0].reason.contains("does not pull images"), "{e}");
    }

    /// Knative's traffic rules: one revision per target, percents adding up to 100, distinct
    /// tags, only the service's own configuration.
    #[test]
    fn traffic_rules_name_the_target() {
        let svc = |traffic: &str| {
            format!(
                "services:\n  - metadata: {{name: a}}\n    spec:\n      template:\n        spec:\n          containers: [{{command: [x]}}]\n      traffic: {traffic}\n"
            )
        };
        assert!(parse(&svc("[{latestRevision: true, percent: 100}]"), "f").is_ok());
        assert!(
            parse(
                &svc("[{latestRevision: true, percent: 90}, {revisionName: a-00001, percent: 10, tag: old}]"),
                "f"
            )
            .is_ok()
        );
        let e = parse(
            &svc("[{latestRevision: true, percent: 90, tag: x}, {configurationName: b, percent: 5, tag: x}, {percent: 0}]"),
            "f",
        )
        .unwrap_err();
        let keys: Vec<_> = e.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "services[0].spec.traffic[1].configurationName",
                "services[0].spec.traffic[1].tag",
                "services[0].spec.traffic[2]",
                "services[0].spec.traffic",
            ],
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("traffic: 95: the percents must add up to 100"),
            "{e}"
        );
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
            s.starts_with("services[0].spec.template.spec.containerConcurency: 1: unknown field"),
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
                "services[0].spec.template.spec.timeoutSeconds: [1]: expected a whole number ≥ 0, \
                 got a list",
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

    /// A `grpc` readiness probe is read (its service; the port is the replica's).
    #[test]
    fn a_grpc_readiness_probe_is_read() {
        let f = parse(
            "services:\n  - metadata: {name: g}\n    spec:\n      template:\n        spec:\n          containers: [{command: [x], ports: [{name: h2c}], readinessProbe: {grpc: {port: 8080, service: thaw.Ready}}}]\n",
            "f",
        )
        .unwrap();
        let c = container_of(&f.services[0].spec.configuration.template).unwrap();
        assert_eq!(readiness_grpc_of(c).as_deref(), Some("thaw.Ready"));
        assert_eq!(readiness_path_of(c), None);
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
    fn with_the_sidecar_its_ports_are_refused_as_container_ports() {
        let svc = |port: u16| {
            format!(
                "services:\n  - metadata: {{name: a}}\n    spec:\n      template:\n        spec:\n          containers: [{{command: [x], ports: [{{containerPort: {port}}}]}}]\n"
            )
        };
        assert!(parse(&svc(9091), "f").is_ok(), "no sidecar: any port");
        let e = parse(&format!("sidecar: true\n{}", svc(9091)), "f").unwrap_err();
        assert_eq!(
            e.0[0].key,
            "services[0].spec.template.spec.containers[0].ports[0].containerPort"
        );
        assert!(
            e.0[0].reason.contains("reserved for the queue sidecar"),
            "{e}"
        );
        assert!(parse(&format!("sidecar: true\n{}", svc(8012)), "f").is_err());
        assert!(
            parse(&format!("sidecar: true\n{}", svc(8080)), "f")
                .unwrap()
                .sidecar
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
