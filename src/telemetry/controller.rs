//! Metrics of `thaw controller`: reconciles by kind and outcome, their duration, and Events
//! that could not be published (Knative's controllers export `reconcile_count` and
//! `reconcile_latency` per reconciler; these are the same facts under thaw's prefix).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of one reconcile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `Service`, `Configuration`, `Revision`, `Route`.
    pub kind: &'static str,
    /// `ok`, `invalid` (the object cannot be reconciled as written), `conflict`, `error`.
    pub result: &'static str,
}

/// Labels of a kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// Labels of a watched kind (its informer's: `Revision`, `Deployment`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WatchLabels {
    pub kind: String,
}

/// Labels of one ingress probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `ok` (the current hash), `old_hash`, `status` (another status), `error` (no answer).
    pub result: &'static str,
}

#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    /// `thaw_controller_reconcile_total{kind,result}`.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// `thaw_controller_reconcile_duration_seconds{kind}`.
    pub durations: Family<KindLabels, Histogram>,
    /// `thaw_controller_events_failed_total`: Kubernetes Events that could not be published.
    pub events_failed: Counter,
    /// `thaw_controller_leader`: 1 while this replica leads and its reconcilers run.
    pub leader: Gauge,
    /// `thaw_controller_ingress_probes_total{result}`: probes of gateway pods by outcome.
    pub ingress_probes: Family<ProbeLabels, Counter>,
    /// `thaw_controller_event_to_reconcile_seconds{kind}`: from a watch event calling for an
    /// object's reconcile (a change of it or of a child it controls) to that reconcile's start.
    pub event_to_reconcile: Family<KindLabels, Histogram>,
    /// `thaw_controller_watch_lists_total{kind}`: lists of each shared watch, the first and
    /// every re-list (a leadership change makes none).
    pub watch_lists: Family<WatchLabels, Counter>,
    /// `thaw_controller_watch_lagged_total{kind}`: reconcilers that fell too far behind a watch
    /// and were replayed its store.
    pub watch_lagged: Family<WatchLabels, Counter>,
    /// `thaw_controller_leader_changes_total`: terms this replica started leading.
    pub leader_terms: Counter,
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    ])
}

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

impl ControllerMetrics {
    /// Families not registered anywhere (tests, a context without an admin port).
    pub fn unregistered() -> Self {
        Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            events_failed: Counter::default(),
            leader: Gauge::default(),
            ingress_probes: Family::default(),
            event_to_reconcile: Family::new_with_constructor(latency_histogram),
            watch_lists: Family::default(),
            watch_lagged: Family::default(),
            leader_terms: Counter::default(),
        }
    }

    pub fn register(reg: &mut Registry) -> Self {
        let m = Self::unregistered();
        reg.register(
            "controller_reconcile",
            "Reconciles by kind and result",
            super::Listed(m.reconciles.clone()),
        );
        reg.register(
            "controller_reconcile_duration_seconds",
            "Time one reconcile took, by kind",
            super::Listed(m.durations.clone()),
        );
        reg.register(
            "controller_events_failed",
            "Kubernetes Events the controller could not publish",
            m.events_failed.clone(),
        );
        reg.register(
            "controller_leader",
            "1 while this controller replica leads and its reconcilers run",
            m.leader.clone(),
        );
        reg.register(
            "controller_ingress_probes",
            "Probes of gateway pods for the routes' current hash, by result",
            super::Listed(m.ingress_probes.clone()),
        );
        reg.register(
            "controller_event_to_reconcile_seconds",
            "Time from a watch event calling for an object's reconcile to that reconcile's start, by kind",
            super::Listed(m.event_to_reconcile.clone()),
        );
        reg.register(
            "controller_watch_lists",
            "Lists of each shared watch of the controller (the first, then re-lists), by kind",
            super::Listed(m.watch_lists.clone()),
        );
        reg.register(
            "controller_watch_lagged",
            "Reconcilers that fell too far behind a watch and were replayed its store, by kind",
            super::Listed(m.watch_lagged.clone()),
        );
        reg.register(
            "controller_leader_changes",
            "Terms this controller replica started leading (alert on its rate across replicas)",
            m.leader_terms.clone(),
        );
        m
    }

    /// Counts one list of the `kind` watch.
    pub fn watch_listed(&self, kind: &str) {
        self.watch_lists
            .get_or_create(&WatchLabels { kind: kind.into() })
            .inc();
    }

    /// Counts one subscriber of the `kind` watch replayed after falling behind.
    pub fn watch_lagged(&self, kind: &str) {
        self.watch_lagged
            .get_or_create(&WatchLabels { kind: kind.into() })
            .inc();
    }

    /// Counts one reconcile and its duration.
    pub fn reconciled(&self, kind: &'static str, result: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&ReconcileLabels { kind, result })
            .inc();
        self.durations
            .get_or_create(&KindLabels { kind })
            .observe(seconds);
    }
}
