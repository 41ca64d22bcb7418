//! Tracing and metrics: the tracing subscriber, the one Prometheus [`Registry`] and every metric
//! name (one file per part: [`activator`], [`autoscaler`], [`platform`], [`config`]).
//!
//! Families are registered once, at start-up, in [`Telemetry::new`]. Per-revision children are
//! resolved once per revision and kept in that revision's state; the request path increments
//! handles, it never looks labels up.
//!
//! Room: the tracing subscriber and every metric family. May use: `percore` (spread cells),
//! `revision` (label values), `config`; no role imports telemetry's users.

pub mod activator;
pub mod autoscaler;
pub mod config;
pub mod controller;
pub mod exposition;
pub mod platform;
pub mod process;
pub mod queue;
pub mod remote;
pub mod webhook;

use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tracing_subscriber::EnvFilter;

/// A metric registered so that its family's HELP and TYPE lines are exposed from the start,
/// before its first series: prometheus-client leaves out a family with no series
/// (`EncodeMetric::is_empty`), which breaks dashboards and alerts written against it until
/// the first event. Wrap a per-revision `Family` in it when registering.
#[derive(Debug, Clone)]
pub struct Listed<M>(pub M);

impl<M: prometheus_client::encoding::EncodeMetric> prometheus_client::encoding::EncodeMetric
    for Listed<M>
{
    fn encode(
        &self,
        encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// Which families a process exports: all of them in the cluster roles, only those that can
/// move in `thaw local` there (no leader, no Kubernetes watches, no stats over the network),
/// so a local `/metrics` holds no series that reads like an alert (`thaw_controller_leader 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Local,
    Cluster,
}

/// Every metric family thaw exports, and the registry that encodes them.
#[derive(Debug)]
pub struct Telemetry {
    registry: Registry,
    pub config: config::ConfigMetrics,
    pub platform: platform::PlatformMetrics,
    pub activator: activator::ActivatorMetrics,
    pub autoscaler: autoscaler::AutoscalerMetrics,
    pub remote: remote::RemoteMetrics,
    pub controller: controller::ControllerMetrics,
    pub webhook: webhook::WebhookMetrics,
}

impl Telemetry {
    /// Registers every family: thaw's under the `thaw` prefix, the standard `process_*` ones
    /// without it.
    pub fn new() -> Self {
        Self::scoped(Scope::Cluster)
    }

    /// Registers the families `thaw local` can move ([`Scope::Local`]); the others exist
    /// (the roles' code records into them) but are not exported.
    pub fn local() -> Self {
        Self::scoped(Scope::Local)
    }

    fn scoped(scope: Scope) -> Self {
        let mut registry = Registry::default();
        process::register(&mut registry);
        let thaw = registry.sub_registry_with_prefix("thaw");
        process::register_build_info(thaw);
        let config = config::ConfigMetrics::register(thaw);
        let platform = platform::PlatformMetrics::register_scoped(thaw, scope);
        let activator = activator::ActivatorMetrics::register(thaw);
        let autoscaler = autoscaler::AutoscalerMetrics::register_scoped(thaw, scope);
        let (remote, controller, webhook) = match scope {
            Scope::Cluster => (
                remote::RemoteMetrics::register(thaw),
                controller::ControllerMetrics::register(thaw),
                webhook::WebhookMetrics::register(thaw),
            ),
            Scope::Local => (
                remote::RemoteMetrics::default(),
                controller::ControllerMetrics::unregistered(),
                webhook::WebhookMetrics::unregistered(),
            ),
        };
        Self {
            registry,
            config,
            platform,
            activator,
            autoscaler,
            remote,
            controller,
            webhook,
        }
    }

    /// The OpenMetrics text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("encoding metrics into a String");
        out
    }

    /// The exposition a scraper sending `accept` asks for ([`exposition::Format::negotiate`]),
    /// with its content type.
    pub fn encode_for(&self, accept: Option<&str>) -> (String, &'static str) {
        let format = exposition::Format::negotiate(accept);
        let om = self.encode();
        let body = match format {
            exposition::Format::OpenMetrics => om,
            exposition::Format::Classic => exposition::to_classic(&om),
        };
        (body, format.content_type())
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

/// Installs the global tracing subscriber: `RUST_LOG` if set, else `info`; JSON lines when
/// `json` is true (production), human-readable otherwise. Safe to call more than once (later
/// calls are ignored).
pub fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal; log files and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A closed stderr (`thaw local 2>&1 | head -2`) must not stop thaw: by default the fmt
    // layer reports a failed write with `eprintln!`, which panics on that same closed pipe.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
