//! What the serving cases send and read besides [`super::checks`]: a request whose reply keeps
//! its headers (`Server-Timing`), the route the ingress gateway takes for a host, `kubectl
//! get`'s tables read by their columns, a counter summed over the activators' `/metrics`, and
//! the status writes of thaw's roles in the API server's audit log.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use thaw::controller::route::virtual_service::{HttpRoute, VirtualService};

use super::Plane;

/// How long one request may take, a cold start's hold included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// An answer: its status, headers and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Reply {
    /// Every `Server-Timing` value, joined by `, ` (empty when none).
    pub fn server_timing(&self) -> String {
        self.headers
            .get_all("server-timing")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// GET `path` from `to` with `Host: host` and `headers`, on a connection of its own; fails
/// after [`REQUEST_TIMEOUT`].
pub async fn request(
    to: SocketAddr,
    host: &str,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<Reply, String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = http::Request::get(format!("http://{to}{path}"))
        .body(Empty::new())
        .unwrap();
    *req.headers_mut() = headers.clone();
    req.headers_mut().insert(
        http::header::HOST,
        host.parse().map_err(|e| format!("{e}"))?,
    );
    let what = format!("GET http://{host}{path} via {to}");
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, client.request(req))
        .await
        .map_err(|_| format!("{what}: no answer in {REQUEST_TIMEOUT:?}"))?
        .map_err(|e| format!("{what}: {e}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{what}: the body: {e}"))?
        .to_bytes();
    Ok(Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The route the external gateway (config-istio's default) takes for a request to `host`
/// carrying no header but `Host`: the first HTTP route of the VirtualServices in `ns` one of
/// whose matches holds, as Envoy picks it.
pub async fn external_route(plane: &Plane, ns: &str, host: &str) -> Result<HttpRoute, String> {
    let istio = thaw::config::network::IstioConfig::default();
    let gateways: Vec<String> = istio
        .external_gateways
        .iter()
        .map(|g| g.reference())
        .collect();
    let ours = |gws: &[String]| gws.iter().any(|g| gateways.contains(g));
    let vss: Api<VirtualService> = Api::namespaced(plane.admin.clone(), ns);
    let vss = vss
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list VirtualServices: {e}"))?
        .items;
    vss.iter()
        .filter(|vs| ours(&vs.spec.gateways))
        .flat_map(|vs| vs.spec.http.iter())
        .find(|r| {
            r.match_.iter().any(|m| {
                (m.gateways.is_empty() || ours(&m.gateways))
                    && m.headers.is_empty()
                    && m.authority
                        .as_ref()
                        .is_none_or(|a| crate::gateway::string_match(a, host))
            })
        })
        .cloned()
        .ok_or_else(|| format!("no route for {host} on {gateways:?} in {ns}'s VirtualServices"))
}

/// One table of `kubectl get`'s output: its column names (upper case, as printed) and each
/// row's cells by column name (empty where kubectl printed nothing).
#[derive(Debug, Clone)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<BTreeMap<String, String>>,
}

/// The tables of `kubectl get a,b,c` (one per kind, separated by blank lines), each cell read
/// at its column's offset in the header (kubectl's tabwriter aligns every cell there), so an
/// empty cell reads as empty instead of shifting the next ones.
pub fn tables(out: &str) -> Vec<Table> {
    let mut tables = Vec::new();
    for block in out.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(header) = lines.next() else {
            continue;
        };
        // Columns are at least three spaces apart; a name has at most single spaces.
        let mut starts = Vec::new();
        let mut columns = Vec::new();
        let mut i = 0;
        let bytes = header.as_bytes();
        while i < bytes.len() {
            if bytes[i] == b' ' {
                i += 1;
                continue;
            }
            let start = i;
            while i < bytes.len() && !(bytes[i] == b' ' && bytes.get(i + 1) == Some(&b' ')) {
                i += 1;
            }
            starts.push(start);
            columns.push(header[start..i].trim().to_string());
        }
        let rows = lines
            .map(|l| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(n, c)| {
                        let from = starts[n].min(l.len());
                        let to = starts.get(n + 1).copied().unwrap_or(l.len()).min(l.len());
                        (c.clone(), l[from..to].trim().to_string())
                    })
                    .collect()
            })
            .collect();
        tables.push(Table { columns, rows });
    }
    tables
}

/// The sum of counter `name` (every series) over the activators' `/metrics` (each pod of
/// thaw-system's activator Deployment, at its admin port 9090).
pub async fn activators_counter(plane: &Plane, name: &str) -> Result<f64, String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(plane.admin.clone(), "thaw-system");
    let lp = ListParams::default().labels("app.kubernetes.io/name=activator");
    let mut sum = 0.0;
    for p in pods.list(&lp).await.map_err(|e| e.to_string())?.items {
        let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
            continue;
        };
        let to: SocketAddr = format!("{ip}:9090").parse().map_err(|e| format!("{e}"))?;
        let reply = request(to, &ip, "/metrics", &http::HeaderMap::new()).await?;
        sum += reply
            .body
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(sum)
}

/// A write of a status subresource by one of thaw's ServiceAccounts, from the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWrite {
    /// When the API server answered it.
    pub at: Timestamp,
    /// The ServiceAccount's name in thaw-system (`controller`, `autoscaler`).
    pub writer: String,
    /// `update` (PUT) or `patch`.
    pub verb: String,
    pub code: u16,
}

/// Every write (`update` or `patch`) of `{resource}/{name}/status` in `ns` by thaw's
/// ServiceAccounts the audit log holds, in the order the API server answered them.
pub fn status_writes(plane: &Plane, ns: &str, resource: &str, name: &str) -> Vec<StatusWrite> {
    const PREFIX: &str = "system:serviceaccount:thaw-system:";
    let text = std::fs::read_to_string(&plane.audit_log).unwrap_or_default();
    let mut writes: Vec<StatusWrite> = text
        .lines()
        .filter(|l| l.contains(name) && l.contains("\"status\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let o = &e["objectRef"];
            o["resource"] == resource
                && o["subresource"] == "status"
                && o["namespace"] == ns
                && o["name"] == name
                && (e["verb"] == "update" || e["verb"] == "patch")
        })
        .filter_map(|e| {
            Some(StatusWrite {
                at: e["stageTimestamp"].as_str()?.parse().ok()?,
                writer: e["user"]["username"]
                    .as_str()?
                    .strip_prefix(PREFIX)?
                    .to_string(),
                verb: e["verb"].as_str()?.to_string(),
                code: u16::try_from(e["responseStatus"]["code"].as_u64()?).ok()?,
            })
        })
        .collect();
    writes.sort_by_key(|w| w.at);
    writes
}
