use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::annotations::{self, resolve};
use crate::config::revision::{RevisionInput, resolve_revision};
use crate::config::{Aggregation, AutoscalerConfig, AutoscalingSpec, ConfigSet, Metric};
use crate::revision::Protocol;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| {
            let k = if k.contains('/') {
                k.to_string()
            } else {
                format!("autoscaling.knative.dev/{k}")
            };
            (k, v.to_string())
        })
        .collect()
}

#[test]
fn no_annotations_gives_knative_defaults() {
    let spec = resolve(&AutoscalerConfig::default(), &BTreeMap::new(), 0).unwrap();
    assert_eq!(spec, AutoscalingSpec::default());
}

/// Each annotation: one accepted value (and its effect) and one rejected value.
#[test]
fn every_annotation_accepted_and_rejected() {
    let cfg = AutoscalerConfig::default();
    type Check = fn(&AutoscalingSpec) -> bool;
    let rows: Vec<(&str, &str, Check, &str, &str)> = vec![
        (
            "class",
            "kpa.autoscaling.knative.dev",
            |s| s.class == "kpa.autoscaling.knative.dev",
            "foo.knative.dev",
            "must be",
        ),
        (
            "metric",
            "rps",
            |s| s.metric == Metric::Rps,
            "cpu",
            "concurrency or rps",
        ),
        (
            "target",
            "10",
            |s| s.total_value == 10.0 && s.target_value == 7.0,
            "0.001",
            "at least 0.01",
        ),
        (
            "target-utilization-percentage",
            "50",
            |s| s.target_utilization == 0.5 && s.target_value == 50.0,
            "0.5",
            "[1, 100]",
        ),
        (
            "target-burst-capacity",
            "-1",
            |s| s.target_burst_capacity == -1.0,
            "-5",
            "non-negative",
        ),
        (
            "window",
            "2m",
            |s| {
                s.stable_window == Duration::from_secs(120)
                    && s.panic_window == Duration::from_secs(12)
            },
            "5s",
            "[6s, 1h]",
        ),
        (
            "panic-window-percentage",
            "50",
            |s| s.panic_window == Duration::from_secs(30),
            "101",
            "[1, 100]",
        ),
        (
            "panic-threshold-percentage",
            "150",
            |s| s.panic_threshold == 1.5,
            "105",
            "[110, 1000]",
        ),
        (
            "min-scale",
            "2",
            |s| s.min_scale == 2,
            "-1",
            "must not be negative",
        ),
        (
            "max-scale",
            "5",
            |s| s.max_scale == 5,
            "x",
            "not an integer",
        ),
        (
            "initial-scale",
            "3",
            |s| s.initial_scale == 3,
            "-1",
            "must not be negative",
        ),
        (
            "activation-scale",
            "3",
            |s| s.activation_scale == 3,
            "1",
            "at least 2",
        ),
        (
            "scale-down-delay",
            "30s",
            |s| s.scale_down_delay == Duration::from_secs(30),
            "2h",
            "[0s, 1h]",
        ),
        (
            "scale-to-zero-pod-retention-period",
            "1m",
            |s| s.scale_to_zero_pod_retention_period == Duration::from_secs(60),
            "-1s",
            "[0s, 1h]",
        ),
        (
            "metric-aggregation-algorithm",
            "weightedExponential",
            |s| s.aggregation == Aggregation::WeightedExponential,
            "median",
            "linear or weighted-exponential",
        ),
        (
            "serving.knative.dev/progress-deadline",
            "60s",
            |s| {
                s.progress_deadline == Duration::from_secs(60)
                    && s.activation_timeout() == Duration::from_secs(90)
            },
            "0s",
            "at least 1s",
        ),
    ];
    for (name, ok, check, bad, reason) in rows {
        let spec =
            resolve(&cfg, &ann(&[(name, ok)]), 0).unwrap_or_else(|e| panic!("{name}={ok}: {e}"));
        assert!(check(&spec), "{name}={ok}: {spec:?}");
        let e = resolve(&cfg, &ann(&[(name, bad)]), 0).unwrap_err();
        assert_eq!(e.0.len(), 1, "{name}={bad}: {e}");
        assert!(e.0[0].key.ends_with(name), "{}", e.0[0].key);
        assert!(
            e.0[0].reason.contains(reason),
            "{name}={bad}: {:?}",
            e.0[0].reason
        );
    }
}

#[test]
fn annotation_over_configmap_over_default() {
    let cfg = AutoscalerConfig {
        stable_window: Duration::from_secs(30),
        min_scale: 1,
        target_burst_capacity: 0.0,
        container_concurrency_target_default: 50.0,
        ..Default::default()
    };
    // ConfigMap over default.
    let s = resolve(&cfg, &BTreeMap::new(), 0).unwrap();
    assert_eq!(
        (s.stable_window, s.min_scale, s.target_burst_capacity),
        (Duration::from_secs(30), 1, 0.0)
    );
    assert_eq!(s.total_value, 50.0);
    assert_eq!(s.panic_window, Duration::from_secs(3));
    // Annotation over ConfigMap.
    let s = resolve(
        &cfg,
        &ann(&[
            ("window", "10s"),
            ("min-scale", "0"),
            ("target-burst-capacity", "5"),
        ]),
        0,
    )
    .unwrap();
    assert_eq!(
        (s.stable_window, s.min_scale, s.target_burst_capacity),
        (Duration::from_secs(10), 0, 5.0)
    );
    assert_eq!(s.panic_window, Duration::from_secs(1), "10% of 10s = 1s");
    // Legacy aliases work, and conflicting duplicates are named.
    assert_eq!(
        resolve(&cfg, &ann(&[("minScale", "3")]), 0)
            .unwrap()
            .min_scale,
        3
    );
    let e = resolve(&cfg, &ann(&[("minScale", "3"), ("min-scale", "4")]), 0).unwrap_err();
    assert!(e.0[0].reason.contains("conflicts"), "{e}");
}

#[test]
fn target_and_container_concurrency_combine() {
    let cfg = AutoscalerConfig::default();
    // cc > 0: the target is cc (not the ConfigMap default) ...
    let s = resolve(&cfg, &BTreeMap::new(), 10).unwrap();
    assert_eq!((s.total_value, s.target_value), (10.0, 7.0));
    // ... and a target annotation is capped at cc.
    let s = resolve(&cfg, &ann(&[("target", "50")]), 10).unwrap();
    assert_eq!(s.total_value, 10.0);
    let s = resolve(&cfg, &ann(&[("target", "4")]), 10).unwrap();
    assert_eq!(s.total_value, 4.0);
    // rps uses its own default and Knative's fixed 0.7 utilisation.
    let s = resolve(&cfg, &ann(&[("metric", "rps")]), 10).unwrap();
    assert_eq!((s.total_value, s.target_utilization), (200.0, 0.7));
    // TargetValue never drops below 0.01.
    let s = resolve(
        &cfg,
        &ann(&[("target", "0.01"), ("target-utilization-percentage", "1")]),
        0,
    )
    .unwrap();
    assert_eq!(s.target_value, 0.01);
}

#[test]
fn scale_bounds_rules() {
    let cfg = AutoscalerConfig {
        max_scale_limit: 10,
        max_scale: 5,
        ..Default::default()
    };
    assert!(
        resolve(&cfg, &ann(&[("max-scale", "0")]), 0).unwrap_err().0[0]
            .reason
            .contains("max-scale-limit")
    );
    assert!(resolve(&cfg, &ann(&[("max-scale", "11")]), 0).is_err());
    assert!(
        resolve(&cfg, &ann(&[("min-scale", "6")]), 0).is_err(),
        "min above ConfigMap max"
    );
    assert!(
        resolve(&cfg, &ann(&[("activation-scale", "6")]), 0).is_err(),
        "activation above max"
    );
    let e = resolve(
        &cfg,
        &ann(&[("min-scale", "4"), ("activation-scale", "3")]),
        0,
    )
    .unwrap_err();
    assert_eq!(e.0[0].key, "autoscaling.knative.dev/activation-scale");
    assert!(e.0[0].reason.contains("below min-scale (4)"), "{e}");
    assert!(
        resolve(
            &cfg,
            &ann(&[("min-scale", "3"), ("activation-scale", "3")]),
            0
        )
        .is_ok()
    );
    let open = AutoscalerConfig::default();
    assert_eq!(
        resolve(&open, &ann(&[("min-scale", "6")]), 0)
            .unwrap()
            .min_scale,
        6,
        "max 0 = unbounded"
    );
}

/// Knative's GetInitialScale: initial-scale 0 without allow-zero-initial-scale falls back to
/// the cluster's initial-scale (with a warning), rather than failing the revision.
#[test]
fn zero_initial_scale_not_allowed_falls_back_to_the_cluster_value() {
    let cfg = AutoscalerConfig {
        initial_scale: 2,
        ..Default::default()
    };
    let a = ann(&[("initial-scale", "0")]);
    assert_eq!(resolve(&cfg, &a, 0).unwrap().initial_scale, 2);
    let w = annotations::warnings(&cfg, &a);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("starts at initial-scale 2"), "{w:?}");
    let allowed = AutoscalerConfig {
        allow_zero_initial_scale: true,
        ..cfg
    };
    assert_eq!(resolve(&allowed, &a, 0).unwrap().initial_scale, 0);
    assert!(annotations::warnings(&allowed, &a).is_empty());
}

#[test]
fn global_only_keys_as_annotations_are_warned() {
    let w = annotations::warnings(
        &AutoscalerConfig::default(),
        &ann(&[
            ("max-scale-down-rate", "4"),
            ("bogus", "1"),
            ("minScale", "1"),
        ]),
    );
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .any(|w| w.contains("max-scale-down-rate: set it in config-autoscaler")),
        "{w:?}"
    );
    assert!(
        w.iter().any(|w| w.contains("bogus: unknown annotation")),
        "{w:?}"
    );
}

#[test]
fn revision_spec_merges_defaults_timeouts_and_activator_annotations() {
    let configs = ConfigSet::default();
    let mut input = RevisionInput {
        namespace: "default".into(),
        name: "hello-00001".into(),
        port_name: Some("h2c".into()),
        ..Default::default()
    };
    let spec = resolve_revision(&input, &configs).unwrap();
    assert_eq!(spec.protocol, Protocol::H2c);
    assert_eq!(spec.timeouts.total, Duration::from_secs(300));
    assert_eq!(spec.timeouts.cold_wait, Duration::from_secs(300));
    assert_eq!(spec.timeouts.idle, None);
    assert_eq!(spec.queue_depth, 10_000);

    input.timeout_seconds = Some(60);
    input.container_concurrency = Some(4);
    input.annotations = ann(&[
        ("activator.thaw.dev/queue-depth", "50"),
        ("activator.thaw.dev/cold-wait", "20s"),
        ("activator.thaw.dev/initial-burst", "5"),
    ]);
    let spec = resolve_revision(&input, &configs).unwrap();
    assert_eq!((spec.queue_depth, spec.initial_burst), (50, 5));
    assert_eq!(spec.timeouts.cold_wait, Duration::from_secs(20));
    assert_eq!(spec.timeouts.response_start, Duration::from_secs(60));
    assert_eq!(spec.autoscaling.total_value, 4.0);

    input.annotations = ann(&[
        ("activator.thaw.dev/cold-wait", "2m"),
        ("activator.thaw.dev/queue-depth", "50000"),
        ("activator.thaw.dev/typo", "1"),
        ("window", "1s"),
    ]);
    input.container_concurrency = Some(5000);
    let e = resolve_revision(&input, &configs).unwrap_err();
    let keys: Vec<_> = e.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "spec.containerConcurrency",
            "autoscaling.knative.dev/window",
            "activator.thaw.dev/cold-wait",
            "activator.thaw.dev/queue-depth",
            "activator.thaw.dev/typo",
        ]
    );
}

/// Knative's revision defaulting: `timeoutSeconds: 0` is config-defaults' timeout, not an error;
/// above max-revision-timeout-seconds is still refused.
#[test]
fn timeout_seconds_zero_is_the_configured_default() {
    let configs = ConfigSet::default();
    let mut input = RevisionInput {
        namespace: "default".into(),
        name: "hello-00001".into(),
        timeout_seconds: Some(0),
        ..Default::default()
    };
    let spec = resolve_revision(&input, &configs).unwrap();
    assert_eq!(spec.timeouts.total, configs.defaults.revision_timeout);
    input.timeout_seconds = Some(601);
    let e = resolve_revision(&input, &configs).unwrap_err();
    assert_eq!(e.0[0].key, "spec.timeoutSeconds");
}
