//! `serving.knative.dev/v1` Service: a Configuration and a Route under one name.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigurationSpec, ConfigurationStatusFields, RouteSpec, RouteStatusFields, duck};

/// Knative's `ServiceSpec`: `ConfigurationSpec` and `RouteSpec` inline (`template`, `traffic`).
#[allow(
    clippy::duplicated_attributes,
    reason = "kube's printcolumn(...) repeats `type_ = \"string\"` by design"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Service",
    namespaced,
    status = "ServiceStatus",
    derive = "PartialEq",
    shortname = "kservice",
    shortname = "ksvc",
    category = "all",
    category = "knative",
    category = "serving",
    doc = "A Knative Service: a Configuration and a Route under one name.",
    printcolumn(name = "URL", type_ = "string", json_path = ".status.url"),
    printcolumn(
        name = "LatestCreated",
        type_ = "string",
        json_path = ".status.latestCreatedRevisionName"
    ),
    printcolumn(
        name = "LatestReady",
        type_ = "string",
        json_path = ".status.latestReadyRevisionName"
    ),
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
pub struct ServiceSpec {
    /// `template`.
    #[serde(flatten)]
    pub configuration: ConfigurationSpec,
    /// `traffic`; empty means 100 % to the latest ready revision.
    #[serde(flatten)]
    pub route: RouteSpec,
}

/// Knative's `ServiceStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// observedGeneration, conditions (`Ready`, `ConfigurationsReady`, `RoutesReady`),
    /// annotations.
    #[serde(flatten)]
    pub status: duck::Status,
    /// latestReadyRevisionName, latestCreatedRevisionName (mirrored from the Configuration).
    #[serde(flatten)]
    pub configuration: ConfigurationStatusFields,
    /// url, address, traffic (mirrored from the Route).
    #[serde(flatten)]
    pub route: RouteStatusFields,
}
