//! A steady cluster as an earlier autoscaler left it, and `thaw autoscaler` processes whose
//! takeovers are read from their `/metrics`: shared by `benches/takeover.rs` (1,000
//! revisions) and `tests/kube_takeover.rs` (a few, in the suite).

#![allow(dead_code, reason = "the bench and the test use different parts")]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use thaw::knative::Revision;
use tokio::time::Instant;

use crate::kube_support::TestApi;

pub const NS: &str = "default";
pub const SYSTEM: &str = "thaw-system";

pub fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One revision as an earlier thaw left it; `warm`: one replica with a ready pod.
pub async fn revision(client: kube::Client, i: usize, warm: bool) {
    let name = format!("rev-{i:05}");
    let revs: Api<Revision> = Api::namespaced(client.clone(), NS);
    let made = revs.create(
        &PostParams::default(),
        &obj(serde_json::json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": name, "labels": {"serving.knative.dev/service": format!("svc-{i:05}")}},
            "spec": {"containerConcurrency": 0, "timeoutSeconds": 300,
                "containers": [{"image": "app", "ports": [{"containerPort": 8080}]}]},
        })),
    )
    .await
    .unwrap();
    let now = "2026-11-27T00:00:00Z";
    revs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
        "observedGeneration": 1,
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ResourcesAvailable", "status": "True", "lastTransitionTime": now},
            {"type": "ContainerHealthy", "status": "True", "lastTransitionTime": now},
        ]}})),
    )
    .await
    .unwrap();
    // Its Deployment and private Service, controlled by the Revision (the platform's own
    // are those it controls).
    let owner = crate::kube_support::revision_owner(&name, &made.metadata.uid.unwrap());
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    deps.create(
        &PostParams::default(),
        &obj(serde_json::json!({
            "metadata": {"name": format!("{name}-deployment"), "ownerReferences": owner,
                "labels": {"serving.knative.dev/revision": name}},
            "spec": {"replicas": i32::from(warm),
                "selector": {"matchLabels": {"serving.knative.dev/revision": name}},
                "template": {"metadata": {"labels": {"serving.knative.dev/revision": name}},
                    "spec": {"containers": [{"name": "user-container", "image": "app"}]}}},
        })),
    )
    .await
    .unwrap();
    let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
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
    let svc = svcs
        .create(
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
    // The public slices the earlier version wrote: the activators (in the path of every
    // revision at zero, and of warm ones without burst capacity to spare, as here).
    let public: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    public
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": format!("{name}-public"), "labels": {
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "autoscaler.thaw.dev",
                    "serving.knative.dev/revision": name,
                    "networking.internal.knative.dev/serviceType": "Public"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                        "uid": svc.metadata.uid.unwrap(), "controller": true}]},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false}},
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": true, "serving": true, "terminating": false}}],
            })),
        )
        .await
        .unwrap();
    if warm {
        let pod = format!("{name}-pod");
        let labels = serde_json::json!({"serving.knative.dev/revision": name});
        let deployment = format!("{name}-deployment");
        let ip = format!("10.1.{}.{}", i / 250, i % 250 + 1);
        crate::kube_support::running_pod(&client, NS, &deployment, &pod, &ip, labels).await;
        let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
        slices
            .create(
                &PostParams::default(),
                &obj(serde_json::json!({
                    "metadata": {"name": format!("{name}-private-1"), "labels": {
                        "serving.knative.dev/revision": name,
                        "networking.internal.knative.dev/serviceType": "Private",
                        "kubernetes.io/service-name": format!("{name}-private")}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip],
                        "conditions": {"ready": true},
                        "targetRef": crate::kube_support::pod_target(NS, &pod)}],
                })),
            )
            .await
            .unwrap();
    }
}

pub struct Autoscaler {
    pub child: Child,
    pub admin: u16,
}

impl Drop for Autoscaler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `thaw autoscaler` with short Lease timings (3 s / 2 s / 500 ms).
pub fn autoscaler(kubeconfig: &std::path::Path, log: &std::path::Path) -> Autoscaler {
    autoscaler_with(
        kubeconfig,
        log,
        &[
            "--lease-duration=3s",
            "--renew-deadline=2s",
            "--retry-period=500ms",
        ],
    )
}

/// A `thaw autoscaler` with `lease` flags.
pub fn autoscaler_with(
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
    lease: &[&str],
) -> Autoscaler {
    let (stats, admin) = (free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args([
            "autoscaler".to_string(),
            format!("--system-namespace={SYSTEM}"),
            format!("--stats-listen=127.0.0.1:{stats}"),
            format!("--admin-listen=127.0.0.1:{admin}"),
        ])
        .args(lease)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("TAKEOVER_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    Autoscaler { child, admin }
}

pub async fn metrics(admin: u16) -> String {
    let c: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::get(format!(
        "http://{}/metrics",
        SocketAddr::from(([127, 0, 0, 1], admin))
    ))
    .header("accept", "text/plain")
    .body(Empty::new())
    .unwrap();
    match c.request(req).await {
        Ok(r) => {
            String::from_utf8_lossy(&r.into_body().collect().await.unwrap().to_bytes()).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// The sum of a metric's samples.
pub fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| l[name.len()..].starts_with(' ') || l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        + 0.0 // an empty sum is -0
}

/// One takeover as the new leader's `/metrics` tell it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Takeover {
    pub seconds: f64,
    /// API writes made by the takeover (`thaw_autoscaler_takeover_writes`).
    pub writes: f64,
    /// Every `/scale` patch, public-slice write and Revision status write so far.
    pub scale_patches: f64,
    pub slice_writes: f64,
    pub status_writes: f64,
}

impl std::fmt::Display for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "takeover {:.3} s, {} API writes ({} /scale patches, {} public-slice writes, {} Revision status writes)",
            self.seconds, self.writes, self.scale_patches, self.slice_writes, self.status_writes
        )
    }
}

/// Waits for `admin`'s replica to lead and finish its takeover (within `within`).
pub async fn takeover(admin: u16, log: &std::path::Path, within: Duration) -> Takeover {
    let deadline = Instant::now() + within;
    loop {
        let m = metrics(admin).await;
        if value(&m, "thaw_autoscaler_takeover_seconds") > 0.0 {
            return Takeover {
                seconds: value(&m, "thaw_autoscaler_takeover_seconds"),
                writes: value(&m, "thaw_autoscaler_takeover_writes"),
                scale_patches: value(&m, "thaw_platform_scale_patches_total"),
                slice_writes: value(
                    &m,
                    "thaw_autoscaler_api_writes_total{resource=\"endpointslices\"}",
                ),
                status_writes: value(
                    &m,
                    "thaw_autoscaler_api_writes_total{resource=\"revisionstatus\"}",
                ),
            };
        }
        assert!(
            Instant::now() < deadline,
            "no takeover; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `admin`'s replica answers `/readyz` (its watches have listed).
pub async fn wait_ready(admin: u16, within: Duration) {
    let deadline = Instant::now() + within;
    let c: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    loop {
        let req = http::Request::get(format!("http://127.0.0.1:{admin}/readyz"))
            .body(Empty::new())
            .unwrap();
        if c.request(req).await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `admin`'s replica made no write for `quiet`.
pub async fn settle(admin: u16, quiet: Duration) {
    let writes = |m: &str| {
        value(m, "thaw_platform_scale_patches_total") + value(m, "thaw_autoscaler_api_writes_total")
    };
    let mut last = writes(&metrics(admin).await);
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = writes(&metrics(admin).await);
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

/// The API server with the system namespace's objects (stats token, `config-autoscaler` at
/// Knative's defaults, two activators) and a kubeconfig for the roles.
pub struct Steady {
    pub api: TestApi,
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
    pub kubeconfig: std::path::PathBuf,
}

impl Steady {
    pub async fn start() -> Self {
        let api = TestApi::start().await;
        let client = api.client();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        crate::kube_support::write_kubeconfig(&kubeconfig, api.addr(), SYSTEM);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM);
        secrets
            .create(
                &PostParams::default(),
                &obj(serde_json::json!({"metadata": {"name": "thaw-stats-token"},
                                "data": {"token": "YmVuY2gtdG9rZW4tMDEyMzQ1Njc4OWFiY2RlZg=="}})),
            )
            .await
            .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM);
        cms.create(
            &PostParams::default(),
            &obj(serde_json::json!({"metadata": {"name": "config-autoscaler"}, "data": {}})),
        )
        .await
        .unwrap();
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), SYSTEM);
        slices
            .create(
                &PostParams::default(),
                &obj(serde_json::json!({
                        "metadata": {"name": "activator-service-1",
                                "labels": {"kubernetes.io/service-name": "activator-service"}},
                        "addressType": "IPv4",
                        "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
                        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}],
                })),
            )
            .await
            .unwrap();
        Self {
            api,
            client,
            dir,
            kubeconfig,
        }
    }
}
