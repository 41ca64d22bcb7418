//! `config-activator`: thaw's own activator limits, and their per-revision overrides under the
//! `activator.thaw.dev/` annotation prefix.

use std::time::Duration;

/// Limits of the activator's listeners, queues and drain. Defaults are for production; each is
/// explained where it is parsed and in `config/config-activator.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivatorConfig {
    /// `queue-depth`: requests one revision may hold while it has no capacity.
    pub queue_depth: u32,
    /// `max-held-requests`: requests held across all revisions; a single revision's
    /// `queue-depth` must stay below it, so no revision can fill it alone.
    pub max_held_requests: u32,
    /// `max-header-count`: request headers beyond this get 431.
    pub max_header_count: u32,
    /// `max-header-bytes`: total request-header bytes (names + values) beyond this get 431.
    pub max_header_bytes: u32,
    /// `header-read-timeout`: a client must finish sending headers within this.
    pub header_read_timeout: Duration,
    /// `keep-alive-timeout`: idle client connections are closed after this.
    pub keep_alive_timeout: Duration,
    /// `max-connections`: client connections beyond this wait in the accept backlog.
    pub max_connections: u32,
    /// `h2-max-concurrent-streams`: streams per HTTP/2 client connection.
    pub h2_max_concurrent_streams: u32,
    /// `drain-delay`: after SIGTERM, readiness fails at once and new connections are still
    /// accepted for this long, so load balancers notice before the listener closes.
    pub drain_delay: Duration,
    /// `drain-timeout`: the longest the activator waits for in-flight and held requests after
    /// the drain delay.
    pub drain_timeout: Duration,
    /// `connect-retries`: other endpoints tried after a connect failure before 502.
    pub connect_retries: u32,
    /// `connect-timeout`: one TCP connect attempt to an endpoint.
    pub connect_timeout: Duration,
    /// `initial-burst`: requests released per new endpoint at once when containerConcurrency is
    /// 0 (then one more per finished request), so a waking pod is not flooded.
    pub initial_burst: u32,
    /// `retry-after`: the `Retry-After` value sent with 503s.
    pub retry_after: Duration,
}

impl Default for ActivatorConfig {
    fn default() -> Self {
        Self {
            queue_depth: 10_000,
            max_held_requests: 50_000,
            max_header_count: 100,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(75),
            max_connections: 50_000,
            h2_max_concurrent_streams: 250,
            drain_delay: Duration::from_secs(15),
            drain_timeout: Duration::from_secs(300),
            connect_retries: 3,
            connect_timeout: Duration::from_secs(1),
            initial_burst: 100,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// Per-revision overrides from `activator.thaw.dev/*` annotations; `None` = use the ConfigMap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActivatorOverrides {
    /// `activator.thaw.dev/queue-depth`.
    pub queue_depth: Option<u32>,
    /// `activator.thaw.dev/cold-wait`: the longest a request may be held for a cold start.
    pub cold_wait: Option<Duration>,
    /// `activator.thaw.dev/initial-burst`.
    pub initial_burst: Option<u32>,
}
