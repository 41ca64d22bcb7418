//! Traffic resolution, as Knative's `traffic.BuildTrafficConfiguration`: a Route's targets
//! flattened to revisions. Pure: the reconcile fetches what [`referenced`] names and hands it
//! over in a [`Referenced`].
//!
//! - `configurationName` (with or without `latestRevision: true`) → that Configuration's
//!   `latestReadyRevisionName`. A configuration has one only once a revision of it was Ready,
//!   so a rollout moves traffic only when the new revision is Ready: while the latest
//!   created revision is not, the target stays on the latest ready one.
//! - `revisionName` → that revision, which must exist and be Ready.
//! - A target with neither, on a Service's route (its controller owner), is the Service's
//!   configuration (Knative's `MakeRoute` fills it in).
//! - Identical (revision, tag, latestRevision) entries have their percents merged.
//! - Every target is in the default group with its percent; a tagged one also forms its own
//!   group at 100%.
//! - Errors are deferred until every target was looked at; a failure (`False`) wins over a
//!   not-ready (`Unknown`), else the first is kept — Knative's order.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use crate::knative::duck::ConditionStatus;
use crate::knative::names::labels;
use crate::knative::{Configuration, Revision, Route, TrafficTarget, condition};

/// The Configurations and Revisions a route refers to, by name (those that exist).
#[derive(Debug, Clone, Default)]
pub struct Referenced {
    pub configurations: BTreeMap<String, Configuration>,
    pub revisions: BTreeMap<String, Revision>,
}

/// One revision the route sends traffic to, at the revision level (Knative's
/// `RevisionTarget`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionTarget {
    pub tag: Option<String>,
    pub revision: String,
    /// The configuration it came from (the target's, or the revision's label).
    pub configuration: Option<String>,
    pub latest_revision: Option<bool>,
    pub percent: Option<i64>,
    /// The revision serves HTTP/2 cleartext (its port is named `h2c`): port 81.
    pub h2c: bool,
    /// The revision's `timeoutSeconds`, when set.
    pub timeout_seconds: Option<i64>,
}

/// The resolved traffic of a route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Traffic {
    /// The flattened targets, merged, in spec order: `status.traffic`.
    pub targets: Vec<RevisionTarget>,
    /// `None`: the default group (every target); `Some(tag)`: the tag's own group. Each
    /// group's revisions are distinct; a group of one carries 100%.
    pub groups: BTreeMap<Option<String>, Vec<RevisionTarget>>,
}

/// Why the traffic cannot be assigned (Knative's `TargetError`s), each with its condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// A referenced Configuration or Revision does not exist: `<Kind>Missing`, False.
    Missing { kind: &'static str, name: String },
    /// A configuration has no ready revision yet (`failed`: its Ready is False).
    ConfigurationNotReady { name: String, failed: bool },
    /// A named revision is not Ready (`failed`: its Ready is False).
    RevisionNotReady { name: String, failed: bool },
    /// A target names neither a revision nor a configuration.
    NoTarget { index: usize },
    /// A Service's route names a revision of another Service (`owner`: that Service), or of
    /// none (`owner: None`).
    NotOwned {
        revision: String,
        service: String,
        owner: Option<String>,
    },
    /// The route fails Knative's validation ([`crate::knative::validate::route`]): False
    /// `InvalidSpec` with the rendered field errors.
    Invalid(String),
}

impl TargetError {
    /// Whether the route failed (False), as opposed to waiting (Unknown).
    pub fn is_failure(&self) -> bool {
        match self {
            Self::Missing { .. }
            | Self::NoTarget { .. }
            | Self::Invalid(_)
            | Self::NotOwned { .. } => true,
            Self::ConfigurationNotReady { failed, .. } | Self::RevisionNotReady { failed, .. } => {
                *failed
            }
        }
    }

    /// `AllTrafficAssigned`'s (status, reason, message), Knative's words.
    pub fn condition(&self) -> (ConditionStatus, String, String) {
        let status = if self.is_failure() {
            ConditionStatus::False
        } else {
            ConditionStatus::Unknown
        };
        let (reason, message) = match self {
            Self::Missing { kind, name } => (
                format!("{kind}Missing"),
                format!("{kind} \"{name}\" referenced in traffic not found."),
            ),
            Self::ConfigurationNotReady { name, failed: true } => (
                "RevisionMissing".into(),
                format!("Configuration \"{name}\" does not have any ready Revision."),
            ),
            Self::ConfigurationNotReady {
                name,
                failed: false,
            } => (
                "RevisionMissing".into(),
                format!("Configuration \"{name}\" is waiting for a Revision to become ready."),
            ),
            Self::RevisionNotReady { name, failed: true } => (
                "RevisionMissing".into(),
                format!("Revision \"{name}\" failed to become ready."),
            ),
            Self::RevisionNotReady {
                name,
                failed: false,
            } => (
                "RevisionMissing".into(),
                format!("Revision \"{name}\" is not yet ready."),
            ),
            Self::NotOwned {
                revision,
                service,
                owner: Some(other),
            } => (
                "RevisionNotOwned".into(),
                format!(
                    "Revision \"{revision}\" belongs to Service \"{other}\", not Service \"{service}\"."
                ),
            ),
            Self::NotOwned {
                revision,
                service,
                owner: None,
            } => (
                "RevisionNotOwned".into(),
                format!("Revision \"{revision}\" does not belong to Service \"{service}\"."),
            ),
            Self::Invalid(message) => (
                crate::knative::validate::reason::INVALID_SPEC.into(),
                message.clone(),
            ),
            Self::NoTarget { index } => (
                "Unknown".into(),
                format!(
                    "spec.traffic[{index}]: expected exactly one of revisionName or \
                     configurationName"
                ),
            ),
        };
        (status, reason, message)
    }
}

/// The Knative Service that controls `route` (its owner reference: the
/// `serving.knative.dev/service` label's value is a hash for a long name).
pub fn service_of(route: &Route) -> Option<String> {
    route
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Service")
        .map(|o| o.name.clone())
}

/// The configuration a target refers to, if any (see the module docs for a Service's route).
fn target_configuration(route: &Route, t: &TrafficTarget) -> Option<String> {
    if t.revision_name.is_some() {
        return None;
    }
    t.configuration_name.clone().or_else(|| service_of(route))
}

/// What the reconcile must fetch: the configurations named by the spec, then (given those)
/// the revisions: named ones and each configuration's latest ready and latest created.
pub fn referenced_configurations(route: &Route) -> BTreeSet<String> {
    route
        .spec
        .traffic
        .iter()
        .filter_map(|t| target_configuration(route, t))
        .collect()
}

/// The revisions to fetch once `configurations` are known.
pub fn referenced_revisions(
    route: &Route,
    configurations: &BTreeMap<String, Configuration>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = route
        .spec
        .traffic
        .iter()
        .filter_map(|t| t.revision_name.clone())
        .collect();
    out.extend(route.status.iter().flat_map(|s| {
        s.fields
            .traffic
            .iter()
            .filter_map(|t| t.revision_name.clone())
    }));
    for c in configurations.values() {
        if let Some(s) = &c.status {
            out.extend(s.fields.latest_ready_revision_name.clone());
            out.extend(s.fields.latest_created_revision_name.clone());
        }
    }
    out
}

fn ready_status(conditions: &crate::knative::duck::Status) -> ConditionStatus {
    conditions
        .condition(condition::READY)
        .map_or(ConditionStatus::Unknown, |c| c.status)
}

/// Whether `rev` is Ready.
pub fn revision_ready(rev: &Revision) -> bool {
    rev.status
        .as_ref()
        .is_some_and(|s| ready_status(&s.status) == ConditionStatus::True)
}

fn revision_is_h2c(rev: &Revision) -> bool {
    rev.spec
        .pod_spec
        .containers
        .first()
        .and_then(|c| c.ports.as_ref()?.first()?.name.as_deref())
        == Some("h2c")
}

/// Resolves `route`'s traffic against `refs`.
pub fn resolve(route: &Route, refs: &Referenced) -> Result<Traffic, TargetError> {
    let mut deferred: Option<TargetError> = None;
    let mut defer = |e: TargetError| {
        if deferred.is_none() || e.is_failure() {
            deferred = Some(e);
        }
    };
    let mut flat: Vec<RevisionTarget> = Vec::new();
    for (index, t) in route.spec.traffic.iter().enumerate() {
        let (rev, configuration) = if let Some(name) = &t.revision_name {
            let Some(rev) = refs.revisions.get(name) else {
                defer(TargetError::Missing {
                    kind: "Revision",
                    name: name.clone(),
                });
                continue;
            };
            // A Service's route may only pin the Service's own revisions.
            if let Some(service) = service_of(route) {
                let owner = rev.labels().get(labels::SERVICE);
                if owner != Some(&labels::value(&service)) {
                    defer(TargetError::NotOwned {
                        revision: name.clone(),
                        service,
                        owner: owner.cloned(),
                    });
                    continue;
                }
            }
            if !revision_ready(rev) {
                let failed = rev
                    .status
                    .as_ref()
                    .is_some_and(|s| ready_status(&s.status) == ConditionStatus::False);
                defer(TargetError::RevisionNotReady {
                    name: name.clone(),
                    failed,
                });
                continue;
            }
            (rev, super::labeler::configuration_of(rev))
        } else if let Some(cfg_name) = target_configuration(route, t) {
            let Some(cfg) = refs.configurations.get(&cfg_name) else {
                defer(TargetError::Missing {
                    kind: "Configuration",
                    name: cfg_name,
                });
                continue;
            };
            let latest_ready = cfg
                .status
                .as_ref()
                .and_then(|s| s.fields.latest_ready_revision_name.as_deref());
            let Some(latest_ready) = latest_ready else {
                let failed = cfg
                    .status
                    .as_ref()
                    .is_some_and(|s| ready_status(&s.status) == ConditionStatus::False);
                defer(TargetError::ConfigurationNotReady {
                    name: cfg_name,
                    failed,
                });
                continue;
            };
            let Some(rev) = refs.revisions.get(latest_ready) else {
                defer(TargetError::Missing {
                    kind: "Revision",
                    name: latest_ready.to_string(),
                });
                continue;
            };
            // The latest ready revision failed since (its pods crash): Knative fails the
            // target rather than send traffic to it.
            if rev
                .status
                .as_ref()
                .is_some_and(|s| ready_status(&s.status) == ConditionStatus::False)
            {
                defer(TargetError::RevisionNotReady {
                    name: latest_ready.to_string(),
                    failed: true,
                });
                continue;
            }
            (rev, Some(cfg_name))
        } else {
            defer(TargetError::NoTarget { index });
            continue;
        };
        let target = RevisionTarget {
            tag: t.tag.clone(),
            revision: rev.name_any(),
            configuration,
            // Knative's defaulting: latestRevision is false for a revisionName target.
            latest_revision: Some(t.latest_revision.unwrap_or(t.revision_name.is_none())),
            percent: t.percent,
            h2c: revision_is_h2c(rev),
            timeout_seconds: rev.spec.timeout_seconds.filter(|s| *s > 0),
        };
        merge_if_identical(&mut flat, target);
    }
    if let Some(e) = deferred {
        return Err(e);
    }
    let mut groups: BTreeMap<Option<String>, Vec<RevisionTarget>> = BTreeMap::new();
    for t in &flat {
        groups.entry(None).or_default().push(t.clone());
        if let Some(tag) = &t.tag {
            groups.entry(Some(tag.clone())).or_default().push(t.clone());
        }
    }
    let groups = groups
        .into_iter()
        .map(|(k, v)| (k, consolidate(v)))
        .collect();
    Ok(Traffic {
        targets: flat,
        groups,
    })
}

/// Knative's `mergeIfNecessary`: the same (tag, revision, latestRevision) adds its percent.
fn merge_if_identical(flat: &mut Vec<RevisionTarget>, t: RevisionTarget) {
    if let Some(same) = flat.iter_mut().find(|f| {
        f.tag == t.tag && f.revision == t.revision && f.latest_revision == t.latest_revision
    }) {
        same.percent = Some(same.percent.unwrap_or(0) + t.percent.unwrap_or(0));
    } else {
        flat.push(t);
    }
}

/// Knative's `consolidate`: one entry per revision (percents added), 100% for a lone one.
fn consolidate(targets: Vec<RevisionTarget>) -> Vec<RevisionTarget> {
    let mut out: Vec<RevisionTarget> = Vec::with_capacity(targets.len());
    for t in targets {
        if let Some(same) = out.iter_mut().find(|o| o.revision == t.revision) {
            if let Some(p) = t.percent {
                same.percent = Some(same.percent.unwrap_or(0) + p);
            }
        } else {
            out.push(t);
        }
    }
    if let [only] = out.as_mut_slice() {
        only.percent = Some(100);
    }
    out
}

#[cfg(test)]
#[path = "traffic_tests.rs"]
mod tests;
