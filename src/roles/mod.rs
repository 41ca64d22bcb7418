//! The Kubernetes roles as processes: `thaw activator` and `thaw autoscaler`. Each wires the
//! parts the roles share with `thaw local` (the activator, the scaler, the catalog) to the
//! Kubernetes platform, the Lease, the live ConfigMaps and the transport between roles.
//!
//! Room: composition only. May use every other room; none uses it.

pub mod activator;
pub mod admin;
pub mod autoscaler;
pub mod controller;
pub mod early_ready;
pub mod mesh;
pub mod pull;
pub mod queue_proxy_stat;
pub mod routes;
pub mod serving;
pub mod share;
pub mod subset;
pub mod webhook;

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::live::{LiveConfig, watch_configmaps};
use crate::platform::kubernetes::revisions::{FollowedRevisions, Follower, follow_revisions};
use crate::platform::kubernetes::service_slices::{ServiceEndpoints, watch_service};
use crate::platform::kubernetes::{KubeOptions, KubePlatform};
use crate::revision::RevisionCatalog;
use crate::telemetry::Telemetry;

/// What both roles follow in the cluster.
pub(crate) struct Followed {
    pub live: LiveConfig,
    pub platform: KubePlatform,
    pub catalog: Arc<RevisionCatalog>,
    pub revisions: FollowedRevisions,
    /// `activator-service`'s ready endpoints (the activator set), when asked for.
    pub activators: Option<watch::Receiver<Arc<ServiceEndpoints>>>,
}

/// Follows the ConfigMaps (listed before anything is resolved against
/// them), then the Revisions into the catalog and the platform, and the activator set (the
/// Service `activator_service`'s endpoints) when named. `None` when a stop signal came
/// first.
pub(crate) async fn follow_cluster(
    client: &kube::Client,
    system_namespace: &str,
    namespace: Option<&str>,
    activator_service: Option<&str>,
    telemetry: &Telemetry,
    stop: &CancellationToken,
) -> Result<Option<Followed>, String> {
    let live = LiveConfig::default();
    let mut config_events = watch_configmaps(
        client.clone(),
        system_namespace,
        live.clone(),
        telemetry.config.clone(),
        stop.clone(),
    );
    // Revisions are resolved against the ConfigMaps: list those first.
    tokio::select! {
        _ = config_events.wait_for(|e| e.listed) => {}
        _ = autoscaler::signal_stop() => return Ok(None),
    }
    let platform = KubePlatform::start(
        client.clone(),
        KubeOptions {
            namespace: namespace.map(String::from),
            ..KubeOptions::default()
        },
        telemetry.platform.clone(),
    );
    let catalog = Arc::new(RevisionCatalog::default());
    let revisions = follow_revisions(
        client.clone(),
        namespace,
        Follower::new(
            catalog.clone(),
            platform.clone(),
            live.clone(),
            telemetry.platform.clone(),
        ),
        config_events,
        stop.clone(),
    );
    let activators = activator_service
        .map(|svc| watch_service(client.clone(), system_namespace, svc, stop.clone()));
    Ok(Some(Followed {
        live,
        platform,
        catalog,
        revisions,
        activators,
    }))
}

/// Runs a role's `work` on a multi-threaded runtime of `threads` workers named `thread_name`;
/// its error, or a runtime that cannot start, is said on stderr and exits 1.
pub(crate) fn run_role(
    role: &str,
    threads: usize,
    thread_name: &str,
    work: impl std::future::Future<Output = Result<(), String>>,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(thread_name)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::cli::say(format_args!("thaw {role}: cannot start the runtime: {e}"));
            return crate::cli::invalid();
        }
    };
    match rt.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            crate::cli::say(msg);
            crate::cli::invalid()
        }
    }
}

/// The Lease timings of a leader-elected role: `config-leader-election` in the system
/// namespace (Knative's keys and defaults, 60s/40s/10s, read at start:
/// [`crate::config::leader_election`]), each overridden by its flag when given.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseTimings {
    /// How long candidates wait after the Lease's last renewal before taking it (whole
    /// seconds); overrides config-leader-election's `lease-duration`.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub lease_duration: Option<std::time::Duration>,
    /// How long the leader keeps trying to renew before it stops leading; overrides
    /// `renew-deadline`.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub renew_deadline: Option<std::time::Duration>,
    /// How often the leader renews and candidates retry; overrides `retry-period`.
    #[arg(long, value_parser = crate::cli::parse_duration)]
    pub retry_period: Option<std::time::Duration>,
}

impl LeaseTimings {
    /// The Lease `namespace/name` held as `identity`: config-leader-election's timings read
    /// from `namespace` through `client`, the flags given over them, checked together; the
    /// error names the role (`thaw autoscaler: invalid lease settings: ...`). Logs the
    /// timings in force and where each came from.
    pub async fn lease(
        &self,
        role: &str,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Result<crate::leader::LeaseSettings, String> {
        let config = crate::config::leader_election::LeaderElectionConfig::read(client, namespace)
            .await
            .map_err(|e| format!("thaw {role}: {e}"))?;
        self.settle(role, &config, namespace, name, identity)
    }

    /// [`LeaseTimings::lease`] over an already read `config`.
    pub fn settle(
        &self,
        role: &str,
        config: &crate::config::leader_election::LeaderElectionConfig,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Result<crate::leader::LeaseSettings, String> {
        let mut lease = crate::leader::LeaseSettings::new(namespace, name, identity);
        lease.lease_duration = self.lease_duration.unwrap_or(config.lease_duration);
        lease.renew_deadline = self.renew_deadline.unwrap_or(config.renew_deadline);
        lease.retry_period = self.retry_period.unwrap_or(config.retry_period);
        lease
            .validate()
            .map_err(|e| format!("thaw {role}: invalid lease settings: {e}"))?;
        let from = |flag: bool| {
            if flag {
                "flag"
            } else {
                "config-leader-election"
            }
        };
        tracing::info!(
            lease = %format!("{namespace}/{name}"),
            lease_duration = ?lease.lease_duration,
            lease_duration_from = from(self.lease_duration.is_some()),
            renew_deadline = ?lease.renew_deadline,
            renew_deadline_from = from(self.renew_deadline.is_some()),
            retry_period = ?lease.retry_period,
            retry_period_from = from(self.retry_period.is_some()),
            "lease timings"
        );
        Ok(lease)
    }
}

/// Whether this replica leads: the `leading` of `/leader` and the role's `leader` gauge.
#[derive(Debug, Clone)]
pub(crate) struct Leading {
    flag: Arc<std::sync::atomic::AtomicBool>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Leading {
    pub(crate) fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        Self {
            flag: Arc::default(),
            gauge,
        }
    }

    /// Whether the leader's work runs now.
    pub(crate) fn get(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Marks the leader's work as running until the guard is dropped (the Lease was lost or
    /// the replica stops).
    pub(crate) fn enter(&self) -> LeadingGuard {
        self.flag.store(true, std::sync::atomic::Ordering::Relaxed);
        self.gauge.set(1);
        LeadingGuard(self.clone())
    }
}

/// Clears [`Leading`] when dropped.
pub(crate) struct LeadingGuard(Leading);

impl Drop for LeadingGuard {
    fn drop(&mut self) {
        self.0
            .flag
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.0.gauge.set(0);
    }
}

/// The Kubernetes client of a role (in-cluster, or `KUBECONFIG`); the error names the role.
pub(crate) async fn kube_client(role: &str) -> Result<kube::Client, String> {
    kube::Client::try_default()
        .await
        .map_err(|e| format!("thaw {role}: no Kubernetes client configuration: {e}"))
}
