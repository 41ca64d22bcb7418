//! `thaw webhook`: Knative's defaulting and validating admission webhooks
//! ([`crate::webhook`]) on Kubernetes, with certificates it manages itself.
//!
//! Every replica follows the ConfigMaps in `--system-namespace` (as the controller does:
//! `config-defaults`, `config-features`, `config-autoscaler` reload live) and the certificate
//! Secret, and serves admission on `--listen` (TLS) once a certificate is loaded; `/readyz`
//! on the admin port says ready from then on. One replica, the holder of the Lease
//! `thaw-webhook`, writes: the Secret (created, rotated) and the `caBundle` of the two webhook
//! configurations. At start the role refuses to run beside Knative Serving
//! ([`crate::webhook::coexist`]).

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
use crate::config::live::{LiveConfig, SYSTEM_NAMESPACE, watch_configmaps};
use crate::leader::elect;
use crate::telemetry::{Telemetry, init_tracing};
use crate::webhook::certs::Lifetimes;
use crate::webhook::rotation::{CertTarget, follow_secret, manage};
use crate::webhook::server::{Admitter, CertSlot, Limits, serve, tls_config};

/// The Lease, the Service and the configurations' default name.
pub const WEBHOOK_NAME: &str = "thaw-webhook";
/// The certificate Secret's default name.
pub const CERTS_SECRET: &str = "thaw-webhook-certs";

/// Arguments of `thaw webhook`.
#[derive(Debug, clap::Args)]
pub struct WebhookArgs {
    /// Where the ConfigMaps, the certificate Secret and the Lease live.
    #[arg(long, default_value = SYSTEM_NAMESPACE, env = "SYSTEM_NAMESPACE")]
    pub system_namespace: String,
    /// The admission port (HTTPS).
    #[arg(long, default_value = "0.0.0.0:8443", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Admin port: /metrics, /healthz, /readyz, /leader.
    #[arg(long, default_value = "0.0.0.0:9090", value_parser = parse_listen)]
    pub admin_listen: SocketAddr,
    /// The webhook's Service (the certificate's DNS names).
    #[arg(long, default_value = WEBHOOK_NAME)]
    pub service: String,
    /// The certificate Secret.
    #[arg(long, default_value = CERTS_SECRET)]
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose caBundle this role keeps current.
    #[arg(long, default_value = WEBHOOK_NAME)]
    pub validating_configuration: String,
    /// The MutatingWebhookConfiguration whose caBundle this role keeps current.
    #[arg(long, default_value = WEBHOOK_NAME)]
    pub mutating_configuration: String,
    /// How long a new CA and serving certificate are valid.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    pub cert_validity: Duration,
    /// Rotate when less than this is left of the served certificate.
    #[arg(long, default_value = "168h", value_parser = parse_duration)]
    pub cert_rotate_before: Duration,
    /// How long a new CA is in the configurations' caBundle before its certificate is served
    /// (the API server's informers catch up meanwhile).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub cert_publish_delay: Duration,
    /// How often the leader checks the certificates and the caBundles.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cert_check_interval: Duration,
    /// Most connections open at once. At the limit a new connection takes the place of the
    /// oldest one with no request in flight (which is closed); it is closed at once only when
    /// every open connection has a request in flight.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Largest AdmissionReview body accepted, in bytes (an object and its old version of up
    /// to etcd's 1.5 MiB each, and the review around them).
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_body: usize,
    /// Time for the TLS handshake, and for each request's head after the connection's start or
    /// previous response (an idle connection is closed after it).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// Time for a request's body from its head on; beyond it the request is answered 408 and
    /// its connection closed (the API server's own timeout is the configurations'
    /// `timeoutSeconds`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// This replica's name: its identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub name: Option<String>,
    /// The Lease the replicas run for (the one that manages the certificates).
    #[arg(long, default_value = WEBHOOK_NAME)]
    pub lease_name: String,
    /// The Lease's timings.
    #[command(flatten)]
    pub lease_timings: super::LeaseTimings,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// Runs `thaw webhook` until SIGTERM or SIGINT.
pub fn main(args: WebhookArgs) -> ExitCode {
    init_tracing(args.log_json);
    super::run_role("webhook", 2, "thaw-webhook", run(args))
}

fn lifetimes(args: &WebhookArgs) -> Result<Lifetimes, String> {
    let d = |d: Duration| time::Duration::try_from(d).unwrap_or(time::Duration::MAX);
    let l = Lifetimes {
        validity: d(args.cert_validity),
        rotate_before: d(args.cert_rotate_before),
        publish_delay: d(args.cert_publish_delay),
    };
    l.validate().map_err(|e| format!("thaw webhook: {e}"))?;
    Ok(l)
}

async fn run(args: WebhookArgs) -> Result<(), String> {
    let life = lifetimes(&args)?;
    let bind = |addr: SocketAddr, flag: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| format!("thaw webhook: cannot listen on {addr} ({flag}): {e}"))
    };
    let admin_listener = bind(args.admin_listen, "--admin-listen").await?;
    let listener = bind(args.listen, "--listen").await?;
    let identity = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{WEBHOOK_NAME}-{}", std::process::id()));
    let client = super::kube_client("webhook").await?;
    let lease = args
        .lease_timings
        .lease(
            "webhook",
            &client,
            &args.system_namespace,
            &args.lease_name,
            &identity,
        )
        .await?;
    for w in crate::webhook::coexist::check(&client, "webhook").await? {
        warn!("{w}");
    }
    let stop = CancellationToken::new();
    let telemetry = Arc::new(Telemetry::new());
    let metrics = telemetry.webhook.clone();
    let slot = Arc::new(CertSlot::default());
    let (ready_tx, ready_rx) = watch::channel(false);
    let leading = super::Leading::new(metrics.leader.clone());
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
    info!(identity = %identity, listen = %args.listen, admin = %args.admin_listen, "thaw webhook starting");

    // The settings admission runs against, swapped on each ConfigMap change.
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
    let settings = Arc::new(arc_swap::ArcSwap::from_pointee(
        super::controller::snapshot(&live, None),
    ));
    {
        let (settings, live, stop) = (settings.clone(), live.clone(), stop.clone());
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        r = events.changed() => if r.is_err() { return },
                    }
                    settings.store(Arc::new(super::controller::snapshot(&live, None)));
                }
            }
            .instrument(tracing::info_span!("settings")),
        );
    }

    let target = CertTarget {
        namespace: args.system_namespace.clone(),
        secret: args.secret.clone(),
        service: args.service.clone(),
        validating: args.validating_configuration.clone(),
        mutating: args.mutating_configuration.clone(),
        lifetimes: life,
        interval: args.cert_check_interval,
    };
    tokio::spawn(
        follow_secret(
            client.clone(),
            target.clone(),
            slot.clone(),
            metrics.clone(),
            stop.clone(),
        )
        .instrument(tracing::info_span!("certificate_secret")),
    );
    let admitter = Arc::new(Admitter {
        settings,
        metrics: metrics.clone(),
        limits: Limits {
            max_connections: args.max_connections.max(1),
            max_body: args.max_body,
            handshake_timeout: args.handshake_timeout,
            request_timeout: args.request_timeout,
        },
    });
    let tls = tls_config(slot.clone()).map_err(|e| format!("thaw webhook: {e}"))?;
    tokio::spawn(serve(listener, tls, admitter, stop.clone()));

    let work = {
        let (client, target, metrics, leading, slot, stop) = (
            client.clone(),
            target.clone(),
            metrics.clone(),
            leading.clone(),
            slot.clone(),
            stop.clone(),
        );
        move || {
            let (client, target, metrics, leading, slot, stop) = (
                client.clone(),
                target.clone(),
                metrics.clone(),
                leading.clone(),
                slot.clone(),
                stop.clone(),
            );
            async move {
                let _guard = leading.enter();
                manage(client, target, metrics, slot, stop).await;
            }
        }
    };
    let _leadership =
        elect(client, lease, stop.clone(), work).map_err(|e| format!("thaw webhook: {e}"))?;

    // Ready once a certificate is served.
    let ready = async {
        while !slot.loaded() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = ready_tx.send(true);
        info!("serving admission");
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = ready => {}
        _ = super::autoscaler::signal_stop() => {}
    }
    info!("stopping: releasing the lease");
    let _ = ready_tx.send(false);
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}
