//! `config-deployment`: Knative's settings of the Deployments the controller writes for
//! revisions (`serving:pkg/deployment/config.go`), keys, defaults and validation.
//!
//! - `queue-sidecar-image`: the image of the queue sidecar (`thaw queue`) injected into every
//!   revision's pods. Knative requires the key; thaw defaults it to the image `thaw
//!   controller` itself runs (read from its Pod by the controller role), else its own
//!   release image, [`DEFAULT_QUEUE_SIDECAR_IMAGE`] (`ghcr.io/thaw-dev/thaw:<crate version>`),
//!   so one image setting covers every role and the sidecar. An empty value is rejected.
//! - `progress-deadline` (600s): whole seconds, > 0. Each revision Deployment's
//!   `progressDeadlineSeconds` (a revision's `serving.knative.dev/progress-deadline`
//!   annotation wins).
//! - `request-body-idle-timeout` (60s): a duration in [1ms, 1h]; the queue sidecar cuts a request
//!   body that sends nothing for this long (thaw's; config-activator has the same key for the
//!   activator). Reaches the sidecar as `THAW_REQUEST_BODY_IDLE_TIMEOUT`.
//! - `queue-sidecar-{cpu,memory,ephemeral-storage}-{request,limit}`: the sidecar's resources.
//!   As in Knative's code only the CPU request has a default (25m); the others are applied
//!   only when set. Each is a Kubernetes quantity (`25m`, `400Mi`, `1Gi`, `0.5`), not negative.
//! - Digest resolution (`digest-resolution-timeout`, `registries-skipping-tag-resolving`) and
//!   the other Knative keys listed in [`INERT`] are accepted and warned about: thaw does not
//!   resolve tags to digests, and runs no per-pod TLS, affinity or runtime-class defaulting.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::keys::{self, ConfigMap, Key};
use super::parse::{Problem, parse_go_duration_nanos};

/// Name of the ConfigMap.
pub const NAME: &str = "config-deployment";

/// The queue sidecar image when `queue-sidecar-image` is not set: thaw's release image of the
/// controller's own version.
pub const DEFAULT_QUEUE_SIDECAR_IMAGE: &str =
    concat!("ghcr.io/thaw-dev/thaw:", env!("CARGO_PKG_VERSION"));
/// Knative's default `progress-deadline`.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);
/// Knative's default `queue-sidecar-cpu-request` (the only resource with a default in its code).
pub const DEFAULT_QUEUE_SIDECAR_CPU_REQUEST: &str = "25m";

/// The Deployment settings of every revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentConfig {
    /// `queue-sidecar-image`: the `thaw queue` sidecar's image.
    pub queue_sidecar_image: String,
    /// `progress-deadline`: the Deployment's `progressDeadlineSeconds` (whole seconds, > 0).
    pub progress_deadline: Duration,
    /// The sidecar's resources; `None`: not set on the container.
    pub queue_sidecar_resources: SidecarResources,
    /// `request-body-idle-timeout`: the sidecar cuts a request body that sends nothing for this
    /// long while it is forwarded (408, or the connection closed once the response has
    /// started), so a stalled body does not hold a place under containerConcurrency. The same
    /// key and range as config-activator's.
    pub request_body_idle_timeout: Duration,
}

/// The queue sidecar's resource requests and limits, as Kubernetes quantities.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SidecarResources {
    pub cpu_request: Option<String>,
    pub cpu_limit: Option<String>,
    pub memory_request: Option<String>,
    pub memory_limit: Option<String>,
    pub ephemeral_storage_request: Option<String>,
    pub ephemeral_storage_limit: Option<String>,
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        Self {
            queue_sidecar_image: DEFAULT_QUEUE_SIDECAR_IMAGE.to_string(),
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            queue_sidecar_resources: SidecarResources {
                cpu_request: Some(DEFAULT_QUEUE_SIDECAR_CPU_REQUEST.to_string()),
                ..SidecarResources::default()
            },
            request_body_idle_timeout: super::activator::DEFAULT_REQUEST_BODY_IDLE_TIMEOUT,
        }
    }
}

/// A Kubernetes resource quantity that is not negative: a decimal number (`0.5`, `25`) with
/// an optional binary (`Ki` … `Ei`), decimal (`n u m k M G T P E`) or exponent (`e3`) suffix.
/// Returns the value as written (trimmed).
pub fn quantity(s: &str) -> Result<String, String> {
    const ERR: &str = "not a Kubernetes quantity (e.g. 25m, 0.5, 400Mi, 1Gi)";
    let num_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_len);
    let digits = num.strip_prefix(['+', '-']).unwrap_or(num);
    if digits.is_empty()
        || digits.contains(['+', '-'])
        || digits.matches('.').count() > 1
        || digits == "."
    {
        return Err(ERR.into());
    }
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()));
    if !suffix_ok {
        return Err(ERR.into());
    }
    let zero = digits.bytes().all(|b| b == b'0' || b == b'.');
    if num.starts_with('-') && !zero {
        return Err("must not be negative".into());
    }
    Ok(s.to_string())
}

fn show_quantity(q: &Option<String>) -> (String, Value) {
    match q {
        Some(q) => (q.clone(), Value::from(q.as_str())),
        None => (String::new(), Value::Null),
    }
}

macro_rules! resource_key {
    ($name:literal, $field:ident, $help:literal) => {
        Key {
            name: $name,
            unit: "quantity (unset: none)",
            help: $help,
            parse: |c, s| {
                c.queue_sidecar_resources.$field = Some(quantity(s)?);
                Ok(())
            },
            show: |c| show_quantity(&c.queue_sidecar_resources.$field),
        }
    };
}

/// Every key of `config-deployment` thaw reads, in Knative's order.
pub static KEYS: &[Key<DeploymentConfig>] = &[
    Key {
        name: "queue-sidecar-image",
        unit: "image reference",
        help: "The image of the queue sidecar (`thaw queue`) injected into revision pods.",
        parse: |c, s| {
            if s.is_empty() {
                return Err("must not be empty".into());
            }
            if s.chars().any(char::is_whitespace) {
                return Err("an image reference has no spaces".into());
            }
            c.queue_sidecar_image = s.to_string();
            Ok(())
        },
        show: |c| {
            (
                c.queue_sidecar_image.clone(),
                Value::from(c.queue_sidecar_image.as_str()),
            )
        },
    },
    Key {
        name: "progress-deadline",
        unit: "duration (whole seconds, > 0)",
        help: "Each revision Deployment's progressDeadlineSeconds; the activation timeout is it + 30s.",
        parse: |c, s| {
            let n = parse_go_duration_nanos(s)?;
            if n <= 0 {
                return Err("must be greater than 0".into());
            }
            if n % 1_000_000_000 != 0 {
                return Err("must be whole seconds".into());
            }
            c.progress_deadline = Duration::from_nanos(n as u64);
            Ok(())
        },
        show: |c| keys::show_duration(c.progress_deadline),
    },
    Key {
        name: "request-body-idle-timeout",
        unit: "duration",
        help: "The queue sidecar cuts a request body that sends nothing for this long while \
               forwarded: 408 (the connection closed if the response has started).",
        parse: |c, s| {
            c.request_body_idle_timeout = super::activator::request_body_idle_timeout(s)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.request_body_idle_timeout),
    },
    resource_key!(
        "queue-sidecar-cpu-request",
        cpu_request,
        "The queue sidecar's CPU request (25m)."
    ),
    resource_key!(
        "queue-sidecar-cpu-limit",
        cpu_limit,
        "The queue sidecar's CPU limit."
    ),
    resource_key!(
        "queue-sidecar-memory-request",
        memory_request,
        "The queue sidecar's memory request."
    ),
    resource_key!(
        "queue-sidecar-memory-limit",
        memory_limit,
        "The queue sidecar's memory limit."
    ),
    resource_key!(
        "queue-sidecar-ephemeral-storage-request",
        ephemeral_storage_request,
        "The queue sidecar's ephemeral-storage request."
    ),
    resource_key!(
        "queue-sidecar-ephemeral-storage-limit",
        ephemeral_storage_limit,
        "The queue sidecar's ephemeral-storage limit."
    ),
];

/// Knative keys of `config-deployment` thaw accepts and does not use: digest resolution (thaw
/// deploys the image reference as written), the sidecar's token audiences, TLS and root CA
/// (no system-internal TLS), and pod defaulting (affinity, runtime class, schedulability).
pub const INERT: &[&str] = &[
    "digest-resolution-timeout",
    "registries-skipping-tag-resolving",
    "queue-sidecar-token-audiences",
    "queue-sidecar-rootca",
    "default-affinity-type",
    "runtime-class-name",
    "pod-is-always-schedulable",
    "concurrency-state-endpoint",
    "concurrency-state-token-path",
];

impl ConfigMap for DeploymentConfig {
    const NAME: &'static str = NAME;
    const INERT: &'static [&'static str] = INERT;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        let _ = data;
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_knatives_with_thaws_image() {
        let c = DeploymentConfig::parse(&data(&[])).unwrap().config;
        assert_eq!(c, DeploymentConfig::default());
        assert_eq!(c.progress_deadline, Duration::from_secs(600));
        assert_eq!(
            c.queue_sidecar_resources.cpu_request.as_deref(),
            Some("25m")
        );
        assert_eq!(c.queue_sidecar_resources.memory_limit, None);
        assert!(c.queue_sidecar_image.starts_with("ghcr.io/thaw-dev/thaw:"));
        assert!(c.queue_sidecar_image.ends_with(env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn keys_parse() {
        let c = DeploymentConfig::parse(&data(&[
            ("queue-sidecar-image", "registry.example/thaw:1.2"),
            ("progress-deadline", "2m"),
            ("queue-sidecar-cpu-request", "100m"),
            ("queue-sidecar-memory-limit", "800Mi"),
            ("queue-sidecar-ephemeral-storage-request", "1e9"),
            ("request-body-idle-timeout", "15s"),
        ]))
        .unwrap()
        .config;
        assert_eq!(c.queue_sidecar_image, "registry.example/thaw:1.2");
        assert_eq!(c.progress_deadline, Duration::from_secs(120));
        let r = &c.queue_sidecar_resources;
        assert_eq!(r.cpu_request.as_deref(), Some("100m"));
        assert_eq!(r.memory_limit.as_deref(), Some("800Mi"));
        assert_eq!(r.ephemeral_storage_request.as_deref(), Some("1e9"));
        assert_eq!(r.cpu_limit, None);
        assert_eq!(c.request_body_idle_timeout, Duration::from_secs(15));
    }

    #[test]
    fn every_bad_value_is_named() {
        let err = DeploymentConfig::parse(&data(&[
            ("queue-sidecar-image", ""),
            ("progress-deadline", "0s"),
            ("queue-sidecar-cpu-limit", "-1"),
            ("queue-sidecar-memory-request", "lots"),
            ("request-body-idle-timeout", "0s"),
        ]))
        .unwrap_err();
        let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "progress-deadline",
                "queue-sidecar-cpu-limit",
                "queue-sidecar-image",
                "queue-sidecar-memory-request",
                "request-body-idle-timeout"
            ]
        );
        assert!(err.to_string().contains("must be greater than 0"), "{err}");
        assert!(err.to_string().contains("must not be negative"), "{err}");
        assert!(
            err.to_string()
                .contains("request-body-idle-timeout: 0s: must be in [1ms, 1h]"),
            "{err}"
        );
        let err = DeploymentConfig::parse(&data(&[("progress-deadline", "1500ms")])).unwrap_err();
        assert!(err.to_string().contains("whole seconds"), "{err}");
        let err = DeploymentConfig::parse(&data(&[("progress-deadline", "600")])).unwrap_err();
        assert!(err.to_string().contains("unit"), "{err}");
    }

    #[test]
    fn digest_resolution_keys_are_inert_with_a_warning() {
        let parsed = DeploymentConfig::parse(&data(&[
            ("digest-resolution-timeout", "10s"),
            (
                "registries-skipping-tag-resolving",
                "kind.local,ko.local,dev.local",
            ),
            ("no-such-key", "x"),
        ]))
        .unwrap();
        assert_eq!(parsed.config, DeploymentConfig::default());
        assert_eq!(parsed.warnings.len(), 3);
        assert!(
            parsed.warnings[0].starts_with("digest-resolution-timeout: known Knative key"),
            "{:?}",
            parsed.warnings
        );
        assert!(parsed.warnings[1].contains("unknown key"));
    }

    #[test]
    fn quantities() {
        for ok in [
            "25m", "0.5", "1", "400Mi", "1Gi", "1e3", "1E-3", "+2", "-0", ".5", "10k",
        ] {
            assert_eq!(quantity(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in ["", "m", "1x", "1.2.3", "1 Gi", "Gi", "1e", "--1", "1mi"] {
            assert!(quantity(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(quantity("-1m").unwrap_err(), "must not be negative");
    }

    #[test]
    fn show_lists_every_key() {
        let shown = DeploymentConfig::default().show();
        assert_eq!(shown.len(), KEYS.len());
        assert!(shown.iter().all(|s| s.is_default));
        let pd = shown.iter().find(|s| s.key == "progress-deadline").unwrap();
        assert_eq!(pd.text, "10m");
        assert_eq!(pd.json, Value::from(600));
    }
}
