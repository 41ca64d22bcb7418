//! Endpoints bound to the revision's pods: an endpoint of a revision's private slices counts
//! only when
//! - its pod (the endpoint's `targetRef`, a pod of the slice's namespace) is controlled by a
//!   ReplicaSet (by UID) that the revision's Deployment controls (by UID), and
//! - each of its addresses is one of that pod's `status.podIPs`, and
//! - the pod is `Running` and not being deleted.
//!
//! A namespace user can write EndpointSlices carrying the revision's labels (a Service of their
//! own that copies them, or a slice written by hand). An endpoint of another pod is
//! [`Foreign::NotTheRevisions`]; one whose `targetRef` names a revision pod but whose address is
//! elsewhere (which would send the activator's requests, early-ready probes and the
//! autoscaler's stats pulls, from thaw-system's network identity, to any address in the
//! cluster) is [`Foreign::Address`]. Foreign endpoints are left out of the endpoints and the
//! stats targets, and counted.
//!
//! **Being deleted is terminating.** An endpoint whose pod has a `deletionTimestamp` (and whose
//! addresses are the pod's) stays the revision's as [`Verdict::Terminating`]: listed as
//! terminating and never ready, whatever the slice's conditions say, so requests in flight on
//! it drain.
//!
//! The index holds, per pod: its controlling ReplicaSet's UID, its IPs, whether it runs and
//! whether it is being deleted (from the platform's pod watch); per ReplicaSet: its controlling
//! Deployment's UID (a metadata-only ReplicaSet watch). Both are selected by the revision label
//! and capped at [`MAX_ENTRIES`] each (more are refused and counted). The revision's Deployment
//! is the one named for it and controlled by the Revision ([`super::children`]).
//!
//! **Unknown is pending, not foreign.** An endpoint whose pod or ReplicaSet the index has not
//! seen yet, whose pod has no IP or is not running yet, or whose revision's Deployment is not
//! known yet is left out until it is known, not counted, and re-checked when the pod, its
//! ReplicaSet, the Deployment or the Revision changes (the watches are separate streams: a pod
//! can reach a slice before its `podIPs` reach the index). A cold start is not failed by it:
//! the pod has its IPs and runs before it is ready, and every role waits for the platform's
//! first sync (this watch included) before it serves.

use std::net::IpAddr;

use dashmap::DashMap;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::Endpoint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Most pods, and most ReplicaSets, the index holds.
pub const MAX_ENTRIES: usize = 1 << 18;

/// Why an endpoint is not the revision's (the `reason` of `thaw_platform_ignored_total`'s
/// `endpoint` kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Foreign {
    /// Its `targetRef` names no pod of the slice's namespace.
    NoPod,
    /// Its pod is not controlled, through a ReplicaSet, by the revision's Deployment.
    NotTheRevisions,
    /// It has an address that is not one of its pod's `status.podIPs` (or none at all).
    Address,
}

impl Foreign {
    /// Every reason, in [`Foreign::index`] order.
    pub const ALL: [Foreign; 3] = [Foreign::NoPod, Foreign::NotTheRevisions, Foreign::Address];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Foreign::NoPod => "no_pod",
            Foreign::NotTheRevisions => "pod_not_owned",
            Foreign::Address => "address_not_the_pods",
        }
    }

    /// Its place in [`Foreign::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What an endpoint is to a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its pod is the revision's Deployment's, runs, and has the endpoint's addresses: ready,
    /// starting or terminating as the slice's conditions say.
    Owned,
    /// As [`Verdict::Owned`], but its pod is being deleted: terminating, never ready.
    Terminating,
    /// Not the revision's: left out and counted.
    Foreign(Foreign),
    /// Its pod, the pod's IPs or phase, the pod's ReplicaSet or the revision's Deployment is
    /// not known yet: left out, not counted.
    Pending,
}

/// The UID of the controller of kind `kind` among `refs`; `None` when there is none.
pub fn controller_uid(refs: Option<&[OwnerReference]>, kind: &str) -> Option<String> {
    refs?
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| r.uid.clone())
}

/// What the index keeps of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// The UID of its controlling ReplicaSet (`None`: it has none).
    pub replica_set: Option<String>,
    /// Its `status.podIPs` (`status.podIP` when only that is set); empty until the kubelet
    /// reports them.
    pub ips: Vec<IpAddr>,
    /// `status.phase` is `Running`.
    pub running: bool,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
    /// Which sidecar it runs ([`super::pods::stats_wire`]): how the autoscaler pulls its stats.
    pub stats_wire: crate::stats::PodStatsWire,
    /// The port its stats are pulled at when not the one its slices name (Knative's
    /// queue-proxy serves them on a fixed port).
    pub stats_port: Option<u16>,
}

impl PodInfo {
    /// What the index keeps of `pod`. Addresses that do not parse are left out (so an endpoint
    /// naming them is not the pod's).
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty()
            && let Some(ip) = status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
        {
            ips.push(ip);
        }
        let (stats_wire, stats_port) = super::pods::stats_wire(pod);
        Self {
            replica_set: controller_uid(pod.metadata.owner_references.as_deref(), "ReplicaSet"),
            ips,
            running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            stats_wire,
            stats_port,
        }
    }
}

/// Pods and ReplicaSets, as far as the watches have seen them.
#[derive(Debug, Default)]
pub struct Owners {
    /// (namespace, pod name) -> what is known of the pod.
    pods: DashMap<(String, String), PodInfo>,
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

fn put<K: std::hash::Hash + Eq, V: PartialEq>(map: &DashMap<K, V>, key: K, value: V) -> Stored {
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
    /// Records pod `namespace/name`.
    pub fn put_pod(&self, namespace: &str, name: &str, pod: PodInfo) -> Stored {
        put(&self.pods, (namespace.to_string(), name.to_string()), pod)
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

    /// How pod `namespace/name` serves its stats, and at which port when not its slices' (the
    /// default, [`crate::stats::PodStatsWire::Thaw`], for a pod not seen).
    pub fn stats_wire(
        &self,
        namespace: &str,
        name: &str,
    ) -> (crate::stats::PodStatsWire, Option<u16>) {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .map_or_else(Default::default, |p| (p.stats_wire, p.stats_port))
    }

    /// What `ep`, an endpoint of a slice in `namespace`, is to the revision whose Deployment
    /// has UID `deployment` (`None`: not known yet).
    pub fn verdict(&self, namespace: &str, deployment: Option<&str>, ep: &Endpoint) -> Verdict {
        let Some(target) = ep.target_ref.as_ref() else {
            return Verdict::Foreign(Foreign::NoPod);
        };
        if target.kind.as_deref() != Some("Pod")
            || target.namespace.as_deref().is_some_and(|n| n != namespace)
        {
            return Verdict::Foreign(Foreign::NoPod);
        }
        let Some(name) = target.name.as_deref() else {
            return Verdict::Foreign(Foreign::NoPod);
        };
        let Some(pod) = self
            .pods
            .get(&(namespace.to_string(), name.to_string()))
            .map(|p| p.clone())
        else {
            return Verdict::Pending;
        };
        let Some(rs) = pod.replica_set.as_deref() else {
            return Verdict::Foreign(Foreign::NotTheRevisions);
        };
        let Some(owner) = self.replica_sets.get(rs).map(|d| d.clone()) else {
            return Verdict::Pending;
        };
        match (owner, deployment) {
            (None, _) => return Verdict::Foreign(Foreign::NotTheRevisions),
            (Some(_), None) => return Verdict::Pending,
            (Some(o), Some(d)) if o != d => return Verdict::Foreign(Foreign::NotTheRevisions),
            (Some(_), Some(_)) => {}
        }
        if pod.ips.is_empty() {
            // The kubelet has not reported them yet: judged when it does.
            return Verdict::Pending;
        }
        let bound = !ep.addresses.is_empty()
            && ep
                .addresses
                .iter()
                .all(|a| a.parse::<IpAddr>().is_ok_and(|ip| pod.ips.contains(&ip)));
        if !bound {
            return Verdict::Foreign(Foreign::Address);
        }
        if pod.deleting {
            Verdict::Terminating
        } else if pod.running {
            Verdict::Owned
        } else {
            Verdict::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(addresses: &[&str], target: serde_json::Value) -> Endpoint {
        serde_json::from_value(serde_json::json!({"addresses": addresses, "targetRef": target}))
            .unwrap()
    }

    fn pod(name: &str) -> Endpoint {
        ep(
            &["10.0.0.1"],
            serde_json::json!({"kind": "Pod", "name": name, "namespace": "ns"}),
        )
    }

    /// A running pod of ReplicaSet `rs` at 10.0.0.1.
    fn running(rs: Option<&str>) -> PodInfo {
        PodInfo {
            replica_set: rs.map(Into::into),
            ips: vec!["10.0.0.1".parse().unwrap()],
            running: true,
            deleting: false,
            ..PodInfo::default()
        }
    }

    #[test]
    fn pod_to_replica_set_to_deployment_by_uid() {
        let o = Owners::default();
        let dep = Some("dep-uid");
        // Nothing known yet: pending, not foreign.
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.put_pod("ns", "p1", running(Some("rs-uid")));
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.put_replica_set("rs-uid", Some("dep-uid".into()));
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Owned);
        // The revision's Deployment not known yet: pending.
        assert_eq!(o.verdict("ns", None, &pod("p1")), Verdict::Pending);
        // Another Deployment's ReplicaSet; a ReplicaSet of no Deployment; a bare pod.
        let not_ours = Verdict::Foreign(Foreign::NotTheRevisions);
        o.put_pod("ns", "p2", running(Some("rs-other")));
        o.put_replica_set("rs-other", Some("dep-other".into()));
        assert_eq!(o.verdict("ns", dep, &pod("p2")), not_ours);
        o.put_pod("ns", "p3", running(Some("rs-bare")));
        o.put_replica_set("rs-bare", None);
        assert_eq!(o.verdict("ns", dep, &pod("p3")), not_ours);
        o.put_pod("ns", "p4", running(None));
        assert_eq!(o.verdict("ns", dep, &pod("p4")), not_ours);
        // No targetRef, not a pod, another namespace's pod of the same name.
        let no_pod = Verdict::Foreign(Foreign::NoPod);
        let none: Endpoint =
            serde_json::from_value(serde_json::json!({"addresses": ["10.0.0.1"]})).unwrap();
        assert_eq!(o.verdict("ns", dep, &none), no_pod);
        let node = ep(
            &["10.0.0.1"],
            serde_json::json!({"kind": "Node", "name": "p1"}),
        );
        assert_eq!(o.verdict("ns", dep, &node), no_pod);
        let elsewhere = ep(
            &["10.0.0.1"],
            serde_json::json!({"kind": "Pod", "name": "p1", "namespace": "b"}),
        );
        assert_eq!(o.verdict("ns", dep, &elsewhere), no_pod);
        // Forgotten: pending again.
        o.remove_replica_set("rs-uid");
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
        o.remove_pod("ns", "p1");
        assert_eq!(o.verdict("ns", dep, &pod("p1")), Verdict::Pending);
    }

    #[test]
    fn addresses_are_bound_to_the_pods_ips() {
        let o = Owners::default();
        let dep = Some("dep-uid");
        o.put_replica_set("rs", Some("dep-uid".into()));
        let target = serde_json::json!({"kind": "Pod", "name": "p", "namespace": "ns"});
        // Dual stack: both of the pod's IPs are its own, in any spelling of the address.
        o.put_pod(
            "ns",
            "p",
            PodInfo {
                ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
                ..running(Some("rs"))
            },
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["fd00:0::1"], target.clone())),
            Verdict::Owned
        );
        // The revision's pod named, an address elsewhere (alone, or beside the pod's own).
        let elsewhere = Verdict::Foreign(Foreign::Address);
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.96.0.10"], target.clone())),
            elsewhere
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.0.0.1", "10.96.0.10"], target.clone())),
            elsewhere
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["kube-dns.kube-system"], target.clone())),
            elsewhere
        );
        assert_eq!(o.verdict("ns", dep, &ep(&[], target.clone())), elsewhere);
        // No IP reported yet: pending (judged when the kubelet reports them).
        o.put_pod(
            "ns",
            "p",
            PodInfo {
                ips: vec![],
                running: false,
                ..running(Some("rs"))
            },
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.96.0.10"], target.clone())),
            Verdict::Pending
        );
        // An IP, not running yet: pending; running: owned.
        o.put_pod(
            "ns",
            "p",
            PodInfo {
                running: false,
                ..running(Some("rs"))
            },
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.0.0.1"], target.clone())),
            Verdict::Pending
        );
        o.put_pod("ns", "p", running(Some("rs")));
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.0.0.1"], target.clone())),
            Verdict::Owned
        );
        // Being deleted: still the revision's, as terminating (its address still checked).
        o.put_pod(
            "ns",
            "p",
            PodInfo {
                deleting: true,
                ..running(Some("rs"))
            },
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.0.0.1"], target.clone())),
            Verdict::Terminating
        );
        assert_eq!(
            o.verdict("ns", dep, &ep(&["10.96.0.10"], target)),
            elsewhere
        );
    }

    #[test]
    fn pod_info_reads_ips_phase_and_deletion() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "deletionTimestamp": "2024-01-01T00:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "rs-uid", "controller": true}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
        }))
        .unwrap();
        let info = PodInfo::of(&pod);
        assert_eq!(info.replica_set.as_deref(), Some("rs-uid"));
        assert_eq!(
            info.ips,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert!(info.running && info.deleting);
        // podIP alone (an older kubelet); no status at all.
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "status": {"phase": "Pending", "podIP": "10.0.0.2"}
        }))
        .unwrap();
        let info = PodInfo::of(&pod);
        assert_eq!(info.ips, ["10.0.0.2".parse::<IpAddr>().unwrap()]);
        assert!(!info.running && !info.deleting);
        let bare: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(PodInfo::of(&bare), PodInfo::default());
    }

    #[test]
    fn stores_say_whether_anything_changed() {
        let o = Owners::default();
        assert_eq!(o.put_pod("ns", "p", running(Some("a"))), Stored::Changed);
        assert_eq!(o.put_pod("ns", "p", running(Some("a"))), Stored::Same);
        assert_eq!(o.put_pod("ns", "p", running(Some("b"))), Stored::Changed);
        // The kubelet reporting the pod's IPs is a change (its endpoints are judged again).
        let mut ips = running(Some("b"));
        ips.ips.push("10.0.0.2".parse().unwrap());
        assert_eq!(o.put_pod("ns", "p", ips), Stored::Changed);
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
