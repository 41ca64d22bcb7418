//! `config-gc`: Knative's revision garbage collection (its "v2" collector), keys, defaults,
//! validation and the collection rule itself as a pure function ([`collectable`]).
//!
//! The same parser and rule serve `thaw local` (which applies them to the revisions local.yaml
//! edits create) and, later, the Kubernetes controller.
//!
//! Knative's rule, per Configuration (that is, per Service here):
//! 1. Nothing is collected while the configuration has at most `min-non-active-revisions`
//!    revisions, or when all three limits are `disabled`.
//! 2. Active revisions are never collected: the routed ones, the latest created and the latest
//!    ready.
//! 3. The others are sorted by last activity (when they stopped being routed, else when they
//!    were created), oldest first. Walking that list, a stale revision is collected as long as
//!    more than `min-non-active-revisions` non-active ones remain, so the ones kept are the
//!    most recently active. Stale = older than `retain-since-create-time` AND inactive for
//!    longer than `retain-since-last-active-time` (a `disabled` rule does not hold a revision
//!    back; both disabled = never stale).
//! 4. Of the non-stale ones left, all but the `max-non-active-revisions` most recently active
//!    are collected, oldest first.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::keys::{self, ConfigMap, Key};
use super::parse::{Problem, format_duration, parse_go_duration_nanos};

/// Name of the ConfigMap.
pub const NAME: &str = "config-gc";

/// Knative's revision GC settings. `None` is Knative's `disabled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcConfig {
    /// `retain-since-create-time`: a revision younger than this is kept (48h).
    pub retain_since_create_time: Option<Duration>,
    /// `retain-since-last-active-time`: a revision routed more recently than this is kept (15h).
    pub retain_since_last_active_time: Option<Duration>,
    /// `min-non-active-revisions`: non-active revisions always kept (20).
    pub min_non_active_revisions: u32,
    /// `max-non-active-revisions`: non-active revisions kept at most, stale or not (1000).
    pub max_non_active_revisions: Option<u32>,
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            retain_since_create_time: Some(Duration::from_secs(48 * 3600)),
            retain_since_last_active_time: Some(Duration::from_secs(15 * 3600)),
            min_non_active_revisions: 20,
            max_non_active_revisions: Some(1000),
        }
    }
}

const DISABLED: &str = "disabled";

/// Knative's `parseDisabledOrDuration`: `disabled` (any case) or a non-negative Go duration.
fn disabled_or_duration(s: &str) -> Result<Option<Duration>, String> {
    if s.eq_ignore_ascii_case(DISABLED) {
        return Ok(None);
    }
    let n = parse_go_duration_nanos(s).map_err(|e| format!("{e}, or \"disabled\""))?;
    if n < 0 {
        return Err("must not be negative".into());
    }
    Ok(Some(Duration::from_nanos(n as u64)))
}

/// Knative's `parseDisabledOrInt64`: `disabled` (any case) or an unsigned 32-bit integer.
fn disabled_or_count(s: &str) -> Result<Option<u32>, String> {
    if s.eq_ignore_ascii_case(DISABLED) {
        return Ok(None);
    }
    count(s).map(Some)
}

fn count(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(v) if v < 0 => Err("must not be negative".into()),
        Ok(v) => u32::try_from(v).map_err(|_| "out of range for a 32-bit count".into()),
        Err(_) => Err("not a whole number".into()),
    }
}

fn show_disabled_duration(d: Option<Duration>) -> (String, Value) {
    match d {
        None => (DISABLED.into(), Value::from(DISABLED)),
        Some(d) => (format_duration(d), super::parse::duration_json(d)),
    }
}

/// Every key of `config-gc`, in Knative's order.
pub static KEYS: &[Key<GcConfig>] = &[
    Key {
        name: "retain-since-create-time",
        unit: "duration or disabled",
        help: "A revision created more recently than this is never collected.",
        parse: |c, s| {
            c.retain_since_create_time = disabled_or_duration(s)?;
            Ok(())
        },
        show: |c| show_disabled_duration(c.retain_since_create_time),
    },
    Key {
        name: "retain-since-last-active-time",
        unit: "duration or disabled",
        help: "A revision routed more recently than this is never collected.",
        parse: |c, s| {
            c.retain_since_last_active_time = disabled_or_duration(s)?;
            Ok(())
        },
        show: |c| show_disabled_duration(c.retain_since_last_active_time),
    },
    Key {
        name: "min-non-active-revisions",
        unit: "revisions",
        help: "Non-active revisions always kept per configuration.",
        parse: |c, s| {
            c.min_non_active_revisions = count(s)?;
            Ok(())
        },
        show: |c| keys::show_u32(c.min_non_active_revisions),
    },
    Key {
        name: "max-non-active-revisions",
        unit: "revisions or disabled",
        help: "Non-active revisions kept at most per configuration, stale or not.",
        parse: |c, s| {
            c.max_non_active_revisions = disabled_or_count(s)?;
            Ok(())
        },
        show: |c| match c.max_non_active_revisions {
            None => (DISABLED.into(), Value::from(DISABLED)),
            Some(v) => keys::show_u32(v),
        },
    },
];

fn validate(c: &GcConfig, data: &BTreeMap<String, String>) -> Vec<Problem> {
    let mut p = Vec::new();
    if let Some(max) = c.max_non_active_revisions
        && c.min_non_active_revisions > max
    {
        p.push(Problem::new(
            "min-non-active-revisions",
            keys::written(KEYS, data, c, "min-non-active-revisions"),
            format!("must not exceed max-non-active-revisions ({max})"),
        ));
    }
    p
}

impl ConfigMap for GcConfig {
    const NAME: &'static str = NAME;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        validate(self, data)
    }
}

/// One revision of a configuration, as the collector sees it. Ages are durations up to now,
/// so the rule needs no clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcCandidate<K> {
    pub key: K,
    /// Routed, the latest created or the latest ready: never collected.
    pub active: bool,
    /// Time since the revision was created.
    pub age: Duration,
    /// Time since it was last routed (since creation if it never was).
    pub inactive_for: Duration,
}

impl GcConfig {
    /// Whether a non-active revision is stale: past both retention rules that are enabled.
    fn is_stale(&self, age: Duration, inactive_for: Duration) -> bool {
        if self.retain_since_create_time.is_none() && self.retain_since_last_active_time.is_none() {
            return false;
        }
        if self.retain_since_create_time.is_some_and(|r| age < r) {
            return false;
        }
        self.retain_since_last_active_time
            .is_none_or(|r| inactive_for >= r)
    }
}

/// The revisions of one configuration that Knative's collector would delete now, in the order
/// it would delete them. Never an active one. See the module docs for the rule.
pub fn collectable<K: Clone>(config: &GcConfig, revisions: &[GcCandidate<K>]) -> Vec<K> {
    let min = config.min_non_active_revisions as usize;
    let all_disabled = config.max_non_active_revisions.is_none()
        && config.retain_since_create_time.is_none()
        && config.retain_since_last_active_time.is_none();
    if revisions.len() <= min || all_disabled {
        return Vec::new();
    }
    let mut non_active: Vec<&GcCandidate<K>> = revisions.iter().filter(|r| !r.active).collect();
    // Longest inactive first, as Knative's collector walks them (a stable sort keeps the given
    // order among equals): the stale ones go oldest first, and what `min` keeps is the most
    // recently active.
    non_active.sort_by_key(|r| std::cmp::Reverse(r.inactive_for));
    let mut out = Vec::new();
    let mut remaining = non_active.len();
    let mut fresh = Vec::new();
    for r in non_active {
        if remaining <= min {
            return out;
        }
        if config.is_stale(r.age, r.inactive_for) {
            remaining -= 1;
            out.push(r.key.clone());
        } else {
            fresh.push(r);
        }
    }
    if let Some(max) = config.max_non_active_revisions {
        let over = fresh.len().saturating_sub(max as usize);
        out.extend(fresh.iter().take(over).map(|r| r.key.clone()));
    }
    out
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
    fn knative_defaults_and_disabled() {
        let c = GcConfig::parse(&data(&[])).unwrap().config;
        assert_eq!(c, GcConfig::default());
        let c = GcConfig::parse(&data(&[
            ("retain-since-create-time", "Disabled"),
            ("retain-since-last-active-time", "1h30m"),
            ("min-non-active-revisions", "0"),
            ("max-non-active-revisions", "DISABLED"),
        ]))
        .unwrap()
        .config;
        assert_eq!(c.retain_since_create_time, None);
        assert_eq!(
            c.retain_since_last_active_time,
            Some(Duration::from_secs(5400))
        );
        assert_eq!(c.max_non_active_revisions, None);
        let shown = c.show();
        assert_eq!(shown[0].text, "disabled");
        assert_eq!(shown[1].json, Value::from(5400));
    }

    #[test]
    fn every_bad_value_is_named() {
        let e = GcConfig::parse(&data(&[
            ("retain-since-create-time", "48"),
            ("retain-since-last-active-time", "-1h"),
            ("min-non-active-revisions", "-1"),
            ("max-non-active-revisions", "lots"),
        ]))
        .unwrap_err();
        let keys: Vec<_> = e.0.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "max-non-active-revisions",
                "min-non-active-revisions",
                "retain-since-create-time",
                "retain-since-last-active-time",
            ]
        );
        let e = GcConfig::parse(&data(&[
            ("min-non-active-revisions", "5"),
            ("max-non-active-revisions", "2"),
        ]))
        .unwrap_err();
        assert_eq!(e.0[0].key, "min-non-active-revisions");
        assert!(e.0[0].reason.contains("max-non-active-revisions (2)"));
    }

    fn rev(key: u32, active: bool, age_h: u64, inactive_h: u64) -> GcCandidate<u32> {
        GcCandidate {
            key,
            active,
            age: Duration::from_secs(age_h * 3600),
            inactive_for: Duration::from_secs(inactive_h * 3600),
        }
    }

    #[test]
    fn stale_revisions_go_past_the_minimum_and_active_ones_never() {
        let c = GcConfig {
            min_non_active_revisions: 1,
            ..GcConfig::default()
        };
        // 1 and 2 are stale (created > 48h ago, idle > 15h), 3 is recent, 4 is routed.
        let revs = [
            rev(1, false, 100, 90),
            rev(2, false, 60, 50),
            rev(3, false, 10, 5),
            rev(4, true, 200, 200),
        ];
        assert_eq!(collectable(&c, &revs), vec![1, 2]);
        // With a minimum of 2 non-active kept: only the longest inactive stale one goes.
        let c2 = GcConfig {
            min_non_active_revisions: 2,
            ..c.clone()
        };
        assert_eq!(collectable(&c2, &revs), vec![1]);
        // At or under the minimum in all: nothing.
        let c4 = GcConfig {
            min_non_active_revisions: 4,
            ..c
        };
        assert!(collectable(&c4, &revs).is_empty());
    }

    #[test]
    fn max_caps_the_fresh_ones_and_all_disabled_collects_nothing() {
        let c = GcConfig {
            retain_since_create_time: None,
            retain_since_last_active_time: None,
            min_non_active_revisions: 0,
            max_non_active_revisions: Some(1),
        };
        let revs = [
            rev(1, false, 3, 3),
            rev(2, false, 2, 1),
            rev(3, true, 1, 0),
            rev(4, false, 2, 2),
        ];
        // Most recently active non-active revision (2) is kept; 1 then 4 go, oldest first.
        assert_eq!(collectable(&c, &revs), vec![1, 4]);
        let off = GcConfig {
            max_non_active_revisions: None,
            ..c
        };
        assert!(collectable(&off, &revs).is_empty());
    }

    /// Knative's `TestCollectMin` ("delete oldest, keep one recent, one active") and its
    /// `min` case with every non-active revision stale: `min` keeps the most recently active
    /// ones, never the oldest.
    #[test]
    fn the_minimum_keeps_the_most_recently_active_as_knative() {
        let c = GcConfig {
            retain_since_create_time: Some(Duration::from_secs(300)),
            retain_since_last_active_time: Some(Duration::from_secs(300)),
            min_non_active_revisions: 1,
            max_non_active_revisions: None,
        };
        let min = |m: u64| Duration::from_secs(m * 60);
        let r = |key, active, inactive: u64| GcCandidate {
            key,
            active,
            age: min(20),
            inactive_for: min(inactive),
        };
        // 5554 inactive 13 min, 5555 12 min, 5556 routed: 5554 goes, 5555 stays.
        let revs = [r(5555, false, 12), r(5556, true, 11), r(5554, false, 13)];
        assert_eq!(collectable(&c, &revs), vec![5554]);
        // Routed one after another (2, 3, 4 no longer, 5 latest): 2 and 3 go, 4 stays.
        let revs = [
            r(2, false, 30),
            r(3, false, 20),
            r(4, false, 10),
            r(5, true, 0),
        ];
        assert_eq!(collectable(&c, &revs), vec![2, 3]);
    }

    #[test]
    fn one_disabled_time_rule_does_not_hold_a_revision_back() {
        let c = GcConfig {
            retain_since_create_time: None,
            retain_since_last_active_time: Some(Duration::from_secs(3600)),
            min_non_active_revisions: 0,
            max_non_active_revisions: None,
        };
        let revs = [rev(1, false, 1, 2), rev(2, false, 1, 0)];
        assert_eq!(collectable(&c, &revs), vec![1]);
    }
}
