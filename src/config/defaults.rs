//! `config-defaults`: Knative's revision defaults (docs/architecture.md, "Knative's rules").

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
    /// `revision-idle-timeout-seconds`: longest gap between response bytes (on a websocket
    /// tunnel, bytes either way); 0 = none.
    pub revision_idle_timeout: Duration,
    /// `container-concurrency`: default containerConcurrency (0 = unlimited).
    pub container_concurrency: u32,
    /// `container-concurrency-max-limit`: the largest containerConcurrency allowed (1000).
    pub container_concurrency_max_limit: u32,
    /// `allow-container-concurrency-zero`: whether containerConcurrency 0 (unlimited) is allowed.
    pub allow_container_concurrency_zero: bool,
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
            allow_container_concurrency_zero: true,
        }
    }
}

use std::collections::BTreeMap;

use serde_json::Value;

use super::keys::{self, ConfigMap, Key};
use super::parse::{Problem, parse_bool, parse_i64};

/// Name of the ConfigMap.
pub const NAME: &str = "config-defaults";

fn seconds(s: &str, min: i64) -> Result<Duration, String> {
    let v = parse_i64(s)?;
    if v < min {
        return Err(format!("must be at least {min}"));
    }
    Ok(Duration::from_secs(v as u64))
}

fn show_seconds(d: Duration) -> (String, Value) {
    (d.as_secs().to_string(), Value::from(d.as_secs()))
}

/// Every key of `config-defaults` thaw reads.
pub static KEYS: &[Key<DefaultsConfig>] = &[
    Key {
        name: "revision-timeout-seconds",
        unit: "seconds",
        help: "Total time a request may take, time held for a cold start included.",
        parse: |c, s| {
            c.revision_timeout = seconds(s, 1)?;
            Ok(())
        },
        show: |c| show_seconds(c.revision_timeout),
    },
    Key {
        name: "max-revision-timeout-seconds",
        unit: "seconds",
        help: "The largest timeoutSeconds a revision may set.",
        parse: |c, s| {
            c.max_revision_timeout = seconds(s, 1)?;
            Ok(())
        },
        show: |c| show_seconds(c.max_revision_timeout),
    },
    Key {
        name: "revision-response-start-timeout-seconds",
        unit: "seconds (default: revision-timeout-seconds)",
        help: "Time from forwarding a request to the first response byte.",
        parse: |c, s| {
            c.revision_response_start_timeout = Some(seconds(s, 0)?);
            Ok(())
        },
        show: |c| {
            show_seconds(
                c.revision_response_start_timeout
                    .unwrap_or(c.revision_timeout),
            )
        },
    },
    Key {
        name: "revision-idle-timeout-seconds",
        unit: "seconds (0 = none)",
        help: "Longest gap between response bytes (on a websocket tunnel, bytes either way).",
        parse: |c, s| {
            c.revision_idle_timeout = seconds(s, 0)?;
            Ok(())
        },
        show: |c| show_seconds(c.revision_idle_timeout),
    },
    Key {
        name: "container-concurrency",
        unit: "requests per replica (0 = unlimited)",
        help: "containerConcurrency of revisions that do not set it.",
        parse: |c, s| {
            let v = parse_i64(s)?;
            c.container_concurrency =
                u32::try_from(v).map_err(|_| "must be in [0, 2147483647]".to_string())?;
            Ok(())
        },
        show: |c| {
            (
                c.container_concurrency.to_string(),
                Value::from(c.container_concurrency),
            )
        },
    },
    Key {
        name: "container-concurrency-max-limit",
        unit: "requests per replica",
        help: "The largest containerConcurrency a revision may set.",
        parse: |c, s| {
            let v = parse_i64(s)?;
            if !(1..=i64::from(i32::MAX)).contains(&v) {
                return Err("must be in [1, 2147483647]".into());
            }
            c.container_concurrency_max_limit = v as u32;
            Ok(())
        },
        show: |c| {
            let v = c.container_concurrency_max_limit;
            (v.to_string(), Value::from(v))
        },
    },
    Key {
        name: "allow-container-concurrency-zero",
        unit: "bool",
        help: "Whether containerConcurrency 0 (unlimited) is allowed.",
        parse: |c, s| {
            c.allow_container_concurrency_zero = parse_bool(s)?;
            Ok(())
        },
        show: |c| {
            let v = c.allow_container_concurrency_zero;
            (v.to_string(), Value::from(v))
        },
    },
];

/// Knative keys of `config-defaults` about pods and images, which the data plane does not use.
const INERT: &[&str] = &[
    "revision-cpu-request",
    "revision-memory-request",
    "revision-ephemeral-storage-request",
    "revision-cpu-limit",
    "revision-memory-limit",
    "revision-ephemeral-storage-limit",
    "container-name-template",
    "init-container-name-template",
    "enable-service-links",
];

fn validate(c: &DefaultsConfig, data: &BTreeMap<String, String>) -> Vec<Problem> {
    let w = |key: &str| keys::written(KEYS, data, c, key);
    let mut p = Vec::new();
    let t = c.revision_timeout.as_secs();
    if c.revision_timeout > c.max_revision_timeout {
        p.push(Problem::new(
            "revision-timeout-seconds",
            w("revision-timeout-seconds"),
            format!(
                "must not exceed max-revision-timeout-seconds ({})",
                c.max_revision_timeout.as_secs()
            ),
        ));
    }
    if c.revision_response_start_timeout
        .is_some_and(|d| d > c.revision_timeout)
    {
        p.push(Problem::new(
            "revision-response-start-timeout-seconds",
            w("revision-response-start-timeout-seconds"),
            format!("must not exceed revision-timeout-seconds ({t})"),
        ));
    }
    if c.revision_idle_timeout > c.revision_timeout {
        p.push(Problem::new(
            "revision-idle-timeout-seconds",
            w("revision-idle-timeout-seconds"),
            format!("must not exceed revision-timeout-seconds ({t})"),
        ));
    }
    if c.container_concurrency > c.container_concurrency_max_limit {
        p.push(Problem::new(
            "container-concurrency",
            w("container-concurrency"),
            format!(
                "must be in [0, container-concurrency-max-limit ({})]",
                c.container_concurrency_max_limit
            ),
        ));
    }
    if c.container_concurrency == 0 && !c.allow_container_concurrency_zero {
        p.push(Problem::new(
            "container-concurrency",
            w("container-concurrency"),
            "must be at least 1 when allow-container-concurrency-zero is false",
        ));
    }
    p
}

impl ConfigMap for DefaultsConfig {
    const NAME: &'static str = NAME;
    const INERT: &'static [&'static str] = INERT;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        validate(self, data)
    }
}

impl DefaultsConfig {
    /// The response-start timeout in force (the revision timeout when unset).
    pub fn response_start_timeout(&self) -> Duration {
        self.revision_response_start_timeout
            .unwrap_or(self.revision_timeout)
    }
}
