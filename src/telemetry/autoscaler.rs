//! Metrics of the autoscaler: per-revision gauges of its decisions, and the cost of deciding.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// A gauge holding a fraction (observed concurrency, targets).
pub type FloatGauge = Gauge<f64, AtomicU64>;

/// Labels of the observed-load and target gauges: the revision and the metric it scales on
/// (`concurrency`, in requests in flight, or `rps`, in requests per second).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct MetricLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name.
    pub revision: String,
    /// `concurrency` or `rps`.
    pub metric: &'static str,
}

/// Labels of the per-revision gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RevisionLabels {
    /// The revision's namespace.
    pub namespace: String,
    /// The revision's name.
    pub revision: String,
}

/// Labels of rejected stats: why (see `autoscaler::collector::Rejected::label`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RejectLabels {
    /// A `Rejected::label()`.
    pub reason: &'static str,
}

/// Labels of the leader's API writes: what was written (`scale`, `endpointslices`,
/// `revisionstatus`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WriteLabels {
    /// The resource written.
    pub resource: &'static str,
}

/// The autoscaler's metric families. Per-revision children are resolved once when the scaler
/// starts tracking a revision and removed when it forgets it.
#[derive(Debug, Clone)]
pub struct AutoscalerMetrics {
    /// `thaw_autoscaler_desired_pods{namespace,revision}`: replicas asked of the platform.
    pub desired_pods: Family<RevisionLabels, Gauge>,
    /// `thaw_autoscaler_ready_pods{namespace,revision}`: ready endpoints at the last decision.
    pub ready_pods: Family<RevisionLabels, Gauge>,
    /// `thaw_autoscaler_panic_mode{namespace,revision}`: 1 while the decider panics.
    pub panic_mode: Family<RevisionLabels, Gauge>,
    /// `thaw_autoscaler_excess_burst_capacity{namespace,revision}`: negative keeps the
    /// activator in the path.
    pub excess_burst_capacity: Family<RevisionLabels, Gauge>,
    /// `thaw_autoscaler_observed_stable{namespace,revision,metric}`: the stable-window average
    /// the last decision saw (Knative's `autoscaler_stable_request_concurrency` /
    /// `_requests_per_second`), for the whole revision.
    pub observed_stable: Family<MetricLabels, FloatGauge>,
    /// `thaw_autoscaler_observed_panic{namespace,revision,metric}`: the panic-window average.
    pub observed_panic: Family<MetricLabels, FloatGauge>,
    /// `thaw_autoscaler_target_per_pod{namespace,revision,metric}`: what one pod should carry
    /// (Knative's `autoscaler_target_concurrency_per_pod`).
    pub target_per_pod: Family<MetricLabels, FloatGauge>,
    /// `thaw_autoscaler_decision_seconds`: time to decide one round (a tick over every
    /// revision, or one poked revision), platform calls included.
    pub decision_seconds: Histogram,
    /// `thaw_autoscaler_stats_rejected_total{reason}`: stats not recorded.
    pub stats_rejected: Family<RejectLabels, Counter>,
    /// `thaw_autoscaler_stats_clamped_total`: stats recorded at the ceilings
    /// (`stats::MAX_STAT_CONCURRENCY`, `stats::MAX_STAT_REQUESTS`) instead of their values.
    pub stats_clamped: Counter,
    /// `thaw_autoscaler_scale_errors_total`: platform scale calls that failed or timed out
    /// (retried at the next decision).
    pub scale_errors: Counter,
    /// `thaw_autoscaler_leader`: 1 while this replica leads (scales, pulls pod stats, writes),
    /// as `thaw_controller_leader` and `thaw_webhook_leader` for their roles.
    pub leader: Gauge,
    /// `thaw_autoscaler_leader_changes_total`: times this replica became the leader (summed
    /// over the replicas: the leader changes; alert on its rate).
    pub leader_changes: Counter,
    /// `thaw_autoscaler_takeover_seconds`: the last takeover, from acquiring the Lease to
    /// every revision adopted (first decision round, every serving mode read back).
    pub takeover_seconds: FloatGauge,
    /// `thaw_autoscaler_takeover_writes`: API writes the last takeover made (target 0 on a
    /// steady cluster).
    pub takeover_writes: Gauge,
    /// `thaw_autoscaler_api_writes_total{resource}`: writes of public EndpointSlices and
    /// Revision status by the leader (`/scale` patches: `thaw_platform_scale_patches_total`).
    pub api_writes: Family<WriteLabels, Counter>,
}

impl Default for AutoscalerMetrics {
    fn default() -> Self {
        Self {
            desired_pods: Family::default(),
            ready_pods: Family::default(),
            panic_mode: Family::default(),
            excess_burst_capacity: Family::default(),
            observed_stable: Family::default(),
            observed_panic: Family::default(),
            target_per_pod: Family::default(),
            // 1µs .. ~4s
            decision_seconds: Histogram::new(exponential_buckets(1e-6, 4.0, 12)),
            stats_rejected: Family::default(),
            stats_clamped: Counter::default(),
            scale_errors: Counter::default(),
            leader: Gauge::default(),
            leader_changes: Counter::default(),
            takeover_seconds: FloatGauge::default(),
            takeover_writes: Gauge::default(),
            api_writes: Family::default(),
        }
    }
}

impl AutoscalerMetrics {
    /// Registers every family under the registry's prefix (`thaw_autoscaler_*`).
    pub fn register(reg: &mut Registry) -> Self {
        Self::register_scoped(reg, super::Scope::Cluster)
    }

    /// As [`AutoscalerMetrics::register`]; [`super::Scope::Local`] leaves out the leader's
    /// families (leadership, leader changes, takeovers, API writes).
    pub fn register_scoped(reg: &mut Registry, scope: super::Scope) -> Self {
        let m = Self::default();
        reg.register(
            "autoscaler_desired_pods",
            "Replicas the autoscaler asked the platform for",
            super::Listed(m.desired_pods.clone()),
        );
        reg.register(
            "autoscaler_ready_pods",
            "Ready endpoints seen at the last decision",
            super::Listed(m.ready_pods.clone()),
        );
        reg.register(
            "autoscaler_panic_mode",
            "1 while the revision's decider is in panic mode",
            super::Listed(m.panic_mode.clone()),
        );
        reg.register(
            "autoscaler_excess_burst_capacity",
            "Spare capacity beyond the target burst capacity; negative keeps the activator in the path",
            super::Listed(m.excess_burst_capacity.clone()),
        );
        reg.register(
            "autoscaler_observed_stable",
            "Stable-window average of the revision's load at the last decision (requests in flight, or per second)",
            super::Listed(m.observed_stable.clone()),
        );
        reg.register(
            "autoscaler_observed_panic",
            "Panic-window average of the revision's load at the last decision (requests in flight, or per second)",
            super::Listed(m.observed_panic.clone()),
        );
        reg.register(
            "autoscaler_target_per_pod",
            "Load one pod should carry: the target times the utilization",
            super::Listed(m.target_per_pod.clone()),
        );
        reg.register(
            "autoscaler_decision_seconds",
            "Time to decide one round (all revisions at a tick, or one poked revision)",
            m.decision_seconds.clone(),
        );
        reg.register(
            "autoscaler_stats_rejected",
            "Stats the collector did not record, by reason",
            super::Listed(m.stats_rejected.clone()),
        );
        reg.register(
            "autoscaler_stats_clamped",
            "Stats recorded at the ceilings instead of their (larger) values",
            m.stats_clamped.clone(),
        );
        reg.register(
            "autoscaler_scale_errors",
            "Platform scale calls that failed or timed out",
            m.scale_errors.clone(),
        );
        if scope == super::Scope::Local {
            return m;
        }
        reg.register(
            "autoscaler_leader",
            "1 while this replica leads: scales, pulls pod stats and writes",
            m.leader.clone(),
        );
        reg.register(
            "autoscaler_leader_changes",
            "Times this replica became the leader",
            m.leader_changes.clone(),
        );
        reg.register(
            "autoscaler_takeover_seconds",
            "The last takeover: from acquiring the Lease to every revision adopted",
            m.takeover_seconds.clone(),
        );
        reg.register(
            "autoscaler_takeover_writes",
            "API writes the last takeover made",
            m.takeover_writes.clone(),
        );
        reg.register(
            "autoscaler_api_writes",
            "Public EndpointSlice and Revision status writes by the leader",
            super::Listed(m.api_writes.clone()),
        );
        m
    }
}
