//! A replica slot's supervisor: spawn (retrying a taken port), probe until ready, serve, and
//! replace the process with backoff when it exits on its own, until told to stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::probe::{self, ProbeKind};
use super::process::{self, SpawnContext, Spawned};
use super::state::{RevisionEntry, StopSignal};
use super::{LocalOptions, LocalRevision, policy};
use crate::telemetry::platform::ExitReason;

/// Held by every supervisor task; shutdown waits until all are dropped.
pub(crate) type TaskGuard = mpsc::Sender<()>;

/// How one process of a slot ended.
enum Ended {
    /// Told to stop: the slot is done.
    Stopped,
    /// Ended on its own (or never started); replace it after backoff. `ready_for` is how long
    /// it had been ready (`None`: never ready).
    Failed { ready_for: Option<Duration> },
}

/// Runs slot `index` of `entry` until its stop signal says so; then removes the slot.
/// Every process it starts is stopped (SIGTERM, SIGKILL after the grace) before it returns.
pub(crate) async fn supervise(
    opts: Arc<LocalOptions>,
    entry: Arc<RevisionEntry>,
    index: u32,
    mut stop: watch::Receiver<StopSignal>,
    _guard: TaskGuard,
) {
    let span = tracing::info_span!("replica", revision = %entry.key, replica = index);
    async {
        let mut attempt: u32 = 0;
        loop {
            if *stop.borrow() != StopSignal::Run {
                break;
            }
            let Some(def) = entry.definition() else {
                break;
            };
            match run_process(&opts, &entry, index, &def, &mut stop).await {
                Ended::Stopped => break,
                Ended::Failed { ready_for } => {
                    if ready_for.is_some_and(|d| d >= opts.restart.max_backoff) {
                        attempt = 0;
                    }
                    attempt = attempt.saturating_add(1);
                    let delay = opts.restart.backoff(attempt);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stopped(&mut stop) => break,
                    }
                    tracing::info!(?delay, attempt, "starting a replacement replica");
                    entry.slot_restarting(index);
                }
            }
        }
        entry.slot_gone(index);
    }
    .instrument(span)
    .await
}

/// What happened while waiting for a process to become ready.
enum Startup {
    Ready(Duration),
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Stop,
}

/// Starts one process for the slot and follows it to its end.
async fn run_process(
    opts: &LocalOptions,
    entry: &RevisionEntry,
    index: u32,
    def: &LocalRevision,
    stop: &mut watch::Receiver<StopSignal>,
) -> Ended {
    let cx = SpawnContext {
        def,
        thaw_exe: &opts.thaw_exe,
        replica: index,
        sink: &opts.log_sink,
        limits: opts.log_limits,
    };
    let kind = match (&def.readiness_grpc, &def.readiness_path) {
        (Some(service), _) => ProbeKind::Grpc {
            service: service.clone(),
        },
        (None, None) => ProbeKind::Tcp,
        (None, Some(path)) => ProbeKind::Http {
            path: path.clone(),
            protocol: def.protocol,
        },
    };
    let mut port_retries = 0;
    let (mut p, startup) = loop {
        let port = match def.port {
            Some(port) if port_retries == 0 && process::port_free(port) => Ok(port),
            Some(port) => {
                let picked = (opts.port_picker)();
                let own = opts.own_ports.iter().find(|(p, _)| *p == port);
                match (&picked, own) {
                    (Ok(other), Some((_, what))) => tracing::warn!(
                        container_port = port,
                        port = other,
                        "containerPort {port} is {what}; this replica gets PORT={other} (give \
                         the container another containerPort, or thaw another port)"
                    ),
                    (Ok(other), None) => tracing::info!(
                        container_port = port,
                        port = other,
                        "containerPort {port} is held by another process (another replica of \
                         this revision, or of the previous one while it drains); this replica \
                         gets PORT={other}"
                    ),
                    (Err(_), _) => {}
                }
                picked
            }
            None => (opts.port_picker)(),
        };
        let spawned = port.and_then(|port| process::spawn(&cx, port));
        let mut p = match spawned {
            Ok(p) => p,
            Err(e) => {
                let what = format!("could not start {:?}: {e}", def.command);
                tracing::warn!("{what}");
                entry.count_exit(ExitReason::SpawnFailed);
                entry.slot_exited(index, true, &what, &opts.restart);
                return Ended::Failed { ready_for: None };
            }
        };
        tracing::debug!(pid = p.pid, addr = %p.addr, "replica spawned");
        entry.slot_spawned(index, p.pid, p.addr, p.started_at);
        let startup_timeout = def.startup_timeout.unwrap_or(opts.startup_timeout);
        let deadline = p.started_at + startup_timeout;
        let probing = probe_reporting(p.addr, p.pid, p.started_at, &kind, &opts.probe);
        let outcome = tokio::select! {
            _ = stopped(stop) => Startup::Stop,
            status = p.child.wait() => Startup::Exited(status),
            r = tokio::time::timeout_at(deadline, probing) => {
                match r {
                    Ok(()) => Startup::Ready(p.started_at.elapsed()),
                    Err(_) => Startup::TimedOut,
                }
            }
        };
        match outcome {
            Startup::Ready(after) => break (p, after),
            Startup::Stop => {
                p.terminate(opts.kill_grace).await;
                entry.count_exit(ExitReason::Stopped);
                return Ended::Stopped;
            }
            Startup::TimedOut => {
                p.terminate(opts.kill_grace).await;
                let what = policy::describe_exit(
                    &format!("not ready within {startup_timeout:?}"),
                    p.last_output().await.as_deref(),
                );
                tracing::warn!(pid = p.pid, "replica {what}");
                entry.count_exit(ExitReason::StartupTimeout);
                entry.slot_exited(index, true, &what, &opts.restart);
                return Ended::Failed { ready_for: None };
            }
            Startup::Exited(status) => {
                let retry = policy::early_exit(
                    process::port_in_use(p.addr),
                    port_retries,
                    opts.max_port_retries,
                );
                if retry == policy::EarlyExit::RetryNewPort {
                    port_retries += 1;
                    let what = exit_text(&mut p, status).await;
                    tracing::info!(addr = %p.addr, port_retries, "replica's port was taken meanwhile ({what}); retrying on a new port");
                    entry.count_exit(ExitReason::PortTaken);
                    continue;
                }
                let what = exit_text(&mut p, status).await;
                tracing::warn!(pid = p.pid, "replica exited before it was ready: {what}");
                entry.count_exit(ExitReason::Crashed);
                entry.slot_exited(index, true, &what, &opts.restart);
                return Ended::Failed { ready_for: None };
            }
        }
    };
    tracing::info!(pid = p.pid, addr = %p.addr, ready_after = ?startup, "replica ready");
    entry.slot_ready(index, startup);
    serve(opts, entry, index, def, &mut p, stop).await
}

/// How often a replica that is not ready yet is reported.
pub const NOT_READY_REPORT_EVERY: Duration = Duration::from_secs(3);

/// Probes until ready, saying every [`NOT_READY_REPORT_EVERY`] that the replica is not ready yet
/// and which address and probe it waits on (an app listening on another port than `PORT` is
/// seen at once, not after the whole start-up timeout).
async fn probe_reporting(
    addr: std::net::SocketAddr,
    pid: u32,
    started_at: Instant,
    kind: &ProbeKind,
    probe_opts: &probe::ProbeOptions,
) {
    let ready = probe::wait_ready(addr, kind, probe_opts, started_at);
    tokio::pin!(ready);
    let what = match kind {
        ProbeKind::Tcp => format!("a TCP connect to {addr}"),
        ProbeKind::Http { path, .. } => format!("GET http://{addr}{path} answering 2xx"),
        ProbeKind::Grpc { service } => {
            format!("grpc.health.v1.Health/Check {service:?} at {addr} answering SERVING")
        }
    };
    let mut every =
        tokio::time::interval_at(started_at + NOT_READY_REPORT_EVERY, NOT_READY_REPORT_EVERY);
    loop {
        tokio::select! {
            () = &mut ready => return,
            _ = every.tick() => tracing::info!(
                pid,
                %addr,
                waited = ?started_at.elapsed(),
                "replica not ready yet: waiting for {what} (the app must listen on $PORT = {})",
                addr.port()
            ),
        }
    }
}

/// Follows a ready process until it exits on its own or is told to stop (draining first
/// when asked to).
async fn serve(
    opts: &LocalOptions,
    entry: &RevisionEntry,
    index: u32,
    def: &LocalRevision,
    p: &mut Spawned,
    stop: &mut watch::Receiver<StopSignal>,
) -> Ended {
    let ready_at = Instant::now();
    let outcome = tokio::select! {
        status = p.child.wait() => Err(status),
        s = stopped(stop) => Ok(s),
    };
    let signal = match outcome {
        Ok(signal) => signal,
        Err(status) => {
            let what = exit_text(p, status).await;
            tracing::warn!(pid = p.pid, "replica exited: {what}");
            entry.count_exit(ExitReason::Exited);
            entry.slot_exited(index, false, &what, &opts.restart);
            return Ended::Failed {
                ready_for: Some(ready_at.elapsed()),
            };
        }
    };
    if signal == StopSignal::Drain {
        let bound = def.drain_timeout.unwrap_or(opts.drain_timeout);
        tracing::debug!(?bound, "draining replica");
        let drained = tokio::select! {
            _ = until_now(stop) => Ok(true),
            _ = tokio::time::sleep(bound) => Ok(false),
            status = p.child.wait() => Err(status),
        };
        match drained {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    ?bound,
                    "replica not reported drained within the bound; stopping it"
                );
            }
            Err(status) => {
                // It left on its own while draining: nothing to replace, but sweep its group.
                let what = exit_text(p, status).await;
                tracing::info!(pid = p.pid, "replica exited while draining: {what}");
                entry.count_exit(ExitReason::Exited);
                p.terminate(opts.kill_grace).await;
                return Ended::Stopped;
            }
        }
    }
    let status = p.terminate(opts.kill_grace).await;
    tracing::info!(pid = p.pid, status = ?status.map(process::exit_status_text), "replica stopped");
    entry.count_exit(ExitReason::Stopped);
    Ended::Stopped
}

async fn exit_text(p: &mut Spawned, status: std::io::Result<std::process::ExitStatus>) -> String {
    let what = match status {
        Ok(s) => process::exit_status_text(s),
        Err(e) => format!("wait failed: {e}"),
    };
    policy::describe_exit(&what, p.last_output().await.as_deref())
}

/// Resolves once the slot is asked to stop (at once if it already was); a dropped sender
/// counts as `Now`.
async fn stopped(rx: &mut watch::Receiver<StopSignal>) -> StopSignal {
    loop {
        let v = *rx.borrow_and_update();
        if v != StopSignal::Run {
            return v;
        }
        if rx.changed().await.is_err() {
            return StopSignal::Now;
        }
    }
}

/// Resolves once the signal is `Now` (the endpoint was reported drained).
async fn until_now(rx: &mut watch::Receiver<StopSignal>) {
    loop {
        if *rx.borrow_and_update() == StopSignal::Now {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
