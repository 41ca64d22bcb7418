//! Typed configuration with Knative's key names, defaults, units and validation.
//!
//! These ConfigMaps are understood:
//! - `config-autoscaler` ([`AutoscalerConfig`]): Knative's KPA keys, with one fix over Knative
//!   (`panic-threshold-percentage` is range-checked to [110, 1000]);
//! - `config-defaults` ([`DefaultsConfig`]): Knative's revision defaults (timeouts, concurrency);
//! - `config-activator` ([`ActivatorConfig`]): thaw's own activator limits;
//! - `config-gc` ([`GcConfig`]): Knative's revision garbage collection;
//! - `config-domain`, `config-network`, `config-istio` and `config-gateway`
//!   ([`NetworkConfig`]): the route's domains, host templates, ingress class and gateways.
//! - `config-deployment` ([`DeploymentConfig`]): the revision Deployments the controller writes
//!   (queue sidecar image and resources, progress deadline).
//! - `config-features` ([`FeaturesConfig`]): Knative's feature flags opening pod-spec fields
//!   to Service authors, and the secure pod defaults.
//! - `config-leader-election` ([`leader_election::LeaderElectionConfig`]): Knative's Lease
//!   timings, read when a leader-elected role starts.
//!
//! Per revision, `autoscaling.knative.dev/*` and `activator.thaw.dev/*` annotations override the
//! ConfigMaps; [`AutoscalingSpec`] and [`crate::revision::RevisionSpec`] are the effective result
//! (annotation over ConfigMap over default).
//!
//! Every parse reports *all* problems as [`Problem`]s naming the key, the value and the reason.
//! Only a fully valid config is ever stored for serving (see [`reload`]). One rule decides
//! between refusing and accepting everywhere ([`keys`]): only an invalid value of a key thaw
//! implements is refused; a key with no effect in thaw is accepted and named.
//! [`migrate`] carries Knative Serving's ConfigMaps over to thaw's under the same rule.
//!
//! Room: parsing, validation and live reload of settings. May use: `telemetry` (reload
//! counters), `revision`'s types, and `local`'s model (`config check` reads local.yaml); no
//! role.

pub mod activator;
pub mod annotations;
pub mod autoscaler;
pub mod check;
pub mod defaults;
pub mod deployment;
pub mod features;
pub mod gc;
pub mod keys;
pub mod leader_election;
pub mod live;
pub mod load;
pub mod migrate;
pub mod network;
pub mod parse;
pub mod reload;
pub mod revision;

#[cfg(test)]
mod tests;

pub use activator::{ActivatorConfig, ActivatorOverrides, TrustedProxies};
pub use annotations::{Aggregation, AutoscalingSpec, Metric};
pub use autoscaler::AutoscalerConfig;
pub use defaults::DefaultsConfig;
pub use deployment::DeploymentConfig;
pub use features::FeaturesConfig;
pub use gc::GcConfig;
pub use keys::ConfigMap;
pub use network::NetworkConfig;
pub use parse::{Problem, Problems};

use std::sync::Arc;

/// The ConfigMaps a running thaw serves with, each swapped independently on reload.
#[derive(Debug, Clone, Default)]
pub struct ConfigSet {
    pub autoscaler: Arc<AutoscalerConfig>,
    pub defaults: Arc<DefaultsConfig>,
    pub activator: Arc<ActivatorConfig>,
    pub gc: Arc<GcConfig>,
}
