//! Route → Istio VirtualService + placeholder Services (Knative's `route.go`, with net-istio's
//! VirtualService written directly: there is no KIngress in between), and the labeler.
//!
//! One reconcile:
//! 0. validates the route (Knative's webhook rules, [`crate::knative::validate::route`]): an
//!    invalid one is `AllTrafficAssigned=False InvalidSpec` with the fields named, nothing is
//!    written but its status, and it is not retried until it changes;
//! 1. resolves the traffic ([`traffic`]) from the Revisions and Configurations in the
//!    controller's stores;
//! 2. when every target is routable: applies the placeholder Services and the two
//!    VirtualServices, `{route}-ingress` and `{route}-mesh` ([`resources`]), each only if
//!    absent or ours (else `IngressReady=False NotOwned`), deletes placeholder Services of
//!    tags no longer named, and asks the [`prober`] whether every gateway pod serves the
//!    VirtualService's current hash; when a target is missing or not
//!    ready, `AllTrafficAssigned` says why (Knative's reasons) and the ingress keeps the last
//!    traffic it was given — so a rollout moves only once the new revision is Ready;
//! 3. marks the revisions and configurations the route uses ([`labeler`]);
//! 4. writes the status (url, address, traffic, conditions) when it changed.
//!
//! A deleted Route is taken off the revisions and configurations it marked (the labeler's
//! cleanup, fed by the Route watch's deletions and by any revision or configuration the
//! stores see listing a route that no longer exists, so a labeler patch the store had not
//! seen when the deletion came is still undone; its children go with it by owner reference).
//!
//! `IngressReady` is True once every pod of every gateway the route is on answers a probe
//! with the route's current hash (net-istio's prober, [`prober`]); until then it is Unknown
//! `Uninitialized`, the message naming what does not answer yet. When the API server does not
//! serve Istio's VirtualService (its CRD is not installed), no route can be programmed:
//! `IngressReady=False` [`VIRTUAL_SERVICE_NOT_SERVED`], the reconcile ends at once (its worker
//! is free), and every route is reconciled again once the VirtualService watch lists (the
//! CRD appeared). `CertificateProvisioned` is True `TLSNotEnabled` unless config-network's
//! `external-domain-tls` is Enabled: then the route's external hosts get cert-manager
//! Certificates ([`certificate`]), each host is served over https (and `https://` in the
//! URLs) once its Certificate is Ready, the Istio class writing a TLS Gateway and copying the
//! Secrets into the gateway's namespace ([`istio_tls`]), the Gateway API class adding
//! listeners to the shared Gateways ([`gateway_tls`]); names in shared places derive from the
//! route's UID ([`tls_owner`]), and each namespace's TLS hosts are bounded
//! ([`tls_limit`]: the reconciles of one namespace's TLS owners take its lock, count what the
//! namespace holds and write under it). A route with Secret copies, or with a host the bound
//! left without TLS, is re-queued within a minute (jittered) rather than at the resync: its
//! copies follow their origins, and a place freed is taken.
//!
//! The controller re-queues a route when its VirtualService or placeholder Services change
//! (owned), and when a Revision or Configuration it refers to changes (the stores' streams
//! mapped to the routes that name them), so a revision turning Ready or a configuration's
//! latest ready revision moving re-routes at once.

pub mod certificate;
pub mod gateway_api;
pub mod gateway_tls;
pub mod http_route;
pub mod ingress;
pub mod istio_tls;
pub mod labeler;
pub mod prober;
pub mod resources;
pub mod tls_limit;
pub mod tls_owner;
pub mod traffic;
pub mod virtual_service;

#[cfg(test)]
mod fixtures;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service as KubeService;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::informers::Informer;
use super::{Ctx, Error, EventKind, is_owned_by, now};
use crate::config::network::{IngressClass, NetworkConfig};
use crate::knative::duck::{Condition, ConditionStatus};
use crate::knative::names::labels;
use crate::knative::{Configuration, Revision, Route, RouteStatus, condition, validate};
use certificate::{Certificate, TlsOutcome};
use http_route::HTTPRoute;
use tls_owner::TlsOwner;
use traffic::{Referenced, TargetError, Traffic};
use virtual_service::VirtualService;

/// The kind, in metrics and spans.
pub const KIND: &str = "Route";

/// Knative's ingress class for Istio (config-network's `ingress-class` default).
pub const ISTIO_INGRESS_CLASS: &str = crate::config::network::ISTIO_INGRESS_CLASS;
/// The CRD the Istio ingress class writes.
pub const VIRTUAL_SERVICE_CRD: &str = "virtualservices.networking.istio.io";
/// `IngressReady=False`'s reason when the API server does not serve VirtualServices.
pub const VIRTUAL_SERVICE_NOT_SERVED: &str = "VirtualServiceNotServed";

/// The longest a reconcile waits for the VirtualService watch's first answer.
pub const SERVED_WAIT: tokio::time::Duration = tokio::time::Duration::from_secs(10);

pub use super::informers::{Served, not_served};

/// Knative's Route condition types.
pub mod conditions {
    pub const ALL_TRAFFIC_ASSIGNED: &str = "AllTrafficAssigned";
    pub const INGRESS_READY: &str = "IngressReady";
    pub const CERTIFICATE_PROVISIONED: &str = "CertificateProvisioned";
}

/// What the controller follows (one watch each), read by every reconcile: the Revisions and
/// Configurations routes refer to, and the children (VirtualServices, and the Services
/// labelled `serving.knative.dev/route`), so an unchanged child costs no API call.
#[derive(Clone)]
pub struct Stores {
    pub revisions: Store<Revision>,
    pub configurations: Store<Configuration>,
    pub virtual_services: Store<VirtualService>,
    /// The Gateway API class's HTTPRoutes (labelled `serving.knative.dev/route`).
    pub http_routes: Store<HTTPRoute>,
    pub placeholders: Store<KubeService>,
    /// Open once the revisions, configurations and placeholders stores have their first list
    /// ([`Stores::gate`]); the VirtualServices' store is [`Stores::served`]'s.
    pub ready: super::StoresReady,
    /// Whether VirtualServices are served (their store has listed) or missing.
    pub served: tokio::sync::watch::Receiver<Served>,
    /// Whether HTTPRoutes are served (their store has listed) or missing.
    pub http_routes_served: tokio::sync::watch::Receiver<Served>,
    /// Whether the gateways serve each route's current VirtualServices.
    pub prober: Arc<prober::Prober>,
    /// cert-manager's Certificates (the routes' own, by owner).
    pub certificates: Store<Certificate>,
    /// Whether Certificates are served (cert-manager is installed) or missing.
    pub certificates_served: tokio::sync::watch::Receiver<Served>,
}

impl Stores {
    /// Returns once every store has its first list (at once after that). Any number of tasks
    /// may wait here at once (see [`super::StoresReady`]).
    pub async fn wait_until_ready(&self) -> Result<(), Error> {
        self.ready.wait().await
    }

    /// The gate of the three watches of kinds every cluster serves: open once each has
    /// listed. (The VirtualServices' watch is not in it: without Istio's CRD it never lists,
    /// and the reconciles must go on to say so.)
    pub fn gate(
        revisions: &Informer<Revision>,
        configurations: &Informer<Configuration>,
        placeholders: &Informer<KubeService>,
    ) -> super::StoresReady {
        let (r, c, p) = (
            revisions.clone(),
            configurations.clone(),
            placeholders.clone(),
        );
        super::StoresReady::spawn(
            "Revisions, Configurations and placeholder Services",
            async move {
                r.listed().await?;
                c.listed().await?;
                p.listed().await
            },
        )
    }

    /// Whether the ingress class's kind is served, once its watch has an answer (its first
    /// list, or a 404). Waits at most [`SERVED_WAIT`]: a watch failing otherwise (the API
    /// server away, a 403) is an error, retried with backoff, the worker freed.
    async fn served(&self, class: IngressClass) -> Result<Served, Error> {
        match class {
            IngressClass::Istio => wait_served(self.served.clone(), "VirtualService").await,
            IngressClass::GatewayApi => {
                wait_served(self.http_routes_served.clone(), "HTTPRoute").await
            }
        }
    }
}

/// Whether a kind is served, once its watch has an answer (its first list, or a 404). Waits
/// at most [`SERVED_WAIT`]: a watch failing otherwise (the API server away, a 403) is an
/// error, retried with backoff, the worker freed.
pub(crate) async fn wait_served(
    mut rx: tokio::sync::watch::Receiver<Served>,
    kind: &str,
) -> Result<Served, Error> {
    let s = tokio::time::timeout(SERVED_WAIT, rx.wait_for(|s| *s != Served::Unknown))
        .await
        .map_err(|_| Error::Other(format!("the {kind} watch has not listed yet")))?
        .map_err(|_| Error::Other(format!("the {kind} watch ended")))?;
    Ok(*s)
}

/// What the status says about the ingress, from the writes of this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingress {
    /// The ingress objects are written and ready (the Gateway API class: their status says
    /// so).
    Programmed,
    /// The VirtualServices and placeholder Services are written and every gateway pod
    /// answered with their hash (kept in the status, [`PROBED_HASH_ANNOTATION`]).
    Probed(String),
    /// Written; not every gateway pod serves them yet: the message says which.
    Probing(String),
    /// The API server does not serve Istio's VirtualService.
    NotServed,
    /// The API server does not serve the Gateway API's HTTPRoute.
    HttpRoutesNotServed,
    /// A gateway refuses the route's HTTPRoute: its reason and message.
    Refused { reason: String, message: String },
    /// Not written this time (a target is not routable): the condition stays as it was, or
    /// Unknown `IngressNotConfigured` when there is none yet.
    Unchanged,
    /// An object of that name exists and is not the route's: the NotOwned message.
    NotOwned(String),
}

fn condition(
    type_: &str,
    status: ConditionStatus,
    reason: Option<&str>,
    message: Option<String>,
) -> Condition {
    Condition {
        reason: reason.map(Into::into),
        message,
        ..Condition::new(type_, status)
    }
}

/// The route's next status from the previous one, the traffic outcome and the ingress
/// outcome. Pure; `now` stamps the conditions that change.
pub fn compute_status(
    route: &Route,
    resolved: &Result<Traffic, TargetError>,
    ingress: &Ingress,
    tls: Option<&TlsOutcome>,
    net: &NetworkConfig,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> RouteStatus {
    use conditions::*;
    let mut st = route.status.clone().unwrap_or_default();
    // The hosts served over https: those of ready Certificates; when the TLS was not
    // reconciled this time (the traffic did not resolve), those the status said.
    let before_https: Vec<String> = st
        .fields
        .url
        .iter()
        .chain(st.fields.traffic.iter().filter_map(|t| t.url.as_ref()))
        .filter_map(|u| u.strip_prefix("https://").map(String::from))
        .collect();
    let https: Vec<&str> = match tls {
        Some(t) => t.https_hosts(),
        None => before_https.iter().map(String::as_str).collect(),
    };
    st.status.observed_generation = route.metadata.generation;
    st.fields.url = Some(certificate::with_scheme(resources::url(route, net), &https));
    st.fields.address = Some(resources::address(route));
    match resolved {
        Ok(t) => {
            st.fields.traffic = resources::status_traffic(route, t, net);
            for t in &mut st.fields.traffic {
                t.url = t.url.take().map(|u| certificate::with_scheme(u, &https));
            }
            st.status.set(
                condition(ALL_TRAFFIC_ASSIGNED, ConditionStatus::True, None, None),
                now,
            );
        }
        Err(e) => {
            // Knative keeps the traffic it reported last: it is still what the ingress serves.
            let (status, reason, message) = e.condition();
            st.status.set(
                condition(ALL_TRAFFIC_ASSIGNED, status, Some(&reason), Some(message)),
                now,
            );
        }
    }
    match ingress {
        Ingress::Programmed => st.status.set(
            condition(INGRESS_READY, ConditionStatus::True, None, None),
            now,
        ),
        Ingress::Probed(hash) => {
            st.status.set(
                condition(INGRESS_READY, ConditionStatus::True, None, None),
                now,
            );
            st.status
                .annotations
                .insert(PROBED_HASH_ANNOTATION.into(), hash.clone());
        }
        Ingress::Probing(message) => st.status.set(
            condition(
                INGRESS_READY,
                ConditionStatus::Unknown,
                Some("Uninitialized"),
                Some(message.clone()),
            ),
            now,
        ),
        Ingress::NotServed => st.status.set(
            condition(
                INGRESS_READY,
                ConditionStatus::False,
                Some(VIRTUAL_SERVICE_NOT_SERVED),
                Some(format!(
                    "The ingress class {ISTIO_INGRESS_CLASS} writes Istio VirtualServices, and \
                     the API server does not serve them: install Istio's CRD \
                     {VIRTUAL_SERVICE_CRD}."
                )),
            ),
            now,
        ),
        Ingress::HttpRoutesNotServed => st.status.set(
            condition(
                INGRESS_READY,
                ConditionStatus::False,
                Some(gateway_api::HTTP_ROUTE_NOT_SERVED),
                Some(format!(
                    "The ingress class {} writes Gateway API HTTPRoutes, and the API server \
                     does not serve them: install the Gateway API's CRD {}.",
                    crate::config::network::GATEWAY_API_INGRESS_CLASS,
                    gateway_api::HTTP_ROUTE_CRD
                )),
            ),
            now,
        ),
        Ingress::Refused { reason, message } => st.status.set(
            condition(
                INGRESS_READY,
                ConditionStatus::False,
                Some(reason),
                Some(message.clone()),
            ),
            now,
        ),
        Ingress::NotOwned(message) => st.status.set(
            condition(
                INGRESS_READY,
                ConditionStatus::False,
                Some("NotOwned"),
                Some(message.clone()),
            ),
            now,
        ),
        Ingress::Unchanged => {
            if st.status.condition(INGRESS_READY).is_none() {
                st.status.set(
                    condition(
                        INGRESS_READY,
                        ConditionStatus::Unknown,
                        Some("IngressNotConfigured"),
                        Some("Ingress has not yet been reconciled.".into()),
                    ),
                    now,
                );
            }
        }
    }
    match tls {
        Some(t) => st.status.set(t.condition(net.templates.http_protocol), now),
        None if st.status.condition(CERTIFICATE_PROVISIONED).is_none() => st.status.set(
            condition(
                CERTIFICATE_PROVISIONED,
                ConditionStatus::Unknown,
                Some("CertificateNotReady"),
                Some("The certificates have not yet been reconciled.".into()),
            ),
            now,
        ),
        None => {}
    }
    st.status.set_ready_from(
        condition::READY,
        &[ALL_TRAFFIC_ASSIGNED, INGRESS_READY, CERTIFICATE_PROVISIONED],
        now,
    );
    st
}

/// What `route` refers to, read from the stores.
fn referenced(route: &Route, ns: &str, stores: &Stores) -> Referenced {
    let mut refs = Referenced::default();
    for name in traffic::referenced_configurations(route) {
        if let Some(c) = stores.configurations.get(&ObjectRef::new(&name).within(ns)) {
            refs.configurations.insert(name, (*c).clone());
        }
    }
    for name in traffic::referenced_revisions(route, &refs.configurations) {
        if let Some(r) = stores.revisions.get(&ObjectRef::new(&name).within(ns)) {
            refs.revisions.insert(name, (*r).clone());
        }
    }
    refs
}

/// Applies `desired` unless an object of its name exists that is not the route's; a child
/// equal to what is wanted (`same`) is not written again. `cached`: the child as the
/// controller's store holds it. Returns the NotOwned message when it is someone else's.
pub(crate) async fn apply_child<P, K>(
    ctx: &Ctx,
    route: &P,
    desired: &K,
    cached: Option<Arc<K>>,
    same: impl Fn(&K, &K) -> bool,
) -> Result<Option<String>, Error>
where
    P: Resource,
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let cached = cached.map(|c| (*c).clone());
    Ok(
        match super::apply_owned(ctx, route, desired, cached, same).await? {
            super::Applied::Ours(_) => None,
            super::Applied::NotOwned { kind, name } => {
                let what = if kind == "Service" {
                    "placeholder Service"
                } else {
                    kind.as_str()
                };
                Some(super::Applied::<K>::not_owned_message(what, &name))
            }
        },
    )
}

pub(crate) fn same_labels<K: Resource>(existing: &K, desired: &K) -> bool {
    let have = existing.meta().labels.clone().unwrap_or_default();
    desired
        .meta()
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have.get(k) == Some(v))
}

fn same_placeholder(existing: &KubeService, desired: &KubeService) -> bool {
    let (Some(e), Some(d)) = (&existing.spec, &desired.spec) else {
        return false;
    };
    same_labels(existing, desired)
        && e.type_ == d.type_
        && e.external_name == d.external_name
        && e.ports.as_ref().map(|p| {
            p.iter()
                .map(|p| (p.name.clone(), p.port))
                .collect::<Vec<_>>()
        }) == d.ports.as_ref().map(|p| {
            p.iter()
                .map(|p| (p.name.clone(), p.port))
                .collect::<Vec<_>>()
        })
}

/// Writes the placeholder Services and the ingress objects of `traffic` in the class in force
/// (the other class's objects of the route are deleted); deletes placeholder Services of tags
/// the route no longer has.
async fn program(
    ctx: &Ctx,
    route: &Route,
    traffic: &Traffic,
    tls: &TlsOutcome,
    net: &NetworkConfig,
    default_timeout: u64,
    stores: &Stores,
) -> Result<Ingress, Error> {
    let ns = route.namespace().unwrap_or_default();
    let placeholders = resources::placeholder_services(route, traffic, net);
    for svc in &placeholders {
        let cached = stores
            .placeholders
            .get(&ObjectRef::new(&svc.name_any()).within(&ns));
        if let Some(msg) = apply_child(ctx, route, svc, cached, same_placeholder).await? {
            return Ok(Ingress::NotOwned(msg));
        }
    }
    let mut desc = ingress::describe(route, traffic, net, default_timeout);
    desc.tls = tls.ingress_tls(&ns);
    let ingress = match net.templates.ingress_class {
        IngressClass::Istio => {
            // HTTPRoutes left from the Gateway API class.
            delete_owned(ctx, &ns, owned(&stores.http_routes, route)).await?;
            program_istio(ctx, route, traffic, &desc, tls, net, stores).await?
        }
        IngressClass::GatewayApi => {
            // VirtualServices left from the Istio class; its prober's task is not needed.
            delete_owned(ctx, &ns, owned(&stores.virtual_services, route)).await?;
            stores.prober.forget(&ns, &route.name_any());
            program_gateway_api(ctx, route, &desc, tls, net, stores).await?
        }
    };
    if matches!(ingress, Ingress::NotOwned(_)) {
        return Ok(ingress);
    }
    // Placeholders of tags no longer named (ours only).
    let stale = stores.placeholders.state_filter(|s| {
        s.namespace().as_deref() == Some(ns.as_str())
            && is_owned_by(&s.metadata, route)
            && !placeholders.iter().any(|p| p.name_any() == s.name_any())
    });
    delete_owned(ctx, &ns, stale).await?;
    Ok(ingress)
}

/// The objects of `store` that `route` owns.
pub(crate) fn owned<P: Resource, K>(store: &Store<K>, route: &P) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.state_filter(|o| o.meta().namespace == route.namespace() && is_owned_by(o.meta(), route))
}

/// Deletes `objects` (in `ns`); one already gone is no failure.
pub(crate) async fn delete_owned<K>(ctx: &Ctx, ns: &str, objects: Vec<Arc<K>>) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = ctx.api::<K>(ns);
    for old in objects {
        match api
            .delete(&old.name_any(), &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The Gateway API class: writes the route's HTTPRoutes, deletes those of groups no longer
/// named, and reads their readiness from their status.
async fn program_gateway_api(
    ctx: &Ctx,
    route: &Route,
    desc: &ingress::IngressDesc,
    tls: &TlsOutcome,
    net: &NetworkConfig,
    stores: &Stores,
) -> Result<Ingress, Error> {
    let ns = &desc.namespace;
    // The TLS listeners and ReferenceGrant first: the HTTPRoutes attach to those listeners.
    let with_tls = !matches!(tls, TlsOutcome::NotEnabled { .. }) || had_tls(route);
    let owner = tls_owner(route, desc.external_hosts());
    if with_tls
        && let Some(r) = gateway_tls::program(ctx, route, &owner, desc, net, &|n| {
            resources::child_meta(route, n)
        })
        .await?
    {
        return Ok(refused(r));
    }
    let routes = gateway_api::http_routes(route, desc, net);
    for hr in &routes {
        let cached = stores
            .http_routes
            .get(&ObjectRef::new(&hr.name_any()).within(ns));
        if let Some(msg) = apply_child(ctx, route, hr, cached, |e: &HTTPRoute, d| {
            e.spec == d.spec && same_labels(e, d)
        })
        .await?
        {
            return Ok(Ingress::NotOwned(msg));
        }
    }
    let stale: Vec<Arc<HTTPRoute>> = owned(&stores.http_routes, route)
        .into_iter()
        .filter(|o| !routes.iter().any(|r| r.name_any() == o.name_any()))
        .collect();
    delete_owned(ctx, ns, stale).await?;
    // The HTTPRoutes name the new listeners now: the owner's others go.
    if with_tls
        && let Some(r) =
            gateway_tls::prune(ctx, net, &owner, &gateway_tls::listener_names(desc)).await?
    {
        return Ok(refused(r));
    }
    let current = |name: &str| stores.http_routes.get(&ObjectRef::new(name).within(ns));
    Ok(match gateway_api::readiness(&routes, current) {
        gateway_api::Readiness::Ready => Ingress::Programmed,
        gateway_api::Readiness::Pending(message) => Ingress::Probing(message),
        gateway_api::Readiness::Refused { reason, message } => Ingress::Refused { reason, message },
    })
}

/// What a writer's refusal of the TLS objects makes of the ingress.
fn refused(r: ingress::Refusal) -> Ingress {
    if r.reason == "NotOwned" {
        Ingress::NotOwned(r.message)
    } else {
        Ingress::Refused {
            reason: r.reason.into(),
            message: r.message,
        }
    }
}

/// The Istio class: writes the route's VirtualServices and asks the prober whether every
/// gateway pod serves them.
async fn program_istio(
    ctx: &Ctx,
    route: &Route,
    traffic: &Traffic,
    desc: &ingress::IngressDesc,
    tls: &TlsOutcome,
    net: &NetworkConfig,
    stores: &Stores,
) -> Result<Ingress, Error> {
    let ns = desc.namespace.clone();
    // The TLS Gateways and Secret copies first: the VirtualService binds those Gateways.
    // (Nothing to look at while the route has never had TLS.)
    if !matches!(tls, TlsOutcome::NotEnabled { .. }) || had_tls(route) {
        let owner = tls_owner(route, desc.external_hosts());
        if let Some(r) = istio_tls::program(ctx, route, &owner, desc, net, &|n| {
            resources::child_meta(route, n)
        })
        .await?
        {
            return Ok(refused(r));
        }
    }
    let vss = resources::istio_virtual_services(route, desc, net);
    // A TLS host whose plain http is redirected (or not served) cannot answer a probe over
    // http: its gateway pods are the external gateway's, probed through the other hosts.
    let unprobed = if net.templates.http_protocol == crate::config::network::HttpProtocol::Enabled {
        Vec::new()
    } else {
        istio_tls::tls_hosts(desc)
    };
    let same = |e: &VirtualService, d: &VirtualService| e.spec == d.spec && same_labels(e, d);
    // Whether both were found as wanted (nothing is written now).
    let mut found = true;
    for vs in [&vss.ingress, &vss.mesh] {
        let cached = stores
            .virtual_services
            .get(&ObjectRef::new(&vs.name_any()).within(&ns));
        found &= cached.as_ref().is_some_and(|c| same(c, vs));
        if let Some(msg) = apply_child(ctx, route, vs, cached, same).await? {
            return Ok(Ingress::NotOwned(msg));
        }
    }
    // Unchanged, and already answered by every gateway pod.
    if found && probed_before(route, &vss.hash) {
        return Ok(Ingress::Probed(vss.hash));
    }
    Ok(
        match stores.prober.check(
            route,
            &vss.hash,
            probed_gateways(route, traffic, net, &unprobed),
        ) {
            prober::Probed::Ready => Ingress::Probed(vss.hash),
            prober::Probed::Pending(message) => Ingress::Probing(message),
        },
    )
}

/// The Route status annotation naming the VirtualServices' hash every gateway pod answered
/// with when `IngressReady` last turned True ([`Ingress::Probed`]).
pub const PROBED_HASH_ANNOTATION: &str = "controller.thaw.dev/probed-hash";

/// Whether `route`'s status says every gateway pod already answered with `hash`
/// (`IngressReady` True, [`PROBED_HASH_ANNOTATION`] that hash), whichever replica probed. A
/// new leader's prober starts cold: without this, every Ready route would go Unknown until
/// probed again, and its Service with it (net-contour skips the probe of a KIngress already
/// Ready for the same reason).
pub fn probed_before(route: &Route, hash: &str) -> bool {
    let Some(st) = route.status.as_ref() else {
        return false;
    };
    st.status
        .condition(conditions::INGRESS_READY)
        .is_some_and(|c| c.status == ConditionStatus::True)
        && st
            .status
            .annotations
            .get(PROBED_HASH_ANNOTATION)
            .map(String::as_str)
            == Some(hash)
}

/// The gateways the route is on, each with the hosts it serves for it: the external gateways
/// the external hosts (unless the route is cluster-local), the local ones the cluster-local
/// hosts (net-istio's `HostsPerVisibility`); but the external hosts `unprobed`.
fn probed_gateways(
    route: &Route,
    traffic: &Traffic,
    net: &NetworkConfig,
    unprobed: &[&str],
) -> Vec<prober::GatewayHosts> {
    let groups: Vec<resources::GroupHosts> = traffic
        .groups
        .keys()
        .map(|tag| resources::group_hosts(route, tag.as_deref(), net))
        .collect();
    let external: Vec<String> = groups
        .iter()
        .filter_map(|g| g.external.clone())
        .filter(|h| !unprobed.contains(&h.as_str()))
        .collect();
    let local: Vec<String> = groups.iter().flat_map(|g| g.local.clone()).collect();
    let mut out = Vec::new();
    if !external.is_empty() {
        out.extend(
            net.istio
                .external_gateways
                .iter()
                .map(|g| prober::GatewayHosts {
                    gateway: g.clone(),
                    hosts: external.clone(),
                }),
        );
    }
    out.extend(
        net.istio
            .local_gateways
            .iter()
            .map(|g| prober::GatewayHosts {
                gateway: g.clone(),
                hosts: local.clone(),
            }),
    );
    out
}

/// Sends the labeler's patches (merge patches of metadata) for `route`.
async fn label(
    ctx: &Ctx,
    route: &Route,
    ns: &str,
    status_traffic: &[crate::knative::TrafficTarget],
    refs: &Referenced,
    stores: &Stores,
) -> Result<(), Error> {
    let used = labeler::used(route, status_traffic, refs);
    mark(ctx, ns, &route.name_any(), &used, stores).await
}

/// Sends the labeler's patches so that exactly `used` lists route `name` in `ns`.
async fn mark(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    used: &labeler::Used,
    stores: &Stores,
) -> Result<(), Error> {
    let modified = now().0.to_string();
    let revs: Vec<Arc<Revision>> = stores
        .revisions
        .state()
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(ns))
        .collect();
    let cfgs: Vec<Arc<Configuration>> = stores
        .configurations
        .state()
        .into_iter()
        .filter(|c| c.namespace().as_deref() == Some(ns))
        .collect();
    let rev_patches = labeler::patches(
        revs.iter()
            .map(|r| (r.metadata.name.as_deref().unwrap_or(""), &r.metadata)),
        &used.revisions,
        name,
        true,
        &modified,
    );
    let cfg_patches = labeler::patches(
        cfgs.iter()
            .map(|c| (c.metadata.name.as_deref().unwrap_or(""), &c.metadata)),
        &used.configurations,
        name,
        false,
        &modified,
    );
    let pp = PatchParams::default();
    let rev_api = ctx.api::<Revision>(ns);
    for (n, p) in rev_patches {
        let sent = rev_api.patch_metadata(&n, &pp, &Patch::Merge(&p)).await;
        tolerate_gone(sent)?;
    }
    let cfg_api = ctx.api::<Configuration>(ns);
    for (n, p) in cfg_patches {
        let sent = cfg_api.patch_metadata(&n, &pp, &Patch::Merge(&p)).await;
        tolerate_gone(sent)?;
    }
    Ok(())
}

/// A 404 (deleted since the store saw it) is no failure of the labeler.
fn tolerate_gone<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `route`'s external hosts get Certificates: `external-domain-tls` is on and the
/// route is not cluster-local.
fn tls_enabled(route: &Route, net: &NetworkConfig) -> bool {
    net.templates.external_domain_tls && !resources::is_cluster_local(route, net)
}

/// Whether the route's status shows it had TLS: its TLS objects may need deleting.
fn had_tls(route: &Route) -> bool {
    route
        .status
        .as_ref()
        .is_some_and(|s| certificate::had_tls(s.fields.url.as_deref(), &s.status))
}

/// The route as the owner of TLS objects in shared places, with its external `hosts`.
pub fn tls_owner(route: &Route, hosts: Vec<String>) -> TlsOwner {
    TlsOwner {
        namespace: route.namespace().unwrap_or_default(),
        name: route.name_any(),
        uid: route.uid().unwrap_or_default(),
        hosts,
        label: (labels::ROUTE, route.name_any()),
    }
}

/// A deleted route as the owner of TLS objects: its hosts as its status last said them (an
/// older listener is its own only with one of them).
fn deleted_tls_owner(route: &Route) -> TlsOwner {
    let hosts = route
        .status
        .iter()
        .flat_map(|s| {
            s.fields
                .url
                .iter()
                .chain(s.fields.traffic.iter().filter_map(|t| t.url.as_ref()))
        })
        .filter_map(|u| u.split_once("://").map(|(_, h)| h.to_string()))
        .collect();
    tls_owner(route, hosts)
}

/// Writes the route's Certificates (one per external host the namespace's bound admits,
/// [`certificate`], [`tls_limit`]) and deletes those no longer wanted (all of them when TLS is
/// off); returns what they say. Call under the namespace's [`tls_limit::lock`].
async fn certificates(
    ctx: &Ctx,
    route: &Route,
    traffic: &Traffic,
    net: &NetworkConfig,
    stores: &Stores,
) -> Result<TlsOutcome, Error> {
    let mut desired = Vec::new();
    let mut limited = Vec::new();
    if tls_enabled(route, net) {
        let uid = route.uid().unwrap_or_default();
        // The default host first, then the tags by name: the bound's order.
        let mut tags: Vec<&Option<String>> = traffic.groups.keys().collect();
        tags.sort_by_key(|t| t.is_some());
        let hosts: Vec<(Option<&str>, String)> = tags
            .into_iter()
            .filter_map(|tag| {
                resources::group_hosts(route, tag.as_deref(), net)
                    .external
                    .map(|h| (tag.as_deref(), h))
            })
            .collect();
        let owner = tls_owner(route, hosts.iter().map(|(_, h)| h.clone()).collect());
        let admission = tls_limit::admit(ctx, net, &owner, &owner.hosts).await?;
        for (tag, host) in hosts {
            let name = certificate::route_certificate_name(&uid, tag);
            match admission.limited.iter().find(|l| l.host == host) {
                None => desired.push(certificate::certificate(
                    resources::child_meta(route, name),
                    &host,
                    net,
                )),
                Some(l) => limited.push(certificate::CertReport {
                    name,
                    host,
                    secret: String::new(),
                    state: certificate::CertState::Limited(l.message.clone()),
                }),
            }
        }
    }
    write_certificates(
        ctx,
        route,
        tls_enabled(route, net).then_some(desired),
        limited,
        &stores.certificates,
        &stores.certificates_served,
        resources::is_cluster_local(route, net),
    )
    .await
}

/// Writes an owner's Certificates `desired` (`None`: TLS is off) and deletes its others;
/// returns what they say, with `limited` (hosts the namespace's bound left without one).
/// `store`/`served`: the owner controller's Certificate watch.
pub(crate) async fn write_certificates<P: Resource + Sync>(
    ctx: &Ctx,
    owner: &P,
    desired: Option<Vec<Certificate>>,
    limited: Vec<certificate::CertReport>,
    store: &Store<Certificate>,
    served: &tokio::sync::watch::Receiver<Served>,
    cluster_local: bool,
) -> Result<TlsOutcome, Error> {
    let ns = owner.meta().namespace.clone().unwrap_or_default();
    // Without cert-manager's CRD there is nothing to read or delete: say so only when TLS is
    // wanted.
    let served = match desired {
        Some(_) => wait_served(served.clone(), "Certificate").await?,
        None => *served.borrow(),
    };
    if desired.is_some() && served == Served::Missing {
        return Ok(TlsOutcome::NotServed);
    }
    let mut reports = Vec::new();
    for cert in desired.iter().flatten() {
        let name = cert.name_any();
        let cached = store.get(&ObjectRef::new(&name).within(&ns));
        if apply_child(ctx, owner, cert, cached.clone(), certificate::same)
            .await?
            .is_some()
        {
            return Ok(TlsOutcome::NotOwned(name));
        }
        reports.push(certificate::CertReport {
            secret: cert.spec.secret_name.clone(),
            state: certificate::state(cert, cached.as_deref()),
            name,
            host: cert.spec.dns_names.first().cloned().unwrap_or_default(),
        });
    }
    if served == Served::Served {
        let stale: Vec<Arc<Certificate>> = owned(store, owner)
            .into_iter()
            .filter(|o| {
                !desired
                    .iter()
                    .flatten()
                    .any(|d| d.name_any() == o.name_any())
            })
            .collect();
        delete_owned(ctx, &ns, stale).await?;
    }
    reports.extend(limited);
    Ok(match desired {
        Some(_) => TlsOutcome::Certificates(reports),
        None => TlsOutcome::NotEnabled { cluster_local },
    })
}

/// How soon an owner with this TLS is reconciled again, if sooner than the resync: with
/// Secret copies (the Istio class, a host served over https), within config-istio's
/// `secret-copy-refresh-period`, so a rotated origin reaches its copy; with a host the bound
/// left without TLS, within a minute, so a place freed is taken. Jittered
/// ([`tls_limit::recheck`]).
pub(crate) fn tls_requeue(
    https: bool,
    limited: bool,
    net: &NetworkConfig,
    resync: std::time::Duration,
) -> std::time::Duration {
    let copies = https && net.templates.ingress_class == IngressClass::Istio;
    let period = match (copies, limited) {
        (true, _) => net.istio.secret_copy_refresh,
        (false, true) => crate::config::network::MAX_SECRET_COPY_REFRESH,
        (false, false) => return resync,
    };
    tls_limit::recheck(period, resync)
}

/// Reconciles one Route (see the module docs).
pub async fn reconcile(route: Arc<Route>, ctx: Arc<Ctx>, stores: Stores) -> Result<Action, Error> {
    // The first reconciles may come before the stores' first list: wait for it (once).
    stores.wait_until_ready().await?;
    let ns = route.namespace().unwrap_or_default();
    let name = route.name_any();
    let settings = ctx.settings();
    let net = &settings.network;
    let refs = referenced(&route, &ns, &stores);
    // Knative's webhook rules (percents, one target kind per entry, tags, the visibility
    // label).
    let invalid = validate::route(&route);
    let resolved = if invalid.is_empty() {
        traffic::resolve(&route, &refs)
    } else {
        Err(TargetError::Invalid(validate::render(&invalid)))
    };
    let class = net.templates.ingress_class;
    let served = stores.served(class).await?;
    // One namespace's TLS owners count and write one at a time (the bound, [`tls_limit`]),
    // waiting for no watch under the lock.
    let tls_lock = match &resolved {
        Ok(_) if tls_enabled(&route, net) || had_tls(&route) => {
            if tls_enabled(&route, net) {
                wait_served(stores.certificates_served.clone(), "Certificate").await?;
            }
            Some(tls_limit::lock(&ctx, &ns).await)
        }
        _ => None,
    };
    // Deleted while this reconcile waited: its TLS is gone, and must stay gone.
    if tls_lock.is_some() && tls_limit::forgotten(&ctx, &route.uid().unwrap_or_default()) {
        return Ok(Action::await_change());
    }
    let tls = match &resolved {
        Ok(t) => Some(certificates(&ctx, &route, t, net, &stores).await?),
        Err(_) if !tls_enabled(&route, net) => Some(TlsOutcome::NotEnabled {
            cluster_local: resources::is_cluster_local(&route, net),
        }),
        Err(_) => None,
    };
    let ingress = match (&resolved, &tls) {
        (Ok(_), _) if served == Served::Missing => match class {
            IngressClass::Istio => Ingress::NotServed,
            IngressClass::GatewayApi => Ingress::HttpRoutesNotServed,
        },
        (Ok(t), Some(tls)) => {
            let timeout = super::defaults_for(&settings, &ns)
                .revision_timeout
                .as_secs();
            program(&ctx, &route, t, tls, net, timeout, &stores).await?
        }
        _ => Ingress::Unchanged,
    };
    drop(tls_lock);
    let status = compute_status(&route, &resolved, &ingress, tls.as_ref(), net, &now());
    if invalid.is_empty() {
        label(&ctx, &route, &ns, &status.fields.traffic, &refs, &stores).await?;
    }

    let before = route.status.clone().unwrap_or_default();
    let ingress_ready = status
        .status
        .condition(conditions::INGRESS_READY)
        .is_some_and(|c| c.status == ConditionStatus::True);
    if status != before {
        announce(&ctx, &route, &before, &status).await;
        let mut next = (*route).clone();
        next.status = Some(status);
        ctx.api::<Route>(&ns)
            .replace_status(&name, &PostParams::default(), &next)
            .await?;
    }
    // Under --adopt-knative: thaw serves the route now; what Knative made for it goes.
    if ctx.adopt() && ingress_ready {
        super::adopt::route::drop_route_finalizer(&ctx, &route).await?;
        super::adopt::route::retire_ingress(&ctx, &*route, true).await?;
    }
    if let Err(TargetError::Invalid(msg)) = resolved {
        return Err(Error::Invalid(msg));
    }
    match ingress {
        Ingress::NotOwned(message) | Ingress::Refused { message, .. } => {
            return Err(Error::Other(message));
        }
        _ => {}
    }
    if let Some(TlsOutcome::NotOwned(name)) = tls {
        return Err(Error::Other(format!(
            "There is an existing certificate {name} that we don't own."
        )));
    }
    // Not served: the kind's watch re-queues every route when it lists.
    let requeue = match &tls {
        Some(t) => tls_requeue(
            !t.https_hosts().is_empty(),
            t.is_limited(),
            net,
            ctx.resync(),
        ),
        None => ctx.resync(),
    };
    Ok(Action::requeue(requeue))
}

/// Events for conditions that turn False (the reason and message), as Knative records them.
async fn announce(ctx: &Ctx, route: &Route, before: &RouteStatus, after: &RouteStatus) {
    use conditions::*;
    for type_ in [ALL_TRAFFIC_ASSIGNED, INGRESS_READY] {
        let Some(c) = after.status.condition(type_) else {
            continue;
        };
        let was = before.status.condition(type_);
        if c.status == ConditionStatus::False
            && (was.map(|w| (w.status, &w.reason)) != Some((c.status, &c.reason)))
        {
            ctx.event(
                route,
                EventKind::Warning,
                c.reason.as_deref().unwrap_or("Failed"),
                c.message.clone().unwrap_or_default(),
            )
            .await;
        }
    }
}

/// Whether `route` refers to the revision `rev` (in its namespace), directly, through its
/// configuration, or as a revision it marked as used.
fn refers_to_revision(route: &Route, rev: &Revision) -> bool {
    let name = rev.name_any();
    let cfg = labeler::configuration_of(rev);
    let spec = route.spec.traffic.iter();
    let status = route.status.iter().flat_map(|s| s.fields.traffic.iter());
    spec.chain(status).any(|t| {
        t.revision_name.as_deref() == Some(name.as_str())
            || (t.revision_name.is_none()
                && cfg.is_some()
                && (t.configuration_name.is_some() && t.configuration_name == cfg
                    || t.configuration_name.is_none() && traffic::service_of(route) == cfg))
    }) || labeler::lists(&rev.metadata, &route.name_any())
}

/// Whether `route` names the configuration `cfg`.
fn refers_to_configuration(route: &Route, cfg: &Configuration) -> bool {
    traffic::referenced_configurations(route).contains(&cfg.name_any())
        || labeler::lists(&cfg.metadata, &route.name_any())
}

/// The routes of `routes` in `ns` for which `pred` holds, as object references.
fn routes_where(
    routes: &Store<Route>,
    ns: Option<String>,
    pred: impl Fn(&Route) -> bool,
) -> Vec<ObjectRef<Route>> {
    routes
        .state()
        .into_iter()
        .filter(|r| r.namespace() == ns && pred(r))
        .map(|r| ObjectRef::from_obj(&*r))
        .collect()
}

/// Passes on the objects of a reflector's event stream whose `relevant` hash changed (and
/// every deletion): the autoscaler rewrites a Revision's status on each scale change, which
/// changes nothing a route reads.
fn relevant_changes<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    relevant: fn(&K) -> u64,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Send,
{
    let mut seen: std::collections::HashMap<(Option<String>, String), u64> =
        std::collections::HashMap::new();
    events.filter_map(move |ev| {
        let out = match ev {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let key = (
                    o.meta().namespace.clone(),
                    o.meta().name.clone().unwrap_or_default(),
                );
                let h = relevant(&o);
                (seen.insert(key, h) != Some(h)).then_some(Ok(o))
            }
            Ok(watcher::Event::Delete(o)) => {
                seen.remove(&(
                    o.meta().namespace.clone(),
                    o.meta().name.clone().unwrap_or_default(),
                ));
                Some(Ok(o))
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
        };
        futures::future::ready(out)
    })
}

fn hash_of(v: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(v)
}

/// What a route reads of a Revision: its spec (generation), whether it is Ready, its owner,
/// and what the labeler wrote (so a labeler patch the store had not seen yet when a route was
/// reconciled re-queues the routes it names, which then see it).
fn revision_relevance(r: &Revision) -> u64 {
    hash_of((
        r.metadata.generation,
        r.status
            .as_ref()
            .and_then(|s| s.status.condition(condition::READY))
            .map(|c| c.status as u8),
        labeler::configuration_of(r),
        labeler::listed(&r.metadata),
        r.labels().get(labels::ROUTING_STATE),
    ))
}

/// What a route reads of a Configuration: its latest ready and created revisions, Ready, and
/// the routes the labeler listed on it.
fn configuration_relevance(c: &Configuration) -> u64 {
    hash_of((
        c.status.as_ref().map(|s| {
            (
                s.fields.latest_ready_revision_name.clone(),
                s.fields.latest_created_revision_name.clone(),
                s.status.condition(condition::READY).map(|c| c.status as u8),
            )
        }),
        labeler::listed(&c.metadata),
    ))
}

/// Takes deleted routes off the revisions and configurations that list them (Knative's labeler
/// does it when the Route is finalized; thaw puts no finalizer on Routes): first every route
/// the stores name that no longer exists (deleted while no replica led), then each deletion
/// the Route watch reports. A failure is logged; the next deletion or restart sweeps again.
async fn forget_deleted_routes(
    ctx: Arc<Ctx>,
    stores: Stores,
    routes: Store<Route>,
    mut routes_listed: tokio::sync::watch::Receiver<bool>,
    mut deleted: tokio::sync::mpsc::Receiver<(String, String)>,
) {
    // The Route store's readiness is the applier's to await (kube-runtime's wait wakes one
    // waiter only): its first list is known here from the Route watch's InitDone.
    if stores.ready.wait_unbounded().await.is_err() || routes_listed.wait_for(|l| *l).await.is_err()
    {
        return;
    }
    let mut gone = std::collections::BTreeSet::new();
    let metas = stores
        .revisions
        .state()
        .into_iter()
        .map(|r| r.metadata.clone())
        .chain(
            stores
                .configurations
                .state()
                .into_iter()
                .map(|c| c.metadata.clone()),
        );
    for meta in metas {
        let ns = meta.namespace.clone().unwrap_or_default();
        for route in labeler::listed(&meta) {
            if routes.get(&ObjectRef::new(&route).within(&ns)).is_none() {
                gone.insert((ns.clone(), route));
            }
        }
    }
    for (ns, name) in gone {
        forget(&ctx, &stores, &ns, &name).await;
    }
    while let Some((ns, name)) = deleted.recv().await {
        // A route named by a revision's watch event may have been re-created since.
        if routes.get(&ObjectRef::new(&name).within(&ns)).is_none() {
            stores.prober.forget(&ns, &name);
            forget(&ctx, &stores, &ns, &name).await;
        }
    }
}

/// Takes what each deleted route's TLS left outside its namespace ([`forget_tls`]), as the
/// Route watch reports the deletions (by UID: a route re-created under the name keeps its
/// own).
async fn forget_deleted_tls(ctx: Arc<Ctx>, mut gone: tokio::sync::mpsc::Receiver<TlsOwner>) {
    while let Some(owner) = gone.recv().await {
        forget_tls(&ctx, &owner).await;
    }
}

/// Sends every route `meta` lists that `routes` does not hold to the labeler's cleanup (which
/// checks again once the Route store has listed). The deletion of a Route is seen once, and
/// the revisions' store may not yet show the labeler's last patch when it is: without this, a
/// revision listing a deleted route would keep it, and stay `active`, until the next start.
fn report_listed_but_gone(
    routes: &Store<Route>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    cleanup: &tokio::sync::mpsc::Sender<(String, String)>,
) {
    let ns = meta.namespace.clone().unwrap_or_default();
    for route in labeler::listed(meta) {
        if routes.get(&ObjectRef::new(&route).within(&ns)).is_none()
            && cleanup.try_send((ns.clone(), route.clone())).is_err()
        {
            tracing::warn!(%route, "deletion queue full; swept at the next start");
        }
    }
}

/// Deletes what a deleted owner's TLS left outside its namespace: the copies of its
/// certificate Secrets in the Istio gateways' namespaces ([`istio_tls`]) and its listeners on
/// the Gateway API's external Gateways ([`gateway_tls`]). (Its Certificates, TLS Gateways and
/// ReferenceGrant go by owner reference.) Under the namespace's TLS lock, so a reconcile of the
/// owner still writing when it was deleted is done first (the lock is fair). A failure is
/// logged.
pub(crate) async fn forget_tls(ctx: &Ctx, owner: &TlsOwner) {
    tls_limit::forget(ctx, &owner.uid);
    let _lock = tls_limit::lock(ctx, &owner.namespace).await;
    let settings = ctx.settings();
    match gateway_tls::prune(ctx, &settings.network, owner, &[]).await {
        Ok(None) => {}
        Ok(Some(r)) => tracing::warn!(namespace = %owner.namespace, owner = %owner.name,
            reason = r.reason, "could not remove a deleted owner's TLS listeners: {}", r.message),
        Err(e) => tracing::warn!(namespace = %owner.namespace, owner = %owner.name,
            error = %e, "could not remove a deleted owner's TLS listeners"),
    }
    istio_tls::forget(ctx, &settings.network, owner).await;
}

async fn forget(ctx: &Ctx, stores: &Stores, ns: &str, name: &str) {
    match mark(ctx, ns, name, &labeler::Used::default(), stores).await {
        Ok(()) => tracing::debug!(namespace = ns, route = name, "deleted route forgotten"),
        Err(e) => tracing::warn!(namespace = ns, route = name, error = %e,
            "could not take a deleted route off its revisions"),
    }
}

/// The watch of a kind the ingress is written as (its objects labelled
/// `serving.knative.dev/route` are not selected: a route's children are found by owner), with
/// whether the API server serves it: its store, its stream of touched objects, the
/// served-or-missing state, and a stream that yields each time it becomes served.
#[allow(clippy::type_complexity)]
pub(crate) fn served_watch<K>(
    informer: &Informer<K>,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    tokio::sync::watch::Receiver<Served>,
    impl futures::Stream<Item = ()> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    (
        informer.store(),
        informer.events().touched_objects(),
        informer.served(),
        informer.now_served(),
    )
}

/// The shared watches the Route controller reads: Revisions, Configurations, Routes,
/// VirtualServices, HTTPRoutes, Certificates and its placeholder Services (by the route
/// label).
#[allow(clippy::type_complexity)]
pub fn watches(
    ctx: &Ctx,
) -> (
    Informer<Revision>,
    Informer<Configuration>,
    Informer<Route>,
    Informer<VirtualService>,
    Informer<HTTPRoute>,
    Informer<Certificate>,
    Informer<KubeService>,
) {
    (
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(Some(labels::ROUTE)),
    )
}

/// The Route controller: owns VirtualServices, HTTPRoutes and placeholder Services; follows Revisions and
/// Configurations through reflectors whose stores the reconciles read; only changes a route
/// reads re-queue routes.
pub async fn controller(ctx: Arc<Ctx>) {
    let (
        revision_watch,
        configuration_watch,
        route_watch,
        vs_watch,
        hr_watch,
        cert_watch,
        svc_watch,
    ) = watches(&ctx);
    let revisions = revision_watch.store();
    let rev_stream = relevant_changes(revision_watch.events(), revision_relevance);
    let configurations = configuration_watch.store();
    let cfg_stream = relevant_changes(configuration_watch.events(), configuration_relevance);
    // The Route watch feeds the controller and reports deletions to the labeler's cleanup
    // (bounded: a deletion dropped when it is full is swept at the next start).
    let routes = route_watch.store();
    let (deleted_tx, deleted_rx) = tokio::sync::mpsc::channel(1024);
    let (rev_gone, cfg_gone) = (deleted_tx.clone(), deleted_tx.clone());
    // And to the TLS cleanup (bounded: one dropped when it is full leaves its listeners and
    // copies, logged).
    let (tls_gone_tx, tls_gone_rx) = tokio::sync::mpsc::channel::<TlsOwner>(1024);
    let (routes_listed_tx, routes_listed) = tokio::sync::watch::channel(false);
    let route_stream = route_watch
        .events()
        .inspect(move |ev| match ev {
            Ok(watcher::Event::Delete(r)) => {
                if deleted_tx
                    .try_send((r.namespace().unwrap_or_default(), r.name_any()))
                    .is_err()
                {
                    tracing::warn!(route = %r.name_any(), "deletion queue full; swept at the next start");
                }
                if tls_gone_tx.try_send(deleted_tls_owner(r)).is_err() {
                    tracing::warn!(route = %r.name_any(),
                        "TLS cleanup queue full; its TLS listeners and Secret copies are left");
                }
            }
            // The store has its first list by now (the replay comes from it).
            Ok(watcher::Event::InitDone) => {
                routes_listed_tx.send_replace(true);
            }
            _ => {}
        })
        .applied_objects();
    // The VirtualService and HTTPRoute watches also tell whether the API server serves them:
    // a 404 is `Missing` (the reconciles of that class say so and end), a list `Served`
    // (every route is reconciled again: the CRD appeared). Each retries with kube's default
    // backoff (up to 30 s apart) while its CRD is missing.
    let (virtual_services, vs_stream, served, vs_now_served) = served_watch(&vs_watch);
    let (http_routes, hr_stream, http_routes_served, hr_now_served) = served_watch(&hr_watch);
    let (certificates, cert_stream, certificates_served, cert_now_served) =
        served_watch(&cert_watch);
    let now_served = futures::stream::select(
        futures::stream::select(vs_now_served, hr_now_served),
        cert_now_served,
    );
    // Routes whose probing finished or changed (bounded; a dropped one is read at resync).
    let (requeue_tx, mut requeue_rx) = tokio::sync::mpsc::channel::<ObjectRef<Route>>(1024);
    let probed = futures::stream::poll_fn(move |cx| requeue_rx.poll_recv(cx));
    let prober = prober::Prober::new(ctx.client.clone(), requeue_tx, ctx.metrics().clone());
    let placeholders = svc_watch.store();
    let svc_stream = svc_watch.events().touched_objects();
    let ready = Stores::gate(&revision_watch, &configuration_watch, &svc_watch);
    let controller = Controller::for_stream(route_stream, routes.clone())
        .owns_stream(vs_stream)
        .owns_stream(hr_stream)
        .owns_stream(cert_stream)
        .owns_stream(svc_stream)
        .reconcile_on(probed)
        .reconcile_all_on(futures::stream::select(now_served, ready.opened_later()));
    let routes2 = routes.clone();
    let routes3 = routes.clone();
    let controller = controller
        .watches_stream(rev_stream, move |rev: Revision| {
            report_listed_but_gone(&routes, &rev.metadata, &rev_gone);
            routes_where(&routes, rev.namespace(), |r| refers_to_revision(r, &rev))
        })
        .watches_stream(cfg_stream, move |cfg: Configuration| {
            report_listed_but_gone(&routes2, &cfg.metadata, &cfg_gone);
            routes_where(&routes2, cfg.namespace(), |r| {
                refers_to_configuration(r, &cfg)
            })
        });
    let stores = Stores {
        revisions,
        configurations,
        virtual_services,
        http_routes,
        placeholders,
        ready,
        served,
        http_routes_served,
        prober,
        certificates,
        certificates_served,
    };
    let cleanup = forget_deleted_routes(
        ctx.clone(),
        stores.clone(),
        routes3,
        routes_listed,
        deleted_rx,
    );
    let run = super::run(ctx.clone(), KIND, controller, move |route, ctx| {
        reconcile(route, ctx, stores.clone())
    });
    tokio::join!(run, cleanup, forget_deleted_tls(ctx.clone(), tls_gone_rx));
}

#[cfg(test)]
mod tests;
