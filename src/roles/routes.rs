//! What `thaw activator` checks requests against ([`crate::activator::route_check`]), followed
//! in the cluster:
//!
//! - every Route (`serving.knative.dev/v1`): its hosts, as the Route reconciler builds them
//!   ([`group_hosts`]: the default group's and each tag's, external and cluster-local, from the
//!   live config-domain and config-network), and the revisions its `status.traffic` names.
//!   Hosts are recomputed when those ConfigMaps change; once a second the book drops
//!   revisions whose `routing-grace` has passed;
//! - the ready endpoints of the gateway Services of the ingress class in force (external and
//!   local: config-istio's, or config-gateway's), the peers `trusted-proxies`' default
//!   believes; the Services followed change with config-network, config-istio and
//!   config-gateway.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::activator::route_check::{GatewayPeers, RouteBook, RouteGuard, RouteInput};
use crate::config::live::LiveConfig;
use crate::config::network::{
    CLUSTER_LOCAL_DOMAIN, GatewayConfig, IngressClass, IstioConfig, NetworkConfig,
};
use crate::controller::route::resources::group_hosts;
use crate::knative::Route;
use crate::platform::kubernetes::service_slices::watch_service;

/// How often expired grace entries are dropped and the network ConfigMaps compared.
const TICK: Duration = Duration::from_secs(1);

/// Starts following the Routes (of `namespace`, or every one) and the gateways; returns the
/// guard to give the activator. Its book says when the Routes have been listed once.
pub fn follow(
    client: kube::Client,
    namespace: Option<&str>,
    live: LiveConfig,
    stop: CancellationToken,
) -> RouteGuard {
    let routes = RouteBook::new();
    let gateways = GatewayPeers::new();
    let api: Api<Route> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    tokio::spawn(
        follow_routes(api, routes.clone(), live.clone(), stop.clone())
            .instrument(tracing::info_span!("watch", resource = "routes")),
    );
    tokio::spawn(
        follow_gateways(client, gateways.clone(), live, stop)
            .instrument(tracing::info_span!("watch", resource = "gateway endpoints")),
    );
    RouteGuard { routes, gateways }
}

/// The network settings hosts are built from, as they are now.
fn network(live: &LiveConfig) -> NetworkConfig {
    NetworkConfig {
        domain: (**live.domain.load()).clone(),
        templates: (**live.network.load()).clone(),
        istio: (**live.istio.load()).clone(),
        gateway: (**live.gateway.load()).clone(),
        certmanager: Default::default(),
    }
}

/// One Route as the book takes it.
pub fn route_input(route: &Route, net: &NetworkConfig) -> RouteInput {
    let traffic = route
        .status
        .as_ref()
        .map(|s| s.fields.traffic.as_slice())
        .unwrap_or_default();
    let mut tags: Vec<Option<&str>> = vec![None];
    tags.extend(traffic.iter().filter_map(|t| t.tag.as_deref().map(Some)));
    tags.dedup();
    let mut hosts = Vec::new();
    for tag in tags {
        let g = group_hosts(route, tag, net);
        hosts.extend(g.external);
        hosts.extend(g.local);
    }
    RouteInput {
        namespace: route.namespace().unwrap_or_default(),
        name: route.name_any(),
        hosts,
        revisions: traffic
            .iter()
            .filter_map(|t| t.revision_name.clone())
            .collect(),
    }
}

async fn follow_routes(
    api: Api<Route>,
    book: Arc<RouteBook>,
    live: LiveConfig,
    stop: CancellationToken,
) {
    let grace = || live.activator.load().routing_grace;
    let mut s = std::pin::pin!(watch_stream(api, watcher::Config::default()).default_backoff());
    // The Routes as last seen (stripped to what hosts are built from), to rebuild their
    // hosts when config-domain or config-network change.
    let mut seen: HashMap<(String, String), Route> = HashMap::new();
    let mut listing: Option<HashMap<(String, String), Route>> = None;
    let mut net = network(&live);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let now_net = network(&live);
                if now_net != net {
                    net = now_net;
                    tracing::info!("network settings changed; rebuilding the routes' hosts");
                    let all = seen.values().map(|r| route_input(r, &net)).collect();
                    book.replace_all(all, Instant::now(), grace());
                }
                book.prune(Instant::now(), grace());
                continue;
            }
            ev = s.next() => ev,
        };
        match ev {
            None => return,
            Some(Err(e)) => tracing::warn!(error = %e, "route watch error; resuming"),
            Some(Ok(Event::Init)) => listing = Some(HashMap::new()),
            Some(Ok(Event::InitApply(r))) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(key(&r), strip(r));
                }
            }
            Some(Ok(Event::InitDone)) => {
                seen = listing.take().unwrap_or_default();
                let all = seen.values().map(|r| route_input(r, &net)).collect();
                book.replace_all(all, Instant::now(), grace());
                tracing::info!(routes = seen.len(), "routes listed");
            }
            Some(Ok(Event::Apply(r))) => {
                book.set(route_input(&r, &net), Instant::now(), grace());
                seen.insert(key(&r), strip(r));
            }
            Some(Ok(Event::Delete(r))) => {
                let (ns, name) = key(&r);
                book.delete(&ns, &name, Instant::now(), grace());
                seen.remove(&(ns, name));
            }
        }
    }
}

fn key(r: &Route) -> (String, String) {
    (r.namespace().unwrap_or_default(), r.name_any())
}

/// The parts of a Route its hosts and routed revisions come from (name, namespace, labels,
/// annotations, status traffic).
fn strip(mut r: Route) -> Route {
    r.metadata.managed_fields = None;
    if let Some(s) = r.status.as_mut() {
        s.status.conditions.clear();
    }
    r
}

/// `(namespace, name)` of a gateway Service host (`{name}.{namespace}.svc...`).
fn service_of(host: &str) -> Option<(String, String)> {
    let rest = host
        .strip_suffix(&format!(".{CLUSTER_LOCAL_DOMAIN}"))
        .or_else(|| host.strip_suffix(".svc"))
        .unwrap_or(host);
    let (name, ns) = rest.split_once('.')?;
    (!name.is_empty() && !ns.is_empty() && !ns.contains('.')).then(|| (ns.into(), name.into()))
}

/// The Services of the gateways of the ingress class in force, external and local:
/// config-istio's, or config-gateway's (those that name one).
fn gateway_services(
    class: IngressClass,
    istio: &IstioConfig,
    gateway: &GatewayConfig,
) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = match class {
        IngressClass::Istio => istio
            .external_gateways
            .iter()
            .chain(&istio.local_gateways)
            .filter_map(|g| service_of(&g.service))
            .collect(),
        IngressClass::GatewayApi => gateway
            .external_gateways
            .iter()
            .chain(&gateway.local_gateways)
            .filter_map(|g| g.service.as_ref())
            .map(|s| (s.namespace.clone(), s.name.clone()))
            .collect(),
    };
    v.sort();
    v.dedup();
    v
}

/// [`gateway_services`] of the live configuration.
fn live_gateway_services(live: &LiveConfig) -> Vec<(String, String)> {
    gateway_services(
        live.network.load().ingress_class,
        &live.istio.load(),
        &live.gateway.load(),
    )
}

async fn follow_gateways(
    client: kube::Client,
    peers: Arc<GatewayPeers>,
    live: LiveConfig,
    stop: CancellationToken,
) {
    loop {
        let services = live_gateway_services(&live);
        tracing::info!(?services, "following the gateways' endpoints");
        let these = stop.child_token();
        let changed = Arc::new(Notify::new());
        let rxs: Vec<_> = services
            .iter()
            .map(|(ns, name)| {
                let rx = watch_service(client.clone(), ns, name, these.clone());
                let mut each = rx.clone();
                let changed = changed.clone();
                tokio::spawn(async move {
                    while each.changed().await.is_ok() {
                        changed.notify_one();
                    }
                });
                rx
            })
            .collect();
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = changed.notified() => {
                    let addrs: Vec<IpAddr> = rxs
                        .iter()
                        .flat_map(|rx| {
                            let e = rx.borrow();
                            e.ports.values().flatten().map(|a| a.ip()).collect::<Vec<_>>()
                        })
                        .collect();
                    peers.set(addrs);
                }
                _ = tick.tick() => {
                    if live_gateway_services(&live) != services {
                        break;
                    }
                }
            }
        }
        these.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_service_hosts() {
        assert_eq!(
            service_of("istio-ingressgateway.istio-system.svc.cluster.local"),
            Some(("istio-system".into(), "istio-ingressgateway".into()))
        );
        assert_eq!(service_of("gw.ns.svc"), Some(("ns".into(), "gw".into())));
        assert_eq!(service_of("gw.ns"), Some(("ns".into(), "gw".into())));
        assert_eq!(service_of("gw"), None);
        let both = gateway_services(
            IngressClass::Istio,
            &IstioConfig::default(),
            &GatewayConfig::default(),
        );
        assert_eq!(
            both,
            [
                (
                    "istio-system".to_string(),
                    "istio-ingressgateway".to_string()
                ),
                (
                    "istio-system".to_string(),
                    "knative-local-gateway".to_string()
                )
            ]
        );
    }

    /// With the Gateway API class, config-gateway's Services are the trusted peers, as
    /// config-gateway says them.
    #[test]
    fn the_gateway_api_class_trusts_config_gateways_services() {
        use crate::config::ConfigMap;
        let gateway = GatewayConfig::parse(&std::collections::BTreeMap::from([(
            "external-gateways".to_string(),
            "- class: eg\n  gateway: envoy/eg\n  service: envoy/eg-proxy\n".to_string(),
        )]))
        .unwrap()
        .config;
        let v = gateway_services(IngressClass::GatewayApi, &IstioConfig::default(), &gateway);
        assert_eq!(
            v,
            [
                ("envoy".to_string(), "eg-proxy".to_string()),
                (
                    "istio-system".to_string(),
                    "knative-local-gateway".to_string()
                )
            ]
        );
    }

    /// A Route's hosts are the reconciler's: external and cluster-local short names, tags
    /// too; its revisions are its status traffic's.
    #[test]
    fn a_routes_hosts_and_revisions() {
        let r: Route = serde_json::from_value(serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Route",
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {},
            "status": {"traffic": [
                {"revisionName": "web-2", "percent": 100},
                {"revisionName": "web-1", "percent": 0, "tag": "old"},
            ]},
        }))
        .unwrap();
        let input = route_input(&r, &NetworkConfig::default());
        for h in [
            "web.team-a.example.com",
            "web.team-a",
            "web.team-a.svc",
            "web.team-a.svc.cluster.local",
            "old-web.team-a.example.com",
            "old-web.team-a",
        ] {
            assert!(
                input.hosts.iter().any(|x| x == h),
                "{h} in {:?}",
                input.hosts
            );
        }
        assert_eq!(input.revisions, ["web-2", "web-1"]);
    }
}
