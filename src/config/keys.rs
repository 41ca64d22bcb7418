//! The key-table machinery shared by every ConfigMap: one [`Key`] per Knative key, beside its
//! parser, its unit and what it does; [`parse_data`] applies a table to a ConfigMap's `data:` map
//! and reports every problem, not only the first.
//!
//! # One rule for every key
//!
//! The same everywhere a ConfigMap is read: `thaw config check`, the live reload
//! ([`super::live`], [`super::reload`]), `thaw local`'s files and `thaw migrate config`.
//! - A key thaw implements with a value it cannot use is **refused**: a [`Problem`] naming the
//!   key, the value and the reason. Live, the whole update is rejected and the last good
//!   configuration stays; `config check` and `migrate config` exit 1.
//! - A key with **no effect in thaw** is **accepted and named**, never refused: an unknown key,
//!   a Knative key thaw does not implement (each ConfigMap's `INERT`), or a value Knative
//!   itself would ignore and keep the key's default for (`config-features`' unknown flag
//!   values). Each such key is one warning, written `{key}: {why}` (so [`warning_key`] finds
//!   the key): a WARN line live, a `warning:` line in `config check` (exit 1 only with
//!   `--strict`), and the `thaw_config_ineffective_keys{config_map}` gauge on `/metrics` (the
//!   roles' and `thaw local`'s admin port).
//! - `_example` is dropped silently, as Knative does.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::parse::{Problem, Problems};

/// One ConfigMap key: its name, unit and help text, how to parse it into `T`, and how to show
/// the value `T` holds (text for humans, JSON in Knative's units for machines).
pub struct Key<T> {
    pub name: &'static str,
    pub unit: &'static str,
    pub help: &'static str,
    /// Parses and range-checks one value, storing it into `T`. The error is the reason only;
    /// the caller adds the key and value.
    pub parse: fn(&mut T, &str) -> Result<(), String>,
    /// The effective value as (text as Knative would write it, JSON value).
    pub show: fn(&T) -> (String, Value),
}

/// A ConfigMap thaw reads: its name, its key table and its rules across keys. Parsing,
/// warnings and `thaw config check`'s view come with it.
pub trait ConfigMap: Default + Sized + 'static {
    /// The ConfigMap's `metadata.name`, by which files and live ConfigMaps are recognised.
    const NAME: &'static str;
    /// Knative keys of this ConfigMap that thaw accepts but does not use (warned about).
    const INERT: &'static [&'static str] = &[];

    /// Every key, in the order `thaw config check` prints them.
    fn keys() -> &'static [Key<Self>];

    /// Rules across keys, run after every key parsed; each problem names one key.
    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem>;

    /// Parses a `data:` map. Every bad key is reported; unknown keys and `_example` are not
    /// errors.
    fn parse(data: &BTreeMap<String, String>) -> Result<Parsed<Self>, Problems> {
        parse_data(Self::keys(), Self::INERT, data, Self::validate)
    }

    /// The keys of a `data:` map, valid or not, that have no effect in thaw: one warning per
    /// key, `{key}: {why}` (the module's rule).
    fn warnings(data: &BTreeMap<String, String>) -> Vec<String> {
        warnings(Self::keys(), Self::INERT, data)
    }

    /// Every key with its effective value and whether it is the default.
    fn show(&self) -> Vec<Shown> {
        show_all(Self::keys(), self)
    }
}

/// A parsed ConfigMap: the config, the keys that were given, and warnings (unknown keys).
#[derive(Debug, Clone)]
pub struct Parsed<T> {
    pub config: T,
    /// Keys present in the input (after `_example` and unknown keys are dropped).
    pub given: BTreeSet<String>,
    /// The keys that have no effect in thaw, one warning each, `{key}: {why}` (the module's
    /// rule).
    pub warnings: Vec<String>,
}

/// One line of `thaw config check`: a key, its effective value, and whether that is the default.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub key: &'static str,
    pub text: String,
    pub json: Value,
    pub unit: &'static str,
    pub is_default: bool,
}

/// Applies `keys` to `data`: every key is parsed (all problems collected), then `validate`
/// checks rules across keys. `_example` is ignored as Knative does; keys in `inert` are known
/// Knative keys that thaw does not use (warned about); anything else is an unknown key (warned
/// about, not rejected).
pub fn parse_data<T: Default>(
    keys: &[Key<T>],
    inert: &[&str],
    data: &BTreeMap<String, String>,
    validate: fn(&T, &BTreeMap<String, String>) -> Vec<Problem>,
) -> Result<Parsed<T>, Problems> {
    let mut config = T::default();
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut given = BTreeSet::new();
    for (k, v) in data {
        if k == "_example" {
            continue;
        }
        match keys.iter().find(|key| key.name == k) {
            Some(key) => {
                given.insert(k.clone());
                if let Err(reason) = (key.parse)(&mut config, v.trim()) {
                    problems.push(Problem::new(k, v, reason));
                }
            }
            None if inert.contains(&k.as_str()) => warnings.push(format!(
                "{k}: known Knative key with no effect in thaw, ignored"
            )),
            None => warnings.push(format!("{k}: unknown key, ignored")),
        }
    }
    if problems.is_empty() {
        problems.extend(validate(&config, data));
    } else {
        // Cross-key rules only make sense between values that parsed; still run them so that a
        // file's independent problems are all reported, but skip rules naming a bad key.
        let bad: BTreeSet<String> = problems.iter().map(|p| p.key.clone()).collect();
        problems.extend(
            validate(&config, data)
                .into_iter()
                .filter(|p| !bad.contains(&p.key)),
        );
    }
    if problems.is_empty() {
        Ok(Parsed {
            config,
            given,
            warnings,
        })
    } else {
        Err(Problems(problems))
    }
}

/// Warnings for `data`: unknown keys, and known Knative keys thaw does not use. `_example` is
/// ignored silently, as Knative does.
pub fn warnings<T>(
    keys: &[Key<T>],
    inert: &[&str],
    data: &BTreeMap<String, String>,
) -> Vec<String> {
    data.keys()
        .filter(|k| *k != "_example" && !keys.iter().any(|key| key.name == k.as_str()))
        .map(|k| {
            if inert.contains(&k.as_str()) {
                format!("{k}: known Knative key with no effect in thaw, ignored")
            } else {
                format!("{k}: unknown key, ignored")
            }
        })
        .collect()
}

/// The key a warning names: every ConfigMap warning is written `{key}: {why}`, and a
/// ConfigMap key never holds `:` (Kubernetes allows `[-._a-zA-Z0-9]` only).
pub fn warning_key(warning: &str) -> &str {
    warning.split_once(':').map_or(warning, |(k, _)| k).trim()
}

/// Every key of a table with its effective value and whether it equals the default.
pub fn show_all<T: Default>(keys: &[Key<T>], config: &T) -> Vec<Shown> {
    let defaults = T::default();
    keys.iter()
        .map(|k| {
            let (text, json) = (k.show)(config);
            let (_, default_json) = (k.show)(&defaults);
            Shown {
                key: k.name,
                is_default: json == default_json,
                text,
                json,
                unit: k.unit,
            }
        })
        .collect()
}

/// The value as written in the input, or the effective value when the key was not given (for
/// naming it in a cross-key problem).
pub fn written<T>(
    keys: &[Key<T>],
    data: &BTreeMap<String, String>,
    config: &T,
    key: &str,
) -> String {
    data.get(key).cloned().unwrap_or_else(|| {
        keys.iter()
            .find(|k| k.name == key)
            .map(|k| (k.show)(config).0)
            .unwrap_or_default()
    })
}

/// JSON for a float the way Knative writes it: integral values as integers.
pub fn num(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::from(v as i64)
    } else {
        Value::from(v)
    }
}

/// Text for a float: integral values without a decimal point.
pub fn num_text(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// A duration key's value: Go-style text (`60s`) and seconds in JSON.
pub fn show_duration(d: std::time::Duration) -> (String, Value) {
    (
        super::parse::format_duration(d),
        super::parse::duration_json(d),
    )
}

/// A float key's value (integral values without a decimal point).
pub fn show_f64(v: f64) -> (String, Value) {
    (num_text(v), num(v))
}

/// An integer key's value.
pub fn show_u32(v: u32) -> (String, Value) {
    (v.to_string(), Value::from(v))
}

/// A boolean key's value.
pub fn show_bool(v: bool) -> (String, Value) {
    (v.to_string(), Value::from(v))
}
