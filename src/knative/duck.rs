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
