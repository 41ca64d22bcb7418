//! `config-autoscaler`: Knative's KPA keys (docs/architecture.md, "Knative's rules").

use std::time::Duration;

/// The cluster-wide autoscaler settings, every key of Knative's `config-autoscaler`.
///
/// Values are stored in the unit the decider uses; [`AutoscalerConfig::default`] is Knative's
/// default for every key. Only a value that passed validation is ever held here.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalerConfig {
    /// `pod-autoscaler-class`: which autoscaler owns revisions by default (not validated, as
    /// in Knative).
    pub pod_autoscaler_class: String,
    /// `enable-scale-to-zero`: when false the last replica is never removed.
    pub enable_scale_to_zero: bool,
    /// `allow-zero-initial-scale`: whether `initial-scale` may be 0.
    pub allow_zero_initial_scale: bool,
    /// `max-scale-up-rate`: desired/ready ratio allowed per decision (> 1).
    pub max_scale_up_rate: f64,
    /// `max-scale-down-rate`: ready/desired ratio allowed per decision (> 1).
    pub max_scale_down_rate: f64,
    /// `container-concurrency-target-percentage` as a fraction in (0, 1] (70 -> 0.7).
    pub container_concurrency_target_fraction: f64,
    /// `container-concurrency-target-default`: soft concurrency target per pod.
    pub container_concurrency_target_default: f64,
    /// `requests-per-second-target-default`: RPS target per pod.
    pub requests_per_second_target_default: f64,
    /// `target-burst-capacity`: spare concurrency to keep before the activator leaves the path;
    /// 0 = leave as soon as scaled, -1 = the activator stays in the path always.
    pub target_burst_capacity: f64,
    /// `stable-window`: the averaging window of normal operation, [6s, 1h], whole seconds.
    pub stable_window: Duration,
    /// `panic-window-percentage`: panic window as a percentage of the stable window, [1, 100].
    pub panic_window_percentage: f64,
    /// `panic-threshold-percentage`: panic when desired/ready reaches this percentage,
    /// [110, 1000] (range-checked here, unlike Knative).
    pub panic_threshold_percentage: f64,
    /// `activator-capacity`: concurrent requests one activator is sized for (>= 1).
    pub activator_capacity: f64,
    /// `initial-scale`: replicas a new revision starts with.
    pub initial_scale: u32,
    /// `min-scale`: lower bound on replicas.
    pub min_scale: u32,
    /// `max-scale`: upper bound on replicas; 0 = unbounded.
    pub max_scale: u32,
    /// `max-scale-limit`: the highest max-scale a revision may ask for; 0 = no limit.
    pub max_scale_limit: u32,
    /// `scale-down-delay`: how long a lower desired scale must persist before it is applied.
    pub scale_down_delay: Duration,
    /// `scale-to-zero-grace-period`: how long the activator must be in the path before the last
    /// replica goes.
    pub scale_to_zero_grace_period: Duration,
    /// `scale-to-zero-pod-retention-period`: how long the last replica stays after the revision
    /// became inactive.
    pub scale_to_zero_pod_retention_period: Duration,
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        Self {
            pod_autoscaler_class: "kpa.autoscaling.knative.dev".into(),
            enable_scale_to_zero: true,
            allow_zero_initial_scale: false,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            container_concurrency_target_fraction: 0.7,
            container_concurrency_target_default: 100.0,
            requests_per_second_target_default: 200.0,
            target_burst_capacity: 211.0,
            stable_window: Duration::from_secs(60),
            panic_window_percentage: 10.0,
            panic_threshold_percentage: 200.0,
            activator_capacity: 100.0,
            initial_scale: 1,
            min_scale: 0,
            max_scale: 0,
            max_scale_limit: 0,
            scale_down_delay: Duration::ZERO,
            scale_to_zero_grace_period: Duration::from_secs(30),
            scale_to_zero_pod_retention_period: Duration::ZERO,
        }
    }
}

use std::collections::BTreeMap;

use serde_json::Value;

use super::keys::{self, ConfigMap, Key};
use super::parse::{
    Problem, format_duration, parse_bool, parse_f64, parse_go_duration_nanos, parse_i32,
};

/// Name of the ConfigMap.
pub const NAME: &str = "config-autoscaler";

/// Lower bound of `stable-window` and of the `window` annotation.
pub const WINDOW_MIN: Duration = Duration::from_secs(6);
/// Upper bound of `stable-window` and of the `window` annotation.
pub const WINDOW_MAX: Duration = Duration::from_secs(3600);
/// The smallest per-pod target (`TargetMin` in Knative).
pub const TARGET_MIN: f64 = 0.01;

/// A duration that may be negative in the input, as a signed number of nanoseconds, so rules
/// can say "must not be negative" rather than "not a duration".
pub(crate) fn signed_duration(s: &str) -> Result<(bool, Duration), String> {
    let n = parse_go_duration_nanos(s)?;
    Ok((n < 0, Duration::from_nanos(n.unsigned_abs() as u64)))
}

/// A non-negative duration; `whole` demands whole seconds (Knative's "at most second precision").
pub(crate) fn duration_in(
    s: &str,
    min: Duration,
    max: Option<Duration>,
    whole: bool,
) -> Result<Duration, String> {
    let (neg, d) = signed_duration(s)?;
    let range = match max {
        Some(max) => format!(
            "must be in [{}, {}]",
            format_duration(min),
            format_duration(max)
        ),
        None if min.is_zero() => "must not be negative".to_string(),
        None => format!("must be at least {}", format_duration(min)),
    };
    if neg || d < min || max.is_some_and(|m| d > m) {
        return Err(range);
    }
    if whole && d.subsec_nanos() != 0 {
        return Err("must be whole seconds (at most second precision)".into());
    }
    Ok(d)
}

fn non_negative_i32(s: &str) -> Result<u32, String> {
    let v = parse_i32(s)?;
    u32::try_from(v).map_err(|_| "must not be negative".to_string())
}

/// Every key of `config-autoscaler`, in Knative's order.
pub static KEYS: &[Key<AutoscalerConfig>] = &[
    Key {
        name: "pod-autoscaler-class",
        unit: "class name",
        help: "The autoscaler that owns revisions without a class annotation.",
        parse: |c, s| {
            c.pod_autoscaler_class = s.to_string();
            Ok(())
        },
        show: |c| {
            (
                c.pod_autoscaler_class.clone(),
                Value::from(c.pod_autoscaler_class.clone()),
            )
        },
    },
    Key {
        name: "enable-scale-to-zero",
        unit: "bool",
        help: "Whether idle revisions may go to zero replicas.",
        parse: |c, s| {
            c.enable_scale_to_zero = parse_bool(s)?;
            Ok(())
        },
        show: |c| keys::show_bool(c.enable_scale_to_zero),
    },
    Key {
        name: "allow-zero-initial-scale",
        unit: "bool",
        help: "Whether initial-scale may be 0 (a new revision then starts with no replica).",
        parse: |c, s| {
            c.allow_zero_initial_scale = parse_bool(s)?;
            Ok(())
        },
        show: |c| keys::show_bool(c.allow_zero_initial_scale),
    },
    Key {
        name: "max-scale-up-rate",
        unit: "ratio desired/ready per decision",
        help: "How many times the ready replicas one decision may ask for.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if v <= 1.0 {
                return Err("must be greater than 1.0".into());
            }
            c.max_scale_up_rate = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.max_scale_up_rate),
    },
    Key {
        name: "max-scale-down-rate",
        unit: "ratio ready/desired per decision",
        help: "By how many times one decision may shrink the ready replicas.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if v <= 1.0 {
                return Err("must be greater than 1.0".into());
            }
            c.max_scale_down_rate = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.max_scale_down_rate),
    },
    Key {
        name: "container-concurrency-target-percentage",
        unit: "percent (values <= 1.0 are read as a fraction)",
        help: "Target utilisation of a replica's concurrency target.",
        parse: |c, s| {
            let mut v = parse_f64(s)?;
            if v > 1.0 {
                v /= 100.0;
            }
            if v <= 0.0 || v > 1.0 {
                return Err("must be in (0, 100]".into());
            }
            c.container_concurrency_target_fraction = v;
            Ok(())
        },
        show: |c| keys::show_f64(round9(c.container_concurrency_target_fraction * 100.0)),
    },
    Key {
        name: "container-concurrency-target-default",
        unit: "concurrent requests per replica",
        help: "Soft concurrency target per replica when containerConcurrency is 0.",
        parse: |c, s| {
            c.container_concurrency_target_default = parse_f64(s)?;
            Ok(())
        },
        show: |c| keys::show_f64(c.container_concurrency_target_default),
    },
    Key {
        name: "requests-per-second-target-default",
        unit: "requests per second per replica",
        help: "Target for revisions that scale on the rps metric.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if v < TARGET_MIN {
                return Err(format!("must be at least {TARGET_MIN}"));
            }
            c.requests_per_second_target_default = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.requests_per_second_target_default),
    },
    Key {
        name: "target-burst-capacity",
        unit: "concurrent requests (-1 = activator always in path)",
        help: "Spare capacity to keep before the activator leaves the request path.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if v < 0.0 && v != -1.0 {
                return Err("must be non-negative, or -1 (activator always in the path)".into());
            }
            c.target_burst_capacity = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.target_burst_capacity),
    },
    Key {
        name: "stable-window",
        unit: "duration, whole seconds",
        help: "Averaging window of normal operation; also the idle time before scale to zero.",
        parse: |c, s| {
            c.stable_window = duration_in(s, WINDOW_MIN, Some(WINDOW_MAX), true)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.stable_window),
    },
    Key {
        name: "panic-window-percentage",
        unit: "percent of stable-window",
        help: "Length of the short window that detects bursts.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if !(1.0..=100.0).contains(&v) {
                return Err("must be in [1, 100]".into());
            }
            c.panic_window_percentage = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.panic_window_percentage),
    },
    Key {
        name: "panic-threshold-percentage",
        unit: "percent of the ready replicas' capacity",
        help: "Panic mode starts when the panic window asks for this share of ready capacity.",
        parse: |c, s| {
            let v = parse_f64(s)?;
            // Knative checks this range only on the annotation; an out-of-range ConfigMap value
            // silently makes the autoscaler panic constantly (<100) or never (huge).
            if !(110.0..=1000.0).contains(&v) {
                return Err("must be in [110, 1000]".into());
            }
            c.panic_threshold_percentage = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.panic_threshold_percentage),
    },
    Key {
        name: "activator-capacity",
        unit: "concurrent requests per activator",
        help: "Requests one activator is sized for (how many activators back a revision).",
        parse: |c, s| {
            let v = parse_f64(s)?;
            if v < 1.0 {
                return Err("must be at least 1".into());
            }
            c.activator_capacity = v;
            Ok(())
        },
        show: |c| keys::show_f64(c.activator_capacity),
    },
    Key {
        name: "initial-scale",
        unit: "replicas",
        help: "Replicas a new revision starts with.",
        parse: |c, s| {
            c.initial_scale = non_negative_i32(s)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.initial_scale),
    },
    Key {
        name: "min-scale",
        unit: "replicas",
        help: "Fewest replicas a revision keeps.",
        parse: |c, s| {
            c.min_scale = non_negative_i32(s)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.min_scale),
    },
    Key {
        name: "max-scale",
        unit: "replicas (0 = unbounded)",
        help: "Most replicas a revision may have.",
        parse: |c, s| {
            c.max_scale = non_negative_i32(s)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_scale),
    },
    Key {
        name: "max-scale-limit",
        unit: "replicas (0 = no limit)",
        help: "The highest max-scale any revision may ask for.",
        parse: |c, s| {
            c.max_scale_limit = non_negative_i32(s)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.max_scale_limit),
    },
    Key {
        name: "scale-down-delay",
        unit: "duration, whole seconds",
        help: "A lower replica count must be wanted this long before it is applied.",
        parse: |c, s| {
            c.scale_down_delay = duration_in(s, Duration::ZERO, None, true)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.scale_down_delay),
    },
    Key {
        name: "scale-to-zero-grace-period",
        unit: "duration",
        help: "How long the activator must be in the path before the last replica goes.",
        parse: |c, s| {
            let (neg, d) = signed_duration(s)?;
            if neg || d.is_zero() {
                return Err("must be positive".into());
            }
            c.scale_to_zero_grace_period = d;
            Ok(())
        },
        show: |c| keys::show_duration(c.scale_to_zero_grace_period),
    },
    Key {
        name: "scale-to-zero-pod-retention-period",
        unit: "duration",
        help: "How long the last replica stays after the revision went idle.",
        parse: |c, s| {
            c.scale_to_zero_pod_retention_period = duration_in(s, Duration::ZERO, None, false)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.scale_to_zero_pod_retention_period),
    },
];

/// Knative keys of this ConfigMap that thaw accepts but does not use.
const INERT: &[&str] = &[];

fn round9(v: f64) -> f64 {
    (v * 1e9).round() / 1e9
}

fn validate(c: &AutoscalerConfig, data: &BTreeMap<String, String>) -> Vec<Problem> {
    let w = |key: &str| keys::written(KEYS, data, c, key);
    let mut p = Vec::new();
    let target = c.container_concurrency_target_fraction * c.container_concurrency_target_default;
    if target < TARGET_MIN {
        let key = if data.contains_key("container-concurrency-target-default") {
            "container-concurrency-target-default"
        } else {
            "container-concurrency-target-percentage"
        };
        p.push(Problem::new(
            key,
            w(key),
            format!(
                "container-concurrency-target-percentage x container-concurrency-target-default \
                 = {target}, must be at least {TARGET_MIN}"
            ),
        ));
    }
    if c.initial_scale == 0 && !c.allow_zero_initial_scale {
        p.push(Problem::new(
            "initial-scale",
            w("initial-scale"),
            "must be at least 1 unless allow-zero-initial-scale is true",
        ));
    }
    if c.max_scale_limit > 0 && (c.max_scale < 1 || c.max_scale > c.max_scale_limit) {
        p.push(Problem::new(
            "max-scale",
            w("max-scale"),
            format!("must be in [1, max-scale-limit ({})]", c.max_scale_limit),
        ));
    }
    if c.max_scale > 0 && c.min_scale > c.max_scale {
        p.push(Problem::new(
            "min-scale",
            w("min-scale"),
            format!("must be in [0, max-scale ({})]", c.max_scale),
        ));
    }
    p
}

impl ConfigMap for AutoscalerConfig {
    const NAME: &'static str = NAME;
    const INERT: &'static [&'static str] = INERT;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        validate(self, data)
    }
}

/// The panic window Knative derives from a stable window and a percentage: rounded to whole
/// seconds, at least one second (one bucket).
pub fn panic_window(stable: Duration, percentage: f64) -> Duration {
    let secs = (stable.as_secs_f64() * percentage / 100.0).round();
    Duration::from_secs((secs as u64).max(1))
}
