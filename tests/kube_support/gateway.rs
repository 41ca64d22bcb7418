//! An Istio gateway pod, played on a loopback port: it follows the VirtualServices (a
//! reflector over the API server) and routes each request as Envoy would for the gateways it
//! serves: the first HTTP route one of whose matches holds (gateway, authority pattern,
//! exact header values), a destination drawn by weight (Envoy's weighted clusters: each
//! request on its own, so a 80/20 split is 80/20 over many requests), the request header
//! operations of the route and of that destination (remove, then set, then add), the route's
//! authority rewrite. Then, by [`Backend`]: forward to a fixed address (an activator or a
//! queue sidecar), to a ready endpoint of the destination's Service, or answer as a backend
//! would (`K-Network-Probe: probe` echoes `K-Network-Hash`, anything else 200). No route: 404.
//!
//! [`TestGateway::freeze`] keeps the routes as they are now (a pod that has not received
//! Istio's latest configuration: it answers probes with an old hash). [`publish`] writes the
//! gateway's Service and an EndpointSlice per pod, as Kubernetes' endpoints controller would.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use thaw::controller::route::virtual_service::{HttpRoute, StringMatch, VirtualService};

/// What the gateway sends a routed request to.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    /// Answers as the activator or a sidecar would a probe (echo the hash the route set).
    Echo,
    /// Forwards to this address (HTTP/1.1, the rewritten headers, `Host` kept).
    Forward(SocketAddr),
    /// Forwards to a ready endpoint of the chosen destination (`{service}.{namespace}.svc...`
    /// and port, read from its Service and EndpointSlices), one drawn at random per request as
    /// Envoy balances over EDS's endpoints. A destination that is an `ExternalName` Service
    /// (a Route's placeholder: `knative-local-gateway.istio-system.svc...`) is followed to
    /// the Service it names, as Envoy's DNS cluster would resolve it. When the API server
    /// cannot be read (restarting), the endpoints last read for that destination are used,
    /// as Envoy keeps its last configuration while istiod or the API is away.
    Destinations,
}

/// One gateway pod; its tasks end when it is dropped.
pub struct TestGateway {
    addr: SocketAddr,
    /// `None`: the live store; `Some`: the routes as they were at [`TestGateway::freeze`].
    frozen: Arc<Mutex<Option<Vec<Arc<VirtualService>>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Shared {
    store: Store<VirtualService>,
    frozen: Arc<Mutex<Option<Vec<Arc<VirtualService>>>>>,
    /// `namespace/name` of the Gateways this pod serves.
    gateways: Vec<String>,
    backend: Backend,
    kube: kube::Client,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    /// [`Backend::Destinations`]: the ready endpoints last read per (host, port).
    last: Mutex<BTreeMap<(String, u32), Vec<SocketAddr>>>,
}

impl TestGateway {
    /// A pod of `gateways` (`namespace/name` references) on `127.0.0.1:0`, following the
    /// VirtualServices through `client`; returns once its store has listed.
    pub async fn start(client: kube::Client, gateways: &[&str], backend: Backend) -> Self {
        Self::start_on(client, gateways, backend, ([127, 0, 0, 1], 0).into()).await
    }

    /// [`TestGateway::start`] listening on `addr` (a gateway pod's own `0.0.0.0:8080`).
    pub async fn start_on(
        client: kube::Client,
        gateways: &[&str],
        backend: Backend,
        addr: SocketAddr,
    ) -> Self {
        let (store, writer) = reflector::store::<VirtualService>();
        let watch = reflector::reflector(
            writer,
            watcher(
                Api::<VirtualService>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .for_each(|_| async {});
        let watch = tokio::spawn(watch);
        store
            .wait_until_ready()
            .await
            .expect("the VirtualService store");
        let frozen = Arc::new(Mutex::new(None));
        let shared = Arc::new(Shared {
            store,
            frozen: frozen.clone(),
            gateways: gateways.iter().map(|g| g.to_string()).collect(),
            backend,
            kube: client,
            client: Client::builder(TokioExecutor::new()).build_http(),
            last: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serve = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            frozen,
            tasks: vec![watch, serve],
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on routes as the VirtualServices are now, whatever changes.
    pub fn freeze(&self, store_now: Vec<Arc<VirtualService>>) {
        *self.frozen.lock().unwrap() = Some(store_now);
    }

    /// Follows the VirtualServices again.
    pub fn thaw(&self) {
        *self.frozen.lock().unwrap() = None;
    }
}

/// The VirtualServices in the API server now (for [`TestGateway::freeze`]).
pub async fn virtual_services_now(client: &kube::Client) -> Vec<Arc<VirtualService>> {
    Api::<VirtualService>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(Arc::new)
        .collect()
}

impl Shared {
    async fn answer(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let services = match self.frozen.lock().unwrap().clone() {
            Some(f) => f,
            None => self.store.state(),
        };
        let Some((route, dest)) = self.route(&services, &host, req.headers()) else {
            return reply(404, "no route\n", None);
        };
        let (parts, body) = req.into_parts();
        let mut headers = parts.headers.clone();
        for ops in [
            route.headers.as_ref().and_then(|h| h.request.as_ref()),
            dest.headers.as_ref().and_then(|h| h.request.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            for r in &ops.remove {
                headers.remove(r.as_str());
            }
            for (n, v) in &ops.set {
                headers.insert(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            for (n, v) in &ops.add {
                headers.append(
                    http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
        }
        if let Some(authority) = route.rewrite.as_ref().and_then(|r| r.authority.as_ref()) {
            headers.insert(http::header::HOST, authority.parse().unwrap());
        }
        match self.backend {
            Backend::Echo => {
                if headers.get("k-network-probe").is_some_and(|v| v == "probe") {
                    let hash = headers.get("k-network-hash").cloned();
                    reply(200, "", hash)
                } else {
                    reply(200, "ok\n", None)
                }
            }
            Backend::Forward(_) | Backend::Destinations => {
                let to = match self.backend {
                    Backend::Forward(to) => to,
                    _ => {
                        let port = dest.destination.port.as_ref().map_or(80, |p| p.number);
                        let pods = self.endpoints(&dest.destination.host, port).await;
                        if pods.is_empty() {
                            return reply(503, "no healthy upstream\n", None);
                        }
                        pods[rand::random_range(0..pods.len())]
                    }
                };
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let mut out = http::Request::builder()
                    .method(parts.method)
                    .uri(format!(
                        "http://{to}{}",
                        parts.uri.path_and_query().map_or("/", |p| p.as_str())
                    ))
                    .body(Full::new(body))
                    .unwrap();
                *out.headers_mut() = headers;
                match self.client.request(out).await {
                    Ok(resp) => {
                        let (p, b) = resp.into_parts();
                        let b = b.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let mut r = hyper::Response::new(Full::new(b));
                        *r.status_mut() = p.status;
                        *r.headers_mut() = p.headers;
                        r
                    }
                    Err(_) => reply(503, "upstream connect error\n", None),
                }
            }
        }
    }

    /// The route and destination for `host` and `headers` on this pod's gateways.
    fn route(
        &self,
        services: &[Arc<VirtualService>],
        host: &str,
        headers: &http::HeaderMap,
    ) -> Option<(
        HttpRoute,
        thaw::controller::route::virtual_service::HttpRouteDestination,
    )> {
        let ours = |gws: &[String]| gws.iter().any(|g| self.gateways.contains(g));
        let route = services
            .iter()
            .filter(|vs| ours(&vs.spec.gateways))
            .flat_map(|vs| vs.spec.http.iter())
            .find(|r| {
                r.match_.iter().any(|m| {
                    (m.gateways.is_empty() || ours(&m.gateways))
                        && m.authority.as_ref().is_none_or(|a| string_match(a, host))
                        && m.headers.iter().all(|(n, want)| {
                            headers
                                .get(n.as_str())
                                .and_then(|v| v.to_str().ok())
                                .is_some_and(|v| string_match(want, v))
                        })
                })
            })?
            .clone();
        let dest = draw(&route.route)?.clone();
        Some((route, dest))
    }

    /// The ready endpoints of `host`'s Service at `port`; a Service with none that is an
    /// `ExternalName` is followed (at most a few hops, as a resolver gives up on a loop).
    async fn endpoints(&self, host: &str, port: u32) -> Vec<SocketAddr> {
        let mut host = host.to_string();
        for _ in 0..4 {
            let key = (host.clone(), port);
            let pods =
                match thaw::controller::route::prober::service_pods(&self.kube, &host, port as i32)
                    .await
                {
                    Ok(pods) => {
                        self.last.lock().unwrap().insert(key, pods.clone());
                        pods
                    }
                    // The API could not be read ("cannot read Service ...", "cannot list the
                    // EndpointSlices ..."); not a Service that is gone.
                    Err(e) if e.starts_with("cannot ") => {
                        return self
                            .last
                            .lock()
                            .unwrap()
                            .get(&key)
                            .cloned()
                            .unwrap_or_default();
                    }
                    Err(_) => Vec::new(),
                };
            if !pods.is_empty() {
                return pods;
            }
            match self.external_name(&host).await {
                Some(next) => host = next,
                None => return pods,
            }
        }
        Vec::new()
    }

    /// The host an `ExternalName` Service `host` (`{name}.{namespace}.svc...`) names, if it is
    /// one; `None` for any other Service, a name that is not a Service's, or an API error.
    async fn external_name(&self, host: &str) -> Option<String> {
        let mut parts = host.split('.');
        let (name, ns) = (parts.next()?, parts.next()?);
        if parts.next() != Some("svc") {
            return None;
        }
        let svc = Api::<Service>::namespaced(self.kube.clone(), ns)
            .get_opt(name)
            .await
            .ok()??;
        let spec = svc.spec?;
        if spec.type_.as_deref() != Some("ExternalName") {
            return None;
        }
        spec.external_name
            .map(|n| n.trim_end_matches('.').to_string())
    }
}

fn weight(d: &thaw::controller::route::virtual_service::HttpRouteDestination) -> u64 {
    u64::try_from(d.weight.unwrap_or(0)).unwrap_or(0)
}

/// A destination drawn with probability weight / total (Envoy's weighted clusters); with no
/// weight anywhere, the first.
fn draw(
    destinations: &[thaw::controller::route::virtual_service::HttpRouteDestination],
) -> Option<&thaw::controller::route::virtual_service::HttpRouteDestination> {
    let total: u64 = destinations.iter().map(weight).sum();
    if total == 0 {
        return destinations.first();
    }
    let mut at = rand::random_range(0..total);
    destinations.iter().find(|d| {
        let w = weight(d);
        if at < w {
            true
        } else {
            at -= w;
            false
        }
    })
}

fn reply(
    status: u16,
    body: &'static str,
    hash: Option<http::HeaderValue>,
) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
    if let Some(h) = hash {
        r.headers_mut().insert("k-network-hash", h);
    }
    r
}

/// Whether `s` satisfies Istio's `StringMatch` as Envoy checks it.
pub fn string_match(m: &StringMatch, s: &str) -> bool {
    if let Some(e) = &m.exact {
        return s == e;
    }
    if let Some(p) = &m.prefix {
        return s.starts_with(p.as_str());
    }
    if let Some(r) = &m.regex {
        // Envoy matches the whole value (RE2 safe_regex).
        return compiled(r).is_some_and(|re| re.is_match(s));
    }
    true
}

/// The whole-value regex of a `StringMatch`, compiled once: a gateway in front of thousands of
/// routes matches every request against each route's authority, as Envoy does against its
/// compiled configuration, and compiling each time made the gateway the slowest part of a
/// whole-stack run. `None` for a pattern that does not compile (it matches nothing). Bounded:
/// past `REGEX_CACHE` patterns it starts again.
fn compiled(pattern: &str) -> Option<Arc<regex::Regex>> {
    const REGEX_CACHE: usize = 100_000;
    static CACHE: std::sync::LazyLock<
        Mutex<std::collections::HashMap<String, Option<Arc<regex::Regex>>>>,
    > = std::sync::LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap();
    if let Some(re) = cache.get(pattern) {
        return re.clone();
    }
    if cache.len() >= REGEX_CACHE {
        cache.clear();
    }
    let re = regex::Regex::new(&format!("^(?:{pattern})$"))
        .ok()
        .map(Arc::new);
    cache.insert(pattern.to_string(), re.clone());
    re
}

/// Writes the gateway Service `host` (`{name}.{namespace}.svc...`, port 80 named `http2`)
/// and one EndpointSlice per pod (each its own port, all ready), replacing earlier ones.
pub async fn publish(client: &kube::Client, host: &str, pods: &[SocketAddr]) {
    let mut parts = host.split('.');
    let (name, ns) = (parts.next().unwrap(), parts.next().unwrap());
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    if svcs.get_opt(name).await.unwrap().is_none() {
        let svc = Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort {
                    name: Some("http2".into()),
                    port: 80,
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        };
        svcs.create(&PostParams::default(), &svc).await.unwrap();
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let lp = kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    for old in slices.list(&lp).await.unwrap().items {
        let _ = slices
            .delete(old.metadata.name.as_deref().unwrap(), &Default::default())
            .await;
    }
    for (i, pod) in pods.iter().enumerate() {
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{name}-{i}")),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/service-name".to_string(),
                    name.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec![pod.ip().to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..EndpointConditions::default()
                }),
                ..Endpoint::default()
            }],
            ports: Some(vec![EndpointPort {
                name: Some("http2".into()),
                port: Some(pod.port().into()),
                protocol: Some("TCP".into()),
                ..EndpointPort::default()
            }]),
        };
        slices.create(&PostParams::default(), &slice).await.unwrap();
    }
}

/// config-istio's default gateways (`Settings::default()`), external and local, served by one
/// pod that answers probes itself ([`Backend::Echo`]) and published as both Services: what
/// a test needs for its routes to reach `IngressReady`.
pub async fn default_gateways(client: &kube::Client) -> TestGateway {
    default_gateways_and(client, &[]).await
}

/// [`default_gateways`] whose pod also serves the Gateways `more` (`namespace/name`: a route's
/// TLS Gateways, which select the same pods).
pub async fn default_gateways_and(client: &kube::Client, more: &[&str]) -> TestGateway {
    let istio = thaw::config::network::IstioConfig::default();
    let refs: Vec<String> = istio
        .external_gateways
        .iter()
        .chain(&istio.local_gateways)
        .map(|g| g.reference())
        .chain(more.iter().map(|m| m.to_string()))
        .collect();
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let gw = TestGateway::start(client.clone(), &refs, Backend::Echo).await;
    for g in istio.external_gateways.iter().chain(&istio.local_gateways) {
        publish(client, &g.service, &[gw.addr()]).await;
    }
    gw
}
