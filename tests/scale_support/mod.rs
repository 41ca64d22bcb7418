//! The rig of the whole-stack scale benchmark (`tests/stack_scale.rs`): each `thaw` role as a
//! real child process reaching the in-process API server through its own counting proxy
//! ([`CountingProxy`]: every request by Kubernetes verb and resource, as the API server's
//! `apiserver_request_total` counts them), the test's Deployment controller, kubelet and
//! endpoints controller for thousands of revisions without a process per pod ([`Kubelet`]),
//! and what `/proc` says of each process ([`ProcStats`]).
//!
//! The pods are API objects only: each gets its own loopback address (127.A.b.c, Linux routes
//! all of 127/8 to `lo`) and one shared [`PodServer`], bound on every address, answers for
//! all of them as their queue sidecars would: pod stats (nothing in flight) on
//! `http-autometric`, the activator's `K-Network-Probe: queue` on `http`.

#![allow(
    dead_code,
    reason = "the benchmark reads only part of what the rig records"
)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio::net::TcpListener;
use tracing::Instrument;

// ------------------------------------------------------------------------------------------
// Counting proxy

/// Requests by (verb, resource): Kubernetes' verbs (`get`, `list`, `watch`, `create`,
/// `update`, `patch`, `apply` for a server-side apply, `delete`) and the resource with its
/// group and subresource (`services` of the core group, `deployments.apps/scale`,
/// `revisions.serving.knative.dev/status`).
pub type CallCounts = BTreeMap<(String, String), u64>;

/// The verbs that write.
pub const WRITE_VERBS: &[&str] = &["create", "update", "patch", "apply", "delete"];

/// An HTTP/1.1 proxy in front of the API server that counts every request by verb and
/// resource and records the `User-Agent`s it saw. Each role gets its own, so its counts are
/// that role's. Responses (watches included) stream through as they come.
pub struct CountingProxy {
    addr: SocketAddr,
    counts: Arc<Mutex<CallCounts>>,
    agents: Arc<Mutex<BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Kubernetes' verb and resource of a request (`GET /apis/apps/v1/.../deployments?watch=true`
/// is `watch` `deployments.apps`; `PATCH .../deployments/d/scale` is `patch`
/// `deployments.apps/scale`).
pub fn classify(method: &http::Method, uri: &http::Uri, content_type: &str) -> (String, String) {
    let path = uri.path();
    let query = uri.query().unwrap_or("");
    // The group, for `/apis/{group}/{version}/...` (`services.serving.knative.dev` is not the
    // core `services`).
    let mut group = None;
    let rest: Vec<&str> = if let Some(r) = path.strip_prefix("/api/v1") {
        r.split('/').filter(|s| !s.is_empty()).collect()
    } else if let Some(r) = path.strip_prefix("/apis/") {
        let parts: Vec<&str> = r.split('/').filter(|s| !s.is_empty()).collect();
        group = parts.first().copied();
        parts.into_iter().skip(2).collect()
    } else {
        return (method.as_str().to_lowercase(), path.to_string());
    };
    // Namespaced: namespaces/{ns}/{resource}[/{name}[/{subresource}]].
    let rest: &[&str] = if rest.len() >= 3 && rest[0] == "namespaces" {
        &rest[2..]
    } else {
        &rest
    };
    let resource = match (rest.first(), group) {
        (Some(r), Some(g)) => format!("{r}.{g}"),
        (Some(r), None) => r.to_string(),
        (None, _) => "discovery".to_string(),
    };
    let named = rest.len() >= 2;
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource,
    };
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH if content_type.starts_with("application/apply-patch") => "apply",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => return (method.as_str().to_lowercase(), resource),
    };
    (verb.to_string(), resource)
}

impl CountingProxy {
    /// A proxy on `127.0.0.1:0` to the API server at `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts: Arc<Mutex<CallCounts>> = Arc::default();
        let agents: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let client: Client<HttpConnector, Incoming> =
            Client::builder(TokioExecutor::new()).build_http();
        let (c, a) = (counts.clone(), agents.clone());
        let task = tokio::spawn(
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (client, counts, agents) = (client.clone(), c.clone(), a.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |mut req: http::Request<Incoming>| {
                            let (client, counts, agents) =
                                (client.clone(), counts.clone(), agents.clone());
                            async move {
                                let ct = req
                                    .headers()
                                    .get(http::header::CONTENT_TYPE)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("");
                                let key = classify(req.method(), req.uri(), ct);
                                *counts.lock().unwrap().entry(key).or_default() += 1;
                                let agent = req
                                    .headers()
                                    .get(http::header::USER_AGENT)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("-")
                                    .to_string();
                                *agents.lock().unwrap().entry(agent).or_default() += 1;
                                let pq = req
                                    .uri()
                                    .path_and_query()
                                    .map_or("/", |p| p.as_str())
                                    .to_string();
                                *req.uri_mut() = format!("http://{upstream}{pq}").parse().unwrap();
                                match client.request(req).await {
                                    Ok(resp) => Ok::<_, Infallible>(resp.map(Either::Upstream)),
                                    Err(e) => {
                                        let mut r = http::Response::new(Either::Here(Full::new(
                                            Bytes::from(format!("proxy: {e}")),
                                        )));
                                        *r.status_mut() = http::StatusCode::BAD_GATEWAY;
                                        Ok(r)
                                    }
                                }
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
            .instrument(tracing::info_span!("counting_proxy")),
        );
        Self {
            addr,
            counts,
            agents,
            task,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests so far by (verb, resource).
    pub fn counts(&self) -> CallCounts {
        self.counts.lock().unwrap().clone()
    }

    /// Requests so far by `User-Agent`.
    pub fn agents(&self) -> BTreeMap<String, u64> {
        self.agents.lock().unwrap().clone()
    }
}

/// The upstream's body or the proxy's own answer.
enum Either {
    Upstream(Incoming),
    Here(Full<Bytes>),
}

impl hyper::body::Body for Either {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Either::Upstream(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
            Either::Here(b) => std::pin::Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Either::Upstream(b) => b.is_end_stream(),
            Either::Here(b) => b.is_end_stream(),
        }
    }
}

/// `after - before`, per key (keys with no change left out).
pub fn diff(before: &CallCounts, after: &CallCounts) -> CallCounts {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Sum of `counts` by verb.
pub fn by_verb(counts: &CallCounts) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((verb, _), n) in counts {
        *out.entry(verb.clone()).or_default() += n;
    }
    out
}

/// The resource of leader election's renewals: written each retry period by every leader
/// (and each try by every candidate), so never part of "no write without a change".
pub const LEASES: &str = "leases.coordination.k8s.io";

/// Writes in `counts`, Lease renewals left out ([`lease_writes`]).
pub fn writes(counts: &CallCounts) -> u64 {
    counts
        .iter()
        .filter(|((v, r), _)| WRITE_VERBS.contains(&v.as_str()) && r != LEASES)
        .map(|(_, n)| n)
        .sum()
}

/// Writes of Leases in `counts`.
pub fn lease_writes(counts: &CallCounts) -> u64 {
    counts
        .iter()
        .filter(|((v, r), _)| WRITE_VERBS.contains(&v.as_str()) && r == LEASES)
        .map(|(_, n)| n)
        .sum()
}

/// `counts` as `verb resource n` lines, writes first.
pub fn render(counts: &CallCounts) -> String {
    let mut lines: Vec<(bool, String)> = counts
        .iter()
        .map(|((v, r), n)| {
            (
                !WRITE_VERBS.contains(&v.as_str()),
                format!("      {v:<7} {r:<48} {n}"),
            )
        })
        .collect();
    lines.sort();
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------------------------------------------------
// Processes

/// CPU seconds (user + system) of process `pid` so far; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 (1-based) of the whole line: 12 and 13 after ")".
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / clock_ticks()
}

fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// A field of `/proc/<pid>/status` in MiB (`VmRSS`, `VmHWM`); 0 once the process is gone.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0.0;
    };
    status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What `/proc` says of a process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStats {
    pub cpu: f64,
    pub rss_mib: f64,
    pub hwm_mib: f64,
}

impl ProcStats {
    pub fn of(pid: u32) -> Self {
        Self {
            cpu: cpu_seconds(pid),
            rss_mib: status_mib(pid, "VmRSS"),
            hwm_mib: status_mib(pid, "VmHWM"),
        }
    }
}

/// A `thaw` role process with its own counting proxy and kubeconfig; killed when dropped.
pub struct RoleProc {
    pub name: String,
    pub admin: SocketAddr,
    pub proxy: CountingProxy,
    pub log: PathBuf,
    child: Mutex<Option<Child>>,
    /// The process's last figures, kept when it exits (a SIGTERMed leader).
    pub last: Mutex<ProcStats>,
}

impl Drop for RoleProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl RoleProc {
    /// Starts `thaw <args>` as `name` (its `POD_NAME`), reaching `api` through a new
    /// [`CountingProxy`]; its log goes to `dir/name.log`.
    pub async fn start(
        api: SocketAddr,
        dir: &Path,
        name: &str,
        admin: SocketAddr,
        args: &[String],
        system: &str,
    ) -> Self {
        let proxy = CountingProxy::start(api).await;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        crate::kube_support::write_kubeconfig(&kubeconfig, proxy.addr(), system);
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_thaw"))
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .env("POD_NAME", name)
            .env_remove("POD_IP")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self {
            name: name.into(),
            admin,
            proxy,
            log,
            child: Mutex::new(Some(child)),
            last: Mutex::default(),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// The process's figures now (its last ones once it exited).
    pub fn stats(&self) -> ProcStats {
        let mut c = self.child.lock().unwrap();
        if let Some(child) = c.as_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                *c = None;
            } else {
                let s = ProcStats::of(child.id());
                // Read while it ran: a process that just exited reads as zeros.
                if s.hwm_mib > 0.0 {
                    *self.last.lock().unwrap() = s;
                }
            }
        }
        *self.last.lock().unwrap()
    }

    pub fn sigterm(&self) {
        self.stats();
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// Whether the process has exited (reaped).
    pub fn exited(&self) -> bool {
        let mut c = self.child.lock().unwrap();
        match c.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => false,
            _ => {
                *c = None;
                true
            }
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log.
    pub fn tail(&self, n: usize) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub async fn get(&self, path: &str) -> String {
        get_text(self.admin, path).await
    }
}

/// The body of `GET http://{addr}{path}` (empty on any error).
pub async fn get_text(addr: SocketAddr, path: &str) -> String {
    let c: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(Empty::new())
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(10), c.request(req)).await {
        Ok(Ok(r)) => match r.into_body().collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            Err(_) => String::new(),
        },
        _ => String::new(),
    }
}

/// The sum of a metric's samples whose line starts with `name` and contains every `needle`.
pub fn metric(text: &str, name: &str, needles: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ------------------------------------------------------------------------------------------
// The pods' shared server

/// Answers for every pod as its queue sidecar would: `GET /stats` the pod's stats with
/// nothing in flight, `K-Network-Probe: queue` with `queue`, anything else 200. Bound on
/// `0.0.0.0` so every pod address reaches it on one port.
pub struct PodServer {
    pub port: u16,
    /// Pod address -> pod name (what `/stats` names).
    pub names: Arc<DashMap<IpAddr, String>>,
    pub pulls: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PodServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodServer {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let names: Arc<DashMap<IpAddr, String>> = Arc::default();
        let pulls = Arc::new(AtomicU64::new(0));
        let (n, p) = (names.clone(), pulls.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let local = stream.local_addr().map(|a| a.ip()).ok();
                let (names, pulls) = (n.clone(), p.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<Incoming>| {
                        let pod = local
                            .and_then(|ip| names.get(&ip).map(|n| n.clone()))
                            .unwrap_or_default();
                        let probe = req
                            .headers()
                            .get("k-network-probe")
                            .is_some_and(|v| v == "queue");
                        let body = if probe {
                            "queue".to_string()
                        } else if req.uri().path() == thaw::stats::POD_STATS_PATH {
                            pulls.fetch_add(1, Ordering::Relaxed);
                            serde_json::to_string(&thaw::stats::PodStats {
                                pod,
                                ..Default::default()
                            })
                            .unwrap()
                        } else {
                            "hello".to_string()
                        };
                        async move {
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(body))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            port,
            names,
            pulls,
            task,
        }
    }
}

// ------------------------------------------------------------------------------------------
// The kubelet, the Deployment controller and the endpoints controller

/// What the test's Kubernetes did for one Deployment.
#[derive(Debug, Default)]
struct DeploymentState {
    /// The Deployment's one ReplicaSet's UID, once made.
    rs_uid: Option<String>,
    /// Its pods: name and address, oldest first.
    pods: Vec<(String, Ipv4Addr)>,
    /// Whether the private Service's slice exists.
    slice: bool,
}

/// The test's Deployment controller, kubelet and endpoints controller, as one reconciler of
/// Deployments (kube-runtime's `Controller`): for each Deployment of a revision (labelled
/// `serving.knative.dev/revision`), one ReplicaSet (controlled by it), `spec.replicas` pods
/// (controlled by the ReplicaSet, at once `Running` and ready at their own address), the
/// private Service's EndpointSlice listing them (ports `http` and `http-autometric` on the
/// [`PodServer`]), and the Deployment's status. Scaled down, the newest pods go (deleted at
/// once, as with no grace period) and leave the slice first.
pub struct Kubelet {
    pub pods_alive: Arc<AtomicI64>,
    pub pods_made: Arc<AtomicU64>,
    /// API writes the test's Kubernetes made (ReplicaSets, pods and their status, slices,
    /// Deployment status).
    pub writes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct KubeletCtx {
    client: kube::Client,
    state: DashMap<(String, String), DeploymentState>,
    /// The second octet of every pod address (127.A.b.c).
    net: u8,
    next_pod: AtomicU32,
    pod_port: u16,
    names: Arc<DashMap<IpAddr, String>>,
    pods_alive: Arc<AtomicI64>,
    pods_made: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
}

const REVISION_LABEL: &str = "serving.knative.dev/revision";

impl Kubelet {
    /// Starts it over every namespace; pods at 127.`net`.b.c, served by `pods`.
    pub fn start(client: kube::Client, net: u8, pods: &PodServer, concurrency: u16) -> Self {
        let pods_alive = Arc::new(AtomicI64::new(0));
        let pods_made = Arc::new(AtomicU64::new(0));
        let writes = Arc::new(AtomicU64::new(0));
        let ctx = Arc::new(KubeletCtx {
            client: client.clone(),
            state: DashMap::new(),
            net,
            next_pod: AtomicU32::new(0),
            pod_port: pods.port,
            names: pods.names.clone(),
            pods_alive: pods_alive.clone(),
            pods_made: pods_made.clone(),
            writes: writes.clone(),
        });
        let api: Api<Deployment> = Api::all(client);
        let task = tokio::spawn(
            Controller::new(api, watcher::Config::default().labels(REVISION_LABEL))
                .with_config(controller::Config::default().concurrency(concurrency))
                .run(reconcile, error_policy, ctx)
                .for_each(|_| async {})
                .instrument(tracing::info_span!("test_kubelet")),
        );
        Self {
            pods_alive,
            pods_made,
            writes,
            task,
        }
    }
}

fn error_policy(_d: Arc<Deployment>, e: &kube::Error, _ctx: Arc<KubeletCtx>) -> Action {
    tracing::warn!(error = %e, "test kubelet: retrying");
    Action::requeue(Duration::from_secs(1))
}

impl KubeletCtx {
    /// A new pod's number and address.
    fn next_pod(&self) -> (u32, Ipv4Addr) {
        let n = self.next_pod.fetch_add(1, Ordering::Relaxed);
        (
            n,
            Ipv4Addr::new(127, self.net, (1 + n / 254) as u8, (1 + n % 254) as u8),
        )
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<KubeletCtx>) -> Result<Action, kube::Error> {
    let ns = d.namespace().unwrap_or_default();
    let name = d.name_any();
    let Some(spec) = d.spec.as_ref() else {
        return Ok(Action::await_change());
    };
    let Some(revision) = d.labels().get(REVISION_LABEL).cloned() else {
        return Ok(Action::await_change());
    };
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    let key = (ns.clone(), name.clone());
    let (mut rs_uid, mut pods, mut slice) = {
        let s = ctx.state.entry(key.clone()).or_default();
        (s.rs_uid.clone(), s.pods.clone(), s.slice)
    };
    let client = &ctx.client;
    let pp = PostParams::default();
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let slice_name = format!("{revision}-private-scale");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    let podapi: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let result = async {
        if want > pods.len() && rs_uid.is_none() {
            let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
            let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": format!("{name}-rs"),
                    "labels": template_labels,
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                        "uid": d.meta().uid, "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {"selector": spec.selector, "template": spec.template},
            }))
            .unwrap();
            let made = match rss.create(&pp, &rs).await {
                Ok(rs) => rs,
                Err(kube::Error::Api(e)) if e.code == 409 => rss.get(&format!("{name}-rs")).await?,
                Err(e) => return Err(e),
            };
            ctx.wrote();
            rs_uid = made.metadata.uid;
        }
        let mut changed = false;
        while pods.len() < want {
            let (n, ip) = ctx.next_pod();
            let pod_name = format!("{name}-{n:05}");
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": pod_name,
                    "labels": template_labels,
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
                        "uid": rs_uid, "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": spec.template.spec,
            }))
            .unwrap();
            podapi.create(&pp, &pod).await?;
            ctx.wrote();
            let containers: Vec<serde_json::Value> = spec
                .template
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .map(|c| {
                    serde_json::json!({"name": c.name, "ready": true, "restartCount": 0,
                        "image": c.image, "imageID": "", "started": true,
                        "state": {"running": {}}})
                })
                .collect();
            podapi
                .patch_status(
                    &pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": {
                        "phase": "Running", "podIP": ip.to_string(),
                        "podIPs": [{"ip": ip.to_string()}],
                        "conditions": [{"type": "Ready", "status": "True"},
                            {"type": "ContainersReady", "status": "True"},
                            {"type": "PodScheduled", "status": "True"}],
                        "containerStatuses": containers}})),
                )
                .await?;
            ctx.wrote();
            ctx.names.insert(IpAddr::V4(ip), pod_name.clone());
            ctx.pods_alive.fetch_add(1, Ordering::Relaxed);
            ctx.pods_made.fetch_add(1, Ordering::Relaxed);
            pods.push((pod_name, ip));
            changed = true;
        }
        let mut gone = Vec::new();
        while pods.len() > want {
            gone.push(pods.pop().unwrap());
            changed = true;
        }
        if changed || !slice {
            let endpoints: Vec<serde_json::Value> = pods
                .iter()
                .map(|(p, ip)| {
                    serde_json::json!({"addresses": [ip.to_string()],
                        "conditions": {"ready": true, "serving": true, "terminating": false},
                        "targetRef": {"kind": "Pod", "name": p, "namespace": ns}})
                })
                .collect();
            let port = ctx.pod_port;
            let body = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": slice_name, "labels": {
                    "kubernetes.io/service-name": format!("{revision}-private"),
                    REVISION_LABEL: revision,
                    "networking.internal.knative.dev/serviceType": "Private",
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": port, "protocol": "TCP"},
                    {"name": thaw::stats::POD_STATS_PORT_NAME, "port": port, "protocol": "TCP"}],
                "endpoints": endpoints,
            });
            if slice {
                slices
                    .patch(
                        &slice_name,
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"endpoints": body["endpoints"]})),
                    )
                    .await?;
            } else {
                let s: EndpointSlice = serde_json::from_value(body).unwrap();
                match slices.create(&pp, &s).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        slices.replace(&slice_name, &pp, &s).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            ctx.wrote();
            slice = true;
        }
        for (p, ip) in &gone {
            match podapi.delete(p, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
            ctx.wrote();
            ctx.names.remove(&IpAddr::V4(*ip));
            ctx.pods_alive.fetch_sub(1, Ordering::Relaxed);
        }
        let n = want as i32;
        let generation = d.metadata.generation;
        let done = d.status.as_ref().is_some_and(|s| {
            s.observed_generation == generation
                && s.replicas.unwrap_or(0) == n
                && s.ready_replicas.unwrap_or(0) == n
                && s.available_replicas.unwrap_or(0) == n
                && s.updated_replicas.unwrap_or(0) == n
                && s.conditions.as_ref().is_some_and(|c| !c.is_empty())
        });
        if !done {
            let deps: Api<Deployment> = Api::namespaced(client.clone(), &ns);
            deps.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {
                "observedGeneration": generation,
                "replicas": n, "readyReplicas": n, "availableReplicas": n,
                "updatedReplicas": n,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
                ]}})),
            )
            .await?;
            ctx.wrote();
        }
        Ok(())
    }
    .await;
    // Keep what was done, even when a later step failed (the retry continues from there).
    if let Some(mut s) = ctx.state.get_mut(&key) {
        s.rs_uid = rs_uid;
        s.pods = pods;
        s.slice = slice;
    }
    result.map(|()| Action::await_change())
}
