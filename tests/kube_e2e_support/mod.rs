//! The end-to-end rig of `thaw activator` and `thaw autoscaler` on the in-process API server:
//! real `thaw` processes reaching the server through a cuttable relay (with a kubeconfig, as
//! in a cluster), the system namespace's objects, and a test kubelet and endpoints controller
//! ([`Kubelet`]) that starts real `thaw sample-app` processes when a Deployment's scale goes
//! up and writes their addresses into the revision's private EndpointSlices.
//!
//! Each "pod" is a sample app behind a counting proxy (the slice's `http` port) that records
//! the most requests it ever had in flight at once, and, when asked, a pod-stats endpoint (the
//! slice's `http-autometric` port) standing in for the queue sidecar.

#![allow(dead_code, reason = "each test uses a different part of the rig")]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use tokio::net::TcpListener;
use tokio::time::Instant;

pub mod mesh;

use crate::kube_support::TestApi;
use crate::kube_support::relay::Relay;

pub const SYSTEM: &str = "thaw-system";
pub const NS: &str = "default";
pub const TOKEN: &str = "e2e-token-0123456789abcdef";

/// A free loopback port (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The API server, the relay thaw talks through, and the system namespace's objects.
pub struct Cluster {
    pub api: TestApi,
    pub relay: Relay,
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// Starts the server and relay, writes the kubeconfig, the stats token Secret and
    /// `config-autoscaler` with `autoscaler` data.
    pub async fn start(autoscaler: serde_json::Value) -> Self {
        let c = Self::start_without_token(autoscaler).await;
        c.set_token(TOKEN).await;
        c
    }

    /// As [`Cluster::start`], without the stats token's Secret (the autoscaler leader makes it).
    pub async fn start_without_token(autoscaler: serde_json::Value) -> Self {
        let api = TestApi::start().await;
        let relay = Relay::start(api.addr()).await;
        let client = api.client();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        crate::kube_support::write_kubeconfig(&kubeconfig, relay.addr(), SYSTEM);
        let c = Self {
            api,
            relay,
            client,
            dir,
            kubeconfig,
        };
        c.config_map("config-autoscaler", autoscaler).await;
        c
    }

    /// Creates or replaces the stats token's Secret with `token`.
    pub async fn set_token(&self, token: &str) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), SYSTEM);
        let mut secret: Secret = obj(serde_json::json!({
            "metadata": {"name": "thaw-stats-token"},
            "data": {"token": base64(token)},
        }));
        match secrets.get_opt("thaw-stats-token").await.unwrap() {
            Some(old) => {
                secret.metadata.resource_version = old.metadata.resource_version;
                secrets
                    .replace("thaw-stats-token", &PostParams::default(), &secret)
                    .await
                    .unwrap();
            }
            None => {
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .unwrap();
            }
        }
    }

    /// The stats token the Secret holds now, if it exists.
    pub async fn token(&self) -> Option<String> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), SYSTEM);
        let s = secrets.get_opt("thaw-stats-token").await.unwrap()?;
        let bytes = s.data?.get("token")?.0.clone();
        String::from_utf8(bytes).ok()
    }

    /// Creates or replaces a ConfigMap in the system namespace.
    pub async fn config_map(&self, name: &str, data: serde_json::Value) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), SYSTEM);
        let cm: ConfigMap = obj(serde_json::json!({"metadata": {"name": name}, "data": data}));
        match api.get_opt(name).await.unwrap() {
            Some(old) => {
                let mut cm = cm;
                cm.metadata.resource_version = old.metadata.resource_version;
                api.replace(name, &PostParams::default(), &cm)
                    .await
                    .unwrap();
            }
            None => {
                api.create(&PostParams::default(), &cm).await.unwrap();
            }
        }
    }

    /// `activator-service`'s slices: one per activator (each listens on its own port here).
    pub async fn activator_service(&self, activators: &[SocketAddr]) {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), SYSTEM);
        for (i, a) in activators.iter().enumerate() {
            let s: EndpointSlice = obj(serde_json::json!({
                "metadata": {"name": format!("activator-service-{i}"),
                    "labels": {"kubernetes.io/service-name": "activator-service"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": a.port(), "protocol": "TCP"}],
                "endpoints": [{"addresses": [a.ip().to_string()], "conditions": {"ready": true}}],
            }));
            api.create(&PostParams::default(), &s).await.unwrap();
        }
    }

    /// Publishes config-istio's default gateway Services (external and local) with one ready
    /// endpoint per address in `peers`: the peers `thaw activator` believes by default.
    pub async fn gateways_at(&self, peers: &[std::net::IpAddr]) {
        let pods: Vec<SocketAddr> = peers.iter().map(|ip| SocketAddr::new(*ip, 80)).collect();
        let istio = thaw::config::network::IstioConfig::default();
        for g in istio.external_gateways.iter().chain(&istio.local_gateways) {
            crate::kube_support::gateway::publish(&self.client, &g.service, &pods).await;
        }
    }

    /// A Route `name` in `namespace` whose status routes `revisions` (the first at 100 %), as
    /// the Route reconciler would leave it; replaced when it exists.
    pub async fn route(&self, namespace: &str, name: &str, revisions: &[&str]) {
        let api: Api<thaw::knative::Route> = Api::namespaced(self.client.clone(), namespace);
        if api.get_opt(name).await.unwrap().is_none() {
            api.create(
                &PostParams::default(),
                &obj(serde_json::json!({
                    "apiVersion": "serving.knative.dev/v1", "kind": "Route",
                    "metadata": {"name": name},
                    "spec": {"traffic": [{"revisionName": revisions[0], "percent": 100}]},
                })),
            )
            .await
            .unwrap();
        }
        let traffic: Vec<serde_json::Value> = revisions
            .iter()
            .enumerate()
            .map(|(i, r)| serde_json::json!({"revisionName": r, "percent": if i == 0 { 100 } else { 0 }}))
            .collect();
        api.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"traffic": traffic}})),
        )
        .await
        .unwrap();
    }

    /// A revision as the controller would make it: the Revision, its Deployment (at 0) and
    /// private Service (both controlled by the Revision, as the platform requires), its
    /// public Service without a selector, and a Route of the same name routing it (so
    /// [`get`]'s host, `{name}.{NS}.svc.cluster.local`, reaches it).
    pub async fn revision(&self, name: &str, cc: u32, annotations: serde_json::Value) {
        self.unrouted_revision(name, cc, annotations).await;
        self.route(NS, name, &[name]).await;
    }

    /// [`Cluster::revision`] without its Route.
    pub async fn unrouted_revision(&self, name: &str, cc: u32, annotations: serde_json::Value) {
        let revs: Api<thaw::knative::Revision> = Api::namespaced(self.client.clone(), NS);
        let made = revs.create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
                "metadata": {"name": name, "annotations": annotations,
                    "labels": {"serving.knative.dev/service": "hello"}},
                "spec": {"containerConcurrency": cc, "timeoutSeconds": 30,
                    "containers": [{"image": "sample-app", "ports": [{"containerPort": 8080}]}]},
            })),
        )
        .await
        .unwrap();
        let owner = crate::kube_support::revision_owner(name, &made.metadata.uid.unwrap());
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), NS);
        deps.create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": format!("{name}-deployment"), "ownerReferences": owner,
                    "labels": {"serving.knative.dev/revision": name}},
                "spec": {"replicas": 0,
                    "selector": {"matchLabels": {"serving.knative.dev/revision": name}},
                    "template": {"metadata": {"labels": {"serving.knative.dev/revision": name}},
                        "spec": {"containers": [{"name": "user-container", "image": "sample-app"}]}}},
            })),
        )
        .await
        .unwrap();
        let svcs: Api<Service> = Api::namespaced(self.client.clone(), NS);
        // (A meshed test gives it a cluster IP: `mesh::KubeProxy`.)
        svcs.create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": format!("{name}-private"), "ownerReferences": owner,
                    "labels": {
                    "serving.knative.dev/revision": name,
                    "networking.internal.knative.dev/serviceType": "Private"}},
                "spec": {"selector": {"serving.knative.dev/revision": name},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8012, "protocol": "TCP"}]},
            })),
        )
        .await
        .unwrap();
        svcs.create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": name, "labels": {
                    "serving.knative.dev/revision": name,
                    "networking.internal.knative.dev/serviceType": "Public"}},
                "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            })),
        )
        .await
        .unwrap();
    }

    /// The Deployment's `spec.replicas`.
    pub async fn replicas(&self, revision: &str) -> i32 {
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), NS);
        deps.get(&format!("{revision}-deployment"))
            .await
            .ok()
            .and_then(|d| d.spec?.replicas)
            .unwrap_or(0)
    }

    /// The public slices' endpoint addresses (`ip:port` of port `http`), sorted.
    pub async fn public_endpoints(&self, revision: &str) -> Vec<SocketAddr> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), NS);
        let lp = kube::api::ListParams::default().labels(&format!(
            "kubernetes.io/service-name={revision},endpointslice.kubernetes.io/managed-by=autoscaler.thaw.dev"
        ));
        let mut out = Vec::new();
        for s in api.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            let port = s
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some("http"))
                .and_then(|p| p.port);
            for e in &s.endpoints {
                for a in &e.addresses {
                    if let (Ok(ip), Some(p)) = (a.parse(), port) {
                        out.push(SocketAddr::new(ip, p as u16));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Spawns a `thaw` role with this cluster's kubeconfig; its output goes to a log file.
    pub fn spawn(&self, name: &str, args: &[String]) -> Proc {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_thaw"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .env_remove("POD_IP")
            .env_remove("POD_NAME")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Proc {
            child: Some(child),
            log,
            name: name.into(),
        }
    }
}

fn base64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A running `thaw` process, killed on drop.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
    pub name: String,
}

impl Proc {
    /// The process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Waits for the process to exit; its code.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                self.child = None;
                return st.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `within` naming `what`.
pub async fn until<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain HTTP client for the tests' requests.
pub fn http() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A client whose connections come from `source` (another loopback address: a peer that is
/// no gateway until published as one).
pub fn http_from(source: std::net::IpAddr) -> Client<HttpConnector, Full<Bytes>> {
    let mut conn = HttpConnector::new();
    conn.set_local_address(Some(source));
    Client::builder(TokioExecutor::new()).build(conn)
}

/// GET `path` on `addr` for `revision` (routed by Knative's headers, as an ingress does, for
/// the host of the Route [`Cluster::revision`] made). Status, `Server-Timing` and body.
pub async fn get(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    revision: &str,
    path: &str,
) -> (u16, Option<String>, String) {
    let host = format!("{revision}.{NS}.svc.cluster.local");
    get_as(client, addr, &host, Some((NS, revision)), path).await
}

/// GET `path` on `addr` with `Host: host` and, when given, Knative's routing headers naming
/// `(namespace, revision)`. Status, `Server-Timing` and body.
pub async fn get_as(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    host: &str,
    named: Option<(&str, &str)>,
    path: &str,
) -> (u16, Option<String>, String) {
    let mut req = http::Request::get(format!("http://{addr}{path}")).header("host", host);
    if let Some((ns, revision)) = named {
        req = req
            .header("Knative-Serving-Namespace", ns)
            .header("Knative-Serving-Revision", revision);
    }
    let req = req.body(Full::new(Bytes::new())).unwrap();
    match client.request(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let timing = resp
                .headers()
                .get("server-timing")
                .and_then(|v| v.to_str().ok())
                .map(String::from);
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, timing, String::from_utf8_lossy(&body).into_owned())
        }
        Err(e) => (0, None, e.to_string()),
    }
}

/// GET an admin/metrics text.
pub async fn get_text(addr: SocketAddr, path: &str) -> String {
    let c: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(Empty::new())
        .unwrap();
    match c.request(req).await {
        Ok(r) => {
            String::from_utf8_lossy(&r.into_body().collect().await.unwrap().to_bytes()).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// The sum of a metric's samples whose line contains every `needle`.
pub fn metric(text: &str, name: &str, needles: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One pod the kubelet runs.
struct PodRun {
    name: String,
    app: Child,
    sidecar: Option<Child>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// With a sidecar: its revision and the sidecar's data port (behind the private Service).
    meshed: Option<(String, u16)>,
}

impl Drop for PodRun {
    fn drop(&mut self) {
        if let Some((rev, data)) = &self.meshed {
            mesh::leave(rev, *data);
        }
        let _ = self.app.kill();
        let _ = self.app.wait();
        if let Some(s) = self.sidecar.as_mut() {
            let _ = s.kill();
            let _ = s.wait();
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What the kubelet does for one revision.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodKind {
    /// Serve pod stats (as a queue sidecar would).
    pub stats: bool,
    /// Crash: the pod never becomes ready and its container waits in CrashLoopBackOff.
    pub crash: bool,
    /// Run a real `thaw queue` sidecar (with this containerConcurrency) in front of the app:
    /// the slice's `http` port is the sidecar's data port, `http-autometric` its admin port,
    /// and the counting proxy sits between the sidecar and the app.
    pub sidecar: Option<u32>,
    /// With a sidecar: behind a mesh enforcing mutual TLS ([`mesh`]): the slice's addresses
    /// refuse plain text, the sidecar is reachable through the private Service only.
    pub strict_mtls: bool,
}

/// Events the kubelet and the public-slice observer saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The Deployment's replicas changed to n.
    Scale(String, i32),
    /// The public endpoints now point at these addresses.
    Public(String, Vec<SocketAddr>),
}

/// The test kubelet and endpoints controller.
pub struct Kubelet {
    pub peak: Arc<AtomicU32>,
    pub served: Arc<AtomicU64>,
    pub timeline: Arc<Mutex<Vec<(Instant, Seen)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    /// Follows the Deployments of `revisions` every 50 ms.
    pub fn start(client: kube::Client, revisions: Vec<(String, PodKind)>) -> Self {
        let peak = Arc::new(AtomicU32::new(0));
        let served = Arc::new(AtomicU64::new(0));
        let timeline: Arc<Mutex<Vec<(Instant, Seen)>>> = Arc::default();
        let (p, s, t) = (peak.clone(), served.clone(), timeline.clone());
        let task = tokio::spawn(async move {
            let mut pods: BTreeMap<String, Vec<PodRun>> = BTreeMap::new();
            let mut last: BTreeMap<String, (i32, Vec<SocketAddr>)> = BTreeMap::new();
            let mut n = 0u32;
            loop {
                for (rev, kind) in &revisions {
                    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
                    let Ok(d) = deps.get(&format!("{rev}-deployment")).await else {
                        continue;
                    };
                    let want = d.spec.and_then(|s| s.replicas).unwrap_or(0);
                    let entry = last.entry(rev.clone()).or_insert((0, Vec::new()));
                    if entry.0 != want {
                        entry.0 = want;
                        t.lock()
                            .unwrap()
                            .push((Instant::now(), Seen::Scale(rev.clone(), want)));
                    }
                    let running = pods.entry(rev.clone()).or_default();
                    while (running.len() as i32) < want {
                        n += 1;
                        let pod = start_pod(&client, rev, n, *kind, p.clone(), s.clone()).await;
                        running.push(pod);
                    }
                    while (running.len() as i32) > want {
                        let pod = running.pop().unwrap();
                        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
                        let _ = slices.delete(&pod.name, &DeleteParams::default()).await;
                        let podapi: Api<Pod> = Api::namespaced(client.clone(), NS);
                        let _ = podapi.delete(&pod.name, &DeleteParams::default()).await;
                    }
                    // The public endpoints, for order assertions.
                    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
                    let lp = kube::api::ListParams::default().labels(&format!(
                        "kubernetes.io/service-name={rev},endpointslice.kubernetes.io/managed-by=autoscaler.thaw.dev"
                    ));
                    if let Ok(l) = api.list(&lp).await {
                        let mut addrs: Vec<SocketAddr> = l
                            .items
                            .iter()
                            .flat_map(|sl| {
                                let port =
                                    sl.ports.iter().flatten().find_map(|p| p.port).unwrap_or(0);
                                sl.endpoints
                                    .iter()
                                    .flat_map(|e| e.addresses.clone())
                                    .filter_map(move |a| {
                                        Some(SocketAddr::new(a.parse().ok()?, port as u16))
                                    })
                                    .collect::<Vec<_>>()
                            })
                            .collect();
                        addrs.sort();
                        if entry.1 != addrs {
                            entry.1 = addrs.clone();
                            t.lock()
                                .unwrap()
                                .push((Instant::now(), Seen::Public(rev.clone(), addrs)));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Self {
            peak,
            served,
            timeline,
            task,
        }
    }

    pub fn timeline(&self) -> Vec<(Instant, Seen)> {
        self.timeline.lock().unwrap().clone()
    }
}

async fn start_pod(
    client: &kube::Client,
    rev: &str,
    n: u32,
    kind: PodKind,
    peak: Arc<AtomicU32>,
    served: Arc<AtomicU64>,
) -> PodRun {
    let name = format!("{rev}-pod{n}");
    let app_port = free_port();
    let app = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args([
            "sample-app",
            "--port",
            &app_port.to_string(),
            "--response-delay",
            "200ms",
        ])
        .args(if kind.crash {
            &["--crash"][..]
        } else {
            &[][..]
        })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let state = if kind.crash {
        serde_json::json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}})
    } else {
        serde_json::json!({"running": {}})
    };
    // Owned as the Deployment controller owns its pods: through the Deployment's ReplicaSet.
    let owners =
        crate::kube_support::pod_owner_refs(client, NS, &format!("{rev}-deployment")).await;
    let _ = pods
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": name, "labels": {"serving.knative.dev/revision": rev},
                    "ownerReferences": owners},
                "spec": {"containers": [{"name": "user-container", "image": "sample-app"}]},
            })),
        )
        .await;
    let _ = pods
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": {"phase": "Running",
                "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                "containerStatuses": [{"name": "user-container", "ready": !kind.crash,
                    "restartCount": if kind.crash { 5 } else { 0 }, "image": "sample-app",
                    "imageID": "", "state": state}]}})),
        )
        .await;
    let mut tasks = Vec::new();
    if kind.crash {
        return PodRun {
            name,
            app,
            sidecar: None,
            tasks,
            meshed: None,
        };
    }
    // Wait for the app to listen.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", app_port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "sample app never listened");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let inflight = Arc::new(AtomicU32::new(0));
    tasks.push(tokio::spawn(counting_proxy(
        proxy,
        app_port,
        inflight.clone(),
        peak,
        served,
    )));
    let mut sidecar = None;
    let mut meshed = None;
    let mut ports = Vec::new();
    if let Some(cc) = kind.sidecar {
        let (data, admin) = (free_port(), free_port());
        sidecar = Some(
            Command::new(env!("CARGO_BIN_EXE_thaw"))
                .args([
                    "queue".to_string(),
                    format!("--listen=127.0.0.1:{data}"),
                    format!("--admin-listen=127.0.0.1:{admin}"),
                ])
                .env("SERVING_NAMESPACE", NS)
                .env("SERVING_REVISION", rev)
                .env("SERVING_POD", &name)
                .env("CONTAINER_CONCURRENCY", cc.to_string())
                .env("USER_PORT", proxy_port.to_string())
                .env("THAW_DRAIN_DELAY", "0s")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while get_text(SocketAddr::from(([127, 0, 0, 1], admin)), "/readyz")
            .await
            .trim()
            != "ok"
        {
            assert!(Instant::now() < deadline, "the sidecar never became ready");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Any sidecar is reachable through the revision's private Service.
        mesh::join(rev, data, admin);
        meshed = Some((rev.to_string(), data));
        let (data_seen, admin_seen) = if kind.strict_mtls {
            let (d, dt) = mesh::strict_port().await;
            let (a, at) = mesh::strict_port().await;
            tasks.extend([dt, at]);
            (d, a)
        } else {
            (data, admin)
        };
        ports.push(serde_json::json!({"name": "http", "port": data_seen, "protocol": "TCP"}));
        ports.push(
            serde_json::json!({"name": "http-autometric", "port": admin_seen, "protocol": "TCP"}),
        );
    } else {
        ports.push(serde_json::json!({"name": "http", "port": proxy_port, "protocol": "TCP"}));
        if kind.stats {
            let stats = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let stats_port = stats.local_addr().unwrap().port();
            tasks.push(tokio::spawn(stats_endpoint(stats, name.clone(), inflight)));
            ports.push(serde_json::json!({"name": "http-autometric", "port": stats_port, "protocol": "TCP"}));
        }
    }
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    slices
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": name, "labels": {
                    "serving.knative.dev/revision": rev,
                    "networking.internal.knative.dev/serviceType": "Private",
                    "kubernetes.io/service-name": format!("{rev}-private")}},
                "addressType": "IPv4",
                "ports": ports,
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "name": name, "namespace": NS}}],
            })),
        )
        .await
        .unwrap();
    PodRun {
        name,
        app,
        sidecar,
        tasks,
        meshed,
    }
}

/// Forwards to the app, counting requests in flight and keeping the peak; answers the
/// activator's pod probe (`K-Network-Probe: queue`) itself, as the sidecar it stands in for.
async fn counting_proxy(
    listener: TcpListener,
    app_port: u16,
    inflight: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    served: Arc<AtomicU64>,
) {
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (client, inflight, peak, served) = (
            client.clone(),
            inflight.clone(),
            peak.clone(),
            served.clone(),
        );
        tokio::spawn(async move {
            let svc = service_fn(move |mut req: http::Request<Incoming>| {
                let (client, inflight, peak, served) = (
                    client.clone(),
                    inflight.clone(),
                    peak.clone(),
                    served.clone(),
                );
                async move {
                    if req
                        .headers()
                        .get("k-network-probe")
                        .is_some_and(|v| v == "queue")
                    {
                        // The activator's pod probe: answered as the queue sidecar would,
                        // without reaching the app.
                        return Ok::<_, Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(b"queue"),
                        )));
                    }
                    let now = inflight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    *req.uri_mut() = format!("http://127.0.0.1:{app_port}{}", req.uri().path())
                        .parse()
                        .unwrap();
                    let out = match client.request(req).await {
                        Ok(resp) => {
                            let (parts, body) = resp.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            http::Response::from_parts(parts, Full::new(body))
                        }
                        Err(_) => {
                            let mut r =
                                http::Response::new(Full::new(Bytes::from_static(b"bad gateway")));
                            *r.status_mut() = http::StatusCode::BAD_GATEWAY;
                            r
                        }
                    };
                    inflight.fetch_sub(1, Ordering::SeqCst);
                    served.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(out)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Serves the pod's stats as a queue sidecar would: everything came through an activator.
async fn stats_endpoint(listener: TcpListener, pod: String, inflight: Arc<AtomicU32>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (pod, inflight) = (pod.clone(), inflight.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |_req: http::Request<Incoming>| {
                let c = f64::from(inflight.load(Ordering::SeqCst));
                let body = serde_json::json!({"pod": pod, "averageConcurrency": c,
                    "requests": 0, "proxiedConcurrency": c, "proxiedRequests": 0});
                async move {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(
                        body.to_string(),
                    ))))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// `thaw autoscaler` with short Lease timings.
pub fn autoscaler(c: &Cluster, name: &str, stats: u16, admin: u16) -> Proc {
    c.spawn(
        name,
        &[
            "autoscaler".into(),
            format!("--system-namespace={SYSTEM}"),
            format!("--stats-listen=127.0.0.1:{stats}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
            "--lease-duration=3s".into(),
            "--renew-deadline=2s".into(),
            "--retry-period=500ms".into(),
        ],
    )
}

/// `thaw activator` on `data`, believing Knative's routing headers from this host's
/// clients (127.0.0.1, published as config-istio's gateways).
pub async fn activator(c: &Cluster, name: &str, data: SocketAddr, admin: u16) -> Proc {
    c.gateways_at(&[[127, 0, 0, 1].into()]).await;
    c.spawn(
        name,
        &[
            "activator".into(),
            format!("--system-namespace={SYSTEM}"),
            format!("--listen={data}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
            format!("--name={name}"),
        ],
    )
}

/// Whether the role's admin `/readyz` answers ok.
pub async fn ready(admin: u16) -> bool {
    get_text(SocketAddr::from(([127, 0, 0, 1], admin)), "/readyz").await == "ok\n"
}

/// `promtool check metrics` on `text`: its exit code and what it said.
pub fn promtool(text: &str) -> (i32, String) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's `prometheus` package; .ci/run installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
