//! A container's process: started in the pod's network namespace through `nsenter`, reaped
//! by a task that reports its exit, stopped as the kubelet stops one (SIGTERM, then SIGKILL
//! after the grace period).

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::container::{Event, Kind};
use super::env::{self, Failure};
use super::{Shared, now_time, probe};

/// A running process.
pub(super) struct Run {
    pub(super) seq: u64,
    pub(super) pid: i32,
    pub(super) started_at: String,
    pub(super) since: Instant,
    pub(super) container_id: String,
    /// The startup probe passed (or there is none).
    pub(super) started: bool,
    pub(super) ready: bool,
    /// Cancelled once the process has exited and been reaped (signals stop then).
    pub(super) exited: CancellationToken,
    /// A stop (liveness failure or pod termination) began: no second one.
    pub(super) stopping: bool,
    /// Why the kubelet killed it, for the exit's message.
    pub(super) kill_reason: Option<String>,
    probes: JoinHandle<()>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.probes.abort();
    }
}

/// What starting a container needs from its pod.
pub(super) struct StartCtx<'a> {
    pub(super) k: &'a Arc<Shared>,
    pub(super) pod: &'a Pod,
    /// The pod's order of arrival (log dumps list oldest pods first).
    pub(super) pod_seq: u64,
    pub(super) sandbox_pid: i32,
    /// The sandbox has a mount namespace of its own ([`super::hosts`]): containers enter it.
    pub(super) mount_ns: bool,
    pub(super) pod_ip: Ipv4Addr,
    /// The pod's own directory (working directory unless `workingDir` exists on the host).
    pub(super) dir: &'a Path,
    pub(super) kubeconfig: Option<&'a Path>,
    pub(super) tx: &'a mpsc::Sender<Event>,
}

/// Starts container `c` (of `kind`; its `attempt`-th start) as process `idx` of the pod:
/// `nsenter` into the pod's network namespace, then the image's program with the
/// container's arguments and exactly the environment the runtime would give it (the rest of
/// the test's environment cleared), output appended to its log. Its exit and its probes'
/// verdicts come as [`Event`]s. `Err` is why it could not start (the waiting reason).
pub(super) async fn spawn(
    c: &Container,
    kind: Kind,
    attempt: i32,
    idx: usize,
    cx: &StartCtx<'_>,
) -> Result<Run, Failure> {
    let image = c.image.clone().unwrap_or_default();
    let repo = env::repository(&image);
    let run = cx.k.cfg.images.get(repo).ok_or_else(|| Failure {
        reason: "ErrImagePull",
        message: format!("Failed to pull image {image:?}: the plane maps no program to {repo:?}"),
    })?;
    let kenv = tokio::time::timeout(
        Duration::from_secs(15),
        env::kubelet_env(
            &cx.k.cfg.node_client,
            cx.pod,
            c,
            cx.pod_ip,
            cx.k.cfg.node_ip,
        ),
    )
    .await
    .map_err(|_| Failure {
        reason: "CreateContainerConfigError",
        message: "timed out reading the container's ConfigMaps and Secrets".into(),
    })??;
    let args = env::argv(run, c, &kenv.0)?;
    if !run.program.is_file() {
        return Err(Failure {
            reason: "RunContainerError",
            message: format!(
                "the image's program {} does not exist",
                run.program.display()
            ),
        });
    }
    // The runtime's order: HOSTNAME, then the image's ENV, then the container's env.
    // KUBECONFIG stands in for the token volume (mounted before the container's env applies).
    let mut penv = env::Env::default();
    penv.set("HOSTNAME", cx.pod.name_any());
    for (k, v) in &run.env {
        penv.set(k, v.clone());
    }
    if let Some(kc) = cx.kubeconfig {
        penv.set("KUBECONFIG", kc.display().to_string());
    }
    for (k, v) in kenv.0 {
        penv.set(&k, v);
    }
    if !penv.0.iter().any(|(n, _)| n == "PATH") {
        penv.set("PATH", cx.k.tools.path.clone());
    }
    let (log_path, log) = open_log(cx, c, &run.program, &args, attempt).map_err(|e| Failure {
        reason: "RunContainerError",
        message: e,
    })?;
    let workdir = c
        .working_dir
        .as_deref()
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| cx.dir.to_path_buf());
    let err_log = log.try_clone().map_err(|e| Failure {
        reason: "RunContainerError",
        message: e.to_string(),
    })?;
    // Entering a mount namespace moves the working directory to its root: `--wd` takes it
    // back (the same directory: the namespace's mounts are a copy of the node's).
    let mount = cx
        .mount_ns
        .then(|| ["--mount".to_string(), format!("--wd={}", workdir.display())]);
    let mut child = tokio::process::Command::new(&cx.k.tools.nsenter)
        .arg("--target")
        .arg(cx.sandbox_pid.to_string())
        .arg("--net")
        .args(mount.iter().flatten())
        .arg("--")
        .arg(&run.program)
        .args(&args)
        .env_clear()
        .envs(penv.0)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure {
            reason: "RunContainerError",
            message: e.to_string(),
        })?;
    let Some(pid) = child.id() else {
        return Err(Failure {
            reason: "RunContainerError",
            message: "the process exited before it could be tracked".into(),
        });
    };
    let pid = pid as i32;
    let registered = cx.k.register(pid);
    let seq = cx.k.next();
    let key = format!(
        "{}/{}/{}",
        cx.pod.namespace().unwrap_or_default(),
        cx.pod.name_any(),
        c.name
    );
    cx.k.containers
        .lock()
        .unwrap()
        .insert(key.clone(), (seq, pid));
    let uid = cx.pod.uid().unwrap_or_default();
    let container_id = super::sha256_hex(format!("{uid}/{}/{pid}/{seq}", c.name).as_bytes());
    let exited = CancellationToken::new();
    let (tx, done, k) = (cx.tx.clone(), exited.clone(), cx.k.clone());
    tokio::spawn(async move {
        let code = match child.wait().await {
            Ok(st) => {
                use std::os::unix::process::ExitStatusExt;
                st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9))
            }
            Err(_) => 128 + 9,
        };
        {
            let mut containers = k.containers.lock().unwrap();
            if containers.get(&key).is_some_and(|(s, _)| *s == seq) {
                containers.remove(&key);
            }
        }
        done.cancel();
        drop(registered);
        let ev = Event::Exited {
            ctr: idx,
            seq,
            code,
            finished_at: now_time(),
        };
        let _ = tx.send(ev).await;
    });
    let since = Instant::now();
    let probes = probe::spawn(
        c.clone(),
        cx.pod_ip,
        since,
        idx,
        seq,
        cx.tx.clone(),
        log_path,
    );
    let started = c.startup_probe.is_none();
    Ok(Run {
        seq,
        pid,
        started_at: now_time(),
        since,
        container_id,
        started,
        ready: started && c.readiness_probe.is_none() && kind != Kind::Init,
        exited,
        stopping: false,
        kill_reason: None,
        probes,
    })
}

/// Stops a process as the kubelet does: SIGTERM, then SIGKILL if it has not exited within
/// `grace` (signals are sent only while `exited` is not cancelled); returns once it exited or
/// 5 s after the SIGKILL.
pub(super) async fn stop(pid: i32, exited: CancellationToken, grace: Duration) {
    if !exited.is_cancelled() {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, exited.cancelled())
        .await
        .is_ok()
    {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let _ = tokio::time::timeout(Duration::from_secs(5), exited.cancelled()).await;
}

/// Opens (appends to) the container's log and writes the start's header line.
fn open_log(
    cx: &StartCtx<'_>,
    c: &Container,
    program: &Path,
    args: &[String],
    attempt: i32,
) -> Result<(PathBuf, std::fs::File), String> {
    let ns = cx.pod.namespace().unwrap_or_default();
    let name = cx.pod.name_any();
    let uid = cx.pod.uid().unwrap_or_default();
    let dir = cx.k.cfg.dir.join("logs");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!(
        "{ns}_{name}_{}_{}.log",
        &uid[..uid.len().min(8)],
        c.name
    ));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = writeln!(
        f,
        "----- {} start #{attempt} of {ns}/{name}/{}: {} {args:?} -----",
        now_time(),
        c.name,
        program.display()
    );
    cx.k.log_file(cx.pod_seq, format!("{ns}/{name}/{}", c.name), &path);
    Ok((path, f))
}
