//! STAND-IN CONFIG PARSER FOR `thaw simulate` — replace at merge.
//!
//! The real parser lives in `src/config` (being written concurrently) and will expose
//! `config::load::autoscaler_from_manifest(path) -> Result<AutoscalerConfig, Problems>` and
//! `config::annotations::resolve(&AutoscalerConfig, &BTreeMap<String, String>, u32) ->
//! Result<AutoscalingSpec, Problems>`. The two private functions below have exactly those
//! shapes (with `String` errors), and [`load_spec`] is the only caller: swapping them for the
//! real ones is a two-line change here. Until then this maps the keys `simulate` needs, with
//! Knative's names, units and main range checks (knative-dataplane.md §3.1).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::config::parse::{parse_bool, parse_f64, parse_go_duration_nanos, parse_i32};
use crate::config::{Aggregation, AutoscalerConfig, AutoscalingSpec, Metric};

/// The annotation prefix of per-revision autoscaler settings.
pub const PREFIX: &str = "autoscaling.knative.dev/";

/// The effective settings of a revision with `container_concurrency`, from a
/// `config-autoscaler` manifest (or Knative's defaults without one) and annotations.
pub fn load_spec(
    config_path: Option<&Path>,
    annotations: &BTreeMap<String, String>,
    container_concurrency: u32,
) -> Result<AutoscalingSpec, String> {
    let config = match config_path {
        Some(path) => autoscaler_from_manifest(path)?,
        None => AutoscalerConfig::default(),
    };
    resolve(&config, annotations, container_concurrency)
}

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(default)]
    data: BTreeMap<String, String>,
}

fn bad(key: &str, value: &str, reason: impl std::fmt::Display) -> String {
    format!("{key}: {value}: {reason}")
}

fn duration(key: &str, v: &str) -> Result<Duration, String> {
    let nanos = parse_go_duration_nanos(v).map_err(|e| bad(key, v, e))?;
    let nanos = u64::try_from(nanos).map_err(|_| bad(key, v, "must not be negative"))?;
    Ok(Duration::from_nanos(nanos))
}

fn whole_window(key: &str, v: &str) -> Result<Duration, String> {
    let d = duration(key, v)?;
    if d < Duration::from_secs(6) || d > Duration::from_secs(3600) || d.subsec_nanos() != 0 {
        return Err(bad(key, v, "must be whole seconds in [6s, 1h]"));
    }
    Ok(d)
}

fn number(key: &str, v: &str, ok: impl Fn(f64) -> bool, rule: &str) -> Result<f64, String> {
    let x = parse_f64(v).map_err(|e| bad(key, v, e))?;
    if ok(x) { Ok(x) } else { Err(bad(key, v, rule)) }
}

fn count(key: &str, v: &str) -> Result<u32, String> {
    let x = parse_i32(v).map_err(|e| bad(key, v, e))?;
    u32::try_from(x).map_err(|_| bad(key, v, "must not be negative"))
}

fn autoscaler_from_manifest(path: &Path) -> Result<AutoscalerConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let manifest: Manifest =
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut c = AutoscalerConfig::default();
    for (key, v) in &manifest.data {
        let (k, v) = (key.as_str(), v.trim());
        match k {
            "pod-autoscaler-class" => c.pod_autoscaler_class = v.to_owned(),
            "enable-scale-to-zero" => {
                c.enable_scale_to_zero = parse_bool(v).map_err(|e| bad(k, v, e))?
            }
            "allow-zero-initial-scale" => {
                c.allow_zero_initial_scale = parse_bool(v).map_err(|e| bad(k, v, e))?
            }
            "max-scale-up-rate" => c.max_scale_up_rate = number(k, v, |x| x > 1.0, "must be > 1")?,
            "max-scale-down-rate" => {
                c.max_scale_down_rate = number(k, v, |x| x > 1.0, "must be > 1")?
            }
            "container-concurrency-target-percentage" => {
                let x = number(k, v, |x| x > 0.0, "must be > 0")?;
                let f = if x <= 1.0 { x } else { x / 100.0 };
                if f > 1.0 {
                    return Err(bad(k, v, "must be at most 100"));
                }
                c.container_concurrency_target_fraction = f;
            }
            "container-concurrency-target-default" => {
                c.container_concurrency_target_default =
                    number(k, v, |x| x >= 0.01, "must be >= 0.01")?
            }
            "requests-per-second-target-default" => {
                c.requests_per_second_target_default =
                    number(k, v, |x| x >= 0.01, "must be >= 0.01")?
            }
            "target-burst-capacity" => {
                c.target_burst_capacity =
                    number(k, v, |x| x >= 0.0 || x == -1.0, "must be >= 0 or -1")?
            }
            "stable-window" => c.stable_window = whole_window(k, v)?,
            "panic-window-percentage" => {
                c.panic_window_percentage =
                    number(k, v, |x| (1.0..=100.0).contains(&x), "must be in [1, 100]")?
            }
            "panic-threshold-percentage" => {
                c.panic_threshold_percentage = number(
                    k,
                    v,
                    |x| (110.0..=1000.0).contains(&x),
                    "must be in [110, 1000]",
                )?
            }
            "activator-capacity" => {
                c.activator_capacity = number(k, v, |x| x >= 1.0, "must be >= 1")?
            }
            "initial-scale" => c.initial_scale = count(k, v)?,
            "min-scale" => c.min_scale = count(k, v)?,
            "max-scale" => c.max_scale = count(k, v)?,
            "max-scale-limit" => c.max_scale_limit = count(k, v)?,
            "scale-down-delay" => c.scale_down_delay = duration(k, v)?,
            "scale-to-zero-grace-period" => {
                c.scale_to_zero_grace_period = duration(k, v)?;
                if c.scale_to_zero_grace_period.is_zero() {
                    return Err(bad(k, v, "must be > 0"));
                }
            }
            "scale-to-zero-pod-retention-period" => {
                c.scale_to_zero_pod_retention_period = duration(k, v)?
            }
            _ => {} // Knative ignores unknown keys (and `_example`).
        }
    }
    if c.initial_scale == 0 && !c.allow_zero_initial_scale {
        return Err(bad(
            "initial-scale",
            "0",
            "needs allow-zero-initial-scale: true",
        ));
    }
    Ok(c)
}

fn resolve(
    config: &AutoscalerConfig,
    annotations: &BTreeMap<String, String>,
    container_concurrency: u32,
) -> Result<AutoscalingSpec, String> {
    let mut ann: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (key, v) in annotations {
        let name = key.strip_prefix(PREFIX).unwrap_or(key);
        let canonical = match name {
            "minScale" => "min-scale",
            "maxScale" => "max-scale",
            "initialScale" => "initial-scale",
            "targetBurstCapacity" => "target-burst-capacity",
            "panicWindowPercentage" => "panic-window-percentage",
            "panicThresholdPercentage" => "panic-threshold-percentage",
            "scaleDownDelay" => "scale-down-delay",
            "scaleToZeroPodRetentionPeriod" => "scale-to-zero-pod-retention-period",
            "targetUtilizationPercentage" => "target-utilization-percentage",
            "metricAggregationAlgorithm" => "metric-aggregation-algorithm",
            "serving.knative.dev/progress-deadline" => "progress-deadline",
            other => other,
        };
        ann.insert(canonical, (key.as_str(), v.trim()));
    }
    let get = |name: &str| ann.get(name).copied();

    let mut spec = AutoscalingSpec {
        class: config.pod_autoscaler_class.clone(),
        container_concurrency,
        ..AutoscalingSpec::default()
    };
    for (&name, &(key, v)) in &ann {
        match name {
            "class"
            | "metric"
            | "target"
            | "target-utilization-percentage"
            | "window"
            | "panic-window-percentage"
            | "progress-deadline" => {} // combined below
            "target-burst-capacity" => {
                spec.target_burst_capacity =
                    number(key, v, |x| x >= 0.0 || x == -1.0, "must be >= 0 or -1")?
            }
            "panic-threshold-percentage" => {
                spec.panic_threshold = number(
                    key,
                    v,
                    |x| (110.0..=1000.0).contains(&x),
                    "must be in [110, 1000]",
                )? / 100.0
            }
            "min-scale" => spec.min_scale = count(key, v)?,
            "max-scale" => spec.max_scale = count(key, v)?,
            "initial-scale" => spec.initial_scale = count(key, v)?,
            "activation-scale" => spec.activation_scale = count(key, v)?.max(1),
            "scale-down-delay" => spec.scale_down_delay = duration(key, v)?,
            "scale-to-zero-pod-retention-period" => {
                spec.scale_to_zero_pod_retention_period = duration(key, v)?
            }
            "metric-aggregation-algorithm" => {
                spec.aggregation = match v {
                    "linear" => Aggregation::Linear,
                    "weighted-exponential" | "weightedExponential" => {
                        Aggregation::WeightedExponential
                    }
                    _ => return Err(bad(key, v, "must be linear or weighted-exponential")),
                }
            }
            _ => return Err(bad(key, v, "unknown autoscaling annotation")),
        }
    }
    let defaults = |v: &mut AutoscalingSpec| {
        if !ann.contains_key("target-burst-capacity") {
            v.target_burst_capacity = config.target_burst_capacity;
        }
        if !ann.contains_key("panic-threshold-percentage") {
            v.panic_threshold = config.panic_threshold_percentage / 100.0;
        }
        if !ann.contains_key("min-scale") {
            v.min_scale = config.min_scale;
        }
        if !ann.contains_key("max-scale") {
            v.max_scale = config.max_scale;
        }
        if !ann.contains_key("initial-scale") {
            v.initial_scale = config.initial_scale;
        }
        if !ann.contains_key("scale-down-delay") {
            v.scale_down_delay = config.scale_down_delay;
        }
        if !ann.contains_key("scale-to-zero-pod-retention-period") {
            v.scale_to_zero_pod_retention_period = config.scale_to_zero_pod_retention_period;
        }
    };
    defaults(&mut spec);
    spec.max_scale_up_rate = config.max_scale_up_rate;
    spec.max_scale_down_rate = config.max_scale_down_rate;
    spec.scale_to_zero_grace_period = config.scale_to_zero_grace_period;
    spec.enable_scale_to_zero = config.enable_scale_to_zero;
    spec.activator_capacity = config.activator_capacity;
    if spec.max_scale > 0 && spec.min_scale > spec.max_scale {
        return Err(bad(
            "min-scale",
            &spec.min_scale.to_string(),
            "must not exceed max-scale",
        ));
    }
    if spec.initial_scale == 0 && !config.allow_zero_initial_scale {
        return Err(bad(
            "initial-scale",
            "0",
            "needs allow-zero-initial-scale: true",
        ));
    }

    // Target (knative-dataplane.md §2.3).
    if let Some((key, v)) = get("metric") {
        spec.metric = match v {
            "concurrency" => Metric::Concurrency,
            "rps" => Metric::Rps,
            _ => return Err(bad(key, v, "must be concurrency or rps")),
        };
    }
    let cc = f64::from(container_concurrency);
    let (mut total, mut utilization) = match spec.metric {
        Metric::Rps => (config.requests_per_second_target_default, 0.7),
        Metric::Concurrency if container_concurrency > 0 => {
            (cc, config.container_concurrency_target_fraction)
        }
        Metric::Concurrency => (
            config.container_concurrency_target_default,
            config.container_concurrency_target_fraction,
        ),
    };
    if let Some((key, v)) = get("target") {
        total = number(key, v, |x| x >= 0.01, "must be >= 0.01")?;
    }
    if let Some((key, v)) = get("target-utilization-percentage") {
        utilization = number(
            key,
            v,
            |x| (1.0..=100.0).contains(&x),
            "must be in [1, 100]",
        )? / 100.0;
    }
    if spec.metric == Metric::Concurrency && container_concurrency > 0 {
        total = total.min(cc);
    }
    spec.total_value = total;
    spec.target_utilization = utilization;
    spec.target_value = (total * utilization).max(0.01);

    // Windows.
    spec.stable_window = match get("window") {
        Some((key, v)) => whole_window(key, v)?,
        None => config.stable_window,
    };
    let percentage = match get("panic-window-percentage") {
        Some((key, v)) => number(
            key,
            v,
            |x| (1.0..=100.0).contains(&x),
            "must be in [1, 100]",
        )?,
        None => config.panic_window_percentage,
    };
    let panic_secs = (spec.stable_window.as_secs_f64() * percentage / 100.0)
        .round()
        .max(1.0);
    spec.panic_window = Duration::from_secs(panic_secs as u64);

    if let Some((key, v)) = get("progress-deadline") {
        spec.activation_timeout = duration(key, v)? + Duration::from_secs(30);
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(data: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-autoscaler\ndata:\n{data}"
        );
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn defaults_match_knative() {
        let spec = load_spec(None, &BTreeMap::new(), 0).unwrap();
        assert_eq!(spec, AutoscalingSpec::default());
    }

    #[test]
    fn manifest_and_annotations_combine() {
        let f = manifest(
            "  stable-window: \"30s\"\n  panic-window-percentage: \"20\"\n  container-concurrency-target-default: \"10\"\n  scale-to-zero-grace-period: 10s\n  _example: |\n    ignored: yes\n",
        );
        let mut ann = BTreeMap::new();
        ann.insert(
            format!("{PREFIX}target-utilization-percentage"),
            "50".to_string(),
        );
        ann.insert("minScale".to_string(), "1".to_string());
        let spec = load_spec(Some(f.path()), &ann, 0).unwrap();
        assert_eq!(spec.stable_window, Duration::from_secs(30));
        assert_eq!(spec.panic_window, Duration::from_secs(6));
        assert_eq!((spec.total_value, spec.target_value), (10.0, 5.0));
        assert_eq!(spec.scale_to_zero_grace_period, Duration::from_secs(10));
        assert_eq!(spec.min_scale, 1);
        // containerConcurrency caps the target.
        ann.insert(format!("{PREFIX}target"), "50".to_string());
        let spec = load_spec(Some(f.path()), &ann, 4).unwrap();
        assert_eq!((spec.total_value, spec.target_value), (4.0, 2.0));
    }

    #[test]
    fn bad_values_name_key_value_and_reason() {
        let f = manifest("  stable-window: \"5s\"\n");
        let err = load_spec(Some(f.path()), &BTreeMap::new(), 0).unwrap_err();
        assert!(err.starts_with("stable-window: 5s: "), "{err}");
        let mut ann = BTreeMap::new();
        ann.insert(format!("{PREFIX}windw"), "60s".to_string());
        let err = load_spec(None, &ann, 0).unwrap_err();
        assert!(err.contains("unknown autoscaling annotation"), "{err}");
    }
}
