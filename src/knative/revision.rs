//! `serving.knative.dev/v1` Revision: an immutable snapshot of code and configuration.
//!
//! The spec is Knative's `RevisionSpec`: every field of a Kubernetes `PodSpec` inline (so a
//! user's pod spec reaches the Deployment whole, never re-typed field by field), plus the four
//! serving fields. The status is Knative's `RevisionStatus`.
//!
//! **Who writes what.** The controller owns the spec, `conditions` other than `Active`,
//! `logUrl` and the container statuses. The autoscaler owns `actualReplicas`,
//! `desiredReplicas` and the `Active` condition, written with its own field manager.

use k8s_openapi::api::core::v1::PodSpec;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duck;

/// Knative's `RevisionSpec`: a pod spec and how requests are served.
///
/// Unknown fields are ignored when deserialising (as everywhere in this module): the API
/// server prunes what the schema does not name, and a caller that must report unknown fields
/// (local.yaml) checks for them itself.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube's printcolumn(...) repeats `type_ = \"string\"` by design"
)]
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Revision",
    namespaced,
    status = "RevisionStatus",
    derive = "PartialEq",
    shortname = "rev",
    category = "all",
    category = "knative",
    category = "serving",
    doc = "A Knative Revision: an immutable snapshot of code and configuration.",
    printcolumn(
        name = "Config Name",
        type_ = "string",
        json_path = ".metadata.labels['serving\\.knative\\.dev/configuration']"
    ),
    printcolumn(
        name = "Generation",
        type_ = "string",
        json_path = ".metadata.labels['serving\\.knative\\.dev/configurationGeneration']"
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
    ),
    printcolumn(
        name = "Actual Replicas",
        type_ = "integer",
        json_path = ".status.actualReplicas"
    ),
    printcolumn(
        name = "Desired Replicas",
        type_ = "integer",
        json_path = ".status.desiredReplicas"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSpec {
    /// The pod: containers, volumes, service account, ... (a `corev1.PodSpec`, inline).
    #[serde(flatten)]
    pub pod_spec: PodSpec,
    /// Requests a replica serves at once; 0 means no limit. `None`: the default of
    /// `config-defaults` (`container-concurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_concurrency: Option<i64>,
    /// The longest a request may take, in seconds. `None` or 0: `revision-timeout-seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    /// The longest wait for the first response byte, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_start_timeout_seconds: Option<i64>,
    /// The longest gap between bytes of a response, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i64>,
}

/// Knative's `RevisionStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionStatus {
    /// observedGeneration, conditions, annotations.
    #[serde(flatten)]
    pub status: duck::Status,
    /// Where the revision's logs can be read (from `config-observability`).
    #[serde(default, rename = "logUrl", skip_serializing_if = "Option::is_none")]
    pub log_url: Option<String>,
    /// The resolved image digest of each container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_statuses: Vec<ContainerStatus>,
    /// The resolved image digest of each init container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_container_statuses: Vec<ContainerStatus>,
    /// Ready replicas (written by the autoscaler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_replicas: Option<i32>,
    /// Replicas the autoscaler asks for (written by the autoscaler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
}

/// One container's resolved image (Knative's `ContainerStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The container's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `registry/image@sha256:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
}

/// Knative's revision condition types.
pub mod condition {
    /// `ResourcesAvailable` ∧ `ContainerHealthy`.
    pub const READY: &str = "Ready";
    /// The Deployment and its pods came up.
    pub const RESOURCES_AVAILABLE: &str = "ResourcesAvailable";
    /// The containers run without crashing.
    pub const CONTAINER_HEALTHY: &str = "ContainerHealthy";
    /// Serving traffic (False with `NoTraffic` at zero): the autoscaler's, outside Ready.
    pub const ACTIVE: &str = "Active";
    /// thaw's own (Knative keeps it on the PodAutoscaler): the revision once reached its
    /// initial scale. Written True once by the autoscaler, never set back; severity Info, so
    /// outside Ready. A later autoscaler leader reads it: initial scale applies only to a
    /// revision never initialized.
    pub const SCALE_TARGET_INITIALIZED: &str = "ScaleTargetInitialized";
}
