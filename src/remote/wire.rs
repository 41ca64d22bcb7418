//! thaw's wire format between the roles: JSON, camelCase.
//!
//! - **Stats push** (`POST` [`STATS_PATH`] on the autoscaler leader's stats port, body
//!   [`StatsBatch`]): one batch per second with every revision the activator reports, and a
//!   batch of one, flagged `poke`, at once for a cold request. The leader stamps each stat with
//!   its own receipt second (no clock is shared). Answers: 202 accepted, 400 malformed, 401
//!   without the token, 413 too large, 503 not the leader (the sender moves on to the leader
//!   it learns from the Lease).
//! - **Decision feed** (`GET` [`DECISIONS_PATH`], same token): a long-lived response of
//!   newline-delimited [`WireDecision`]s: every known revision once, then each change. The
//!   receiver times a decision from its own receipt.

use serde::{Deserialize, Serialize};

use crate::revision::RevisionKey;
use crate::stats::Stat;

/// Where activators push stats.
pub const STATS_PATH: &str = "/stats";
/// Where activators follow decisions.
pub const DECISIONS_PATH: &str = "/decisions";
/// Largest stats body accepted (a few thousand revisions a batch fit many times over).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Content type of both directions.
pub const CONTENT_TYPE: &str = "application/json";

/// One push: a reporter's stats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatsBatch {
    /// The reporter (an activator's pod name); the collector counts each source once a second.
    pub source: String,
    pub stats: Vec<WireStat>,
}

/// One revision's second, as [`Stat`] without its source and second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WireStat {
    pub namespace: String,
    pub name: String,
    pub concurrency: f64,
    pub requests: u64,
    /// A cold request's immediate poke rather than the 1 s record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poke: bool,
}

impl WireStat {
    pub fn from_stat(s: &Stat, poke: bool) -> Self {
        Self {
            namespace: s.revision.namespace.to_string(),
            name: s.revision.name.to_string(),
            concurrency: s.average_concurrency,
            requests: s.requests,
            poke,
        }
    }

    /// The stat as the collector takes it, from `source`, stamped with the receiver's `at`.
    pub fn to_stat(&self, source: &std::sync::Arc<str>, at: u64) -> Stat {
        Stat {
            revision: RevisionKey::new(&self.namespace, &self.name),
            source: source.clone(),
            at,
            average_concurrency: self.concurrency,
            requests: self.requests,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
        }
    }
}

/// One line of the decision feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireDecision {
    pub namespace: String,
    pub name: String,
    /// Replicas the leader asks for; absent before its first decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<u32>,
    /// Whether the activator stays in the revision's path.
    pub activator_in_path: bool,
    /// The revision is no longer scaled (deleted, or of another autoscaler class).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_is_compact_camel_case_json() {
        let b = StatsBatch {
            source: "activator-1".into(),
            stats: vec![WireStat {
                namespace: "default".into(),
                name: "hello-00001".into(),
                concurrency: 1.5,
                requests: 3,
                poke: false,
            }],
        };
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(
            json,
            r#"{"source":"activator-1","stats":[{"namespace":"default","name":"hello-00001","concurrency":1.5,"requests":3}]}"#
        );
        assert_eq!(serde_json::from_str::<StatsBatch>(&json).unwrap(), b);
        assert!(serde_json::from_str::<StatsBatch>(r#"{"source":"a","stats":[],"x":1}"#).is_err());
        let d: WireDecision = serde_json::from_str(
            r#"{"namespace":"n","name":"r","desired":2,"activatorInPath":false}"#,
        )
        .unwrap();
        assert_eq!(d.desired, Some(2));
        assert!(!d.removed);
    }
}
