//! net-istio's older `config-istio` keys, one per gateway: `gateway.{namespace}.{name}` (an
//! external gateway) and `local-gateway.{namespace}.{name}` (a cluster-local one), each valued
//! with the address of the gateway's Kubernetes Service (`istio-ingressgateway.istio-system.svc.cluster.local`).
//!
//! The rule thaw implements is net-istio's (`NewIstioFromConfigMap`, the release Knative
//! Serving v1.15 ships with):
//! - The older keys are read only when neither `external-gateways` nor `local-gateways` is
//!   given. Both forms at once is refused, naming the first older key, as net-istio refuses
//!   such a ConfigMap (`... can not be defined simultaneously ...`): nothing an operator wrote
//!   is silently dropped, and a config-istio net-istio would not have loaded is not one thaw
//!   serves with.
//! - `{namespace}` is optional: `gateway.{name}` names a gateway in `knative-serving`, the
//!   namespace net-istio (and thaw's defaults) keep the Knative gateways in.
//! - Gateways of one kind are taken in the order of their keys; a kind with no key keeps its
//!   default gateway.
//! - The service address must be a host name (net-istio: a DNS-1123 subdomain), the gateway's
//!   name and namespace DNS labels; a bad one is refused naming its key.
//! - `local-gateway.mesh: mesh` (deprecated in net-istio, knative/serving#11523) has no effect
//!   in thaw and is named as such.

use std::collections::BTreeMap;

use super::{Gateway, is_dns_name};
use crate::config::parse::Problem;

/// The prefix of an older external gateway key.
pub const GATEWAY_PREFIX: &str = "gateway.";
/// The prefix of an older cluster-local gateway key.
pub const LOCAL_GATEWAY_PREFIX: &str = "local-gateway.";
/// The namespace of a gateway whose key names none (net-istio's system namespace).
pub const DEFAULT_GATEWAY_NAMESPACE: &str = "knative-serving";
/// The deprecated mesh-only local gateway key.
const MESH_KEY: &str = "local-gateway.mesh";

/// The current key an older key is read as (`external-gateways` or `local-gateways`), or
/// `None` for a key that is not one of them.
pub fn read_as(key: &str) -> Option<&'static str> {
    if key == MESH_KEY {
        None
    } else if key.starts_with(GATEWAY_PREFIX) {
        Some("external-gateways")
    } else if key.starts_with(LOCAL_GATEWAY_PREFIX) {
        Some("local-gateways")
    } else {
        None
    }
}

/// Whether `key` is an older gateway key (read or not).
pub fn is_legacy(key: &str) -> bool {
    key.starts_with(GATEWAY_PREFIX) || key.starts_with(LOCAL_GATEWAY_PREFIX)
}

/// The older keys of a `data:` map, read.
#[derive(Debug, Default)]
pub struct Legacy {
    /// The external gateways, in key order.
    pub external: Vec<Gateway>,
    /// The cluster-local gateways, in key order.
    pub local: Vec<Gateway>,
    /// The keys read into `external` and `local`.
    pub read: Vec<String>,
    /// Bad values, each naming its key.
    pub problems: Vec<Problem>,
    /// Older keys with no effect, `{key}: {why}`.
    pub warnings: Vec<String>,
}

impl Legacy {
    /// Reads every older key of `data` (a `BTreeMap`, so in key order, as net-istio sorts
    /// them).
    pub fn read(data: &BTreeMap<String, String>) -> Self {
        let mut out = Self::default();
        for (k, v) in data {
            let (prefix, list) = if let Some(rest) = k.strip_prefix(GATEWAY_PREFIX) {
                (rest, &mut out.external)
            } else if let Some(rest) = k.strip_prefix(LOCAL_GATEWAY_PREFIX) {
                (rest, &mut out.local)
            } else {
                continue;
            };
            if k == MESH_KEY {
                out.warnings.push(format!(
                    "{k}: net-istio's deprecated mesh-only gateway (knative/serving#11523), no \
                     effect in thaw: cluster-local hosts go on the local gateways"
                ));
                continue;
            }
            match gateway(prefix, v) {
                Ok(g) => {
                    list.push(g);
                    out.read.push(k.clone());
                }
                Err(reason) => out.problems.push(Problem::new(k, v, reason)),
            }
        }
        out
    }

    /// Whether any older key names a gateway (read or refused).
    pub fn any(&self) -> bool {
        !self.read.is_empty() || !self.problems.is_empty()
    }
}

/// One gateway from the part of its key after the prefix (`{namespace}.{name}` or `{name}`)
/// and its value (the Service's address).
fn gateway(rest: &str, service: &str) -> Result<Gateway, String> {
    let (namespace, name) = rest
        .split_once('.')
        .unwrap_or((DEFAULT_GATEWAY_NAMESPACE, rest));
    let label = |l: &str| is_dns_name(l) && !l.contains('.');
    if !label(name) {
        return Err(format!(
            "the key's gateway name \"{name}\" is not a DNS label (the key is \
             gateway.{{namespace}}.{{name}})"
        ));
    }
    if !label(namespace) {
        return Err(format!(
            "the key's gateway namespace \"{namespace}\" is not a DNS label"
        ));
    }
    let service = service.trim();
    let host = service.strip_suffix('.').unwrap_or(service);
    if !is_dns_name(host) {
        return Err(format!(
            "must be the gateway Service's address (svc.namespace.svc.cluster.local); \
             \"{service}\" is not a host name"
        ));
    }
    Ok(Gateway::new(namespace, name, host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_key_is_a_gateway_and_its_value_the_service() {
        let l = Legacy::read(&data(&[
            (
                "gateway.knative-serving.knative-ingress-gateway",
                "istio-ingressgateway.istio-system.svc.cluster.local",
            ),
            ("gateway.public", "public-gw.edge.svc.cluster.local."),
            (
                "local-gateway.knative-serving.knative-local-gateway",
                "knative-local-gateway.istio-system.svc.cluster.local",
            ),
            ("local-gateway.mesh", "mesh"),
            ("external-gateways", "ignored here"),
        ]));
        assert!(l.problems.is_empty(), "{:?}", l.problems);
        let refs: Vec<(String, &str)> = l
            .external
            .iter()
            .map(|g| (g.reference(), g.service.as_str()))
            .collect();
        assert_eq!(
            refs,
            [
                (
                    "knative-serving/knative-ingress-gateway".to_string(),
                    "istio-ingressgateway.istio-system.svc.cluster.local"
                ),
                (
                    "knative-serving/public".to_string(),
                    "public-gw.edge.svc.cluster.local"
                ),
            ]
        );
        assert_eq!(
            l.local[0].reference(),
            "knative-serving/knative-local-gateway"
        );
        assert_eq!(l.local.len(), 1, "the mesh key is no gateway");
        assert_eq!(l.read.len(), 3);
        assert_eq!(l.warnings.len(), 1);
        assert!(
            l.warnings[0].starts_with("local-gateway.mesh: "),
            "{:?}",
            l.warnings
        );
        assert_eq!(
            read_as("gateway.knative-serving.knative-ingress-gateway"),
            Some("external-gateways")
        );
        assert_eq!(read_as("local-gateway.x.y"), Some("local-gateways"));
        assert_eq!(read_as("local-gateway.mesh"), None);
        assert_eq!(read_as("external-gateways"), None);
    }

    #[test]
    fn a_bad_service_or_name_is_refused_naming_the_key() {
        let l = Legacy::read(&data(&[
            ("gateway.ns.gw", "not a host"),
            ("local-gateway.ns.Bad_Name", "x.y.svc.cluster.local"),
        ]));
        assert!(l.external.is_empty() && l.local.is_empty());
        let keys: Vec<&str> = l.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["gateway.ns.gw", "local-gateway.ns.Bad_Name"]);
        assert!(l.problems[0].reason.contains("not a host name"));
        assert!(l.problems[1].reason.contains("not a DNS label"));
        assert!(l.any());
    }
}
