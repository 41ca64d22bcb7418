//! The local process platform: each replica is a child process on a loopback port.
//!
//! [`LocalPlatform`] implements [`Platform`]: revisions are registered with
//! [`LocalPlatform::upsert`] (their command, environment and readiness probe), scaled with
//! [`Platform::scale`], and publish full [`EndpointSnapshot`]s on a watch per revision.
//!
//! # Replica life
//! - **Start.** The command runs with `PORT` set to its declared port
//!   ([`LocalRevision::port`]) when that is free, else to a free loopback port (picked by binding
//!   `127.0.0.1:0` and releasing it) and `K_REVISION` set, in its own process group (a
//!   terminal's Ctrl-C reaches thaw, not the replicas), stdin closed, SIGKILLed if its handle
//!   drops. A first word `thaw` runs [`LocalOptions::thaw_exe`], so nothing needs to be on
//!   `PATH`. If it exits before ready and its port turns out to be held by someone else, it is
//!   started again on a new port (at most [`LocalOptions::max_port_retries`] times).
//! - **Ready** when it accepts a TCP connection, or when `GET readiness_path` answers 2xx;
//!   probed with exponential backoff from 250 us, capped at 1 ms early and at 5 % of the time
//!   spent starting later (at most 25 ms; [`ProbeOptions`]), bounded
//!   by [`LocalOptions::startup_timeout`] (past it the process is killed and counted as a
//!   crash). The spawn-to-ready time goes to `thaw_platform_replica_startup_seconds` and
//!   [`RevisionStatus::last_startup`].
//! - **Output** (stdout at INFO, stderr at WARN) goes to the [`LogSink`] line by line, tagged
//!   with revision and replica, cut at [`LogLimits::max_line_bytes`] and rate-bounded per
//!   stream with a "suppressed K lines" summary.
//! - **Scale down** stops backing-off and starting replicas first, then the newest ready ones.
//!   A ready replica's endpoint moves from `ready` to `terminating` (published) first; its
//!   process gets SIGTERM (to the whole group) once [`EndpointSource::drained`] is called for
//!   it or after the drain bound, and SIGKILL after [`LocalOptions::kill_grace`].
//! - **Unexpected exit**: the endpoint leaves the snapshot and a replacement starts after
//!   [`RestartPolicy`] backoff (100 ms doubling to 10 s). After `crash_limit` exits in a row
//!   with no replica becoming ready, the revision's status is `Failing` with the last exit
//!   (e.g. `replicas keep crashing: exit status 1 (last output: 'boom')`); it returns to `Ok`
//!   when a replica becomes ready, and on `scale(rev, 0)`.
//!
//! # Shutdown, and when thaw itself dies
//! [`LocalPlatform::shutdown`] stops every replica (SIGTERM, SIGKILL after the grace) and
//! returns once all are reaped; the binary calls it on SIGINT/SIGTERM, so no replica outlives
//! thaw then. If thaw is **SIGKILLed** (or crashes hard) it gets no chance to signal: replicas
//! live in their own process groups, so they survive it, reparented to init (or the nearest
//! subreaper). Mitigations: `kill_on_drop` covers every exit path that unwinds or drops the
//! runtime; `thaw sample-app` polls `getppid()` every second and exits when its parent
//! changes. Linux's `PR_SET_PDEATHSIG` would cover any program, but it must be set between
//! fork and exec (`pre_exec`), which needs `unsafe` and the crate forbids `unsafe` code.
//! Programs other than the sample app should watch their parent or stdin themselves.

mod logs;
mod policy;
mod probe;
mod process;
mod replica;
mod slots;
mod state;
mod status;

pub use logs::{LogLimits, LogSink, Stream, TracingLogSink};
pub use policy::RestartPolicy;
pub use probe::ProbeOptions;
pub use process::pick_free_port;
pub use status::{ReplicaState, ReplicaStatus, RevisionStatus};

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::platform::{BoxFuture, EndpointSnapshot, EndpointSource, Platform, PlatformError};
use crate::revision::{Protocol, RevisionKey};
use crate::telemetry::platform::PlatformMetrics;
use state::RevisionEntry;

/// How a revision's replicas are run: what the platform needs beyond its [`RevisionKey`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRevision {
    /// The revision these processes serve (also `K_REVISION` in their environment).
    pub key: RevisionKey,
    /// Program and arguments. A first word `thaw` runs [`LocalOptions::thaw_exe`]. Empty: every
    /// start fails, so the revision goes `Failing`.
    pub command: Vec<String>,
    /// Added to thaw's own environment (then `PORT` and `K_REVISION` are set).
    pub env: Vec<(String, String)>,
    /// `None`: ready when the port accepts TCP. `Some(path)`: ready when `GET path` is 2xx.
    pub readiness_path: Option<String>,
    /// `Some(service)`: ready when `grpc.health.v1.Health/Check` for `service` (`""`: the
    /// server) answers SERVING over h2c; wins over `readiness_path`.
    pub readiness_grpc: Option<String>,
    /// Protocol of the HTTP readiness probe (h2c with prior knowledge, or HTTP/1.1).
    pub protocol: Protocol,
    /// Working directory of the process; thaw's own if `None`.
    pub working_dir: Option<PathBuf>,
    /// Overrides [`LocalOptions::drain_timeout`] (e.g. the revision's request timeout).
    pub drain_timeout: Option<Duration>,
    /// Overrides [`LocalOptions::startup_timeout`] (e.g. the revision's progress deadline).
    pub startup_timeout: Option<Duration>,
    /// The container's declared port (`containerPort`): a replica gets it as `PORT` when it is
    /// free. When another replica holds it (a second replica, or the previous revision during a
    /// roll-out: replicas share the loopback interface, pods would not), the replica gets a free
    /// port instead and that is logged. `None`: always a free port.
    pub port: Option<u16>,
}

impl LocalRevision {
    /// A revision running `command` (program first), TCP readiness, no extra environment.
    pub fn new<S: Into<String>>(key: RevisionKey, command: impl IntoIterator<Item = S>) -> Self {
        Self {
            key,
            command: command.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            readiness_path: None,
            readiness_grpc: None,
            protocol: Protocol::Http1,
            working_dir: None,
            drain_timeout: None,
            startup_timeout: None,
            port: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Probes readiness with `GET path` instead of a TCP connect.
    pub fn readiness_path(mut self, path: impl Into<String>) -> Self {
        self.readiness_path = Some(path.into());
        self
    }
}

/// Picks a loopback port for a new replica (see [`pick_free_port`], the default).
pub type PortPicker = Arc<dyn Fn() -> io::Result<u16> + Send + Sync>;

/// Settings of the platform, fixed at construction.
#[derive(Clone)]
pub struct LocalOptions {
    /// What a command's first word `thaw` runs. Default: this executable (`current_exe`).
    pub thaw_exe: PathBuf,
    /// Longest wait for `drained` after an endpoint moved to `terminating` (default 30 s).
    pub drain_timeout: Duration,
    /// SIGTERM to SIGKILL (default 10 s).
    pub kill_grace: Duration,
    /// Spawn to ready, past which the process is killed and counted as a crash (default 60 s).
    pub startup_timeout: Duration,
    /// Backoff of replacements and when a revision counts as failing.
    pub restart: RestartPolicy,
    /// New ports tried for one start whose port was taken meanwhile (default 5).
    pub max_port_retries: u32,
    /// Readiness probe backoff and per-attempt bound.
    pub probe: ProbeOptions,
    /// Rate and length bounds of replica output.
    pub log_limits: LogLimits,
    /// Where replica output goes (default: [`TracingLogSink`]).
    pub log_sink: Arc<dyn LogSink>,
    /// How a replica's port is chosen (default: [`pick_free_port`]; tests inject races).
    pub port_picker: PortPicker,
    /// thaw's own ports and what each is (`"thaw's data port (--listen)"`): a `containerPort`
    /// equal to one is named as such when its replica is given another port.
    pub own_ports: Vec<(u16, &'static str)>,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self {
            thaw_exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("thaw")),
            drain_timeout: Duration::from_secs(30),
            kill_grace: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(60),
            restart: RestartPolicy::default(),
            max_port_retries: 5,
            probe: ProbeOptions::default(),
            log_limits: LogLimits::default(),
            log_sink: Arc::new(TracingLogSink),
            port_picker: Arc::new(pick_free_port),
            own_ports: Vec::new(),
        }
    }
}

impl fmt::Debug for LocalOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalOptions")
            .field("thaw_exe", &self.thaw_exe)
            .field("drain_timeout", &self.drain_timeout)
            .field("kill_grace", &self.kill_grace)
            .field("startup_timeout", &self.startup_timeout)
            .field("restart", &self.restart)
            .field("max_port_retries", &self.max_port_retries)
            .field("probe", &self.probe)
            .field("log_limits", &self.log_limits)
            .finish_non_exhaustive()
    }
}

/// Child processes on loopback ports. Cheap to clone (one shared state).
///
/// Must be used inside a tokio runtime. Every replica is owned by a supervisor task; dropping
/// the platform does not stop them (call [`LocalPlatform::shutdown`]), but a dropped runtime
/// SIGKILLs every replica process through `kill_on_drop`.
#[derive(Clone)]
pub struct LocalPlatform {
    inner: Arc<Inner>,
}

struct Inner {
    opts: Arc<LocalOptions>,
    metrics: PlatformMetrics,
    /// Every revision seen (registered, scaled, or subscribed to). Entries stay after removal
    /// so subscribers keep the `Failing` reason; bounded by the revisions ever defined.
    revisions: DashMap<RevisionKey, Arc<RevisionEntry>>,
    /// Set first thing in shutdown; checked under each revision's lock before slots are
    /// created, so a `scale` racing with shutdown either starts nothing or starts slots that
    /// shutdown's sweep (which takes the same lock afterwards) stops.
    shutting_down: AtomicBool,
    /// Cloned into every supervisor task; `None` once shutdown began.
    tasks: Mutex<Option<mpsc::Sender<()>>>,
    /// Yields `None` once every supervisor task has ended.
    tasks_done: tokio::sync::Mutex<mpsc::Receiver<()>>,
}

impl fmt::Debug for LocalPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalPlatform")
            .field("opts", &self.inner.opts)
            .field("revisions", &self.inner.revisions.len())
            .finish_non_exhaustive()
    }
}

impl LocalPlatform {
    /// A platform with no revisions. `metrics` are the registered families
    /// (`Telemetry::platform`).
    pub fn new(opts: LocalOptions, metrics: PlatformMetrics) -> Self {
        let (tx, rx) = mpsc::channel(1);
        Self {
            inner: Arc::new(Inner {
                opts: Arc::new(opts),
                metrics,
                revisions: DashMap::new(),
                shutting_down: AtomicBool::new(false),
                tasks: Mutex::new(Some(tx)),
                tasks_done: tokio::sync::Mutex::new(rx),
            }),
        }
    }

    fn entry(&self, key: &RevisionKey) -> Arc<RevisionEntry> {
        if let Some(e) = self.inner.revisions.get(key) {
            return e.clone();
        }
        self.inner
            .revisions
            .entry(key.clone())
            .or_insert_with(|| Arc::new(RevisionEntry::new(key.clone(), &self.inner.metrics)))
            .clone()
    }

    /// Registers or updates a revision's definition. Running replicas keep the definition they
    /// were started with; new and replacement processes use the latest. Re-registering a
    /// removed revision makes it scalable again (status `Ok`).
    pub fn upsert(&self, def: LocalRevision) {
        let entry = self.entry(&def.key);
        entry.update(|st| {
            st.def = Some(Arc::new(def));
            st.removed = None;
        });
    }

    /// Removes a revision: every replica is stopped (ready ones drain first, as on scale down)
    /// and the snapshot's status becomes `Failing { "revision removed: {reason}" }`, so held
    /// requests are answered 503 with that reason. Later `scale` calls above 0 fail with
    /// `UnknownRevision` until it is upserted again. Unknown revisions: no-op.
    pub fn remove(&self, key: &RevisionKey, reason: &str) {
        let Some(entry) = self.inner.revisions.get(key).map(|e| e.clone()) else {
            return;
        };
        tracing::info!(revision = %key, reason, "removing revision");
        entry.update(|st| {
            st.def = None;
            st.removed = Some(format!("revision removed: {reason}").into());
            st.set_desired(0);
            st.reconcile(false);
        });
    }

    /// The revision's replicas right now; `None` if the platform has never seen it.
    pub fn status(&self, key: &RevisionKey) -> Option<RevisionStatus> {
        self.inner.revisions.get(key).map(|e| e.status())
    }

    /// Every revision the platform has seen.
    pub fn revisions(&self) -> Vec<RevisionKey> {
        self.inner
            .revisions
            .iter()
            .map(|e| e.key().clone())
            .collect()
    }

    /// Stops every replica of every revision (SIGTERM, SIGKILL after the kill grace; no
    /// drain wait: the activator drains before this is called) and returns once every process
    /// is reaped. Bounded by about twice the kill grace. Afterwards `scale` fails; calling it
    /// again returns once the first call's work is done.
    pub async fn shutdown(&self) {
        async {
            self.inner.shutting_down.store(true, Ordering::SeqCst);
            let guard = self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            drop(guard);
            for e in self.inner.revisions.iter() {
                e.update(|st| st.stop_all_now());
            }
            let mut done = self.inner.tasks_done.lock().await;
            while done.recv().await.is_some() {}
            tracing::info!("every replica stopped");
        }
        .instrument(tracing::info_span!("platform_shutdown"))
        .await
    }

    fn task_guard(&self) -> Option<mpsc::Sender<()>> {
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn scale_now(&self, key: &RevisionKey, replicas: u32) -> Result<(), PlatformError> {
        let Some(entry) = self.inner.revisions.get(key).map(|e| e.clone()) else {
            return if replicas == 0 {
                Ok(())
            } else {
                Err(PlatformError::UnknownRevision(key.clone()))
            };
        };
        let guard = self.task_guard();
        let created = entry.update(|st| {
            if st.def.is_none() && replicas > 0 {
                return Err(PlatformError::UnknownRevision(key.clone()));
            }
            let closed = guard.is_none() || self.inner.shutting_down.load(Ordering::SeqCst);
            if closed && replicas > 0 {
                return Err(PlatformError::Scale {
                    revision: key.clone(),
                    reason: "the platform is shutting down".into(),
                });
            }
            if st.desired != replicas {
                tracing::info!(revision = %key, from = st.desired, to = replicas, "scaling");
            }
            st.set_desired(replicas);
            Ok(st.reconcile(!closed))
        })?;
        if let Some(guard) = guard {
            for (index, stop) in created {
                tokio::spawn(replica::supervise(
                    self.inner.opts.clone(),
                    entry.clone(),
                    index,
                    stop,
                    guard.clone(),
                ));
            }
        }
        Ok(())
    }
}

impl EndpointSource for LocalPlatform {
    fn endpoints(&self, revision: &RevisionKey) -> watch::Receiver<Arc<EndpointSnapshot>> {
        self.entry(revision).subscribe()
    }

    fn drained(&self, revision: &RevisionKey, addr: SocketAddr) {
        if let Some(e) = self.inner.revisions.get(revision) {
            e.drained(addr);
        }
    }

    /// A terminating replica waits for the activator's report (up to the drain bound).
    fn needs_drain_reports(&self) -> bool {
        true
    }
}

impl Platform for LocalPlatform {
    /// Accepted at once: new replicas start in the background, surplus ones begin to drain.
    /// Fails with `UnknownRevision` when asked for replicas of a revision never upserted (or
    /// removed), and with `Scale` after shutdown began. Scaling to 0 always succeeds.
    fn scale(
        &self,
        revision: &RevisionKey,
        replicas: u32,
    ) -> BoxFuture<'_, Result<(), PlatformError>> {
        let revision = revision.clone();
        // Inside the future: supervisors are spawned on the runtime that polls it.
        Box::pin(async move { self.scale_now(&revision, replicas) })
    }
}

// The integrator holds the platform as `Arc<dyn Platform>` beside the activator and scaler.
const _: fn(LocalPlatform) -> Arc<dyn Platform> = |p| Arc::new(p);
