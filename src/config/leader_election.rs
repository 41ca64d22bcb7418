//! `config-leader-election`: Knative's Lease timings (knative.dev/pkg `leaderelection`), read by
//! every leader-elected role (the autoscaler, the controller, the webhook) when it starts.
//!
//! Keys and defaults are Knative's: `lease-duration` 60s, `renew-deadline` 40s,
//! `retry-period` 10s, and `buckets` 1 (1 to 10). The legacy camel-case keys
//! (`leaseDuration`, `renewDeadline`, `retryPeriod`) are read too, the kebab-case key winning
//! when both are given, as Knative parses them. thaw leads each role with one Lease: `buckets`
//! is range-checked as Knative does and otherwise has no effect (a value other than 1 is
//! warned about), nor has `map-lease-prefix.*` (thaw's Leases are `thaw-{role}`).
//!
//! As in Knative, the ConfigMap is read at start (a change takes effect when a role's pods
//! restart); an invalid one stops the role from starting, naming the key and the reason, so a
//! rollout with a bad ConfigMap leaves the running replicas in place. A role's
//! `--lease-duration`, `--renew-deadline` and `--retry-period` flags override the ConfigMap.

use std::collections::BTreeMap;
use std::time::Duration;

use super::keys::{self, ConfigMap, Key};
use super::parse::{Problem, format_duration, parse_go_duration_nanos};

/// Name of the ConfigMap.
pub const NAME: &str = "config-leader-election";

/// Knative's `MaxBuckets`.
pub const MAX_BUCKETS: u32 = 10;

/// Knative's leader-election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// `lease-duration`: how long candidates wait after the Lease's last renewal (60s).
    pub lease_duration: Duration,
    /// `renew-deadline`: how long the leader keeps trying to renew before it stops (40s).
    pub renew_deadline: Duration,
    /// `retry-period`: how often the leader renews and candidates retry (10s).
    pub retry_period: Duration,
    /// `buckets`: Knative's number of Leases per role (1); thaw keeps one.
    pub buckets: u32,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(60),
            renew_deadline: Duration::from_secs(40),
            retry_period: Duration::from_secs(10),
            buckets: 1,
        }
    }
}

/// Knative's `cm.AsDuration`: a Go duration, positive here (a Lease cannot be held for none).
fn duration(s: &str) -> Result<Duration, String> {
    let n = parse_go_duration_nanos(s)?;
    if n <= 0 {
        return Err("must be positive".into());
    }
    Ok(Duration::from_nanos(
        u64::try_from(n).map_err(|_| "out of range")?,
    ))
}

/// Every key, Knative's order; the legacy names parse into the same fields and are applied
/// first (see [`LeaderElectionConfig::parse_map`]).
pub static KEYS: &[Key<LeaderElectionConfig>] = &[
    Key {
        name: "lease-duration",
        unit: "duration",
        help: "How long candidates wait after the Lease's last renewal before taking it.",
        parse: |c, s| {
            c.lease_duration = duration(s)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.lease_duration),
    },
    Key {
        name: "renew-deadline",
        unit: "duration",
        help: "How long the leader keeps trying to renew before it stops leading.",
        parse: |c, s| {
            c.renew_deadline = duration(s)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.renew_deadline),
    },
    Key {
        name: "retry-period",
        unit: "duration",
        help: "How often the leader renews and candidates retry.",
        parse: |c, s| {
            c.retry_period = duration(s)?;
            Ok(())
        },
        show: |c| keys::show_duration(c.retry_period),
    },
    Key {
        name: "buckets",
        unit: "leases",
        help: "Knative's Leases per role (1 to 10); thaw leads each role with one.",
        parse: |c, s| {
            let n: u32 = s
                .trim()
                .parse()
                .map_err(|_| "not a whole number".to_string())?;
            if !(1..=MAX_BUCKETS).contains(&n) {
                return Err(format!("value must be between 1 <= {n} <= {MAX_BUCKETS}"));
            }
            c.buckets = n;
            Ok(())
        },
        show: |c| keys::show_u32(c.buckets),
    },
];

/// Knative's legacy key names and the kebab-case key each stands for.
const LEGACY: &[(&str, &str)] = &[
    ("leaseDuration", "lease-duration"),
    ("renewDeadline", "renew-deadline"),
    ("retryPeriod", "retry-period"),
];

fn validate(c: &LeaderElectionConfig, data: &BTreeMap<String, String>) -> Vec<Problem> {
    let mut p = Vec::new();
    if c.renew_deadline >= c.lease_duration {
        p.push(Problem::new(
            "renew-deadline",
            keys::written(KEYS, data, c, "renew-deadline"),
            format!(
                "must be less than lease-duration ({})",
                format_duration(c.lease_duration)
            ),
        ));
    }
    if c.retry_period >= c.renew_deadline {
        p.push(Problem::new(
            "retry-period",
            keys::written(KEYS, data, c, "retry-period"),
            format!(
                "must be less than renew-deadline ({})",
                format_duration(c.renew_deadline)
            ),
        ));
    }
    if c.lease_duration.subsec_nanos() != 0 {
        p.push(Problem::new(
            "lease-duration",
            keys::written(KEYS, data, c, "lease-duration"),
            "must be whole seconds (a Lease stores leaseDurationSeconds)",
        ));
    }
    p
}

impl ConfigMap for LeaderElectionConfig {
    const NAME: &'static str = NAME;

    fn keys() -> &'static [Key<Self>] {
        KEYS
    }

    fn validate(&self, data: &BTreeMap<String, String>) -> Vec<Problem> {
        validate(self, data)
    }
}

impl LeaderElectionConfig {
    /// Parses a `data:` map as Knative does: a legacy camel-case key counts as its kebab-case
    /// key when that one is absent. Warnings: unknown keys, a `buckets` other than 1, and
    /// `map-lease-prefix.*` entries (thaw's Leases keep their names).
    pub fn parse_map(
        data: &BTreeMap<String, String>,
    ) -> Result<keys::Parsed<Self>, super::Problems> {
        let mut data = data.clone();
        let mut prefixes = Vec::new();
        data.retain(|k, _| {
            let prefix = k.starts_with("map-lease-prefix.");
            if prefix {
                prefixes.push(k.clone());
            }
            !prefix
        });
        for (legacy, key) in LEGACY {
            if let Some(v) = data.remove(*legacy) {
                data.entry((*key).to_string()).or_insert(v);
            }
        }
        let mut parsed = Self::parse(&data)?;
        if parsed.config.buckets != 1 {
            parsed.warnings.push(format!(
                "buckets: {} has no effect: thaw leads each role with one Lease",
                parsed.config.buckets
            ));
        }
        for p in prefixes {
            parsed.warnings.push(format!(
                "{p}: has no effect: thaw's Leases are named thaw-<role>"
            ));
        }
        Ok(parsed)
    }

    /// The ConfigMap of the system namespace `namespace` as a role reads it when it starts:
    /// Knative's defaults when it is absent; an error naming each bad key otherwise. Read by a
    /// list selecting its name (the roles may list and watch their namespace's ConfigMaps).
    pub async fn read(client: &kube::Client, namespace: &str) -> Result<Self, String> {
        use k8s_openapi::api::core::v1::ConfigMap as KubeConfigMap;
        let api: kube::Api<KubeConfigMap> = kube::Api::namespaced(client.clone(), namespace);
        let lp = kube::api::ListParams::default().fields(&format!("metadata.name={NAME}"));
        let list = api
            .list(&lp)
            .await
            .map_err(|e| format!("cannot read {namespace}/{NAME}: {e}"))?;
        let Some(cm) = list
            .items
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(NAME))
        else {
            tracing::info!(
                configmap = NAME,
                "absent: Knative's leader-election defaults (60s/40s/10s)"
            );
            return Ok(Self::default());
        };
        let data = cm.data.unwrap_or_default();
        let parsed = Self::parse_map(&data).map_err(|p| format!("{namespace}/{NAME}: {p}"))?;
        for w in &parsed.warnings {
            tracing::warn!(configmap = NAME, "{w}");
        }
        Ok(parsed.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn knatives_defaults_and_keys() {
        let c = LeaderElectionConfig::parse_map(&BTreeMap::new())
            .unwrap()
            .config;
        assert_eq!(
            (
                c.lease_duration,
                c.renew_deadline,
                c.retry_period,
                c.buckets
            ),
            (
                Duration::from_secs(60),
                Duration::from_secs(40),
                Duration::from_secs(10),
                1
            )
        );
        let c = LeaderElectionConfig::parse_map(&map(&[
            ("lease-duration", "15s"),
            ("renew-deadline", "10s"),
            ("retry-period", "2s"),
        ]))
        .unwrap()
        .config;
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
    }

    #[test]
    fn legacy_keys_count_unless_the_kebab_case_key_is_given() {
        let c = LeaderElectionConfig::parse_map(&map(&[
            ("leaseDuration", "30s"),
            ("renewDeadline", "20s"),
            ("retryPeriod", "5s"),
            ("retry-period", "4s"),
        ]))
        .unwrap();
        assert_eq!(c.config.lease_duration, Duration::from_secs(30));
        assert_eq!(c.config.renew_deadline, Duration::from_secs(20));
        assert_eq!(c.config.retry_period, Duration::from_secs(4));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn bad_values_name_the_key_and_the_reason() {
        let e = LeaderElectionConfig::parse_map(&map(&[("lease-duration", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lease-duration"), "{e}");
        let e = LeaderElectionConfig::parse_map(&map(&[("buckets", "11")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("buckets") && e.contains("value must be between 1 <= 11 <= 10"),
            "{e}"
        );
        let e = LeaderElectionConfig::parse_map(&map(&[("renew-deadline", "60s")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("renew-deadline") && e.contains("less than lease-duration"),
            "{e}"
        );
        let e = LeaderElectionConfig::parse_map(&map(&[("lease-duration", "1500ms")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("whole seconds"), "{e}");
    }

    #[test]
    fn buckets_and_lease_prefixes_are_read_and_said_to_have_no_effect() {
        let c = LeaderElectionConfig::parse_map(&map(&[
            ("buckets", "3"),
            ("map-lease-prefix.reconciler.Route", "route"),
        ]))
        .unwrap();
        assert_eq!(c.config.buckets, 3);
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("buckets: 3 has no effect"));
        assert!(c.warnings[1].starts_with("map-lease-prefix.reconciler.Route"));
    }
}
