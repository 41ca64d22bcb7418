//! The HTTP headers thaw's own parts exchange (Knative's `networking/pkg/http/header`), and
//! the list of those a client must never be able to send ([`INTERNAL`]).
//!
//! The ingress (the Route's VirtualServices) removes every [`INTERNAL`] header from client
//! requests before it sets the per-destination ones, so what the activator and the queue
//! sidecar read in them was written by thaw: which revision a request is for, that it came
//! through the activator, the client's original host, a probe and its hash.

/// The revision's namespace, set by the ingress on each destination (the activator routes by
/// it).
pub const SERVING_NAMESPACE: &str = "Knative-Serving-Namespace";
/// The revision's name, set by the ingress on each destination.
pub const SERVING_REVISION: &str = "Knative-Serving-Revision";
/// Set by the activator on what it forwards: the queue sidecar counts the request as proxied.
pub const PROXY_REQUEST: &str = "K-Proxy-Request";
/// The client's `Host`, moved aside by the activator when `Host` becomes the pod.
pub const ORIGINAL_HOST: &str = "K-Original-Host";
/// A probe: `probe` (the ingress prober), `activator` (the autoscaler), `queue` (the
/// activator's pod probe).
pub const NETWORK_PROBE: &str = "K-Network-Probe";
/// The ingress prober's hash: the ingress sets it on probe requests, the backend echoes it.
pub const NETWORK_HASH: &str = "K-Network-Hash";
/// Knative's mesh passthrough marker (activator to pod through the private Service).
pub const PASSTHROUGH_LB: &str = "K-Passthrough-Lb";
/// Marks a kubelet probe: the queue sidecar answers its readiness instead of the app.
pub const KUBELET_PROBE: &str = "K-Kubelet-Probe";

/// `K-Network-Probe`'s value on the ingress prober's requests.
pub const PROBE_VALUE: &str = "probe";
/// `K-Network-Hash`'s value on the ingress prober's requests: the ingress route matching it
/// replaces it with the route's current hash (net-istio's `HashValueOverride`).
pub const HASH_VALUE_OVERRIDE: &str = "override";
/// The ingress prober's `User-Agent` (Knative's `IngressReadinessUserAgent`).
pub const INGRESS_PROBE_USER_AGENT: &str = "Knative-Ingress-Probe";

/// Every header thaw treats as internal: meaningful only when one of its parts wrote it.
/// The ingress removes them all from client requests (the probe route keeps the two the
/// prober sends, [`NETWORK_PROBE`] and [`NETWORK_HASH`], and sets the hash).
pub const INTERNAL: &[&str] = &[
    SERVING_NAMESPACE,
    SERVING_REVISION,
    PROXY_REQUEST,
    ORIGINAL_HOST,
    NETWORK_PROBE,
    NETWORK_HASH,
    PASSTHROUGH_LB,
    KUBELET_PROBE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_internal_header_is_a_valid_distinct_name() {
        let mut seen = std::collections::BTreeSet::new();
        for h in INTERNAL {
            http::HeaderName::from_bytes(h.as_bytes()).unwrap();
            assert!(seen.insert(h.to_ascii_lowercase()), "{h} twice");
        }
        // The activator's and the sidecar's names are the same headers.
        for h in [
            crate::activator::headers::KNATIVE_SERVING_NAMESPACE,
            crate::activator::headers::KNATIVE_SERVING_REVISION,
            crate::activator::headers::K_PROXY_REQUEST,
            crate::activator::headers::K_ORIGINAL_HOST,
            crate::activator::headers::K_NETWORK_PROBE,
            crate::activator::headers::K_NETWORK_HASH,
            crate::activator::headers::K_KUBELET_PROBE,
        ] {
            assert!(seen.contains(h.as_str()), "{h} is not in INTERNAL");
        }
    }
}
