//! Metrics of the queue sidecar, under Knative's queue-proxy names (`revision_request_count`,
//! `revision_app_request_count`, `revision_queue_depth`, `queue_average_concurrent_requests`,
//! ...) so dashboards written for Knative's queue-proxy read them, and thaw's own overflow and
//! timeout counters. Every series carries the pod's constant labels (`namespace_name`,
//! `configuration_name`, `revision_name`, `pod_name`), as Knative's do.
//!
//! The sidecar has its own registry ([`QueueTelemetry`]): one process, one role. The request
//! path increments handles resolved at start-up; it never looks labels up.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::exposition;

/// Knative's request-latency buckets (milliseconds).
const LATENCY_MS: [f64; 18] = [
    5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0, 500.0, 1000.0, 2000.0,
    5000.0, 10000.0, 20000.0, 60000.0,
];

/// The status classes counted apart (`1xx` .. `5xx`).
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The pod's constant labels.
#[derive(Debug, Clone)]
pub struct PodLabels {
    pub namespace: String,
    pub configuration: String,
    pub revision: String,
    pub pod: String,
}

/// Counters per status class, resolved once.
#[derive(Debug, Clone)]
pub struct ByClass([Counter; 5]);

impl ByClass {
    fn register(reg: &mut Registry, name: &str, help: &str) -> Self {
        let family = Family::<Vec<(String, String)>, Counter>::default();
        reg.register(name, help, family.clone());
        Self(CLASSES.map(|c| {
            family
                .get_or_create(&vec![("response_code_class".to_string(), c.to_string())])
                .clone()
        }))
    }

    /// Counts one answer with status `code`.
    pub fn inc(&self, code: u16) {
        let i = usize::from((code / 100).clamp(1, 5) - 1);
        self.0[i].inc();
    }
}

/// Every family the sidecar exports.
#[derive(Debug)]
pub struct QueueMetrics {
    /// Requests answered by the sidecar, by status class (Knative: `revision_request_count`).
    pub requests: ByClass,
    /// Time from arrival to the response head, ms (Knative: `revision_request_latencies`).
    pub latency_ms: Histogram,
    /// Requests the user container answered, by status class (`revision_app_request_count`).
    pub app_requests: ByClass,
    /// The user container's time to the response head, ms (`revision_app_request_latencies`).
    pub app_latency_ms: Histogram,
    /// Requests waiting for a place under containerConcurrency (`revision_queue_depth`).
    pub queue_depth: Gauge,
    /// Last complete second: arrivals (`queue_requests_per_second`).
    pub rps: Gauge<f64, AtomicU64>,
    /// ... of which through an activator (`queue_proxied_operations_per_second`).
    pub proxied_rps: Gauge<f64, AtomicU64>,
    /// ... average concurrency (`queue_average_concurrent_requests`).
    pub concurrency: Gauge<f64, AtomicU64>,
    /// ... of which through an activator (`queue_average_proxied_concurrent_requests`).
    pub proxied_concurrency: Gauge<f64, AtomicU64>,
    /// Requests refused because the queue was full (`thaw_queue_overflow_total`).
    pub overflow: Counter,
    /// Requests answered 504 (`thaw_queue_timeouts_total`).
    pub timeouts: Counter,
    /// Failed exchanges with the user container: refused, closed, cut
    /// (`thaw_queue_user_errors_total`).
    pub user_errors: Counter,
    /// Request bodies cut after the request-body idle timeout
    /// (`thaw_queue_request_body_timeouts_total`).
    pub request_body_timeouts: Counter,
    /// Requests whose `K-Proxy-Request` lacked the revision's tag, counted as direct
    /// (`thaw_queue_untagged_proxy_requests_total`).
    pub untagged_proxy: Counter,
}

/// The sidecar's registry and its families.
#[derive(Debug)]
pub struct QueueTelemetry {
    registry: Registry,
    pub queue: QueueMetrics,
}

impl QueueTelemetry {
    /// Registers every family with the pod's constant labels; the standard `process_*`
    /// metrics and `thaw_build_info` too.
    pub fn new(labels: &PodLabels) -> Self {
        let mut registry = Registry::default();
        super::process::register(&mut registry);
        super::process::register_build_info(registry.sub_registry_with_prefix("thaw"));
        let consts = vec![
            ("namespace_name".into(), labels.namespace.clone().into()),
            (
                "configuration_name".into(),
                labels.configuration.clone().into(),
            ),
            ("revision_name".into(), labels.revision.clone().into()),
            ("pod_name".into(), labels.pod.clone().into()),
        ];
        let reg = registry.sub_registry_with_labels(consts.into_iter());
        let hist = || Histogram::new(LATENCY_MS);
        let (latency_ms, app_latency_ms) = (hist(), hist());
        reg.register(
            "revision_request_latencies",
            "Time from a request's arrival at the sidecar to its response head, in milliseconds",
            latency_ms.clone(),
        );
        reg.register(
            "revision_app_request_latencies",
            "Time from forwarding a request to the user container to its response head, in milliseconds",
            app_latency_ms.clone(),
        );
        let queue = QueueMetrics {
            requests: ByClass::register(
                reg,
                "revision_request_count",
                "Requests answered by the sidecar, by status class",
            ),
            latency_ms,
            app_requests: ByClass::register(
                reg,
                "revision_app_request_count",
                "Requests the user container answered, by status class",
            ),
            app_latency_ms,
            queue_depth: gauge(
                reg,
                "revision_queue_depth",
                "Requests waiting for a place under containerConcurrency",
            ),
            rps: gauge(
                reg,
                "queue_requests_per_second",
                "Requests that arrived in the last complete second",
            ),
            proxied_rps: gauge(
                reg,
                "queue_proxied_operations_per_second",
                "Requests through an activator (K-Proxy-Request) that arrived in the last complete second",
            ),
            concurrency: gauge(
                reg,
                "queue_average_concurrent_requests",
                "Time-weighted average requests in the pod over the last complete second",
            ),
            proxied_concurrency: gauge(
                reg,
                "queue_average_proxied_concurrent_requests",
                "The share of queue_average_concurrent_requests through an activator",
            ),
            overflow: counter(
                reg,
                "thaw_queue_overflow",
                "Requests refused with 503 because the queue was full",
            ),
            timeouts: counter(
                reg,
                "thaw_queue_timeouts",
                "Requests answered 504 (total, response-start or queue timeout)",
            ),
            user_errors: counter(
                reg,
                "thaw_queue_user_errors",
                "Failed exchanges with the user container (refused, closed, cut mid-body)",
            ),
            request_body_timeouts: counter(
                reg,
                "thaw_queue_request_body_timeouts",
                "Request bodies cut after sending nothing for the request-body idle timeout",
            ),
            untagged_proxy: counter(
                reg,
                "thaw_queue_untagged_proxy_requests",
                "Requests whose K-Proxy-Request lacked the revision's tag: counted as direct, K-Original-Host ignored",
            ),
        };
        Self { registry, queue }
    }

    /// The exposition a scraper sending `accept` asks for, with its content type.
    pub fn encode_for(&self, accept: Option<&str>) -> (String, &'static str) {
        let mut om = String::with_capacity(8 * 1024);
        encode(&mut om, &self.registry).expect("encoding metrics into a String");
        let format = exposition::Format::negotiate(accept);
        let body = match format {
            exposition::Format::OpenMetrics => om,
            exposition::Format::Classic => exposition::to_classic(&om),
        };
        (body, format.content_type())
    }
}

fn gauge<N, A>(reg: &mut Registry, name: &str, help: &str) -> Gauge<N, A>
where
    Gauge<N, A>: Default + prometheus_client::registry::Metric + Clone,
{
    let g = Gauge::<N, A>::default();
    reg.register(name, help, g.clone());
    g
}

fn counter(reg: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    reg.register(name, help, c.clone());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knatives_names_with_the_pods_labels() {
        let t = QueueTelemetry::new(&PodLabels {
            namespace: "ns".into(),
            configuration: "hello".into(),
            revision: "hello-00001".into(),
            pod: "hello-00001-abc".into(),
        });
        t.queue.requests.inc(200);
        t.queue.requests.inc(503);
        let (text, _) = t.encode_for(None);
        for needle in [
            "revision_request_count_total{namespace_name=\"ns\",configuration_name=\"hello\",revision_name=\"hello-00001\",pod_name=\"hello-00001-abc\",response_code_class=\"2xx\"} 1",
            "response_code_class=\"5xx\"} 1",
            "# TYPE revision_queue_depth gauge",
            "# TYPE queue_average_concurrent_requests gauge",
            "# TYPE revision_app_request_latencies histogram",
            "thaw_queue_overflow_total{",
            "thaw_queue_untagged_proxy_requests_total{",
            "process_resident_memory_bytes",
            "thaw_build_info",
        ] {
            assert!(text.contains(needle), "{needle} not in:\n{text}");
        }
    }
}
