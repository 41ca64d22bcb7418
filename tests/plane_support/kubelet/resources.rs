//! Resources as the downward API and the QoS class read them: quantities, the
//! `resourceFieldRef` values, and the class of a pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::env::Failure;

/// The node's allocatable cpu and memory: limits a container does not set are these in the
/// downward API, as the kubelet defaults them (`defaultPodLimitsForDownwardAPI`).
pub(super) const ALLOCATABLE_CPU: &str = "2";
pub(super) const ALLOCATABLE_MEMORY: &str = "24Gi";

/// A `resourceFieldRef`'s value: the named container's (default this one) request or limit
/// (an unset limit is the node's allocatable), divided by `divisor` (default 1) and rounded
/// up, as the kubelet does (so cpu with no divisor is whole cores).
pub(super) fn resource_ref(
    pod: &Pod,
    c: &Container,
    r: &ResourceFieldSelector,
) -> Result<String, Failure> {
    let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
        None => c,
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|x| x.name == name)
            .ok_or_else(|| Failure::config(format!("container {name} not found in the pod")))?,
    };
    let res = target.resources.as_ref();
    let get = |limits: bool, name: &str| -> Option<String> {
        let m = if limits {
            res.and_then(|r| r.limits.as_ref())
        } else {
            res.and_then(|r| r.requests.as_ref())
        };
        m.and_then(|m| m.get(name)).map(|q| q.0.clone())
    };
    let divisor = r
        .divisor
        .as_ref()
        .map(|q| q.0.as_str())
        .filter(|d| !d.is_empty())
        .unwrap_or("1");
    let div = parse_quantity(divisor)
        .filter(|d| *d > 0.0)
        .ok_or_else(|| Failure::config(format!("invalid divisor {divisor:?}")))?;
    let (quantity, cpu) = match r.resource.as_str() {
        "limits.cpu" => (get(true, "cpu").unwrap_or(ALLOCATABLE_CPU.into()), true),
        "limits.memory" => (
            get(true, "memory").unwrap_or(ALLOCATABLE_MEMORY.into()),
            false,
        ),
        "requests.cpu" => (get(false, "cpu").unwrap_or("0".into()), true),
        "requests.memory" => (get(false, "memory").unwrap_or("0".into()), false),
        "limits.ephemeral-storage" => (get(true, "ephemeral-storage").unwrap_or("0".into()), false),
        "requests.ephemeral-storage" => {
            (get(false, "ephemeral-storage").unwrap_or("0".into()), false)
        }
        other => {
            return Err(Failure::config(format!(
                "unsupported container resource: {other}"
            )));
        }
    };
    let q = parse_quantity(&quantity)
        .ok_or_else(|| Failure::config(format!("invalid quantity {quantity:?}")))?;
    // The kubelet divides MilliValue()s for cpu and Value()s otherwise, each rounded up.
    let v = if cpu {
        ((q * 1000.0).ceil() / (div * 1000.0).ceil()).ceil()
    } else {
        (q.ceil() / div.ceil()).ceil()
    };
    Ok(format!("{}", v as i64))
}

/// A Kubernetes quantity ("100m", "1.5Gi", "2e3") in base units; `None` if malformed.
pub(super) fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let end = s
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.' || ch == '+' || ch == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

/// The QoS class: the API server's (set at creation) when present, else computed as
/// Kubernetes does for cpu and memory.
pub(super) fn qos(pod: &Pod) -> String {
    if let Some(q) = pod.status.as_ref().and_then(|s| s.qos_class.clone()) {
        return q;
    }
    let spec = pod.spec.as_ref();
    let all = spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    let (mut any, mut guaranteed) = (false, true);
    for c in all {
        let r = c.resources.as_ref();
        for res in ["cpu", "memory"] {
            let get = |m: Option<&BTreeMap<String, Quantity>>| {
                m.and_then(|m| m.get(res))
                    .and_then(|q| parse_quantity(&q.0))
                    .filter(|v| *v > 0.0)
            };
            let (req, lim) = (
                get(r.and_then(|r| r.requests.as_ref())),
                get(r.and_then(|r| r.limits.as_ref())),
            );
            any |= req.is_some() || lim.is_some();
            guaranteed &= lim.is_some() && req.is_none_or(|q| Some(q) == lim);
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
    .into()
}
