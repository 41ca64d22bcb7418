//! Request -> revision (knative-dataplane.md §1.2, §1.8): Knative's probe headers first, then
//! `Knative-Serving-Namespace` + `Knative-Serving-Revision`, else the `Host` (or, on HTTP/2, the
//! `:authority`) looked up in the catalog's host table. Pure functions of the request head.

use http::Uri;
use http::header::{self, HeaderMap, HeaderValue};

use super::headers::{
    K_KUBELET_PROBE, K_NETWORK_HASH, K_NETWORK_PROBE, KNATIVE_SERVING_NAMESPACE,
    KNATIVE_SERVING_REVISION,
};

/// A Knative probe, answered by the activator itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A kubelet probe (`User-Agent: kube-probe/*` or `K-Kubelet-Probe`): health.
    Health,
    /// `K-Network-Probe: activator`: 200 `activator` (the autoscaler checks the activator is in
    /// the path).
    Activator,
    /// `K-Network-Probe: probe`: the ingress prober; echo `K-Network-Hash` (400 if missing).
    Network(Option<HeaderValue>),
    /// Any other `K-Network-Probe` value: 400.
    Unknown,
}

/// Classifies a request as a probe, or `None` for ordinary traffic.
pub fn probe(headers: &HeaderMap) -> Option<Probe> {
    let kube_probe = headers
        .get(header::USER_AGENT)
        .is_some_and(|ua| ua.as_bytes().starts_with(b"kube-probe/"));
    if kube_probe || headers.contains_key(K_KUBELET_PROBE) {
        return Some(Probe::Health);
    }
    let value = headers.get(K_NETWORK_PROBE)?;
    Some(match value.as_bytes() {
        b"" => return None,
        b"activator" => Probe::Activator,
        b"probe" => Probe::Network(headers.get(K_NETWORK_HASH).cloned()),
        _ => Probe::Unknown,
    })
}

/// Where a request asks to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Knative's routing headers name the revision.
    Named {
        /// `Knative-Serving-Namespace`.
        namespace: &'a str,
        /// `Knative-Serving-Revision`.
        name: &'a str,
    },
    /// Route by host (without port; case is handled by the catalog).
    Host(&'a str),
}

/// The request's target, or a one-line reason why it has none.
pub fn target<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Result<Target<'a>, String> {
    let ns = headers
        .get(KNATIVE_SERVING_NAMESPACE)
        .map(HeaderValue::to_str);
    let rev = headers
        .get(KNATIVE_SERVING_REVISION)
        .map(HeaderValue::to_str);
    match (ns, rev) {
        (Some(Ok(namespace)), Some(Ok(name))) if !namespace.is_empty() && !name.is_empty() => {
            return Ok(Target::Named { namespace, name });
        }
        (None, None) => {}
        _ => {
            return Err(
                "Knative-Serving-Namespace and Knative-Serving-Revision must both be set".into(),
            );
        }
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "no Host header and no Knative-Serving-Revision header".to_string())?;
    Ok(Target::Host(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn probes() {
        assert_eq!(
            probe(&headers(&[("user-agent", "kube-probe/1.30")])),
            Some(Probe::Health)
        );
        assert_eq!(
            probe(&headers(&[("k-kubelet-probe", "1")])),
            Some(Probe::Health)
        );
        assert_eq!(
            probe(&headers(&[("k-network-probe", "activator")])),
            Some(Probe::Activator)
        );
        assert_eq!(
            probe(&headers(&[
                ("k-network-probe", "probe"),
                ("k-network-hash", "h")
            ])),
            Some(Probe::Network(Some(HeaderValue::from_static("h"))))
        );
        assert_eq!(
            probe(&headers(&[("k-network-probe", "queue")])),
            Some(Probe::Unknown)
        );
        assert_eq!(probe(&headers(&[("user-agent", "curl/8")])), None);
    }

    #[test]
    fn targets() {
        let uri: Uri = "/x".parse().unwrap();
        let h = headers(&[
            ("knative-serving-namespace", "ns"),
            ("knative-serving-revision", "r"),
            ("host", "ignored.example.com"),
        ]);
        assert_eq!(
            target(&h, &uri),
            Ok(Target::Named {
                namespace: "ns",
                name: "r"
            })
        );
        let h = headers(&[("host", "hello.default.example.com:8080")]);
        assert_eq!(
            target(&h, &uri),
            Ok(Target::Host("hello.default.example.com:8080"))
        );
        let h2: Uri = "http://svc.ns.example.com/x".parse().unwrap();
        assert_eq!(
            target(&HeaderMap::new(), &h2),
            Ok(Target::Host("svc.ns.example.com"))
        );
        assert!(target(&headers(&[("knative-serving-revision", "r")]), &uri).is_err());
        assert!(target(&HeaderMap::new(), &uri).is_err());
    }
}
