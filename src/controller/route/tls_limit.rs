//! The bound on each namespace's TLS hosts on the shared gateway (config-istio's or
//! config-gateway's `max-tls-hosts-per-namespace`, default 8): one namespace cannot fill the
//! shared Gateway's 64 listeners, nor send the cluster's issuer more than that many
//! Certificates.
//!
//! - **What counts** ([`placement`]): the namespace's TLS hosts of other owners, read from the
//!   API server (not a store that may lag): the Certificates a Route or DomainMapping of the
//!   namespace controls (each its one host, ready or not), the listeners thaw wrote for the
//!   namespace on config-gateway's external Gateways (the Gateway API class), or the Secret
//!   copies of the namespace's certificates in config-istio's gateway namespaces (the Istio
//!   class) — these two also count a DomainMapping's own `spec.tls` Secret, which has no
//!   Certificate.
//! - **Who gets a place** ([`choose`]): an owner's hosts that already have one (a
//!   Certificate, a listener or a copy) keep it, whatever the bound is now; then its other
//!   hosts in their order (a Route's default host first, then its tags by name) while the
//!   namespace is under the bound and, with the Gateway API, while each external Gateway has
//!   room (64 listeners at most, [`MAX_LISTENERS_PER_GATEWAY`]). A host without a place gets
//!   no Certificate and no listener or copy: it is served over http as while its certificate
//!   is pending (Knative's `HTTPDowngrade`), whatever `http-protocol` says, and the owner is
//!   `CertificateProvisioned=False` [`super::certificate::TLS_HOST_LIMIT_EXCEEDED`] naming
//!   the bound. It is checked again at the owner's next reconcile (within a minute,
//!   [`recheck`]): a place freed is taken then.
//! - **One namespace at a time** ([`lock`]): the reconciles of one namespace's TLS owners
//!   (Routes and DomainMappings) count and write under one lock of their controller (its
//!   [`Ctx`]: one per process, shared by both reconcilers), so two of them cannot both take
//!   the last place; only the leader reconciles. A deleted owner's TLS
//!   is taken away under it too, after [`forget`]: a reconcile of it still waiting for the
//!   lock then writes nothing ([`forgotten`]).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock, Mutex as StdMutex, Weak};

use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, ListParams};

use super::certificate::Certificate;
use super::http_route::Gateway as ApiGateway;
use super::istio_tls;
use super::tls_owner::{TlsOwner, Whose, is_namespace_listener, whose};
use crate::config::network::{
    IngressClass, MAX_LISTENERS_PER_GATEWAY, NetworkConfig, TLS_HOSTS_KEY, TlsHostLimit,
};
use crate::controller::{Ctx, Error};

/// A host the bound leaves without TLS, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub host: String,
    /// The bound it met, for the owner's `CertificateProvisioned` message.
    pub message: String,
}

/// Which of an owner's hosts get TLS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Admission {
    /// In the order asked.
    pub admitted: Vec<String>,
    pub limited: Vec<Limited>,
}

impl Admission {
    pub fn admits(&self, host: &str) -> bool {
        self.admitted.iter().any(|h| h == host)
    }
}

/// The namespace's TLS hosts on the shared gateway, as one owner sees them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// Other owners' hosts (or, for a copy that does not say its hosts, its origin).
    pub others: BTreeSet<String>,
    /// The owner's hosts that have a Certificate, a listener or a copy.
    pub own: BTreeSet<String>,
    /// With the Gateway API: the fewest listeners any external Gateway has room for besides
    /// the owner's, and that Gateway (`namespace/name`).
    pub room: Option<(usize, String)>,
}

/// Which of `wanted` (the owner's hosts, in order) get TLS (the module doc). Pure.
pub fn choose(
    wanted: &[String],
    placed: &Placement,
    limit: TlsHostLimit,
    namespace: &str,
) -> Admission {
    let kept: Vec<&String> = wanted.iter().filter(|h| placed.own.contains(*h)).collect();
    let bound = limit.per_namespace as usize;
    let mut free_ns = bound.saturating_sub(placed.others.len() + kept.len());
    let mut free_gw = placed
        .room
        .as_ref()
        .map(|(r, g)| (r.saturating_sub(kept.len()), g));
    let mut out = Admission::default();
    for host in wanted {
        if kept.contains(&host) {
            out.admitted.push(host.clone());
            continue;
        }
        if free_ns == 0 {
            out.limited.push(Limited {
                host: host.clone(),
                message: format!(
                    "namespace {namespace} has its {bound} TLS hosts ({}'s {TLS_HOSTS_KEY})",
                    limit.config_map
                ),
            });
            continue;
        }
        if let Some((0, gw)) = &free_gw {
            out.limited.push(Limited {
                host: host.clone(),
                message: format!(
                    "the Gateway {gw} has no room for another listener ({MAX_LISTENERS_PER_GATEWAY} \
                     at most)"
                ),
            });
            continue;
        }
        free_ns -= 1;
        if let Some((r, _)) = &mut free_gw {
            *r -= 1;
        }
        out.admitted.push(host.clone());
    }
    out
}

/// Which of `wanted` (the owner's external hosts in order) get TLS. Call under
/// [`lock`]`(owner.namespace)`, and write what is admitted before letting it go.
pub async fn admit(
    ctx: &Ctx,
    net: &NetworkConfig,
    owner: &TlsOwner,
    wanted: &[String],
) -> Result<Admission, Error> {
    let placed = placement(ctx, net, owner).await?;
    Ok(choose(
        wanted,
        &placed,
        net.tls_host_limit(),
        &owner.namespace,
    ))
}

/// Whether `e` means the kind is not served (404) or not ours to read (403): the shared
/// object is then not counted (the writer reports a 403 itself).
fn unreadable(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 403)
}

/// The namespace's TLS hosts on the shared gateway (the module doc), read from the API server.
pub async fn placement(
    ctx: &Ctx,
    net: &NetworkConfig,
    owner: &TlsOwner,
) -> Result<Placement, Error> {
    let ns = &owner.namespace;
    let mut p = Placement::default();
    // Certificates of other owners' Secrets: a copy of one is counted by its Certificate.
    let mut counted_secrets = BTreeSet::new();
    let certs = match ctx
        .api::<Certificate>(ns)
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(e) if unreadable(&e) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for c in certs {
        let Some(by) = c.owner_references().iter().find(|o| {
            o.controller == Some(true)
                && o.api_version.starts_with("serving.knative.dev/")
                && matches!(o.kind.as_str(), "Route" | "DomainMapping")
        }) else {
            continue;
        };
        if by.uid == owner.uid {
            p.own.extend(c.spec.dns_names.iter().cloned());
        } else {
            p.others.extend(c.spec.dns_names.iter().cloned());
            counted_secrets.insert(c.spec.secret_name.clone());
        }
    }
    match net.templates.ingress_class {
        IngressClass::GatewayApi => {
            let ar = ApiResource::erase::<ApiGateway>(&());
            for g in &net.gateway.external_gateways {
                let api = kube::Api::<DynamicObject>::namespaced_with(
                    ctx.client.clone(),
                    &g.gateway.namespace,
                    &ar,
                );
                let gw = match api.get_opt(&g.gateway.name).await {
                    Ok(Some(gw)) => gw,
                    Ok(None) => continue,
                    Err(e) if unreadable(&e) => continue,
                    Err(e) => return Err(e.into()),
                };
                let listeners = gw.data["spec"]["listeners"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let mut not_own = 0;
                for l in &listeners {
                    let host = l["hostname"].as_str().unwrap_or_default().to_string();
                    match whose(l, owner) {
                        Whose::Ours | Whose::Legacy => {
                            p.own.insert(host);
                        }
                        Whose::Theirs => {
                            not_own += 1;
                            if is_namespace_listener(l, ns) {
                                p.others.insert(host);
                            }
                        }
                    }
                }
                let room = (MAX_LISTENERS_PER_GATEWAY as usize).saturating_sub(not_own);
                if p.room.as_ref().is_none_or(|(r, _)| room < *r) {
                    p.room = Some((room, g.gateway.to_string()));
                }
            }
        }
        IngressClass::Istio => {
            let mut seen = BTreeSet::new();
            for g in &net.istio.external_gateways {
                let Some((_, gw_ns)) = istio_tls::service_of(&g.service) else {
                    continue;
                };
                if !seen.insert(gw_ns) {
                    continue;
                }
                let copies = match istio_tls::list_copies(ctx, gw_ns, ns).await {
                    Ok(c) => c,
                    Err(e) if unreadable(&e) => continue,
                    Err(e) => return Err(e.into()),
                };
                for c in copies {
                    let hosts = istio_tls::copy_hosts(&c.metadata);
                    if istio_tls::is_owners_copy(&c.metadata, owner) {
                        p.own.extend(hosts);
                    } else if !hosts.is_empty() {
                        p.others.extend(hosts);
                    } else if let Some(origin) =
                        c.labels().get(istio_tls::ORIGIN_SECRET_NAME).cloned()
                        && !counted_secrets.contains(&origin)
                    {
                        // An older copy (no hosts said) of a Secret no Certificate counts.
                        p.others.insert(format!("Secret {ns}/{origin}"));
                    }
                }
            }
        }
    }
    // A host that is both (a domain another owner also names) counts once, as the owner's.
    let own = p.own.clone();
    p.others.retain(|h| !own.contains(h));
    Ok(p)
}

/// A controller's key: its context's address (one per controller; tests run several in one
/// process, each with its own API server).
fn controller_key(ctx: &Ctx) -> usize {
    std::ptr::from_ref(ctx) as usize
}

/// The locks of the namespaces whose TLS is being reconciled now, per controller (an entry
/// lives while its lock is held or awaited).
type Locks = HashMap<(usize, String), Weak<tokio::sync::Mutex<()>>>;
static LOCKS: LazyLock<StdMutex<Locks>> = LazyLock::new(|| StdMutex::new(HashMap::new()));

/// Holds the TLS of one namespace: its owners' reconciles count and write one at a time.
pub struct NamespaceLock {
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

/// Waits for the lock of `namespace`'s TLS in the controller of `ctx` (the module doc).
/// Unbounded in time only as the holder's reconcile is (each API call has the client's
/// timeout; the holders wait for no watch).
pub async fn lock(ctx: &Ctx, namespace: &str) -> NamespaceLock {
    let key = (controller_key(ctx), namespace.to_string());
    let m = {
        let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
        locks.retain(|_, w| w.strong_count() > 0);
        match locks.get(&key).and_then(Weak::upgrade) {
            Some(m) => m,
            None => {
                let m = Arc::new(tokio::sync::Mutex::new(()));
                locks.insert(key, Arc::downgrade(&m));
                m
            }
        }
    };
    NamespaceLock {
        _guard: m.lock_owned().await,
    }
}

/// The UIDs of owners deleted lately whose TLS was taken away ([`forget`]): a reconcile that
/// read such an owner before its deletion and waited for the lock writes nothing. At most
/// [`FORGOTTEN_CAP`], the oldest dropped first.
type Forgotten = (VecDeque<(usize, String)>, HashSet<(usize, String)>);
static FORGOTTEN: LazyLock<StdMutex<Forgotten>> =
    LazyLock::new(|| StdMutex::new((VecDeque::new(), HashSet::new())));

/// How many deleted owners [`forgotten`] remembers (a reconcile waits for the lock for less
/// time than it takes to delete this many).
pub const FORGOTTEN_CAP: usize = 4096;

/// Remembers that the owner of UID `uid` is deleted: call before taking its namespace's lock
/// to remove its TLS.
pub fn forget(ctx: &Ctx, uid: &str) {
    let key = (controller_key(ctx), uid.to_string());
    let mut f = FORGOTTEN.lock().unwrap_or_else(|p| p.into_inner());
    if f.1.insert(key.clone()) {
        f.0.push_back(key);
        if f.0.len() > FORGOTTEN_CAP
            && let Some(old) = f.0.pop_front()
        {
            f.1.remove(&old);
        }
    }
}

/// Whether the owner of UID `uid` was deleted and its TLS taken away ([`forget`]).
pub fn forgotten(ctx: &Ctx, uid: &str) -> bool {
    FORGOTTEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .1
        .contains(&(controller_key(ctx), uid.to_string()))
}

/// When an owner whose TLS is limited, or has Secret copies, is reconciled again: a uniform
/// draw between 3/4 of `period` and `period` (so owners spread out), never after `resync`.
pub fn recheck(period: std::time::Duration, resync: std::time::Duration) -> std::time::Duration {
    let f: f64 = rand::random_range(0.75..=1.0);
    period.mul_f64(f).min(resync)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i:02}")).collect()
    }

    fn limit(n: u32) -> TlsHostLimit {
        TlsHostLimit {
            per_namespace: n,
            config_map: "config-gateway",
        }
    }

    #[test]
    fn the_first_hosts_in_order_get_places_up_to_the_bound() {
        let want = hosts(71);
        let a = choose(&want, &Placement::default(), limit(8), "team");
        assert_eq!(a.admitted, want[..8]);
        assert_eq!(a.limited.len(), 63);
        assert_eq!(a.limited[0].host, "h08");
        assert!(
            a.limited[0].message.contains(
                "namespace team has its 8 TLS hosts (config-gateway's max-tls-hosts-per-namespace)"
            ),
            "{}",
            a.limited[0].message
        );
        // Under the bound, every host.
        let a = choose(&hosts(3), &Placement::default(), limit(8), "team");
        assert_eq!(a.admitted.len(), 3);
        assert!(a.limited.is_empty());
    }

    #[test]
    fn placed_hosts_keep_their_place_and_others_count() {
        let want = hosts(10);
        // Another owner has 5 of the namespace's 8: 3 left.
        let mut placed = Placement {
            others: (0..5).map(|i| format!("other{i}")).collect(),
            ..Placement::default()
        };
        let a = choose(&want, &placed, limit(8), "team");
        assert_eq!(a.admitted, want[..3]);
        // The owner's last host was placed before (a lower bound, or a full namespace now):
        // it keeps its place, and the first ones fill what is left.
        placed.own.insert("h09".into());
        let a = choose(&want, &placed, limit(8), "team");
        assert_eq!(a.admitted, ["h00", "h01", "h09"]);
        // The bound lowered below what is placed: placed hosts stay, nothing new.
        placed.others = (0..20).map(|i| format!("other{i}")).collect();
        let a = choose(&want, &placed, limit(8), "team");
        assert_eq!(a.admitted, ["h09"]);
    }

    #[test]
    fn a_gateway_never_gets_more_than_64_listeners() {
        let want = hosts(8);
        let placed = Placement {
            room: Some((2, "istio-system/knative-gateway".into())),
            ..Placement::default()
        };
        let a = choose(&want, &placed, limit(8), "team");
        assert_eq!(a.admitted, want[..2]);
        assert!(
            a.limited[0]
                .message
                .contains("the Gateway istio-system/knative-gateway has no room"),
            "{}",
            a.limited[0].message
        );
    }

    #[test]
    fn a_recheck_is_jittered_within_the_period_and_the_resync() {
        let p = std::time::Duration::from_secs(60);
        for _ in 0..100 {
            let d = recheck(p, std::time::Duration::from_secs(36_000));
            assert!(d >= p.mul_f64(0.75) && d <= p, "{d:?}");
        }
        assert_eq!(
            recheck(p, std::time::Duration::from_secs(1)),
            std::time::Duration::from_secs(1)
        );
    }

    fn ctx() -> Arc<Ctx> {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap();
        Ctx::new(client, crate::controller::Settings::default())
    }

    #[tokio::test]
    async fn a_deleted_owner_is_remembered_boundedly_per_controller() {
        let (a, b) = (ctx(), ctx());
        forget(&a, "u-deleted");
        assert!(forgotten(&a, "u-deleted"));
        assert!(!forgotten(&b, "u-deleted"), "another controller's");
        assert!(!forgotten(&a, "u-alive"));
        for i in 0..FORGOTTEN_CAP {
            forget(&a, &format!("u-{i}"));
        }
        assert!(!forgotten(&a, "u-deleted"), "the oldest is dropped");
        assert!(FORGOTTEN.lock().unwrap().0.len() <= FORGOTTEN_CAP);
    }

    #[tokio::test]
    async fn one_namespace_at_a_time_others_free() {
        let (c, other) = (ctx(), ctx());
        let a = lock(&c, "a").await;
        // Another namespace's lock is free, and another controller's of the same namespace.
        let b = tokio::time::timeout(std::time::Duration::from_secs(5), lock(&c, "b")).await;
        assert!(b.is_ok());
        let o = tokio::time::timeout(std::time::Duration::from_secs(5), lock(&other, "a")).await;
        assert!(o.is_ok());
        // The same namespace waits for the holder.
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), lock(&c, "a")).await;
        assert!(again.is_err());
        drop(a);
        let again = tokio::time::timeout(std::time::Duration::from_secs(5), lock(&c, "a")).await;
        assert!(again.is_ok());
    }
}
