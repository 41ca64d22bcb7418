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
//!   config-gateway;
//! - the pods of those Services' namespaces, for the gateways' mesh identities: the
//!   `(namespace, service account)` of each pod whose address is a gateway endpoint, believed
//!   in `X-Forwarded-Client-Cert` from the activator's own sidecar
//!   ([`crate::activator::mesh_identity`]). RBAC: `pods` list/watch, which the activator has
//!   cluster-wide already.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::activator::route_check::{
    CATCH_UP_SEATS, GatewayIdentities, GatewayPeers, GroupInput, RouteBook, RouteGuard, RouteInput,
};
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
    let identities = GatewayIdentities::new();
    let api: Api<Route> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    tokio::spawn(
        follow_routes(api, routes.clone(), live.clone(), stop.clone())
            .instrument(tracing::info_span!("watch", resource = "routes")),
    );
    tokio::spawn(
        follow_gateways(client, gateways.clone(), identities.clone(), live, stop)
            .instrument(tracing::info_span!("watch", resource = "gateway endpoints")),
    );
    RouteGuard {
        routes,
        gateways,
        identities,
        catch_up_seats: CATCH_UP_SEATS,
    }
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

/// One Route as the book takes it: the default group (its hosts, drawing from the targets
/// with a percent above 0) and each tag's group (its hosts, its revision), as Knative's
/// traffic configuration builds them; every revision `status.traffic` names.
pub fn route_input(route: &Route, net: &NetworkConfig) -> RouteInput {
    let traffic = route
        .status
        .as_ref()
        .map(|s| s.fields.traffic.as_slice())
        .unwrap_or_default();
    let hosts = |tag: Option<&str>| {
        let g = group_hosts(route, tag, net);
        g.external.into_iter().chain(g.local).collect::<Vec<_>>()
    };
    let percent = |p: Option<i64>| u32::try_from(p.unwrap_or(0).clamp(0, 100)).unwrap_or(0);
    let mut groups = vec![GroupInput {
        tag: None,
        hosts: hosts(None),
        split: traffic
            .iter()
            .filter_map(|t| Some((t.revision_name.clone()?, percent(t.percent))))
            .collect(),
    }];
    let mut tags = BTreeSet::new();
    for t in traffic {
        if let (Some(tag), Some(rev)) = (t.tag.as_deref(), t.revision_name.as_ref())
            && tags.insert(tag)
        {
            groups.push(GroupInput {
                tag: Some(tag.to_string()),
                hosts: hosts(Some(tag)),
                split: vec![(rev.clone(), 100)],
            });
        }
    }
    RouteInput {
        namespace: route.namespace().unwrap_or_default(),
        name: route.name_any(),
        groups,
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
    identities: Arc<GatewayIdentities>,
    live: LiveConfig,
    stop: CancellationToken,
) {
    loop {
        let services = live_gateway_services(&live);
        tracing::info!(?services, "following the gateways' endpoints and pods");
        let these = stop.child_token();
        let changed = Arc::new(Notify::new());
        let rxs: Vec<_> = services
            .iter()
            .map(|(ns, name)| {
                let rx = watch_service(client.clone(), ns, name, these.clone());
                forward(rx.clone(), changed.clone());
                rx
            })
            .collect();
        let namespaces: BTreeSet<&str> = services.iter().map(|(ns, _)| ns.as_str()).collect();
        let pods: Vec<_> = namespaces
            .into_iter()
            .map(|ns| {
                let rx = watch_pods(client.clone(), ns, these.clone());
                forward(rx.clone(), changed.clone());
                (ns.to_string(), rx)
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
                    let ids = pods
                        .iter()
                        .flat_map(|(ns, rx)| gateway_identities(ns, &addrs, &rx.borrow()))
                        .collect::<Vec<_>>();
                    peers.set(addrs);
                    identities.set(ids);
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

/// Notifies `changed` at each change `rx` sees, until its sender goes.
fn forward<T: Send + Sync + 'static>(mut rx: watch::Receiver<T>, changed: Arc<Notify>) {
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            changed.notify_one();
        }
    });
}

/// What identities need of one pod: its addresses and service account.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodIdentity {
    ips: Vec<IpAddr>,
    service_account: String,
}

/// A pod that may serve (not Succeeded or Failed) with addresses: its identity.
fn pod_identity(pod: &Pod) -> Option<PodIdentity> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    ips.sort();
    ips.dedup();
    let service_account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".to_string());
    (!ips.is_empty()).then_some(PodIdentity {
        ips,
        service_account,
    })
}

/// The `(namespace, service account)` of each of `namespace`'s `pods` with an address among
/// the gateway endpoints `addrs`.
fn gateway_identities(
    namespace: &str,
    addrs: &[IpAddr],
    pods: &HashMap<String, PodIdentity>,
) -> Vec<(String, String)> {
    pods.values()
        .filter(|p| {
            p.ips
                .iter()
                .any(|ip| addrs.iter().any(|a| a.to_canonical() == *ip))
        })
        .map(|p| (namespace.to_string(), p.service_account.clone()))
        .collect()
}

/// Follows `namespace`'s pods (their identities, by name) until `stop`.
fn watch_pods(
    client: kube::Client,
    namespace: &str,
    stop: CancellationToken,
) -> watch::Receiver<HashMap<String, PodIdentity>> {
    let (tx, rx) = watch::channel(HashMap::new());
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let span = tracing::info_span!("watch", resource = "gateway pods", namespace = %namespace);
    tokio::spawn(
        async move {
            let mut s =
                std::pin::pin!(watch_stream(api, watcher::Config::default()).default_backoff());
            let mut listing: Option<HashMap<String, PodIdentity>> = None;
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                match ev {
                    None => return,
                    Some(Err(e)) => tracing::warn!(error = %e, "pod watch error; resuming"),
                    Some(Ok(Event::Init)) => listing = Some(HashMap::new()),
                    Some(Ok(Event::InitApply(p))) => {
                        if let (Some(l), Some(id)) = (listing.as_mut(), pod_identity(&p)) {
                            l.insert(p.name_any(), id);
                        }
                    }
                    Some(Ok(Event::InitDone)) => {
                        let all = listing.take().unwrap_or_default();
                        tx.send_if_modified(|cur| std::mem::replace(cur, all) != *cur);
                    }
                    Some(Ok(Event::Apply(p))) => {
                        let name = p.name_any();
                        let id = pod_identity(&p);
                        tx.send_if_modified(|cur| match id {
                            Some(id) => cur.insert(name, id.clone()).as_ref() != Some(&id),
                            None => cur.remove(&name).is_some(),
                        });
                    }
                    Some(Ok(Event::Delete(p))) => {
                        tx.send_if_modified(|cur| cur.remove(&p.name_any()).is_some());
                    }
                }
            }
        }
        .instrument(span),
    );
    rx
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
                {"revisionName": "web-2", "percent": 90},
                {"revisionName": "web-3", "percent": 10, "tag": "next"},
                {"revisionName": "web-1", "percent": 0, "tag": "old"},
            ]},
        }))
        .unwrap();
        let input = route_input(&r, &NetworkConfig::default());
        let default = &input.groups[0];
        assert_eq!(default.tag, None);
        for h in [
            "web.team-a.example.com",
            "web.team-a",
            "web.team-a.svc",
            "web.team-a.svc.cluster.local",
        ] {
            assert!(default.hosts.iter().any(|x| x == h), "{h} in {default:?}");
        }
        // The default group draws by percent (a 0 % target is never drawn).
        assert_eq!(
            default.split,
            [
                ("web-2".to_string(), 90),
                ("web-3".to_string(), 10),
                ("web-1".to_string(), 0)
            ]
        );
        // Each tag's hosts reach its revision alone.
        let old = input
            .groups
            .iter()
            .find(|g| g.tag.as_deref() == Some("old"))
            .unwrap();
        assert!(old.hosts.iter().any(|h| h == "old-web.team-a.example.com"));
        assert!(old.hosts.iter().any(|h| h == "old-web.team-a"));
        assert_eq!(old.split, [("web-1".to_string(), 100)]);
        assert_eq!(input.groups.len(), 3);
        assert_eq!(input.revisions, ["web-2", "web-3", "web-1"]);
    }

    /// The gateways' identities are the service accounts of the pods whose addresses are
    /// gateway endpoints, and no other pod's of their namespace.
    #[test]
    fn gateway_identities_are_the_gateway_pods_service_accounts() {
        let pod = |ip: &str, sa: Option<&str>, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{ip}"), "namespace": "istio-system"},
                "spec": {"serviceAccountName": sa, "containers": []},
                "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]},
            }))
            .unwrap()
        };
        let pods: HashMap<String, PodIdentity> = [
            pod(
                "10.0.0.1",
                Some("istio-ingressgateway-service-account"),
                "Running",
            ),
            pod("10.0.0.2", Some("tenant-looking-gateway"), "Running"),
            pod("10.0.0.3", None, "Running"),
            pod("10.0.0.4", Some("gone"), "Failed"),
        ]
        .iter()
        .filter_map(|p| Some((p.name_any(), pod_identity(p)?)))
        .collect();
        assert_eq!(pods.len(), 3, "a Failed pod is no one");
        let addrs: Vec<IpAddr> = ["10.0.0.1", "::ffff:10.0.0.3", "10.0.0.4"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let mut ids = gateway_identities("istio-system", &addrs, &pods);
        ids.sort();
        assert_eq!(
            ids,
            [
                ("istio-system".into(), "default".into()),
                (
                    "istio-system".into(),
                    "istio-ingressgateway-service-account".into()
                ),
            ]
        );
    }
}
