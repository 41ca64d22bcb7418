//! `thaw local`: wires the activator, the autoscaler, the local process platform and the local
//! controller together in one process, and follows local.yaml and its ConfigMaps live.
//!
//! Shutdown (SIGINT or SIGTERM): the activator drains first (readiness fails, listeners close
//! after `drain-delay`, held and in-flight requests finish within `drain-timeout`) while the
//! autoscaler and the platform keep serving them; then the autoscaler stops and every replica
//! is stopped (SIGTERM, SIGKILL after the kill grace). No replica outlives thaw.
//!
//! If thaw itself is SIGKILLed it cannot stop its replicas: they run in their own process
//! groups (so a terminal's Ctrl-C reaches thaw, not them) and are re-parented to init. The
//! shipped `thaw sample-app` exits within a second when its parent dies; other commands should
//! do the same or be cleaned up by hand (`pgrep -f` on their command line).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::controller::LocalController;
use super::model::{self, LocalModel, Source};
use crate::activator::{Activator, ActivatorDeps, NextHop, raise_nofile_limit};
use crate::autoscaler::scaler::{ScaleStates, Scaler, ScalerOptions};
use crate::cli::parse_listen;
use crate::config::reload::{FileWatch, Outcome, watch_file};
use crate::percore::Workers;
use crate::platform::Platform;
use crate::platform::local::{LocalOptions, LocalPlatform};
use crate::revision::RevisionCatalog;
use crate::stats::stat_channel;
use crate::telemetry::{Telemetry, init_tracing};

/// Bound of the in-process stats channel (activator -> autoscaler): a few seconds of reports
/// for thousands of revisions; beyond it stats are dropped and counted, never queued.
const STATS_CHANNEL: usize = 16 * 1024;

/// Arguments of `thaw local`.
#[derive(Debug, clap::Args)]
pub struct LocalArgs {
    /// Data port: where clients send requests (Host: {service}.{namespace}.{domain}).
    /// HOST:PORT, localhost:PORT, :PORT (every interface) or PORT (loopback).
    #[arg(long, default_value = "127.0.0.1:8080", env = "THAW_LISTEN", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Admin port: /metrics, /healthz, /readyz, /revisions. Same forms as --listen.
    #[arg(long, default_value = "127.0.0.1:9090", env = "THAW_ADMIN_LISTEN", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// The services file. Default: ./local.yaml, else config/local.yaml, in the current folder;
    /// with neither, the built-in demo (one service, hello) is served and a warning says so.
    #[arg(long, env = "THAW_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
    /// Quote a crashing replica's last output line in its revision's failing reason (shown on
    /// the admin port's /revisions). Off by default: output can carry secrets; it is logged
    /// either way, and never sent to clients.
    #[arg(long)]
    pub reason_quotes_output: bool,
}

/// Runs `thaw local` to completion (a signal); the exit code says whether it started.
pub fn main(args: LocalArgs) -> ExitCode {
    init_tracing(args.log_json);
    // The control runtime: accept loop, admin port, autoscaler, platform, reloads. Requests are
    // served on the per-core data workers, so one thread is plenty here.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("thaw-control")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::cli::say(format_args!("thaw local: cannot start the runtime: {e}"));
            return crate::cli::invalid();
        }
    };
    match rt.block_on(run(args)) {
        Ok(Stopped::Cleanly) => ExitCode::SUCCESS,
        Ok(Stopped::AtOnce) => {
            // Dropping the runtime SIGKILLs the replicas still running (`kill_on_drop`).
            rt.shutdown_timeout(std::time::Duration::from_millis(200));
            crate::cli::interrupted()
        }
        Err(msg) => {
            crate::cli::say(msg);
            crate::cli::invalid()
        }
    }
}

/// How `thaw local` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// After a drain: every request finished or was cut at drain-timeout, replicas stopped.
    Cleanly,
    /// A second Ctrl-C during the stop: what was left is cut short.
    AtOnce,
}

/// Where `thaw local` looks for its services file without `--config`, in order.
pub const LOOKED_FOR: [&str; 2] = ["local.yaml", "config/local.yaml"];

fn source(args: &LocalArgs) -> Source {
    match &args.config {
        Some(p) => Source::File(p.clone()),
        None => LOOKED_FOR
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .map_or(Source::Builtin, Source::File),
    }
}

async fn run(args: LocalArgs) -> Result<Stopped, String> {
    if let Err(e) = raise_nofile_limit() {
        warn!(error = %e, "cannot raise the open-files limit; keeping the current one");
    }
    let source = source(&args);
    let model = model::load(&source).map_err(|p| {
        let what = match &source {
            Source::File(p) => p.display().to_string(),
            Source::Builtin => "the built-in local.yaml".into(),
        };
        format!("thaw local: invalid configuration in {what}:\n{p}")
    })?;
    for w in &model.warnings {
        warn!("{w}");
    }
    match &source {
        Source::File(p) => info!(config = %p.display(), "services file"),
        Source::Builtin => {
            let here = std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| ".".into());
            warn!(
                looked_for = %LOOKED_FOR.join(", "),
                folder = %here,
                "no services file found: serving the built-in demo (service hello); write \
                 ./local.yaml or pass --config FILE"
            );
        }
    }
    let model = Arc::new(model);

    // The ports first: replicas are told which of theirs clash with them, and routes name the
    // data port.
    let data = TcpListener::bind(args.listen).await.map_err(|e| {
        format!(
            "thaw local: cannot listen on {} (--listen): {e}",
            args.listen
        )
    })?;
    let admin = TcpListener::bind(args.admin_listen).await.map_err(|e| {
        format!(
            "thaw local: cannot listen on {} (--admin-listen): {e}",
            args.admin_listen
        )
    })?;
    let (data_addr, admin_addr) = (
        data.local_addr().map_err(|e| format!("thaw local: {e}"))?,
        admin.local_addr().map_err(|e| format!("thaw local: {e}"))?,
    );
    info!(data = %data_addr, admin = %admin_addr, "thaw local listening");
    for (addr, flag) in [(data_addr, "--listen"), (admin_addr, "--admin-listen")] {
        if addr.ip().is_unspecified() {
            warn!(addr = %addr, "{flag} {addr} accepts connections from other machines too (every \
                interface); 127.0.0.1:{} keeps it on this machine", addr.port());
        }
    }

    let telemetry = Arc::new(Telemetry::local());
    let mut options = LocalOptions::default();
    options.restart.reason_quotes_output = args.reason_quotes_output;
    options.own_ports = vec![
        (data_addr.port(), "thaw's data port (--listen)"),
        (admin_addr.port(), "thaw's admin port (--admin-listen)"),
    ];
    let platform = LocalPlatform::new(options, telemetry.platform.clone());
    let catalog = Arc::new(RevisionCatalog::default());
    let controller = LocalController::start(
        platform.clone(),
        catalog.clone(),
        model.clone(),
        data_addr.port(),
    );
    let scale_states = ScaleStates::new();
    let (sink, stats_rx) = stat_channel(STATS_CHANNEL);
    let sink = sink.count_drops_in(telemetry.activator.stats_dropped.clone());
    let activator_config = Arc::new(ArcSwap::new(model.configs.activator.clone()));

    for r in controller.routes() {
        let traffic: Vec<String> = r
            .traffic
            .iter()
            .map(|t| {
                let rev = t.revision_name.as_deref().unwrap_or("(missing)");
                match &t.tag {
                    Some(tag) => format!("{rev} {}% tag {tag}", t.percent),
                    None => format!("{rev} {}%", t.percent),
                }
            })
            .collect();
        info!(
            service = %format!("{}/{}", r.namespace, r.service),
            "route {} -> {}; try: curl {}",
            r.url,
            traffic.join(", "),
            curl_of(&r.host, data_addr),
        );
    }
    info!("admin: curl http://{admin_addr}/routes (also /revisions /metrics /healthz /readyz)");

    let activator = Activator::new(ActivatorDeps {
        catalog: catalog.clone(),
        endpoints: Arc::new(platform.clone()),
        stats: Arc::new(sink),
        scale_states: Some(scale_states.clone()),
        config: activator_config.clone(),
        telemetry: telemetry.clone(),
        source_name: "activator".into(),
        // No queue sidecar stands in front of a local replica: it gets the client's Host, as a
        // container behind Knative's queue-proxy does.
        next_hop: NextHop::Container,
    });
    // The data plane runs nginx-style: one single-threaded runtime per core, each owning its
    // connections and its upstream pool, so a request never hops between threads.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = Arc::new(
        Workers::start(cores).map_err(|e| format!("thaw local: cannot start data workers: {e}"))?,
    );
    activator.use_workers(workers.clone());
    info!(workers = workers.len(), "data-plane workers (one per core)");
    let scaler = Scaler::new(
        catalog.clone(),
        Arc::new(platform.clone()) as Arc<dyn Platform>,
        scale_states,
        &telemetry,
        ScalerOptions::default(),
    );
    let (stop_scaler, scaler_stopped) = watch::channel(false);
    let scaler_task = tokio::spawn(scaler.run(stats_rx, async move {
        let mut rx = scaler_stopped;
        let _ = rx.wait_for(|stop| *stop).await;
    }));

    for (config_map, n) in &model.ineffective_keys {
        telemetry.config.set_ineffective(config_map, *n);
    }
    let _watches = watch_files(
        &source,
        &model,
        controller,
        activator_config.clone(),
        &telemetry,
    );

    let (stop_tx, stop_rx) = watch::channel(Stop::Running);
    tokio::spawn(signals(stop_tx, activator_config));
    let mut stopping = stop_rx.clone();
    let graceful = async {
        let served = activator
            .clone()
            .serve(data, admin, async move {
                let _ = stopping.wait_for(|s| *s != Stop::Running).await;
            })
            .await;
        info!("activator drained; stopping the autoscaler and every replica");
        workers.stop();
        let _ = stop_scaler.send(true);
        let _ = scaler_task.await;
        platform.shutdown().await;
        info!("thaw local stopped");
        served.map_err(|e| format!("thaw local: serving failed: {e}"))
    };
    let mut at_once = stop_rx.clone();
    let mut draining = stop_rx.clone();
    tokio::select! {
        r = graceful => r.map(|()| Stopped::Cleanly),
        () = report_drain(&activator, &mut draining) => unreachable!("the drain report never ends"),
        // Counted before the select drops the drain (which ends its requests).
        (in_flight, held) = async {
            let _ = at_once.wait_for(|s| *s == Stop::AtOnce).await;
            requests_left(&activator)
        } => {
            warn!(
                in_flight,
                held,
                "second Ctrl-C: stopping at once; {in_flight} requests in flight and {held} held \
                 are cut short, replicas are killed"
            );
            Ok(Stopped::AtOnce)
        }
    }
}

/// The shortest curl command that reaches `host` on `data`: a `*.localhost` host resolves to
/// loopback by itself (curl and browsers), any other needs its Host header.
fn curl_of(host: &str, data: SocketAddr) -> String {
    if host.ends_with(".localhost") && data.ip().is_loopback() {
        format!("http://{host}:{}/", data.port())
    } else {
        format!("-H 'Host: {host}' http://{data}/")
    }
}

/// Where a stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Running,
    /// SIGINT or SIGTERM: drain, then stop.
    Draining,
    /// A second SIGINT while draining: stop now.
    AtOnce,
}

/// How often a drain says what it still waits for.
const DRAIN_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Once a drain has begun, says every [`DRAIN_REPORT_EVERY`] how many requests it still waits
/// for (nothing when none). Never completes.
async fn report_drain(activator: &Activator, stop: &mut watch::Receiver<Stop>) {
    let _ = stop.wait_for(|s| *s != Stop::Running).await;
    let mut every = tokio::time::interval(DRAIN_REPORT_EVERY);
    every.tick().await;
    loop {
        every.tick().await;
        let (in_flight, held) = requests_left(activator);
        if in_flight + held > 0 {
            info!(
                in_flight,
                held,
                "draining: {} requests still in flight, {held} held (Ctrl-C again to stop at once)",
                in_flight
            );
        }
    }
}

/// Requests forwarded and not yet answered, and requests held for a cold start, over every
/// revision.
fn requests_left(activator: &Activator) -> (u64, u64) {
    let in_flight = activator
        .states()
        .iter()
        .flat_map(|s| s.throttler.endpoints())
        .map(|e| u64::from(e.in_flight))
        .sum();
    (in_flight, u64::from(activator.held_requests()))
}

/// Watches local.yaml and every ConfigMap file it names. Any change reloads the whole model;
/// a valid one is applied (services, revisions, effective settings, activator limits), an
/// invalid one is logged key by key and counted, and the last good model keeps serving.
///
/// The set of watched files is the one at start-up: a `configMaps` path changed in local.yaml
/// is read on every later reload, but its own edits are only followed after a restart.
fn watch_files(
    source: &Source,
    model: &Arc<LocalModel>,
    controller: Arc<LocalController>,
    activator_config: Arc<ArcSwap<crate::config::ActivatorConfig>>,
    telemetry: &Telemetry,
) -> Vec<FileWatch> {
    let Source::File(local_yaml) = source else {
        return Vec::new();
    };
    let live: Arc<ArcSwap<LocalModel>> = Arc::new(ArcSwap::new(model.clone()));
    let mut files = vec![("local.yaml", local_yaml.clone())];
    files.extend(
        model
            .config_files
            .iter()
            .map(|(name, p)| (*name, p.clone())),
    );
    let mut watches = Vec::new();
    for (name, path) in files {
        let src = source.clone();
        let w = watch_file(
            &path,
            name,
            move |_| model::load(&src),
            live.clone(),
            telemetry.config.clone(),
        );
        match w {
            Ok(w) => watches.push(w),
            Err(e) => {
                error!(file = %path.display(), error = %e, "cannot watch; edits need a restart")
            }
        }
    }
    // Warnings already said (at start or by an earlier reload) are not repeated: one warning
    // per field, not one per edit.
    let said: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>> = Arc::new(
        std::sync::Mutex::new(model.warnings.iter().cloned().collect()),
    );
    for w in &watches {
        let mut events = w.events();
        let (controller, live, activator_config, said, metrics) = (
            controller.clone(),
            live.clone(),
            activator_config.clone(),
            said.clone(),
            telemetry.config.clone(),
        );
        tokio::spawn(async move {
            while events.changed().await.is_ok() {
                let applied = matches!(events.borrow_and_update().outcome, Some(Outcome::Applied));
                if applied {
                    let model: Arc<LocalModel> = live.load_full();
                    {
                        let mut said = said.lock().unwrap_or_else(|p| p.into_inner());
                        for w in &model.warnings {
                            if said.insert(w.clone()) {
                                warn!("{w}");
                            }
                        }
                    }
                    for (config_map, n) in &model.ineffective_keys {
                        metrics.set_ineffective(config_map, *n);
                    }
                    activator_config.store(model.configs.activator.clone());
                    controller.apply(model);
                }
            }
        });
    }
    watches
}

/// Follows SIGINT (Ctrl-C) and SIGTERM: the first starts the drain, a second Ctrl-C stops at
/// once. Ctrl-C comes from a person at a terminal, with no load balancer to wait for, so it
/// skips `drain-delay` (requests still finish, bounded by `drain-timeout`); SIGTERM honours it
/// as in a cluster.
async fn signals(stop: watch::Sender<Stop>, config: Arc<ArcSwap<crate::config::ActivatorConfig>>) {
    use tokio::signal::unix::{SignalKind, signal};
    // Both handlers are installed before anything waits, so no signal is missed between the
    // first and the second.
    let (mut int, mut term) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (i, t) => {
            let e = i
                .err()
                .or(t.err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            error!(error = %e, "cannot listen for SIGINT/SIGTERM; stop thaw with SIGKILL");
            return;
        }
    };
    tokio::select! {
        _ = int.recv() => {
            info!("SIGINT: draining now (no drain delay); Ctrl-C again to stop at once");
            config.rcu(|c| crate::config::ActivatorConfig {
                drain_delay: std::time::Duration::ZERO,
                ..(**c).clone()
            });
        }
        _ = term.recv() => {
            let delay = config.load().drain_delay;
            info!(
                drain_delay = ?delay,
                "SIGTERM: draining; new requests are still served for config-activator's \
                 drain-delay ({delay:?}) as behind a load balancer, idle or not (Ctrl-C skips \
                 it)"
            );
        }
    }
    let _ = stop.send(Stop::Draining);
    if int.recv().await.is_some() {
        let _ = stop.send(Stop::AtOnce);
    }
}
