//! The networking seam: what a Route asks of the ingress, whatever writes it (Knative's
//! KIngress spec, kept in memory: there is no Ingress object in between). The Route reconciler
//! builds one [`IngressDesc`] from the route, its resolved [`Traffic`] and the
//! [`NetworkConfig`]; `config-network`'s `ingress-class` picks the writer that turns it into
//! objects: [`super::resources::virtual_services`] (Istio, the default) or
//! [`super::gateway_api::http_routes`] (Gateway API).
//!
//! The description holds, per target group (the default one and one per tag, tags first):
//! the hosts by visibility (the external host unless the route is cluster-local, and the
//! three cluster-local ones), the weighted splits (each revision's public Service, port 80 or
//! 81 for h2c, its percent, and the headers set on requests sent to it:
//! `Knative-Serving-Namespace` / `Knative-Serving-Revision`), the group's timeout (the longest
//! `timeoutSeconds` of the revisions it sends traffic to); and, for every group, the internal
//! headers removed from the client's request ([`crate::knative::headers::INTERNAL`] but those a
//! split sets) and the TLS the hosts are served with (a host and its Secret per ready
//! Certificate, [`super::certificate`]; set by the Route reconciler after [`describe`]).

use std::collections::BTreeMap;

use kube::ResourceExt;

use super::resources::{GroupHosts, NAMESPACE_HEADER, REVISION_HEADER, group_hosts};
use super::traffic::{RevisionTarget, Traffic};
use crate::config::network::NetworkConfig;
use crate::knative::Route;

/// The ingress description of one route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressDesc {
    /// The owner's namespace (where the Services sent traffic are).
    pub namespace: String,
    /// The owner's name (a Route's, or a DomainMapping's: its domain).
    pub name: String,
    /// The owner's UID: the names of its TLS listeners derive from it
    /// ([`super::tls_owner::listener_name`]).
    pub owner_uid: String,
    /// The owner is served on the local gateways only.
    pub cluster_local: bool,
    /// The target groups, tags first, then the default one.
    pub groups: Vec<Group>,
    /// The internal headers removed from every client request (all of
    /// [`crate::knative::headers::INTERNAL`] but those a split sets).
    pub remove_headers: Vec<String>,
    /// The hosts served over TLS, with their certificate's Secret (empty unless
    /// `external-domain-tls` is Enabled and a Certificate is Ready).
    pub tls: Vec<Tls>,
}

/// Why a writer could not write the objects of a description's TLS: the owner's
/// `IngressReady=False` reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `NotOwned` (an object of that name is someone else's), [`GATEWAY_MISSING`] or
    /// [`super::tls_owner::GATEWAY_FORBIDDEN`].
    pub reason: &'static str,
    pub message: String,
}

/// The reason when a gateway the TLS objects need (config-istio's gateway Service, or
/// config-gateway's external Gateway) does not exist.
pub const GATEWAY_MISSING: &str = "GatewayMissing";

impl Refusal {
    pub fn not_owned(message: String) -> Self {
        Self {
            reason: "NotOwned",
            message,
        }
    }

    pub fn gateway_missing(message: String) -> Self {
        Self {
            reason: GATEWAY_MISSING,
            message,
        }
    }
}

/// One TLS block: hosts and the Secret holding their certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub hosts: Vec<String>,
    pub secret_namespace: String,
    pub secret_name: String,
}

/// One target group: its hosts by visibility, its splits and its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The group's hosts (its name is the route's, or `tag-template`'s for a tag).
    pub hosts: GroupHosts,
    /// The revisions sent traffic (a split of 0% is left out).
    pub splits: Vec<Split>,
    /// The request timeout, in seconds.
    pub timeout_seconds: u64,
    /// The `Host` the requests are sent on with (a DomainMapping's: its target's
    /// cluster-local host, so the gateway routes them as the target's own).
    pub rewrite_host: Option<String>,
}

/// One weighted backend: a revision's public Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The Service's name: the revision's.
    pub service: String,
    /// 80, or 81 when the revision serves h2c.
    pub port: u16,
    /// The revision serves HTTP/2 cleartext.
    pub h2c: bool,
    /// Its share of the group's requests, 0..=100.
    pub percent: u32,
    /// Headers set on the requests sent to it (they overwrite a client's).
    pub set_headers: BTreeMap<String, String>,
}

/// The internal headers a split removes from the client's request: all but those it sets (a
/// set overwrites), and, when `keep` is given, but those too (a probe route keeps the two the
/// prober sends).
pub fn removed_headers(keep: &[&str]) -> Vec<String> {
    crate::knative::headers::INTERNAL
        .iter()
        .filter(|n| {
            !n.eq_ignore_ascii_case(NAMESPACE_HEADER)
                && !n.eq_ignore_ascii_case(REVISION_HEADER)
                && !keep.iter().any(|k| n.eq_ignore_ascii_case(k))
        })
        .map(|n| n.to_string())
        .collect()
}

fn split(ns: &str, t: &RevisionTarget) -> Split {
    Split {
        service: t.revision.clone(),
        port: if t.h2c { 81 } else { 80 },
        h2c: t.h2c,
        percent: t.percent.unwrap_or(0).clamp(0, 100) as u32,
        set_headers: BTreeMap::from([
            (NAMESPACE_HEADER.to_string(), ns.to_string()),
            (REVISION_HEADER.to_string(), t.revision.clone()),
        ]),
    }
}

/// The ingress description of `route` with `traffic`. `default_timeout_seconds` applies to a
/// revision without its own `timeoutSeconds` (config-defaults' `revision-timeout-seconds`).
pub fn describe(
    route: &Route,
    traffic: &Traffic,
    net: &NetworkConfig,
    default_timeout_seconds: u64,
) -> IngressDesc {
    let ns = route.namespace().unwrap_or_default();
    // Tags first, then the default group (hosts never overlap; the order only reads well).
    let mut groups: Vec<(&Option<String>, &Vec<RevisionTarget>)> = traffic.groups.iter().collect();
    groups.sort_by_key(|(tag, _)| tag.is_none());
    let groups = groups
        .into_iter()
        .map(|(tag, targets)| {
            let sent = || targets.iter().filter(|t| t.percent.unwrap_or(0) > 0);
            Group {
                hosts: group_hosts(route, tag.as_deref(), net),
                splits: sent().map(|t| split(&ns, t)).collect(),
                timeout_seconds: sent()
                    .map(|t| {
                        t.timeout_seconds
                            .and_then(|s| u64::try_from(s).ok())
                            .unwrap_or(default_timeout_seconds)
                    })
                    .max()
                    .unwrap_or(default_timeout_seconds),
                rewrite_host: None,
            }
        })
        .collect();
    IngressDesc {
        namespace: ns,
        name: route.name_any(),
        owner_uid: route.uid().unwrap_or_default(),
        cluster_local: super::resources::is_cluster_local(route, net),
        groups,
        remove_headers: removed_headers(&[]),
        tls: Vec::new(),
    }
}

impl IngressDesc {
    /// Every external host, in group order.
    pub fn external_hosts(&self) -> Vec<String> {
        self.groups
            .iter()
            .filter_map(|g| g.hosts.external.clone())
            .collect()
    }

    /// Every cluster-local host, in group order.
    pub fn local_hosts(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| g.hosts.local.clone())
            .collect()
    }
}
