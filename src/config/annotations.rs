//! Per-revision `autoscaling.knative.dev/*` annotations and the effective [`AutoscalingSpec`].

use std::time::Duration;

/// The metric the KPA scales on (`autoscaling.knative.dev/metric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metric {
    /// In-flight requests per pod (Knative's default).
    #[default]
    Concurrency,
    /// Requests per second per pod.
    Rps,
}

/// How a window's buckets are averaged (`autoscaling.knative.dev/metric-aggregation-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Plain average over the valid buckets (Knative's default).
    #[default]
    Linear,
    /// Σ α(1−α)^i · bucket[newest−i], α = max(1 − 0.0001^(1/buckets), 0.2).
    WeightedExponential,
}

/// A revision's effective autoscaling settings: annotation over ConfigMap over default, with
/// target, utilisation and containerConcurrency already combined (docs/architecture.md, "Knative's rules").
///
/// This is what the decider and the scaler read; it is always valid.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalingSpec {
    /// `class`: `kpa.autoscaling.knative.dev` unless an annotation says otherwise.
    pub class: String,
    pub metric: Metric,
    pub aggregation: Aggregation,
    /// The revision's containerConcurrency (0 = unlimited).
    pub container_concurrency: u32,
    /// Per-pod target before utilisation: containerConcurrency when > 0, else the ConfigMap
    /// default, overridden by the `target` annotation (capped at containerConcurrency when > 0).
    pub total_value: f64,
    /// Target utilisation as a fraction (0.7 by default).
    pub target_utilization: f64,
    /// max(0.01, total_value × target_utilization): what one pod should carry.
    pub target_value: f64,
    /// Spare capacity to keep before the activator leaves the path (-1 = always in path).
    pub target_burst_capacity: f64,
    /// panic-threshold-percentage / 100 (2.0 by default).
    pub panic_threshold: f64,
    pub stable_window: Duration,
    /// round(stable × panic-window-percentage / 100), whole seconds, at least 1s.
    pub panic_window: Duration,
    pub max_scale_up_rate: f64,
    pub max_scale_down_rate: f64,
    /// Minimum replicas once the revision is active at all (1 = no effect).
    pub activation_scale: u32,
    pub min_scale: u32,
    /// 0 = unbounded.
    pub max_scale: u32,
    pub initial_scale: u32,
    pub scale_down_delay: Duration,
    pub scale_to_zero_grace_period: Duration,
    pub scale_to_zero_pod_retention_period: Duration,
    pub enable_scale_to_zero: bool,
    pub activator_capacity: f64,
    /// How long a replica may take to become ready (`serving.knative.dev/progress-deadline`,
    /// config-deployment's 600s by default).
    pub progress_deadline: Duration,
    /// Some route may send it traffic (Knative's PodAutoscaler reachability is not
    /// `Unreachable`): min-scale holds and scale-down is rate-limited. From the revision's
    /// routing state ([`crate::config::revision::RevisionInput::unreachable`]), not an
    /// annotation.
    pub reachable: bool,
}

impl AutoscalingSpec {
    /// How long a revision may stay activating before it is given up: the progress deadline
    /// plus Knative's 30 s buffer (docs/architecture.md, "Knative's rules").
    pub fn activation_timeout(&self) -> Duration {
        self.progress_deadline + Duration::from_secs(30)
    }
}

impl Default for AutoscalingSpec {
    /// Knative's defaults for a revision with containerConcurrency 0 and no annotations.
    fn default() -> Self {
        Self {
            class: "kpa.autoscaling.knative.dev".into(),
            metric: Metric::Concurrency,
            aggregation: Aggregation::Linear,
            container_concurrency: 0,
            total_value: 100.0,
            target_utilization: 0.7,
            target_value: 70.0,
            target_burst_capacity: 211.0,
            panic_threshold: 2.0,
            stable_window: Duration::from_secs(60),
            panic_window: Duration::from_secs(6),
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            activation_scale: 1,
            min_scale: 0,
            max_scale: 0,
            initial_scale: 1,
            scale_down_delay: Duration::ZERO,
            scale_to_zero_grace_period: Duration::from_secs(30),
            scale_to_zero_pod_retention_period: Duration::ZERO,
            enable_scale_to_zero: true,
            activator_capacity: 100.0,
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            reachable: true,
        }
    }
}

use std::collections::BTreeMap;

use super::autoscaler::{
    AutoscalerConfig, TARGET_MIN, WINDOW_MAX, WINDOW_MIN, duration_in, panic_window,
};
use super::parse::{Problem, Problems, parse_f64, parse_i32};

/// The prefix of Knative's per-revision autoscaling annotations.
pub const PREFIX: &str = "autoscaling.knative.dev/";
/// Knative's annotation for a revision's progress deadline (activation timeout = it + 30s).
pub const PROGRESS_DEADLINE: &str = "serving.knative.dev/progress-deadline";
/// The KPA class (the only one thaw implements).
pub const KPA_CLASS: &str = "kpa.autoscaling.knative.dev";
/// Knative's HPA class (accepted as a value; thaw then leaves scaling to the platform).
pub const HPA_CLASS: &str = "hpa.autoscaling.knative.dev";
/// Default progress deadline (config-deployment's `progress-deadline`).
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// Each annotation this module reads: its current name and Knative's legacy camelCase alias.
const NAMES: &[(&str, Option<&str>)] = &[
    ("class", None),
    ("metric", None),
    ("target", None),
    (
        "target-utilization-percentage",
        Some("targetUtilizationPercentage"),
    ),
    ("target-burst-capacity", Some("targetBurstCapacity")),
    ("window", None),
    ("panic-window-percentage", Some("panicWindowPercentage")),
    (
        "panic-threshold-percentage",
        Some("panicThresholdPercentage"),
    ),
    ("min-scale", Some("minScale")),
    ("max-scale", Some("maxScale")),
    ("initial-scale", Some("initialScale")),
    ("activation-scale", None),
    ("scale-down-delay", Some("scaleDownDelay")),
    (
        "scale-to-zero-pod-retention-period",
        Some("scaleToZeroPodRetentionPeriod"),
    ),
    (
        "metric-aggregation-algorithm",
        Some("metricAggregationAlgorithm"),
    ),
];

/// ConfigMap keys users try as annotations; Knative ignores them silently, thaw warns.
const GLOBAL_ONLY: &[&str] = &[
    "max-scale-up-rate",
    "max-scale-down-rate",
    "scale-to-zero-grace-period",
    "enable-scale-to-zero",
    "activator-capacity",
];

/// Looks an annotation up by its name or its legacy alias. Both present with different values
/// is a problem (Knative takes the first silently).
fn get<'a>(
    a: &'a BTreeMap<String, String>,
    name: &str,
    problems: &mut Vec<Problem>,
) -> Option<(String, &'a str)> {
    let alias = NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, alias)| *alias);
    let key = format!("{PREFIX}{name}");
    let main = a.get(&key).map(|v| (key.clone(), v.as_str()));
    let legacy = alias.and_then(|al| {
        let k = format!("{PREFIX}{al}");
        a.get(&k).map(|v| (k, v.as_str()))
    });
    match (main, legacy) {
        (Some(m), Some(l)) if m.1.trim() != l.1.trim() => {
            problems.push(Problem::new(
                &m.0,
                m.1,
                format!("conflicts with the legacy annotation {} = {}", l.0, l.1),
            ));
            None
        }
        (Some(m), _) => Some((m.0, m.1.trim())),
        (None, l) => l.map(|(k, v)| (k, v.trim())),
    }
}

/// Parses one annotation with `f`, recording a problem (with the annotation's full name) on
/// failure.
fn read<T>(
    a: &BTreeMap<String, String>,
    name: &str,
    problems: &mut Vec<Problem>,
    f: impl FnOnce(&str) -> Result<T, String>,
) -> Option<(String, T)> {
    let (key, raw) = get(a, name, problems)?;
    match f(raw) {
        Ok(v) => Some((key, v)),
        Err(reason) => {
            problems.push(Problem::new(key, raw, reason));
            None
        }
    }
}

fn int_ge0(s: &str) -> Result<u32, String> {
    u32::try_from(parse_i32(s)?).map_err(|_| "must not be negative".to_string())
}

fn float_in(s: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v = parse_f64(s)?;
    if v < lo || v > hi {
        return Err(format!("must be in [{lo}, {hi}]"));
    }
    Ok(v)
}

/// Warnings for a revision's annotations: unknown `autoscaling.knative.dev/*` names, global-only
/// keys set as annotations (which have no effect), and an initial scale of 0 that `config`
/// does not allow (Knative then starts the revision at the cluster's initial-scale).
pub fn warnings(config: &AutoscalerConfig, annotations: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    if let Some((key, 0)) = read(annotations, "initial-scale", &mut ignored, int_ge0)
        && !config.allow_zero_initial_scale
    {
        out.push(format!(
            "{key}: 0 is not allowed while allow-zero-initial-scale is false in \
             config-autoscaler; the revision starts at initial-scale {} instead, as Knative does",
            config.initial_scale
        ));
    }
    for k in annotations.keys() {
        let Some(name) = k.strip_prefix(PREFIX) else {
            continue;
        };
        if GLOBAL_ONLY.contains(&name) {
            out.push(format!(
                "{k}: set it in config-autoscaler; it has no per-revision annotation"
            ));
        } else if !NAMES.iter().any(|(n, al)| *n == name || *al == Some(name)) {
            out.push(format!("{k}: unknown annotation, ignored"));
        }
    }
    out
}

/// A revision's effective autoscaling settings: its `autoscaling.knative.dev/*` annotations over
/// `config` over Knative's defaults, with target, utilisation and `container_concurrency`
/// combined as Knative does (docs/architecture.md, "Knative's rules"). Every invalid annotation is reported.
pub fn resolve(
    config: &AutoscalerConfig,
    annotations: &BTreeMap<String, String>,
    container_concurrency: u32,
) -> Result<AutoscalingSpec, Problems> {
    let a = annotations;
    let mut p = Vec::new();
    let class = read(a, "class", &mut p, |s| {
        if s.ends_with(".knative.dev") && s != KPA_CLASS && s != HPA_CLASS {
            Err(format!("must be {KPA_CLASS} or {HPA_CLASS}"))
        } else {
            Ok(s.to_string())
        }
    })
    .map(|(_, v)| v)
    .unwrap_or_else(|| config.pod_autoscaler_class.clone());
    let is_kpa = class == KPA_CLASS;
    let metric = read(a, "metric", &mut p, |s| match (is_kpa, s) {
        (true, "concurrency") => Ok(Some(Metric::Concurrency)),
        (true, "rps") => Ok(Some(Metric::Rps)),
        (true, _) => Err("must be concurrency or rps for the KPA class".into()),
        // Other classes (HPA: cpu, memory, custom) are not scaled by thaw's KPA.
        (false, _) => Ok(None),
    })
    .and_then(|(_, v)| v)
    .unwrap_or(Metric::Concurrency);
    let target = read(a, "target", &mut p, |s| {
        let v = parse_f64(s)?;
        if v < TARGET_MIN {
            Err(format!("must be at least {TARGET_MIN}"))
        } else {
            Ok(v)
        }
    });
    let utilization = read(a, "target-utilization-percentage", &mut p, |s| {
        float_in(s, 1.0, 100.0)
    });
    let tbc = read(a, "target-burst-capacity", &mut p, |s| {
        let v = parse_f64(s)?;
        if v < 0.0 && v != -1.0 {
            Err("must be non-negative, or -1".into())
        } else {
            Ok(v)
        }
    });
    let window = read(a, "window", &mut p, |s| {
        duration_in(s, WINDOW_MIN, Some(WINDOW_MAX), true)
    });
    let pwp = read(a, "panic-window-percentage", &mut p, |s| {
        float_in(s, 1.0, 100.0)
    });
    let ptp = read(a, "panic-threshold-percentage", &mut p, |s| {
        float_in(s, 110.0, 1000.0)
    });
    let min_scale = read(a, "min-scale", &mut p, int_ge0);
    let max_scale = read(a, "max-scale", &mut p, int_ge0);
    // Knative's GetInitialScale: a revision asking for 0 while config-autoscaler does not
    // allow it starts at the cluster's initial-scale instead (see `warnings`).
    let initial_scale = read(a, "initial-scale", &mut p, int_ge0)
        .filter(|(_, v)| *v > 0 || config.allow_zero_initial_scale);
    let activation = read(a, "activation-scale", &mut p, |s| {
        let v = int_ge0(s)?;
        if v < 2 {
            Err("must be at least 2".into())
        } else {
            Ok(v)
        }
    });
    let hour = Some(Duration::from_secs(3600));
    let sdd = read(a, "scale-down-delay", &mut p, |s| {
        duration_in(s, Duration::ZERO, hour, true)
    });
    let retention = read(a, "scale-to-zero-pod-retention-period", &mut p, |s| {
        duration_in(s, Duration::ZERO, hour, false)
    });
    let aggregation = read(a, "metric-aggregation-algorithm", &mut p, |s| match s {
        "linear" => Ok(Aggregation::Linear),
        "weighted-exponential" | "weightedExponential" => Ok(Aggregation::WeightedExponential),
        _ => Err("must be linear or weighted-exponential".into()),
    });
    let progress_deadline = a.get(PROGRESS_DEADLINE).and_then(|raw| {
        match duration_in(raw.trim(), Duration::from_secs(1), None, true) {
            Ok(d) => Some(d),
            Err(reason) => {
                p.push(Problem::new(PROGRESS_DEADLINE, raw, reason));
                None
            }
        }
    });

    // Scale bounds: annotation over ConfigMap, then the rules across them.
    let min = min_scale.as_ref().map_or(config.min_scale, |(_, v)| *v);
    let max = max_scale.as_ref().map_or(config.max_scale, |(_, v)| *v);
    if let Some((key, v)) = &max_scale
        && config.max_scale_limit > 0
        && (*v == 0 || *v > config.max_scale_limit)
    {
        p.push(Problem::new(
            key,
            v.to_string(),
            format!(
                "must be in [1, max-scale-limit ({})]",
                config.max_scale_limit
            ),
        ));
    }
    if max > 0 && min > max {
        let (key, v) = match (&min_scale, &max_scale) {
            (_, Some((k, v))) => (k.clone(), *v),
            (Some((k, v)), None) => (k.clone(), *v),
            (None, None) => ("min-scale".to_string(), min),
        };
        p.push(Problem::new(
            key,
            v.to_string(),
            format!("min-scale ({min}) exceeds max-scale ({max})"),
        ));
    }
    // Knative's webhook: activation-scale within [min-scale, max-scale].
    let activation_scale = activation.as_ref().map_or(1, |(_, v)| *v);
    if let Some((key, v)) = &activation {
        if max > 0 && *v > max {
            p.push(Problem::new(
                key,
                v.to_string(),
                format!("must not exceed max-scale ({max})"),
            ));
        } else if *v < min {
            p.push(Problem::new(
                key,
                v.to_string(),
                format!("must not be below min-scale ({min})"),
            ));
        }
    }

    // Target (§2.3).
    let cc = container_concurrency;
    let (total_value, target_utilization) = match metric {
        Metric::Concurrency => {
            let mut total = if cc > 0 {
                f64::from(cc)
            } else {
                config.container_concurrency_target_default
            };
            if let Some((_, t)) = target {
                total = if cc > 0 { t.min(f64::from(cc)) } else { t };
            }
            let util = utilization
                .map_or(config.container_concurrency_target_fraction, |(_, u)| {
                    u / 100.0
                });
            (total, util)
        }
        Metric::Rps => {
            let total = target.map_or(config.requests_per_second_target_default, |(_, t)| t);
            (total, utilization.map_or(0.7, |(_, u)| u / 100.0))
        }
    };
    if !p.is_empty() {
        return Err(Problems(p));
    }
    let stable_window = window.map_or(config.stable_window, |(_, w)| w);
    let pwp = pwp.map_or(config.panic_window_percentage, |(_, v)| v);
    Ok(AutoscalingSpec {
        class,
        metric,
        aggregation: aggregation.map_or(Aggregation::Linear, |(_, v)| v),
        container_concurrency: cc,
        total_value,
        target_utilization,
        target_value: (total_value * target_utilization).max(TARGET_MIN),
        target_burst_capacity: tbc.map_or(config.target_burst_capacity, |(_, v)| v),
        panic_threshold: ptp.map_or(config.panic_threshold_percentage, |(_, v)| v) / 100.0,
        stable_window,
        panic_window: panic_window(stable_window, pwp),
        max_scale_up_rate: config.max_scale_up_rate,
        max_scale_down_rate: config.max_scale_down_rate,
        activation_scale,
        min_scale: min,
        max_scale: max,
        initial_scale: initial_scale.map_or(config.initial_scale, |(_, v)| v),
        scale_down_delay: sdd.map_or(config.scale_down_delay, |(_, v)| v),
        scale_to_zero_grace_period: config.scale_to_zero_grace_period,
        scale_to_zero_pod_retention_period: retention
            .map_or(config.scale_to_zero_pod_retention_period, |(_, v)| v),
        enable_scale_to_zero: config.enable_scale_to_zero,
        activator_capacity: config.activator_capacity,
        progress_deadline: progress_deadline.unwrap_or(DEFAULT_PROGRESS_DEADLINE),
        reachable: true,
    })
}
