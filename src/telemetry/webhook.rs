//! Metrics of `thaw webhook`: admission requests by webhook, kind, operation and outcome,
//! their latency (Knative's webhook exports `request_count` and `request_latencies` with the
//! same facts), requests refused before admission (body too large, not an AdmissionReview,
//! every connection busy), the admission port's connections (open, and closed to seat a new
//! one or for idling), and the serving certificate: when it ends and each rotation step.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of one admission.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `defaulting` or `validation`.
    pub webhook: &'static str,
    /// `Service`, `Configuration`, `Revision`, `Route`, `other`.
    pub kind: &'static str,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub operation: &'static str,
    /// `true` or `false`.
    pub allowed: &'static str,
}

/// Labels of a latency.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HookKindLabels {
    pub webhook: &'static str,
    pub kind: &'static str,
}

/// Labels of a refusal before admission.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `body_too_large`, `timeout` (the body not in within the request timeout), `bad_review`,
    /// `not_found`, `method`, `tls`, `connections` (a new connection while every open one has
    /// a request in flight), `closing` (a request on a connection whose seat was just taken).
    pub reason: &'static str,
}

/// Labels of a connection the webhook closed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `evicted` (the oldest connection with no request in flight, its seat given to a new
    /// one at the connection limit), `idle` (no request head within the handshake timeout).
    pub reason: &'static str,
}

/// Labels of a certificate step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct StepLabels {
    /// `created`, `staged`, `promoted`, `bundle`, `configuration`, `conflict`, `error`.
    pub step: &'static str,
}

#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    /// `thaw_webhook_requests_total{webhook,kind,operation,allowed}`.
    pub requests: Family<AdmissionLabels, Counter>,
    /// `thaw_webhook_request_duration_seconds{webhook,kind}`.
    pub durations: Family<HookKindLabels, Histogram>,
    /// `thaw_webhook_refused_total{reason}`.
    pub refused: Family<ReasonLabels, Counter>,
    /// `thaw_webhook_connections`: connections open on the admission port.
    pub connections: Gauge,
    /// `thaw_webhook_connections_closed_total{reason}`.
    pub connections_closed: Family<ClosedLabels, Counter>,
    /// `thaw_webhook_certificate_steps_total{step}`.
    pub certificate_steps: Family<StepLabels, Counter>,
    /// `thaw_webhook_certificate_expiry_timestamp_seconds`: when the served certificate ends.
    pub certificate_expiry: Gauge,
    /// `thaw_webhook_leader`: 1 while this replica manages the certificates.
    pub leader: Gauge,
}

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    ])
}

impl WebhookMetrics {
    /// Families not registered anywhere (tests).
    pub fn unregistered() -> Self {
        Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            refused: Family::default(),
            connections: Gauge::default(),
            connections_closed: Family::default(),
            certificate_steps: Family::default(),
            certificate_expiry: Gauge::default(),
            leader: Gauge::default(),
        }
    }

    pub fn register(reg: &mut Registry) -> Self {
        let m = Self::unregistered();
        reg.register(
            "webhook_requests",
            "Admission requests by webhook, kind, operation and whether they were allowed",
            super::Listed(m.requests.clone()),
        );
        reg.register(
            "webhook_request_duration_seconds",
            "Time to admit one request, by webhook and kind",
            super::Listed(m.durations.clone()),
        );
        reg.register(
            "webhook_refused",
            "Requests refused before admission, by reason",
            super::Listed(m.refused.clone()),
        );
        reg.register(
            "webhook_connections",
            "Connections open on the admission port",
            m.connections.clone(),
        );
        reg.register(
            "webhook_connections_closed",
            "Connections the webhook closed: evicted (its seat given to a new connection at the \
             limit) or idle (no request head within the handshake timeout)",
            super::Listed(m.connections_closed.clone()),
        );
        reg.register(
            "webhook_certificate_steps",
            "Steps of the serving certificate's management (created, staged, promoted, ...)",
            super::Listed(m.certificate_steps.clone()),
        );
        reg.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "When the certificate this replica serves ends (Unix seconds)",
            m.certificate_expiry.clone(),
        );
        reg.register(
            "webhook_leader",
            "1 while this webhook replica manages the certificates",
            m.leader.clone(),
        );
        m
    }

    /// Counts one admission and its duration.
    pub fn admitted(
        &self,
        webhook: &'static str,
        kind: &'static str,
        operation: &'static str,
        allowed: bool,
        seconds: f64,
    ) {
        self.requests
            .get_or_create(&AdmissionLabels {
                webhook,
                kind,
                operation,
                allowed: if allowed { "true" } else { "false" },
            })
            .inc();
        self.durations
            .get_or_create(&HookKindLabels { webhook, kind })
            .observe(seconds);
    }

    /// Counts a refusal before admission.
    pub fn refuse(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Counts a connection the webhook closed.
    pub fn closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ClosedLabels { reason })
            .inc();
    }

    /// Counts a certificate step.
    pub fn step(&self, step: &'static str) {
        self.certificate_steps
            .get_or_create(&StepLabels { step })
            .inc();
    }
}
