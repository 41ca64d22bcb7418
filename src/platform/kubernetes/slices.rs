//! From a revision's private EndpointSlices to its endpoint sets: the port chosen by the
//! revision's protocol, `ready` and `terminating` from the slice conditions, merged across
//! every slice of the revision and deduplicated. Pure functions; the watch loop calls them.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::owners::Verdict;
use crate::revision::Protocol;

/// The appProtocol Kubernetes defines for HTTP/2 without TLS.
pub const APP_PROTOCOL_H2C: &str = "kubernetes.io/h2c";
/// The private Service's port name for HTTP/1 revisions.
pub const PORT_NAME_HTTP: &str = "http";
/// The private Service's port name for h2c revisions.
pub const PORT_NAME_HTTP2: &str = "http2";

/// The endpoints one slice contributes, already reduced to addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceEndpoints {
    /// Ready, not terminating.
    pub ready: BTreeSet<SocketAddr>,
    /// Terminating (whether or not still serving).
    pub terminating: BTreeSet<SocketAddr>,
    /// Not ready (starting, or failing its readiness probe) and not terminating.
    pub starting: BTreeSet<SocketAddr>,
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

/// One slice's endpoints for `protocol`. An endpoint is terminating when its condition says
/// so, ready when `ready` is true or unset (Kubernetes: "nil should be interpreted as
/// true") and it is not terminating, and starting otherwise (not ready yet, or failing its
/// readiness probe).
/// Addresses that do not parse as IPs (an FQDN slice) are skipped.
#[cfg(test)]
pub fn slice_endpoints(slice: &EndpointSlice, protocol: Protocol) -> SliceEndpoints {
    owned_endpoints(slice, protocol, &|_| Verdict::Owned).0
}

/// [`slice_endpoints`], keeping only the endpoints `verdict` finds [`Verdict::Owned`]; with
/// how many it found [`Verdict::Foreign`] (pending ones are left out, not counted).
pub fn owned_endpoints(
    slice: &EndpointSlice,
    protocol: Protocol,
    verdict: &dyn Fn(&Endpoint) -> Verdict,
) -> (SliceEndpoints, usize) {
    let mut out = SliceEndpoints::default();
    let mut foreign = 0;
    let Some(port) = serving_port(slice, protocol) else {
        return (out, foreign);
    };
    for ep in &slice.endpoints {
        match verdict(ep) {
            Verdict::Owned => {}
            Verdict::Foreign => {
                foreign += 1;
                continue;
            }
            Verdict::Pending => continue,
        }
        let cond = ep.conditions.as_ref();
        let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
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
    }
    (out, foreign)
}

/// Every slice of one revision merged: the union of `ready`, of `terminating` and of
/// `starting`, sorted and without duplicates. An address ready in one slice and terminating
/// or starting in another (a pod moving between slices) counts as ready; one terminating in
/// one and starting in another, as terminating.
pub fn merge<'a>(slices: impl IntoIterator<Item = &'a SliceEndpoints>) -> Merged {
    let mut ready = BTreeSet::new();
    let mut terminating = BTreeSet::new();
    let mut starting = BTreeSet::new();
    for s in slices {
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
    }
}

/// A revision's endpoints across its slices ([`merge`]), each list sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Merged {
    pub ready: Vec<SocketAddr>,
    pub terminating: Vec<SocketAddr>,
    pub starting: Vec<SocketAddr>,
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

    #[test]
    fn merge_unions_and_deduplicates() {
        let a = SliceEndpoints {
            ready: [addr("10.0.0.1:80"), addr("10.0.0.2:80")].into(),
            terminating: [addr("10.0.0.9:80")].into(),
            starting: [addr("10.0.0.3:80"), addr("10.0.0.5:80")].into(),
        };
        let b = SliceEndpoints {
            ready: [addr("10.0.0.2:80"), addr("10.0.0.3:80")].into(),
            terminating: [addr("10.0.0.1:80"), addr("10.0.0.6:80")].into(),
            starting: [addr("10.0.0.4:80"), addr("10.0.0.6:80")].into(),
        };
        let Merged {
            ready,
            terminating,
            starting,
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
