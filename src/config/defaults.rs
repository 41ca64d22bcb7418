//! `config-defaults`: Knative's revision defaults (knative-dataplane.md §3.2).

use std::time::Duration;

/// Revision defaults applied when a revision does not set its own.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultsConfig {
    /// `revision-timeout-seconds`: total time a request may take, hold included (300).
    pub revision_timeout: Duration,
    /// `max-revision-timeout-seconds`: the largest timeout a revision may ask for (600).
    pub max_revision_timeout: Duration,
    /// `revision-response-start-timeout-seconds`: time to the first response byte; defaults to
    /// the revision timeout.
    pub revision_response_start_timeout: Option<Duration>,
    /// `revision-idle-timeout-seconds`: longest gap between response bytes; 0 = none.
    pub revision_idle_timeout: Duration,
    /// `container-concurrency`: default containerConcurrency (0 = unlimited).
    pub container_concurrency: u32,
    /// `container-concurrency-max-limit`: the largest containerConcurrency allowed (1000).
    pub container_concurrency_max_limit: u32,
}

impl Default for DefaultsConfig {
    fn default() -> Self {
        Self {
            revision_timeout: Duration::from_secs(300),
            max_revision_timeout: Duration::from_secs(600),
            revision_response_start_timeout: None,
            revision_idle_timeout: Duration::ZERO,
            container_concurrency: 0,
            container_concurrency_max_limit: 1000,
        }
    }
}
