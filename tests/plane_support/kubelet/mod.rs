//! The kubelet of the real control plane's one node, and the scheduler's one job (binding),
//! played by the test process against a real API server with real identities: the node's
//! client certificate (`system:node:<name>`, so the Node authorizer and NodeRestriction judge
//! every call it makes) and the scheduler's (`system:kube-scheduler`, binding and the
//! Unschedulable condition only).
//!
//! What it plays, as the kubelet does it:
//! - the Node ([`node`]): registered with its labels, its status written every 10 s, its Lease
//!   renewed every 10 s (a kubelet that stops renewing gets its node tainted and its pods
//!   evicted by the nodelifecycle controller, as in a cluster);
//! - binding ([`scheduler`]): every pending pod of the default scheduler that fits the node
//!   (`nodeSelector`, NoSchedule/NoExecute taints, `spec.unschedulable`) is bound to it; one
//!   that does not stays Pending with PodScheduled=False, Unschedulable, and the reason;
//! - pods ([`manager`], [`pod`]): each pod bound here gets its own network namespace (a pause
//!   process, a veth on the bridge, an address from [`KubeletConfig::pod_ips`]), its init
//!   containers in order then its containers as real processes in that namespace (so
//!   `0.0.0.0:8080` and a shared localhost work as in a pod), the environment the kubelet
//!   builds ([`env`]), a kubeconfig with a bound ServiceAccount token ([`token`]), startup,
//!   readiness and liveness probes ([`probe`]), restarts with the kubelet's back-off, graceful
//!   termination (preStop, SIGTERM, SIGKILL at the grace period's end, then the Pod deleted
//!   with grace 0), and a status written through `pods/status` whenever it changes
//!   ([`status`]).
//!
//! What it does not play:
//! - images: an image reference (without tag or digest) names a local program
//!   ([`KubeletConfig::images`]); nothing is pulled; an unknown image is `ErrImagePull`;
//! - cgroups and resources: requests and limits are reported (downward API, QoS class) but
//!   not enforced; no OOM kills, no eviction, no node pressure;
//! - volumes beyond emptyDir directories, and mount namespaces (but for the hosts file of
//!   [`hosts`]): a container's volumeMounts mount nothing (every container sees the host's filesystem), the ServiceAccount token
//!   is handed over as a kubeconfig file (`KUBECONFIG`) instead of a projected volume;
//! - securityContext: everything runs as the test's own user;
//! - exec probes and exec hooks (a probe counts as failed, a hook is logged and skipped);
//! - kube-proxy and DNS: no `KUBERNETES_SERVICE_HOST`/`PORT` nor service links in the
//!   environment; ClusterIPs lead nowhere and names resolve to nothing until a test names a
//!   namespace whose pods dial Services ([`Kubelet::resolve_services`]): from then on the
//!   node proxies every cluster IP (kube-proxy's userspace mode) and that namespace's pods
//!   resolve Service names through a hosts file of their own ([`hosts`]);
//! - the kubelet's own API (logs, exec, port-forward, metrics): read [`Kubelet::dump_logs`];
//! - node affinity, pod (anti-)affinity, topology spread and preemption when binding;
//! - hostNetwork and hostPort (every pod gets its own namespace), Events, termination
//!   messages, `activeDeadlineSeconds`;
//! - in-place updates of a running pod's spec (a changed image is not restarted), static
//!   and mirror pods, restartable init containers beyond "started in order, kept running".
//!
//! Several `Kubelet`s may share one API server (one node each): each binds pods to its own
//! node, the first binding wins, and their Unschedulable messages may overwrite each other.

mod check;
mod container;
mod ending;
mod env;
mod hosts;
mod manager;
mod netns;
mod node;
mod pod;
mod probe;
mod process;
mod resources;
mod scheduler;
mod status;
mod token;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Everything the kubelet needs from the plane: the node's identity and address, the bridge,
/// the clients and how to run each image.
pub struct KubeletConfig {
    /// The Node's name, e.g. "plane-node-1".
    pub node_name: String,
    /// The node's own address (the bridge's), InternalIP in NodeStatus and status.hostIP.
    pub node_ip: Ipv4Addr,
    /// The bridge pods' veth ends are attached to (already created and up, holding
    /// node_ip/16).
    pub bridge: String,
    /// Pod addresses are taken from here, in order, and reused once a pod is gone, e.g.
    /// 10.244.1.1 ..= 10.244.255.254. Prefix length of the pod's eth0 is 16, default route
    /// via node_ip.
    pub pod_ips: RangeInclusive<Ipv4Addr>,
    /// The client with the node's identity (client cert CN=system:node:<node_name>,
    /// O=system:nodes): Node, its Lease, pods' status, pod deletion, TokenRequest,
    /// Secrets/ConfigMaps referenced by pods.
    pub node_client: kube::Client,
    /// The client with the scheduler's identity (CN=system:kube-scheduler): pods/binding
    /// only (and the Unschedulable condition through pods/status).
    pub scheduler_client: kube::Client,
    /// The client with kube-proxy's identity (CN=system:kube-proxy, bound to
    /// `system:node-proxier`): Services and EndpointSlices, read only while some namespace
    /// resolves Service names ([`Kubelet::resolve_services`], [`hosts`]).
    pub proxy_client: kube::Client,
    /// The API server's URL as pods reach it (e.g. https://10.244.0.1:PORT), for each pod's
    /// kubeconfig.
    pub server: String,
    /// The cluster CA (PEM), for each pod's kubeconfig.
    pub ca_pem: String,
    /// How to run an image: the image reference without tag or digest ("thaw.test/thaw",
    /// "ghcr.io/knative/helloworld-go") -> the program and leading arguments standing in for
    /// the image's entrypoint, plus extra environment.
    pub images: BTreeMap<String, ImageRun>,
    /// Logs (one file per container), pod kubeconfigs and tokens go under here.
    pub dir: PathBuf,
}

/// What an image runs: its entrypoint (`program` and leading `args`, kept unless the
/// container's `command` replaces the entrypoint) and its environment (`ENV`, below the
/// container's own `env`).
#[derive(Debug, Clone)]
pub struct ImageRun {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The kubelet of one node. Its loops and pods run on the tokio runtime that called
/// [`Kubelet::start`]; [`Kubelet::shutdown`] (or dropping it) kills every process at once.
pub struct Kubelet {
    k: Arc<Shared>,
    /// The node status, Lease, scheduler and pod-watch loops (aborted on shutdown).
    loops: Vec<JoinHandle<()>>,
}

/// The programs the kubelet runs itself, resolved from `PATH` once at start.
struct Tools {
    ip: PathBuf,
    nsenter: PathBuf,
    unshare: PathBuf,
    sleep: PathBuf,
    /// For the bind mount of a pod's hosts file ([`hosts`]).
    mount: PathBuf,
    /// The `PATH` containers get unless their environment sets one.
    path: String,
}

/// One container's log file, for [`Kubelet::dump_logs`].
struct LogEntry {
    /// The pod's order of arrival: dumps list the oldest pods first.
    pod_seq: u64,
    /// "ns/pod/container".
    name: String,
    path: PathBuf,
}

/// A pod's task as the pod watch sees it.
struct PodHandle {
    /// The pod as last seen by the watch (its task follows deletion and readiness gates).
    tx: watch::Sender<Arc<k8s_openapi::api::core::v1::Pod>>,
    /// Cancelled when the pod is gone from the API: the task kills everything at once.
    vanished: CancellationToken,
    task: JoinHandle<()>,
}

/// What every loop and pod task shares.
struct Shared {
    cfg: KubeletConfig,
    tools: Tools,
    /// Cancelled by shutdown: loops stop, pod tasks stop without API calls.
    stop: CancellationToken,
    ips: Mutex<netns::IpPool>,
    /// Every live process (pause and container), id -> pid: shutdown SIGKILLs them all.
    procs: Mutex<BTreeMap<u64, i32>>,
    /// Each running container's current process, "ns/pod/container" -> (run seq, pid), for
    /// [`Kubelet::signal`]; an entry goes when that run's process has been reaped.
    containers: Mutex<BTreeMap<String, (u64, i32)>>,
    next_id: AtomicU64,
    logs: Mutex<Vec<LogEntry>>,
    /// Pods bound here, by UID (kept after their task ends until the API drops them, so a
    /// late watch event cannot start a deleted pod again).
    pods: Mutex<BTreeMap<String, PodHandle>>,
    /// Namespace -> the API server's URL written into the kubeconfig of that namespace's
    /// pods instead of [`KubeletConfig::server`] ([`Kubelet::set_pod_server`]); empty by
    /// default.
    pod_servers: Mutex<BTreeMap<String, String>>,
    /// The namespaces whose pods resolve Service names ([`Kubelet::resolve_services`]).
    dns_namespaces: Mutex<std::collections::BTreeSet<String>>,
    /// The hosts files of those pods, by UID ([`hosts`]).
    hosts: Mutex<BTreeMap<String, hosts::Entry>>,
    /// The Service name lines last computed, for a new pod's first file.
    service_lines: Mutex<String>,
}

/// A process in [`Shared::procs`]; leaves it when dropped (after the process was reaped).
struct Registered {
    k: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.k.procs.lock().unwrap().remove(&self.id);
    }
}

impl Shared {
    fn next(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts `pid` in the registry shutdown kills from.
    fn register(self: &Arc<Self>, pid: i32) -> Registered {
        let id = self.next();
        self.procs.lock().unwrap().insert(id, pid);
        Registered {
            k: self.clone(),
            id,
        }
    }

    /// Records a container's log file (once per file).
    fn log_file(&self, pod_seq: u64, name: String, path: &Path) {
        let mut logs = self.logs.lock().unwrap();
        if !logs.iter().any(|l| l.path == path) {
            logs.push(LogEntry {
                pod_seq,
                name,
                path: path.to_path_buf(),
            });
        }
    }

    /// The API server's URL for the kubeconfig of a pod in `ns`.
    fn server_for(&self, ns: &str) -> String {
        self.pod_servers
            .lock()
            .unwrap()
            .get(ns)
            .cloned()
            .unwrap_or_else(|| self.cfg.server.clone())
    }

    /// Logs a kubelet message on stderr, naming the node.
    fn say(&self, msg: impl std::fmt::Display) {
        eprintln!("kubelet {}: {msg}", self.cfg.node_name);
    }
}

impl Kubelet {
    /// Registers the Node and starts every loop. Returns once the Node exists and is Ready
    /// and its Lease is held.
    ///
    /// Panics when `ip`, `nsenter`, `unshare` or `sleep` is not on `PATH`, when `dir` cannot
    /// be created, or when the Node cannot be registered within a minute (the plane is not
    /// up, or the node's identity is refused): a test cannot go on without its node.
    pub async fn start(config: KubeletConfig) -> Kubelet {
        std::fs::create_dir_all(&config.dir)
            .unwrap_or_else(|e| panic!("kubelet dir {}: {e}", config.dir.display()));
        let tools = Tools::find();
        let ips = netns::IpPool::new(&config.pod_ips, config.node_ip);
        let k = Arc::new(Shared {
            cfg: config,
            tools,
            stop: CancellationToken::new(),
            ips: Mutex::new(ips),
            procs: Mutex::default(),
            containers: Mutex::default(),
            next_id: AtomicU64::new(1),
            logs: Mutex::default(),
            pods: Mutex::default(),
            pod_servers: Mutex::default(),
            dns_namespaces: Mutex::default(),
            hosts: Mutex::default(),
            service_lines: Mutex::default(),
        });
        let registered = node::register(&k).await;
        let mut loops = vec![
            tokio::spawn(node::status_loop(k.clone(), registered.since.clone())),
            tokio::spawn(node::lease_loop(k.clone(), registered.uid.clone())),
        ];
        loops.push(tokio::spawn(scheduler::run(k.clone())));
        loops.push(tokio::spawn(manager::run(k.clone())));
        loops.push(tokio::spawn(hosts::run(k.clone())));
        Kubelet { k, loops }
    }

    /// Every container's log file: "ns/pod/container" and its path, oldest pods first (a
    /// pod's containers in the order they first started). Files are appended to while their
    /// containers run; each start begins with a header line.
    pub fn logs(&self) -> Vec<(String, PathBuf)> {
        let mut logs: Vec<(u64, String, PathBuf)> = self
            .k
            .logs
            .lock()
            .unwrap()
            .iter()
            .map(|l| (l.pod_seq, l.name.clone(), l.path.clone()))
            .collect();
        logs.sort_by_key(|l| l.0);
        logs.into_iter().map(|(_, n, p)| (n, p)).collect()
    }

    /// Every container's log, "ns/pod/container" then the file's text (for a failing test's
    /// output), oldest pods first.
    pub fn dump_logs(&self) -> String {
        let mut out = String::new();
        for (name, path) in self.logs() {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| format!("(reading {}: {e})\n", path.display()));
            let _ = writeln!(out, "===== {name} =====\n{text}");
        }
        out
    }

    /// Sends `signal` to the running process of container `container` of pod `ns/pod`, as
    /// a crash or `kill` inside the container would (the pod stays; no API call). The pod's
    /// task sees the exit and restarts the container as its `restartPolicy` says, with the
    /// kubelet's back-off. `Err` when no such container runs now, or the signal cannot be sent.
    pub fn signal(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        signal: nix::sys::signal::Signal,
    ) -> Result<(), String> {
        let key = format!("{ns}/{pod}/{container}");
        let (_, pid) = self
            .k
            .containers
            .lock()
            .unwrap()
            .get(&key)
            .copied()
            .ok_or_else(|| format!("no running container {key} on this node"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .map_err(|e| format!("{signal} to {key} (pid {pid}): {e}"))
    }

    /// Makes the kubeconfig of every pod of namespace `ns` whose token is written from now on
    /// (a pod started, or its token renewed) name `server` as the API server (e.g. a proxy
    /// in front of it, with a certificate of the plane's CA), or [`KubeletConfig::server`]
    /// again with `None`. Pods already running keep the kubeconfig they have until their
    /// token is renewed: restart them for the change to take.
    pub fn set_pod_server(&self, ns: &str, server: Option<String>) {
        let mut servers = self.k.pod_servers.lock().unwrap();
        match server {
            Some(s) => servers.insert(ns.to_string(), s),
            None => servers.remove(ns),
        };
    }

    /// Makes the pods of namespace `ns` whose sandbox is made from now on resolve Service
    /// names as cluster DNS answers them, and the node proxy every Service's cluster IP to
    /// its ready endpoints ([`hosts`]): a stand-in for the cluster DNS and kube-proxy the
    /// plane lacks, for programs that dial Services by name. Pods already running keep the
    /// node's `/etc/hosts`.
    pub fn resolve_services(&self, ns: &str) {
        self.k.dns_namespaces.lock().unwrap().insert(ns.to_string());
    }

    /// Stops every pod at once (SIGKILL), removes their network namespaces (their pause
    /// processes die with the rest); also done on Drop. Makes no API call: the Pods stay
    /// as they were, the Node's Lease expires. Idempotent.
    pub fn shutdown(&self) {
        self.k.stop.cancel();
        let pids: Vec<i32> = self.k.procs.lock().unwrap().values().copied().collect();
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for t in &self.loops {
            t.abort();
        }
        for h in self.k.pods.lock().unwrap().values() {
            h.task.abort();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Tools {
    /// Resolves the tools from `PATH`; panics naming the missing one.
    fn find() -> Tools {
        let path = std::env::var("PATH").unwrap_or_else(|_| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        });
        let find = |name: &str| -> PathBuf {
            std::env::split_paths(&path)
                .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .unwrap_or_else(|| panic!("kubelet: `{name}` is not on PATH ({path})"))
        };
        Tools {
            ip: find("ip"),
            nsenter: find("nsenter"),
            unshare: find("unshare"),
            sleep: find("sleep"),
            mount: find("mount"),
            path: path.clone(),
        }
    }
}

/// Now as the API's `Time` (RFC 3339, seconds).
fn now_time() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Now as the API's `MicroTime` (RFC 3339 with exactly six fractional digits, which the API
/// server's parser requires).
fn now_micro() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    let secs = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    format!(
        "{}.{:06}Z",
        secs.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_microsecond().max(0)
    )
}

/// The kubelet's container back-off: the first restart is immediate, then 10 s doubling
/// to 5 min (`streak` counts exits in a row; it restarts at 0 after 10 min of running).
fn backoff(streak: u32) -> Duration {
    const BASE: Duration = Duration::from_secs(10);
    const MAX: Duration = Duration::from_secs(300);
    if streak <= 1 {
        return Duration::ZERO;
    }
    (BASE * 2u32.pow((streak - 2).min(8))).min(MAX)
}

/// A short retry delay for API errors: 0.5 s doubling to 8 s.
fn api_retry(attempt: u32) -> Duration {
    (Duration::from_millis(500) * 2u32.pow(attempt.min(4))).min(Duration::from_secs(8))
}

/// Lowercase hex of the SHA-256 of `data`.
fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Whether `e` is the API's 404.
fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
