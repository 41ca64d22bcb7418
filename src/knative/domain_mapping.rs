//! `serving.knative.dev/v1beta1` DomainMapping (a custom domain for a Service or Route) and
//! `networking.internal.knative.dev/v1alpha1` ClusterDomainClaim (which namespace may map a
//! domain), as Knative defines them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::duck;

/// Knative's `DomainMappingSpec`: the object the domain (the DomainMapping's name) maps to.
#[allow(
    clippy::duplicated_attributes,
    reason = "kube's printcolumn(...) repeats `type_ = \"string\"` by design"
)]
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "serving.knative.dev",
    version = "v1beta1",
    kind = "DomainMapping",
    namespaced,
    status = "DomainMappingStatus",
    derive = "PartialEq",
    shortname = "dm",
    category = "all",
    category = "knative",
    category = "serving",
    doc = "A Knative DomainMapping: the domain of its name served by a Service or Route.",
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
pub struct DomainMappingSpec {
    /// The Knative Service or Route (in the DomainMapping's namespace) the domain serves.
    #[serde(rename = "ref")]
    pub ref_: KReference,
    /// A Secret (in the DomainMapping's namespace) holding the domain's certificate: the
    /// domain is served over https with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SecretTls>,
}

/// Knative's `KReference`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Defaults to the DomainMapping's namespace; no other is allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Knative's `SecretTLS`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretTls {
    pub secret_name: String,
}

/// Knative's `DomainMappingStatus`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainMappingStatus {
    /// observedGeneration, conditions (`Ready`, `DomainClaimed`, `ReferenceResolved`,
    /// `IngressReady`, `CertificateProvisioned`).
    #[serde(flatten)]
    pub status: duck::Status,
    /// `http://{domain}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `http://{domain}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<duck::Addressable>,
}

/// Knative's `ClusterDomainClaimSpec`: the namespace whose DomainMappings may use the domain
/// (the claim's name).
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "networking.internal.knative.dev",
    version = "v1alpha1",
    kind = "ClusterDomainClaim",
    derive = "PartialEq",
    shortname = "cdc",
    category = "knative-internal",
    category = "networking",
    doc = "A Knative ClusterDomainClaim: the namespace that may map the domain of its name."
)]
pub struct ClusterDomainClaimSpec {
    pub namespace: String,
}
