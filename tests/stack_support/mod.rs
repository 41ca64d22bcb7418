//! The whole stack on one host: the in-process API server, `thaw controller`, two
//! `thaw autoscaler` and two `thaw activator` processes (each reaching the server through its
//! own cuttable relay, with a kubeconfig), and the test playing the rest of Kubernetes
//! ([`cluster`]: the Deployment controller, the kubelet, the endpoints controller) and the
//! ingress ([`ingress`]). Every role process and every pod has its own loopback address
//! (127.A.0.x for the roles, 127.A.b.c for pods; Linux routes all of 127/8 to `lo`), so ports
//! are the ones the manifests and the Deployments name.
//!
//! What a drill uses: [`Stack::role`] (kill -9, SIGTERM, restart with the same arguments, the
//! role's relay to cut and restore), [`Stack::autoscaler_leader`], [`Stack::activator_view`]
//! (an activator's `/revisions` entry), [`cluster::Kubelet::signal`] (one container of a pod),
//! [`Stack::records`] (every `/scale` change the Deployment controller saw and every change of
//! each revision's public slices, timestamped), and [`traffic::SteadyLoop`] (requests through
//! the [`ingress::Ingress`] on kept-alive and fresh connections, counted). When the test panics (or [`LOGS_ENV`] is
//! set), dropping the stack prints every role's and every container's log.

#![allow(
    dead_code,
    reason = "drills use more of the rig than the first scenario"
)]

pub mod cluster;
pub mod ingress;
pub mod roles;
pub mod traffic;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::kube_support::TestApi;
use cluster::{Cluster, Records};
use roles::{Role, RoleKind};

pub const SYSTEM: &str = "thaw-system";
pub const NS: &str = "default";
pub const TOKEN: &str = "stack-e2e-token-0123456789abcdef";
/// The queue sidecar's image, as config-deployment names it; the kubelet runs `thaw queue` for it.
pub const QUEUE_IMAGE: &str = "thaw.test/thaw:stack-e2e";
/// Knative's helloworld-go image (any tag or digest); the kubelet runs `thaw sample-app` for it.
pub const HELLOWORLD_IMAGE: &str = "ghcr.io/knative/helloworld-go";
/// The ingress gateway the test's [`ingress::Ingress`] plays (config-istio's default).
pub const EXTERNAL_GATEWAY: &str = "knative-serving/knative-ingress-gateway";

/// Knative's activator data port, the roles' admin port and the autoscaler's stats port.
pub const ACTIVATOR_PORT: u16 = 8012;
pub const ADMIN_PORT: u16 = 9090;
pub const STATS_PORT: u16 = 8080;

/// The leader-elected roles' Lease timings (`--lease-duration`, `--renew-deadline`,
/// `--retry-period`): short, so a drill's failover is quick.
pub const LEASE_DURATION: &str = "3s";
pub const RENEW_DEADLINE: &str = "2s";
pub const RETRY_PERIOD: &str = "500ms";

/// config-autoscaler for the drills: Knative's defaults but the stable window and the two
/// scale-to-zero periods, shortened so an idle Service reaches zero within seconds.
pub fn short_windows() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("stable-window".into(), "6s".into()),
        ("scale-to-zero-grace-period".into(), "2s".into()),
        ("scale-to-zero-pod-retention-period".into(), "0s".into()),
    ])
}

/// Set (to anything) to print every log when the stack is dropped, not only on failure.
pub const LOGS_ENV: &str = "STACK_E2E_LOGS";

/// How long the stack's own waits (start-up, processes becoming ready) may take.
pub const START: Duration = Duration::from_secs(30);

/// What the stack is started with.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// config-autoscaler's data (the keys the test shortens; the rest stay Knative's defaults).
    pub autoscaler: BTreeMap<String, String>,
    /// config-activator's data (likewise).
    pub activator: BTreeMap<String, String>,
    /// Replicas of each role (at most 9 of each).
    pub controllers: usize,
    pub autoscalers: usize,
    pub activators: usize,
    /// Pods are deleted gracefully, as on Kubernetes: a deleted pod stays, terminating (its
    /// endpoints too), until the kubelet has stopped its containers (after the sidecar's
    /// drain: 30 s). Off, a deleted pod is gone at once and its processes stop behind it.
    pub graceful_pod_deletion: bool,
}

/// The address plan: a /16 of 127/8 per stack, so two stacks on one host (two worktrees'
/// test runs) do not meet.
#[derive(Debug, Clone, Copy)]
pub struct Net {
    pub a: u8,
}

impl Net {
    /// A /16 nobody on this host listens in: its first activator's address and port are free.
    fn pick() -> Self {
        let seed = std::process::id() as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
        for i in 0..254u64 {
            let a = 1 + ((seed + i * 37) % 254) as u8;
            let net = Net { a };
            let probe = SocketAddr::new(net.role(20).into(), ACTIVATOR_PORT);
            if std::net::TcpListener::bind(probe).is_ok() {
                return net;
            }
        }
        panic!("no free 127.x.0.0/16 on this host");
    }

    /// The n-th role process's address (127.A.0.n).
    pub fn role(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.a, 0, n)
    }

    /// The n-th pod's address (127.A.b.c from 127.A.1.1).
    pub fn pod(&self, n: u32) -> Ipv4Addr {
        let n = n + 256;
        Ipv4Addr::new(127, self.a, (n / 254) as u8, (n % 254) as u8 + 1)
    }

    /// Whether `ip` is one of this stack's pod addresses.
    pub fn is_pod(&self, ip: IpAddr) -> bool {
        matches!(ip, IpAddr::V4(v) if v.octets()[..2] == [127, self.a] && v.octets()[2] >= 1)
    }
}

/// Every `/scale` change (deployment, replicas) and public-slice change (revision,
/// endpoints), in order.
#[derive(Debug, PartialEq)]
pub struct Moves {
    pub scale: Vec<(String, i32)>,
    pub public: Vec<(String, Vec<SocketAddr>)>,
}

/// The running stack. Dropped in field order: the processes go before the server and their
/// log directory.
pub struct Stack {
    /// config-istio's two default gateways, one pod (on loopback) routing by the
    /// VirtualServices to the destinations' endpoints: the controller probes it before a
    /// route is IngressReady (the test's [`ingress::Ingress`] carries the test's own requests).
    pub gateway: crate::kube_support::gateway::TestGateway,
    pub roles: Vec<Role>,
    pub cluster: Cluster,
    pub api: TestApi,
    /// The test's own client (straight to the server, never cut).
    pub client: kube::Client,
    pub dir: tempfile::TempDir,
    pub net: Net,
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os(LOGS_ENV).is_some() {
            eprintln!("{}", self.dump());
        }
    }
}

impl Stack {
    /// Starts the server, the system namespace's objects, the test's Kubernetes controllers and
    /// kubelet, then the roles, and waits until every role is ready and an autoscaler leads.
    pub async fn start(opts: StackOptions) -> Self {
        let api = TestApi::start().await;
        let client = api.client();
        let dir = tempfile::tempdir().unwrap();
        let net = Net::pick();
        system_objects(&client, &opts).await;
        let gateway = gateway(&client).await;
        let cluster = Cluster::start(
            client.clone(),
            net,
            dir.path().join("pods"),
            opts.graceful_pod_deletion,
        );
        let mut roles = Vec::new();
        for i in 0..opts.controllers {
            let ip = net.role(1 + i as u8);
            roles.push(Role::start(&api, dir.path(), RoleKind::Controller, i + 1, ip).await);
        }
        for i in 0..opts.autoscalers {
            let ip = net.role(10 + i as u8);
            roles.push(Role::start(&api, dir.path(), RoleKind::Autoscaler, i + 1, ip).await);
        }
        for i in 0..opts.activators {
            let ip = net.role(20 + i as u8);
            let role = Role::start(&api, dir.path(), RoleKind::Activator, i + 1, ip).await;
            // The activators are activator-service's pods: the kubelet probes them and the
            // endpoints controller lists the ready ones.
            cluster.kubelet.adopt(role.pod()).await;
            roles.push(role);
        }
        let stack = Self {
            gateway,
            api,
            client,
            dir,
            net,
            roles,
            cluster,
        };
        for r in &stack.roles {
            let admin = r.admin();
            stack
                .until(
                    START,
                    &format!("{} ready (/readyz)", r.name),
                    || async move { ready(admin).await.then_some(()) },
                )
                .await;
        }
        if opts.autoscalers > 0 {
            stack
                .until(
                    START,
                    "an autoscaler leading (Lease thaw-autoscaler)",
                    || stack.autoscaler_leader(),
                )
                .await;
        }
        let want = opts.activators;
        stack
            .until(
                START,
                "activator-service listing every activator",
                || async { (stack.activator_service().await.len() == want).then_some(()) },
            )
            .await;
        stack
    }

    /// Starts one more role of `kind` (the next number, the next address), as a Deployment's
    /// rollout adds a pod (an activator's pod is adopted by the kubelet, so activator-service
    /// lists it once ready), and waits until it is ready. Its name.
    pub async fn add_role(&mut self, kind: RoleKind) -> String {
        let n = self.roles_of(kind).count() + 1;
        let base = match kind {
            RoleKind::Controller => 1,
            RoleKind::Autoscaler => 10,
            RoleKind::Activator => 20,
        };
        let ip = self.net.role(base + n as u8 - 1);
        let role = Role::start(&self.api, self.dir.path(), kind, n, ip).await;
        if kind == RoleKind::Activator {
            self.cluster.kubelet.adopt(role.pod()).await;
        }
        let admin = role.admin();
        let name = role.name.clone();
        self.roles.push(role);
        self.until(START, &format!("{name} ready (/readyz)"), || async move {
            ready(admin).await.then_some(())
        })
        .await;
        name
    }

    /// The role named `name` (`controller-1`, `autoscaler-2`, `activator-1`, ...).
    pub fn role(&self, name: &str) -> &Role {
        self.roles
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no role {name}"))
    }

    pub fn roles_of(&self, kind: RoleKind) -> impl Iterator<Item = &Role> {
        self.roles.iter().filter(move |r| r.kind == kind)
    }

    /// The autoscaler holding the Lease `thaw-autoscaler` (its holderIdentity is the leader's
    /// stats address).
    pub async fn autoscaler_leader(&self) -> Option<&Role> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), SYSTEM);
        let holder = leases
            .get_opt("thaw-autoscaler")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())?;
        self.roles_of(RoleKind::Autoscaler)
            .find(|r| r.stats().to_string() == holder)
    }

    /// activator-service's ready endpoints (port `http`), as its EndpointSlices list them.
    pub async fn activator_service(&self) -> Vec<SocketAddr> {
        cluster::service_endpoints(&self.client, SYSTEM, "activator-service", "http").await
    }

    /// Cuts every role off the API server.
    pub fn cut_all(&self) {
        for r in &self.roles {
            r.cut();
        }
    }

    pub fn restore_all(&self) {
        for r in &self.roles {
            r.restore();
        }
    }

    /// `revision`'s entry in `role`'s `/revisions` (an activator's view: `state`, `ready`,
    /// `held`, `endpoints`, ...); `None` while it does not list it.
    pub async fn activator_view(
        &self,
        role: &Role,
        ns: &str,
        revision: &str,
    ) -> Option<serde_json::Value> {
        let text = crate::kube_e2e_support::get_text(role.admin(), "/revisions").await;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["revisions"]
            .as_array()?
            .iter()
            .find(|r| r["namespace"] == ns && r["name"] == revision)
            .cloned()
    }

    /// Every `/scale` change and public-slice change seen so far.
    pub fn records(&self) -> &Arc<Records> {
        &self.cluster.records
    }

    /// What a drill must not move: every `/scale` change and every public-slice change
    /// recorded so far.
    pub fn moves(&self) -> Moves {
        let r = self.records();
        Moves {
            scale: r
                .scale()
                .into_iter()
                .map(|c| (c.deployment, c.replicas))
                .collect(),
            public: r
                .public()
                .into_iter()
                .map(|c| (c.revision, c.endpoints))
                .collect(),
        }
    }

    /// `revision`'s public slices' endpoints as last recorded.
    pub fn public_now(&self, revision: &str) -> Vec<SocketAddr> {
        self.records()
            .public_of(revision)
            .last()
            .map(|c| c.endpoints.clone())
            .unwrap_or_default()
    }

    /// Whether `addr` is an activator's data address.
    pub fn is_activator(&self, addr: &SocketAddr) -> bool {
        self.roles_of(RoleKind::Activator)
            .any(|r| r.data() == *addr)
    }

    /// Polls `f` every 50 ms until it returns `Some`; after `within`, fails naming `what` (the
    /// stack's logs are printed as the test unwinds).
    /// Waits until every activator sees `namespace/revision` with no ready endpoint (a request
    /// now is a cold one).
    pub async fn until_activators_cold(&self, namespace: &str, revision: &str, within: Duration) {
        for act in self.roles_of(RoleKind::Activator) {
            self.until(
                within,
                &format!("{} seeing {revision} cold", act.name),
                || async {
                    let v = self.activator_view(act, namespace, revision).await?;
                    (v["ready"]["count"] == 0).then_some(())
                },
            )
            .await;
        }
    }

    pub async fn until<T, F, Fut>(&self, within: Duration, what: &str, mut f: F) -> T
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

    /// Every role's log, then every container's.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for r in &self.roles {
            out.push_str(&format!(
                "===== {} ({}) =====\n{}\n",
                r.name,
                r.ip,
                r.logs()
            ));
        }
        out.push_str(&self.cluster.kubelet.logs());
        out.push_str(&format!(
            "===== records =====\n{}\n",
            self.cluster.records.describe()
        ));
        out
    }
}

/// Knative's helloworld-go Service under another name, with template annotations (inline
/// YAML map entries) and, when given, a containerConcurrency.
pub fn helloworld(
    name: &str,
    annotations: &str,
    container_concurrency: Option<u32>,
) -> thaw::knative::Service {
    let cc = container_concurrency
        .map(|c| format!("      containerConcurrency: {c}\n"))
        .unwrap_or_default();
    let yaml = format!(
        r#"
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  template:
    metadata:
      annotations: {{{annotations}}}
    spec:
{cc}      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          env:
            - name: TARGET
              value: "Go Sample v1"
"#
    );
    serde_saphyr::from_str(&yaml).expect("a Service")
}

/// `/readyz` answers `ok`.
pub async fn ready(admin: SocketAddr) -> bool {
    crate::kube_e2e_support::get_text(admin, "/readyz")
        .await
        .trim()
        == "ok"
}

/// The stats token Secret, the ConfigMaps and activator-service (as deploy/ has them).
async fn system_objects(client: &kube::Client, opts: &StackOptions) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("thaw-stats-token".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(TOKEN.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM);
    for (name, data) in [
        ("config-autoscaler", opts.autoscaler.clone()),
        ("config-activator", opts.activator.clone()),
        (
            "config-deployment",
            BTreeMap::from([("queue-sidecar-image".to_string(), QUEUE_IMAGE.to_string())]),
        ),
    ] {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    // deploy/activator/service.yaml's activator-service.
    let svcs: Api<Service> = Api::namespaced(client.clone(), SYSTEM);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "activator-service", "labels": {
            "app.kubernetes.io/name": "activator", "app.kubernetes.io/part-of": "thaw"}},
        "spec": {"selector": {"app.kubernetes.io/name": "activator"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "http"},
                {"name": "http2", "port": 81, "targetPort": "http",
                    "appProtocol": "kubernetes.io/h2c"}]},
    }))
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
}

/// One gateway pod serving both of config-istio's default gateways, forwarding to the
/// destinations' endpoints, published as both gateway Services.
async fn gateway(client: &kube::Client) -> crate::kube_support::gateway::TestGateway {
    use crate::kube_support::gateway::{Backend, TestGateway, publish};
    let istio = thaw::config::network::IstioConfig::default();
    let gws: Vec<_> = istio
        .external_gateways
        .iter()
        .chain(&istio.local_gateways)
        .collect();
    let refs: Vec<String> = gws.iter().map(|g| g.reference()).collect();
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let gw = TestGateway::start(client.clone(), &refs, Backend::Destinations).await;
    for g in gws {
        publish(client, &g.service, &[gw.addr()]).await;
    }
    gw
}
