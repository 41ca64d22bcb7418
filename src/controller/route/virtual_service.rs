//! Istio's `networking.istio.io/v1` VirtualService: a hand-written subset, the fields the
//! Route reconciler writes (docs/decisions.md, "The Route reconciler").
//!
//! Field names and shapes are Istio's (`istio.io/api/networking/v1/virtual_service.proto`).
//! Unknown fields are ignored when read back; on a cluster Istio's own CRD (which names every
//! field) is installed, so nothing written here is pruned. The CRD generated from this type
//! ([`crd`]) is for the in-process API server of the tests only.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Istio's `VirtualService` spec: hosts, gateways and HTTP routes.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "VirtualService",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "vs",
    doc = "An Istio VirtualService (the subset thaw writes)."
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    /// The host names the routes apply to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// `namespace/name` of the Gateways the routes are attached to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// HTTP routes, first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpRoute>,
}

/// Istio's `HTTPRoute`: match conditions and the weighted destinations.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// For people reading the object (and Istio's access logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any one of these matches selects this route.
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub match_: Vec<HttpMatchRequest>,
    /// The weighted destinations; weights sum to 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<HttpRouteDestination>,
    /// Istio's request timeout (`"300s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Istio's retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    /// Header changes for every destination of this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    /// Istio's `HTTPRewrite`: the authority the request is forwarded with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
}

/// Istio's `HTTPRewrite` (the authority part).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HttpRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
}

/// Istio's `HTTPMatchRequest`: all given conditions must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatchRequest {
    /// The `Host` / `:authority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Request headers (lower-case names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StringMatch>,
    /// Only on these gateways (`namespace/name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
}

/// Istio's `StringMatch` (one of the three).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// RE2 syntax, anchored by the author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// Istio's `HTTPRouteDestination`: one weighted destination with its own header changes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteDestination {
    pub destination: Destination,
    /// Share of the route's traffic, 0..=100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Header changes for requests sent to this destination only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// Istio's `Destination`: a Kubernetes Service host and port.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// `{service}.{namespace}.svc.cluster.local`.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
}

/// Istio's `PortSelector`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct PortSelector {
    pub number: u32,
}

/// Istio's `Headers`: request and response header operations.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Istio's `HeaderOperations`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct HeaderOperations {
    /// Overwrites the header.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Appends a value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    /// Removes the header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// Istio's `HTTPRetry`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRetry {
    /// Absent means 0 (proto3's default): retries off. net-istio writes `retries: {}`, so a
    /// VirtualService it left must read back.
    #[serde(default)]
    pub attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
}

/// The CRD of this subset, for an API server without Istio (the tests').
pub fn crd() -> CustomResourceDefinition {
    VirtualService::crd()
}

/// Istio's `Gateway` spec (the subset thaw writes for a route's TLS hosts): the gateway pods it
/// configures and their servers.
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "Gateway",
    plural = "gateways",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    shortname = "gw",
    doc = "An Istio Gateway (the subset thaw writes)."
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The labels of the gateway pods this Gateway configures.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// The ports, protocols and hosts the pods serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<Server>,
}

/// Istio's `Server`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct Server {
    pub port: ServerPort,
    /// The hosts served on this port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
}

/// Istio's `Port` of a server.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ServerPort {
    pub number: u32,
    /// `HTTP` or `HTTPS`.
    pub protocol: String,
    pub name: String,
}

/// Istio's `ServerTLSSettings` (the parts thaw sets).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerTlsSettings {
    /// On an HTTP server: answer every request with a redirect to https.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_redirect: Option<bool>,
    /// `SIMPLE`: TLS terminated with the credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The Secret (in the gateway pods' namespace) with `tls.crt` and `tls.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
}

/// The CRD of the Gateway subset, for an API server without Istio (the tests').
pub fn gateway_crd() -> CustomResourceDefinition {
    Gateway::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// net-istio writes `retries: {}` (retries off); such a VirtualService must read back,
    /// or one of them would stop every typed watch of the kind.
    #[test]
    fn an_empty_retry_policy_reads_as_no_retries() {
        let r: HttpRetry = serde_json::from_str("{}").unwrap();
        assert_eq!(r.attempts, 0);
        assert_eq!(r.per_try_timeout, None);
    }
}
