//! Per-revision `autoscaling.knative.dev/*` annotations and the effective [`AutoscalingSpec`].

use std::time::Duration;

/// The metric the KPA scales on (`autoscaling.knative.dev/metric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metric {
    /// In-flight requests per pod (Knative's default).
    #[default]
    Concurrency,
    /// Requests per second per pod.
    Rps,
}

/// How a window's buckets are averaged (`autoscaling.knative.dev/metric-aggregation-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Plain average over the valid buckets (Knative's default).
    #[default]
    Linear,
    /// Σ α(1−α)^i · bucket[newest−i], α = max(1 − 0.0001^(1/buckets), 0.2).
    WeightedExponential,
}

/// A revision's effective autoscaling settings: annotation over ConfigMap over default, with
/// target, utilisation and containerConcurrency already combined (knative-dataplane.md §2.3).
///
/// This is what the decider and the scaler read; it is always valid.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalingSpec {
    /// `class`: `kpa.autoscaling.knative.dev` unless an annotation says otherwise.
    pub class: String,
    pub metric: Metric,
    pub aggregation: Aggregation,
    /// The revision's containerConcurrency (0 = unlimited).
    pub container_concurrency: u32,
    /// Per-pod target before utilisation: containerConcurrency when > 0, else the ConfigMap
    /// default, overridden by the `target` annotation (capped at containerConcurrency when > 0).
    pub total_value: f64,
    /// Target utilisation as a fraction (0.7 by default).
    pub target_utilization: f64,
    /// max(0.01, total_value × target_utilization): what one pod should carry.
    pub target_value: f64,
    /// Spare capacity to keep before the activator leaves the path (-1 = always in path).
    pub target_burst_capacity: f64,
    /// panic-threshold-percentage / 100 (2.0 by default).
    pub panic_threshold: f64,
    pub stable_window: Duration,
    /// round(stable × panic-window-percentage / 100), whole seconds, at least 1s.
    pub panic_window: Duration,
    pub max_scale_up_rate: f64,
    pub max_scale_down_rate: f64,
    /// Minimum replicas once the revision is active at all (1 = no effect).
    pub activation_scale: u32,
    pub min_scale: u32,
    /// 0 = unbounded.
    pub max_scale: u32,
    pub initial_scale: u32,
    pub scale_down_delay: Duration,
    pub scale_to_zero_grace_period: Duration,
    pub scale_to_zero_pod_retention_period: Duration,
    pub enable_scale_to_zero: bool,
    pub activator_capacity: f64,
    /// How long a revision may stay activating before it is given up (progress deadline + 30s).
    pub activation_timeout: Duration,
}

impl Default for AutoscalingSpec {
    /// Knative's defaults for a revision with containerConcurrency 0 and no annotations.
    fn default() -> Self {
        Self {
            class: "kpa.autoscaling.knative.dev".into(),
            metric: Metric::Concurrency,
            aggregation: Aggregation::Linear,
            container_concurrency: 0,
            total_value: 100.0,
            target_utilization: 0.7,
            target_value: 70.0,
            target_burst_capacity: 211.0,
            panic_threshold: 2.0,
            stable_window: Duration::from_secs(60),
            panic_window: Duration::from_secs(6),
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            activation_scale: 1,
            min_scale: 0,
            max_scale: 0,
            initial_scale: 1,
            scale_down_delay: Duration::ZERO,
            scale_to_zero_grace_period: Duration::from_secs(30),
            scale_to_zero_pod_retention_period: Duration::ZERO,
            enable_scale_to_zero: true,
            activator_capacity: 100.0,
            activation_timeout: Duration::from_secs(630),
        }
    }
}
