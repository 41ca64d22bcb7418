//! The ingress prober (net-istio's status prober, `networking/pkg/status`): whether every
//! gateway pod serves a route's current VirtualService, told by the hash the probe routes set
//! ([`super::resources::ingress_hash`]).
//!
//! For a route and a hash, one task probes each pod of each gateway (the ready endpoints of
//! the gateway's Kubernetes Service, from its EndpointSlices) with each host the gateway
//! serves for the route: `GET http://{pod}/healthz` with `Host: {host}`, `K-Network-Probe:
//! probe`, `K-Network-Hash: override` and `User-Agent: Knative-Ingress-Probe`. The gateway's
//! probe route replaces the hash and forwards to a backend (the activator or a pod's queue
//! sidecar), which echoes it: a 200 carrying the current hash means that pod serves this
//! version of the route. Anything else (an old hash, another status, no answer within
//! [`PROBE_TIMEOUT`]) is probed again after a backoff ([`BACKOFF_BASE`] doubling to
//! [`BACKOFF_CAP`]), the gateway's pods read again each round. Once every (pod, host) has
//! answered, the route is re-queued and its `IngressReady` turns True.
//!
//! Bounds: one task per route being probed (a new hash replaces the route's task; a deleted
//! route's task is stopped, [`Prober::forget`]); at most [`PROBE_CONCURRENCY`] probes in
//! flight across all routes (Knative's `probeConcurrency`); one fresh connection per probe,
//! closed after it; a gateway's endpoints are read at most once per [`RESOLVE_TTL`] whatever
//! the number of routes; the status message lists at most [`MESSAGE_FAILURES`] failures.
//! Every round is counted in `thaw_controller_ingress_probes_total{result}`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Duration, Instant};
use tracing::Instrument;

use crate::config::network::Gateway;
use crate::knative::Route;
use crate::knative::headers as h;
use crate::telemetry::controller::ControllerMetrics;

/// Probes in flight at once, across every route (Knative's `probeConcurrency`).
pub const PROBE_CONCURRENCY: usize = 15;
/// The longest one probe (connect, request, response head) may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The wait before the second round of a route's probes.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// The longest wait between two rounds.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// How long a gateway's endpoints, once read, serve every route's probes.
pub const RESOLVE_TTL: Duration = Duration::from_secs(1);
/// Failures named in the status message (the rest are counted).
pub const MESSAGE_FAILURES: usize = 3;
/// The path probed (Knative's prober uses `/healthz`; the probe route matches any path).
pub const PROBE_PATH: &str = "/healthz";

/// One gateway and the hosts it serves for the route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayHosts {
    pub gateway: Gateway,
    pub hosts: Vec<String>,
}

/// Whether the gateways serve a route's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// Every pod of every gateway answered with the hash.
    Ready,
    /// Not yet: what is missing, for the condition's message.
    Pending(String),
}

/// How one probe ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 200 with the current hash.
    Ok,
    /// 200 with another hash (or none): the pod serves another version of the route.
    OldHash(String),
    /// Another status (a gateway without the route answers 404).
    Status(u16),
    /// No answer: refused, reset or past [`PROBE_TIMEOUT`].
    Failed(String),
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OldHash(_) => "old_hash",
            Outcome::Status(_) => "status",
            Outcome::Failed(_) => "error",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok => f.write_str("serves the route"),
            Outcome::OldHash(h) if h.is_empty() => f.write_str("answered without a hash"),
            Outcome::OldHash(h) => write!(f, "serves hash {}", short(h)),
            Outcome::Status(s) => write!(f, "answered {s}"),
            Outcome::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

/// A route's probing: its hash, how far it got, and the task doing it.
struct RouteProbe {
    hash: String,
    state: Arc<Mutex<Probed>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RouteProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Resolved = Result<Vec<SocketAddr>, String>;

/// The prober of one controller (module doc). Cheap to share (`Arc`).
pub struct Prober {
    client: kube::Client,
    routes: Mutex<HashMap<(String, String), RouteProbe>>,
    permits: Arc<Semaphore>,
    /// Routes to reconcile again: the probing finished or its message changed.
    requeue: mpsc::Sender<ObjectRef<Route>>,
    resolved: Mutex<HashMap<String, (Instant, Resolved)>>,
    metrics: ControllerMetrics,
}

impl Prober {
    /// A prober reading gateways through `client`; each route whose probing finishes (or
    /// whose pending message changes) is sent to `requeue` (dropped when it is full: the
    /// route's resync reads the state anyway).
    pub fn new(
        client: kube::Client,
        requeue: mpsc::Sender<ObjectRef<Route>>,
        metrics: ControllerMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            routes: Mutex::new(HashMap::new()),
            permits: Arc::new(Semaphore::new(PROBE_CONCURRENCY)),
            requeue,
            resolved: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// Whether `gateways` serve `route` at `hash`: the state of its probing, started now when
    /// the route has none for this hash (replacing one for an older hash).
    pub fn check(
        self: &Arc<Self>,
        route: &Route,
        hash: &str,
        gateways: Vec<GatewayHosts>,
    ) -> Probed {
        let key = (
            route.metadata.namespace.clone().unwrap_or_default(),
            route.metadata.name.clone().unwrap_or_default(),
        );
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = routes.get(&key)
            && p.hash == hash
        {
            return p.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        }
        let pending = Probed::Pending(format!(
            "Waiting for the gateways to serve the route (hash {}).",
            short(hash)
        ));
        let state = Arc::new(Mutex::new(pending.clone()));
        let me = self.clone();
        let span = tracing::info_span!("ingress_probe", namespace = %key.0, route = %key.1,
            hash = short(hash));
        let task = tokio::spawn(
            me.probe_until_ready(
                ObjectRef::new(&key.1).within(&key.0),
                hash.to_string(),
                gateways,
                state.clone(),
            )
            .instrument(span),
        );
        routes.insert(
            key,
            RouteProbe {
                hash: hash.to_string(),
                state,
                task,
            },
        );
        pending
    }

    /// Stops probing a deleted route and forgets it.
    pub fn forget(&self, namespace: &str, name: &str) {
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Routes with a probing state (ready or not).
    pub fn len(&self) -> usize {
        self.routes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no route has a probing state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    async fn probe_until_ready(
        self: Arc<Self>,
        route: ObjectRef<Route>,
        hash: String,
        gateways: Vec<GatewayHosts>,
        state: Arc<Mutex<Probed>>,
    ) {
        let mut done: std::collections::HashSet<(SocketAddr, String)> = Default::default();
        let mut wait = BACKOFF_BASE;
        loop {
            let mut failures: Vec<String> = Vec::new();
            let mut probes = tokio::task::JoinSet::new();
            let mut targets = 0usize;
            for gw in &gateways {
                let pods = match self.resolve(&gw.gateway).await {
                    Ok(p) if p.is_empty() => {
                        failures.push(format!(
                            "gateway {} has no ready pods ({})",
                            gw.gateway.reference(),
                            gw.gateway.service
                        ));
                        continue;
                    }
                    Ok(p) => p,
                    Err(e) => {
                        failures.push(format!("gateway {}: {e}", gw.gateway.reference()));
                        continue;
                    }
                };
                for pod in pods {
                    for host in &gw.hosts {
                        targets += 1;
                        if done.contains(&(pod, host.clone())) {
                            continue;
                        }
                        let (permits, hash, host) =
                            (self.permits.clone(), hash.clone(), host.clone());
                        let gateway = gw.gateway.reference();
                        probes.spawn(async move {
                            let _permit = permits.acquire_owned().await;
                            let outcome = probe(pod, &host, &hash).await;
                            (gateway, pod, host, outcome)
                        });
                    }
                }
            }
            // Per failing pod: its first failure and the hosts it failed for.
            let mut failing: std::collections::BTreeMap<(String, SocketAddr), (Outcome, usize)> =
                Default::default();
            while let Some(joined) = probes.join_next().await {
                let Ok((gateway, pod, host, outcome)) = joined else {
                    continue;
                };
                self.metrics
                    .ingress_probes
                    .get_or_create(&crate::telemetry::controller::ProbeLabels {
                        result: outcome.label(),
                    })
                    .inc();
                if outcome == Outcome::Ok {
                    done.insert((pod, host));
                } else {
                    tracing::debug!(%gateway, %pod, %host, %outcome, "probe failed");
                    failing.entry((gateway, pod)).or_insert((outcome, 0)).1 += 1;
                }
            }
            let failed = failing.len();
            let listed = failed.min(MESSAGE_FAILURES.saturating_sub(failures.len()));
            for ((gateway, pod), (outcome, hosts)) in failing.into_iter().take(listed) {
                failures.push(format!(
                    "gateway {gateway} pod {pod} {outcome} ({hosts} of {} hosts)",
                    gateways
                        .iter()
                        .find(|g| g.gateway.reference() == gateway)
                        .map_or(0, |g| g.hosts.len())
                ));
            }
            if failures.is_empty() && targets > 0 {
                tracing::debug!(targets, "every gateway pod serves the route");
                *state.lock().unwrap_or_else(|e| e.into_inner()) = Probed::Ready;
                let _ = self.requeue.try_send(route);
                return;
            }
            // Pods not named.
            let more = failed - listed;
            let mut message = format!(
                "Waiting for the gateways to serve the route (hash {}): {}",
                short(&hash),
                failures.join("; ")
            );
            if more > 0 {
                message.push_str(&format!("; and {more} more pods"));
            }
            message.push('.');
            let changed = {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                let next = Probed::Pending(message);
                let changed = *s != next;
                *s = next;
                changed
            };
            if changed {
                let _ = self.requeue.try_send(route.clone());
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(BACKOFF_CAP);
        }
    }

    /// The ready endpoints of `gw`'s Service (read at most once per [`RESOLVE_TTL`]).
    async fn resolve(&self, gw: &Gateway) -> Resolved {
        let now = Instant::now();
        if let Some((at, r)) = self
            .resolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&gw.service)
            && now.duration_since(*at) < RESOLVE_TTL
        {
            return r.clone();
        }
        let r = gateway_pods(&self.client, &gw.service).await;
        let mut cache = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the gateways configured (entries of others go at their next refresh).
        cache.retain(|_, (at, _)| now.duration_since(*at) < RESOLVE_TTL * 60);
        cache.insert(gw.service.clone(), (now, r.clone()));
        r
    }
}

/// `{name}.{namespace}[.svc[.cluster.local]]` as (namespace, name).
pub fn service_of(host: &str) -> Option<(&str, &str)> {
    let mut parts = host.split('.');
    let name = parts.next().filter(|s| !s.is_empty())?;
    let ns = parts.next().filter(|s| !s.is_empty())?;
    Some((ns, name))
}

/// The ready endpoints of the gateway Service `service` (a host name), on the port the
/// gateway serves plain HTTP on: the Service's port 80 (else its first), matched by name in
/// each EndpointSlice.
pub async fn gateway_pods(client: &kube::Client, service: &str) -> Resolved {
    service_pods(client, service, 80).await
}

/// The ready endpoints behind port `number` of the Service `service` (a host name): that
/// port of the Service (else its first), matched by name in each EndpointSlice.
pub async fn service_pods(client: &kube::Client, service: &str, number: i32) -> Resolved {
    let (ns, name) =
        service_of(service).ok_or_else(|| format!("{service} is not a Service host name"))?;
    let svc = Api::<KubeService>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read Service {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("Service {ns}/{name} does not exist"))?;
    let ports = svc.spec.and_then(|s| s.ports).unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.port == number)
        .or(ports.first())
        .ok_or_else(|| format!("Service {ns}/{name} has no port"))?;
    let port_name = port.name.clone().unwrap_or_default();
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map_err(|e| format!("cannot list the EndpointSlices of {ns}/{name}: {e}"))?;
    let mut pods = Vec::new();
    for s in slices.items {
        let Some(number) = s
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.clone().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
        else {
            continue;
        };
        let Ok(number) = u16::try_from(number) else {
            continue;
        };
        for e in &s.endpoints {
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<std::net::IpAddr>() {
                    pods.push(SocketAddr::new(ip, number));
                }
            }
        }
    }
    pods.sort();
    pods.dedup();
    Ok(pods)
}

/// One probe of `pod` for `host` (module doc), within [`PROBE_TIMEOUT`].
pub async fn probe(pod: SocketAddr, host: &str, hash: &str) -> Outcome {
    match tokio::time::timeout(PROBE_TIMEOUT, send_probe(pod, host)).await {
        Err(_) => Outcome::Failed(format!("no answer within {PROBE_TIMEOUT:?}")),
        Ok(Err(e)) => Outcome::Failed(e),
        Ok(Ok((200, got))) if got.as_deref() == Some(hash) => Outcome::Ok,
        Ok(Ok((200, got))) => Outcome::OldHash(got.unwrap_or_default()),
        Ok(Ok((status, _))) => Outcome::Status(status),
    }
}

async fn send_probe(pod: SocketAddr, host: &str) -> Result<(u16, Option<String>), String> {
    let stream = tokio::net::TcpStream::connect(pod)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // The connection ends with this function (the timeout drops it).
    let conn = tokio::spawn(conn);
    let req = http::Request::get(PROBE_PATH)
        .header(http::header::HOST, host)
        .header(h::NETWORK_PROBE, h::PROBE_VALUE)
        .header(h::NETWORK_HASH, h::HASH_VALUE_OVERRIDE)
        .header(http::header::USER_AGENT, h::INGRESS_PROBE_USER_AGENT)
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("bad probe request: {e}"))?;
    let resp = send.send_request(req).await;
    conn.abort();
    let resp = resp.map_err(|e| format!("no answer: {e}"))?;
    let hash = resp
        .headers()
        .get(h::NETWORK_HASH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((resp.status().as_u16(), hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_service_host_names_its_namespace_and_name() {
        assert_eq!(
            service_of("knative-local-gateway.istio-system.svc.cluster.local"),
            Some(("istio-system", "knative-local-gateway"))
        );
        assert_eq!(service_of("gw.ns"), Some(("ns", "gw")));
        assert_eq!(service_of("gw"), None);
        assert_eq!(service_of(".ns"), None);
    }

    #[tokio::test]
    async fn a_closed_port_is_a_failed_probe() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert!(matches!(probe(addr, "h", "x").await, Outcome::Failed(_)));
    }
}
