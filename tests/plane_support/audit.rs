//! thaw's API requests as the API server saw them: its audit log ([`Plane::audit_log`],
//! Metadata level, every request of a `system:serviceaccounts:thaw-system` user) read back
//! and filtered by user, verb, resource and time. What the cases count thaw's writes from,
//! whatever thaw's own counters say.
//!
//! A point in time is the wall clock ([`now`]); a request belongs to a span when the API
//! server received it within that span (`requestReceivedTimestamp`: the plane runs on the
//! test's own host, so both read the same clock). Each request is read from its
//! `ResponseComplete` event (or `Panic`), written before the response leaves the server
//! (`--audit-log-mode=blocking`, the default), so a request answered before a read is in it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::Plane;

/// The verbs that change something.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// The ServiceAccount user of thaw's `role` (`autoscaler`, `controller`, ...), as the API
/// server names it.
pub fn user(role: &str) -> String {
    format!("system:serviceaccount:thaw-system:{role}")
}

/// Now, as a point between requests.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// One request of a thaw ServiceAccount.
#[derive(Debug, Clone)]
pub struct Request {
    /// When the API server received it.
    pub at: Timestamp,
    pub user: String,
    /// The pod whose bound token it carried (`authentication.kubernetes.io/pod-name`); empty
    /// for a token not bound to a pod.
    pub pod: String,
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
}

impl Request {
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }

    /// A Lease (leader election: a leader renews its Lease every retry period, a write that
    /// leading consists of).
    pub fn is_lease(&self) -> bool {
        self.group == "coordination.k8s.io" && self.resource == "leases"
    }

    /// A write of a `/scale` subresource (the autoscaler's replica count).
    pub fn is_scale_write(&self) -> bool {
        self.is_write() && self.subresource == "scale"
    }

    /// A write of an EndpointSlice (the autoscaler writes only revisions' public slices).
    pub fn is_slice_write(&self) -> bool {
        self.is_write() && self.group == "discovery.k8s.io" && self.resource == "endpointslices"
    }

    /// `verb group/resource[/subresource]`, e.g. `patch apps/deployments/scale`.
    pub fn kind(&self) -> String {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!("{} {group}/{}{sub}", self.verb, self.resource)
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}/{} by {} ({}): {}",
            self.at,
            self.kind(),
            self.namespace,
            self.name,
            self.user.rsplit(':').next().unwrap_or_default(),
            self.pod,
            self.code
        )
    }
}

/// Every request in the audit log, in the order the server completed them.
pub fn requests(plane: &Plane) -> Vec<Request> {
    let text = std::fs::read_to_string(&plane.audit_log).unwrap_or_default();
    text.lines().filter_map(parse).collect()
}

fn parse(line: &str) -> Option<Request> {
    let e: serde_json::Value = serde_json::from_str(line).ok()?;
    let stage = e["stage"].as_str()?;
    if stage != "ResponseComplete" && stage != "Panic" {
        return None;
    }
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let o = &e["objectRef"];
    Some(Request {
        at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        user: s(&e["user"]["username"]),
        pod: s(&e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]),
        verb: s(&e["verb"]),
        group: s(&o["apiGroup"]),
        resource: s(&o["resource"]),
        subresource: s(&o["subresource"]),
        namespace: s(&o["namespace"]),
        name: s(&o["name"]),
        code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
    })
}

/// The writes of `role`'s ServiceAccount received in `[from, to]`, Leases aside (a leader
/// renews its Lease every retry period: that write is its leading, not its work).
pub fn writes(plane: &Plane, role: &str, from: Timestamp, to: Timestamp) -> Writes {
    let user = user(role);
    Writes {
        role: role.to_string(),
        span: (from, to),
        requests: requests(plane)
            .into_iter()
            .filter(|r| r.user == user && r.is_write() && !r.is_lease())
            .filter(|r| r.at >= from && r.at <= to)
            .collect(),
    }
}

/// When `role`'s ServiceAccount last wrote something other than a Lease, if ever.
pub fn last_write(plane: &Plane, role: &str) -> Option<Timestamp> {
    let user = user(role);
    requests(plane)
        .into_iter()
        .filter(|r| r.user == user && r.is_write() && !r.is_lease())
        .map(|r| r.at)
        .max()
}

/// Whether none of `roles` has written anything but its Lease for `quiet` up to now.
pub fn quiet_for(plane: &Plane, roles: &[&str], quiet: Duration) -> bool {
    let since = now() - quiet;
    roles
        .iter()
        .all(|r| last_write(plane, r).is_none_or(|at| at < since))
}

/// Some writes of one role between two points.
#[derive(Debug, Clone)]
pub struct Writes {
    pub role: String,
    pub span: (Timestamp, Timestamp),
    pub requests: Vec<Request>,
}

impl Writes {
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// `/scale` writes.
    pub fn scale(&self) -> usize {
        self.requests.iter().filter(|r| r.is_scale_write()).count()
    }

    /// EndpointSlice writes.
    pub fn slices(&self) -> usize {
        self.requests.iter().filter(|r| r.is_slice_write()).count()
    }

    /// The writes made with the token of `pod`.
    pub fn by_pod(&self, pod: &str) -> Writes {
        Writes {
            requests: self
                .requests
                .iter()
                .filter(|r| r.pod == pod)
                .cloned()
                .collect(),
            ..self.clone()
        }
    }

    /// How many of each [`Request::kind`].
    pub fn kinds(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for r in &self.requests {
            *out.entry(r.kind()).or_insert(0) += 1;
        }
        out
    }
}

impl fmt::Display for Writes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = (self.span.1 - self.span.0)
            .total(k8s_openapi::jiff::Unit::Second)
            .unwrap_or(0.0);
        write!(
            f,
            "{} writes by {} over {secs:.1}s (Leases aside): {} /scale, {} EndpointSlice",
            self.len(),
            self.role,
            self.scale(),
            self.slices()
        )?;
        for (kind, n) in self.kinds() {
            write!(f, "\n    {n:>4} {kind}")?;
        }
        for r in self.requests.iter().take(20) {
            write!(f, "\n    {r}")?;
        }
        Ok(())
    }
}
