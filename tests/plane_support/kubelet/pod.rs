//! One pod's life on the node, in one task: its sandbox (network namespace and address), its
//! kubeconfig, its containers (init containers in order, then the rest at once, restarted
//! as its `restartPolicy` says), its status written whenever it changes, and its end:
//! graceful termination when deleted (preStop, SIGTERM, SIGKILL at the grace period's end,
//! the terminal status, then the Pod deleted with grace 0 and a UID precondition), a
//! terminal phase when its containers are done for good, or everything killed at once when
//! the Pod vanished from the API.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::container::{Ctr, Event, Kind};
use super::netns::Sandbox;
use super::process::StartCtx;
use super::status::{self, Transitions};
use super::{Shared, api_retry, token};

/// Runs pod `rx` (its latest version) until it is deleted and finalised, vanishes, or the
/// kubelet shuts down. `seq` is its order of arrival. A pod first seen finished or deleted
/// is never started: a finished one keeps its status, a deleted one is only deleted.
pub(super) async fn run(
    k: Arc<Shared>,
    mut rx: watch::Receiver<Arc<Pod>>,
    vanished: CancellationToken,
    seq: u64,
) {
    let pod = rx.borrow_and_update().clone();
    let foreign = status::is_terminal(&pod) || pod.metadata.deletion_timestamp.is_some();
    let mut p = PodRun::new(k, pod, seq, foreign);
    loop {
        p.step().await;
        if p.finished {
            return;
        }
        let at = p.next_wake();
        let wake = tokio::select! {
            () = vanished.cancelled() => Wake::Vanished,
            () = p.k.stop.cancelled() => return,
            r = rx.changed() => Wake::Pod(r.is_ok()),
            ev = p.events.recv() => Wake::Event(ev),
            () = tokio::time::sleep_until(at) => Wake::Timer,
        };
        match wake {
            Wake::Vanished => {
                p.kill_now();
                return;
            }
            // The watch's side is gone: with the pod (its handle went with it), or with the
            // kubelet.
            Wake::Pod(false) => {
                if vanished.is_cancelled() {
                    p.kill_now();
                }
                return;
            }
            Wake::Pod(true) => p.pod = rx.borrow_and_update().clone(),
            Wake::Event(Some(ev)) => p.on_event(ev),
            Wake::Event(None) | Wake::Timer => {}
        }
    }
}

enum Wake {
    Vanished,
    Pod(bool),
    Event(Option<Event>),
    Timer,
}

pub(super) struct PodRun {
    pub(super) k: Arc<Shared>,
    pub(super) pod: Arc<Pod>,
    pub(super) seq: u64,
    pub(super) ns: String,
    pub(super) name: String,
    pub(super) uid: String,
    /// The pod's directory: working directory, emptyDir volumes, token and kubeconfig.
    pub(super) dir: PathBuf,
    pub(super) policy: String,
    pub(super) start_time: String,
    /// Never started here: its status is not ours to write.
    pub(super) foreign: bool,
    pub(super) sandbox: Option<Sandbox>,
    pub(super) pod_ip: Option<Ipv4Addr>,
    pub(super) sandbox_due: Instant,
    pub(super) sandbox_failures: u32,
    /// The ServiceAccount whose token the pod gets (see [`token::wanted`]).
    pub(super) token_sa: Option<String>,
    pub(super) kubeconfig: Option<PathBuf>,
    pub(super) token_due: Instant,
    pub(super) token_failures: u32,
    /// Why containers cannot be created yet (sandbox or token), shown in their waiting state.
    pub(super) setup_error: Option<String>,
    pub(super) ctrs: Vec<Ctr>,
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) events: mpsc::Receiver<Event>,
    pub(super) times: Transitions,
    pub(super) written: Option<Value>,
    pub(super) write_due: Instant,
    pub(super) write_failures: u32,
    /// Termination began (deleted, or every container done for good); `true` once every
    /// process it stopped has exited.
    pub(super) terminating: Option<bool>,
    /// Its containers were stopped for good: the phase is terminal, the sandbox gone.
    pub(super) over: bool,
    pub(super) delete_due: Instant,
    pub(super) delete_failures: u32,
    /// Deleted from the API: the task ends.
    pub(super) finished: bool,
}

impl PodRun {
    fn new(k: Arc<Shared>, pod: Arc<Pod>, seq: u64, foreign: bool) -> Self {
        let (ns, name, uid) = (
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid().unwrap_or_default(),
        );
        let dir = k
            .cfg
            .dir
            .join("pods")
            .join(format!("{ns}_{name}_{}", &uid[..uid.len().min(8)]));
        let spec = pod.spec.clone().unwrap_or_default();
        let mut ctrs: Vec<Ctr> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                let sidecar = c.restart_policy.as_deref() == Some("Always");
                Ctr::new(c.clone(), if sidecar { Kind::Sidecar } else { Kind::Init })
            })
            .collect();
        ctrs.extend(
            spec.containers
                .iter()
                .map(|c| Ctr::new(c.clone(), Kind::Main)),
        );
        let (tx, events) = mpsc::channel(64);
        let now = Instant::now();
        Self {
            times: Transitions::from_pod(&pod),
            token_sa: token::wanted(&pod),
            policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".into()),
            start_time: super::now_time(),
            k,
            pod,
            seq,
            ns,
            name,
            uid,
            dir,
            foreign,
            sandbox: None,
            pod_ip: None,
            sandbox_due: now,
            sandbox_failures: 0,
            kubeconfig: None,
            token_due: now,
            token_failures: 0,
            setup_error: None,
            ctrs,
            tx,
            events,
            written: None,
            write_due: now,
            write_failures: 0,
            terminating: foreign.then_some(true),
            over: foreign,
            delete_due: now,
            delete_failures: 0,
            finished: false,
        }
    }

    pub(super) fn say(&self, msg: impl std::fmt::Display) {
        self.k
            .say(format_args!("pod {}/{}: {msg}", self.ns, self.name));
    }

    /// Whether containers are being run (not terminating, not over).
    fn active(&self) -> bool {
        self.terminating.is_none() && !self.over
    }

    /// Whether containers can be started: sandbox up and, if wanted, a kubeconfig.
    fn ready_to_start(&self) -> bool {
        self.active()
            && self.sandbox.is_some()
            && (self.token_sa.is_none() || self.kubeconfig.is_some())
    }

    /// The containers whose turn it is: init containers (and sidecars) in order up to the
    /// first not done (not started), then, once all are, the containers.
    fn eligible(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, c) in self.ctrs.iter().enumerate() {
            out.push(i);
            let passed = match c.kind {
                Kind::Init => c.done,
                Kind::Sidecar => c.ever_started,
                Kind::Main => true,
            };
            if !passed {
                break;
            }
        }
        out
    }

    /// Everything due now, then the status if it changed.
    async fn step(&mut self) {
        let now = Instant::now();
        if self.pod.metadata.deletion_timestamp.is_some() && self.terminating.is_none() {
            let spec = self.pod.spec.as_ref();
            let grace = self
                .pod
                .metadata
                .deletion_grace_period_seconds
                .or(spec.and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30);
            self.begin_termination(Duration::from_secs(grace.max(0) as u64));
        }
        if self.active() && self.sandbox.is_none() && self.sandbox_due <= now {
            self.make_sandbox().await;
        }
        if self.active()
            && self.sandbox.is_some()
            && self.token_due <= now
            && let Some(sa) = self.token_sa.clone()
        {
            self.renew_token(&sa).await;
        }
        if self.ready_to_start() {
            self.start_due().await;
        }
        // Every container done for good (restartPolicy Never/OnFailure, or an init container
        // failed under Never): the rest (sidecars) is stopped and the pod is over.
        if self.active() {
            let init = status::initialized(&self.ctrs);
            let phase = status::phase(&self.ctrs, &self.policy, false, init);
            let mains_done = self
                .ctrs
                .iter()
                .filter(|c| c.kind == Kind::Main)
                .all(|c| c.term.is_some());
            if phase == "Failed" || phase == "Succeeded" || (mains_done && self.policy != "Always")
            {
                let grace = self
                    .pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                self.begin_termination(Duration::from_secs(grace.unwrap_or(30).max(0) as u64));
            }
        }
        if self.terminating == Some(true) && !self.over && self.ctrs.iter().all(|c| c.run.is_none())
        {
            for c in &mut self.ctrs {
                c.settle();
            }
            self.over = true;
        }
        if self.over {
            // The pause process goes with the containers; the address is free again.
            self.sandbox = None;
        }
        self.write_status().await;
        if self.over
            && self.pod.metadata.deletion_timestamp.is_some()
            && self.delete_due <= Instant::now()
        {
            self.delete().await;
        }
    }

    /// When something falls due (a start, a retry), at most 5 s away, at least 20 ms.
    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let mut at = now + Duration::from_secs(5);
        if self.ready_to_start() {
            for i in self.eligible() {
                if let Some(d) = self.ctrs[i].due.filter(|_| self.ctrs[i].run.is_none()) {
                    at = at.min(d);
                }
            }
        }
        if self.active() && self.sandbox.is_none() {
            at = at.min(self.sandbox_due);
        }
        if self.active() && self.token_sa.is_some() {
            at = at.min(self.token_due);
        }
        if self.write_failures > 0 {
            at = at.min(self.write_due);
        }
        if self.over && self.pod.metadata.deletion_timestamp.is_some() {
            at = at.min(self.delete_due);
        }
        at.max(now + Duration::from_millis(20))
    }

    async fn make_sandbox(&mut self) {
        let _ = std::fs::create_dir_all(&self.dir);
        let resolves = self.k.dns_namespaces.lock().unwrap().contains(&self.ns);
        let hosts_path = self.dir.join("etc-hosts");
        let hosts =
            resolves.then_some((self.uid.as_str(), hosts_path.as_path(), self.name.as_str()));
        match Sandbox::create(&self.k, hosts).await {
            Ok(sb) => {
                self.pod_ip = Some(sb.ip);
                self.sandbox = Some(sb);
                self.setup_error = None;
                // emptyDir volumes: a directory each. Nothing is mounted (no mount namespace
                // per pod): containers that mount one see the host's filesystem there.
                for v in self
                    .pod
                    .spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                {
                    if v.empty_dir.is_some() {
                        let _ = std::fs::create_dir_all(self.dir.join("volumes").join(&v.name));
                    }
                }
                let _ = std::fs::create_dir_all(&self.dir);
            }
            Err(e) => {
                self.sandbox_failures += 1;
                self.say(format_args!("sandbox: {e}"));
                self.setup_error = Some(format!("Failed to create pod sandbox: {e}"));
                self.sandbox_due = Instant::now() + api_retry(self.sandbox_failures);
            }
        }
    }

    async fn renew_token(&mut self, sa: &str) {
        match token::refresh(&self.k, &self.pod, &self.dir, sa).await {
            Ok((path, renew_in)) => {
                self.kubeconfig = Some(path);
                self.token_due = Instant::now() + renew_in;
                self.token_failures = 0;
                self.setup_error = None;
            }
            Err(e) => {
                self.token_failures += 1;
                self.say(format_args!("token: {e}"));
                if self.kubeconfig.is_none() {
                    self.setup_error = Some(format!(
                        "MountVolume.SetUp failed for volume \"kube-api-access\": {e}"
                    ));
                }
                self.token_due = Instant::now() + api_retry(self.token_failures);
            }
        }
    }

    async fn start_due(&mut self) {
        let Some(sb) = &self.sandbox else { return };
        let cx = StartCtx {
            k: &self.k,
            pod: &self.pod,
            pod_seq: self.seq,
            sandbox_pid: sb.pid,
            mount_ns: sb.mount_ns,
            pod_ip: sb.ip,
            dir: &self.dir,
            kubeconfig: self.kubeconfig.as_deref(),
            tx: &self.tx,
        };
        // Recomputed after each start: an init container done at once opens the next.
        for i in 0..self.ctrs.len() {
            let mut eligible = true;
            for c in &self.ctrs[..i] {
                eligible &= match c.kind {
                    Kind::Init => c.done,
                    Kind::Sidecar => c.ever_started,
                    Kind::Main => true,
                };
            }
            if eligible && self.ctrs[i].is_due(Instant::now()) {
                let before = self.ctrs[i].waiting.clone();
                self.ctrs[i].start(i, &cx).await;
                // A failed start is logged when its reason or message changes (a retry of the
                // same failure every 2 s would flood the output).
                if let Some((reason, message)) = &self.ctrs[i].waiting
                    && before.as_ref() != self.ctrs[i].waiting.as_ref()
                {
                    let c = &self.ctrs[i].spec.name;
                    self.k.say(format_args!(
                        "pod {}/{}: container {c}: {reason}: {message}",
                        self.ns, self.name
                    ));
                }
            }
        }
    }
}
