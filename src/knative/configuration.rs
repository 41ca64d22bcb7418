//! `serving.knative.dev/v1` Configuration: the desired latest revision; each template change
//! stamps out a new [`Revision`](super::Revision).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{RevisionSpec, duck};

/// Knative's `ConfigurationSpec`.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube's printcolumn(...) repeats `type_ = \"string\"` by design"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Configuration",
    namespaced,
    status = "ConfigurationStatus",
    derive = "PartialEq",
    shortname = "config",
    shortname = "cfg",
    category = "all",
    category = "knative",
    category = "serving",
    doc = "A Knative Configuration: the template each new Revision is stamped from.",
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
pub struct ConfigurationSpec {
    /// The revision to create. Missing is accepted when parsing (validation reports it).
    #[serde(default)]
    pub template: RevisionTemplateSpec,
}

/// Knative's `RevisionTemplateSpec`: a revision's metadata and spec.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionTemplateSpec {
    /// Labels and annotations copied onto the revision (autoscaling annotations live here);
    /// `name` asks for that revision name instead of a generated one.
    #[serde(default, skip_serializing_if = "is_empty_meta")]
    pub metadata: ObjectMeta,
    /// The revision's spec.
    #[serde(default)]
    pub spec: RevisionSpec,
}

fn is_empty_meta(m: &ObjectMeta) -> bool {
    *m == ObjectMeta::default()
}

/// Knative's `ConfigurationStatusFields`: shared by Configuration and Service status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatusFields {
    /// The newest revision of this configuration that is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_ready_revision_name: Option<String>,
    /// The revision of the current generation (ready or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_created_revision_name: Option<String>,
}

/// Knative's `ConfigurationStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    /// observedGeneration, conditions (`Ready`), annotations.
    #[serde(flatten)]
    pub status: duck::Status,
    /// latestReadyRevisionName, latestCreatedRevisionName.
    #[serde(flatten)]
    pub fields: ConfigurationStatusFields,
}
