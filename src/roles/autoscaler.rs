//! `thaw autoscaler`: the KPA over every Revision (or one namespace's) on Kubernetes.
//!
//! Every replica follows the Revisions, the ConfigMaps (`config-autoscaler`,
//! `config-defaults`, `config-activator` in `--system-namespace`, validated and reloaded as
//! the files are), the private EndpointSlices and pods (the Kubernetes platform), the
//! activator set and the public Services, and runs for the Lease `thaw-autoscaler`. Only the
//! leader acts: it accepts the activators' stats (others answer 503), pulls pod stats, decides,
//! patches Deployments' `/scale`, swaps the public endpoints (serving mode) and writes its part
//! of the Revision status. Its stats address is the Lease's `holderIdentity`, which is how the
//! activators find it. On losing the Lease all of that stops at once; on SIGTERM the Lease is
//! released so another replica takes over without waiting for it to expire.
//!
//! The admin port answers `/healthz` from the start; `/readyz` once the first sync is done and
//! the stats token is known. The leader creates the token's Secret when it is absent
//! ([`crate::remote::token::follow`]).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use super::serving::{self, Swap};
use super::{admin, pull};
use crate::autoscaler::scaler::{ActivatorPath, InPath, ScaleStates, Scaler, ScalerOptions};
use crate::cli::parse_listen;
use crate::config::live::SYSTEM_NAMESPACE;
use crate::leader::elect;
use crate::platform::Platform;
use crate::remote::server::{StatsPort, serve as serve_stats};
use crate::remote::token;
use crate::stats::StatMessage;
use crate::telemetry::{Telemetry, init_tracing};

/// Bound of the stats channel into the scaler (pushes and pulls): ten activators' seconds of
/// reports for a thousand revisions each fit; beyond it stats are dropped and counted.
const STATS_CHANNEL: usize = 64 * 1024;

/// Arguments of `thaw autoscaler`.
#[derive(Debug, clap::Args)]
pub struct AutoscalerArgs {
    /// Where the ConfigMaps, the Lease, the stats token and activator-service live.
    #[arg(long, default_value = SYSTEM_NAMESPACE, env = "SYSTEM_NAMESPACE")]
    pub system_namespace: String,
    /// Scale only this namespace's Revisions (default: every namespace).
    #[arg(long, env = "THAW_NAMESPACE")]
    pub namespace: Option<String>,
    /// Stats port: the activators' pushes and the decision feed.
    #[arg(long, default_value = "0.0.0.0:8080", value_parser = parse_listen)]
    pub stats_listen: SocketAddr,
    /// The stats address the activators reach this replica at (written into the Lease while
    /// it leads), e.g. `$(POD_IP):8080`. Default: the bound stats address.
    #[arg(long)]
    pub stats_advertise: Option<String>,
    /// Admin port: /metrics, /healthz, /readyz, /leader.
    #[arg(long, default_value = "0.0.0.0:9090", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// The Service in front of the activators (its EndpointSlices are the activator set).
    #[arg(long, default_value = "activator-service")]
    pub activator_service: String,
    /// The Lease the replicas run for.
    #[arg(long, default_value = "thaw-autoscaler")]
    pub lease_name: String,
    /// The Lease's timings.
    #[command(flatten)]
    pub lease_timings: super::LeaseTimings,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// Runs `thaw autoscaler` until SIGTERM or SIGINT.
pub fn main(args: AutoscalerArgs) -> ExitCode {
    init_tracing(args.log_json);
    super::run_role("autoscaler", 2, "thaw-autoscaler", run(args))
}

async fn run(args: AutoscalerArgs) -> Result<(), String> {
    let stats_listener = TcpListener::bind(args.stats_listen).await.map_err(|e| {
        format!(
            "thaw autoscaler: cannot listen on {} (--stats-listen): {e}",
            args.stats_listen
        )
    })?;
    let admin_listener = TcpListener::bind(args.admin_listen).await.map_err(|e| {
        format!(
            "thaw autoscaler: cannot listen on {} (--admin-listen): {e}",
            args.admin_listen
        )
    })?;
    let stats_addr = stats_listener.local_addr().map_err(|e| e.to_string())?;
    let identity = args
        .stats_advertise
        .clone()
        .unwrap_or_else(|| stats_addr.to_string());
    let client = super::kube_client("autoscaler").await?;
    let lease = args
        .lease_timings
        .lease(
            "autoscaler",
            &client,
            &args.system_namespace,
            &args.lease_name,
            &identity,
        )
        .await?;
    let stop = CancellationToken::new();
    let telemetry = Arc::new(Telemetry::new());
    let (ready_tx, ready_rx) = watch::channel(false);
    let leading = super::Leading::new(telemetry.autoscaler.leader.clone());
    let scale_states = ScaleStates::new();
    let revisions_view: Arc<std::sync::Mutex<Option<RevisionsView>>> = Arc::default();
    {
        let (identity, leading, states) = (identity.clone(), leading.clone(), scale_states.clone());
        let state = Arc::new(admin::AdminState {
            telemetry: telemetry.clone(),
            ready: ready_rx,
            leader: Box::new(move || {
                serde_json::json!({
                    "identity": identity,
                    "leading": leading.get(),
                    "revisions": states.all().len(),
                })
            }),
            revisions: {
                let view = revisions_view.clone();
                Some(Box::new(move || {
                    match &*view.lock().unwrap_or_else(|p| p.into_inner()) {
                        Some(v) => v.json(),
                        None => serde_json::json!({"revisions": []}),
                    }
                }))
            },
        });
        tokio::spawn(admin::serve(state, admin_listener, stop.clone()));
    }
    info!(stats = %stats_addr, identity = %identity, admin = %args.admin_listen, "thaw autoscaler starting");

    let Some(super::Followed {
        live,
        platform,
        catalog,
        revisions: followed,
        activators,
    }) = super::follow_cluster(
        &client,
        &args.system_namespace,
        args.namespace.as_deref(),
        Some(&args.activator_service),
        &telemetry,
        &stop,
    )
    .await?
    else {
        return Ok(());
    };
    let Some(activators) = activators else {
        unreachable!("asked for above")
    };
    let services =
        serving::watch_public_services(client.clone(), args.namespace.as_deref(), stop.clone());
    // What a new leader adopts: every replica follows the public slices, so a takeover finds
    // them listed.
    let (public, mut public_synced) = serving::watch_public_slices(
        client.clone(),
        args.namespace.as_deref(),
        None,
        stop.clone(),
    );
    // mesh-compatibility-mode, read once: the pod-stats pull goes through the private Services
    // when it says so.
    let (mesh, mut services_synced) =
        super::mesh::start(&client, args.namespace.as_deref(), &live, &stop);
    tokio::select! {
        _ = async {
            platform.wait_synced().await;
            followed.wait_synced().await;
            let _ = public_synced.wait_for(|s| *s).await;
            let _ = services_synced.wait_for(|s| *s).await;
        } => {}
        _ = signal_stop() => return Ok(()),
    }
    info!(revisions = catalog.load().len(), "first sync done");

    let options = ScalerOptions {
        activator_path: ActivatorPath::Confirmed(Arc::new(InPath::default())),
        ..ScalerOptions::default()
    };
    let ActivatorPath::Confirmed(in_path) = options.activator_path.clone() else {
        unreachable!("set just above")
    };

    let (stats_tx, stats_rx) = mpsc::channel::<StatMessage>(STATS_CHANNEL);
    let stats_rx = Arc::new(Mutex::new(stats_rx));
    let flow = Arc::new(pull::PodStatsFlow::default());
    let swap = Arc::new(Swap {
        client: client.clone(),
        platform: platform.clone(),
        catalog: catalog.clone(),
        states: scale_states.clone(),
        in_path,
        flow: flow.clone(),
        activators,
        services,
        public,
        metrics: telemetry.autoscaler.clone(),
        writes: Default::default(),
        modes: Default::default(),
        first_pass_pending: Default::default(),
        write_permits: tokio::sync::Semaphore::new(serving::WRITES_IN_FLIGHT),
    });
    *revisions_view.lock().unwrap_or_else(|p| p.into_inner()) = Some(RevisionsView {
        catalog: catalog.clone(),
        states: scale_states.clone(),
        swap: swap.clone(),
        flow: flow.clone(),
        platform: platform.clone(),
    });
    let work = {
        let (catalog, platform, states, telemetry, options, stats_tx, flow) = (
            catalog.clone(),
            platform.clone(),
            scale_states.clone(),
            telemetry.clone(),
            options,
            stats_tx.clone(),
            flow.clone(),
        );
        move || {
            let mesh = mesh.clone();
            let (catalog, platform, states, telemetry, options, stats_tx, flow, swap, stats_rx) = (
                catalog.clone(),
                platform.clone(),
                states.clone(),
                telemetry.clone(),
                options.clone(),
                stats_tx.clone(),
                flow.clone(),
                swap.clone(),
                stats_rx.clone(),
            );
            let leading = leading.clone();
            async move {
                let term = CancellationToken::new();
                let _end = term.clone().drop_guard();
                let _leading = leading.enter();
                info!("leading: scaling, pulling pod stats, swapping serving modes");
                telemetry.autoscaler.leader_changes.inc();
                // Writes are made only while this term lasts (the Lease renewed within its
                // deadline); they stop the moment it ends.
                platform.fence(term.clone());
                tokio::spawn(
                    takeover(
                        platform.clone(),
                        swap.clone(),
                        options.rounds.clone(),
                        telemetry.clone(),
                        term.clone(),
                    )
                    .instrument(tracing::info_span!("takeover")),
                );
                let mut shared_rx = stats_rx.lock().await;
                // Stats from before this term are stale: start from an empty channel.
                while shared_rx.try_recv().is_ok() {}
                let (tx, rx) = mpsc::channel(STATS_CHANNEL);
                let mut scaler = Scaler::new(
                    catalog.clone(),
                    Arc::new(serving::AdoptingPlatform {
                        platform: platform.clone(),
                        swap: swap.clone(),
                    }) as Arc<dyn Platform>,
                    states,
                    &telemetry,
                    options,
                );
                // Adopt every revision (publishing what was found) before a serving task can
                // read its state: a task that ran first would see no state, take the activators
                // for the path and rewrite a revision served by its pods.
                scaler.sync_catalog(tokio::time::Instant::now()).await;
                tokio::spawn(
                    pull::run(
                        pull::MeshTargets::new(platform, mesh),
                        catalog,
                        stats_tx,
                        flow,
                        telemetry.remote.clone(),
                        term.child_token(),
                    )
                    .instrument(tracing::info_span!("pod_stats")),
                );
                tokio::spawn(serving::run(swap, term.child_token()));
                let t = term.clone();
                let scaling = tokio::spawn(scaler.run(rx, async move { t.cancelled().await }));
                loop {
                    tokio::select! {
                        m = shared_rx.recv() => match m {
                            Some(m) => if tx.try_send(m).is_err() {
                                telemetry.activator.stats_dropped.inc();
                            },
                            None => break,
                        },
                        _ = term.cancelled() => break,
                    }
                }
                drop(scaling);
            }
        }
    };
    let leadership = elect(client.clone(), lease, stop.clone(), work)
        .map_err(|e| format!("thaw autoscaler: {e}"))?;
    // The stats token, followed live; the leader creates the Secret when it is absent. Ready
    // once it is known (the first sync is done by now).
    let tokens = token::follow(
        client.clone(),
        &args.system_namespace,
        Some(leadership.subscribe()),
        stop.clone(),
    );
    let ready_tx = Arc::new(ready_tx);
    {
        let (tokens, ready_tx, stop) = (tokens.clone(), ready_tx.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                known = tokens.wait() => if known {
                    let _ = ready_tx.send(true);
                },
                _ = stop.cancelled() => {}
            }
        });
    }
    let port = Arc::new(StatsPort {
        token: tokens,
        leading: leadership.subscribe(),
        stats: stats_tx,
        states: scale_states,
        metrics: telemetry.remote.clone(),
        dropped: telemetry.activator.stats_dropped.clone(),
    });
    tokio::spawn(serve_stats(port, stats_listener, stop.clone()));

    signal_stop().await;
    info!("stopping: releasing the lease");
    let _ = ready_tx.send(false);
    stop.cancel();
    // The election task releases the Lease on stop; give it a moment to finish.
    let mut l = leadership.subscribe();
    let _ = tokio::time::timeout(Duration::from_secs(5), l.wait_for(|v| !*v)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    platform.shutdown();
    info!("thaw autoscaler stopped");
    Ok(())
}

/// Waits until the new term has adopted every revision (the first decision round is done and
/// every serving task has read back and acted once), then records how long that took and how
/// many API writes it made.
async fn takeover(
    platform: crate::platform::kubernetes::KubePlatform,
    swap: Arc<Swap>,
    rounds: Arc<std::sync::atomic::AtomicU64>,
    telemetry: Arc<Telemetry>,
    term: CancellationToken,
) {
    let started = tokio::time::Instant::now();
    let writes = || platform.writes() + swap.writes.load(Ordering::Relaxed);
    let before = writes();
    let round0 = rounds.load(Ordering::Relaxed);
    loop {
        // Give the serving tasks of this term a moment to be spawned before counting them.
        tokio::select! {
            () = term.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        if rounds.load(Ordering::Relaxed) > round0
            && swap.first_pass_pending.load(Ordering::Relaxed) == 0
        {
            break;
        }
    }
    let took = started.elapsed();
    let made = writes() - before;
    telemetry
        .autoscaler
        .takeover_seconds
        .set(took.as_secs_f64());
    telemetry
        .autoscaler
        .takeover_writes
        .set(i64::try_from(made).unwrap_or(i64::MAX));
    info!(took = ?took, writes = made, "takeover complete: every revision adopted");
}

/// What `/revisions` shows of each revision on this replica: the scaler's state (on the
/// leader), the serving mode (written, or found at takeover), and whether pod stats flow.
struct RevisionsView {
    catalog: Arc<crate::revision::RevisionCatalog>,
    states: Arc<ScaleStates>,
    swap: Arc<Swap>,
    flow: Arc<pull::PodStatsFlow>,
    platform: crate::platform::kubernetes::KubePlatform,
}

impl RevisionsView {
    fn json(&self) -> serde_json::Value {
        use crate::platform::EndpointSource;
        let snapshot = self.catalog.load();
        let mut out = Vec::new();
        for rev in snapshot.revisions() {
            let key = &rev.key;
            let state = self.states.get(key);
            let mode = match self.swap.modes.get(key).map(|m| *m) {
                Some(m) => Some((m.mode, m.adopted)),
                None => self.swap.found_mode(key).map(|m| (m, true)),
            };
            let ready = self.platform.endpoints(key).borrow().ready.len();
            let found = self.platform.stored_status(key).unwrap_or_default();
            out.push(serde_json::json!({
                "namespace": &*key.namespace,
                "name": &*key.name,
                "desired": state.as_ref().map(|s| s.desired),
                "ready": ready,
                "activatorInPath": state.as_ref().map(|s| s.activator_in_path),
                "initialized": state.as_ref().is_some_and(|s| s.initialized) || found.initialized,
                "servingMode": mode.map(|(m, _)| match m {
                    serving::Mode::Proxy => "proxy",
                    serving::Mode::Serve => "serve",
                }),
                "servingModeAdopted": mode.map(|(_, a)| a),
                "podStatsFlowing": self.flow.flows(key),
                // Why a pulled revision's pod stats stopped (it returns to the activators).
                "podStats": self.flow.health(key).map(|h| h.reason()),
            }));
        }
        serde_json::json!({ "revisions": out })
    }
}

/// Completes on SIGTERM or SIGINT.
pub(super) async fn signal_stop() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => info!("SIGTERM"),
                _ = i.recv() => info!("SIGINT"),
            }
        }
        _ => std::future::pending().await,
    }
}
