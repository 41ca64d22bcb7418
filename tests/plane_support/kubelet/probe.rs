//! Probes and preStop hooks as the kubelet runs them: a worker per container run for its
//! startup, readiness and liveness probes (thresholds, periods and delays as the spec says;
//! readiness and liveness wait for the startup probe), each attempt one [`check`].

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::check::{check, http_get};
use super::container::{Event, Probed};

/// Starts the probe worker of run `seq` of container `ctr` (started at `since`, reachable at
/// `ip`). It reports verdicts as they change: Started (startup probe passed), Ready(bool),
/// Unhealthy (startup or liveness failed `failureThreshold` times; it stops then). Failures
/// are appended to `log` when their message changes. Aborted with the run.
pub(super) fn spawn(
    c: Container,
    ip: Ipv4Addr,
    since: Instant,
    ctr: usize,
    seq: u64,
    tx: mpsc::Sender<Event>,
    log: PathBuf,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let send = |news: Probed| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(Event::Probe { ctr, seq, news }).await;
            }
        };
        let note = ProbeLog::new(log);
        let (started_tx, started_rx) = watch::channel(c.startup_probe.is_none());
        let startup = async {
            let Some(p) = &c.startup_probe else { return };
            match until(p, ip, &c, since, &note, "Startup", 1).await {
                Ok(()) => {
                    let _ = started_tx.send(true);
                    send(Probed::Started).await;
                }
                Err(why) => send(Probed::Unhealthy(format!("Startup probe failed: {why}"))).await,
            }
        };
        let readiness = async {
            let Some(p) = &c.readiness_probe else { return };
            let mut started = started_rx.clone();
            if started.wait_for(|s| *s).await.is_err() {
                return;
            }
            tokio::time::sleep_until(since + secs(p.initial_delay_seconds, 0)).await;
            let (mut ready, mut ok_run, mut bad_run) = (false, 0, 0);
            loop {
                match check(p, ip, &c).await {
                    Ok(()) => {
                        (ok_run, bad_run) = (ok_run + 1, 0);
                        if !ready && ok_run >= p.success_threshold.unwrap_or(1) {
                            ready = true;
                            send(Probed::Ready(true)).await;
                        }
                    }
                    Err(why) => {
                        note.failed("Readiness", &why);
                        (ok_run, bad_run) = (0, bad_run + 1);
                        if ready && bad_run >= p.failure_threshold.unwrap_or(3) {
                            ready = false;
                            send(Probed::Ready(false)).await;
                        }
                    }
                }
                tokio::time::sleep(secs(p.period_seconds, 10)).await;
            }
        };
        let liveness = async {
            let Some(p) = &c.liveness_probe else { return };
            let mut started = started_rx.clone();
            if started.wait_for(|s| *s).await.is_err() {
                return;
            }
            if let Err(why) = until(p, ip, &c, since, &note, "Liveness", 0).await {
                send(Probed::Unhealthy(format!(
                    "Container {} failed liveness probe, will be restarted: {why}",
                    c.name
                )))
                .await;
            }
        };
        futures::join!(startup, readiness, liveness);
    })
}

/// Runs probe `p` every period after its initial delay (from `since`) until it has passed
/// `passes` times in a row (`Ok`; 0: never, for liveness) or failed `failureThreshold` times
/// in a row (`Err`, the last failure).
async fn until(
    p: &Probe,
    ip: Ipv4Addr,
    c: &Container,
    since: Instant,
    note: &ProbeLog,
    what: &str,
    passes: i32,
) -> Result<(), String> {
    tokio::time::sleep_until(since + secs(p.initial_delay_seconds, 0)).await;
    let (mut ok_run, mut bad_run) = (0, 0);
    loop {
        match check(p, ip, c).await {
            Ok(()) => {
                (ok_run, bad_run) = (ok_run + 1, 0);
                if passes > 0 && ok_run >= passes {
                    return Ok(());
                }
            }
            Err(why) => {
                note.failed(what, &why);
                (ok_run, bad_run) = (0, bad_run + 1);
                if bad_run >= p.failure_threshold.unwrap_or(3) {
                    return Err(why);
                }
            }
        }
        tokio::time::sleep(secs(p.period_seconds, 10)).await;
    }
}

/// A probe field in seconds (`default` when unset; at least 1 s for periods and timeouts).
pub(super) fn secs(v: Option<i32>, default: i32) -> Duration {
    let s = v.unwrap_or(default).max(0) as u64;
    if default > 0 {
        Duration::from_secs(s.max(1))
    } else {
        Duration::from_secs(s)
    }
}

/// Probe failures appended to the container's log, each time the message changes.
struct ProbeLog {
    path: PathBuf,
    last: std::sync::Mutex<String>,
}

impl ProbeLog {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            last: std::sync::Mutex::default(),
        }
    }

    fn failed(&self, what: &str, why: &str) {
        let line = format!("{what} probe failed: {why}");
        let mut last = self.last.lock().unwrap();
        if *last != line {
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.path) {
                let _ = writeln!(f, "[kubelet {}] {line}", super::now_time());
            }
            *last = line;
        }
    }
}

/// Runs a preStop hook before `deadline`: `sleep` sleeps, `httpGet` is sent (its failure is
/// only logged, as the kubelet does), `exec` is not played. Returns a line for the log.
pub(super) async fn pre_stop(
    h: &LifecycleHandler,
    ip: Ipv4Addr,
    c: &Container,
    deadline: Instant,
) -> String {
    let left = deadline.saturating_duration_since(Instant::now());
    if let Some(s) = &h.sleep {
        let d = Duration::from_secs(s.seconds.max(0) as u64).min(left);
        tokio::time::sleep(d).await;
        return format!("preStop sleep {}s done", d.as_secs());
    }
    if let Some(g) = &h.http_get {
        return match http_get(g, ip, c, left.max(Duration::from_millis(1))).await {
            Ok(()) => "preStop httpGet done".into(),
            Err(e) => format!("preStop httpGet failed: {e}"),
        };
    }
    if h.exec.is_some() {
        return "preStop exec hook not played by the test kubelet (skipped)".into();
    }
    "preStop hook of no known kind (skipped)".into()
}
