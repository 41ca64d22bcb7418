//! `thaw queue`: the per-pod sidecar in front of the user container, as Knative's
//! queue-proxy: it admits at most containerConcurrency requests into the container at once
//! (more wait in a bounded queue), counts every request for the autoscaler to pull, answers
//! readiness only while the container does, and drains on SIGTERM.
//!
//! Entry points: [`run`] (the subcommand), or [`Settings::from_lookup`], [`Sidecar::new`] and
//! [`server::serve`] to embed it. Settings come from environment variables
//! ([`settings`], documented in the README); the request path is [`handler`]'s.
//!
//! Room: the sidecar's own policy: probes, containerConcurrency, header hygiene for the user
//! container, its timeouts, its stats and admin port, drain. It is a [`crate::http1::Handler`]:
//! connections, HTTP/1 parsing and writing, hyper, the upstream pool and the timed response
//! body are the engine's; the concurrency limit and its queue are [`crate::limiter`]'s.
//! May use: `http1`, `limiter`, `stats` (the pull format), `telemetry` (its registry),
//! `config` (the engine's default limits, duration syntax), `cli`, `knative::proxy_tag` (the
//! proxy tag it checks). Never the activator or the
//! autoscaler (`tests/import_cycles.rs` checks).

pub mod admin;
pub mod body;
pub mod exec;
pub mod handler;
pub mod podstats;
pub mod probe;
pub mod server;
pub mod settings;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use handler::Sidecar;
pub use settings::Settings;

use crate::cli::parse_listen;
use crate::telemetry::queue::{PodLabels, QueueTelemetry};

/// Arguments of `thaw queue`. Everything else comes from the environment (see [`settings`]).
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = settings::HELP)]
pub struct QueueArgs {
    /// Data port (HTTP/1.1 and h2c). Default: every interface, port $QUEUE_SERVING_PORT
    /// (8012). HOST:PORT, :PORT or PORT (loopback).
    #[arg(long, value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// Admin port (/metrics, /healthz, /readyz, /stats, /wait-for-drain). Default: every
    /// interface, port $THAW_QUEUE_ADMIN_PORT (9091). Same forms as --listen.
    #[arg(long, value_parser = parse_listen)]
    pub admin_listen: Option<SocketAddr>,
    /// Threads serving requests: 1 runs everything on one thread (the default: a sidecar's
    /// CPU is usually a fraction of a core).
    #[arg(long, env = "THAW_QUEUE_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
    /// Wrapper mode (how `thaw local` runs a replica behind a sidecar): after `--`, the user
    /// container's command, started as this process's child with `PORT` set to `USER_PORT` (a
    /// free port if unset). The data port defaults to 127.0.0.1:$PORT and opens once the child
    /// answers its probe; the admin port to 127.0.0.1 on a free port. The child's exit ends the
    /// sidecar (exit 1); after a drain the child is stopped.
    #[arg(last = true, value_name = "COMMAND")]
    pub exec: Vec<String>,
}

/// Runs the sidecar until SIGTERM or SIGINT, then drains; exit 0 after a drain, 1 on invalid
/// settings or a port that cannot be bound.
pub fn run(args: &QueueArgs) -> ExitCode {
    crate::telemetry::init_tracing(args.log_json);
    let env = |k: &str| std::env::var(k).ok();
    let exec::Defaults {
        listen,
        admin_listen,
        user_port,
    } = if args.exec.is_empty() {
        exec::Defaults {
            listen: args.listen,
            admin_listen: args.admin_listen,
            user_port: None,
        }
    } else {
        match exec::defaults(args.listen, args.admin_listen, env) {
            Ok(d) => d,
            Err(msg) => {
                crate::cli::say(msg);
                return crate::cli::invalid();
            }
        }
    };
    let lookup = |k: &str| match (k, &user_port) {
        (settings::USER_PORT, Some(p)) => Some(p.to_string()),
        _ => env(k),
    };
    let settings = match Settings::from_lookup(lookup, listen, admin_listen) {
        Ok(s) => s,
        Err(errs) => {
            let list: Vec<String> = errs.iter().map(|e| format!("  {e}")).collect();
            crate::cli::say(format_args!(
                "thaw queue: invalid settings:\n{}",
                list.join("\n")
            ));
            return crate::cli::invalid();
        }
    };
    let built = if args.threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(args.threads))
            .thread_name("thaw-queue")
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            crate::cli::say(format_args!("thaw queue: cannot start the runtime: {e}"));
            return crate::cli::invalid();
        }
    };
    match rt.block_on(serve(settings, args.exec.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            crate::cli::say(msg);
            crate::cli::invalid()
        }
    }
}

async fn serve(settings: Settings, exec: Vec<String>) -> Result<(), String> {
    if let Err(e) = crate::http1::limits::raise_nofile_limit() {
        tracing::warn!(error = %e, "cannot raise the open-files limit; keeping the current one");
    }
    // Handlers first: a SIGTERM right after the ports open must find them in place.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("thaw queue: cannot watch SIGTERM: {e}"))?;
    let mut child = match exec.is_empty() {
        true => None,
        false => match exec::start_until_ready(&exec, &settings, &mut term).await? {
            Some(child) => Some(child),
            // SIGTERM before the user container was ready: nothing to drain.
            None => return Ok(()),
        },
    };
    let bind = |addr: SocketAddr, what: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| format!("thaw queue: cannot listen on {addr} ({what}): {e}"))
    };
    let data = bind(settings.data, "data port").await?;
    let admin = bind(settings.admin, "admin port").await?;
    let (data_addr, admin_addr) = (
        data.local_addr().map_err(|e| e.to_string())?,
        admin.local_addr().map_err(|e| e.to_string())?,
    );
    let telemetry = QueueTelemetry::new(&PodLabels {
        namespace: settings.namespace.clone(),
        configuration: settings.configuration.clone().unwrap_or_default(),
        revision: settings.revision.clone(),
        pod: settings.pod.clone(),
    });
    tracing::info!(
        data = %data_addr,
        admin = %admin_addr,
        user = %settings.user,
        revision = %format_args!("{}/{}", settings.namespace, settings.revision),
        container_concurrency = settings.container_concurrency,
        queue_depth = settings.queue_depth,
        "thaw queue listening"
    );
    let sidecar = Arc::new(Sidecar::new(settings, telemetry));
    // Set when the user container (wrapper mode) exits on its own.
    let mut child_exit = None;
    let shutdown = async {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
            status = async { child.as_mut()?.wait().await.ok() }, if child.is_some() => {
                tracing::warn!(?status, "the user container exited: draining and stopping");
                child_exit = Some(status);
            }
        }
    };
    let served = server::serve(sidecar, data, admin, shutdown).await;
    if let Some(mut c) = child.filter(|_| child_exit.is_none()) {
        exec::stop(&mut c).await;
    }
    served.map_err(|e| format!("thaw queue: the data port failed: {e}"))?;
    tracing::info!("thaw queue stopped");
    match child_exit {
        Some(status) => Err(format!(
            "thaw queue: the user container exited ({})",
            status.map_or_else(|| "status unknown".to_string(), |s| s.to_string())
        )),
        None => Ok(()),
    }
}
