//! The ingress gateway, as Envoy under Istio would route: every [`REFRESH`] it reads the
//! VirtualServices bound to [`EXTERNAL_GATEWAY`] (the Route reconciler's `<route>-ingress`)
//! and, for each destination `{service}.{namespace}.svc.cluster.local:{port}`, the Service's
//! port of that number and the ready endpoints of that port name in its EndpointSlices (EDS).
//! A request for a host takes the first HTTP route whose match holds (authority on this
//! gateway), a destination by weight, the headers the route and the destination set, and
//! goes to one of the destination's endpoints (round robin) with the host as `Host`.
//!
//! Retries follow Istio's default policy when the route sets none (2 more attempts): only on
//! a failure to connect, the one Istio retry condition an HTTP/1 client can tell apart
//! (`connect-failure`), each on the next endpoint. No endpoint: 503 `no healthy upstream`,
//! as Envoy answers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use thaw::controller::route::virtual_service::{HttpRoute, VirtualService};

use crate::kube_support::gateway::string_match;
use tokio::task::JoinHandle;

use super::EXTERNAL_GATEWAY;
use super::cluster::service_endpoints;

/// How often the routes and endpoints are read again.
pub const REFRESH: Duration = Duration::from_millis(100);
/// Istio's default number of retries when a route sets no retry policy.
pub const DEFAULT_RETRIES: u32 = 2;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client that keeps its connections alive (one per endpoint, reused).
pub fn keepalive_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client that opens a fresh connection for every request.
pub fn fresh_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

/// What the ingress knows, replaced whole at each refresh.
#[derive(Debug, Default, Clone)]
struct Table {
    services: Vec<VirtualService>,
    /// (namespace, service, port number) -> ready endpoints.
    endpoints: BTreeMap<(String, String, u32), Vec<SocketAddr>>,
}

/// Where one request goes.
struct Routed {
    route: HttpRoute,
    endpoints: Vec<SocketAddr>,
    headers: Vec<(String, String)>,
}

/// An answer through the ingress.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// The endpoint that answered (an activator or a pod's sidecar).
    pub endpoint: SocketAddr,
}

pub struct Ingress {
    table: Arc<Mutex<Table>>,
    next: AtomicUsize,
    task: JoinHandle<()>,
}

impl Drop for Ingress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Ingress {
    /// Starts following the VirtualServices and the endpoints through `client`.
    pub fn start(client: kube::Client) -> Self {
        let table = Arc::new(Mutex::new(Table::default()));
        let t = table.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(new) = read_table(&client).await {
                    *t.lock().unwrap() = new;
                }
                tokio::time::sleep(REFRESH).await;
            }
        });
        Self {
            table,
            next: AtomicUsize::new(0),
            task,
        }
    }

    /// Where a request for `host` goes now: its route, the endpoints of the destination
    /// picked by weight, and the request headers set.
    fn route(&self, host: &str) -> Result<Routed, String> {
        let table = self.table.lock().unwrap().clone();
        let route = table
            .services
            .iter()
            .filter(|vs| vs.spec.gateways.iter().any(|g| g == EXTERNAL_GATEWAY))
            .flat_map(|vs| vs.spec.http.iter())
            .find(|r| {
                r.match_.iter().any(|m| {
                    (m.gateways.is_empty() || m.gateways.iter().any(|g| g == EXTERNAL_GATEWAY))
                        && m.authority.as_ref().is_none_or(|a| string_match(a, host))
                })
            })
            .cloned()
            .ok_or_else(|| format!("404: no route for {host} on {EXTERNAL_GATEWAY}"))?;
        let total: i32 = route.route.iter().map(|d| d.weight.unwrap_or(0)).sum();
        let mut pick = if total > 0 {
            rand::random::<u32>() as i32 % total
        } else {
            0
        };
        let dest = route
            .route
            .iter()
            .find(|d| {
                let w = d.weight.unwrap_or(0);
                if pick < w {
                    return true;
                }
                pick -= w;
                false
            })
            .or(route.route.first())
            .cloned()
            .ok_or_else(|| format!("503: the route for {host} has no destination"))?;
        let (svc, ns) = parse_host(&dest.destination.host).ok_or_else(|| {
            format!(
                "503: destination host {} is not a Service",
                dest.destination.host
            )
        })?;
        let port = dest.destination.port.as_ref().map_or(80, |p| p.number);
        let endpoints = table
            .endpoints
            .get(&(ns.to_string(), svc.to_string(), port))
            .cloned()
            .unwrap_or_default();
        let mut headers = Vec::new();
        for ops in [
            route.headers.as_ref().and_then(|h| h.request.as_ref()),
            dest.headers.as_ref().and_then(|h| h.request.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            for r in &ops.remove {
                headers.retain(|(n, _): &(String, String)| !n.eq_ignore_ascii_case(r));
            }
            for (n, v) in &ops.set {
                headers.retain(|(h, _): &(String, String)| !h.eq_ignore_ascii_case(n));
                headers.push((n.clone(), v.clone()));
            }
            for (n, v) in &ops.add {
                headers.push((n.clone(), v.clone()));
            }
        }
        Ok(Routed {
            route,
            endpoints,
            headers,
        })
    }

    /// The endpoints `host` would be sent to now.
    pub fn endpoints(&self, host: &str) -> Vec<SocketAddr> {
        self.route(host).map(|r| r.endpoints).unwrap_or_default()
    }

    /// GET `path` on `host` through `client`: the status and body, or what went wrong.
    pub async fn get(&self, client: &HttpClient, host: &str, path: &str) -> Result<Reply, String> {
        let Routed {
            route,
            endpoints,
            headers,
        } = self.route(host)?;
        if endpoints.is_empty() {
            return Err("503: no healthy upstream".into());
        }
        let timeout = route
            .timeout
            .as_deref()
            .and_then(|t| t.strip_suffix('s')?.parse::<f64>().ok())
            .map_or(Duration::from_secs(15), Duration::from_secs_f64);
        let retries = route
            .retries
            .as_ref()
            .map_or(DEFAULT_RETRIES, |r| r.attempts.max(0) as u32);
        let mut last = String::new();
        for _ in 0..=retries {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let endpoint = endpoints[i % endpoints.len()];
            let mut req =
                http::Request::get(format!("http://{endpoint}{path}")).header("host", host);
            for (n, v) in &headers {
                req = req.header(n.as_str(), v.as_str());
            }
            let req = req.body(Full::new(Bytes::new())).unwrap();
            let sent = tokio::time::timeout(timeout, async {
                let resp = client.request(req).await?;
                let status = resp.status().as_u16();
                let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                Ok::<_, hyper_util::client::legacy::Error>((status, body))
            })
            .await;
            match sent {
                Err(_) => return Err(format!("504: upstream request timeout ({endpoint})")),
                Ok(Ok((status, Ok(body)))) => {
                    return Ok(Reply {
                        status,
                        body: String::from_utf8_lossy(&body).into_owned(),
                        endpoint,
                    });
                }
                Ok(Ok((status, Err(e)))) => {
                    return Err(format!(
                        "{status} from {endpoint}, then the body failed: {e}"
                    ));
                }
                Ok(Err(e)) if e.is_connect() => {
                    last = format!("connect-failure to {endpoint}: {e:?}");
                }
                Ok(Err(e)) => return Err(format!("{endpoint}: {e:?}")),
            }
        }
        Err(format!("503: retries exhausted; last: {last}"))
    }
}

/// `{service}.{namespace}.svc.cluster.local` (or `.svc`).
fn parse_host(host: &str) -> Option<(&str, &str)> {
    let rest = host
        .strip_suffix(".svc.cluster.local")
        .or_else(|| host.strip_suffix(".svc"))?;
    rest.split_once('.')
}

/// The VirtualServices and each destination's endpoints; `None` when the server did not
/// answer (the last table stays, as Envoy keeps its last configuration).
async fn read_table(client: &kube::Client) -> Option<Table> {
    let vs_api: Api<VirtualService> = Api::all(client.clone());
    let services = vs_api.list(&Default::default()).await.ok()?.items;
    let mut endpoints = BTreeMap::new();
    for vs in &services {
        for d in vs.spec.http.iter().flat_map(|r| r.route.iter()) {
            let Some((svc, ns)) = parse_host(&d.destination.host) else {
                continue;
            };
            let number = d.destination.port.as_ref().map_or(80, |p| p.number);
            let key = (ns.to_string(), svc.to_string(), number);
            if endpoints.contains_key(&key) {
                continue;
            }
            let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
            let Ok(Some(s)) = svcs.get_opt(svc).await else {
                endpoints.insert(key, Vec::new());
                continue;
            };
            let port_name = s
                .spec
                .iter()
                .flat_map(|sp| sp.ports.iter().flatten())
                .find(|p| p.port as u32 == number)
                .and_then(|p| p.name.clone())
                .unwrap_or_default();
            let addrs = service_endpoints(client, ns, &s.name_any(), &port_name).await;
            endpoints.insert(key, addrs);
        }
    }
    Some(Table {
        services,
        endpoints,
    })
}
