//! Who owns the TLS objects thaw writes into shared places (listeners on the operator's
//! Gateways, Secret copies in the gateway's namespace), and how their names are made so that
//! no tenant can aim at another's or at the operator's.
//!
//! - **Names derive from the owner's UID** (a Route's or a DomainMapping's), never from a
//!   checksum of names a tenant chooses: a listener is `kni-{uid}-{digest(host)}`, a copy
//!   `{uid}-{digest(namespace/secret)}`, [`digest`] being 16 hex digits of SHA-256. A UID is
//!   unique in the cluster and known only once the owner exists, so no name can be chosen to
//!   meet another's (adler32 of `namespace/owner` let `default/bbbb` and `default/caac` share
//!   one prefix, and `{namespace}.{secret}` let namespace `example` name `example.com-tls`).
//! - **Older names are recognised, not trusted**: a listener of the adler32 prefix
//!   ([`legacy_listener_prefix`]) is this owner's only when its hostname is one of the
//!   owner's hosts ([`Whose::Legacy`]); it is removed once the new one serves.
//! - **A 403 is a condition** ([`forbidden`]): deploy/ grants the Secret writes (and the
//!   Gateway API Gateways' reads and updates) in the gateway namespaces it was rendered for;
//!   config-istio or config-gateway pointed elsewhere makes the owner `IngressReady=False`
//!   [`GATEWAY_FORBIDDEN`] naming the namespace and the verb, retried with backoff.

use sha2::{Digest, Sha256};

use super::ingress::Refusal;
use crate::controller::Error;

/// The prefix of every TLS listener thaw writes (net-gateway-api's).
pub const LISTENER_PREFIX: &str = "kni-";

/// `IngressReady=False`'s reason when the API server refuses (403) a call in a gateway
/// namespace.
pub const GATEWAY_FORBIDDEN: &str = "GatewayForbidden";

/// The owner of TLS objects in shared places: a Route or a DomainMapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOwner {
    pub namespace: String,
    /// A Route's name, or a DomainMapping's (its domain).
    pub name: String,
    /// Its UID: every name in a shared place derives from it.
    pub uid: String,
    /// Its external hosts (every target group's for a Route, the domain for a
    /// DomainMapping): an adler32-named listener is its own only with one of them.
    pub hosts: Vec<String>,
    /// The label naming it on its Secret copies (`serving.knative.dev/route` or
    /// `serving.knative.dev/domainmapping`, and the value).
    pub label: (&'static str, String),
}

/// 16 hex digits (64 bits) of SHA-256 of `s`: a name part for text a tenant chooses.
pub fn digest(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The prefix of an owner's listeners: `kni-{uid}-`.
pub fn listener_prefix(uid: &str) -> String {
    format!("{LISTENER_PREFIX}{uid}-")
}

/// The listener of `host` for the owner of UID `uid` (57 characters; a listener name may
/// have 253).
pub fn listener_name(uid: &str, host: &str) -> String {
    format!("{}{}", listener_prefix(uid), digest(host))
}

/// The prefix thaw named an owner's listeners with before they derived from its UID:
/// `kni-{adler32(namespace/owner)}-` (8 hex digits).
pub fn legacy_listener_prefix(namespace: &str, owner: &str) -> String {
    format!(
        "{LISTENER_PREFIX}{:08x}-",
        adler2::adler32_slice(format!("{namespace}/{owner}").as_bytes())
    )
}

/// Whose a listener on a shared Gateway is, for one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// Named with the owner's UID.
    Ours,
    /// Named with the owner's adler32 prefix, for one of its hosts: written before the names
    /// derived from UIDs; replaced, then removed.
    Legacy,
    /// Anyone else's: never changed.
    Theirs,
}

/// Whose the listener `l` (as the Gateway holds it) is.
pub fn whose(l: &serde_json::Value, owner: &TlsOwner) -> Whose {
    let name = l["name"].as_str().unwrap_or_default();
    if name.starts_with(&listener_prefix(&owner.uid)) {
        return Whose::Ours;
    }
    let host = l["hostname"].as_str().unwrap_or_default();
    if name.starts_with(&legacy_listener_prefix(&owner.namespace, &owner.name))
        && name.len() == legacy_listener_prefix(&owner.namespace, &owner.name).len() + 8
        && owner.hosts.iter().any(|h| h == host)
    {
        return Whose::Legacy;
    }
    Whose::Theirs
}

/// Whether the listener `l` is one thaw wrote for an owner in `namespace` (its prefix, and
/// routes allowed from that namespace only).
pub fn is_namespace_listener(l: &serde_json::Value, namespace: &str) -> bool {
    l["name"]
        .as_str()
        .is_some_and(|n| n.starts_with(LISTENER_PREFIX))
        && l["allowedRoutes"]["namespaces"]["selector"]["matchLabels"]
            ["kubernetes.io/metadata.name"]
            .as_str()
            == Some(namespace)
}

/// A 403 from `verb` on `what` in the gateway namespace `namespace` (which `config` names)
/// as the owner's refusal; any other error as it is.
pub fn forbidden(
    e: kube::Error,
    verb: &str,
    what: &str,
    namespace: &str,
    config: &str,
) -> Result<Refusal, Error> {
    match e {
        kube::Error::Api(s) if s.code == 403 => Ok(Refusal {
            reason: GATEWAY_FORBIDDEN,
            message: format!(
                "The controller may not {verb} {what} in the namespace {namespace}, where \
                 {config} puts a gateway: grant it the Role thaw-controller-gateway there \
                 (deploy/rbac/controller.yaml renders it for istio-system)."
            ),
        }),
        e => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(ns: &str, name: &str, uid: &str, hosts: &[&str]) -> TlsOwner {
        TlsOwner {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            label: ("serving.knative.dev/route", name.into()),
        }
    }

    #[test]
    fn colliding_owners_get_distinct_names_and_an_old_name_needs_one_of_the_hosts() {
        // The finding: adler32 gives both owners one prefix.
        assert_eq!(
            legacy_listener_prefix("default", "bbbb"),
            legacy_listener_prefix("default", "caac")
        );
        let b = owner("default", "bbbb", "u-b", &["bbbb.default.example.com"]);
        let c = owner("default", "caac", "u-c", &["caac.default.example.com"]);
        assert_ne!(
            listener_prefix(&b.uid),
            listener_prefix(&c.uid),
            "UIDs differ"
        );
        let ours = serde_json::json!({
            "name": listener_name("u-b", "bbbb.default.example.com"),
            "hostname": "bbbb.default.example.com",
        });
        assert_eq!(whose(&ours, &b), Whose::Ours);
        assert_eq!(whose(&ours, &c), Whose::Theirs);
        // The old name of b's listener: b's (its host), not c's (the same prefix).
        let old = serde_json::json!({
            "name": format!(
                "{}{:08x}",
                legacy_listener_prefix("default", "bbbb"),
                adler2::adler32_slice(b"bbbb.default.example.com")
            ),
            "hostname": "bbbb.default.example.com",
        });
        assert_eq!(whose(&old, &b), Whose::Legacy);
        assert_eq!(whose(&old, &c), Whose::Theirs);
        assert_eq!(digest("a").len(), 16);
        assert_ne!(digest("a"), digest("b"));
        assert!(listener_name("0d2f7c2e-1111-2222-3333-444455556666", "h").len() <= 63);
    }

    #[test]
    fn a_403_is_a_refusal_naming_the_namespace_and_the_verb() {
        let e = kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        let r = forbidden(e, "create", "Secrets", "gw", "config-istio").unwrap();
        assert_eq!(r.reason, GATEWAY_FORBIDDEN);
        assert!(r.message.contains("create Secrets in the namespace gw"));
        let e = kube::Error::Api(
            kube::core::Status::failure("gone", "NotFound")
                .with_code(404)
                .boxed(),
        );
        assert!(forbidden(e, "create", "Secrets", "gw", "config-istio").is_err());
    }
}
