//! Metrics of the transport between roles on Kubernetes: the stats push (activator side and
//! autoscaler side), the decision feed and the pod-stats pull.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a push or pull outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabels {
    /// Pushes: `ok`, `not_leader`, `unauthorized`, `no_leader`, `error`, `full` (dropped
    /// before sending), `rejected` (400/413), `timeout`. Pulls: `ok`, `timeout` (no whole
    /// answer within the revision's deadline), `connect` (refused or not connected in time),
    /// `status` (an answer other than 200), `rejected` (not valid pod stats), `error` (the
    /// connection failed after it was made), `busy` (no free pull slot before the deadline).
    pub result: &'static str,
}

/// Labels of a request the autoscaler's stats port answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CodeLabels {
    /// `stats` or `decisions`.
    pub path: &'static str,
    /// The status code.
    pub code: u16,
}

#[derive(Debug, Clone)]
pub struct RemoteMetrics {
    /// `thaw_activator_stats_push_total{result}`: stat batches the activator tried to push
    /// (pokes are batches of one).
    pub pushes: Family<ResultLabels, Counter>,
    /// `thaw_activator_stats_push_splits_total`: extra batches made by splitting one second's
    /// stats below the receiver's size limit.
    pub batch_splits: Counter,
    /// `thaw_activator_decision_feed_connected`: 1 while the activator follows the leader's
    /// decisions.
    pub feed_connected: Gauge,
    /// `thaw_autoscaler_stats_requests_total{path,code}`: requests on the stats port.
    pub requests: Family<CodeLabels, Counter>,
    /// `thaw_autoscaler_pod_stats_pulls_total{result}`: pod-stats pulls (one per sampled pod).
    pub pulls: Family<ResultLabels, Counter>,
    /// `thaw_autoscaler_pod_stats_stale_revisions`: revisions the puller samples whose pod
    /// stats are not flowing (no successful sample within the last few seconds), as of the
    /// last tick.
    pub stale_revisions: Gauge,
    /// `thaw_autoscaler_pod_stats_sample_seconds`: time to sample one revision's pods (all
    /// its pulls, concurrent, under the revision's deadline).
    pub sample_seconds: Histogram,
}

impl Default for RemoteMetrics {
    fn default() -> Self {
        Self {
            pushes: Family::default(),
            batch_splits: Counter::default(),
            feed_connected: Gauge::default(),
            requests: Family::default(),
            pulls: Family::default(),
            stale_revisions: Gauge::default(),
            // 0.5 ms .. ~1 s (the deadline is below the 1 s tick)
            sample_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 12)),
        }
    }
}

impl RemoteMetrics {
    pub fn register(reg: &mut Registry) -> Self {
        let m = Self::default();
        reg.register(
            "activator_stats_push",
            "Stat batches the activator pushed to the autoscaler leader, by result",
            super::Listed(m.pushes.clone()),
        );
        reg.register(
            "activator_stats_push_splits",
            "Extra stat batches made by splitting a second's stats below the receiver's limit",
            m.batch_splits.clone(),
        );
        reg.register(
            "activator_decision_feed_connected",
            "1 while the activator follows the autoscaler leader's decisions",
            m.feed_connected.clone(),
        );
        reg.register(
            "autoscaler_stats_requests",
            "Requests on the autoscaler's stats port, by path and status code",
            super::Listed(m.requests.clone()),
        );
        reg.register(
            "autoscaler_pod_stats_pulls",
            "Pod-stats pulls from queue sidecars, by result",
            super::Listed(m.pulls.clone()),
        );
        reg.register(
            "autoscaler_pod_stats_stale_revisions",
            "Sampled revisions whose pod stats are not flowing",
            m.stale_revisions.clone(),
        );
        reg.register(
            "autoscaler_pod_stats_sample_seconds",
            "Time to sample one revision's pods for their stats",
            m.sample_seconds.clone(),
        );
        m
    }

    /// Counts one push outcome.
    pub fn pushed(&self, result: &'static str) {
        self.pushes.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts one pull outcome.
    pub fn pulled(&self, result: &'static str) {
        self.pulls.get_or_create(&ResultLabels { result }).inc();
    }

    /// Counts one answer of the stats port.
    pub fn answered(&self, path: &'static str, code: u16) {
        self.requests
            .get_or_create(&CodeLabels { path, code })
            .inc();
    }
}
