//! From a revision's private EndpointSlices to its endpoint sets: the port chosen by the
//! revision's protocol, `ready` and `terminating` from the slice conditions, merged across
//! every slice of the revision and deduplicated; only the slices of the revision's private
//! Service and the endpoints bound to its pods count ([`Ownership`]). Pure functions; the
//! watch loop calls them.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::children::{Ignored, Judged};
use super::owners::{Foreign, Verdict};
use crate::revision::Protocol;
use crate::stats::PodStatsWire;

/// The appProtocol Kubernetes defines for HTTP/2 without TLS.
pub const APP_PROTOCOL_H2C: &str = "kubernetes.io/h2c";
/// The private Service's port name for HTTP/1 revisions.
pub const PORT_NAME_HTTP: &str = "http";
/// The private Service's port name for h2c revisions.
pub const PORT_NAME_HTTP2: &str = "http2";

/// Whose a revision's slices and their endpoints are, as far as the platform knows at one
/// moment ([`super::owners`], [`super::children`]).
pub trait Ownership {
    /// Whether `slice` is the revision's private Service's.
    fn slice(&self, slice: &EndpointSlice) -> Judged;
    /// What `ep`, an endpoint of one of the revision's slices, is to it.
    fn endpoint(&self, ep: &Endpoint) -> Verdict;
    /// Which sidecar the pod of `ep` (an endpoint it owns) runs; thaw's unless known otherwise.
    fn sidecar(&self, _ep: &Endpoint) -> PodStatsWire {
        PodStatsWire::Thaw
    }
}

/// Endpoints left out of one slice because they are not the revision's, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally([u32; Foreign::ALL.len()]);

impl Tally {
    fn add(&mut self, f: Foreign) {
        self.0[f.index()] += 1;
    }

    /// How many were left out for `f`.
    pub fn get(&self, f: Foreign) -> u32 {
        self.0[f.index()]
    }

    /// Endpoints left out, all reasons.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    /// Per reason, how many more `self` has than `before` (none fewer).
    pub fn more_than(&self, before: &Tally) -> Tally {
        let mut out = Tally::default();
        for (o, (a, b)) in out.0.iter_mut().zip(self.0.iter().zip(before.0.iter())) {
            *o = a.saturating_sub(*b);
        }
        out
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &Tally) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }
}

/// The endpoints one slice contributes, already reduced to addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceEndpoints {
    /// Ready, not terminating.
    pub ready: BTreeSet<SocketAddr>,
    /// Terminating (whether or not still serving).
    pub terminating: BTreeSet<SocketAddr>,
    /// Not ready (starting, or failing its readiness probe) and not terminating.
    pub starting: BTreeSet<SocketAddr>,
    /// Endpoints left out as not the revision's ([`Verdict::Foreign`]), by reason.
    pub foreign: Tally,
    /// The whole slice left out: not the revision's private Service's.
    pub ignored: Option<Ignored>,
    /// A ready or starting endpoint's pod runs Knative's queue-proxy
    /// ([`EndpointSnapshot::queue_proxy`](crate::platform::EndpointSnapshot::queue_proxy)).
    pub queue_proxy: bool,
}

/// The serving port of a slice for `protocol`: for h2c the port named `http2` or with
/// appProtocol `kubernetes.io/h2c`; for HTTP/1 the port named `http` that is not h2c. `None`
/// when the slice has no such port (it contributes nothing).
pub fn serving_port(slice: &EndpointSlice, protocol: Protocol) -> Option<u16> {
    let ports = slice.ports.as_ref()?;
    let port = ports.iter().find(|p| {
        let h2c = p.app_protocol.as_deref() == Some(APP_PROTOCOL_H2C);
        match protocol {
            Protocol::H2c => h2c || p.name.as_deref() == Some(PORT_NAME_HTTP2),
            Protocol::Http1 => !h2c && p.name.as_deref() == Some(PORT_NAME_HTTP),
        }
    })?;
    u16::try_from(port.port?).ok()
}

/// Trusts every slice and endpoint (the reduction's own tests).
#[cfg(test)]
pub struct Trusting;

#[cfg(test)]
impl Ownership for Trusting {
    fn slice(&self, _: &EndpointSlice) -> Judged {
        Judged::Genuine
    }
    fn endpoint(&self, _: &Endpoint) -> Verdict {
        Verdict::Owned
    }
}

/// One slice's endpoints for `protocol`, every slice and endpoint trusted.
#[cfg(test)]
pub fn slice_endpoints(slice: &EndpointSlice, protocol: Protocol) -> SliceEndpoints {
    owned_endpoints(slice, protocol, &Trusting)
}

/// One slice's endpoints for `protocol`, as far as `owner` finds them the revision's:
/// - a slice that is not the revision's private Service's contributes nothing (`ignored`
///   says why; a pending one, nothing either);
/// - an endpoint [`Verdict::Owned`] is terminating when its condition says so, ready when
///   `ready` is true or unset (Kubernetes: "nil should be interpreted as true") and it is not
///   terminating, and starting otherwise (not ready yet, or failing its readiness probe);
/// - an endpoint [`Verdict::Terminating`] (its pod is being deleted) is terminating, whatever
///   its conditions say;
/// - a foreign one is left out and tallied; a pending one is left out.
///
/// Addresses that do not parse as IPs (an FQDN slice) are skipped.
pub fn owned_endpoints(
    slice: &EndpointSlice,
    protocol: Protocol,
    owner: &dyn Ownership,
) -> SliceEndpoints {
    let mut out = SliceEndpoints::default();
    match owner.slice(slice) {
        Judged::Genuine => {}
        Judged::Pending => return out,
        Judged::Ignored(why) => {
            out.ignored = Some(why);
            return out;
        }
    }
    let port = serving_port(slice, protocol);
    for ep in &slice.endpoints {
        let deleting = match owner.endpoint(ep) {
            Verdict::Owned => false,
            Verdict::Terminating => true,
            Verdict::Foreign(f) => {
                out.foreign.add(f);
                continue;
            }
            Verdict::Pending => continue,
        };
        let Some(port) = port else { continue };
        let cond = ep.conditions.as_ref();
        let terminating = deleting || cond.and_then(|c| c.terminating).unwrap_or(false);
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        for a in &ep.addresses {
            let Ok(ip) = a.parse::<IpAddr>() else {
                continue;
            };
            let addr = SocketAddr::new(ip, port);
            if terminating {
                out.terminating.insert(addr);
            } else if ready {
                out.ready.insert(addr);
            } else {
                out.starting.insert(addr);
            }
        }
        if !terminating && owner.sidecar(ep) == PodStatsWire::QueueProxy {
            out.queue_proxy = true;
        }
    }
    out
}

/// Every slice of one revision merged: the union of `ready`, of `terminating` and of
/// `starting`, sorted and without duplicates. An address ready in one slice and terminating
/// or starting in another (a pod moving between slices) counts as ready; one terminating in
/// one and starting in another, as terminating.
pub fn merge<'a>(slices: impl IntoIterator<Item = &'a SliceEndpoints>) -> Merged {
    let mut ready = BTreeSet::new();
    let mut terminating = BTreeSet::new();
    let mut starting = BTreeSet::new();
    let mut queue_proxy = false;
    for s in slices {
        queue_proxy |= s.queue_proxy;
        ready.extend(s.ready.iter().copied());
        terminating.extend(s.terminating.iter().copied());
        starting.extend(s.starting.iter().copied());
    }
    let terminating: BTreeSet<SocketAddr> = terminating.difference(&ready).copied().collect();
    let starting = starting
        .into_iter()
        .filter(|a| !ready.contains(a) && !terminating.contains(a))
        .collect();
    Merged {
        ready: ready.into_iter().collect(),
        terminating: terminating.into_iter().collect(),
        starting,
        queue_proxy,
    }
}

/// A revision's endpoints across its slices ([`merge`]), each list sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Merged {
    pub ready: Vec<SocketAddr>,
    pub terminating: Vec<SocketAddr>,
    pub starting: Vec<SocketAddr>,
    /// A slice's ready or starting endpoint runs Knative's queue-proxy.
    pub queue_proxy: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(ports: serde_json::Value, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Owns every endpoint; the pods at `.9` addresses run Knative's queue-proxy.
    struct KnativeAtNine;

    impl Ownership for KnativeAtNine {
        fn slice(&self, _: &EndpointSlice) -> Judged {
            Judged::Genuine
        }
        fn endpoint(&self, _: &Endpoint) -> Verdict {
            Verdict::Owned
        }
        fn sidecar(&self, ep: &Endpoint) -> PodStatsWire {
            if ep.addresses[0].ends_with(".9") {
                PodStatsWire::QueueProxy
            } else {
                PodStatsWire::Thaw
            }
        }
    }

    #[test]
    fn a_ready_or_starting_queue_proxy_pod_marks_the_revision() {
        let ports = serde_json::json!([{"name": "http", "port": 8012}]);
        let ep = |a: &str, ready: bool, terminating: bool| {
            serde_json::json!({"addresses": [a],
                "conditions": {"ready": ready, "terminating": terminating}})
        };
        let of = |endpoints| {
            owned_endpoints(
                &slice(ports.clone(), endpoints),
                Protocol::Http1,
                &KnativeAtNine,
            )
        };
        let thaw_only = of(serde_json::json!([ep("10.0.0.1", true, false)]));
        let ready = of(serde_json::json!([
            ep("10.0.0.1", true, false),
            ep("10.0.0.9", true, false)
        ]));
        let starting = of(serde_json::json!([ep("10.0.0.9", false, false)]));
        let leaving = of(serde_json::json!([ep("10.0.0.9", false, true)]));
        assert!(!thaw_only.queue_proxy);
        assert!(ready.queue_proxy && starting.queue_proxy);
        assert!(
            !leaving.queue_proxy,
            "a terminating pod takes no new request"
        );
        assert!(merge([&thaw_only, &starting]).queue_proxy);
        assert!(!merge([&thaw_only, &leaving]).queue_proxy);
    }

    #[test]
    fn port_follows_the_protocol() {
        let s = slice(
            serde_json::json!([
                {"name": "http", "port": 8012},
                {"name": "http2", "port": 8013, "appProtocol": "kubernetes.io/h2c"},
                {"name": "queue-adm", "port": 8022}
            ]),
            serde_json::json!([]),
        );
        assert_eq!(serving_port(&s, Protocol::Http1), Some(8012));
        assert_eq!(serving_port(&s, Protocol::H2c), Some(8013));
        // h2c by appProtocol alone, under another name.
        let s = slice(
            serde_json::json!([{"name": "grpc", "port": 9000, "appProtocol": "kubernetes.io/h2c"}]),
            serde_json::json!([]),
        );
        assert_eq!(serving_port(&s, Protocol::H2c), Some(9000));
        assert_eq!(serving_port(&s, Protocol::Http1), None);
    }

    #[test]
    fn conditions_sort_endpoints() {
        let s = slice(
            serde_json::json!([{"name": "http", "port": 8012}]),
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.4"],
                 "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["not-an-ip"], "conditions": {"ready": true}}
            ]),
        );
        let e = slice_endpoints(&s, Protocol::Http1);
        assert_eq!(
            e.ready.into_iter().collect::<Vec<_>>(),
            [addr("10.0.0.1:8012"), addr("10.0.0.2:8012")]
        );
        assert_eq!(
            e.terminating.into_iter().collect::<Vec<_>>(),
            [addr("10.0.0.4:8012")]
        );
        assert_eq!(
            e.starting.into_iter().collect::<Vec<_>>(),
            [addr("10.0.0.3:8012")]
        );
        // No serving port for the protocol: nothing.
        assert_eq!(
            slice_endpoints(&s, Protocol::H2c),
            SliceEndpoints::default()
        );
    }

    /// Judges each endpoint by its first address's last octet (1 owned, 2 terminating, 3 not
    /// the revision's pod, 4 elsewhere, 5 pending) and every slice as `slice`.
    struct Scripted(Judged);

    impl Ownership for Scripted {
        fn slice(&self, _: &EndpointSlice) -> Judged {
            self.0
        }
        fn endpoint(&self, ep: &Endpoint) -> Verdict {
            match ep.addresses[0].rsplit('.').next() {
                Some("1") => Verdict::Owned,
                Some("2") => Verdict::Terminating,
                Some("3") => Verdict::Foreign(Foreign::NotTheRevisions),
                Some("4") => Verdict::Foreign(Foreign::Address),
                _ => Verdict::Pending,
            }
        }
    }

    #[test]
    fn only_the_revisions_slices_and_endpoints_count() {
        let s = slice(
            serde_json::json!([{"name": "http", "port": 8012}]),
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.1.1"], "conditions": {"ready": true, "terminating": true}},
                // Its pod is being deleted: terminating though the slice says ready.
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": true}},
                {"addresses": ["10.0.1.3"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}
            ]),
        );
        let e = owned_endpoints(&s, Protocol::Http1, &Scripted(Judged::Genuine));
        assert_eq!(
            e.ready.iter().copied().collect::<Vec<_>>(),
            [addr("10.0.0.1:8012")]
        );
        assert_eq!(
            e.terminating.iter().copied().collect::<Vec<_>>(),
            [addr("10.0.0.2:8012"), addr("10.0.1.1:8012")]
        );
        assert!(e.starting.is_empty());
        assert_eq!(e.foreign.get(Foreign::NotTheRevisions), 2);
        assert_eq!(e.foreign.get(Foreign::Address), 1);
        assert_eq!(e.foreign.total(), 3);
        assert_eq!(e.ignored, None);
        // Foreign endpoints are tallied even when the slice has no port for the protocol.
        let e = owned_endpoints(&s, Protocol::H2c, &Scripted(Judged::Genuine));
        assert!(e.ready.is_empty() && e.terminating.is_empty());
        assert_eq!(e.foreign.total(), 3);
        // Not the private Service's slice: nothing of it, and why; pending: nothing.
        let why = Ignored::NotThePrivateService;
        let e = owned_endpoints(&s, Protocol::Http1, &Scripted(Judged::Ignored(why)));
        assert_eq!(
            e,
            SliceEndpoints {
                ignored: Some(why),
                ..SliceEndpoints::default()
            }
        );
        let e = owned_endpoints(&s, Protocol::Http1, &Scripted(Judged::Pending));
        assert_eq!(e, SliceEndpoints::default());
    }

    #[test]
    fn tallies_say_what_is_new() {
        let mut a = Tally::default();
        a.add(Foreign::Address);
        a.add(Foreign::Address);
        let mut b = Tally::default();
        b.add(Foreign::Address);
        b.add(Foreign::NoPod);
        let more = a.more_than(&b);
        assert_eq!(more.get(Foreign::Address), 1);
        assert_eq!(more.get(Foreign::NoPod), 0);
        let mut sum = more;
        sum.merge(&b);
        assert_eq!(sum.total(), 3);
    }

    #[test]
    fn merge_unions_and_deduplicates() {
        let a = SliceEndpoints {
            ready: [addr("10.0.0.1:80"), addr("10.0.0.2:80")].into(),
            terminating: [addr("10.0.0.9:80")].into(),
            starting: [addr("10.0.0.3:80"), addr("10.0.0.5:80")].into(),
            ..SliceEndpoints::default()
        };
        let b = SliceEndpoints {
            ready: [addr("10.0.0.2:80"), addr("10.0.0.3:80")].into(),
            terminating: [addr("10.0.0.1:80"), addr("10.0.0.6:80")].into(),
            starting: [addr("10.0.0.4:80"), addr("10.0.0.6:80")].into(),
            ..SliceEndpoints::default()
        };
        let Merged {
            ready,
            terminating,
            starting,
            ..
        } = merge([&a, &b]);
        assert_eq!(
            ready,
            [
                addr("10.0.0.1:80"),
                addr("10.0.0.2:80"),
                addr("10.0.0.3:80")
            ]
        );
        assert_eq!(terminating, [addr("10.0.0.6:80"), addr("10.0.0.9:80")]);
        // Ready or terminating elsewhere wins over starting.
        assert_eq!(starting, [addr("10.0.0.4:80"), addr("10.0.0.5:80")]);
    }
}
