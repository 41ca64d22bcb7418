//! Who a request comes from when the activator runs behind an Istio sidecar (SECURITY.md,
//! "Tenancy"): the mesh identity, not the peer's address.
//!
//! Behind a sidecar every connection comes from the sidecar itself, from `127.0.0.6` (or
//! `::6`: Istio's inbound passthrough bind addresses), gateways included, so an address says
//! nothing. What the sidecar does say is the peer's certificate: on inbound mutual TLS it
//! appends to `X-Forwarded-Client-Cert` (Envoy's `APPEND_FORWARD`, with `Subject`, `URI` and
//! `DNS`, as Istio's pilot configures the sidecar's inbound listener) one element
//!
//! ```text
//! By=spiffe://cluster.local/ns/thaw-system/sa/activator;Hash=<sha256>;Subject="";URI=spiffe://cluster.local/ns/<ns>/sa/<sa>
//! ```
//!
//! and removes the header altogether on a connection without a client certificate. So the
//! element the sidecar wrote is the **last** one ([`sidecar_identity`]), and what comes before it
//! is whatever the client sent. A client can shape that prefix, so the parse refuses anything
//! that could make the last element not the sidecar's: a header ending inside a quoted string
//! (an unbalanced prefix swallows the sidecar's comma), an element that is not `key=value`
//! pairs, more than one `URI` in the last element, a `URI` in another trust domain than `By`.
//!
//! [`GatewayIdentities`] holds the `(namespace, service account)` of the gateways' pods (those
//! behind config-istio's or config-gateway's gateway Services, followed by `roles::routes`).
//! The request path reads it through one `ArcSwap` load and a scan of a few entries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Istio's inbound passthrough bind address (IPv4): where the activator's own sidecar connects
/// from.
pub const SIDECAR_PEER_V4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
/// Istio's inbound passthrough bind address (IPv6).
pub const SIDECAR_PEER_V6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// Whether `peer` is the activator's own sidecar. Only a process in the activator's own pod
/// can connect from a loopback address (the kernel drops loopback sources from outside), and
/// Istio's sidecar binds exactly these.
pub fn is_sidecar_peer(peer: IpAddr) -> bool {
    match peer.to_canonical() {
        IpAddr::V4(v4) => v4 == SIDECAR_PEER_V4,
        IpAddr::V6(v6) => v6 == SIDECAR_PEER_V6,
    }
}

/// The `(namespace, service account)` the last element of an `X-Forwarded-Client-Cert`
/// value vouches for (see the module doc), or `None` when the value is not one the sidecar's
/// element can be told apart in. Allocation-free: the parts are slices of `xfcc`.
pub fn sidecar_identity(xfcc: &[u8]) -> Option<(&[u8], &[u8])> {
    let last = last_element(xfcc)?;
    let mut by: Option<&[u8]> = None;
    let mut uri: Option<&[u8]> = None;
    for pair in split_outside_quotes(last, b';') {
        let eq = pair.iter().position(|b| *b == b'=')?;
        let (key, value) = (&pair[..eq], unquote(&pair[eq + 1..]));
        if key.eq_ignore_ascii_case(b"by") {
            by.get_or_insert(value);
        } else if key.eq_ignore_ascii_case(b"uri") {
            if uri.is_some() {
                // Two identities in one certificate: not one a mesh CA issues a workload.
                return None;
            }
            uri = Some(value);
        } else if key.is_empty() {
            return None;
        }
    }
    let (by_domain, _) = spiffe(by?)?;
    let (domain, path) = spiffe(uri?)?;
    if !by_domain.eq_ignore_ascii_case(domain) {
        return None;
    }
    let rest = path.strip_prefix(b"ns/")?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    let (ns, rest) = (&rest[..slash], &rest[slash..]);
    let sa = rest.strip_prefix(b"/sa/")?;
    let plain = |s: &[u8]| !s.is_empty() && !s.contains(&b'/');
    (plain(ns) && plain(sa)).then_some((ns, sa))
}

/// A SPIFFE id's trust domain and path (`spiffe://<domain>/<path>`).
fn spiffe(id: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = id.strip_prefix(b"spiffe://")?;
    let slash = rest.iter().position(|b| *b == b'/')?;
    let (domain, path) = (&rest[..slash], &rest[slash + 1..]);
    (!domain.is_empty()).then_some((domain, path))
}

/// The value without its surrounding double quotes, if it has them.
fn unquote(v: &[u8]) -> &[u8] {
    match v {
        [b'"', inner @ .., b'"'] => inner,
        _ => v,
    }
}

/// A scan of a header value that knows whether it is inside a quoted string (with backslash
/// escapes), one byte at a time.
#[derive(Default)]
struct Quotes {
    quoted: bool,
    escaped: bool,
}

impl Quotes {
    /// Takes byte `b`: whether it lies outside quotes and is not a quote itself.
    fn outside(&mut self, b: u8) -> bool {
        if self.quoted {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.quoted = false,
                _ => {}
            }
            false
        } else if b == b'"' {
            self.quoted = true;
            false
        } else {
            true
        }
    }
}

/// The part after the last `,` outside a quoted string; `None` if the value ends inside one
/// (or is empty).
fn last_element(v: &[u8]) -> Option<&[u8]> {
    let mut start = 0;
    let mut q = Quotes::default();
    for (i, b) in v.iter().enumerate() {
        if q.outside(*b) && *b == b',' {
            start = i + 1;
        }
    }
    let last = v[start..].trim_ascii();
    (!q.quoted && !last.is_empty()).then_some(last)
}

/// `v` split at each `sep` outside a quoted string (`v` is one element, already known to end
/// outside quotes), each part trimmed.
fn split_outside_quotes(v: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(v);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut q = Quotes::default();
        for (i, b) in s.iter().enumerate() {
            if q.outside(*b) && *b == sep {
                rest = Some(&s[i + 1..]);
                return Some(s[..i].trim_ascii());
            }
        }
        rest = None;
        Some(s.trim_ascii())
    })
}

/// One identity: `(namespace, service account)`.
type Identity = (Box<str>, Box<str>);

/// The gateways' mesh identities: `(namespace, service account)` of each pod behind a gateway
/// Service of the ingress class in force. Replaced whole by its follower.
#[derive(Default)]
pub struct GatewayIdentities {
    ids: ArcSwap<Box<[Identity]>>,
}

impl GatewayIdentities {
    /// None known yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Replaces the set.
    pub fn set(&self, ids: impl IntoIterator<Item = (String, String)>) {
        let mut v: Vec<Identity> = ids
            .into_iter()
            .map(|(ns, sa)| (ns.into(), sa.into()))
            .collect();
        v.sort();
        v.dedup();
        if ***self.ids.load() != *v {
            tracing::info!(identities = ?v, "gateway identities (their X-Forwarded-Client-Cert is believed from the sidecar)");
            self.ids.store(Arc::new(v.into_boxed_slice()));
        }
    }

    /// Whether `xfcc` (one `X-Forwarded-Client-Cert` value, as the activator's own sidecar
    /// passed it) names a gateway's identity in its last element.
    pub fn vouch(&self, xfcc: &[u8]) -> bool {
        let Some((ns, sa)) = sidecar_identity(xfcc) else {
            return false;
        };
        self.ids
            .load()
            .iter()
            .any(|(n, s)| n.as_bytes() == ns && s.as_bytes() == sa)
    }

    /// The identities, as `namespace/service-account`.
    pub fn list(&self) -> Vec<String> {
        self.ids
            .load()
            .iter()
            .map(|(n, s)| format!("{n}/{s}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Istio's sidecar writes (Envoy's `APPEND_FORWARD` with Subject, URI and DNS, an
    /// Istio workload certificate: empty subject, one URI SAN, no DNS SAN).
    const ISTIO: &str = "By=spiffe://cluster.local/ns/thaw-system/sa/activator;\
        Hash=0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0;Subject=\"\";\
        URI=spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account";

    fn id(v: &str) -> Option<(String, String)> {
        sidecar_identity(v.as_bytes()).map(|(n, s)| {
            (
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(s.to_vec()).unwrap(),
            )
        })
    }

    fn gw() -> Option<(String, String)> {
        Some((
            "istio-system".into(),
            "istio-ingressgateway-service-account".into(),
        ))
    }

    #[test]
    fn the_sidecars_element_names_the_peer() {
        assert_eq!(id(ISTIO), gw());
        // Appended after what the client sent: the last element counts.
        let forged =
            "By=spiffe://cluster.local/ns/x/sa/y;URI=spiffe://cluster.local/ns/team/sa/default";
        assert_eq!(
            id(&format!("{forged},{ISTIO}")),
            gw(),
            "the sidecar's element is last"
        );
        let mine = ISTIO.replace(
            "istio-system/sa/istio-ingressgateway-service-account",
            "team-a/sa/default",
        );
        assert_eq!(
            id(&format!("{ISTIO},{mine}")),
            Some(("team-a".into(), "default".into())),
            "a client's copy of the gateway's element is not the last"
        );
        // A subject with quoted commas and semicolons (other CAs write subjects).
        let subject = ISTIO.replace("Subject=\"\"", "Subject=\"CN=a\\\"b,OU=c;d,O=e\"");
        assert_eq!(id(&subject), gw());
        // A DNS SAN after the URI, keys in another case, spaces around elements.
        assert_eq!(
            id(&format!(
                " x=1 , {};dns=gw.example.com ",
                ISTIO.replace("URI=", "uri=")
            )),
            gw()
        );
    }

    /// A client that shapes what comes before the sidecar's element cannot make its own
    /// claim the last one.
    #[test]
    fn a_prefix_cannot_swallow_the_sidecars_element() {
        let claim =
            "URI=spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account";
        let mine = ISTIO.replace(
            "istio-system/sa/istio-ingressgateway-service-account",
            "team-a/sa/default",
        );
        // An open quote: the sidecar's comma and element fall inside it; the value ends
        // inside a quoted string, so nothing is believed.
        for prefix in [
            format!("{claim};x=\""),
            format!("{claim};x=\"\\"),
            format!("x=\"{claim}"),
        ] {
            assert_eq!(id(&format!("{prefix},{mine}")), None, "{prefix}");
        }
        // A balanced prefix is its own element.
        assert_eq!(
            id(&format!("{claim};x=\"a,b\",{mine}")),
            Some(("team-a".into(), "default".into()))
        );
    }

    #[test]
    fn malformed_or_ambiguous_elements_vouch_for_nobody() {
        for v in [
            "",
            ",",
            "garbage",
            // No URI, an empty one, no By.
            "By=spiffe://cluster.local/ns/a/sa/b;Subject=\"\"",
            "By=spiffe://cluster.local/ns/a/sa/b;URI=",
            "URI=spiffe://cluster.local/ns/istio-system/sa/gw",
            // Two URIs in one element.
            "By=spiffe://cluster.local/ns/a/sa/b;URI=spiffe://cluster.local/ns/istio-system/sa/gw;URI=spiffe://cluster.local/ns/c/sa/d",
            // Another trust domain than the sidecar's own.
            "By=spiffe://cluster.local/ns/a/sa/b;URI=spiffe://evil.example/ns/istio-system/sa/gw",
            // Not the ns/sa shape.
            "By=spiffe://cluster.local/ns/a/sa/b;URI=spiffe://cluster.local/ns/istio-system/sa/gw/x",
            "By=spiffe://cluster.local/ns/a/sa/b;URI=spiffe://cluster.local/sa/gw",
            "By=spiffe://cluster.local/ns/a/sa/b;URI=https://cluster.local/ns/istio-system/sa/gw",
            // A part that is no key=value pair.
            "By=spiffe://cluster.local/ns/a/sa/b;oops;URI=spiffe://cluster.local/ns/istio-system/sa/gw",
        ] {
            assert_eq!(id(v), None, "{v}");
        }
    }

    #[test]
    fn identities_vouch_only_for_their_own() {
        let ids = GatewayIdentities::default();
        assert!(!ids.vouch(ISTIO.as_bytes()), "none known yet");
        ids.set([(
            "istio-system".to_string(),
            "istio-ingressgateway-service-account".to_string(),
        )]);
        assert!(ids.vouch(ISTIO.as_bytes()));
        let other = ISTIO.replace("sa/istio-ingressgateway", "sa/other");
        assert!(!ids.vouch(other.as_bytes()));
        assert_eq!(
            ids.list(),
            ["istio-system/istio-ingressgateway-service-account"]
        );
    }

    #[test]
    fn sidecar_peers() {
        assert!(is_sidecar_peer("127.0.0.6".parse().unwrap()));
        assert!(is_sidecar_peer("::6".parse().unwrap()));
        assert!(is_sidecar_peer("::ffff:127.0.0.6".parse().unwrap()));
        assert!(!is_sidecar_peer("127.0.0.1".parse().unwrap()));
        assert!(!is_sidecar_peer("10.0.0.6".parse().unwrap()));
    }
}
