//! The Gateway API ingress class (`gateway-api.ingress.networking.knative.dev`, net-gateway-api's
//! objects): a route's [`IngressDesc`] written as HTTPRoutes, and their readiness read back
//! from the HTTPRoutes' status.
//!
//! - **One HTTPRoute per target group and visibility** (net-gateway-api's `MakeHTTPRoute`,
//!   named by the group's longest host): the external host on config-gateway's
//!   `external-gateways` (unless the route is cluster-local), the three cluster-local hosts on
//!   its `local-gateways` (labelled `networking.knative.dev/visibility: cluster-local`). Each
//!   parentRef is a `Gateway` by namespace and name, with the gateway's `http-listener-name` as
//!   its `sectionName` when given.
//! - **One rule**: every path (`PathPrefix /`); a `RequestHeaderModifier` filter removing the
//!   internal headers ([`crate::knative::headers::INTERNAL`] but those set below) from every
//!   client request; one `backendRef` per revision sent traffic — its public Service, port 80
//!   or 81 (h2c, whose Service port carries `appProtocol: kubernetes.io/h2c` so the gateway
//!   speaks HTTP/2 cleartext to it), its percent as the weight — with its own
//!   `RequestHeaderModifier` setting `Knative-Serving-Namespace` and `Knative-Serving-Revision`;
//!   the group's timeout as `timeouts.request` when every gateway of the HTTPRoute lists the
//!   `HTTPRouteRequestTimeout` feature (net-gateway-api's rule).
//! - **Readiness** ([`readiness`]): an HTTPRoute is programmed once, for each of its parents,
//!   the implementation reports `Accepted=True` and `ResolvedRefs=True` (for the generation
//!   written, when it says which). A condition `False` is the gateway refusing the route
//!   (`IngressReady=False` with the gateway's reason); no report yet is `Unknown`. Unlike the
//!   Istio class, the gateways' pods are not probed: Gateway API implementations report per
//!   HTTPRoute whether they program it, and a probe route matching `K-Network-Hash` would be
//!   one more rule per group for every implementation to support.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::http_route::{
    GROUP, HTTPRoute, HttpBackendRef, HttpHeader, HttpHeaderFilter, HttpPathMatch,
    HttpRequestRedirectFilter, HttpRouteFilter, HttpRouteMatch, HttpRouteRule, HttpRouteSpec,
    HttpRouteTimeouts, HttpUrlRewriteFilter, ParentReference,
};
use super::ingress::{IngressDesc, Split};
use super::resources::{CLUSTER_LOCAL, VISIBILITY, child_meta};
use crate::config::network::{
    GatewayApiGateway, HttpProtocol, NetworkConfig, REQUEST_TIMEOUT_FEATURE,
};
use crate::knative::Route;

/// The CRD the Gateway API ingress class writes.
pub const HTTP_ROUTE_CRD: &str = "httproutes.gateway.networking.k8s.io";
/// `IngressReady=False`'s reason when the API server does not serve HTTPRoutes.
pub const HTTP_ROUTE_NOT_SERVED: &str = "HTTPRouteNotServed";
/// The filter type that rewrites the host (and path).
pub const URL_REWRITE: &str = "URLRewrite";
/// The filter type that redirects.
pub const REQUEST_REDIRECT: &str = "RequestRedirect";
/// The suffix of a TLS host's redirecting HTTPRoute.
pub const REDIRECT_SUFFIX: &str = "-redirect";
/// The filter type that changes request headers.
pub const REQUEST_HEADER_MODIFIER: &str = "RequestHeaderModifier";
/// The HTTPRoute condition saying its parent accepted it.
pub const ACCEPTED: &str = "Accepted";
/// The HTTPRoute condition saying every backendRef resolved.
pub const RESOLVED_REFS: &str = "ResolvedRefs";

fn parent_ref(g: &GatewayApiGateway) -> ParentReference {
    ParentReference {
        group: Some(GROUP.into()),
        kind: Some("Gateway".into()),
        namespace: Some(g.gateway.namespace.clone()),
        name: g.gateway.name.clone(),
        section_name: g.http_listener_name.clone(),
        port: None,
    }
}

fn header_filter(set: &BTreeMap<String, String>, remove: &[String]) -> HttpRouteFilter {
    HttpRouteFilter {
        type_: REQUEST_HEADER_MODIFIER.into(),
        url_rewrite: None,
        request_redirect: None,
        request_header_modifier: Some(HttpHeaderFilter {
            set: set
                .iter()
                .map(|(name, value)| HttpHeader {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            add: Vec::new(),
            remove: remove.to_vec(),
        }),
    }
}

fn backend(split: &Split) -> HttpBackendRef {
    HttpBackendRef {
        group: Some(String::new()),
        kind: Some("Service".into()),
        name: split.service.clone(),
        namespace: None,
        port: Some(i32::from(split.port)),
        weight: Some(split.percent as i32),
        filters: vec![header_filter(&split.set_headers, &[])],
    }
}

fn http_route(
    meta: &dyn Fn(String) -> ObjectMeta,
    name: &str,
    hostnames: Vec<String>,
    gateways: &[GatewayApiGateway],
    rule: HttpRouteRule,
    cluster_local: bool,
    timeout_seconds: u64,
) -> HTTPRoute {
    let mut meta = meta(name.to_string());
    if cluster_local {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(VISIBILITY.into(), CLUSTER_LOCAL.into());
    }
    let timeouts = gateways
        .iter()
        .all(|g| g.supports(REQUEST_TIMEOUT_FEATURE))
        .then(|| HttpRouteTimeouts {
            // Gateway API durations allow at most five digits per unit.
            request: Some(format!("{}s", timeout_seconds.min(99_999))),
            backend_request: None,
        });
    HTTPRoute {
        metadata: meta,
        spec: HttpRouteSpec {
            parent_refs: gateways.iter().map(parent_ref).collect(),
            hostnames,
            rules: vec![HttpRouteRule { timeouts, ..rule }],
        },
        status: None,
    }
}

/// The parentRefs of a TLS host's HTTPRoute: its listener on each gateway, and, with
/// `http-protocol: Enabled`, the http listener (a parentRef without `sectionName` attaches to
/// every listener whose hostname matches, the TLS one included).
fn tls_parents(
    gateways: &[GatewayApiGateway],
    listener: &str,
    http: HttpProtocol,
) -> Vec<ParentReference> {
    let mut out = Vec::new();
    for g in gateways {
        let tls = ParentReference {
            section_name: Some(listener.to_string()),
            ..parent_ref(g)
        };
        match (http, &g.http_listener_name) {
            (HttpProtocol::Enabled, None) => out.push(parent_ref(g)),
            (HttpProtocol::Enabled, Some(_)) => out.extend([parent_ref(g), tls]),
            _ => out.push(tls),
        }
    }
    out
}

/// The HTTPRoute `{host}-redirect`: on the gateways' http listener (config-gateway's
/// `http-listener-name`, else port 80), a `RequestRedirect` to https (301) for every path.
fn redirect_route(
    meta: &dyn Fn(String) -> ObjectMeta,
    host: &str,
    gateways: &[GatewayApiGateway],
) -> HTTPRoute {
    HTTPRoute {
        metadata: meta(format!("{host}{REDIRECT_SUFFIX}")),
        spec: HttpRouteSpec {
            parent_refs: gateways
                .iter()
                .map(|g| ParentReference {
                    port: g.http_listener_name.is_none().then_some(80),
                    ..parent_ref(g)
                })
                .collect(),
            hostnames: vec![host.to_string()],
            rules: vec![HttpRouteRule {
                matches: vec![HttpRouteMatch {
                    path: Some(HttpPathMatch {
                        type_: Some("PathPrefix".into()),
                        value: Some("/".into()),
                    }),
                    headers: Vec::new(),
                }],
                filters: vec![HttpRouteFilter {
                    type_: REQUEST_REDIRECT.into(),
                    request_redirect: Some(HttpRequestRedirectFilter {
                        scheme: Some("https".into()),
                        port: None,
                        status_code: Some(301),
                    }),
                    ..HttpRouteFilter::default()
                }],
                backend_refs: Vec::new(),
                timeouts: None,
            }],
        },
        status: None,
    }
}

/// The Gateway API class's writer: the HTTPRoutes of `route`'s ingress description (the module
/// doc), external ones first.
pub fn http_routes(route: &Route, desc: &IngressDesc, net: &NetworkConfig) -> Vec<HTTPRoute> {
    write_http_routes(desc, net, &|n| child_meta(route, n))
}

/// The HTTPRoutes of an ingress description, each with the metadata `meta` gives its name
/// (the owner's labels and owner reference). A group without cluster-local hosts (a
/// DomainMapping's) gets no local HTTPRoute; a group's `rewrite_host` is a `URLRewrite`
/// filter.
pub fn write_http_routes(
    desc: &IngressDesc,
    net: &NetworkConfig,
    meta: &dyn Fn(String) -> ObjectMeta,
) -> Vec<HTTPRoute> {
    let mut out = Vec::new();
    for group in &desc.groups {
        let rule = HttpRouteRule {
            matches: vec![HttpRouteMatch {
                path: Some(HttpPathMatch {
                    type_: Some("PathPrefix".into()),
                    value: Some("/".into()),
                }),
                headers: Vec::new(),
            }],
            filters: std::iter::once(header_filter(&BTreeMap::new(), &desc.remove_headers))
                .chain(group.rewrite_host.as_ref().map(|host| HttpRouteFilter {
                    type_: URL_REWRITE.into(),
                    request_header_modifier: None,
                    url_rewrite: Some(HttpUrlRewriteFilter {
                        hostname: Some(host.clone()),
                    }),
                    request_redirect: None,
                }))
                .collect(),
            backend_refs: group.splits.iter().map(backend).collect(),
            timeouts: None,
        };
        let h = &group.hosts;
        if let Some(ext) = &h.external {
            let gateways = &net.gateway.external_gateways;
            let mut hr = http_route(
                meta,
                ext,
                vec![ext.clone()],
                gateways,
                rule.clone(),
                false,
                group.timeout_seconds,
            );
            let tls = !desc.cluster_local && desc.tls.iter().any(|t| t.hosts.contains(ext));
            if tls {
                let listener = super::tls_owner::listener_name(&desc.owner_uid, ext);
                hr.spec.parent_refs = tls_parents(gateways, &listener, net.templates.http_protocol);
            }
            out.push(hr);
            if tls && net.templates.http_protocol == HttpProtocol::Redirected {
                out.push(redirect_route(meta, ext, gateways));
            }
        }
        if let Some(longest) = h.local.get(2) {
            out.push(http_route(
                meta,
                longest,
                h.local.clone(),
                &net.gateway.local_gateways,
                rule,
                true,
                group.timeout_seconds,
            ));
        }
    }
    out
}

/// Whether the gateways program a route's HTTPRoutes, from their status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Every parent of every HTTPRoute reports `Accepted` and `ResolvedRefs` True.
    Ready,
    /// Not every parent has reported on the HTTPRoute as written: what is missing.
    Pending(String),
    /// A parent reports a condition False: its reason and what it said.
    Refused { reason: String, message: String },
}

fn same_parent(a: &ParentReference, b: &ParentReference, route_ns: &str) -> bool {
    a.name == b.name
        && a.namespace.as_deref().unwrap_or(route_ns) == b.namespace.as_deref().unwrap_or(route_ns)
        && a.section_name == b.section_name
}

/// The readiness of the HTTPRoutes `desired` (what this reconcile wrote), each read back as
/// `current` returns it (the watch's copy; `None`: not seen yet).
pub fn readiness(
    desired: &[HTTPRoute],
    current: impl Fn(&str) -> Option<std::sync::Arc<HTTPRoute>>,
) -> Readiness {
    let mut pending = Vec::new();
    for want in desired {
        let name = want.name_any();
        let ns = want.namespace().unwrap_or_default();
        let Some(have) = current(&name).filter(|h| h.spec == want.spec) else {
            pending.push(format!("HTTPRoute {name} is not yet seen as written"));
            continue;
        };
        let parents = have.status.as_ref().map(|s| s.parents.as_slice());
        for p in &want.spec.parent_refs {
            let gw = format!("{}/{}", p.namespace.as_deref().unwrap_or(&ns), p.name);
            let Some(st) = parents
                .into_iter()
                .flatten()
                .find(|s| same_parent(&s.parent_ref, p, &ns))
            else {
                pending.push(format!(
                    "gateway {gw} has not reported on HTTPRoute {name} yet"
                ));
                continue;
            };
            for type_ in [ACCEPTED, RESOLVED_REFS] {
                let c = st.conditions.iter().find(|c| c.type_ == type_);
                let stale = c.is_some_and(|c| {
                    matches!((c.observed_generation, have.metadata.generation),
                        (Some(seen), Some(now)) if seen < now)
                });
                match c {
                    Some(c) if c.status == "False" && !stale => {
                        return Readiness::Refused {
                            reason: if c.reason.is_empty() {
                                format!("HTTPRoute{type_}False")
                            } else {
                                c.reason.clone()
                            },
                            message: format!(
                                "gateway {gw} reports HTTPRoute {name} {type_}=False: {}",
                                c.message
                            ),
                        };
                    }
                    Some(c) if c.status == "True" && !stale => {}
                    _ => pending.push(format!(
                        "gateway {gw} has not reported HTTPRoute {name} {type_}=True yet"
                    )),
                }
            }
        }
    }
    if pending.is_empty() {
        Readiness::Ready
    } else {
        let more = pending
            .len()
            .saturating_sub(super::prober::MESSAGE_FAILURES);
        pending.truncate(super::prober::MESSAGE_FAILURES);
        let mut message = pending.join("; ");
        if more > 0 {
            message.push_str(&format!(" (and {more} more)"));
        }
        Readiness::Pending(message)
    }
}

#[cfg(test)]
#[path = "gateway_api_tests.rs"]
mod tests;
