//! A real Kubernetes control plane for the tests: etcd, kube-apiserver and
//! kube-controller-manager built from their Go modules (`tests/cluster/build.sh`), started
//! once per test target inside the target's own namespaces ([`netns`]), with the kubelet
//! stand-in ([`kubelet`]) as its one node. thaw goes on it as the README says ([`install`]).
//!
//! What is real: authentication (client certificates, service-account tokens), authorization
//! (`Node,RBAC`), admission (the default plugins, `NodeRestriction`,
//! `OwnerReferencesPermissionEnforcement`, Pod Security, the webhooks thaw ships), CRD schemas
//! with CEL, server-side apply, watches, the Deployment, ReplicaSet, EndpointSlice, garbage
//! collector, namespace, service-account and node-lifecycle controllers. What is played: the
//! kubelet and the scheduler's binding ([`kubelet`]); what is missing: kube-proxy (cluster IPs
//! route nowhere; the API server reaches webhooks at their endpoints,
//! `--enable-aggregator-routing`), cluster DNS, a CNI's NetworkPolicy. A target that runs
//! programs dialling Services by name (Knative's own components, [`knative`]) turns on the
//! kubelet stand-in's smallest stand-in for both ([`kubelet::Kubelet::resolve_services`]).

#![allow(
    dead_code,
    reason = "helpers for the cases of this target and the next ones on the plane"
)]

pub mod audit;
pub mod checks;
pub mod harness;
pub mod install;
pub mod knative;
pub mod kubelet;
pub mod latency;
pub mod net_istio;
pub mod netns;
pub mod pki;
pub mod serving_checks;
pub mod stack;
pub mod traffic;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use pki::Pki;

/// The Kubernetes release the plane runs (tests/cluster/kube/go.mod).
pub const KUBE_VERSION: &str = "v1.34.4";
/// The node the kubelet stand-in registers.
pub const NODE: &str = "plane-node-1";
/// How long the plane's own start may take (etcd, the API server's post-start hooks, the
/// controllers' first sync).
pub const START: Duration = Duration::from_secs(120);

/// Where `tests/cluster/build.sh` puts the binaries.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("plane")
}

/// Builds the plane's Go binaries unless built from the same inputs already (the script keeps
/// a stamp). Runs outside the namespaces: it needs the Go module proxy.
pub fn build() -> Result<PathBuf, String> {
    let out = bin_dir();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/build.sh");
    let status = Command::new(&script)
        .arg(&out)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !status.success() {
        return Err(format!(
            "{} failed ({status}): the real control plane cannot be built here",
            script.display()
        ));
    }
    Ok(out.join("bin"))
}

/// A process of the plane, killed when dropped; its output goes to `log`.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// How it was started, for [`Proc::restart`].
    program: PathBuf,
    args: Vec<String>,
}

impl Proc {
    fn start(name: &str, program: &Path, args: &[String], dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Self::spawn(program, args, out);
        Proc {
            name: name.into(),
            log,
            child,
            program: program.to_owned(),
            args: args.to_vec(),
        }
    }

    fn spawn(program: &Path, args: &[String], out: std::fs::File) -> Child {
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()))
    }

    /// SIGKILLs it, reaps it, and starts it again with the same arguments, its output
    /// appended to the same log after a header line.
    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut out = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        use std::io::Write as _;
        let _ = writeln!(
            out,
            "----- {} restarted (SIGKILL, then started again) -----",
            self.name
        );
        self.child = Self::spawn(&self.program, &self.args, out);
    }

    /// Panics with the end of its log when it has exited.
    fn check(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, tail(&self.log, 40));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A port nobody listens on at `ip` (the namespace is the plane's alone, so it stays free).
pub fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind(SocketAddr::new(ip.into(), 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The running plane. Dropped in field order: the node's pods first, the controllers, the
/// API server, etcd, then the directory.
pub struct Plane {
    pub kubelet: kubelet::Kubelet,
    /// etcd, the API server, the controller-manager, in that order (a Mutex: the API server
    /// is restarted through a shared plane, [`Plane::restart_apiserver`]).
    procs: Mutex<Vec<Proc>>,
    /// The API server's URL (the node's address; what pods' kubeconfigs name too).
    pub server: String,
    /// `system:masters`: the test's own setup and checks only.
    pub admin: kube::Client,
    pub admin_kubeconfig: PathBuf,
    pub pki: Pki,
    pub bins: PathBuf,
    /// The API server's audit log of thaw's ServiceAccounts' requests (JSON lines).
    pub audit_log: PathBuf,
    /// Logs, certificates, etcd's data; kept when a case fails ([`Plane::keep`]).
    pub dir: tempfile::TempDir,
}

impl Plane {
    /// Starts etcd, the API server, the controller-manager and the node, and returns once the
    /// API server is ready, the node is Ready and the `default` namespace has its
    /// ServiceAccount (the controller-manager's controllers run). Panics with the failing
    /// component's log.
    pub async fn start(bins: &Path) -> Plane {
        netns::network().unwrap();
        let dir = tempfile::Builder::new()
            .prefix("real-plane-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let pki = Pki::new(&dir.path().join("pki"));
        let node_ip = netns::NODE_IP;
        let secure_port = free_port(node_ip);
        let server = format!("https://{node_ip}:{secure_port}");
        let mut procs = Vec::new();

        // etcd: loopback only, data in the run's directory, no fsync (the data dies with the run).
        let etcd_client = free_port(Ipv4Addr::LOCALHOST);
        let etcd_peer = free_port(Ipv4Addr::LOCALHOST);
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        procs.push(Proc::start(
            "etcd",
            &bins.join("etcd"),
            &[
                "--name=plane".into(),
                format!("--data-dir={}", dir.path().join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=plane={peer_url}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            dir.path(),
        ));

        let serving = pki.server(
            "apiserver",
            &[
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
                "localhost",
            ],
            &[node_ip, Ipv4Addr::LOCALHOST, Ipv4Addr::new(10, 96, 0, 1)],
        );
        let (sa_key, sa_pub) = pki.service_account_keys();
        // Every request of thaw's ServiceAccounts, at Metadata level: what [`checks::denials`]
        // reads the refusals from, whatever the roles log.
        let audit_policy = dir.path().join("audit-policy.yaml");
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n    userGroups: [\"system:serviceaccounts:thaw-system\"]\n  - level: None\n",
        )
        .unwrap();
        let audit_log = dir.path().join("audit.log");
        let a = |k: &str, v: &dyn std::fmt::Display| format!("--{k}={v}");
        let d = |p: &Path| p.display().to_string();
        procs.push(Proc::start(
            "kube-apiserver",
            &bins.join("kube-apiserver"),
            &[
                a("etcd-servers", &etcd_url),
                a("bind-address", &node_ip),
                a("advertise-address", &node_ip),
                a("secure-port", &secure_port),
                a("service-cluster-ip-range", &netns::SERVICE_CIDR),
                a("tls-cert-file", &d(&serving.cert)),
                a("tls-private-key-file", &d(&serving.key)),
                a("client-ca-file", &d(&pki.ca_file())),
                a("authorization-mode", &"Node,RBAC"),
                // On top of the default plugins (Pod Security, ServiceAccount, the webhooks,
                // ...): a node changes only itself and its pods; an owner reference with
                // blockOwnerDeletion needs delete on the owner (OpenShift's default).
                a(
                    "enable-admission-plugins",
                    &"NodeRestriction,OwnerReferencesPermissionEnforcement",
                ),
                a(
                    "service-account-issuer",
                    &"https://kubernetes.default.svc.cluster.local",
                ),
                a("service-account-key-file", &d(&sa_pub)),
                a("service-account-signing-key-file", &d(&sa_key)),
                // No kube-proxy: webhooks and aggregated APIs are reached at their endpoints.
                a("enable-aggregator-routing", &true),
                a("allow-privileged", &true),
                a("profiling", &false),
                a("audit-policy-file", &d(&audit_policy)),
                a("audit-log-path", &d(&audit_log)),
                a("v", &1),
            ],
            dir.path(),
        ));

        let admin_pair = pki.client("admin", "kubernetes-admin", &["system:masters"]);
        let admin_kubeconfig = pki.kubeconfig("admin", &server, &admin_pair);
        let admin = pki::client(&admin_kubeconfig).await;
        let deadline = Instant::now() + START;
        loop {
            for p in &mut procs {
                p.check();
            }
            let ready = admin
                .request_text(http::Request::get("/readyz").body(Vec::new()).unwrap())
                .await;
            if ready.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the API server is not ready after {START:?}: {ready:?}\n{}",
                tail(&procs[1].log, 40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let kcm_pair = pki.client("kcm", "system:kube-controller-manager", &[]);
        let kcm_kubeconfig = pki.kubeconfig("kcm", &server, &kcm_pair);
        procs.push(Proc::start(
            "kube-controller-manager",
            &bins.join("kube-controller-manager"),
            &[
                a("kubeconfig", &d(&kcm_kubeconfig)),
                a("authentication-kubeconfig", &d(&kcm_kubeconfig)),
                a("authorization-kubeconfig", &d(&kcm_kubeconfig)),
                a("bind-address", &Ipv4Addr::LOCALHOST),
                a("secure-port", &free_port(Ipv4Addr::LOCALHOST)),
                // Every default controller, each with its own service account's token.
                a("controllers", &"*"),
                a("use-service-account-credentials", &true),
                a("service-account-private-key-file", &d(&sa_key)),
                a("root-ca-file", &d(&pki.ca_file())),
                a("cluster-signing-cert-file", &d(&pki.ca_file())),
                a("cluster-signing-key-file", &d(&pki.ca_key_file())),
                a("leader-elect", &false),
                // The defaults (20 QPS, burst 30) are a large cluster's fair share; the plane's
                // one controller-manager may go faster.
                a("kube-api-qps", &200),
                a("kube-api-burst", &400),
                a("v", &1),
            ],
            dir.path(),
        ));

        let node_pair = pki.client("node", &format!("system:node:{NODE}"), &["system:nodes"]);
        let node_kubeconfig = pki.kubeconfig("node", &server, &node_pair);
        let scheduler_pair = pki.client("scheduler", "system:kube-scheduler", &[]);
        let scheduler_kubeconfig = pki.kubeconfig("scheduler", &server, &scheduler_pair);
        let proxy_pair = pki.client("kube-proxy", "system:kube-proxy", &[]);
        let proxy_kubeconfig = pki.kubeconfig("kube-proxy", &server, &proxy_pair);
        let kubelet = kubelet::Kubelet::start(kubelet::KubeletConfig {
            node_name: NODE.into(),
            node_ip,
            bridge: netns::BRIDGE.into(),
            pod_ips: netns::FIRST_POD_IP..=netns::LAST_POD_IP,
            node_client: pki::client(&node_kubeconfig).await,
            scheduler_client: pki::client(&scheduler_kubeconfig).await,
            proxy_client: pki::client(&proxy_kubeconfig).await,
            server: server.clone(),
            ca_pem: pki.ca_pem.clone(),
            images: install::images(),
            dir: dir.path().to_owned(),
        })
        .await;

        let plane = Plane {
            kubelet,
            procs: Mutex::new(procs),
            server,
            admin,
            admin_kubeconfig,
            audit_log,
            pki,
            bins: bins.to_owned(),
            dir,
        };
        plane.until_controllers().await;
        plane
    }

    /// Waits until the controller-manager's service-account controller has made `default`'s
    /// ServiceAccount (its controllers are running).
    async fn until_controllers(&self) {
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(self.admin.clone(), "default");
        let deadline = Instant::now() + START;
        while sas.get_opt("default").await.ok().flatten().is_none() {
            self.check();
            assert!(
                Instant::now() < deadline,
                "no default ServiceAccount after {START:?}: the controller-manager's log:\n{}",
                tail(&self.procs.lock().unwrap()[2].log, 40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Panics with its log when a component of the plane has exited.
    pub fn check(&self) {
        for p in self.procs.lock().unwrap().iter_mut() {
            p.check();
        }
    }

    /// Restarts the API server as a crash and a supervisor's restart would: SIGKILL, then the
    /// same binary with the same arguments (etcd and its data kept, the same address and
    /// certificates); returns once `/readyz` answers ok again, with how long it was away.
    /// Panics with its log when it is not ready within [`START`]. Every client's connection
    /// breaks; watches must be resumed by their owners.
    pub async fn restart_apiserver(&self) -> Duration {
        let began = Instant::now();
        let log = {
            let mut procs = self.procs.lock().unwrap();
            let p = procs
                .iter_mut()
                .find(|p| p.name == "kube-apiserver")
                .expect("the plane's API server");
            p.restart();
            p.log.clone()
        };
        let deadline = began + START;
        loop {
            self.check();
            let ready = self
                .admin
                .request_text(http::Request::get("/readyz").body(Vec::new()).unwrap())
                .await;
            if ready.as_deref().is_ok_and(|r| r.trim() == "ok") {
                return began.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "the API server is not ready {START:?} after its restart: {ready:?}\n{}",
                tail(&log, 40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `kubectl` with the admin kubeconfig; the error carries what it printed.
    /// Runs as a child the runtime waits for: a blocking wait here would stall the kubelet
    /// stand-in, which shares the runtime.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = tokio::process::Command::new(self.bins.join("kubectl"))
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .args(args)
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "kubectl {}: {}{}",
                args.join(" "),
                stdout,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Every component's log tail and every container's log: what a failing run prints.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for p in self.procs.lock().unwrap().iter() {
            s.push_str(&format!("===== {} =====\n{}\n", p.name, tail(&p.log, 60)));
        }
        s.push_str(&self.kubelet.dump_logs());
        s
    }

    /// Keeps the run's directory (logs, certificates) after the plane stops; returns it.
    pub fn keep(self) -> PathBuf {
        let Plane { dir, .. } = self;
        dir.keep()
    }
}
