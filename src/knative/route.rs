//! `serving.knative.dev/v1` Route: named endpoints and the traffic split between revisions.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duck;

/// Knative's `RouteSpec`.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube's printcolumn(...) repeats `type_ = \"string\"` by design"
)]
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Route",
    namespaced,
    status = "RouteStatus",
    derive = "PartialEq",
    shortname = "rt",
    category = "all",
    category = "knative",
    category = "serving",
    doc = "A Knative Route: host names and the traffic split between revisions.",
    printcolumn(name = "URL", type_ = "string", json_path = ".status.url"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// How traffic is split; percents of the untagged-or-tagged targets sum to 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
}

/// One entry of a traffic split (Knative's `TrafficTarget`), in spec and in status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficTarget {
    /// Also serves this target at `{tag}-{route}.{namespace}.{domain}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// A fixed revision (exclusive with `configurationName` and `latestRevision: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Follows this configuration's latest ready revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_name: Option<String>,
    /// `true`: the latest ready revision (of the Service's configuration); `false`: the
    /// revision named in `revisionName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<bool>,
    /// Share of the traffic, 0..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i64>,
    /// Status only: where this target is reached (its tag's URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// Knative's `RouteStatusFields`: shared by Route and Service status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatusFields {
    /// The external URL (`http://hello.default.example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The cluster-local address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<duck::Addressable>,
    /// The split in force, with revision names resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
}

/// Knative's `RouteStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// observedGeneration, conditions (`Ready`, `AllTrafficAssigned`, `IngressReady`,
    /// `CertificateProvisioned`), annotations.
    #[serde(flatten)]
    pub status: duck::Status,
    /// url, address, traffic.
    #[serde(flatten)]
    pub fields: RouteStatusFields,
}
