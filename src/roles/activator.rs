//! `thaw activator`: the data plane proxy on Kubernetes.
//!
//! The same activator as in `thaw local` (data port, admin port, drain), fed from the cluster:
//! the catalog from a Revision watch, endpoints from the Kubernetes platform (private
//! EndpointSlices, failing pods), split with the other activators of each revision's subset
//! (the revision's public slices, [`super::subset`], [`super::share`]), its
//! limits from the live `config-activator`. It pushes its stats to the autoscaler leader it
//! finds in the Lease and follows the leader's decisions; when the autoscaler or the API
//! server is away it keeps serving warm traffic and holding cold traffic (a held request still
//! ends by its cold-wait deadline). `/readyz` depends on neither after the first sync.
//!
//! Every request is checked against the Routes ([`super::routes`]): a gateway's choice reaches
//! a revision only through a host of a Route of the revision's namespace that routes it (or
//! did, within `routing-grace`), any other request is routed by its host's Route, and
//! `trusted-proxies`' default believes the gateways alone (their endpoints' addresses, or their
//! mesh identity from the activator's own sidecar).
//!
//! The admin port answers from the start: `/healthz` at once, `/readyz` 503 saying what it
//! waits for until the first sync is done and the stats token is known (the Secret, followed
//! live, which the autoscaler leader creates when it is absent).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::autoscaler::signal_stop;
use super::early_ready::{EarlyReady, EarlyReadyMetrics};
use super::serving::watch_public_slices;
use super::share::{SharedEndpoints, Subsets};
use crate::activator::{Activator, ActivatorDeps, NextHop, raise_nofile_limit};
use crate::autoscaler::scaler::ScaleStates;
use crate::cli::parse_listen;
use crate::config::live::SYSTEM_NAMESPACE;
use crate::leader::watch_leader;
use crate::percore::Workers;
use crate::platform::EndpointSource;
use crate::remote::{feed, push, tag_key, token};
use crate::telemetry::{Telemetry, init_tracing};

/// Arguments of `thaw activator`.
#[derive(Debug, clap::Args)]
pub struct ActivatorArgs {
    /// Where the ConfigMaps, the autoscaler's Lease, the stats token and activator-service live.
    #[arg(long, default_value = SYSTEM_NAMESPACE, env = "SYSTEM_NAMESPACE")]
    pub system_namespace: String,
    /// Serve only this namespace's Revisions (default: every namespace).
    #[arg(long, env = "THAW_NAMESPACE")]
    pub namespace: Option<String>,
    /// Data port (activator-service's `http` and `http2` ports lead here).
    #[arg(long, default_value = "0.0.0.0:8080", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Admin port: /metrics, /healthz, /readyz, /revisions. Not on activator-service.
    #[arg(long, default_value = "0.0.0.0:9090", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// This activator's data address as activator-service's EndpointSlices list it (and so
    /// the revisions' public slices: its place in each revision's subset). Default:
    /// `$POD_IP` and the data port.
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// This activator's name in its stats (default: `$POD_NAME`, else the advertised address).
    #[arg(long, env = "POD_NAME")]
    pub name: Option<String>,
    /// The autoscaler's Lease (its holder is the leader's stats address).
    #[arg(long, default_value = "thaw-autoscaler")]
    pub autoscaler_lease: String,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// Runs `thaw activator` until SIGTERM (drain) or SIGINT.
pub fn main(args: ActivatorArgs) -> ExitCode {
    init_tracing(args.log_json);
    super::run_role("activator", 1, "thaw-control", run(args))
}

async fn run(args: ActivatorArgs) -> Result<(), String> {
    if let Err(e) = raise_nofile_limit() {
        warn!(error = %e, "cannot raise the open-files limit; keeping the current one");
    }
    let data = TcpListener::bind(args.listen).await.map_err(|e| {
        format!(
            "thaw activator: cannot listen on {} (--listen): {e}",
            args.listen
        )
    })?;
    let admin = TcpListener::bind(args.admin_listen).await.map_err(|e| {
        format!(
            "thaw activator: cannot listen on {} (--admin-listen): {e}",
            args.admin_listen
        )
    })?;
    let telemetry = Arc::new(Telemetry::new());
    // /healthz from now on; /readyz says what is missing.
    let (waiting, waiting_rx) = tokio::sync::watch::channel("the ConfigMaps and the first sync");
    let starting_done = CancellationToken::new();
    let starting = tokio::spawn(super::admin::serve_starting(
        telemetry.clone(),
        waiting_rx,
        admin,
        starting_done.clone(),
    ));
    let data_addr = data.local_addr().map_err(|e| e.to_string())?;
    let advertise = match args.advertise {
        Some(a) => a,
        None => {
            let ip = std::env::var("POD_IP")
                .ok()
                .and_then(|ip| ip.parse().ok())
                .unwrap_or(data_addr.ip());
            SocketAddr::new(ip, data_addr.port())
        }
    };
    let name = args.name.clone().unwrap_or_else(|| advertise.to_string());
    let client = super::kube_client("activator").await?;
    let stop = CancellationToken::new();
    let tokens = token::follow(client.clone(), &args.system_namespace, None, stop.clone());
    let tag_keys = tag_key::follow(client.clone(), &args.system_namespace, None, stop.clone());
    info!(data = %data_addr, advertise = %advertise, name = %name, "thaw activator starting");

    let Some(super::Followed {
        live,
        platform,
        catalog,
        revisions: followed,
        activators: _,
    }) = super::follow_cluster(
        &client,
        &args.system_namespace,
        args.namespace.as_deref(),
        None,
        &telemetry,
        &stop,
    )
    .await?
    else {
        return Ok(());
    };
    let leader = watch_leader(
        client.clone(),
        &args.system_namespace,
        &args.autoscaler_lease,
        stop.clone(),
    );
    let scale_states = ScaleStates::new();
    feed::follow(
        leader.clone(),
        tokens.clone(),
        scale_states.clone(),
        telemetry.remote.clone(),
        stop.clone(),
    );
    let sink = push::start(
        push::PushSettings {
            leader,
            token: tokens.clone(),
            source: name.clone(),
            metrics: telemetry.remote.clone(),
            dropped: telemetry.activator.stats_dropped.clone(),
            // The sink's bound follows the revisions that may report: the catalog's.
            revisions: {
                let catalog = catalog.clone();
                Arc::new(move || catalog.load().len())
            },
        },
        stop.clone(),
    );
    // Each revision's subset: the public slices that list this activator.
    let subsets = Subsets::new(advertise);
    let (_, mut public_synced) = {
        let subsets = subsets.clone();
        watch_public_slices(
            client.clone(),
            args.namespace.as_deref(),
            Some(Box::new(move |key, found| {
                subsets.update(key, found.map(|f| f.backends.as_slice()));
            })),
            stop.clone(),
        )
    };
    // mesh-compatibility-mode, read once (as Knative's activator does).
    let (mesh, mut services_synced) =
        super::mesh::start(&client, args.namespace.as_deref(), &live, &stop);
    // The Routes requests are checked against, and the gateways believed by default.
    let guard = super::routes::follow(
        client.clone(),
        args.namespace.as_deref(),
        live.clone(),
        stop.clone(),
    );
    // The first sync: revisions, endpoints, the public slices, the Routes (and the private
    // Services the mesh mode needs) listed once; and the token.
    tokio::select! {
        _ = async {
            platform.wait_synced().await;
            followed.wait_synced().await;
            let _ = public_synced.wait_for(|s| *s).await;
            let _ = services_synced.wait_for(|s| *s).await;
            guard.routes.wait_synced().await;
            info!(revisions = catalog.load().len(), "first sync done");
            waiting.send_replace(
                "the stats token (the Secret thaw-stats-token, which the autoscaler leader creates)",
            );
            if !tokens.wait().await {
                std::future::pending::<()>().await;
            }
        } => {}
        _ = signal_stop() => return Ok(()),
    }
    starting_done.cancel();
    let admin = starting
        .await
        .map_err(|e| format!("thaw activator: the admin port's starting server failed: {e}"))?;

    // Starting pods probed and sent to once they answer, unless mesh-compatibility-mode is
    // `enabled` (pods are then reached through their Service only).
    let mesh_enabled = mesh.mode() == crate::config::network::MeshMode::Enabled;
    let early = {
        let config = live.activator.clone();
        EarlyReady::new(
            Arc::new(platform.clone()),
            move || {
                if mesh_enabled {
                    0
                } else {
                    config.load().pod_probe_budget
                }
            },
            EarlyReadyMetrics {
                probes: telemetry.activator.starting_pod_probes.clone(),
                early: telemetry.activator.early_ready_pods.clone(),
            },
        )
    };
    let shared = SharedEndpoints::new(Arc::new(early), subsets, catalog.clone(), Some(mesh));
    let activator = Activator::new(ActivatorDeps {
        catalog: catalog.clone(),
        endpoints: Arc::new(shared) as Arc<dyn EndpointSource>,
        stats: Arc::new(sink),
        scale_states: Some(scale_states),
        config: live.activator.clone(),
        telemetry: telemetry.clone(),
        source_name: name.into(),
        next_hop: NextHop::Sidecar,
    });
    activator.guard_routes(guard);
    activator.use_proxy_tags(tag_key::tagger(&tag_keys, &tokens, stop.clone()));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = Arc::new(
        Workers::start(cores)
            .map_err(|e| format!("thaw activator: cannot start data workers: {e}"))?,
    );
    activator.use_workers(workers.clone());
    let served = activator
        .clone()
        .serve(data, admin, async {
            signal_stop().await;
            info!("draining");
        })
        .await;
    workers.stop();
    stop.cancel();
    platform.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    info!("thaw activator stopped");
    served.map_err(|e| format!("thaw activator: serving failed: {e}"))
}
