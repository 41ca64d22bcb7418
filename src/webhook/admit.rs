//! Knative's admission of `serving.knative.dev/v1` objects as pure functions: an
//! `AdmissionRequest` and the settings in force in, an `AdmissionResponse` out. No I/O.
//!
//! **Defaulting** (the mutating webhook, Knative's `webhook.serving.knative.dev`) writes into
//! the object what the controller would otherwise resolve when it stamps a Revision: the
//! template's spec through [`defaulted_spec`] (containerConcurrency, timeoutSeconds, the
//! response-start and idle timeouts, container names, the serving container's readiness
//! probe, `enableServiceLinks`), a Service's traffic (none written: 100 % to the latest
//! revision; each target's `latestRevision`), and who did it: `serving.knative.dev/creator`
//! and `serving.knative.dev/lastModifier` on create, `lastModifier` on an update that changes
//! the spec (Knative's `SetUserInfo`), except on a Configuration or Route with an owner: a
//! Service's children carry the Service's annotations, copied by the controller, as in
//! Knative. The answer is a JSON patch from the object as sent.
//! A Revision is defaulted on create only: its spec is immutable afterwards.
//!
//! **Validation** (Knative's `validation.webhook.serving.knative.dev`) refuses what the
//! controller would mark `Ready=False InvalidSpec` (the same functions:
//! [`crate::knative::validate`], the field masks of `config-features`, the resolver's checks),
//! and on update what Knative refuses between two versions: a Revision's spec changed
//! (`Immutable fields changed (-old +new)`), a template changed under the same explicit
//! revision name (`Saw the following changes without a name change (-old +new)`), and an
//! edited `creator` (or `lastModifier` without a spec change) on an object no other owns
//! (a Service's Configuration and Route follow the Service's). The message is Knative's:
//! `validation failed: ` and the rendered field errors; the status is 400 `BadRequest`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use crate::controller::Settings;
use crate::controller::configuration::{CREATOR_ANNOTATION, defaulted_spec, template_problems};
use crate::knative::validate::{self, FieldError};
use crate::knative::{
    Configuration, Revision, RevisionTemplateSpec, Route, Service, TrafficTarget,
};

/// Knative's `serving.knative.dev/lastModifier`: who last changed the spec.
pub const LAST_MODIFIER_ANNOTATION: &str = "serving.knative.dev/lastModifier";

/// The API group this webhook admits.
pub const GROUP: &str = "serving.knative.dev";

/// Which webhook a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// The mutating webhook: defaults, answered with a JSON patch.
    Defaulting,
    /// The validating webhook: allowed or refused with Knative's message.
    Validation,
}

/// The answer and what the metrics record of it.
#[derive(Debug)]
pub struct Verdict {
    pub response: AdmissionResponse,
    /// `Service`, `Configuration`, `Revision`, `Route`, `DomainMapping`, or `other`.
    pub kind: &'static str,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub operation: &'static str,
}

fn kind_label(kind: &str) -> &'static str {
    match kind {
        "Service" => "Service",
        "Configuration" => "Configuration",
        "Revision" => "Revision",
        "Route" => "Route",
        "DomainMapping" => "DomainMapping",
        _ => "other",
    }
}

fn operation_label(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Admits one request. Deletes, subresources (`/status`) and other groups' kinds are allowed
/// untouched (the configurations do not send them; this is the answer if one does).
pub fn admit(hook: Hook, req: &AdmissionRequest<DynamicObject>, settings: &Settings) -> Verdict {
    let kind = kind_label(&req.kind.kind);
    let operation = operation_label(&req.operation);
    let allow = AdmissionResponse::from(req);
    let ours = req.kind.group == GROUP
        && kind != "other"
        && req.sub_resource.as_deref().unwrap_or("").is_empty()
        && matches!(req.operation, Operation::Create | Operation::Update);
    let response = match (ours, req.object.as_ref()) {
        (false, _) | (true, None) => allow,
        (true, Some(obj)) => {
            let old = req.old_object.as_ref();
            let result = match hook {
                Hook::Defaulting => defaulting(kind, req, obj, old, settings)
                    .and_then(|p| allow.clone().with_patch(p).map_err(|e| e.to_string())),
                Hook::Validation => {
                    validation(kind, req, obj, old, settings).map(|()| allow.clone())
                }
            };
            match result {
                Ok(r) => r,
                Err(message) => deny(allow, message),
            }
        }
    };
    Verdict {
        response,
        kind,
        operation,
    }
}

/// Knative's refusal: 400 `BadRequest` with `message` (kubectl prints `Error from server
/// (BadRequest): admission webhook "..." denied the request: MESSAGE`).
fn deny(r: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut r = r.deny(message);
    r.result.code = 400;
    r.result.reason = "BadRequest".into();
    r.result.status = Some(kube::core::response::StatusSummary::Failure);
    r
}

fn parse<T: serde::de::DeserializeOwned>(obj: &DynamicObject) -> Result<(T, Value), String> {
    let v = serde_json::to_value(obj).map_err(|e| format!("cannot read the object: {e}"))?;
    let t = serde_path_to_error::deserialize(&v)
        .map_err(|e| format!("cannot read the object at {}: {}", e.path(), e.inner()))?;
    Ok((t, v))
}

fn namespace(req: &AdmissionRequest<DynamicObject>, meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .or_else(|| req.namespace.clone())
        .unwrap_or_else(|| "default".into())
}

// ---------------------------------------------------------------------------------------------
// Defaulting.

fn defaulting(
    kind: &str,
    req: &AdmissionRequest<DynamicObject>,
    obj: &DynamicObject,
    old: Option<&DynamicObject>,
    settings: &Settings,
) -> Result<json_patch::Patch, String> {
    let user = req.user_info.username.as_deref();
    let (sent, after) = match kind {
        "Service" => {
            let (mut svc, sent): (Service, _) = parse(obj)?;
            let ns = namespace(req, &svc.metadata);
            default_template(&mut svc.spec.configuration.template, settings, &ns);
            default_service_traffic(&mut svc.spec.route.traffic);
            let old_spec = old
                .map(parse::<Service>)
                .transpose()?
                .map(|(o, _)| serde_json::to_value(&o.spec).unwrap_or_default());
            let new_spec = serde_json::to_value(&svc.spec).unwrap_or_default();
            set_user_info(&mut svc.metadata, user, old_spec.as_ref(), &new_spec);
            (sent, to_json(&svc)?)
        }
        "Configuration" => {
            let (mut cfg, sent): (Configuration, _) = parse(obj)?;
            let ns = namespace(req, &cfg.metadata);
            default_template(&mut cfg.spec.template, settings, &ns);
            let old_spec = old
                .map(parse::<Configuration>)
                .transpose()?
                .map(|(o, _)| serde_json::to_value(&o.spec).unwrap_or_default());
            let new_spec = serde_json::to_value(&cfg.spec).unwrap_or_default();
            if !owned(&cfg.metadata) {
                set_user_info(&mut cfg.metadata, user, old_spec.as_ref(), &new_spec);
            }
            (sent, to_json(&cfg)?)
        }
        "Revision" => {
            let (mut rev, sent): (Revision, _) = parse(obj)?;
            if old.is_none() {
                let ns = namespace(req, &rev.metadata);
                rev.spec = defaulted_spec(&rev.spec, settings.defaults.for_namespace(&ns));
            }
            (sent, to_json(&rev)?)
        }
        "Route" => {
            let (mut route, sent): (Route, _) = parse(obj)?;
            for t in &mut route.spec.traffic {
                default_target(t);
            }
            let old_spec = old
                .map(parse::<Route>)
                .transpose()?
                .map(|(o, _)| serde_json::to_value(&o.spec).unwrap_or_default());
            let new_spec = serde_json::to_value(&route.spec).unwrap_or_default();
            if !owned(&route.metadata) {
                set_user_info(&mut route.metadata, user, old_spec.as_ref(), &new_spec);
            }
            (sent, to_json(&route)?)
        }
        _ => return Ok(json_patch::Patch(Vec::new())),
    };
    let mut merged = sent.clone();
    overlay(&mut merged, &after);
    Ok(json_patch::diff(&sent, &merged))
}

fn to_json<T: serde::Serialize>(t: &T) -> Result<Value, String> {
    serde_json::to_value(t).map_err(|e| format!("cannot write the defaulted object: {e}"))
}

/// The template's spec with the namespace's config-defaults resolved (the controller's
/// [`defaulted_spec`], so a stored template reads as the Revision it becomes).
pub fn default_template(t: &mut RevisionTemplateSpec, settings: &Settings, namespace: &str) {
    t.spec = defaulted_spec(&t.spec, settings.defaults.for_namespace(namespace));
}

/// Knative's Service traffic default: none written is 100 % to the latest revision; each
/// target without `latestRevision` follows the latest unless it names a revision.
pub fn default_service_traffic(traffic: &mut Vec<TrafficTarget>) {
    if traffic.is_empty() {
        traffic.push(TrafficTarget {
            latest_revision: Some(true),
            percent: Some(100),
            ..Default::default()
        });
    }
    for t in traffic {
        default_target(t);
    }
}

fn default_target(t: &mut TrafficTarget) {
    if t.latest_revision.is_none() {
        t.latest_revision = Some(t.revision_name.as_deref().unwrap_or("").is_empty());
    }
}

/// Whether another object owns this one (a Service's Configuration and Route): Knative sets
/// and checks the user annotations only on objects the user made (`GetOwnerReferences() ==
/// nil`); an owned one carries its owner's, which the controller copies and updates.
fn owned(meta: &ObjectMeta) -> bool {
    meta.owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty())
}

/// Knative's `SetUserInfo`: on create, creator and lastModifier; on update, lastModifier when
/// the spec changed.
fn set_user_info(meta: &mut ObjectMeta, user: Option<&str>, old_spec: Option<&Value>, new: &Value) {
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return;
    };
    let ann = meta.annotations.get_or_insert_with(Default::default);
    match old_spec {
        None => {
            ann.insert(CREATOR_ANNOTATION.into(), user.into());
            ann.insert(LAST_MODIFIER_ANNOTATION.into(), user.into());
        }
        Some(old) if old != new => {
            ann.insert(LAST_MODIFIER_ANNOTATION.into(), user.into());
        }
        Some(_) => {}
    }
}

/// Lays `top` over `base`: objects merge key by key, arrays of equal length element by
/// element, anything else is replaced by `top`'s. Keys only `base` has stay (defaulting adds,
/// it never removes), so the patch touches only what defaulting wrote.
fn overlay(base: &mut Value, top: &Value) {
    match (base, top) {
        (Value::Object(b), Value::Object(t)) => {
            for (k, tv) in t {
                match b.get_mut(k) {
                    Some(bv) => overlay(bv, tv),
                    None => {
                        b.insert(k.clone(), tv.clone());
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(t)) if b.len() == t.len() => {
            for (bv, tv) in b.iter_mut().zip(t) {
                overlay(bv, tv);
            }
        }
        (b, t) => *b = t.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation.

fn validation(
    kind: &str,
    req: &AdmissionRequest<DynamicObject>,
    obj: &DynamicObject,
    old: Option<&DynamicObject>,
    settings: &Settings,
) -> Result<(), String> {
    let mut errors: Vec<FieldError> = Vec::new();
    match kind {
        "Service" => {
            let (svc, _): (Service, _) = parse(obj)?;
            errors = validate::service(
                &svc,
                &settings.defaults,
                &settings.autoscaler,
                &settings.features,
            );
            let ns = namespace(req, &svc.metadata);
            if errors.is_empty() {
                errors = template_problems(
                    &ns,
                    &svc.metadata.name.clone().unwrap_or_default(),
                    &svc.spec.configuration.template,
                    settings,
                    settings.defaults.for_namespace(&ns),
                );
            }
            if let Some(old) = old {
                let (o, _): (Service, _) = parse(old)?;
                name_change(
                    &o.spec.configuration.template,
                    &svc.spec.configuration.template,
                    &mut errors,
                );
                creator_and_modifier(&o.metadata, &svc.metadata, &o.spec, &svc.spec, &mut errors);
            }
        }
        "Configuration" => {
            let (cfg, _): (Configuration, _) = parse(obj)?;
            errors = crate::controller::configuration::problems(&cfg, settings);
            if let Some(old) = old {
                let (o, _): (Configuration, _) = parse(old)?;
                name_change(&o.spec.template, &cfg.spec.template, &mut errors);
                if !owned(&cfg.metadata) {
                    creator_and_modifier(
                        &o.metadata,
                        &cfg.metadata,
                        &o.spec,
                        &cfg.spec,
                        &mut errors,
                    );
                }
            }
        }
        "Revision" => {
            let (rev, _): (Revision, _) = parse(obj)?;
            if let Some(old) = old {
                let (o, _): (Revision, _) = parse(old)?;
                let (a, b) = (to_json(&o.spec)?, to_json(&rev.spec)?);
                if a != b {
                    return Err(failed(&[FieldError::new(
                        "spec",
                        "Immutable fields changed (-old +new)",
                    )
                    .details(short_diff(&a, &b))]));
                }
            }
            if let Err(m) = crate::controller::revision::check(&rev, settings) {
                return Err(format!("validation failed: {m}"));
            }
        }
        "DomainMapping" => {
            let (mut dm, _): (crate::knative::DomainMapping, _) = parse(obj)?;
            let ns = namespace(req, &dm.metadata);
            dm.metadata.namespace = Some(ns);
            errors = validate::domain_mapping(&dm);
        }
        "Route" => {
            let (route, _): (Route, _) = parse(obj)?;
            errors = validate::route(&route);
            if let Some(old) = old
                && !owned(&route.metadata)
            {
                let (o, _): (Route, _) = parse(old)?;
                creator_and_modifier(
                    &o.metadata,
                    &route.metadata,
                    &o.spec,
                    &route.spec,
                    &mut errors,
                );
            }
        }
        _ => {}
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(failed(&errors))
    }
}

fn failed(errors: &[FieldError]) -> String {
    format!("validation failed: {}", validate::render(errors))
}

/// Knative's `VerifyNameChange`: a template with an explicit name may change only together
/// with its name (the name is the Revision's; the same name cannot be two revisions).
fn name_change(old: &RevisionTemplateSpec, new: &RevisionTemplateSpec, e: &mut Vec<FieldError>) {
    let name = new.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() || Some(name) != old.metadata.name.as_deref() {
        return;
    }
    let (a, b) = (
        serde_json::to_value(old).unwrap_or_default(),
        serde_json::to_value(new).unwrap_or_default(),
    );
    if a != b {
        e.push(
            FieldError::new(
                "spec.template.metadata.name",
                "Saw the following changes without a name change (-old +new)",
            )
            .details(short_diff(&a, &b)),
        );
    }
}

/// Knative's `ValidateCreatorAndModifier`: `creator` never changes; `lastModifier` changes
/// only with the spec.
fn creator_and_modifier<S: serde::Serialize>(
    old: &ObjectMeta,
    new: &ObjectMeta,
    old_spec: &S,
    new_spec: &S,
    e: &mut Vec<FieldError>,
) {
    let get = |m: &ObjectMeta, k: &str| m.annotations.as_ref().and_then(|a| a.get(k)).cloned();
    if get(old, CREATOR_ANNOTATION) != get(new, CREATOR_ANNOTATION) {
        e.push(FieldError::new(
            format!("metadata.annotations.{CREATOR_ANNOTATION}"),
            "annotation value is immutable",
        ));
    }
    let same_spec = serde_json::to_value(old_spec).ok() == serde_json::to_value(new_spec).ok();
    if same_spec && get(old, LAST_MODIFIER_ANNOTATION) != get(new, LAST_MODIFIER_ANNOTATION) {
        e.push(FieldError::new(
            format!("metadata.annotations.{LAST_MODIFIER_ANNOTATION}"),
            "annotation value is immutable",
        ));
    }
}

/// The differences between two JSON values, one field a block (`path:`, then `-: old` and
/// `+: new`), as Knative's `kmp.ShortDiff` lists them. Bounded: at most 20 fields, each value
/// cut at 200 characters.
pub fn short_diff(old: &Value, new: &Value) -> String {
    const MAX_FIELDS: usize = 20;
    const MAX_VALUE: usize = 200;
    let show = |v: Option<&Value>| match v {
        None => "(absent)".to_string(),
        Some(v) => {
            let s = v.to_string();
            if s.len() > MAX_VALUE {
                let cut = (0..=MAX_VALUE)
                    .rev()
                    .find(|i| s.is_char_boundary(*i))
                    .unwrap_or(0);
                format!("{}...", &s[..cut])
            } else {
                s
            }
        }
    };
    let ops = json_patch::diff(old, new).0;
    let mut out = Vec::new();
    for op in ops.iter().take(MAX_FIELDS) {
        let p = op.path().as_str();
        let field = p
            .trim_start_matches('/')
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect::<Vec<_>>()
            .join(".");
        out.push(format!(
            "{field}:\n\t-: {}\n\t+: {}",
            show(old.pointer(p)),
            show(new.pointer(p))
        ));
    }
    if ops.len() > MAX_FIELDS {
        out.push(format!("... and {} more", ops.len() - MAX_FIELDS));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests;
