//! `config-autoscaler`: Knative's KPA keys (knative-dataplane.md §3.1).

use std::time::Duration;

/// The cluster-wide autoscaler settings, every key of Knative's `config-autoscaler`.
///
/// Values are stored in the unit the decider uses; [`AutoscalerConfig::default`] is Knative's
/// default for every key. Only a value that passed validation is ever held here.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalerConfig {
    /// `pod-autoscaler-class`: which autoscaler owns revisions by default (not validated, as
    /// in Knative).
    pub pod_autoscaler_class: String,
    /// `enable-scale-to-zero`: when false the last replica is never removed.
    pub enable_scale_to_zero: bool,
    /// `allow-zero-initial-scale`: whether `initial-scale` may be 0.
    pub allow_zero_initial_scale: bool,
    /// `max-scale-up-rate`: desired/ready ratio allowed per decision (> 1).
    pub max_scale_up_rate: f64,
    /// `max-scale-down-rate`: ready/desired ratio allowed per decision (> 1).
    pub max_scale_down_rate: f64,
    /// `container-concurrency-target-percentage` as a fraction in (0, 1] (70 -> 0.7).
    pub container_concurrency_target_fraction: f64,
    /// `container-concurrency-target-default`: soft concurrency target per pod.
    pub container_concurrency_target_default: f64,
    /// `requests-per-second-target-default`: RPS target per pod.
    pub requests_per_second_target_default: f64,
    /// `target-burst-capacity`: spare concurrency to keep before the activator leaves the path;
    /// 0 = leave as soon as scaled, -1 = the activator stays in the path always.
    pub target_burst_capacity: f64,
    /// `stable-window`: the averaging window of normal operation, [6s, 1h], whole seconds.
    pub stable_window: Duration,
    /// `panic-window-percentage`: panic window as a percentage of the stable window, [1, 100].
    pub panic_window_percentage: f64,
    /// `panic-threshold-percentage`: panic when desired/ready reaches this percentage,
    /// [110, 1000] (range-checked here, unlike Knative).
    pub panic_threshold_percentage: f64,
    /// `activator-capacity`: concurrent requests one activator is sized for (>= 1).
    pub activator_capacity: f64,
    /// `initial-scale`: replicas a new revision starts with.
    pub initial_scale: u32,
    /// `min-scale`: lower bound on replicas.
    pub min_scale: u32,
    /// `max-scale`: upper bound on replicas; 0 = unbounded.
    pub max_scale: u32,
    /// `max-scale-limit`: the highest max-scale a revision may ask for; 0 = no limit.
    pub max_scale_limit: u32,
    /// `scale-down-delay`: how long a lower desired scale must persist before it is applied.
    pub scale_down_delay: Duration,
    /// `scale-to-zero-grace-period`: how long the activator must be in the path before the last
    /// replica goes.
    pub scale_to_zero_grace_period: Duration,
    /// `scale-to-zero-pod-retention-period`: how long the last replica stays after the revision
    /// became inactive.
    pub scale_to_zero_pod_retention_period: Duration,
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        Self {
            pod_autoscaler_class: "kpa.autoscaling.knative.dev".into(),
            enable_scale_to_zero: true,
            allow_zero_initial_scale: false,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            container_concurrency_target_fraction: 0.7,
            container_concurrency_target_default: 100.0,
            requests_per_second_target_default: 200.0,
            target_burst_capacity: 211.0,
            stable_window: Duration::from_secs(60),
            panic_window_percentage: 10.0,
            panic_threshold_percentage: 200.0,
            activator_capacity: 100.0,
            initial_scale: 1,
            min_scale: 0,
            max_scale: 0,
            max_scale_limit: 0,
            scale_down_delay: Duration::ZERO,
            scale_to_zero_grace_period: Duration::from_secs(30),
            scale_to_zero_pod_retention_period: Duration::ZERO,
        }
    }
}
