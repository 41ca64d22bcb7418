//! Endpoints by ownership: an endpoint of a revision's private slices counts only when its pod
//! (the endpoint's `targetRef`) is controlled by a ReplicaSet (by UID) that the revision's
//! Deployment controls (by UID). A Service of the namespace's own that copies the revision's
//! labels gets slices the platform's watch sees; their pods belong to another ReplicaSet or
//! Deployment, so they are **foreign**: left out of the endpoints and the stats targets, and
//! counted (`thaw_platform_foreign_endpoints_total`).
//!
//! The index holds UIDs only: pod -> its controlling ReplicaSet (from the platform's pod watch),
//! ReplicaSet -> its controlling Deployment (a metadata-only ReplicaSet watch), both selected by
//! the revision label and capped at [`MAX_ENTRIES`] each (more are refused and counted). The
//! revision's Deployment is the one the platform scales ([`super::DeploymentRef`]).
//!
//! **Unknown is pending, not foreign.** An endpoint whose pod or ReplicaSet the index has not
//! seen yet (the watches are separate streams; a pod can reach a slice before its event
//! reaches the index) is left out until it is seen, not counted as foreign, and re-checked
//! when the pod, its ReplicaSet or the Deployment arrives. A cold start is not failed by it:
//! the ReplicaSet and the pod exist before the pod is ready, and every role waits for the
//! platform's first sync (this watch included) before it serves.

use dashmap::DashMap;
use k8s_openapi::api::discovery::v1::Endpoint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Most pods, and most ReplicaSets, the index holds.
pub const MAX_ENTRIES: usize = 1 << 18;

/// What an endpoint is to a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its pod belongs to the revision's Deployment.
    Owned,
    /// Its pod belongs elsewhere, or it names no pod.
    Foreign,
    /// Its pod, the pod's ReplicaSet or the revision's Deployment is not known yet.
    Pending,
}

/// The UID of the controller of kind `kind` among `refs`; `Some(None)`-like: `None` when there
/// is none.
pub fn controller_uid(refs: Option<&[OwnerReference]>, kind: &str) -> Option<String> {
    refs?
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| r.uid.clone())
}

/// Pods and ReplicaSets by UID, as far as the watches have seen them.
#[derive(Debug, Default)]
pub struct Owners {
    /// (namespace, pod name) -> the UID of its controlling ReplicaSet (`None`: it has none).
    pods: DashMap<(String, String), Option<String>>,
    /// ReplicaSet UID -> the UID of its controlling Deployment (`None`: it has none).
    replica_sets: DashMap<String, Option<String>>,
}

/// Whether an insert was refused because the map is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The entry is new or differs from what was known.
    Changed,
    /// The same as before.
    Same,
    /// Refused: [`MAX_ENTRIES`] reached.
    Full,
}

fn put<K: std::hash::Hash + Eq>(
    map: &DashMap<K, Option<String>>,
    key: K,
    value: Option<String>,
) -> Stored {
    if let Some(mut cur) = map.get_mut(&key) {
        if *cur == value {
            return Stored::Same;
        }
        *cur = value;
        return Stored::Changed;
    }
    if map.len() >= MAX_ENTRIES {
        return Stored::Full;
    }
    map.insert(key, value);
    Stored::Changed
}

impl Owners {
    /// Records pod `namespace/name` and its controlling ReplicaSet.
    pub fn put_pod(&self, namespace: &str, name: &str, replica_set: Option<String>) -> Stored {
        put(
            &self.pods,
            (namespace.to_string(), name.to_string()),
            replica_set,
        )
    }

    /// Forgets pod `namespace/name`.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.pods.remove(&(namespace.to_string(), name.to_string()));
    }

    /// Records ReplicaSet `uid` and its controlling Deployment.
    pub fn put_replica_set(&self, uid: &str, deployment: Option<String>) -> Stored {
        put(&self.replica_sets, uid.to_string(), deployment)
    }

    /// Forgets ReplicaSet `uid`.
    pub fn remove_replica_set(&self, uid: &str) {
        self.replica_sets.remove(uid);
    }

    /// Forgets every pod (a new pod list replaces them).
    pub fn clear_pods(&self) {
        self.pods.clear();
    }

    /// Forgets every ReplicaSet (a new list replaces them).
    pub fn clear_replica_sets(&self) {
        self.replica_sets.clear();
    }

    /// What `ep`, an endpoint of a slice in `namespace`, is to the revision whose Deployment
    /// has UID `deployment` (`None`: not known yet).
    pub fn verdict(&self, namespace: &str, deployment: Option<&str>, ep: &Endpoint) -> Verdict {
        let Some(target) = ep.target_ref.as_ref() else {
            return Verdict::Foreign;
        };
        if target.kind.as_deref() != Some("Pod")
            || target.namespace.as_deref().is_some_and(|n| n != namespace)
        {
            return Verdict::Foreign;
        }
        let Some(name) = target.name.as_deref() else {
            return Verdict::Foreign;
        };
        let Some(rs) = self
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|r| r.clone())
        else {
            return Verdict::Pending;
        };
        let Some(rs) = rs else {
            return Verdict::Foreign;
        };
        let Some(owner) = self.replica_sets.get(&rs).map(|d| d.clone()) else {
            return Verdict::Pending;
        };
        match (owner, deployment) {
            (None, _) => Verdict::Foreign,
            (Some(_), None) => Verdict::Pending,
            (Some(o), Some(d)) if o == d => Verdict::Owned,
            (Some(_), Some(_)) => Verdict::Foreign,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(target: serde_json::Value) -> Endpoint {
        serde_json::from_value(serde_json::json!({"addresses": ["10.0.0.1"], "targetRef": target}))
            .unwrap()
    }

    fn pod(name: &str) -> Endpoint {
        ep(serde_json::json!({"kind": "Pod", "name": name, "namespace": "ns"}))
    }

    #[test]
    fn pod_to_replica_set_to_deployment_by_uid() {
        let o = Owners::default();
        let dep = Some("dep-uid");
        // Nothing known yet: pending, not foreign.
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.put_pod("ns", "p1", Some("rs-uid".into()));
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.put_replica_set("rs-uid", Some("dep-uid".into()));
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Owned);
        // The revision's Deployment not known yet: pending.
        assert_eq!(o.verdict("ns", None, &pod("p1")), Verdict::Pending);
        // Another Deployment's ReplicaSet; a ReplicaSet of no Deployment; a bare pod.
        o.put_pod("ns", "p2", Some("rs-other".into()));
        o.put_replica_set("rs-other", Some("dep-other".into()));
        assert_eq!(o.verdict("ns", dep, &pod("p2")), Verdict::Foreign);
        o.put_pod("ns", "p3", Some("rs-bare".into()));
        o.put_replica_set("rs-bare", None);
        assert_eq!(o.verdict("ns", dep, &pod("p3")), Verdict::Foreign);
        o.put_pod("ns", "p4", None);
        assert_eq!(o.verdict("ns", dep, &pod("p4")), Verdict::Foreign);
        // No targetRef, not a pod, another namespace's pod of the same name.
        let none: Endpoint =
            serde_json::from_value(serde_json::json!({"addresses": ["10.0.0.1"]})).unwrap();
        assert_eq!(o.verdict("ns", dep, &none), Verdict::Foreign);
        let node = ep(serde_json::json!({"kind": "Node", "name": "p1"}));
        assert_eq!(o.verdict("ns", dep, &node), Verdict::Foreign);
        let elsewhere = ep(serde_json::json!({"kind": "Pod", "name": "p1", "namespace": "b"}));
        assert_eq!(o.verdict("ns", dep, &elsewhere), Verdict::Foreign);
        // Forgotten: pending again.
        o.remove_replica_set("rs-uid");
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.remove_pod("ns", "p1");
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
    }

    #[test]
    fn stores_say_whether_anything_changed() {
        let o = Owners::default();
        assert_eq!(o.put_pod("ns", "p", Some("a".into())), Stored::Changed);
        assert_eq!(o.put_pod("ns", "p", Some("a".into())), Stored::Same);
        assert_eq!(o.put_pod("ns", "p", Some("b".into())), Stored::Changed);
        assert_eq!(o.put_replica_set("a", None), Stored::Changed);
        assert_eq!(o.put_replica_set("a", None), Stored::Same);
    }

    #[test]
    fn the_controller_of_a_kind_is_found_by_uid() {
        let refs: Vec<OwnerReference> = serde_json::from_value(serde_json::json!([
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "not-controller"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "y", "uid": "rs", "controller": true}
        ]))
        .unwrap();
        assert_eq!(
            controller_uid(Some(&refs), "ReplicaSet").as_deref(),
            Some("rs")
        );
        assert_eq!(controller_uid(Some(&refs), "Deployment"), None);
        assert_eq!(controller_uid(None, "ReplicaSet"), None);
    }
}
