//! `config-defaults`: Knative's revision defaults (docs/architecture.md, "Knative's rules"),
//! and thaw's per-namespace overrides of them.
//!
//! # Per-namespace defaults
//! Knative's flat keys are the cluster's defaults. One more key, [`NAMESPACE_DEFAULTS`], holds a
//! YAML map `namespace → {key: value}` with the same key names; in a namespace with a section,
//! the section's values win and the other keys keep the cluster's values (the seeds'
//! `clusterDefault` + `namespaceDefaults` pattern, in one ConfigMap):
//!
//! ```yaml
//! data:
//!   container-concurrency: "0"
//!   namespace-defaults: |
//!     team-a:
//!       container-concurrency: "10"
//!       revision-timeout-seconds: "60"
//! ```
//!
//! Each section is parsed with the same key parsers and cross-key rules, applied to the
//! cluster's values with the section's over them; every problem is named with its full path
//! (`namespace-defaults.team-a.container-concurrency`). A section with any problem rejects the
//! whole ConfigMap, so the last good one keeps serving, as for any other key.
//! [`DefaultsConfig::for_namespace`] gives the defaults in force in one namespace.

use std::collections::BTreeMap;
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
    /// `namespace-defaults`: per namespace, the defaults in force there. Empty in a namespace's
    /// own config (sections do not nest).
    pub namespaces: BTreeMap<String, NamespaceDefaults>,
}

/// One section of `namespace-defaults`.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceDefaults {
    /// The defaults in force in the namespace: the cluster's with the section's keys over them.
    pub config: DefaultsConfig,
    /// The keys the section sets, as written (what `thaw config check` shows).
    pub given: BTreeMap<String, String>,
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
            namespaces: BTreeMap::new(),
        }
    }
}

use serde_json::Value;

use super::keys::{self, ConfigMap, Key, Parsed, Shown};
use super::parse::{Problem, Problems, parse_bool, parse_i64};

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

    /// The flat keys as every ConfigMap's, then each `namespace-defaults` section over them.
    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        parse_with_namespaces(data)
    }

    fn warnings(data: &BTreeMap<String, String>) -> Vec<String> {
        let mut flat = data.clone();
        flat.remove(NAMESPACE_DEFAULTS);
        keys::warnings(KEYS, INERT, &flat)
    }

    /// Every flat key, then `namespace-defaults` (each section's keys as set).
    fn show(&self) -> Vec<Shown> {
        let mut out = keys::show_all(KEYS, self);
        out.push(show_namespaces(self));
        out
    }
}

/// The key of the per-namespace sections.
pub const NAMESPACE_DEFAULTS: &str = "namespace-defaults";

fn parse_with_namespaces(
    data: &BTreeMap<String, String>,
) -> Result<Parsed<DefaultsConfig>, Problems> {
    let mut flat = data.clone();
    let raw = flat.remove(NAMESPACE_DEFAULTS);
    let cluster = keys::parse_data(KEYS, INERT, &flat, validate);
    let cluster_problems: &[Problem] = match &cluster {
        Ok(_) => &[],
        Err(p) => &p.0,
    };
    let mut problems = Vec::new();
    let sections = match raw.as_deref() {
        Some(text) => parse_sections(text, &mut problems),
        None => BTreeMap::new(),
    };
    let mut namespaces = BTreeMap::new();
    for (ns, given) in sections {
        let at = |key: &str| format!("{NAMESPACE_DEFAULTS}.{ns}.{key}");
        let mut merged = flat.clone();
        let mut section_ok = true;
        for (k, v) in &given {
            if KEYS.iter().any(|key| key.name == k) {
                merged.insert(k.clone(), v.clone());
            } else {
                section_ok = false;
                problems.push(Problem::new(
                    at(k),
                    v,
                    "not a config-defaults key thaw reads per namespace",
                ));
            }
        }
        match keys::parse_data(KEYS, INERT, &merged, validate) {
            Ok(p) if section_ok => {
                namespaces.insert(
                    ns,
                    NamespaceDefaults {
                        config: p.config,
                        given,
                    },
                );
            }
            Ok(_) => {}
            Err(ps) => {
                for p in ps.0 {
                    // The cluster's own problems are reported once, under their own keys.
                    if !given.contains_key(&p.key) && cluster_problems.contains(&p) {
                        continue;
                    }
                    problems.push(Problem {
                        key: at(&p.key),
                        ..p
                    });
                }
            }
        }
    }
    match cluster {
        Ok(mut parsed) if problems.is_empty() => {
            parsed.config.namespaces = namespaces;
            if raw.is_some() {
                parsed.given.insert(NAMESPACE_DEFAULTS.to_string());
            }
            Ok(parsed)
        }
        Ok(_) => Err(Problems(problems)),
        Err(mut ps) => {
            ps.0.extend(problems);
            Err(ps)
        }
    }
}

/// `namespace-defaults`' YAML: a map of namespace name to a map of key to scalar (a number or
/// boolean written without quotes reads as its text, as in `data:`). An empty value or a
/// section with no keys is allowed.
fn parse_sections(
    text: &str,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let shape = "must be a YAML map of namespace to {key: value}";
    if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        return BTreeMap::new();
    }
    let top: Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            problems.push(Problem::new(
                NAMESPACE_DEFAULTS,
                text.trim(),
                format!("invalid YAML ({first}); {shape}"),
            ));
            return BTreeMap::new();
        }
    };
    let top = match top {
        Value::Null => return BTreeMap::new(),
        Value::Object(m) => m,
        _ => {
            problems.push(Problem::new(NAMESPACE_DEFAULTS, text.trim(), shape));
            return BTreeMap::new();
        }
    };
    let mut out = BTreeMap::new();
    for (ns, section) in top {
        let at = format!("{NAMESPACE_DEFAULTS}.{ns}");
        if !crate::knative::validate::is_dns1123_label(&ns) {
            problems.push(Problem::new(
                &at,
                "",
                "not a namespace name (a DNS-1123 label: lower-case letters, digits and '-', \
                 at most 63 characters)",
            ));
            continue;
        }
        let map = match section {
            Value::Null => serde_json::Map::new(),
            Value::Object(m) => m,
            other => {
                problems.push(Problem::new(
                    &at,
                    other.to_string(),
                    "must be a map of key to value",
                ));
                continue;
            }
        };
        let mut keys = BTreeMap::new();
        for (k, v) in map {
            let text = match v {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    problems.push(Problem::new(
                        format!("{at}.{k}"),
                        other.to_string(),
                        "must be a single value (a string, number or boolean)",
                    ));
                    continue;
                }
            };
            keys.insert(k, text);
        }
        out.insert(ns, keys);
    }
    out
}

/// The `namespace-defaults` line of `thaw config check`: each namespace with the keys its
/// section sets (text `team-a{container-concurrency=10}`; JSON in each key's units).
fn show_namespaces(c: &DefaultsConfig) -> Shown {
    let mut text = Vec::new();
    let mut json = serde_json::Map::new();
    for (ns, section) in &c.namespaces {
        let mut shown = Vec::new();
        let mut obj = serde_json::Map::new();
        for key in KEYS.iter().filter(|k| section.given.contains_key(k.name)) {
            let (t, j) = (key.show)(&section.config);
            shown.push(format!("{}={t}", key.name));
            obj.insert(key.name.to_string(), j);
        }
        text.push(format!("{ns}{{{}}}", shown.join(", ")));
        json.insert(ns.clone(), Value::Object(obj));
    }
    Shown {
        key: NAMESPACE_DEFAULTS,
        text: if text.is_empty() {
            "none".to_string()
        } else {
            text.join("; ")
        },
        json: Value::Object(json),
        unit: "per-namespace overrides",
        is_default: c.namespaces.is_empty(),
    }
}

impl DefaultsConfig {
    /// The defaults in force in namespace `ns`: its `namespace-defaults` section's config, or
    /// the cluster's (`self`) when it has none. A borrow, no copy.
    pub fn for_namespace(&self, ns: &str) -> &DefaultsConfig {
        self.namespaces.get(ns).map_or(self, |n| &n.config)
    }

    /// The response-start timeout in force (the revision timeout when unset).
    pub fn response_start_timeout(&self) -> Duration {
        self.revision_response_start_timeout
            .unwrap_or(self.revision_timeout)
    }
}
