//! `config-defaults`' `namespace-defaults`: sections over the cluster's keys, every problem
//! named with its full path, an invalid section rejecting the whole ConfigMap.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::defaults::NAMESPACE_DEFAULTS;
use crate::config::keys::ConfigMap;
use crate::config::load::{check_named, parse_manifest};
use crate::config::{DefaultsConfig, Problems};

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse(pairs: &[(&str, &str)]) -> Result<DefaultsConfig, Problems> {
    DefaultsConfig::parse(&data(pairs)).map(|p| p.config)
}

const TWO_TEAMS: &str = "team-a:\n  container-concurrency: \"10\"\n  revision-timeout-seconds: 60\nteam-b:\n  container-concurrency-max-limit: \"50\"\n  allow-container-concurrency-zero: false\n  container-concurrency: 5\n";

#[test]
fn a_section_wins_in_its_namespace_and_the_cluster_keys_elsewhere() {
    let c = parse(&[
        ("container-concurrency", "3"),
        ("max-revision-timeout-seconds", "900"),
        (NAMESPACE_DEFAULTS, TWO_TEAMS),
    ])
    .unwrap();
    // Cluster defaults: the flat keys.
    assert_eq!(c.container_concurrency, 3);
    assert_eq!(c.revision_timeout, Duration::from_secs(300));
    let other = c.for_namespace("default");
    assert!(
        std::ptr::eq(other, &c),
        "no section: the cluster's config itself"
    );
    // team-a: its two keys, the cluster's for the rest (max timeout 900 from the flat key).
    let a = c.for_namespace("team-a");
    assert_eq!(a.container_concurrency, 10);
    assert_eq!(a.revision_timeout, Duration::from_secs(60));
    assert_eq!(a.max_revision_timeout, Duration::from_secs(900));
    assert_eq!(a.container_concurrency_max_limit, 1000);
    assert!(a.namespaces.is_empty(), "sections do not nest");
    let b = c.for_namespace("team-b");
    assert_eq!(b.container_concurrency, 5);
    assert_eq!(b.container_concurrency_max_limit, 50);
    assert!(!b.allow_container_concurrency_zero);
    assert_eq!(b.revision_timeout, Duration::from_secs(300));
    // A section's own config answers for itself.
    assert!(std::ptr::eq(a.for_namespace("team-b"), a));
}

#[test]
fn every_problem_is_named_with_its_full_path_and_rejects_the_configmap() {
    let sections = "team-a:\n  container-concurrency: \"2000\"\n  revision-timeout-seconds: abc\n  no-such-key: \"1\"\nteam-b:\n  container-concurrency-max-limit: \"0\"\n";
    let err = parse(&[(NAMESPACE_DEFAULTS, sections)]).unwrap_err();
    let lines: Vec<String> = err.0.iter().map(ToString::to_string).collect();
    let has = |frag: &str| lines.iter().any(|l| l.contains(frag));
    assert!(
        has("namespace-defaults.team-a.revision-timeout-seconds: abc: not an integer"),
        "{lines:#?}"
    );
    assert!(
        has("namespace-defaults.team-a.no-such-key: 1: not a config-defaults key"),
        "{lines:#?}"
    );
    assert!(
        has(
            "namespace-defaults.team-b.container-concurrency-max-limit: 0: must be in [1, 2147483647]"
        ),
        "{lines:#?}"
    );
    // A cross-key rule inside a section (2000 > the cluster's max limit 1000).
    let err = parse(&[(
        NAMESPACE_DEFAULTS,
        "team-a:\n  container-concurrency: \"2000\"\n",
    )])
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "namespace-defaults.team-a.container-concurrency: 2000: must be in [0, \
         container-concurrency-max-limit (1000)]"
    );
    // A section's value that breaks a rule against a cluster key names the namespace.
    let err = parse(&[(
        NAMESPACE_DEFAULTS,
        "team-a:\n  max-revision-timeout-seconds: \"100\"\n",
    )])
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "namespace-defaults.team-a.revision-timeout-seconds: 300: must not exceed \
         max-revision-timeout-seconds (100)"
    );
}

#[test]
fn a_cluster_problem_is_reported_once_not_per_section() {
    let err = parse(&[
        ("container-concurrency", "-1"),
        (
            NAMESPACE_DEFAULTS,
            "team-a:\n  revision-timeout-seconds: \"60\"\n",
        ),
    ])
    .unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert_eq!(err.0[0].key, "container-concurrency");
    // A section that sets the same bad key is its own problem.
    let err = parse(&[
        ("container-concurrency", "-1"),
        (
            NAMESPACE_DEFAULTS,
            "team-a:\n  container-concurrency: \"-2\"\n",
        ),
    ])
    .unwrap_err();
    let keys: Vec<&str> = err.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "container-concurrency",
            "namespace-defaults.team-a.container-concurrency"
        ]
    );
}

#[test]
fn bad_shapes_and_namespace_names_are_problems() {
    for (text, frag) in [
        ("[a, b]", "namespace-defaults: [a, b]: must be a YAML map"),
        (
            "team-a: [1]",
            "namespace-defaults.team-a: [1]: must be a map",
        ),
        (
            "team-a:\n  container-concurrency: [1]\n",
            "namespace-defaults.team-a.container-concurrency: [1]: must be a single value",
        ),
        (
            "Team_A:\n  container-concurrency: \"1\"\n",
            "namespace-defaults.Team_A: not a namespace name",
        ),
        ("team-a: {\n", "namespace-defaults: team-a: {: invalid YAML"),
    ] {
        let err = parse(&[(NAMESPACE_DEFAULTS, text)]).unwrap_err();
        assert!(err.to_string().contains(frag), "{text:?}: {err}");
    }
    // Empty, comments only, or an empty section: accepted, no override.
    for text in [
        "",
        "  ",
        "# team-a:\n#   container-concurrency: \"1\"\n",
        "team-a:\n",
    ] {
        let c = parse(&[(NAMESPACE_DEFAULTS, text)]).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(
            c.for_namespace("team-a").container_concurrency,
            0,
            "{text:?}"
        );
    }
}

#[test]
fn the_key_is_no_unknown_key_warning_and_config_check_shows_the_sections() {
    let text = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-defaults\ndata:\n  \
         container-concurrency: \"3\"\n  namespace-defaults: |\n{}",
        TWO_TEAMS
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    );
    let cm = parse_manifest(&text, "f").unwrap();
    let (shown, warnings) = check_named(&cm);
    assert!(warnings.is_empty(), "{warnings:?}");
    let shown = shown.unwrap();
    let ns = shown.iter().find(|s| s.key == NAMESPACE_DEFAULTS).unwrap();
    assert!(!ns.is_default);
    assert_eq!(
        ns.text,
        "team-a{revision-timeout-seconds=60, container-concurrency=10}; \
         team-b{container-concurrency=5, container-concurrency-max-limit=50, \
         allow-container-concurrency-zero=false}"
    );
    assert_eq!(
        ns.json,
        serde_json::json!({
            "team-a": {"container-concurrency": 10, "revision-timeout-seconds": 60},
            "team-b": {"container-concurrency": 5, "container-concurrency-max-limit": 50,
                       "allow-container-concurrency-zero": false}
        })
    );
    // Without sections the line is there, at its default.
    let plain = DefaultsConfig::default().show();
    let ns = plain.iter().find(|s| s.key == NAMESPACE_DEFAULTS).unwrap();
    assert!(ns.is_default);
    assert_eq!(ns.text, "none");
}

#[test]
fn the_revision_resolver_uses_the_namespace_section() {
    use crate::config::ConfigSet;
    use crate::config::revision::{RevisionInput, resolve_revision};
    use std::sync::Arc;
    let defaults = parse(&[(NAMESPACE_DEFAULTS, TWO_TEAMS)]).unwrap();
    let configs = ConfigSet {
        defaults: Arc::new(defaults),
        ..ConfigSet::default()
    };
    let input = |ns: &str| RevisionInput {
        namespace: ns.into(),
        name: "hello-00001".into(),
        ..RevisionInput::default()
    };
    let a = resolve_revision(&input("team-a"), &configs).unwrap();
    assert_eq!(a.container_concurrency, 10);
    assert_eq!(a.timeouts.total, Duration::from_secs(60));
    let other = resolve_revision(&input("default"), &configs).unwrap();
    assert_eq!(other.container_concurrency, 0);
    assert_eq!(other.timeouts.total, Duration::from_secs(300));
    // team-b's max limit (50) applies to what a revision there asks for.
    let mut big = input("team-b");
    big.container_concurrency = Some(60);
    let err = resolve_revision(&big, &configs).unwrap_err();
    assert!(
        err.to_string()
            .contains("container-concurrency-max-limit (50)"),
        "{err}"
    );
}
