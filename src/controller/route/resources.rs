//! What a Route becomes (pure builders from the route, its resolved [`Traffic`] and the
//! [`NetworkConfig`]): its host names, the Istio ingress class's VirtualServices (written from
//! the route's [`super::ingress`] description), the placeholder Services and the status fields
//! (url, address, traffic).
//!
//! - **Hosts** per target group (the default one, and one per tag named by `tag-template`):
//!   external `{name}.{namespace}.{domain}` (`domain-template`, the domain from config-domain)
//!   unless the route is cluster-local, and always the cluster-local
//!   `{name}.{namespace}`, `{name}.{namespace}.svc`, `{name}.{namespace}.svc.cluster.local`.
//! - **VirtualService** `{route}-ingress` (net-istio's name for the ingress one): every host;
//!   the external gateways (unless cluster-local) and the local ones; one HTTP route per
//!   group, matching its hosts by authority (with or without a port) on the gateways that
//!   serve them, and sending each revision of the group its percent at its public Service
//!   (`{revision}.{namespace}.svc.cluster.local`, port 80, or 81 for h2c) with the internal
//!   headers ([`crate::knative::headers::INTERNAL`]) removed from the client's request and
//!   `Knative-Serving-Namespace` / `Knative-Serving-Revision` set on that destination, so the
//!   activator (when it is in the path) knows the revision; the route's timeout is the longest
//!   `timeoutSeconds` of the revisions it sends traffic to (the activator holds cold requests
//!   that long).
//! - **VirtualService** `{route}-mesh` (net-istio's `MakeMeshVirtualService`): the same routes
//!   on the `mesh` gateway (every sidecar) for the cluster-local hosts, so callers inside the
//!   mesh get the route's splits and tags.
//! - **The probe** (net-istio's `InsertProbe`): [`ingress_hash`] of the two VirtualServices'
//!   routes, namespace and name; each group gets a copy of its route first, matching
//!   `K-Network-Hash: override` as well, that sets `K-Network-Hash` to that hash on every
//!   destination. A backend asked `K-Network-Probe: probe` echoes the hash, so the prober knows
//!   which version of the route a gateway serves.
//! - **Placeholder Services** `{route}` and `{tag}-{route}`: ExternalName to the first local
//!   gateway's service of the ingress class in force (config-istio's, or config-gateway's),
//!   port 80 named `http2` (Knative's placeholder, pointed where Knative points it once the
//!   ingress reports its private load balancer), so the cluster-local names resolve and reach
//!   the gateway.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::ingress::{IngressDesc, Split, describe, removed_headers};
use super::traffic::Traffic;
use super::virtual_service::{
    Destination, HeaderOperations, Headers, HttpMatchRequest, HttpRewrite, HttpRoute,
    HttpRouteDestination, PortSelector, StringMatch, VirtualService, VirtualServiceSpec,
};
use crate::config::network::{CLUSTER_LOCAL_DOMAIN, IngressClass, NetworkConfig, TemplateValues};
use crate::controller::owner_ref;
use crate::knative::duck::Addressable;
use crate::knative::names::{child_name, labels};
use crate::knative::{Route, TrafficTarget};

/// Knative's visibility label (and annotation): `cluster-local` keeps a route off the
/// external gateways.
pub const VISIBILITY: &str = "networking.knative.dev/visibility";
/// The value of [`VISIBILITY`] that makes a route cluster-local.
pub const CLUSTER_LOCAL: &str = "cluster-local";
/// The header telling the activator a request's namespace.
pub const NAMESPACE_HEADER: &str = "Knative-Serving-Namespace";
/// The header telling the activator a request's revision.
pub const REVISION_HEADER: &str = "Knative-Serving-Revision";
/// The suffix of the route's VirtualService (net-istio's `-ingress`).
pub const VIRTUAL_SERVICE_SUFFIX: &str = "-ingress";
/// The suffix of the route's mesh VirtualService (net-istio's `-mesh`).
pub const MESH_VIRTUAL_SERVICE_SUFFIX: &str = "-mesh";
/// Istio's name for every sidecar of the mesh as a gateway.
pub const MESH_GATEWAY: &str = "mesh";

/// Whether `route` is cluster-local: the visibility label or annotation says so, or its
/// domain is `svc.cluster.local`.
pub fn is_cluster_local(route: &Route, net: &NetworkConfig) -> bool {
    let says =
        |m: &BTreeMap<String, String>| m.get(VISIBILITY).map(String::as_str) == Some(CLUSTER_LOCAL);
    says(route.labels())
        || says(route.annotations())
        || net.domain.domain_for(route.labels()) == CLUSTER_LOCAL_DOMAIN
}

/// The host names of one target group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHosts {
    /// The group's name: the route's, or `tag-template`'s for a tag. Also its placeholder
    /// Service's name.
    pub name: String,
    /// The external host, unless the route is cluster-local.
    pub external: Option<String>,
    /// `{name}.{ns}`, `{name}.{ns}.svc`, `{name}.{ns}.svc.cluster.local`.
    pub local: Vec<String>,
}

impl GroupHosts {
    /// The URL people use: the external host, else the cluster-local one.
    pub fn url(&self) -> String {
        let host = self.external.as_deref().unwrap_or(&self.local[2]);
        format!("http://{host}")
    }
}

/// The hosts of `route`'s group `tag` (`None`: the default group).
pub fn group_hosts(route: &Route, tag: Option<&str>, net: &NetworkConfig) -> GroupHosts {
    let route_name = route.name_any();
    let ns = route.namespace().unwrap_or_default();
    let name = match tag {
        None => route_name.clone(),
        Some(tag) => net.templates.tag_template.render(&TemplateValues {
            name: &route_name,
            tag,
            ..TemplateValues::default()
        }),
    };
    let external = (!is_cluster_local(route, net)).then(|| {
        net.templates.domain_template.render(&TemplateValues {
            name: &name,
            namespace: &ns,
            domain: net.domain.domain_for(route.labels()),
            tag: "",
        })
    });
    let local = vec![
        format!("{name}.{ns}"),
        format!("{name}.{ns}.svc"),
        format!("{name}.{ns}.{CLUSTER_LOCAL_DOMAIN}"),
    ];
    GroupHosts {
        name,
        external,
        local,
    }
}

/// The labels every child of `route` carries: `serving.knative.dev/route`.
fn child_labels(route: &Route) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::ROUTE.to_string(), labels::value(&route.name_any()));
    if let Some(s) = route.labels().get(labels::SERVICE) {
        l.insert(labels::SERVICE.to_string(), s.clone());
    }
    l
}

pub(super) fn child_meta(route: &Route, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: route.namespace(),
        labels: Some(child_labels(route)),
        owner_references: Some(vec![owner_ref(route)]),
        ..ObjectMeta::default()
    }
}

/// The VirtualService's name: `{route}-ingress`, within 63 characters.
pub fn virtual_service_name(route: &Route) -> String {
    child_name(&route.name_any(), VIRTUAL_SERVICE_SUFFIX)
}

/// The mesh VirtualService's name: `{route}-mesh`, within 63 characters.
pub fn mesh_virtual_service_name(route: &Route) -> String {
    child_name(&route.name_any(), MESH_VIRTUAL_SERVICE_SUFFIX)
}

/// `^host(:port)?$` as an RE2 pattern.
fn authority_regex(host: &str) -> String {
    format!("^{}(?::\\d{{1,5}})?$", host.replace('.', "\\."))
}

fn destination(ns: &str, split: &Split, remove: &[String]) -> HttpRouteDestination {
    HttpRouteDestination {
        destination: Destination {
            host: format!("{}.{ns}.{CLUSTER_LOCAL_DOMAIN}", split.service),
            port: Some(PortSelector {
                number: u32::from(split.port),
            }),
            subset: None,
        },
        weight: Some(split.percent as i32),
        headers: Some(Headers {
            request: Some(HeaderOperations {
                set: split.set_headers.clone(),
                remove: remove.to_vec(),
                ..HeaderOperations::default()
            }),
            response: None,
        }),
    }
}

/// The Route's VirtualServices and the hash the gateways answer probes with.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualServices {
    /// `{route}-ingress`, on the external and local gateways.
    pub ingress: VirtualService,
    /// `{route}-mesh`, on the `mesh` gateway.
    pub mesh: VirtualService,
    /// [`ingress_hash`] of the two, as the probe routes set it.
    pub hash: String,
}

/// The VirtualServices of `route` with `traffic` (the module doc). `default_timeout_seconds`
/// applies to a revision without its own `timeoutSeconds` (config-defaults'
/// `revision-timeout-seconds`).
pub fn virtual_services(
    route: &Route,
    traffic: &Traffic,
    net: &NetworkConfig,
    default_timeout_seconds: u64,
) -> VirtualServices {
    istio_virtual_services(
        route,
        &describe(route, traffic, net, default_timeout_seconds),
        net,
    )
}

/// The Istio ingress class's writer: the VirtualServices of `route`'s ingress description.
pub fn istio_virtual_services(
    route: &Route,
    desc: &IngressDesc,
    net: &NetworkConfig,
) -> VirtualServices {
    write_virtual_services(desc, net, |n| child_meta(route, n))
}

/// The VirtualServices of an ingress description, each with the metadata `meta` gives its
/// name (the owner's labels and owner reference).
pub fn write_virtual_services(
    desc: &IngressDesc,
    net: &NetworkConfig,
    meta: impl Fn(String) -> ObjectMeta,
) -> VirtualServices {
    let ns = &desc.namespace;
    let external: Vec<String> = net
        .istio
        .external_gateways
        .iter()
        .map(|g| g.reference())
        .collect();
    let local: Vec<String> = net
        .istio
        .local_gateways
        .iter()
        .map(|g| g.reference())
        .collect();
    let mesh = vec![MESH_GATEWAY.to_string()];
    let tls_gateways = super::istio_tls::tls_gateway_refs(desc, net);
    let tls_hosts = super::istio_tls::tls_hosts(desc);
    let cluster_local = desc.cluster_local;
    let mut hosts = Vec::new();
    let mut mesh_hosts = Vec::new();
    let mut http = Vec::new();
    let mut mesh_http = Vec::new();
    let authority = |host: &str, gateways: &[String]| HttpMatchRequest {
        authority: Some(StringMatch {
            regex: Some(authority_regex(host)),
            ..StringMatch::default()
        }),
        gateways: gateways.to_vec(),
        ..HttpMatchRequest::default()
    };
    for group in &desc.groups {
        let h = &group.hosts;
        let mut matches = Vec::new();
        if let Some(ext) = &h.external {
            hosts.push(ext.clone());
            let on = if tls_hosts.contains(&ext.as_str()) {
                &tls_gateways
            } else {
                &external
            };
            matches.push(authority(ext, on));
        }
        for l in &h.local {
            hosts.push(l.clone());
            matches.push(authority(l, &local));
        }
        mesh_hosts.extend(h.local.get(2).cloned());
        let route_dests: Vec<HttpRouteDestination> = group
            .splits
            .iter()
            .map(|s| destination(ns, s, &desc.remove_headers))
            .collect();
        let group_route = HttpRoute {
            name: Some(h.name.clone()),
            match_: matches,
            route: route_dests,
            timeout: Some(format!("{}s", group.timeout_seconds)),
            rewrite: group.rewrite_host.as_ref().map(|a| HttpRewrite {
                authority: Some(a.clone()),
            }),
            ..HttpRoute::default()
        };
        mesh_http.push(HttpRoute {
            match_: h.local.iter().map(|l| authority(l, &mesh)).collect(),
            ..group_route.clone()
        });
        http.push(group_route);
    }
    let mut gateways = Vec::new();
    if !cluster_local {
        gateways.extend(external);
        gateways.extend(tls_gateways);
    }
    if desc.groups.iter().any(|g| !g.hosts.local.is_empty()) {
        gateways.extend(local);
    }
    let mut ingress = VirtualService {
        metadata: meta(child_name(&desc.name, VIRTUAL_SERVICE_SUFFIX)),
        spec: VirtualServiceSpec {
            hosts,
            gateways,
            http,
        },
    };
    let mut mesh = VirtualService {
        metadata: meta(child_name(&desc.name, MESH_VIRTUAL_SERVICE_SUFFIX)),
        spec: VirtualServiceSpec {
            hosts: mesh_hosts,
            gateways: mesh,
            http: mesh_http,
        },
    };
    let hash = description_hash(&desc.namespace, &desc.name, &ingress.spec, &mesh.spec);
    insert_probe(&mut ingress.spec, &hash);
    insert_probe(&mut mesh.spec, &hash);
    VirtualServices {
        ingress,
        mesh,
        hash,
    }
}

/// The ingress VirtualService alone (see [`virtual_services`]).
pub fn virtual_service(
    route: &Route,
    traffic: &Traffic,
    net: &NetworkConfig,
    default_timeout_seconds: u64,
) -> VirtualService {
    virtual_services(route, traffic, net, default_timeout_seconds).ingress
}

/// The hash of a route's ingress description (net-istio's `ComputeHash`): SHA-256 of the two
/// VirtualServices' specs before the probe routes, the namespace and the name, in hex. Equal
/// descriptions hash equal whatever the route's generation; any change of hosts, gateways,
/// splits, headers or timeouts changes it.
pub fn ingress_hash(
    route: &Route,
    ingress: &VirtualServiceSpec,
    mesh: &VirtualServiceSpec,
) -> String {
    description_hash(
        &route.namespace().unwrap_or_default(),
        &route.name_any(),
        ingress,
        mesh,
    )
}

fn description_hash(
    namespace: &str,
    name: &str,
    ingress: &VirtualServiceSpec,
    mesh: &VirtualServiceSpec,
) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // Serialising these plain structs (strings, numbers, sorted maps) cannot fail.
    h.update(serde_json::to_vec(ingress).unwrap_or_default());
    h.update(serde_json::to_vec(mesh).unwrap_or_default());
    h.update(namespace.as_bytes());
    h.update(name.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Puts before each HTTP route its probe copy (net-istio's `InsertProbe`): the same matches
/// with `K-Network-Hash: override` required, every destination setting `K-Network-Hash:
/// {hash}` and keeping the prober's two headers.
fn insert_probe(spec: &mut VirtualServiceSpec, hash: &str) {
    use crate::knative::headers as h;
    let mut probes = Vec::with_capacity(spec.http.len() * 2);
    for r in &spec.http {
        let mut p = r.clone();
        p.name = r.name.as_ref().map(|n| format!("{n}-probe"));
        for m in &mut p.match_ {
            m.headers.insert(
                h::NETWORK_HASH.to_ascii_lowercase(),
                StringMatch {
                    exact: Some(h::HASH_VALUE_OVERRIDE.into()),
                    ..StringMatch::default()
                },
            );
        }
        for d in &mut p.route {
            let ops = d
                .headers
                .get_or_insert_with(Headers::default)
                .request
                .get_or_insert_with(HeaderOperations::default);
            ops.set
                .insert(h::NETWORK_HASH.to_string(), hash.to_string());
            ops.remove = removed_headers(&[h::NETWORK_PROBE, h::NETWORK_HASH]);
        }
        probes.push(p);
    }
    probes.append(&mut spec.http);
    spec.http = probes;
}

/// The placeholder Services: one per group (`{route}`, `{tag}-{route}`). A tag whose name
/// would pass 63 characters gets none (Kubernetes would refuse the name).
pub fn placeholder_services(route: &Route, traffic: &Traffic, net: &NetworkConfig) -> Vec<Service> {
    let target = local_gateway_service(net);
    let mut names: Vec<String> = vec![route.name_any()];
    names.extend(
        traffic
            .groups
            .keys()
            .flatten()
            .map(|tag| group_hosts(route, Some(tag), net).name),
    );
    names
        .into_iter()
        .filter(|n| n.len() <= crate::knative::names::MAX_NAME_LEN)
        .map(|name| Service {
            metadata: child_meta(route, name),
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some(target.clone()),
                session_affinity: Some("None".into()),
                ports: Some(vec![ServicePort {
                    name: Some("http2".into()),
                    port: 80,
                    target_port: Some(IntOrString::Int(80)),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        })
        .collect()
}

/// The host of the first local gateway's Service of the ingress class in force: where the
/// placeholder Services point.
pub fn local_gateway_service(net: &NetworkConfig) -> String {
    match net.templates.ingress_class {
        IngressClass::Istio => net.istio.local_gateways.first().map(|g| g.service.clone()),
        IngressClass::GatewayApi => net
            .gateway
            .local_gateways
            .first()
            .and_then(|g| g.service_host()),
    }
    .unwrap_or_default()
}

/// `status.url`.
pub fn url(route: &Route, net: &NetworkConfig) -> String {
    group_hosts(route, None, net).url()
}

/// `status.address`: `http://{route}.{namespace}.svc.cluster.local`.
pub fn address(route: &Route) -> Addressable {
    Addressable {
        url: Some(format!(
            "http://{}.{}.{CLUSTER_LOCAL_DOMAIN}",
            route.name_any(),
            route.namespace().unwrap_or_default()
        )),
        ..Addressable::default()
    }
}

/// `status.traffic`: the flattened targets with revision names, and each tag's URL.
pub fn status_traffic(route: &Route, traffic: &Traffic, net: &NetworkConfig) -> Vec<TrafficTarget> {
    traffic
        .targets
        .iter()
        .map(|t| TrafficTarget {
            tag: t.tag.clone(),
            revision_name: Some(t.revision.clone()),
            configuration_name: None,
            latest_revision: t.latest_revision,
            percent: t.percent,
            url: t
                .tag
                .as_deref()
                .map(|tag| group_hosts(route, Some(tag), net).url()),
        })
        .collect()
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
