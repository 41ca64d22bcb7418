use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::config::keys::Shown;
use crate::config::load::read_manifest;
use crate::config::parse::Problems;
use crate::config::{ActivatorConfig, AutoscalerConfig, ConfigMap, DefaultsConfig};

/// key, default (JSON as `config check` prints it), accepted value -> JSON, rejected value and
/// a fragment of the reason.
type Row = (
    &'static str,
    Value,
    &'static str,
    Value,
    &'static str,
    &'static str,
);

fn autoscaler_rows() -> Vec<Row> {
    vec![
        (
            "pod-autoscaler-class",
            json!("kpa.autoscaling.knative.dev"),
            "custom.example.com",
            json!("custom.example.com"),
            "",
            "",
        ),
        (
            "enable-scale-to-zero",
            json!(true),
            "False",
            json!(false),
            "yes",
            "not a boolean",
        ),
        (
            "allow-zero-initial-scale",
            json!(false),
            "t",
            json!(true),
            "2",
            "not a boolean",
        ),
        (
            "max-scale-up-rate",
            json!(1000),
            "2.5",
            json!(2.5),
            "1.0",
            "greater than 1.0",
        ),
        (
            "max-scale-down-rate",
            json!(2),
            "4",
            json!(4),
            "0.5",
            "greater than 1.0",
        ),
        (
            "container-concurrency-target-percentage",
            json!(70),
            "0.5",
            json!(50),
            "101",
            "(0, 100]",
        ),
        (
            "container-concurrency-target-default",
            json!(100),
            "10",
            json!(10),
            "0.001",
            "at least 0.01",
        ),
        (
            "requests-per-second-target-default",
            json!(200),
            "50.5",
            json!(50.5),
            "0.001",
            "at least 0.01",
        ),
        (
            "target-burst-capacity",
            json!(211),
            "-1",
            json!(-1),
            "-2",
            "non-negative, or -1",
        ),
        (
            "stable-window",
            json!(60),
            "2m",
            json!(120),
            "60",
            "missing unit",
        ),
        (
            "panic-window-percentage",
            json!(10),
            "20",
            json!(20),
            "0.5",
            "[1, 100]",
        ),
        (
            "panic-threshold-percentage",
            json!(200),
            "150",
            json!(150),
            "100",
            "[110, 1000]",
        ),
        (
            "activator-capacity",
            json!(100),
            "50",
            json!(50),
            "0.5",
            "at least 1",
        ),
        (
            "initial-scale",
            json!(1),
            "3",
            json!(3),
            "-1",
            "must not be negative",
        ),
        ("min-scale", json!(0), "2", json!(2), "x", "not an integer"),
        (
            "max-scale",
            json!(0),
            "10",
            json!(10),
            "-3",
            "must not be negative",
        ),
        (
            "max-scale-limit",
            json!(0),
            "100",
            json!(100),
            "-1",
            "must not be negative",
        ),
        (
            "scale-down-delay",
            json!(0),
            "15s",
            json!(15),
            "1.5s",
            "whole seconds",
        ),
        (
            "scale-to-zero-grace-period",
            json!(30),
            "500ms",
            json!(0.5),
            "0s",
            "must be positive",
        ),
        (
            "scale-to-zero-pod-retention-period",
            json!(0),
            "1m30s",
            json!(90),
            "-1s",
            "must not be negative",
        ),
    ]
}

fn defaults_rows() -> Vec<Row> {
    vec![
        (
            "revision-timeout-seconds",
            json!(300),
            "120",
            json!(120),
            "0",
            "at least 1",
        ),
        (
            "max-revision-timeout-seconds",
            json!(600),
            "900",
            json!(900),
            "ten",
            "not an integer",
        ),
        (
            "revision-response-start-timeout-seconds",
            json!(300),
            "30",
            json!(30),
            "-1",
            "at least 0",
        ),
        (
            "revision-idle-timeout-seconds",
            json!(0),
            "60",
            json!(60),
            "1.5",
            "not an integer",
        ),
        (
            "container-concurrency",
            json!(0),
            "10",
            json!(10),
            "-1",
            "[0, 2147483647]",
        ),
        (
            "container-concurrency-max-limit",
            json!(1000),
            "50",
            json!(50),
            "0",
            "[1, 2147483647]",
        ),
        (
            "allow-container-concurrency-zero",
            json!(true),
            "false",
            json!(false),
            "nope",
            "not a boolean",
        ),
    ]
}

fn activator_rows() -> Vec<Row> {
    vec![
        (
            "allowed-upgrades",
            json!("websocket"),
            "websocket, WebTransport",
            json!("websocket, webtransport"),
            "websocket, h2c",
            "h2c cannot be tunnelled",
        ),
        (
            "trusted-proxies",
            json!(""),
            "10.0.0.0/8, 127.0.0.1",
            json!("10.0.0.0/8, 127.0.0.1/32"),
            "10.0.0.0/8, nope",
            "\"nope\" is not an IP address or CIDR range",
        ),
        (
            "pod-probe-budget",
            json!(8),
            "0",
            json!(0),
            "1001",
            "must be in",
        ),
        (
            "routing-grace",
            json!(60),
            "5s",
            json!(5),
            "2h",
            "must be in",
        ),
        (
            "fast-lane",
            json!(true),
            "false",
            json!(false),
            "maybe",
            "not a boolean",
        ),
        (
            "queue-depth",
            json!(10000),
            "500",
            json!(500),
            "0",
            "[1, 1000000]",
        ),
        (
            "max-held-requests",
            json!(50000),
            "20000",
            json!(20000),
            "1",
            "[2, 10000000]",
        ),
        (
            "max-held-requests-namespace-percentage",
            json!(50),
            "100",
            json!(100),
            "0",
            "[1, 100]",
        ),
        (
            "max-header-count",
            json!(100),
            "50",
            json!(50),
            "0",
            "[1, 10000]",
        ),
        (
            "max-header-bytes",
            json!(65536),
            "8192",
            json!(8192),
            "100",
            "[1024, 1048576]",
        ),
        (
            "header-read-timeout",
            json!(10),
            "250ms",
            json!(0.25),
            "10",
            "missing unit",
        ),
        (
            "request-body-idle-timeout",
            json!(60),
            "5s",
            json!(5),
            "2h",
            "must be in [1ms, 1h]",
        ),
        (
            "keep-alive-timeout",
            json!(75),
            "2m",
            json!(120),
            "0s",
            "must be in",
        ),
        (
            "max-connections",
            json!(50000),
            "1000",
            json!(1000),
            "0",
            "[1, 10000000]",
        ),
        (
            "h2-max-concurrent-streams",
            json!(250),
            "100",
            json!(100),
            "0",
            "[1, 100000]",
        ),
        (
            "drain-delay",
            json!(15),
            "0s",
            json!(0),
            "-1s",
            "must be in",
        ),
        (
            "drain-timeout",
            json!(300),
            "30s",
            json!(30),
            "2h",
            "must be in",
        ),
        ("connect-retries", json!(3), "0", json!(0), "11", "[0, 10]"),
        (
            "connect-timeout",
            json!(1),
            "100ms",
            json!(0.1),
            "0s",
            "must be in",
        ),
        (
            "initial-burst",
            json!(100),
            "10",
            json!(10),
            "0",
            "[1, 1000000]",
        ),
        (
            "retry-after",
            json!(1),
            "5s",
            json!(5),
            "1500ms",
            "whole seconds",
        ),
    ]
}

fn one(k: &str, v: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(k.to_string(), v.to_string())])
}

/// `key` set to `v`, plus what another key must say for `v` to be valid on its own.
fn with_context(k: &str, v: &str) -> BTreeMap<String, String> {
    let mut d = one(k, v);
    match (k, v) {
        // A max-scale-limit demands a max-scale in [1, limit].
        ("max-scale-limit", _) => d.insert("max-scale".into(), "10".into()),
        // Forbidding containerConcurrency 0 demands a non-zero default.
        ("allow-container-concurrency-zero", "false") => {
            d.insert("container-concurrency".into(), "1".into())
        }
        _ => None,
    };
    d
}

fn run_table<T: Default>(
    rows: Vec<Row>,
    all_keys: Vec<&'static str>,
    parse: impl Fn(&BTreeMap<String, String>) -> Result<T, Problems>,
    show: impl Fn(&T) -> Vec<Shown>,
) {
    let covered: BTreeSet<_> = rows.iter().map(|r| r.0).collect();
    let all: BTreeSet<_> = all_keys.into_iter().collect();
    assert_eq!(covered, all, "every key needs a row in the table");
    let defaults = show(&T::default());
    for (key, default, ok, ok_json, bad, reason) in rows {
        let d = defaults.iter().find(|s| s.key == key).unwrap();
        assert_eq!(d.json, default, "{key}: default");
        assert!(d.is_default);
        let parsed = parse(&with_context(key, ok)).unwrap_or_else(|e| panic!("{key}={ok}: {e}"));
        let shown = show(&parsed);
        let s = shown.iter().find(|s| s.key == key).unwrap();
        assert_eq!(s.json, ok_json, "{key}={ok}");
        if bad.is_empty() {
            continue; // pod-autoscaler-class: not validated, as in Knative.
        }
        let err = match parse(&one(key, bad)) {
            Ok(_) => panic!("{key}={bad} should be rejected"),
            Err(e) => e,
        };
        assert_eq!(err.0.len(), 1, "{key}={bad}: {err}");
        let p = &err.0[0];
        assert_eq!((p.key.as_str(), p.value.as_str()), (key, bad));
        assert!(
            p.reason.contains(reason),
            "{key}={bad}: reason {:?} lacks {reason:?}",
            p.reason
        );
    }
}

#[test]
fn autoscaler_every_key() {
    run_table(
        autoscaler_rows(),
        crate::config::autoscaler::KEYS
            .iter()
            .map(|k| k.name)
            .collect(),
        |d| AutoscalerConfig::parse(d).map(|p| p.config),
        AutoscalerConfig::show,
    );
}

#[test]
fn defaults_every_key() {
    run_table(
        defaults_rows(),
        crate::config::defaults::KEYS
            .iter()
            .map(|k| k.name)
            .collect(),
        |d| DefaultsConfig::parse(d).map(|p| p.config),
        DefaultsConfig::show,
    );
}

#[test]
fn activator_every_key() {
    run_table(
        activator_rows(),
        crate::config::activator::KEYS
            .iter()
            .map(|k| k.name)
            .collect(),
        |d| ActivatorConfig::parse(d).map(|p| p.config),
        ActivatorConfig::show,
    );
}

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn keys_of(e: Problems) -> Vec<String> {
    e.0.into_iter().map(|p| p.key).collect()
}

#[test]
fn autoscaler_cross_key_rules() {
    // min-scale above max-scale only matters when max-scale bounds anything.
    assert!(AutoscalerConfig::parse(&data(&[("min-scale", "5"), ("max-scale", "0")])).is_ok());
    let e = AutoscalerConfig::parse(&data(&[("min-scale", "5"), ("max-scale", "3")])).unwrap_err();
    assert_eq!(keys_of(e), ["min-scale"]);
    // initial-scale 0 needs allow-zero-initial-scale.
    let e = AutoscalerConfig::parse(&data(&[("initial-scale", "0")])).unwrap_err();
    assert_eq!(keys_of(e), ["initial-scale"]);
    assert!(
        AutoscalerConfig::parse(&data(&[
            ("initial-scale", "0"),
            ("allow-zero-initial-scale", "true")
        ]))
        .is_ok()
    );
    // max-scale-limit: max-scale must be in [1, limit].
    let e = AutoscalerConfig::parse(&data(&[("max-scale-limit", "10")])).unwrap_err();
    assert_eq!(keys_of(e), ["max-scale"]);
    let e = AutoscalerConfig::parse(&data(&[("max-scale-limit", "10"), ("max-scale", "11")]))
        .unwrap_err();
    assert_eq!(keys_of(e), ["max-scale"]);
    assert!(
        AutoscalerConfig::parse(&data(&[("max-scale-limit", "10"), ("max-scale", "10")])).is_ok()
    );
    // target: percentage x default must reach 0.01.
    let e = AutoscalerConfig::parse(&data(&[
        ("container-concurrency-target-default", "0.01"),
        ("container-concurrency-target-percentage", "50"),
    ]))
    .unwrap_err();
    assert!(e.0[0].reason.contains("must be at least 0.01"), "{e}");
}

#[test]
fn all_bad_keys_are_reported_unknown_keys_warned_example_ignored() {
    let e = AutoscalerConfig::parse(&data(&[
        ("stable-window", "5s"),
        ("max-scale-up-rate", "1"),
        ("panic-threshold-percentage", "50"),
        ("made-up-key", "1"),
        ("_example", "anything: at all"),
    ]))
    .unwrap_err();
    assert_eq!(
        keys_of(e),
        [
            "max-scale-up-rate",
            "panic-threshold-percentage",
            "stable-window"
        ]
    );
    let ok = AutoscalerConfig::parse(&data(&[("made-up-key", "1"), ("_example", "x")])).unwrap();
    assert_eq!(ok.warnings, ["made-up-key: unknown key, ignored"]);
    assert_eq!(ok.config, AutoscalerConfig::default());
}

#[test]
fn stable_window_bounds_and_precision() {
    for ok in ["6s", "1h", "90s", "1m30s"] {
        assert!(
            AutoscalerConfig::parse(&one("stable-window", ok)).is_ok(),
            "{ok}"
        );
    }
    for bad in ["5s", "61m", "6500ms", "-10s", "0"] {
        assert!(
            AutoscalerConfig::parse(&one("stable-window", bad)).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn activator_queue_depth_must_stay_below_global_cap() {
    let e = ActivatorConfig::parse(&data(&[
        ("queue-depth", "100"),
        ("max-held-requests", "100"),
    ]))
    .unwrap_err();
    assert_eq!(keys_of(e), ["queue-depth"]);
}

#[test]
fn defaults_timeouts_are_ordered() {
    let e = DefaultsConfig::parse(&data(&[("revision-timeout-seconds", "700")])).unwrap_err();
    assert_eq!(keys_of(e), ["revision-timeout-seconds"]);
    let e = DefaultsConfig::parse(&data(&[
        ("revision-timeout-seconds", "100"),
        ("revision-response-start-timeout-seconds", "200"),
        ("revision-idle-timeout-seconds", "150"),
    ]))
    .unwrap_err();
    assert_eq!(
        keys_of(e),
        [
            "revision-response-start-timeout-seconds",
            "revision-idle-timeout-seconds"
        ]
    );
    let e = DefaultsConfig::parse(&data(&[("container-concurrency", "2000")])).unwrap_err();
    assert_eq!(keys_of(e), ["container-concurrency"]);
}

/// The shipped manifests hold every key, each at its default.
#[test]
fn shipped_manifests_are_complete_and_default() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let check = |file: &str, names: Vec<&str>, shown: Vec<Shown>| {
        let cm = read_manifest(&root.join(file)).unwrap();
        let given: BTreeSet<_> = cm.data.keys().map(String::as_str).collect();
        assert_eq!(
            given,
            names.into_iter().collect(),
            "{file}: every key, nothing else"
        );
        for s in shown {
            assert!(s.is_default, "{file}: {} is not at its default", s.key);
        }
    };
    let a = read_manifest(&root.join("config-autoscaler.yaml")).unwrap();
    check(
        "config-autoscaler.yaml",
        crate::config::autoscaler::KEYS
            .iter()
            .map(|k| k.name)
            .collect(),
        AutoscalerConfig::parse(&a.data).unwrap().config.show(),
    );
    let d = read_manifest(&root.join("config-defaults.yaml")).unwrap();
    check(
        "config-defaults.yaml",
        crate::config::defaults::KEYS
            .iter()
            .map(|k| k.name)
            .chain([crate::config::defaults::NAMESPACE_DEFAULTS])
            .collect(),
        DefaultsConfig::parse(&d.data).unwrap().config.show(),
    );
    let x = read_manifest(&root.join("config-activator.yaml")).unwrap();
    check(
        "config-activator.yaml",
        crate::config::activator::KEYS
            .iter()
            .map(|k| k.name)
            .collect(),
        ActivatorConfig::parse(&x.data).unwrap().config.show(),
    );
}
