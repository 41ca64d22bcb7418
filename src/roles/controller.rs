//! `thaw controller`: Knative's Service, Configuration, Revision and Route reconcilers
//! ([`crate::controller`]) on Kubernetes.
//!
//! Every replica follows the ConfigMaps in `--system-namespace` (validated and reloaded as the
//! files are: an invalid edit is rejected naming the key, and the last good value stays) and
//! runs for the Lease `thaw-controller`. Every replica holds the shared watches from the start
//! ([`crate::controller::informers`]: one per kind and selector, their stores warm in a
//! standby). Only the leader reconciles: on gaining the Lease every kind's controller starts
//! from the warm stores (every object is reconciled once, nothing is listed again); on losing
//! it they are dropped at once; on SIGTERM the Lease is released so another replica
//! takes over without waiting for it to expire. A ConfigMap change re-queues every object.
//!
//! At start it refuses to run beside Knative Serving ([`crate::webhook::coexist`]): both would
//! reconcile the same objects.
//!
//! It follows the proxy tag key's Secret ([`crate::remote::tag_key`]; the leader creates it
//! when absent) to put each revision's proxy tag into its sidecar's environment
//! ([`crate::knative::proxy_tag`]), and the stats token's (read only) for the previous form's
//! tag of Deployments created during the upgrade window. The leader waits a little for the tag
//! key before it reconciles, so revisions are not built without a tag and rolled a moment
//! later.
//!
//! The queue sidecar runs the controller's own image (read from its Pod, `--name`) unless
//! `config-deployment` sets `queue-sidecar-image`: retagging the roles' image retags the
//! sidecar too.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::admin;
use crate::cli::{parse_duration, parse_listen};
use crate::config::deployment::DEFAULT_QUEUE_SIDECAR_IMAGE;
use crate::config::live::{LiveConfig, SYSTEM_NAMESPACE, watch_configmaps};
use crate::controller::{CONTROLLER_NAME, Ctx, CtxOptions, DEFAULT_WORKERS, Settings};
use crate::leader::elect;
use crate::remote::tag_key;
use crate::telemetry::{Telemetry, init_tracing};

/// How long the controller waits for the stats token, and its leader for the tag key, before
/// it starts reconciling.
const TOKEN_WAIT: Duration = Duration::from_secs(5);

/// Arguments of `thaw controller`.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Where the ConfigMaps and the Lease live.
    #[arg(long, default_value = SYSTEM_NAMESPACE, env = "SYSTEM_NAMESPACE")]
    pub system_namespace: String,
    /// Reconcile only this namespace's objects (default: every namespace).
    #[arg(long, env = "THAW_NAMESPACE")]
    pub namespace: Option<String>,
    /// Admin port: /metrics, /healthz, /readyz, /leader.
    #[arg(long, default_value = "0.0.0.0:9090", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// Reconciles run at once per kind (Knative's "threads per controller").
    #[arg(long, default_value_t = DEFAULT_WORKERS, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: u16,
    /// How often every object is reconciled without a change.
    #[arg(long, default_value = "10h", value_parser = parse_duration)]
    pub resync: Duration,
    /// This replica's name: its identity in the Lease and in Events (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub name: Option<String>,
    /// The Lease the replicas run for.
    #[arg(long, default_value = CONTROLLER_NAME)]
    pub lease_name: String,
    /// The Lease's timings.
    #[command(flatten)]
    pub lease_timings: super::LeaseTimings,
    /// Adopt Knative Serving's objects in place (a cluster where Knative ran): a revision's
    /// Services and a route's VirtualServices or HTTPRoutes are taken over only when their
    /// controller chain (ServerlessService, PodAutoscaler; KIngress) leads by UID to the
    /// Revision or Route; Knative's internal objects are removed once thaw serves what they
    /// served. Off: anything owned by another stays NotOwned.
    #[arg(long, env = "THAW_ADOPT_KNATIVE")]
    pub adopt_knative: bool,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// Runs `thaw controller` until SIGTERM or SIGINT.
pub fn main(args: ControllerArgs) -> ExitCode {
    init_tracing(args.log_json);
    super::run_role("controller", 2, "thaw-controller", run(args))
}

/// The settings snapshot of the ConfigMaps in force. `own_image`: this replica's image, the
/// queue sidecar's when `config-deployment` sets no `queue-sidecar-image`.
pub fn snapshot(live: &LiveConfig, own_image: Option<&str>) -> Settings {
    let mut deployment = (**live.deployment.load()).clone();
    if let Some(image) = own_image
        && deployment.queue_sidecar_image == DEFAULT_QUEUE_SIDECAR_IMAGE
    {
        deployment.queue_sidecar_image = image.to_string();
    }
    Settings {
        defaults: (**live.defaults.load()).clone(),
        autoscaler: (**live.autoscaler.load()).clone(),
        gc: (**live.gc.load()).clone(),
        network: crate::config::NetworkConfig {
            domain: (**live.domain.load()).clone(),
            templates: (**live.network.load()).clone(),
            istio: (**live.istio.load()).clone(),
            gateway: (**live.gateway.load()).clone(),
            certmanager: (**live.certmanager.load()).clone(),
        },
        deployment,
        features: (**live.features.load()).clone(),
        proxy_tags: Default::default(),
    }
}

/// The image of this replica's container (`controller`, else the pod's first), read from its
/// Pod `pod` in `namespace`: what the queue sidecar runs unless `config-deployment` names
/// another, so one image setting (the Deployments' `image`, e.g. kustomize's `images:`)
/// covers every role and the sidecar. `None` (logged) outside a pod.
async fn own_image(client: &kube::Client, namespace: &str, pod: &str) -> Option<String> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().fields(&format!("metadata.name={pod}"));
    let found = match pods.list(&lp).await {
        Ok(l) => l.items.into_iter().next(),
        Err(e) => {
            warn!(error = %e, pod, "cannot read this replica's Pod; the queue sidecar's image is config-deployment's or thaw's release image");
            return None;
        }
    };
    let containers = found.and_then(|p| p.spec).map(|s| s.containers);
    let Some(containers) = containers else {
        info!(
            pod,
            namespace,
            default = DEFAULT_QUEUE_SIDECAR_IMAGE,
            "no Pod of this replica; the queue sidecar's image is config-deployment's or the default"
        );
        return None;
    };
    let image = containers
        .iter()
        .find(|c| c.name == "controller")
        .or(containers.first())
        .and_then(|c| c.image.clone())?;
    info!(image = %image, "the queue sidecar runs this replica's image unless config-deployment names one");
    Some(image)
}

/// Every kind's controller, run together until dropped: from the shared watches' stores, so
/// every object is reconciled once at the start (a promotion) with nothing listed again.
pub async fn run_controllers(ctx: Arc<Ctx>) {
    struct Term(Arc<Ctx>);
    impl Drop for Term {
        fn drop(&mut self) {
            self.0.set_leading(false);
        }
    }
    ctx.metrics().leader_terms.inc();
    ctx.set_leading(true);
    let _term = Term(ctx.clone());
    tokio::join!(
        crate::controller::service::controller(ctx.clone()),
        crate::controller::configuration::controller(ctx.clone()),
        crate::controller::route::controller(ctx.clone()),
        crate::controller::domain_mapping::controller(ctx.clone()),
        crate::controller::revision::controller(ctx.clone()),
    );
}

async fn run(args: ControllerArgs) -> Result<(), String> {
    let admin_listener = TcpListener::bind(args.admin_listen).await.map_err(|e| {
        format!(
            "thaw controller: cannot listen on {} (--admin-listen): {e}",
            args.admin_listen
        )
    })?;
    let identity = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", CONTROLLER_NAME, std::process::id()));
    let client = super::kube_client("controller").await?;
    let lease = args
        .lease_timings
        .lease(
            "controller",
            &client,
            &args.system_namespace,
            &args.lease_name,
            &identity,
        )
        .await?;
    for w in crate::webhook::coexist::check(&client, "controller").await? {
        warn!("{w}");
    }
    let stop = CancellationToken::new();
    let telemetry = Arc::new(Telemetry::new());
    let (ready_tx, ready_rx) = watch::channel(false);
    let leading = super::Leading::new(telemetry.controller.leader.clone());
    {
        let (identity, leading) = (identity.clone(), leading.clone());
        let state = Arc::new(admin::AdminState {
            telemetry: telemetry.clone(),
            ready: ready_rx,
            leader: Box::new(move || {
                serde_json::json!({
                    "identity": identity,
                    "leading": leading.get(),
                })
            }),
            revisions: None,
        });
        tokio::spawn(admin::serve(state, admin_listener, stop.clone()));
    }
    info!(identity = %identity, admin = %args.admin_listen, workers = args.workers, "thaw controller starting");

    let live = LiveConfig::default();
    let mut events = watch_configmaps(
        client.clone(),
        &args.system_namespace,
        live.clone(),
        telemetry.config.clone(),
        stop.clone(),
    );
    tokio::select! {
        _ = events.wait_for(|e| e.listed) => {}
        _ = super::autoscaler::signal_stop() => return Ok(()),
    }
    let image = match &args.name {
        Some(pod) => own_image(&client, &args.system_namespace, pod).await,
        None => None,
    };
    // The proxy tag key (only tags go into pods), created by the leader when absent; and the
    // stats token, the previous form's key for Deployments created in the upgrade window.
    // Waited for a little (one list when the Secret exists); past that, a new revision gets
    // its previous-form tag only once it is read.
    let (leading_tx, leading_rx) = watch::channel(false);
    let tag_keys = tag_key::follow(
        client.clone(),
        &args.system_namespace,
        Some(leading_rx),
        stop.clone(),
    );
    let tokens =
        crate::remote::token::follow(client.clone(), &args.system_namespace, None, stop.clone());
    if tokio::time::timeout(TOKEN_WAIT, tokens.wait())
        .await
        .is_err()
    {
        warn!(
            "no stats token yet (the Secret thaw-stats-token, which the autoscaler leader creates): revisions created in the upgrade window get their previous-form proxy tag once it is read"
        );
    }
    let settings = {
        let (live, image) = (live.clone(), image.clone());
        let (tag_keys, tokens) = (tag_keys.clone(), tokens.clone());
        move || {
            let mut s = snapshot(&live, image.as_deref());
            s.proxy_tags = tag_key::controller_keys(&tag_keys, &tokens);
            s
        }
    };
    let ctx = Ctx::with_options(
        client.clone(),
        settings(),
        CtxOptions {
            system_namespace: args.system_namespace.clone(),
            namespace: args.namespace.clone(),
            resync: args.resync,
            workers: args.workers,
            instance: Some(identity.clone()),
            metrics: Some(telemetry.controller.clone()),
            adopt: args.adopt_knative,
        },
    );
    if args.adopt_knative {
        info!("adopting Knative Serving's objects along their ownership chains (--adopt-knative)");
    }
    // Every replica watches from the start; only the leader reconciles.
    let watches = crate::controller::warm(&ctx);
    info!(watches, "shared watches started");
    // Each ConfigMap change, a new tag key and a new stats token put a new snapshot in force
    // (and re-queue everything: a rotated tag key rolls the revisions to their new tags; a
    // rotated stats token changes no template).
    {
        let (ctx, stop, settings) = (ctx.clone(), stop.clone(), settings.clone());
        let (mut tag_keys, mut tokens) = (tag_keys.clone(), tokens);
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        r = events.changed() => if r.is_err() { return },
                        changed = tag_keys.changed() => if !changed { return },
                        changed = tokens.changed() => if !changed { return },
                    }
                    ctx.set_settings(settings());
                }
            }
            .instrument(tracing::info_span!("settings")),
        );
    }
    let work = {
        let (ctx, leading, tag_keys) = (ctx.clone(), leading.clone(), tag_keys.clone());
        move || {
            let (ctx, leading, tag_keys) = (ctx.clone(), leading.clone(), tag_keys.clone());
            let settings = settings.clone();
            async move {
                let _guard = leading.enter();
                // This leader creates the tag key when it is absent: wait a little for it.
                if tokio::time::timeout(TOKEN_WAIT, tag_keys.wait())
                    .await
                    .is_err()
                {
                    warn!(
                        "no proxy tag key yet (the Secret {}): revisions get their tag once it is read",
                        tag_key::SECRET_NAME
                    );
                }
                ctx.set_settings(settings());
                run_controllers(ctx).await;
            }
        }
    };
    let leadership =
        elect(client, lease, stop.clone(), work).map_err(|e| format!("thaw controller: {e}"))?;
    // The tag key's follower creates the Secret while this replica leads.
    {
        let mut leader = leadership.subscribe();
        tokio::spawn(async move {
            loop {
                leading_tx.send_replace(*leader.borrow_and_update());
                if leader.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    let _ = ready_tx.send(true);
    super::autoscaler::signal_stop().await;
    info!("stopping: releasing the lease");
    let _ = ready_tx.send(false);
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ControllerArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    #[test]
    fn adoption_is_off_unless_asked_for() {
        let off = Cli::try_parse_from(["thaw"]).unwrap();
        assert!(!off.args.adopt_knative);
        let on = Cli::try_parse_from(["thaw", "--adopt-knative"]).unwrap();
        assert!(on.args.adopt_knative);
    }
}
