//! Knative's webhook validation of [`Service`], [`Configuration`], [`Revision`] and [`Route`],
//! as pure functions: no webhook runs here, so the controller's own validation is the contract.
//!
//! Each function returns **every** problem as a [`FieldError`] naming the field by its full path
//! (`spec.traffic[1].percent`, `spec.template.spec.containers[0].ports.containerPort`), with
//! Knative's `apis.FieldError` messages ("expected 0 <= 150 <= 100", "missing field(s)",
//! "must not set the field(s)", "invalid value: ...", "expected exactly one, got both"), and
//! [`render`] joins them as Knative prints a `FieldError`. An empty list means valid.
//!
//! The rules are Knative Serving's (`pkg/apis/serving/v1/*_validation.go`,
//! `pkg/apis/serving/k8s_validation.go`, `metadata_validation.go`): names and labels, the
//! revision template's name, the pod spec (containers, the one serving port, reserved ports,
//! env vars, container names and mount paths, volumes, probes), `containerConcurrency` and the
//! timeouts against `config-defaults` (per namespace: [`DefaultsConfig::for_namespace`]), the
//! `autoscaling.knative.dev/*` annotations (through [`crate::config::annotations::resolve`], the
//! parser the data plane uses), the traffic list (percent range and sum, one target kind per
//! entry, tags), and Knative's field masks with the keys of `config-features`
//! ([`super::fieldmask`]): a closed field is refused naming the key that opens it. Difference
//! from Knative: image references are checked only for presence.
//!
//! # How a reconciler reports an invalid object
//! Validate before any write; an invalid object gets no child written or changed, a Warning
//! Event with the same reason and message, and, not being retried until it changes, the
//! reconcile returns `Error::Invalid(render(&errors))`. The condition to set, per kind:
//!
//! | kind | condition(s) set False | reason | message |
//! |---|---|---|---|
//! | Configuration | `Ready` | [`reason::REVISION_FAILED`] | [`revision_creation_failed`] (Knative's `MarkRevisionCreationFailed`) |
//! | Service, problem under `spec.template` | `ConfigurationsReady`, `Ready` | [`reason::REVISION_FAILED`] | [`revision_creation_failed`] |
//! | Service, other problems (traffic, metadata) | `RoutesReady`, `Ready` | [`reason::INVALID_SPEC`] | [`render`] |
//! | Route | `AllTrafficAssigned`, `Ready` | [`reason::INVALID_SPEC`] | [`render`] |
//! | Revision | `ResourcesAvailable`, `Ready` | [`reason::INVALID_SPEC`] | [`render`] |
//!
//! [`reason::for_service`] picks the Service's row. `RevisionFailed` is what Knative shows when
//! a revision cannot be created; Knative has no reason for the other cases (its webhook never
//! admits such an object), so thaw names one, `InvalidSpec`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Container, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::fieldmask;
use super::{Configuration, Revision, RevisionSpec, RevisionTemplateSpec, Route, Service};
use super::{TrafficTarget, names::labels};
use crate::config::features::key as feature_key;
use crate::config::{AutoscalerConfig, DefaultsConfig, FeaturesConfig, annotations};

/// One problem: where (the full field path, Knative's spelling) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `spec.traffic[1].percent`, `metadata.name`, `spec.template.metadata.annotations.autoscaling.knative.dev/min-scale`.
    pub path: String,
    /// Knative's message: `expected 0 <= 150 <= 100`, `missing field(s)`, `invalid value: x`.
    pub message: String,
    /// A longer explanation, printed on the next line (Knative's `Details`).
    pub details: Option<String>,
}

impl FieldError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn details(mut self, d: impl Into<String>) -> Self {
        self.details = Some(d.into());
        self
    }
}

impl fmt::Display for FieldError {
    /// `MESSAGE: PATH`, then the details on the next line (one Knative `FieldError` line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.message, self.path)?;
        if let Some(d) = &self.details {
            write!(f, "\n{d}")?;
        }
        Ok(())
    }
}

/// All problems as Knative prints an `apis.FieldError`: one line per message, the paths that
/// share a message (and details) joined by ", " (`Multiple definitions for "a":
/// spec.traffic[0].tag, spec.traffic[1].tag`), details on the line after. Messages keep the
/// order they were found in. Empty for no problems.
pub fn render(errors: &[FieldError]) -> String {
    let mut merged: Vec<(&str, Option<&str>, Vec<&str>)> = Vec::new();
    for e in errors {
        let key = (e.message.as_str(), e.details.as_deref());
        match merged.iter_mut().find(|(m, d, _)| (*m, *d) == key) {
            Some((_, _, paths)) => {
                if !paths.contains(&e.path.as_str()) {
                    paths.push(&e.path)
                }
            }
            None => merged.push((key.0, key.1, vec![&e.path])),
        }
    }
    let lines: Vec<String> = merged
        .into_iter()
        .map(|(m, d, paths)| match d {
            None => format!("{m}: {}", paths.join(", ")),
            Some(d) => format!("{m}: {}\n{d}", paths.join(", ")),
        })
        .collect();
    lines.join("\n")
}

/// Knative's reasons for an invalid object's conditions (the table in the module doc).
pub mod reason {
    use super::FieldError;

    /// The revision template cannot become a revision (Knative's Configuration reason).
    pub const REVISION_FAILED: &str = "RevisionFailed";
    /// Anything else invalid (thaw's: Knative's webhook never admits such an object).
    pub const INVALID_SPEC: &str = "InvalidSpec";

    /// The Service's condition and reason for `errors` (from [`super::service`]):
    /// `("ConfigurationsReady", RevisionFailed)` when any problem is under `spec.template`,
    /// else `("RoutesReady", InvalidSpec)`.
    pub fn for_service(errors: &[FieldError]) -> (&'static str, &'static str) {
        if errors.iter().any(|e| e.path.starts_with("spec.template")) {
            ("ConfigurationsReady", REVISION_FAILED)
        } else {
            ("RoutesReady", INVALID_SPEC)
        }
    }
}

/// Knative's Configuration message when a revision cannot be created:
/// `Revision creation failed with message: {render(errors)}.`
pub fn revision_creation_failed(errors: &[FieldError]) -> String {
    format!("Revision creation failed with message: {}.", render(errors))
}

/// The ports of the queue sidecar a user container may not use: Knative's reserved set
/// (8012 HTTP, 8013 h2c, 8022 queue admin, 9090 autoscaling metrics, 9091 user metrics, 8008
/// profiling), which includes thaw's sidecar's data and admin ports
/// ([`crate::queue::settings::DEFAULT_DATA_PORT`], [`crate::queue::settings::DEFAULT_ADMIN_PORT`]).
pub const RESERVED_PORTS: &[i32] = &[
    crate::queue::settings::DEFAULT_DATA_PORT as i32,
    8013,
    8022,
    9090,
    crate::queue::settings::DEFAULT_ADMIN_PORT as i32,
    8008,
];

/// Env vars the platform sets on the serving container (sidecar containers may set `PORT`).
pub const RESERVED_ENV_VARS: &[&str] = &["PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"];

/// Mount paths a container may not use (Knative's current list).
pub const RESERVED_MOUNT_PATHS: &[&str] = &["/", "/dev", "/dev/log"];

/// The sidecar's container name (Knative's), which a user container may not take.
pub const RESERVED_CONTAINER_NAMES: &[&str] = &["queue-proxy"];

/// The serving container's port names: `http1`, `h2c`, or none.
const VALID_PORT_NAMES: &[&str] = &["", "h2c", "http1"];

/// Knative's gradual rollout duration annotation (Service, Configuration, Route).
pub const ROLLOUT_DURATION: &str = "serving.knative.dev/rollout-duration";

/// `networking.knative.dev/visibility`: its one allowed value is `cluster-local`.
pub const VISIBILITY_LABEL: &str = "networking.knative.dev/visibility";

/// The annotation of the sidecar's share of the pod's resources (Knative's), in [0.1, 100].
pub const QUEUE_RESOURCE_PERCENTAGE: &str = "queue.sidecar.serving.knative.dev/resource-percentage";

const SERVING_PREFIX: &str = "serving.knative.dev/";

/// Validates a Service: its metadata, its template (as a Configuration's, revision names
/// prefixed by the Service's name) and its traffic (no `configurationName`: the Service's own
/// configuration is the default; an empty list means 100 % to the latest revision).
///
/// `defaults` is the cluster's `config-defaults`; the Service's namespace section applies.
pub fn service(
    svc: &Service,
    defaults: &DefaultsConfig,
    autoscaler: &AutoscalerConfig,
    features: &FeaturesConfig,
) -> Vec<FieldError> {
    let mut e = Vec::new();
    let meta = &svc.metadata;
    object_meta(meta, &mut e);
    for (k, v) in meta.labels.iter().flatten() {
        if k == VISIBILITY_LABEL {
            visibility(v, &mut e);
        } else if k.starts_with(SERVING_PREFIX) {
            e.push(invalid_key(k, "metadata.labels"));
        }
    }
    no_autoscaling_annotations(meta, &mut e);
    let defaults = defaults.for_namespace(ns(meta));
    template(
        &svc.spec.configuration.template,
        meta,
        "spec.template",
        defaults,
        autoscaler,
        features,
        &mut e,
    );
    if !svc.spec.route.traffic.is_empty() {
        traffic(&svc.spec.route.traffic, true, "spec.traffic", &mut e);
    }
    e
}

/// Validates a Configuration: its metadata and its template (a revision name must start with
/// `{configuration}-`). `defaults` is the cluster's; the namespace section applies.
pub fn configuration(
    cfg: &Configuration,
    defaults: &DefaultsConfig,
    autoscaler: &AutoscalerConfig,
    features: &FeaturesConfig,
) -> Vec<FieldError> {
    let mut e = Vec::new();
    let meta = &cfg.metadata;
    // A Configuration's name is only ever a prefix of its children's names, which
    // `child_name` keeps within 63 characters; it may be as long as any object name.
    object_meta_with(meta, 253, &mut e);
    for (k, v) in meta.labels.iter().flatten() {
        match k.as_str() {
            labels::ROUTE | labels::CONFIGURATION_UID | labels::SERVICE_UID => {}
            labels::SERVICE => owned_by(meta, "Service", v, k, &mut e),
            _ if k.starts_with(SERVING_PREFIX) => e.push(invalid_key(k, "metadata.labels")),
            _ => {}
        }
    }
    no_autoscaling_annotations(meta, &mut e);
    let defaults = defaults.for_namespace(ns(meta));
    template(
        &cfg.spec.template,
        meta,
        "spec.template",
        defaults,
        autoscaler,
        features,
        &mut e,
    );
    e
}

/// Validates a Revision: its metadata (autoscaling annotations live here), its labels and its
/// spec. `defaults` is the cluster's; the namespace section applies.
pub fn revision(
    rev: &Revision,
    defaults: &DefaultsConfig,
    autoscaler: &AutoscalerConfig,
    features: &FeaturesConfig,
) -> Vec<FieldError> {
    let mut e = Vec::new();
    let meta = &rev.metadata;
    object_meta(meta, &mut e);
    for k in meta.labels.iter().flatten().map(|(k, _)| k) {
        match k.as_str() {
            labels::ROUTING_STATE
            | labels::ROUTE
            | labels::SERVICE
            | labels::CONFIGURATION_UID
            | labels::SERVICE_UID
            | labels::CONFIGURATION_GENERATION
            // Knative also asks for an owner reference to that Configuration; thaw accepts a
            // Revision made by hand with the label (deploy/examples/hello/).
            | labels::CONFIGURATION => {}
            _ if k.starts_with(SERVING_PREFIX) => e.push(invalid_key(k, "metadata.labels")),
            _ => {}
        }
    }
    let defaults = defaults.for_namespace(ns(meta));
    annotation_values(meta, "metadata.annotations", &rev.spec, autoscaler, &mut e);
    revision_spec(&rev.spec, "spec", defaults, features, &mut e);
    e
}

/// Validates a Route: its metadata and labels, and its traffic (each target names exactly
/// one of `revisionName` and `configurationName`; percents sum to 100).
pub fn route(route: &Route) -> Vec<FieldError> {
    let mut e = Vec::new();
    let meta = &route.metadata;
    object_meta(meta, &mut e);
    for (k, v) in meta.labels.iter().flatten() {
        if k == VISIBILITY_LABEL {
            visibility(v, &mut e);
        } else if k == labels::SERVICE {
            owned_by(meta, "Service", v, k, &mut e);
        } else if k == labels::SERVICE_UID {
            // The Service reconciler puts it on the Route it owns, beside the service label.
        } else if k.starts_with(SERVING_PREFIX) {
            e.push(invalid_key(k, "metadata.labels"));
        }
    }
    traffic(&route.spec.traffic, false, "spec.traffic", &mut e);
    e
}

/// Knative's cluster domain (`network.GetClusterDomainName()`'s default): a DomainMapping may
/// not map a name under it.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Validates a DomainMapping (Knative's `domainmapping_validation.go`): no `generateName`; the
/// name a fully qualified domain name (at least two labels, each a DNS-1123 label, at most
/// 253 characters) not under the cluster domain; `spec.ref` with `name`, `apiVersion` and
/// `kind`, and its `namespace`, when set, the DomainMapping's own; `spec.tls.secretName` when
/// `spec.tls` is given.
pub fn domain_mapping(dm: &super::DomainMapping) -> Vec<FieldError> {
    let mut e = Vec::new();
    let meta = &dm.metadata;
    if meta.generate_name.as_deref().is_some_and(|g| !g.is_empty()) {
        e.push(FieldError::new(
            "metadata.generateName",
            "must not set the field(s)",
        ));
    }
    let name = meta.name.as_deref().unwrap_or("");
    let invalid =
        |why: &str| FieldError::new("metadata.name", format!("invalid name {name:?}: {why}"));
    if let Some(why) = fully_qualified_domain_name_error(name) {
        e.push(invalid(&why));
    }
    if name == CLUSTER_DOMAIN || name.ends_with(&format!(".{CLUSTER_DOMAIN}")) {
        e.push(invalid(&format!(
            "must not be a subdomain of cluster local domain {CLUSTER_DOMAIN:?}"
        )));
    }
    let r = &dm.spec.ref_;
    for (field, v) in [
        ("spec.ref.apiVersion", &r.api_version),
        ("spec.ref.kind", &r.kind),
        ("spec.ref.name", &r.name),
    ] {
        if v.is_empty() {
            e.push(FieldError::new(field, "missing field(s)"));
        }
    }
    let parent = ns(meta);
    if let Some(rns) = r.namespace.as_deref().filter(|n| !n.is_empty())
        && rns != parent
    {
        e.push(
            FieldError::new("spec.ref.namespace", "mismatched namespaces").details(format!(
                "parent namespace: {parent:?} does not match ref: {rns:?}"
            )),
        );
    }
    if dm
        .spec
        .tls
        .as_ref()
        .is_some_and(|t| t.secret_name.is_empty())
    {
        e.push(FieldError::new("spec.tls.secretName", "missing field(s)"));
    }
    e
}

fn ns(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

// ---------------------------------------------------------------------------------------------
// Names.

/// Kubernetes' messages for a DNS-1035 label (`validation.IsDNS1035Label`): empty when `s` is
/// one (lower-case alphanumerics and '-', starting with a letter, ending with an alphanumeric,
/// at most 63 characters).
pub fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    let ok = s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        out.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character (e.g. \
             'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
                .to_string(),
        );
    }
    out
}

/// Kubernetes' `validation.IsFullyQualifiedDomainName(field.NewPath("name"), s)` as its
/// aggregate error reads (Knative puts it after `invalid name "..."`): the first of a
/// subdomain's errors (joined by ','), fewer than two labels, then the first label that is not
/// a DNS-1123 label; `None` for a valid (or empty: required elsewhere) name.
fn fully_qualified_domain_name_error(s: &str) -> Option<String> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() {
        return None;
    }
    let invalid = |value: &str, why: &str| format!("name: Invalid value: {value:?}: {why}");
    let errs = dns1123_subdomain_errors(s);
    if !errs.is_empty() {
        return Some(invalid(s, &errs.join(",")));
    }
    if s.split('.').count() < 2 {
        return Some(invalid(
            s,
            "should be a domain with at least two segments separated by dots",
        ));
    }
    s.split('.').find(|l| !is_dns1123_label(l)).map(|label| {
        let mut why = Vec::new();
        if label.len() > 63 {
            why.push("must be no more than 63 characters");
        }
        let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        if !(label.starts_with(alnum)
            && label.ends_with(alnum)
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            why.push(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters \
                 or '-', and must start and end with an alphanumeric character (e.g. \
                 'my-name',  or '123-abc', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            );
        }
        invalid(label, &why.join(","))
    })
}

/// Whether `s` is a DNS-1123 label (a namespace name): lower-case alphanumerics and '-',
/// starting and ending with an alphanumeric, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Kubernetes' `validation.IsDNS1123Subdomain` (a service account name): why `s` is not one,
/// nothing when it is. At most 253 characters, and `[a-z0-9]([-a-z0-9]*[a-z0-9])?` parts
/// (of any length) joined by '.'.
fn dns1123_subdomain_errors(s: &str) -> Vec<&'static str> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters");
    }
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let part = |p: &str| {
        p.starts_with(alnum)
            && p.ends_with(alnum)
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if !s.split('.').all(part) {
        errs.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character (e.g. \
             'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        );
    }
    errs
}

/// Go's `fmt.Sprint` of a `[]string`: `[a b]`.
fn go_list(msgs: &[String]) -> String {
    format!("[{}]", msgs.join(" "))
}

/// Knative's `apis.ValidateObjectMetadata`: a DNS-1035 `name` or `generateName`.
fn object_meta(meta: &ObjectMeta, e: &mut Vec<FieldError>) {
    object_meta_with(meta, 63, e);
}

/// [`object_meta`] with names of up to `max_name` characters.
fn object_meta_with(meta: &ObjectMeta, max_name: usize, e: &mut Vec<FieldError>) {
    let name = meta.name.as_deref().unwrap_or("");
    let generate = meta.generate_name.as_deref().unwrap_or("");
    if !generate.is_empty() {
        // A prefix: the generated suffix makes any trailing character fine.
        let msgs = dns1035_label_errors(&format!("{generate}a"));
        if !msgs.is_empty() {
            e.push(FieldError::new(
                "metadata.generateName",
                format!("not a DNS 1035 label prefix: {}", go_list(&msgs)),
            ));
        }
    }
    if !name.is_empty() {
        let mut msgs = dns1035_label_errors(name);
        if max_name > 63 {
            msgs.retain(|m| !m.starts_with("must be no more than 63"));
            if name.len() > max_name {
                msgs.insert(0, format!("must be no more than {max_name} characters"));
            }
        }
        if !msgs.is_empty() {
            e.push(FieldError::new(
                "metadata.name",
                format!("not a DNS 1035 label: {}", go_list(&msgs)),
            ));
        }
    }
    if name.is_empty() && generate.is_empty() {
        e.push(FieldError::new(
            "metadata.name",
            "name or generateName is required",
        ));
    }
    rollout_duration(meta, "metadata.annotations", e);
}

/// `serving.knative.dev/rollout-duration`: a Go duration, whole seconds, not negative
/// (Knative's `validateRolloutDurationAnnotation`).
fn rollout_duration(meta: &ObjectMeta, at: &str, e: &mut Vec<FieldError>) {
    let Some(v) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROLLOUT_DURATION))
        .filter(|v| !v.is_empty())
    else {
        return;
    };
    let path = format!("{at}.{ROLLOUT_DURATION}");
    match crate::config::parse::parse_go_duration_nanos(v) {
        Err(_) => e.push(FieldError::new(path, format!("invalid value: {v}"))),
        Ok(n) if n % 1_000_000_000 != 0 => e.push(FieldError::new(
            path,
            format!("rollout-duration={v} is not at second precision"),
        )),
        Ok(n) if n < 0 => e.push(FieldError::new(
            path,
            format!("rollout-duration={v} must be positive"),
        )),
        Ok(_) => {}
    }
}

fn invalid_key(key: &str, path: &str) -> FieldError {
    FieldError::new(path, format!("invalid key name {key:?}"))
}

fn visibility(value: &str, e: &mut Vec<FieldError>) {
    if value != "cluster-local" {
        e.push(FieldError::new(
            format!("metadata.labels.{VISIBILITY_LABEL}"),
            format!("invalid value: {value}"),
        ));
    }
}

/// A `serving.knative.dev/service` (or `/configuration`) label is only for objects that
/// resource owns.
fn owned_by(meta: &ObjectMeta, kind: &str, name: &str, label: &str, e: &mut Vec<FieldError>) {
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        // The label holds `labels::value` of the owner's name (hashed past 63 characters).
        .any(|r| r.kind == kind && labels::value(&r.name) == name);
    if !owned {
        e.push(FieldError::new(
            format!("metadata.labels.{label}"),
            "missing field(s)",
        ));
    }
}

/// Service and Configuration: autoscaling annotations belong on the template.
fn no_autoscaling_annotations(meta: &ObjectMeta, e: &mut Vec<FieldError>) {
    for k in meta.annotations.iter().flatten().map(|(k, _)| k) {
        if k.starts_with(annotations::PREFIX) {
            e.push(invalid_key(k, "metadata.annotations").details(
                "autoscaling annotations must be put under \
                 \"spec.template.metadata.annotations\" to work",
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The revision template and spec.

fn template(
    t: &RevisionTemplateSpec,
    parent: &ObjectMeta,
    at: &str,
    defaults: &DefaultsConfig,
    autoscaler: &AutoscalerConfig,
    features: &FeaturesConfig,
    e: &mut Vec<FieldError>,
) {
    revision_spec(&t.spec, &format!("{at}.spec"), defaults, features, e);
    annotation_values(
        &t.metadata,
        &format!("{at}.metadata.annotations"),
        &t.spec,
        autoscaler,
        e,
    );
    // Visibility is the Service's or Route's label; a revision template may not carry it.
    if t.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(VISIBILITY_LABEL))
    {
        e.push(invalid_key(
            VISIBILITY_LABEL,
            &format!("{at}.metadata.annotations"),
        ));
    }
    rollout_duration(&t.metadata, &format!("{at}.metadata.annotations"), e);
    // Knative's validateRevisionName.
    if let Some(generate) = t
        .metadata
        .generate_name
        .as_deref()
        .filter(|g| !g.is_empty())
    {
        let msgs = dns1035_label_errors(&format!("{generate}a"));
        if !msgs.is_empty() {
            e.push(FieldError::new(
                format!("{at}.metadata.generateName"),
                format!(
                    "invalid value: not a DNS 1035 label prefix: {}",
                    go_list(&msgs)
                ),
            ));
        }
    }
    if let Some(name) = t.metadata.name.as_deref().filter(|n| !n.is_empty()) {
        let path = format!("{at}.metadata.name");
        let msgs = dns1035_label_errors(name);
        let parent_name = parent.name.as_deref().unwrap_or("");
        let prefix = format!("{parent_name}-");
        if !msgs.is_empty() {
            e.push(FieldError::new(
                path,
                format!("invalid value: not a DNS 1035 label: {}", go_list(&msgs)),
            ));
        } else if parent_name.is_empty()
            && parent
                .generate_name
                .as_deref()
                .is_some_and(|g| !g.is_empty())
        {
            e.push(FieldError::new(path, "must not set the field(s)"));
        } else if !name.starts_with(&prefix) {
            e.push(FieldError::new(
                path,
                format!("invalid value: {name:?} must have prefix {prefix:?}"),
            ));
        }
    }
}

/// `autoscaling.knative.dev/*` (through the data plane's own parser) and the sidecar's
/// resource percentage, each problem at `{at}.{annotation}`.
fn annotation_values(
    meta: &ObjectMeta,
    at: &str,
    spec: &RevisionSpec,
    autoscaler: &AutoscalerConfig,
    e: &mut Vec<FieldError>,
) {
    let Some(a) = meta.annotations.as_ref() else {
        return;
    };
    let cc = spec
        .container_concurrency
        .and_then(|c| u32::try_from(c).ok())
        .unwrap_or(0);
    if let Err(problems) = annotations::resolve(autoscaler, a, cc) {
        for p in problems.0 {
            e.push(
                FieldError::new(
                    format!("{at}.{}", p.key),
                    format!("invalid value: {}", p.value),
                )
                .details(p.reason),
            );
        }
    }
    if let Some(v) = a.get(QUEUE_RESOURCE_PERCENTAGE) {
        let path = format!("{at}.{QUEUE_RESOURCE_PERCENTAGE}");
        match v.trim().parse::<f64>() {
            Ok(p) if (0.1..=100.0).contains(&p) => {}
            Ok(p) => e.push(FieldError::new(path, format!("expected 0.1 <= {p} <= 100"))),
            Err(_) => e.push(FieldError::new(path, format!("invalid value: {v}"))),
        }
    }
}

fn revision_spec(
    s: &RevisionSpec,
    at: &str,
    d: &DefaultsConfig,
    features: &FeaturesConfig,
    e: &mut Vec<FieldError>,
) {
    pod_spec(&s.pod_spec, at, features, e);
    let max_timeout = d.max_revision_timeout.as_secs() as i64;
    // Knative: 0 means the default; otherwise within [0, max-revision-timeout-seconds].
    if let Some(t) = s.timeout_seconds
        && t != 0
        && !(0..=max_timeout).contains(&t)
    {
        e.push(out_of_bounds(
            t,
            0,
            max_timeout,
            &format!("{at}.timeoutSeconds"),
        ));
    }
    let timeout = s
        .timeout_seconds
        .filter(|t| *t > 0)
        .unwrap_or(d.revision_timeout.as_secs() as i64);
    if let Some(t) = s.response_start_timeout_seconds
        && !(0..=timeout).contains(&t)
    {
        e.push(out_of_bounds(
            t,
            0,
            timeout,
            &format!("{at}.responseStartTimeoutSeconds"),
        ));
    }
    if let Some(t) = s.idle_timeout_seconds
        && !(0..=max_timeout).contains(&t)
    {
        e.push(out_of_bounds(
            t,
            0,
            max_timeout,
            &format!("{at}.idleTimeoutSeconds"),
        ));
    }
    if let Some(cc) = s.container_concurrency {
        let min = i64::from(!d.allow_container_concurrency_zero);
        let max = i64::from(d.container_concurrency_max_limit);
        if !(min..=max).contains(&cc) {
            e.push(out_of_bounds(
                cc,
                min,
                max,
                &format!("{at}.containerConcurrency"),
            ));
        }
    }
}

fn out_of_bounds(v: i64, lo: i64, hi: i64, path: &str) -> FieldError {
    FieldError::new(path, format!("expected {lo} <= {v} <= {hi}"))
}

/// Knative's `ValidatePodSpec`: the field masks ([`fieldmask::check`]) with the keys of
/// `config-features`, then the rules on values.
fn pod_spec(ps: &PodSpec, at: &str, features: &FeaturesConfig, e: &mut Vec<FieldError>) {
    e.extend(fieldmask::check(ps, features, at));
    if ps.containers.len() > 1 && !features.multi_container.open() {
        e.push(
            FieldError::new(
                format!("{at}.containers"),
                format!(
                    "multi-container is off, but found {} containers",
                    ps.containers.len()
                ),
            )
            .details(closed_by(feature_key::MULTI_CONTAINER)),
        );
    }
    let all: Vec<&Container> = ps
        .init_containers
        .iter()
        .flatten()
        .chain(&ps.containers)
        .collect();
    let mounted: BTreeSet<&str> = all
        .iter()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str())
        .collect();
    let volumes = volumes(ps, &mounted, &format!("{at}.volumes"), features, e);

    // Init containers: no name shared with a container.
    let names: BTreeSet<&str> = ps.containers.iter().map(|c| c.name.as_str()).collect();
    for (i, c) in ps.init_containers.iter().flatten().enumerate() {
        let cat = format!("{at}.initContainers[{i}]");
        if names.contains(c.name.as_str()) {
            e.push(FieldError::new(
                format!("{cat}.name"),
                format!("duplicate container name {:?}", c.name),
            ));
        }
        for (field, set) in [
            ("livenessProbe", c.liveness_probe.is_some()),
            ("readinessProbe", c.readiness_probe.is_some()),
            ("startupProbe", c.startup_probe.is_some()),
            ("lifecycle", c.lifecycle.is_some()),
        ] {
            if set {
                e.push(FieldError::new(
                    format!("{cat}.{field}"),
                    "field not allowed in an init container",
                ));
            }
        }
        container(c, Role::Init, &volumes, &cat, e);
    }

    // Exactly one container port across the containers (the serving one).
    let count: usize = ps
        .containers
        .iter()
        .map(|c| c.ports.as_ref().map_or(0, Vec::len))
        .sum();
    let serving_port = ps
        .containers
        .iter()
        .find_map(|c| c.ports.as_ref().and_then(|p| p.first()))
        .map(|p| p.name.clone().unwrap_or_default())
        .unwrap_or_default();
    if count == 0 && ps.containers.len() > 1 {
        e.push(FieldError::new(
            format!("{at}.containers[*].ports"),
            "missing field(s)",
        ));
    }
    if count > 1 {
        e.push(
            FieldError::new(
                format!("{at}.containers[*].ports"),
                "more than one container port is set",
            )
            .details("Only a single port is allowed across all containers"),
        );
    }

    match ps.containers.len() {
        0 => e.push(FieldError::new(
            format!("{at}.containers"),
            "missing field(s)",
        )),
        n => {
            let mut seen = BTreeSet::new();
            for (i, c) in ps.containers.iter().enumerate() {
                let cat = format!("{at}.containers[{i}]");
                if n > 1 && !seen.insert(c.name.as_str()) {
                    e.push(FieldError::new(
                        format!("{cat}.name"),
                        format!("duplicate container name {:?}", c.name),
                    ));
                }
                // With one container, it serves; with several, the one with the port does.
                let serving = n == 1 || c.ports.as_ref().is_some_and(|p| !p.is_empty());
                if serving {
                    probe(
                        c.liveness_probe.as_ref(),
                        &serving_port,
                        false,
                        &format!("{cat}.livenessProbe"),
                        e,
                    );
                    probe(
                        c.readiness_probe.as_ref(),
                        &serving_port,
                        true,
                        &format!("{cat}.readinessProbe"),
                        e,
                    );
                    container(c, Role::Serving, &volumes, &cat, e);
                } else {
                    container(c, Role::Sidecar, &volumes, &cat, e);
                }
            }
        }
    }
    // One error per reason, the reason as its details (Knative's `ErrInvalidValue(name,
    // "serviceAccountName", reason)`).
    if let Some(sa) = ps.service_account_name.as_deref().filter(|s| !s.is_empty()) {
        for why in dns1123_subdomain_errors(sa) {
            e.push(
                FieldError::new(
                    format!("{at}.serviceAccountName"),
                    format!("invalid value: {sa}"),
                )
                .details(why),
            );
        }
    }
    // Knative's `ValidatePodSecurityContext`: ids within [0, MaxInt32] (the fields themselves
    // are gated by the field mask).
    if let Some(sc) = &ps.security_context {
        let sat = format!("{at}.securityContext");
        for (field, id) in [
            ("runAsUser", sc.run_as_user),
            ("runAsGroup", sc.run_as_group),
            ("fsGroup", sc.fs_group),
        ] {
            id_in_bounds(id, &format!("{sat}.{field}"), e);
        }
        for (i, g) in sc.supplemental_groups.iter().flatten().enumerate() {
            id_in_bounds(Some(*g), &format!("{sat}.supplementalGroups[{i}]"), e);
        }
    }
}

/// The largest user or group id Knative accepts (`math.MaxInt32`).
const MAX_ID: i64 = i32::MAX as i64;

/// Knative's bound on a user or group id: `expected 0 <= id <= 2147483647`.
fn id_in_bounds(id: Option<i64>, path: &str, e: &mut Vec<FieldError>) {
    if let Some(id) = id.filter(|id| !(0..=MAX_ID).contains(id)) {
        e.push(out_of_bounds(id, 0, MAX_ID, path));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Serving,
    Sidecar,
    Init,
}

/// The details of a refusal that a `config-features` key would lift.
pub fn closed_by(key: &str) -> String {
    format!("closed by config-features; \"{key}: enabled\" in config-features opens it")
}

/// What a volume mount may do: `Writable` (emptyDir, hostPath, csi, and
/// persistentVolumeClaim with `kubernetes.podspec-persistent-volume-write`), or read only and
/// why.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mount {
    Writable,
    ReadOnly,
    /// A claim, read only until persistent-volume-write opens it.
    ReadOnlyClaim,
}

/// The volumes by name, after checking each: unique name, mounted somewhere, exactly one
/// source (Knative's `validateVolume`), a claim read only unless persistent-volume-write is
/// enabled. Returns what a mount of each may do.
fn volumes<'a>(
    ps: &'a PodSpec,
    mounted: &BTreeSet<&str>,
    at: &str,
    features: &FeaturesConfig,
    e: &mut Vec<FieldError>,
) -> BTreeMap<&'a str, Mount> {
    let mut out = BTreeMap::new();
    for (i, v) in ps.volumes.iter().flatten().enumerate() {
        let vat = format!("{at}[{i}]");
        if out.contains_key(v.name.as_str()) {
            e.push(FieldError::new(
                format!("{vat}.name"),
                format!("duplicate volume name {:?}", v.name),
            ));
        }
        if !mounted.contains(v.name.as_str()) {
            e.push(FieldError::new(
                format!("{vat}.name"),
                format!("volume with name {:?} not mounted", v.name),
            ));
        }
        if v.name.is_empty() {
            e.push(FieldError::new(format!("{vat}.name"), "missing field(s)"));
        } else if !is_dns1123_label(&v.name) {
            e.push(FieldError::new(
                format!("{vat}.name"),
                format!("invalid value: {}", v.name),
            ));
        }
        let f = features;
        // (name, set, may be set): the kinds Knative counts, each behind its key if any.
        let sources = [
            ("secret", v.secret.is_some(), true),
            ("configMap", v.config_map.is_some(), true),
            ("projected", v.projected.is_some(), true),
            (
                "emptyDir",
                v.empty_dir.is_some(),
                f.podspec_volumes_emptydir.open(),
            ),
            (
                "persistentVolumeClaim",
                v.persistent_volume_claim.is_some(),
                f.podspec_persistent_volume_claim.open(),
            ),
            (
                "hostPath",
                v.host_path.is_some(),
                f.podspec_volumes_hostpath.open(),
            ),
            ("csi", v.csi.is_some(), f.podspec_volumes_csi.open()),
            ("image", v.image.is_some(), f.podspec_volumes_image.open()),
        ];
        let set: Vec<&str> = sources.iter().filter(|s| s.1).map(|s| s.0).collect();
        let paths = |names: &[&str]| -> Vec<String> {
            names.iter().map(|n| format!("{vat}.{n}")).collect()
        };
        match set.len() {
            0 => {
                let all: Vec<&str> = sources.iter().filter(|s| s.2).map(|s| s.0).collect();
                for p in paths(&all) {
                    e.push(FieldError::new(p, "expected exactly one, got neither"));
                }
            }
            1 => {}
            _ => {
                for p in paths(&set) {
                    e.push(FieldError::new(p, "expected exactly one, got both"));
                }
            }
        }
        let write = f.podspec_persistent_volume_write.open();
        if let Some(pvc) = &v.persistent_volume_claim
            && pvc.read_only != Some(true)
            && !write
        {
            e.push(
                FieldError::new(
                    format!("{vat}.persistentVolumeClaim.readOnly"),
                    format!(
                        "Persistent volume write support is disabled, but found persistent \
                         volume claim {} that is not read-only",
                        pvc.claim_name
                    ),
                )
                .details(closed_by(feature_key::PERSISTENT_VOLUME_WRITE)),
            );
        }
        let mount = if v.empty_dir.is_some() || v.host_path.is_some() || v.csi.is_some() {
            Mount::Writable
        } else if v.persistent_volume_claim.is_some() {
            if write {
                Mount::Writable
            } else {
                Mount::ReadOnlyClaim
            }
        } else {
            Mount::ReadOnly
        };
        out.insert(v.name.as_str(), mount);
    }
    out
}

/// Knative's `validate` of one container (serving, sidecar or init).
fn container(
    c: &Container,
    role: Role,
    volumes: &BTreeMap<&str, Mount>,
    at: &str,
    e: &mut Vec<FieldError>,
) {
    if RESERVED_CONTAINER_NAMES.contains(&c.name.as_str()) {
        e.push(FieldError::new(
            format!("{at}.name"),
            format!("{:?} is a reserved container name", c.name),
        ));
    }
    // Knative's `validateSecurityContext`: ids within [0, MaxInt32].
    if let Some(sc) = &c.security_context {
        for (field, id) in [
            ("runAsUser", sc.run_as_user),
            ("runAsGroup", sc.run_as_group),
        ] {
            id_in_bounds(id, &format!("{at}.securityContext.{field}"), e);
        }
    }
    for (i, env) in c.env.iter().flatten().enumerate() {
        let eat = format!("{at}.env[{i}]");
        let reserved = RESERVED_ENV_VARS.contains(&env.name.as_str())
            && !(role != Role::Serving && env.name == "PORT");
        if env.name.is_empty() {
            e.push(FieldError::new(format!("{eat}.name"), "missing field(s)"));
        } else if reserved {
            e.push(FieldError::new(
                format!("{eat}.name"),
                format!("{:?} is a reserved environment variable", env.name),
            ));
        }
    }
    for (i, from) in c.env_from.iter().flatten().enumerate() {
        let fat = format!("{at}.envFrom[{i}]");
        match (from.config_map_ref.is_some(), from.secret_ref.is_some()) {
            (true, true) => {
                e.push(FieldError::new(
                    format!("{fat}.configMapRef"),
                    "expected exactly one, got both",
                ));
                e.push(FieldError::new(
                    format!("{fat}.secretRef"),
                    "expected exactly one, got both",
                ));
            }
            (false, false) => {
                e.push(FieldError::new(
                    format!("{fat}.configMapRef"),
                    "expected exactly one, got neither",
                ));
                e.push(FieldError::new(
                    format!("{fat}.secretRef"),
                    "expected exactly one, got neither",
                ));
            }
            _ => {}
        }
    }
    if c.image.as_deref().is_none_or(str::is_empty) {
        e.push(FieldError::new(format!("{at}.image"), "missing field(s)"));
    }
    let ports = c.ports.as_deref().unwrap_or_default();
    let checked = if role == Role::Init {
        ports
    } else {
        ports.get(..1).unwrap_or_default()
    };
    for p in checked {
        let pat = format!("{at}.ports");
        if RESERVED_PORTS.contains(&p.container_port) {
            e.push(
                FieldError::new(
                    format!("{pat}.containerPort"),
                    format!("invalid value: {} is a reserved port", p.container_port),
                )
                .details(format!(
                    "{} is a reserved port, please use a different value",
                    p.container_port
                )),
            );
        }
        if !(0..=65535).contains(&p.container_port) {
            e.push(out_of_bounds(
                i64::from(p.container_port),
                0,
                65535,
                &format!("{pat}.containerPort"),
            ));
        }
        if role != Role::Init {
            if let Some(proto) = p
                .protocol
                .as_deref()
                .filter(|p| !p.is_empty() && *p != "TCP")
            {
                e.push(FieldError::new(
                    format!("{pat}.protocol"),
                    format!("invalid value: {proto}"),
                ));
            }
            let name = p.name.as_deref().unwrap_or("");
            if !VALID_PORT_NAMES.contains(&name) {
                e.push(
                    FieldError::new(pat, format!("Port name {name} is not allowed"))
                        .details("Name must be empty, or one of: 'h2c', 'http1'"),
                );
            }
        }
    }
    if let Some(policy) = c
        .termination_message_policy
        .as_deref()
        .filter(|p| !["", "File", "FallbackToLogsOnError"].contains(p))
    {
        e.push(FieldError::new(
            format!("{at}.terminationMessagePolicy"),
            format!("invalid value: {policy}"),
        ));
    }
    let mut seen_paths = BTreeSet::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mat = format!("{at}.volumeMounts[{i}]");
        let writable = volumes.get(m.name.as_str()).copied();
        if writable.is_none() {
            e.push(FieldError::new(
                format!("{mat}.name"),
                "volumeMount has no matching volume",
            ));
        }
        let clean = clean_path(&m.mount_path);
        if m.mount_path.is_empty() {
            e.push(FieldError::new(
                format!("{mat}.mountPath"),
                "missing field(s)",
            ));
        } else if RESERVED_MOUNT_PATHS.contains(&clean.as_str()) {
            e.push(FieldError::new(
                format!("{mat}.mountPath"),
                format!("mountPath {clean:?} is a reserved path"),
            ));
        } else if !m.mount_path.starts_with('/') {
            e.push(FieldError::new(
                format!("{mat}.mountPath"),
                format!("invalid value: {}", m.mount_path),
            ));
        } else if seen_paths.contains(&clean) {
            e.push(FieldError::new(
                format!("{mat}.mountPath"),
                format!("invalid value: {:?} must be unique", m.mount_path),
            ));
        }
        seen_paths.insert(clean);
        if writable.is_some_and(|w| w != Mount::Writable) && m.read_only != Some(true) {
            let err = FieldError::new(
                format!("{mat}.readOnly"),
                "volume mount should be readOnly for this type of volume",
            );
            e.push(if writable == Some(Mount::ReadOnlyClaim) {
                err.details(closed_by(feature_key::PERSISTENT_VOLUME_WRITE))
            } else {
                err
            });
        }
    }
}

/// Go's `path.Clean` for absolute paths: no `.`, `..`, repeated or trailing slashes.
fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    if p.starts_with('/') {
        format!("/{}", parts.join("/"))
    } else {
        parts.join("/")
    }
}

/// Knative's `validateProbe` (and `validateReadinessProbe` when `readiness`): exactly one
/// handler; a named port must be the serving port's name; readiness thresholds.
fn probe(p: Option<&Probe>, port_name: &str, readiness: bool, at: &str, e: &mut Vec<FieldError>) {
    let Some(p) = p else { return };
    let mut handlers = Vec::new();
    let named = |port: &IntOrString| match port {
        IntOrString::String(s) if !s.is_empty() && s != port_name => Some(s.clone()),
        _ => None,
    };
    if let Some(h) = &p.http_get {
        handlers.push("httpGet");
        if let Some(s) = named(&h.port) {
            e.push(
                FieldError::new(format!("{at}.httpGet.port"), format!("invalid value: {s}"))
                    .details("Probe port must match container port"),
            );
        }
    }
    if let Some(t) = &p.tcp_socket {
        handlers.push("tcpSocket");
        if let Some(s) = named(&t.port) {
            e.push(
                FieldError::new(
                    format!("{at}.tcpSocket.port"),
                    format!("invalid value: {s}"),
                )
                .details("Probe port must match container port"),
            );
        }
    }
    if p.exec.is_some() {
        handlers.push("exec");
    }
    if p.grpc.is_some() {
        handlers.push("grpc");
    }
    match handlers.len() {
        0 => {
            for h in ["httpGet", "tcpSocket", "exec", "grpc"] {
                e.push(FieldError::new(
                    format!("{at}.{h}"),
                    "expected exactly one, got neither",
                ));
            }
        }
        1 => {}
        _ => {
            for h in handlers {
                e.push(FieldError::new(
                    format!("{at}.{h}"),
                    "expected exactly one, got both",
                ));
            }
        }
    }
    if !readiness {
        return;
    }
    let max = i64::from(i32::MAX);
    let period = i64::from(p.period_seconds.unwrap_or(0));
    let check = |v: Option<i32>, lo: i64, field: &str, e: &mut Vec<FieldError>| {
        if let Some(v) = v
            && i64::from(v) < lo
        {
            e.push(out_of_bounds(
                i64::from(v),
                lo,
                max,
                &format!("{at}.{field}"),
            ));
        }
    };
    check(p.period_seconds, 0, "periodSeconds", e);
    check(p.initial_delay_seconds, 0, "initialDelaySeconds", e);
    check(p.success_threshold, 1, "successThreshold", e);
    if period == 0 {
        // Knative's aggressive probing: no failureThreshold or timeoutSeconds.
        for (field, v) in [
            ("failureThreshold", p.failure_threshold),
            ("timeoutSeconds", p.timeout_seconds),
        ] {
            if v.is_some_and(|v| v != 0) {
                e.push(FieldError::new(
                    format!("{at}.{field}"),
                    format!("{field} is disallowed when periodSeconds is zero"),
                ));
            }
        }
    } else {
        check(p.timeout_seconds, 1, "timeoutSeconds", e);
        check(p.failure_threshold, 1, "failureThreshold", e);
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic.

/// Knative's `validateTrafficList` in a spec. `in_service`: the Service's own configuration
/// is the default target, so `configurationName` may not be set.
fn traffic(list: &[TrafficTarget], in_service: bool, at: &str, e: &mut Vec<FieldError>) {
    let mut tags: BTreeMap<&str, usize> = BTreeMap::new();
    let mut sum: i64 = 0;
    for (i, t) in list.iter().enumerate() {
        let tat = format!("{at}[{i}]");
        let rev = t.revision_name.as_deref().unwrap_or("");
        let cfg = t.configuration_name.as_deref().unwrap_or("");
        if let Some(latest) = t.latest_revision
            && latest != rev.is_empty()
        {
            e.push(FieldError::new(
                format!("{tat}.latestRevision"),
                format!("may not set revisionName {rev:?} when latestRevision is {latest}"),
            ));
        }
        if in_service && !cfg.is_empty() {
            e.push(FieldError::new(
                format!("{tat}.configurationName"),
                "must not set the field(s)",
            ));
        } else if !rev.is_empty() && !cfg.is_empty() {
            for f in ["revisionName", "configurationName"] {
                e.push(FieldError::new(
                    format!("{tat}.{f}"),
                    "expected exactly one, got both",
                ));
            }
        } else if !rev.is_empty() {
            qualified_name(rev, &format!("{tat}.revisionName"), e);
        } else if !cfg.is_empty() {
            qualified_name(cfg, &format!("{tat}.configurationName"), e);
        } else if !in_service {
            for f in ["revisionName", "configurationName"] {
                e.push(FieldError::new(
                    format!("{tat}.{f}"),
                    "expected exactly one, got neither",
                ));
            }
        }
        if let Some(p) = t.percent {
            if !(0..=100).contains(&p) {
                e.push(out_of_bounds(p, 0, 100, &format!("{tat}.percent")));
            }
            sum += p;
        }
        if t.url.as_deref().is_some_and(|u| !u.is_empty()) {
            e.push(FieldError::new(
                format!("{tat}.url"),
                "must not set the field(s)",
            ));
        }
        let Some(tag) = t.tag.as_deref().filter(|t| !t.is_empty()) else {
            continue;
        };
        let msgs = dns1035_label_errors(tag);
        if !msgs.is_empty() {
            e.push(FieldError::new(
                format!("{tat}.tag"),
                format!("invalid value: not a DNS 1035 label: {}", go_list(&msgs)),
            ));
        }
        match tags.get(tag) {
            Some(first) => {
                let msg = format!("Multiple definitions for {tag:?}");
                e.push(FieldError::new(format!("{tat}.tag"), msg.clone()));
                e.push(FieldError::new(format!("{at}[{first}].tag"), msg));
            }
            None => {
                tags.insert(tag, i);
            }
        }
    }
    if sum != 100 {
        e.push(FieldError::new(
            at,
            format!("Traffic targets sum to {sum}, want 100"),
        ));
    }
}

/// Kubernetes' `IsQualifiedName` (a name, optionally `prefix/`): at most 63 characters of
/// alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric.
fn qualified_name(s: &str, path: &str, e: &mut Vec<FieldError>) {
    let name = s.rsplit_once('/').map_or(s, |(_, n)| n);
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        e.push(invalid_key(s, path));
    }
}
