//! Metrics of the activator: requests, holds, overflow, upstream errors and cold-start phases.
//!
//! Families are registered once in [`ActivatorMetrics::register`]. The request path never looks
//! labels up: [`ActivatorMetrics::revision`] resolves one [`RevisionMetrics`] per revision when
//! the revision's state is created, and the state keeps it.

use std::sync::OnceLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Listed;
use crate::percore::spread::{SpreadCounter, SpreadGauge};
use crate::revision::RevisionKey;

/// Labels of per-revision series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RevisionLabels {
    pub namespace: String,
    pub revision: String,
}

/// The phases of a cold start, from the activator's point of view. Label values are
/// snake_case (`poke_to_decision`, ...), as Prometheus label values conventionally are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColdStartPhase {
    /// First held request (the poke) -> the scaler's decision (`ScaleState::decided_at`).
    PokeToDecision,
    /// The decision -> the first endpoint snapshot with a ready endpoint.
    DecisionToReady,
    /// The poke -> the first ready endpoint (the whole wake-up, decision or not).
    PokeToReady,
    /// The first ready endpoint -> the first response forwarded to a client.
    ReadyToFirstByte,
}

impl ColdStartPhase {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PokeToDecision => "poke_to_decision",
            Self::DecisionToReady => "decision_to_ready",
            Self::PokeToReady => "poke_to_ready",
            Self::ReadyToFirstByte => "ready_to_first_byte",
        }
    }
}

impl EncodeLabelValue for ColdStartPhase {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// Labels of `thaw_activator_cold_start_phase_seconds`: the revision and the phase.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub revision: String,
    pub phase: ColdStartPhase,
}

/// Labels of `thaw_activator_requests_total` and `thaw_activator_request_latencies_seconds`,
/// the same on both (so a rate and a latency quantile join without relabelling), and the set
/// of Knative's `activator_request_count` / `activator_request_latencies`: the revision, its
/// service and configuration (a Knative Service's configuration shares its name), the status
/// code and its class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub namespace: String,
    pub service: String,
    pub configuration: String,
    pub revision: String,
    pub code: u16,
    pub response_code_class: &'static str,
}

/// Labels of `thaw_activator_unmatched_requests_total`: why a request matched no revision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// The response code classes, in the order of [`RevisionMetrics`]' latency handles.
const CODE_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~16 s: a warm request (about 1 ms) and a cold start (seconds) both resolve.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn hold_histogram() -> Histogram {
    // 1 ms .. ~65 s: a warm pick is far below the first bucket, a cold start lands mid-range.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every activator metric family.
#[derive(Debug, Clone)]
pub struct ActivatorMetrics {
    /// `thaw_activator_requests_total{namespace,service,configuration,revision,code,
    /// response_code_class}`: requests answered.
    pub requests: Family<RequestLabels, SpreadCounter>,
    /// `thaw_activator_held_requests{namespace,revision}`: requests waiting in the revision's
    /// queue now (the queue-depth gauge).
    pub held: Family<RevisionLabels, Gauge>,
    /// `thaw_activator_in_flight_requests{namespace,revision}`: requests forwarded and not yet
    /// finished.
    pub in_flight: Family<RevisionLabels, SpreadGauge>,
    /// `thaw_activator_ready_endpoints{namespace,revision}`.
    pub ready_endpoints: Family<RevisionLabels, Gauge>,
    /// `thaw_activator_hold_seconds{namespace,revision}`: how long held requests waited.
    pub hold_seconds: HistogramFamily<RevisionLabels>,
    /// `thaw_activator_overflow_total{namespace,revision}`: 503s because a queue was full.
    pub overflow: Family<RevisionLabels, Counter>,
    /// `thaw_activator_hold_timeouts_total{namespace,revision}`: 504s after cold-wait.
    pub hold_timeouts: Family<RevisionLabels, Counter>,
    /// `thaw_activator_upstream_errors_total{namespace,revision}`: connect failures (after
    /// retries), response-start/idle timeouts and upstream failures mid-response.
    pub upstream_errors: Family<RevisionLabels, Counter>,
    /// `thaw_activator_client_errors_total{namespace,revision}`: requests whose own body failed
    /// while forwarded (malformed framing, cut short): answered 400, never upstream errors.
    pub client_errors: Family<RevisionLabels, Counter>,
    /// `thaw_activator_retries_total{namespace,revision}`: retries on another endpoint after a
    /// connect failure.
    pub retries: Family<RevisionLabels, Counter>,
    /// `thaw_activator_endpoint_ejections_total{namespace,revision}`: endpoints passed over for
    /// a while after a failed connect (`Endpoint::connect_failed`).
    pub ejections: Family<RevisionLabels, Counter>,
    /// `thaw_activator_cold_starts_total{namespace,revision}`: pokes sent for a cold revision.
    pub cold_starts: Family<RevisionLabels, Counter>,
    /// `thaw_activator_cold_start_phase_seconds{namespace,revision,phase}`.
    pub cold_start_phase: HistogramFamily<PhaseLabels>,
    /// `thaw_activator_request_latencies_seconds{namespace,service,configuration,revision,
    /// code,response_code_class}`: arrival to the response head, hold included.
    pub latencies: HistogramFamily<RequestLabels>,
    /// `thaw_activator_unmatched_requests_total{reason}`: requests that matched no revision
    /// (not found, bad request, headers too large, not implemented), in one counter.
    pub unmatched: Family<ReasonLabels, Counter>,
    /// `thaw_activator_connections`: open client connections on the data port.
    pub connections: Gauge,
    /// `thaw_activator_stats_dropped_total`: stats and pokes dropped because the channel to
    /// the autoscaler was full or closed.
    pub stats_dropped: Counter,
    /// `thaw_activator_request_body_timeouts_total`: request bodies cut after sending nothing
    /// for `request-body-idle-timeout` (answered 408, or the connection closed once the
    /// response had started).
    pub request_body_timeouts: Counter,
    /// `thaw_activator_route_refused_total`: requests the route check could not place within
    /// the catch-up (no Route has their host, its Route is another namespace's or does not
    /// route the revision, the revision does not exist; also counted as
    /// `unmatched{reason="not_found"}`).
    pub route_refused: Counter,
    /// `thaw_activator_route_catch_up_waiting`: requests waiting now for the Route watch or
    /// the catalog to place them, before their 404 (at most the catch-up's seats).
    pub route_catch_up_waiting: Gauge,
    /// `thaw_activator_route_catch_up_full_total`: requests answered 404 at once because every
    /// catch-up seat was taken.
    pub route_catch_up_full: Counter,
    /// `thaw_activator_starting_pod_probes_total`: probes sent to pods not ready yet
    /// (`pod-probe-budget`).
    pub starting_pod_probes: Counter,
    /// `thaw_activator_early_ready_pods_total`: pods sent to on their own probe's answer,
    /// before the platform marked them ready.
    pub early_ready_pods: Counter,
}

impl ActivatorMetrics {
    /// Registers every family in `reg` (the `thaw` prefix comes from the registry).
    pub fn register(reg: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            held: Family::default(),
            in_flight: Family::default(),
            ready_endpoints: Family::default(),
            hold_seconds: Family::new_with_constructor(hold_histogram),
            overflow: Family::default(),
            hold_timeouts: Family::default(),
            upstream_errors: Family::default(),
            client_errors: Family::default(),
            retries: Family::default(),
            ejections: Family::default(),
            cold_starts: Family::default(),
            cold_start_phase: Family::new_with_constructor(hold_histogram),
            latencies: Family::new_with_constructor(latency_histogram),
            unmatched: Family::default(),
            connections: Gauge::default(),
            stats_dropped: Counter::default(),
            request_body_timeouts: Counter::default(),
            route_refused: Counter::default(),
            route_catch_up_waiting: Gauge::default(),
            route_catch_up_full: Counter::default(),
            starting_pod_probes: Counter::default(),
            early_ready_pods: Counter::default(),
        };
        let r = reg;
        r.register(
            "activator_requests",
            "Requests answered by the activator",
            Listed(m.requests.clone()),
        );
        r.register(
            "activator_held_requests",
            "Requests held now",
            Listed(m.held.clone()),
        );
        r.register(
            "activator_in_flight_requests",
            "Requests forwarded now",
            Listed(m.in_flight.clone()),
        );
        r.register(
            "activator_ready_endpoints",
            "Ready endpoints",
            Listed(m.ready_endpoints.clone()),
        );
        r.register(
            "activator_hold_seconds",
            "Time requests were held",
            Listed(m.hold_seconds.clone()),
        );
        r.register(
            "activator_overflow",
            "Requests refused: queue full",
            Listed(m.overflow.clone()),
        );
        r.register(
            "activator_hold_timeouts",
            "Held past cold-wait",
            Listed(m.hold_timeouts.clone()),
        );
        r.register(
            "activator_upstream_errors",
            "Upstream failures",
            Listed(m.upstream_errors.clone()),
        );
        r.register(
            "activator_client_errors",
            "Requests whose own body failed while forwarded (answered 400)",
            Listed(m.client_errors.clone()),
        );
        r.register(
            "activator_retries",
            "Connect retries",
            Listed(m.retries.clone()),
        );
        r.register(
            "activator_endpoint_ejections",
            "Endpoints passed over for a while after a failed connect",
            Listed(m.ejections.clone()),
        );
        r.register(
            "activator_cold_starts",
            "Cold starts (pokes)",
            Listed(m.cold_starts.clone()),
        );
        r.register(
            "activator_cold_start_phase_seconds",
            "Cold-start phases: poke, decision, ready, first byte",
            Listed(m.cold_start_phase.clone()),
        );
        r.register(
            "activator_request_latencies_seconds",
            "Time from a request's arrival to its response head, hold included",
            Listed(m.latencies.clone()),
        );
        r.register(
            "activator_unmatched_requests",
            "Requests that matched no revision, by reason",
            Listed(m.unmatched.clone()),
        );
        r.register(
            "activator_connections",
            "Open client connections",
            m.connections.clone(),
        );
        r.register(
            "activator_stats_dropped",
            "Stats and pokes dropped because the channel to the autoscaler was full or closed",
            m.stats_dropped.clone(),
        );
        r.register(
            "activator_request_body_timeouts",
            "Request bodies cut after sending nothing for request-body-idle-timeout",
            m.request_body_timeouts.clone(),
        );
        r.register(
            "activator_route_refused",
            "Requests answered 404 because the route check could not place them within the catch-up",
            m.route_refused.clone(),
        );
        r.register(
            "activator_route_catch_up_waiting",
            "Requests waiting for the Route watch or the catalog to place them, before their 404",
            m.route_catch_up_waiting.clone(),
        );
        r.register(
            "activator_route_catch_up_full",
            "Requests answered 404 at once because every catch-up seat was taken",
            m.route_catch_up_full.clone(),
        );
        r.register(
            "activator_starting_pod_probes",
            "Probes sent to pods not ready yet, to send to them as soon as their sidecar answers",
            m.starting_pod_probes.clone(),
        );
        r.register(
            "activator_early_ready_pods",
            "Pods sent to on their own probe's answer, before the platform marked them ready",
            m.early_ready_pods.clone(),
        );
        m
    }

    /// Resolves every per-revision child once. Call when a revision's state is created; call
    /// [`ActivatorMetrics::forget`] when it is removed.
    /// `service` is the Knative Service the revision belongs to, if any (the latency series'
    /// service and configuration labels).
    pub fn revision(&self, key: &RevisionKey, service: Option<&str>) -> RevisionMetrics {
        let labels = RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        };
        RevisionMetrics {
            latency: Default::default(),
            latencies: self.latencies.clone(),
            service: service.unwrap_or_default().to_string(),
            held: self.held.get_or_create_owned(&labels),
            in_flight: self.in_flight.get_or_create_owned(&labels),
            ready_endpoints: self.ready_endpoints.get_or_create_owned(&labels),
            hold_seconds: self.hold_seconds.get_or_create_owned(&labels),
            overflow: self.overflow.get_or_create_owned(&labels),
            hold_timeouts: self.hold_timeouts.get_or_create_owned(&labels),
            upstream_errors: self.upstream_errors.get_or_create_owned(&labels),
            client_errors: self.client_errors.get_or_create_owned(&labels),
            retries: self.retries.get_or_create_owned(&labels),
            ejections: self.ejections.get_or_create_owned(&labels),
            cold_starts: self.cold_starts.get_or_create_owned(&labels),
            codes: Default::default(),
            family: self.requests.clone(),
            key: key.clone(),
        }
    }

    /// Removes a removed revision's series so the exposition does not grow without bound (and
    /// a dashboard shows no revision that is gone).
    pub fn forget(&self, key: &RevisionKey, service: Option<&str>) {
        let labels = RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        };
        self.held.remove(&labels);
        self.in_flight.remove(&labels);
        self.ready_endpoints.remove(&labels);
        self.hold_seconds.remove(&labels);
        self.overflow.remove(&labels);
        self.hold_timeouts.remove(&labels);
        self.upstream_errors.remove(&labels);
        self.client_errors.remove(&labels);
        self.retries.remove(&labels);
        self.ejections.remove(&labels);
        self.cold_starts.remove(&labels);
        // Every status code a response can carry (removal is rare; a family is not iterable).
        let service = service.unwrap_or_default();
        for code in 100..=599 {
            let labels = request_labels(key, service, code);
            self.requests.remove(&labels);
            self.latencies.remove(&labels);
        }
        for phase in [
            ColdStartPhase::PokeToDecision,
            ColdStartPhase::DecisionToReady,
            ColdStartPhase::PokeToReady,
            ColdStartPhase::ReadyToFirstByte,
        ] {
            self.cold_start_phase.remove(&PhaseLabels {
                namespace: labels.namespace.clone(),
                revision: labels.revision.clone(),
                phase,
            });
        }
    }

    /// Observes one cold-start phase of `key`.
    pub fn observe_phase(&self, key: &RevisionKey, phase: ColdStartPhase, seconds: f64) {
        self.cold_start_phase
            .get_or_create(&PhaseLabels {
                namespace: key.namespace.to_string(),
                revision: key.name.to_string(),
                phase,
            })
            .observe(seconds);
    }

    /// Counts a request that matched no revision, by the status it was answered with.
    pub fn unmatched(&self, status: u16) {
        let reason = match status {
            404 => "not_found",
            431 => "headers_too_large",
            501 => "not_implemented",
            400 => "bad_request",
            _ => "other",
        };
        self.unmatched.get_or_create(&ReasonLabels { reason }).inc();
    }
}

fn request_labels(key: &RevisionKey, service: &str, code: u16) -> RequestLabels {
    RequestLabels {
        namespace: key.namespace.to_string(),
        service: service.to_string(),
        configuration: service.to_string(),
        revision: key.name.to_string(),
        code,
        response_code_class: CODE_CLASSES[usize::from(code / 100).clamp(1, 5) - 1],
    }
}

/// Status codes whose counters are cached per revision (the rest are resolved per answer).
const CACHED_CODES: [u16; 16] = [
    200, 201, 204, 301, 302, 304, 400, 401, 403, 404, 431, 500, 502, 503, 504, 101,
];

/// One revision's metric handles, resolved once. Incrementing is a plain atomic add.
#[derive(Debug)]
pub struct RevisionMetrics {
    /// `thaw_activator_held_requests` (moved by the throttler).
    pub held: Gauge,
    /// `thaw_activator_in_flight_requests` (moved by every request: spread per thread).
    pub in_flight: SpreadGauge,
    /// `thaw_activator_ready_endpoints`.
    pub ready_endpoints: Gauge,
    /// `thaw_activator_hold_seconds`.
    pub hold_seconds: Histogram,
    /// `thaw_activator_overflow_total`.
    pub overflow: Counter,
    /// `thaw_activator_hold_timeouts_total`.
    pub hold_timeouts: Counter,
    /// `thaw_activator_upstream_errors_total`.
    pub upstream_errors: Counter,
    /// `thaw_activator_client_errors_total`.
    pub client_errors: Counter,
    /// `thaw_activator_retries_total`.
    pub retries: Counter,
    /// `thaw_activator_endpoint_ejections_total`.
    pub ejections: Counter,
    /// `thaw_activator_cold_starts_total`.
    pub cold_starts: Counter,
    /// Latency histograms of the common codes, each resolved on first use.
    latency: [OnceLock<Histogram>; CACHED_CODES.len()],
    latencies: HistogramFamily<RequestLabels>,
    service: String,
    /// Counters of the common codes, each resolved on first use.
    codes: [OnceLock<SpreadCounter>; CACHED_CODES.len()],
    family: Family<RequestLabels, SpreadCounter>,
    key: RevisionKey,
}

impl RevisionMetrics {
    /// Counts one answer with status `code` and observes its latency (arrival to response
    /// head). Common codes cost one atomic add and one histogram observation after their
    /// first use; others take two family lookups.
    pub fn answered(&self, code: u16, seconds: f64) {
        match CACHED_CODES.iter().position(|&c| c == code) {
            Some(i) => {
                self.codes[i]
                    .get_or_init(|| self.family.get_or_create_owned(&self.labels(code)))
                    .inc();
                self.latency[i]
                    .get_or_init(|| self.latencies.get_or_create_owned(&self.labels(code)))
                    .observe(seconds);
            }
            None => {
                let labels = self.labels(code);
                self.family.get_or_create(&labels).inc();
                self.latencies.get_or_create(&labels).observe(seconds);
            }
        }
    }

    fn labels(&self, code: u16) -> RequestLabels {
        request_labels(&self.key, &self.service, code)
    }
}
