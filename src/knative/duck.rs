//! Knative's shared status pieces (`knative.dev/pkg/apis` and `apis/duck/v1`): [`Condition`],
//! the [`Status`] every serving object's status starts with, and [`Addressable`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The value of a [`Condition`]: Kubernetes' `ConditionStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold; `reason` and `message` say why.
    False,
    /// Not known yet (e.g. still deploying).
    #[default]
    Unknown,
}

/// How much a condition that is not `True` matters (`apis.ConditionSeverity`). Knative writes
/// no severity for errors (the default); only conditions outside the Ready set carry one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionSeverity {
    /// Worth a look, does not make the object unready.
    Warning,
    /// Informational only (e.g. `Active=False` on a revision at zero).
    Info,
}

/// One condition as Knative writes it (`apis.Condition`): `type`, `status`, `severity`,
/// `lastTransitionTime`, `reason`, `message`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's name: `Ready`, `Active`, `ContainerHealthy`, `ResourcesAvailable`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Absent for errors (the default severity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<ConditionSeverity>,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// One CamelCase word saying why (`NoTraffic`, `TimedOut`, `RevisionMissing`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A sentence for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Condition {
    /// A condition of `type_` with `status`, no reason, no time.
    pub fn new(type_: impl Into<String>, status: ConditionStatus) -> Self {
        Self {
            type_: type_.into(),
            status,
            ..Self::default()
        }
    }
}

/// The fields every Knative status starts with (`duckv1.Status`, inlined).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The object's conditions; at most one per type. A map keyed by `type` for server-side
    /// apply, so each writer owns its own conditions (the autoscaler `Active`, the controller
    /// the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Status annotations (Knative uses them for data that is not a condition).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Status {
    /// The condition of `type_`, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the condition of `type_` is present and `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.condition(type_)
            .is_some_and(|c| c.status == ConditionStatus::True)
    }

    /// Sets `c` in place of the condition of its type (Knative's `ConditionManager.SetCondition`):
    /// `lastTransitionTime` is kept when the status does not change, else set to `now`.
    /// Conditions stay sorted by type, as Knative keeps them.
    pub fn set(&mut self, mut c: Condition, now: &Time) {
        match self.conditions.iter_mut().find(|o| o.type_ == c.type_) {
            Some(old) => {
                c.last_transition_time = if old.status == c.status {
                    old.last_transition_time
                        .clone()
                        .or_else(|| Some(now.clone()))
                } else {
                    Some(now.clone())
                };
                *old = c;
            }
            None => {
                c.last_transition_time = Some(now.clone());
                self.conditions.push(c);
            }
        }
        self.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    }

    /// Sets the condition `ready` from `dependents` as Knative's living condition set does: the
    /// first `False` dependent makes it `False` with that dependent's reason and message; else
    /// the first `Unknown` (or missing) one makes it `Unknown`; else `True`.
    pub fn set_ready_from(&mut self, ready: &str, dependents: &[&str], now: &Time) {
        let mut result = Condition::new(ready, ConditionStatus::True);
        let mut unknown: Option<Condition> = None;
        for d in dependents {
            match self.condition(d) {
                Some(c) if c.status == ConditionStatus::False => {
                    result = Condition {
                        status: ConditionStatus::False,
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        ..Condition::new(ready, ConditionStatus::False)
                    };
                    unknown = None;
                    break;
                }
                Some(c) if c.status == ConditionStatus::True => {}
                other => {
                    if unknown.is_none() {
                        unknown = Some(Condition {
                            reason: other.and_then(|c| c.reason.clone()),
                            message: other.and_then(|c| c.message.clone()),
                            ..Condition::new(ready, ConditionStatus::Unknown)
                        });
                    }
                }
            }
        }
        if result.status == ConditionStatus::True
            && let Some(u) = unknown
        {
            result = u;
        }
        self.set(result, now);
    }
}

/// Where an object can be reached (`duckv1.Addressable`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Addressable {
    /// The address's name, when an object has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The URL (`http://hello.default.svc.cluster.local`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// PEM CA certificates to trust when `url` is https (Knative spells it `CACerts`).
    #[serde(rename = "CACerts", default, skip_serializing_if = "Option::is_none")]
    pub ca_certs: Option<String>,
    /// The OIDC audience of the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}
