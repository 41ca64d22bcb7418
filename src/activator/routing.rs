//! Request -> revision (docs/architecture.md, "Knative's rules"): Knative's probe headers first, then
//! `Knative-Serving-Namespace` + `Knative-Serving-Revision`, else the `Host` (or, on HTTP/2, the
//! `:authority`) looked up in the catalog's host table. Pure functions of the request head.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Uri, Version};

use super::error::ActivatorError;
use super::headers::{
    FORWARDED, K_KUBELET_PROBE, K_NETWORK_HASH, K_NETWORK_PROBE, KNATIVE_SERVING_NAMESPACE,
    KNATIVE_SERVING_REVISION, X_FORWARDED_CLIENT_CERT, X_FORWARDED_HOST, X_FORWARDED_PROTO,
    X_REAL_IP, X_REQUEST_ID,
};
use crate::http1::fields::RawFields;
use crate::http1::host::{self, HostFields};

/// The request headers the activator reads, found in one pass over the fields (a request
/// carries a handful of headers; nine hashed lookups cost more than looking at each once). For
/// each name, the first value, as [`HeaderMap::get`] would give. Either form of the fields
/// (`super::fields`): a map's values or slices of the lane's head.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen<'a> {
    pub host: Option<FieldRef<'a>>,
    pub user_agent: Option<FieldRef<'a>>,
    pub kubelet_probe: bool,
    pub network_probe: Option<FieldRef<'a>>,
    pub network_hash: Option<FieldRef<'a>>,
    pub namespace: Option<FieldRef<'a>>,
    pub revision: Option<FieldRef<'a>>,
    pub request_id: Option<FieldRef<'a>>,
    /// `X-Forwarded-Client-Cert`: believed only from the activator's own sidecar, and only
    /// when it came once (`super::mesh_identity`).
    pub client_cert: Option<FieldRef<'a>>,
    /// How many `Host` fields (two or more is ambiguous: 400).
    pub host_count: u8,
    /// How many `X-Forwarded-Client-Cert` fields.
    pub client_cert_count: u8,
    /// Whether any of `X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded`, `X-Real-IP` came:
    /// only then does the peer's trust matter to the header hygiene.
    pub forwarding: bool,
}

impl Seen<'_> {
    /// Whether the request carries anything believed only from a trusted peer (Knative's
    /// routing headers, the forwarding headers), so the caller need not look the peer up
    /// otherwise.
    pub fn asks_for_trust(&self) -> bool {
        self.namespace.is_some() || self.revision.is_some() || self.forwarding
    }
}

/// One header value as [`Seen`] found it.
#[derive(Debug, Clone, Copy)]
pub enum FieldRef<'a> {
    /// A value in a `HeaderMap`.
    Map(&'a HeaderValue),
    /// A value in the lane's head (a slice of `RawFields`' buffer).
    Raw(&'a RawFields, &'a [u8]),
}

impl<'a> FieldRef<'a> {
    /// The value's bytes.
    pub fn as_bytes(self) -> &'a [u8] {
        match self {
            FieldRef::Map(v) => v.as_bytes(),
            FieldRef::Raw(_, v) => v,
        }
    }

    /// The value as text if it is visible ASCII, as [`HeaderValue::to_str`] decides. (A raw
    /// value has no control characters but tab: httparse refuses them. So ASCII is enough.)
    pub fn to_str(self) -> Option<&'a str> {
        match self {
            FieldRef::Map(v) => v.to_str().ok(),
            FieldRef::Raw(_, v) if v.is_ascii() => std::str::from_utf8(v).ok(),
            FieldRef::Raw(..) => None,
        }
    }

    /// An owned value (a map's is cloned; a raw one shares the head's buffer).
    pub fn to_value(self) -> Option<HeaderValue> {
        match self {
            FieldRef::Map(v) => Some(v.clone()),
            FieldRef::Raw(raw, v) => raw.value(v),
        }
    }
}

impl<'a> Seen<'a> {
    /// Looks at every header once.
    pub fn scan(headers: &'a HeaderMap) -> Self {
        let mut s = Seen::default();
        for (name, value) in headers {
            // Standard names compare by tag; custom ones by their bytes.
            let slot = if name == header::HOST {
                s.host_count = s.host_count.saturating_add(1);
                &mut s.host
            } else if name == header::USER_AGENT {
                &mut s.user_agent
            } else if name == KNATIVE_SERVING_NAMESPACE {
                &mut s.namespace
            } else if name == KNATIVE_SERVING_REVISION {
                &mut s.revision
            } else if name == X_REQUEST_ID {
                &mut s.request_id
            } else if name == K_NETWORK_PROBE {
                &mut s.network_probe
            } else if name == K_NETWORK_HASH {
                &mut s.network_hash
            } else if name == X_FORWARDED_CLIENT_CERT {
                s.client_cert_count = s.client_cert_count.saturating_add(1);
                &mut s.client_cert
            } else {
                s.kubelet_probe |= name == K_KUBELET_PROBE;
                s.forwarding |= name == X_FORWARDED_PROTO
                    || name == X_FORWARDED_HOST
                    || name == FORWARDED
                    || name == X_REAL_IP;
                continue;
            };
            slot.get_or_insert(FieldRef::Map(value));
        }
        s
    }
}

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
pub fn probe(seen: &Seen<'_>) -> Option<Probe> {
    let kube_probe = seen
        .user_agent
        .is_some_and(|ua| ua.as_bytes().starts_with(b"kube-probe/"));
    if kube_probe || seen.kubelet_probe {
        return Some(Probe::Health);
    }
    let value = seen.network_probe?;
    Some(match value.as_bytes() {
        b"" => return None,
        b"activator" => Probe::Activator,
        b"probe" => Probe::Network(seen.network_hash.and_then(FieldRef::to_value)),
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

/// The host a request names, as routing reads it: an absolute-form target's authority (h2's
/// `:authority`), else the first `Host`.
pub fn request_host<'a>(seen: &Seen<'a>, uri: &'a Uri) -> Option<&'a str> {
    uri.authority()
        .map(|a| a.as_str())
        .or_else(|| seen.host.and_then(FieldRef::to_str))
        .filter(|h| !h.is_empty())
}

/// The request's target, or why it has none: 400 for an ambiguous or missing host (the engine's
/// host rule, `http1::host`, which the queue sidecar applies too), 404 otherwise.
///
/// Knative's routing headers name the revision only from a `trusted` peer; from anyone else
/// they are ignored (and stripped before forwarding) and the host routes. An absolute-form
/// target's (or h2's `:authority`) host comes before `Host` (RFC 9112 §3.2.2).
pub fn target<'a>(
    seen: &Seen<'a>,
    uri: &'a Uri,
    version: Version,
    trusted: bool,
) -> Result<Target<'a>, ActivatorError> {
    if trusted {
        let ns = seen.namespace.map(FieldRef::to_str);
        let rev = seen.revision.map(FieldRef::to_str);
        match (ns, rev) {
            (Some(Some(namespace)), Some(Some(name)))
                if !namespace.is_empty() && !name.is_empty() =>
            {
                return Ok(Target::Named { namespace, name });
            }
            (None, None) => {}
            _ => {
                return Err(ActivatorError::NotFound(
                    "Knative-Serving-Namespace and Knative-Serving-Revision must both be set"
                        .into(),
                ));
            }
        }
    }
    let authority = uri.authority().map(|a| a.as_str());
    let fields = HostFields {
        count: seen.host_count,
        first: seen.host.map(FieldRef::as_bytes),
    };
    // The rule decides whether the host is usable; `request_host` reads it as the rule says
    // (the authority when there is one, else the one `Host`).
    host::source(fields, authority, version).map_err(|e| ActivatorError::BadRequest(e.reason()))?;
    match request_host(seen, uri) {
        Some(host) => Ok(Target::Host(host)),
        None => Err(ActivatorError::NotFound(
            "no Host header and no Knative-Serving-Revision header".into(),
        )),
    }
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

    fn probe_of(pairs: &[(&'static str, &'static str)]) -> Option<Probe> {
        probe(&Seen::scan(&headers(pairs)))
    }

    fn target_of<'a>(h: &'a HeaderMap, uri: &'a Uri) -> Result<Target<'a>, String> {
        target(&Seen::scan(h), uri, Version::HTTP_11, true).map_err(|e| e.to_string())
    }

    fn status_of(h: &HeaderMap, uri: &Uri, version: Version, trusted: bool) -> u16 {
        match target(&Seen::scan(h), uri, version, trusted) {
            Ok(_) => 200,
            Err(e) => e.status().as_u16(),
        }
    }

    /// Finding 4: Knative's routing headers route only from a trusted peer.
    #[test]
    fn routing_headers_from_an_untrusted_peer_are_ignored() {
        let uri: Uri = "/".parse().unwrap();
        let h = headers(&[
            ("knative-serving-namespace", "ns"),
            ("knative-serving-revision", "secret"),
            ("host", "public.default.example.com"),
        ]);
        assert_eq!(
            target(&Seen::scan(&h), &uri, Version::HTTP_11, false).unwrap(),
            Target::Host("public.default.example.com")
        );
        assert!(Seen::scan(&h).asks_for_trust());
        assert!(!Seen::scan(&headers(&[("host", "a")])).asks_for_trust());
        assert!(Seen::scan(&headers(&[("x-real-ip", "1.2.3.4")])).asks_for_trust());
    }

    /// Finding 5: ambiguous or missing hosts are 400 (RFC 9112 §3.2, RFC 9113 §8.3.1); an
    /// absolute-form target's authority routes, whatever `Host` says (RFC 9112 §3.2.2).
    #[test]
    fn host_ambiguity_is_a_bad_request() {
        let origin: Uri = "/".parse().unwrap();
        let mut two = headers(&[("host", "a.example.com")]);
        two.append("host", HeaderValue::from_static("b.example.com"));
        assert_eq!(status_of(&two, &origin, Version::HTTP_11, true), 400);
        assert_eq!(
            status_of(&HeaderMap::new(), &origin, Version::HTTP_11, true),
            400
        );
        assert_eq!(
            status_of(&HeaderMap::new(), &origin, Version::HTTP_10, true),
            404
        );
        let absolute: Uri = "http://right.ns.example.com/x".parse().unwrap();
        let wrong = headers(&[("host", "wrong.ns.example.com")]);
        assert_eq!(
            target(&Seen::scan(&wrong), &absolute, Version::HTTP_11, false).unwrap(),
            Target::Host("right.ns.example.com")
        );
        // h2: `host` must agree with `:authority` (the URI's authority).
        assert_eq!(status_of(&wrong, &absolute, Version::HTTP_2, true), 400);
        let same = headers(&[("host", "RIGHT.ns.example.com")]);
        assert_eq!(status_of(&same, &absolute, Version::HTTP_2, true), 200);
    }

    #[test]
    fn the_first_value_of_each_name_is_seen() {
        let mut h = headers(&[("host", "a"), ("x-request-id", "1")]);
        h.append("host", HeaderValue::from_static("b"));
        h.append("k-kubelet-probe", HeaderValue::from_static(""));
        let seen = Seen::scan(&h);
        assert_eq!(seen.host.unwrap().as_bytes(), b"a");
        assert_eq!(seen.request_id.unwrap().as_bytes(), b"1");
        assert!(seen.kubelet_probe && seen.user_agent.is_none());
    }

    #[test]
    fn probes() {
        assert_eq!(
            probe_of(&[("user-agent", "kube-probe/1.30")]),
            Some(Probe::Health)
        );
        assert_eq!(probe_of(&[("k-kubelet-probe", "1")]), Some(Probe::Health));
        assert_eq!(
            probe_of(&[("k-network-probe", "activator")]),
            Some(Probe::Activator)
        );
        assert_eq!(
            probe_of(&[("k-network-probe", "probe"), ("k-network-hash", "h")]),
            Some(Probe::Network(Some(HeaderValue::from_static("h"))))
        );
        assert_eq!(
            probe_of(&[("k-network-probe", "queue")]),
            Some(Probe::Unknown)
        );
        assert_eq!(probe_of(&[("user-agent", "curl/8")]), None);
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
            target_of(&h, &uri),
            Ok(Target::Named {
                namespace: "ns",
                name: "r"
            })
        );
        let h = headers(&[("host", "hello.default.example.com:8080")]);
        assert_eq!(
            target_of(&h, &uri),
            Ok(Target::Host("hello.default.example.com:8080"))
        );
        let h2: Uri = "http://svc.ns.example.com/x".parse().unwrap();
        assert_eq!(
            target_of(&HeaderMap::new(), &h2),
            Ok(Target::Host("svc.ns.example.com"))
        );
        assert!(target_of(&headers(&[("knative-serving-revision", "r")]), &uri).is_err());
        assert!(target_of(&HeaderMap::new(), &uri).is_err());
    }
}
