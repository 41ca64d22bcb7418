//! Live ConfigMaps on Kubernetes: `config-autoscaler`, `config-defaults`, `config-activator`,
//! `config-gc`, `config-deployment`, `config-features` and the network ones (`config-domain`,
//! `config-network`, `config-istio`, `config-gateway`, `config-certmanager`) in the system namespace (`--system-namespace`, default
//! `thaw-system`),
//! followed through one watch of that namespace and validated exactly as the files are
//! ([`super::reload::apply`], under [`super::keys`]'s rule): a key with no effect in thaw is
//! accepted, named in a WARN line and counted in `thaw_config_ineffective_keys{config_map}`;
//! a valid update is swapped in; an invalid one is rejected with
//! each key, value and reason logged, counted in `thaw_config_reload_rejected_total`, and the
//! last good configuration keeps serving. A ConfigMap that is missing (or deleted) leaves the
//! value in force (the defaults, or the last good one) and says so in the log.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap as KubeConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::keys::ConfigMap;
use super::network::{CertManagerConfig, DomainConfig, GatewayConfig, IstioConfig, TemplateConfig};
use super::reload::{Outcome, apply};
use super::{
    ActivatorConfig, AutoscalerConfig, DefaultsConfig, DeploymentConfig, FeaturesConfig, GcConfig,
};
use crate::telemetry::config::{ConfigLabels, ConfigMetrics};

/// The default system namespace (`--system-namespace`).
pub const SYSTEM_NAMESPACE: &str = "thaw-system";

/// Where each ConfigMap's valid value lives; readers load from these.
#[derive(Debug, Clone, Default)]
pub struct LiveConfig {
    pub autoscaler: Arc<ArcSwap<AutoscalerConfig>>,
    pub defaults: Arc<ArcSwap<DefaultsConfig>>,
    pub activator: Arc<ArcSwap<ActivatorConfig>>,
    /// `config-gc` (read by the controller only).
    pub gc: Arc<ArcSwap<GcConfig>>,
    /// `config-domain` (read by the controller only).
    pub domain: Arc<ArcSwap<DomainConfig>>,
    /// `config-network`'s templates (read by the controller only).
    pub network: Arc<ArcSwap<TemplateConfig>>,
    /// `config-istio`'s gateways (read by the controller only).
    pub istio: Arc<ArcSwap<IstioConfig>>,
    /// `config-gateway`'s Gateway API gateways (read by the controller only).
    pub gateway: Arc<ArcSwap<GatewayConfig>>,
    /// `config-certmanager`'s issuer (read by the controller only).
    pub certmanager: Arc<ArcSwap<CertManagerConfig>>,
    /// `config-deployment` (read by the controller only).
    pub deployment: Arc<ArcSwap<DeploymentConfig>>,
    /// `config-features` (read by the controller only).
    pub features: Arc<ArcSwap<FeaturesConfig>>,
}

/// One update seen by the watch, numbered so a waiter can tell a new one from one it has seen.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveEvent {
    pub generation: u64,
    /// The ConfigMap's name; empty for the initial value.
    pub name: String,
    /// `None` for the initial value.
    pub outcome: Option<Outcome>,
    /// The namespace's ConfigMaps have been listed once (what was there is applied): a role
    /// waits for this before resolving revisions against the configuration.
    pub listed: bool,
}

/// Watches the three ConfigMaps in `namespace` and keeps `config` at their last valid values
/// until `stop`. A `data` map equal to the one last seen for that ConfigMap (a re-list after a
/// reconnect) is not applied again. Returns the events at once; the watch runs in a task.
pub fn watch_configmaps(
    client: kube::Client,
    namespace: &str,
    config: LiveConfig,
    metrics: ConfigMetrics,
    stop: CancellationToken,
) -> watch::Receiver<LiveEvent> {
    let (tx, rx) = watch::channel(LiveEvent {
        generation: 0,
        name: String::new(),
        outcome: None,
        listed: false,
    });
    let api: Api<KubeConfigMap> = Api::namespaced(client, namespace);
    let span = tracing::info_span!("watch", resource = "configmaps", namespace = %namespace);
    tokio::spawn(
        async move {
            let mut s =
                std::pin::pin!(watch_stream(api, watcher::Config::default()).default_backoff());
            let mut last: HashMap<String, BTreeMap<String, String>> = HashMap::new();
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                let cm = match ev {
                    None => return,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "configmap watch error; resuming");
                        continue;
                    }
                    Some(Ok(Event::Apply(cm) | Event::InitApply(cm))) => cm,
                    Some(Ok(Event::Delete(cm))) => {
                        if is_ours(&cm.name_any()) {
                            tracing::warn!(config = %cm.name_any(),
                                "ConfigMap deleted; the last good configuration stays in force");
                            last.remove(&cm.name_any());
                        }
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        tx.send_if_modified(|e| !std::mem::replace(&mut e.listed, true));
                        continue;
                    }
                    Some(Ok(Event::Init)) => continue,
                };
                let name = cm.name_any();
                if !is_ours(&name) {
                    continue;
                }
                let data = cm.data.unwrap_or_default();
                if last.get(&name) == Some(&data) {
                    continue;
                }
                let labels = ConfigLabels {
                    config: name.clone(),
                };
                let span = tracing::info_span!("configmap", config = %name);
                let outcome = span.in_scope(|| match name.as_str() {
                    super::autoscaler::NAME => apply(
                        parse::<AutoscalerConfig>(&data, &metrics),
                        &config.autoscaler,
                        &metrics,
                        &labels,
                    ),
                    super::defaults::NAME => apply(
                        parse::<DefaultsConfig>(&data, &metrics),
                        &config.defaults,
                        &metrics,
                        &labels,
                    ),
                    super::gc::NAME => apply(
                        parse::<GcConfig>(&data, &metrics),
                        &config.gc,
                        &metrics,
                        &labels,
                    ),
                    super::network::DOMAIN_NAME => apply(
                        parse::<DomainConfig>(&data, &metrics),
                        &config.domain,
                        &metrics,
                        &labels,
                    ),
                    super::network::NETWORK_NAME => apply(
                        parse::<TemplateConfig>(&data, &metrics),
                        &config.network,
                        &metrics,
                        &labels,
                    ),
                    super::network::ISTIO_NAME => apply(
                        parse::<IstioConfig>(&data, &metrics),
                        &config.istio,
                        &metrics,
                        &labels,
                    ),
                    super::network::GATEWAY_NAME => apply(
                        parse::<GatewayConfig>(&data, &metrics),
                        &config.gateway,
                        &metrics,
                        &labels,
                    ),
                    super::network::CERTMANAGER_NAME => apply(
                        parse::<CertManagerConfig>(&data, &metrics),
                        &config.certmanager,
                        &metrics,
                        &labels,
                    ),
                    super::deployment::NAME => apply(
                        parse::<DeploymentConfig>(&data, &metrics),
                        &config.deployment,
                        &metrics,
                        &labels,
                    ),
                    super::features::NAME => apply(
                        parse::<FeaturesConfig>(&data, &metrics),
                        &config.features,
                        &metrics,
                        &labels,
                    ),
                    _ => apply(
                        parse::<ActivatorConfig>(&data, &metrics),
                        &config.activator,
                        &metrics,
                        &labels,
                    ),
                });
                last.insert(name.clone(), data);
                tx.send_modify(|e| {
                    e.generation += 1;
                    e.name = name;
                    e.outcome = Some(outcome);
                });
            }
        }
        .instrument(span),
    );
    rx
}

fn is_ours(name: &str) -> bool {
    // config-leader-election is read once, at start (a role's Lease timings do not change
    // under it); every other ConfigMap thaw reads follows live.
    name != super::leader_election::NAME && super::migrate::READ_BY_THAW.contains(&name)
}

/// Parses one ConfigMap under [`super::keys`]'s rule: each key with no effect in thaw is
/// named in a WARN line and counted in `thaw_config_ineffective_keys{config_map}` (the
/// ConfigMap as last read, applied or not); only invalid values make it an error.
fn parse<T: ConfigMap>(
    data: &BTreeMap<String, String>,
    metrics: &ConfigMetrics,
) -> Result<T, super::Problems> {
    let warnings = T::warnings(data);
    for w in &warnings {
        tracing::warn!(
            config = T::NAME,
            key = super::keys::warning_key(w),
            "{w} (accepted: the key has no effect in thaw)"
        );
    }
    metrics.set_ineffective(T::NAME, warnings.len());
    T::parse(data).map(|p| p.config)
}
