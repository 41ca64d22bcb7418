//! DomainMapping → the ingress of its domain (Knative's `domainmapping` reconciler, the
//! ingress written directly through the Route reconciler's seam, [`super::route::ingress`]).
//!
//! One reconcile of a DomainMapping `{domain}` in namespace `ns`:
//! 1. `status.url` and `status.address.url` are `http://{domain}` (`https://` once served
//!    over TLS, step 5);
//! 2. **the claim**: the ClusterDomainClaim `{domain}` must name `ns`. Missing, it is created
//!    for `ns` when config-network's `autocreate-cluster-domain-claims` is true; else, or when
//!    it names another namespace, `DomainClaimed=False DomainAlreadyClaimed` (Knative's reason)
//!    and nothing else is written: one tenant cannot take another's domain;
//! 3. **the reference**: `spec.ref` must be a `serving.knative.dev` Service or Route in `ns`
//!    whose Route has a cluster-local address (`ReferenceResolved`, else False with why);
//! 4. **the ingress**: one target group, the domain as its only (external) host, all traffic
//!    to the Route's placeholder Service `{route}` (port 80: the local gateway) with the
//!    `Host` rewritten to `{route}.{ns}.svc.cluster.local`, so the gateway serves it as the
//!    Route (its splits, tags and headers apply); written in the ingress class in force
//!    (`{domain}-ingress` VirtualService, or the `{domain}` HTTPRoute whose readiness is its
//!    `Accepted`/`ResolvedRefs`); the Istio class is not probed for DomainMappings: written is
//!    `IngressReady`. `IngressReady=False NotOwned` when the object is someone else's;
//! 5. **TLS**: with `spec.tls.secretName` the domain is served over https with that Secret
//!    (`CertificateProvisioned` True `TLSCertificateProvidedExternally`); else, with
//!    config-network's `external-domain-tls`, the DomainMapping's own cert-manager Certificate
//!    `{domain}` (in its namespace, owned by it, config-certmanager's issuer), the domain
//!    https once it is Ready (the Route's rules and reasons, [`super::route::certificate`]);
//!    the class's TLS objects as for a Route ([`super::route::istio_tls`],
//!    [`super::route::gateway_tls`], named after the DomainMapping's UID); else
//!    `TLSNotEnabled`. Either way the domain takes one of its namespace's places on the shared
//!    gateway ([`super::route::tls_limit`]): without one it is served over http,
//!    `CertificateProvisioned=False TLSHostLimitExceeded`. With Secret copies, or without a
//!    place, it is re-queued within a minute (its copies follow their origin: a rotated
//!    `spec.tls` Secret reaches the gateway). `Ready` from the four.
//!
//! **Finalizer** (Knative's `domainmappings.serving.knative.dev`, so a DomainMapping Knative
//! left behind is finalized the same way): put on each DomainMapping at its first reconcile;
//! when it is being deleted and `autocreate-cluster-domain-claims` is true, the claim of its
//! domain is deleted if it names the DomainMapping's namespace (a claim this namespace did
//! not win is someone else's), then the finalizer is taken off. With autocreate off claims
//! are the operator's and stay, as in Knative: an operator releases a domain. A freed claim
//! re-queues the DomainMappings of that domain, so one in another namespace that was refused
//! `DomainAlreadyClaimed` claims it next.
//!
//! Re-queued when its VirtualService or HTTPRoute changes (owned), when the ClusterDomainClaim
//! of its domain changes, and when the Route it maps to changes.

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::informers::Informer;
use super::route::certificate::{self, Certificate, TlsOutcome};
use super::route::http_route::HTTPRoute;
use super::route::ingress::{Group, IngressDesc, Split, removed_headers};
use super::route::resources::GroupHosts;
use super::route::tls_owner::TlsOwner;
use super::route::virtual_service::VirtualService;
use super::route::{Served, gateway_api, tls_limit};
use super::{Ctx, Error, now, owner_ref};
use crate::config::network::{CLUSTER_LOCAL_DOMAIN, IngressClass, NetworkConfig};
use crate::knative::duck::{Addressable, Condition, ConditionStatus};
use crate::knative::{ClusterDomainClaim, ClusterDomainClaimSpec, DomainMapping, Route, condition};

/// The kind, in metrics and spans.
pub const KIND: &str = "DomainMapping";
/// Knative's finalizer on DomainMappings (its generated reconciler's name for the kind).
pub const FINALIZER: &str = "domainmappings.serving.knative.dev";
/// Knative's reason for a domain claimed by another namespace (or by none).
pub const DOMAIN_ALREADY_CLAIMED: &str = "DomainAlreadyClaimed";
/// The label on a DomainMapping's ingress objects naming it.
pub const DOMAIN_MAPPING_LABEL: &str = "serving.knative.dev/domainmapping";

/// Knative's DomainMapping condition types.
pub mod conditions {
    pub const DOMAIN_CLAIMED: &str = "DomainClaimed";
    pub const REFERENCE_RESOLVED: &str = "ReferenceResolved";
    pub const INGRESS_READY: &str = "IngressReady";
    pub const CERTIFICATE_PROVISIONED: &str = "CertificateProvisioned";
}

/// What the reconciles read: the claims and Routes (stores of their watches), the ingress
/// objects, and whether each ingress kind is served.
#[derive(Clone)]
pub struct Stores {
    pub claims: Store<ClusterDomainClaim>,
    pub routes: Store<Route>,
    pub virtual_services: Store<VirtualService>,
    pub http_routes: Store<HTTPRoute>,
    pub vs_served: tokio::sync::watch::Receiver<Served>,
    pub hr_served: tokio::sync::watch::Receiver<Served>,
    /// cert-manager's Certificates (the DomainMappings' own, by owner).
    pub certificates: Store<Certificate>,
    pub certificates_served: tokio::sync::watch::Receiver<Served>,
    /// Open once the claims and Routes stores have their first list.
    pub ready: super::StoresReady,
}

/// Whether the domain's claim lets `namespace` map it: `Ok(None)` claimed, `Ok(Some(message))`
/// not (Knative's `DomainAlreadyClaimed`), creating the claim first when `autocreate`.
pub async fn claim(
    ctx: &Ctx,
    claims: &Store<ClusterDomainClaim>,
    domain: &str,
    namespace: &str,
    autocreate: bool,
) -> Result<Option<String>, Error> {
    let owner = match claims.get(&ObjectRef::new(domain)) {
        Some(c) => c.spec.namespace.clone(),
        None if autocreate => {
            let api: Api<ClusterDomainClaim> = Api::all(ctx.client.clone());
            let want = ClusterDomainClaim::new(
                domain,
                ClusterDomainClaimSpec {
                    namespace: namespace.into(),
                },
            );
            match api.create(&PostParams::default(), &want).await {
                Ok(c) => c.spec.namespace,
                // Created since the store saw it: whoever did decides.
                Err(kube::Error::Api(s)) if s.code == 409 => api.get(domain).await?.spec.namespace,
                Err(e) => return Err(e.into()),
            }
        }
        None => {
            return Ok(Some(format!(
                "no ClusterDomainClaim found for domain {domain:?} (and \
                 autocreate-cluster-domain-claims is not true)"
            )));
        }
    };
    Ok((owner != namespace)
        .then(|| "The domain name is already in use by another DomainMapping".to_string()))
}

/// The Route `dm.spec.ref` maps to, with its cluster-local host; `Err`: why it does not
/// resolve (Knative's `ReferenceResolved=False` message).
pub fn resolve(dm: &DomainMapping, routes: &Store<Route>) -> Result<(String, String), String> {
    let ns = dm.namespace().unwrap_or_default();
    let r = &dm.spec.ref_;
    let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
    if group != "serving.knative.dev" || !matches!(r.kind.as_str(), "Service" | "Route") {
        return Err(format!(
            "{} {} is not a serving.knative.dev Service or Route",
            r.api_version, r.kind
        ));
    }
    if r.namespace.as_deref().is_some_and(|n| n != ns) {
        return Err(format!(
            "the referenced {} must be in the DomainMapping's namespace {ns}",
            r.kind
        ));
    }
    let host = format!("{}.{ns}.{CLUSTER_LOCAL_DOMAIN}", r.name);
    let route = routes
        .get(&ObjectRef::new(&r.name).within(&ns))
        .ok_or_else(|| format!("{} {:?} has no Route yet", r.kind, r.name))?;
    let address = route
        .status
        .as_ref()
        .and_then(|s| s.fields.address.as_ref())
        .and_then(|a| a.url.clone());
    if address.as_deref() != Some(format!("http://{host}").as_str()) {
        return Err(format!("the Route {:?} has no address yet", r.name));
    }
    Ok((r.name.clone(), host))
}

/// The ingress description of `dm` mapped to the Route `route` (host `host`).
pub fn describe(dm: &DomainMapping, route: &str, host: &str, timeout_seconds: u64) -> IngressDesc {
    let domain = dm.name_any();
    IngressDesc {
        namespace: dm.namespace().unwrap_or_default(),
        name: domain.clone(),
        owner_uid: dm.uid().unwrap_or_default(),
        cluster_local: false,
        groups: vec![Group {
            hosts: GroupHosts {
                name: domain.clone(),
                external: Some(domain),
                local: Vec::new(),
            },
            splits: vec![Split {
                service: route.into(),
                port: 80,
                h2c: false,
                percent: 100,
                set_headers: Default::default(),
            }],
            timeout_seconds,
            rewrite_host: Some(host.into()),
        }],
        remove_headers: removed_headers(&[]),
        tls: Vec::new(),
    }
}

/// The DomainMapping as the owner of TLS objects in shared places (its one host, its domain).
fn tls_owner(dm: &DomainMapping) -> TlsOwner {
    TlsOwner {
        namespace: dm.namespace().unwrap_or_default(),
        name: dm.name_any(),
        uid: dm.uid().unwrap_or_default(),
        hosts: vec![dm.name_any()],
        label: (
            DOMAIN_MAPPING_LABEL,
            crate::knative::names::labels::value(&dm.name_any()),
        ),
    }
}

fn meta(
    dm: &DomainMapping,
    name: String,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name),
        namespace: dm.namespace(),
        labels: Some(
            [(
                DOMAIN_MAPPING_LABEL.to_string(),
                crate::knative::names::labels::value(&dm.name_any()),
            )]
            .into(),
        ),
        owner_references: Some(vec![owner_ref(dm)]),
        ..Default::default()
    }
}

/// What the ingress of one reconcile came to: `(status, reason, message)` of `IngressReady`.
async fn program(
    ctx: &Ctx,
    dm: &DomainMapping,
    desc: &IngressDesc,
    with_tls: bool,
    net: &NetworkConfig,
    stores: &Stores,
) -> Result<(ConditionStatus, Option<String>, Option<String>), Error> {
    use super::route::{apply_child, delete_owned, owned, same_labels};
    let ns = desc.namespace.clone();
    let class = net.templates.ingress_class;
    let served = match class {
        IngressClass::Istio => *stores.vs_served.borrow(),
        IngressClass::GatewayApi => *stores.hr_served.borrow(),
    };
    if served != Served::Served {
        return Ok((
            ConditionStatus::Unknown,
            Some("IngressNotConfigured".into()),
            Some(format!(
                "the ingress class {} is not served by the API server yet",
                class.as_str()
            )),
        ));
    }
    let not_owned = |m: String| Ok((ConditionStatus::False, Some("NotOwned".into()), Some(m)));
    let refused = |r: super::route::ingress::Refusal| {
        Ok((
            ConditionStatus::False,
            Some(r.reason.into()),
            Some(r.message),
        ))
    };
    // The TLS objects of the class (none without TLS; looked at only when TLS is on, or was).
    let owner = tls_owner(dm);
    if with_tls {
        let made = match class {
            IngressClass::Istio => {
                super::route::istio_tls::program(ctx, dm, &owner, desc, net, &|n| meta(dm, n))
                    .await?
            }
            IngressClass::GatewayApi => {
                super::route::gateway_tls::program(ctx, dm, &owner, desc, net, &|n| meta(dm, n))
                    .await?
            }
        };
        if let Some(r) = made {
            return refused(r);
        }
    }
    match class {
        IngressClass::Istio => {
            delete_owned(ctx, &ns, owned(&stores.http_routes, dm)).await?;
            let vs =
                super::route::resources::write_virtual_services(desc, net, |n| meta(dm, n)).ingress;
            let cached = stores
                .virtual_services
                .get(&ObjectRef::new(&vs.name_any()).within(&ns));
            if let Some(m) = apply_child(ctx, dm, &vs, cached, |e: &VirtualService, d| {
                e.spec == d.spec && same_labels(e, d)
            })
            .await?
            {
                return not_owned(m);
            }
            Ok((ConditionStatus::True, None, None))
        }
        IngressClass::GatewayApi => {
            delete_owned(ctx, &ns, owned(&stores.virtual_services, dm)).await?;
            let routes = gateway_api::write_http_routes(desc, net, &|n| meta(dm, n));
            for hr in &routes {
                let cached = stores
                    .http_routes
                    .get(&ObjectRef::new(&hr.name_any()).within(&ns));
                if let Some(m) = apply_child(ctx, dm, hr, cached, |e: &HTTPRoute, d| {
                    e.spec == d.spec && same_labels(e, d)
                })
                .await?
                {
                    return not_owned(m);
                }
            }
            // The HTTPRoutes name the new listeners now: the owner's others go.
            if with_tls
                && let Some(r) = super::route::gateway_tls::prune(
                    ctx,
                    net,
                    &owner,
                    &super::route::gateway_tls::listener_names(desc),
                )
                .await?
            {
                return refused(r);
            }
            let current = |n: &str| stores.http_routes.get(&ObjectRef::new(n).within(&ns));
            Ok(match gateway_api::readiness(&routes, current) {
                gateway_api::Readiness::Ready => (ConditionStatus::True, None, None),
                gateway_api::Readiness::Pending(m) => (
                    ConditionStatus::Unknown,
                    Some("Uninitialized".into()),
                    Some(m),
                ),
                gateway_api::Readiness::Refused { reason, message } => {
                    (ConditionStatus::False, Some(reason), Some(message))
                }
            })
        }
    }
}

/// A DomainMapping's TLS: its own Certificate's, or the Secret its `spec.tls` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// From `external-domain-tls` (the Certificate named after the domain), or not enabled.
    Certificates(TlsOutcome),
    /// `spec.tls.secretName`: a certificate the user provides for the domain (no Certificate
    /// is written).
    Provided { host: String, secret: String },
    /// `spec.tls.secretName`, and the namespace's bound on TLS hosts leaves the domain without
    /// TLS: why.
    Limited(String),
}

/// Knative's reason for a certificate given in `spec.tls`.
pub const TLS_PROVIDED_EXTERNALLY: &str = "TLSCertificateProvidedExternally";

impl Tls {
    /// Whether the domain is served over https.
    pub fn https(&self) -> bool {
        match self {
            Tls::Certificates(t) => !t.https_hosts().is_empty(),
            Tls::Provided { .. } => true,
            Tls::Limited(_) => false,
        }
    }

    /// Whether the namespace's bound left the domain without TLS.
    pub fn is_limited(&self) -> bool {
        match self {
            Tls::Certificates(t) => t.is_limited(),
            Tls::Provided { .. } => false,
            Tls::Limited(_) => true,
        }
    }

    /// The ingress description's TLS.
    pub fn ingress_tls(&self, ns: &str) -> Vec<super::route::ingress::Tls> {
        match self {
            Tls::Certificates(t) => t.ingress_tls(ns),
            Tls::Provided { host, secret } => vec![super::route::ingress::Tls {
                hosts: vec![host.clone()],
                secret_namespace: ns.to_string(),
                secret_name: secret.clone(),
            }],
            Tls::Limited(_) => Vec::new(),
        }
    }

    /// `CertificateProvisioned`.
    pub fn condition(&self, http: crate::config::network::HttpProtocol) -> Condition {
        match self {
            Tls::Certificates(t) => t.condition(http),
            Tls::Provided { .. } => Condition {
                reason: Some(TLS_PROVIDED_EXTERNALLY.into()),
                ..Condition::new(conditions::CERTIFICATE_PROVISIONED, ConditionStatus::True)
            },
            Tls::Limited(why) => Condition {
                reason: Some(certificate::TLS_HOST_LIMIT_EXCEEDED.into()),
                message: Some(why.clone()),
                ..Condition::new(conditions::CERTIFICATE_PROVISIONED, ConditionStatus::False)
            },
        }
    }
}

/// The DomainMapping's TLS: the Secret `spec.tls` names; else, with `external-domain-tls`,
/// its Certificate `{domain}` (Knative's name) for the domain, owned by it; else none (its
/// Certificate deleted). Either needs a place under the namespace's bound on TLS hosts
/// ([`tls_limit`]): call under its lock.
async fn tls(
    ctx: &Ctx,
    dm: &DomainMapping,
    net: &NetworkConfig,
    stores: &Stores,
) -> Result<Tls, Error> {
    let domain = dm.name_any();
    let provided = dm.spec.tls.as_ref().map(|t| t.secret_name.clone());
    let wants_tls = provided.is_some() || net.templates.external_domain_tls;
    let limited = if wants_tls {
        let owner = tls_owner(dm);
        tls_limit::admit(ctx, net, &owner, &owner.hosts)
            .await?
            .limited
            .into_iter()
            .next()
    } else {
        None
    };
    let desired =
        (provided.is_none() && net.templates.external_domain_tls).then(|| match &limited {
            None => vec![certificate::certificate(
                meta(dm, domain.clone()),
                &domain,
                net,
            )],
            Some(_) => Vec::new(),
        });
    let limited_reports = match (&limited, &provided) {
        (Some(l), None) => vec![certificate::CertReport {
            name: domain.clone(),
            host: domain.clone(),
            secret: String::new(),
            state: certificate::CertState::Limited(l.message.clone()),
        }],
        _ => Vec::new(),
    };
    let t = super::route::write_certificates(
        ctx,
        dm,
        desired,
        limited_reports,
        &stores.certificates,
        &stores.certificates_served,
        false,
    )
    .await?;
    Ok(match (provided, limited) {
        (Some(_), Some(l)) => Tls::Limited(format!(
            "{domain} is served over http (its spec.tls Secret is not used): {}.",
            l.message
        )),
        (Some(secret), None) => Tls::Provided {
            host: domain,
            secret,
        },
        (None, _) => Tls::Certificates(t),
    })
}

fn set(
    st: &mut crate::knative::duck::Status,
    type_: &str,
    status: ConditionStatus,
    reason: Option<String>,
    message: Option<String>,
) {
    st.set(
        Condition {
            reason,
            message,
            ..Condition::new(type_, status)
        },
        &now(),
    );
}

/// Reconciles one DomainMapping (the module doc).
pub async fn reconcile(
    dm: Arc<DomainMapping>,
    ctx: Arc<Ctx>,
    stores: Stores,
) -> Result<Action, Error> {
    use conditions::*;
    stores.ready.wait().await?;
    let ns = dm.namespace().unwrap_or_default();
    let domain = dm.name_any();
    let settings = ctx.settings();
    let net = &settings.network;
    let held = dm.finalizers().iter().any(|f| f == FINALIZER);
    if dm.metadata.deletion_timestamp.is_some() {
        if held {
            finalize(&ctx, &dm, net.templates.autocreate_cluster_domain_claims).await?;
        }
        return Ok(Action::await_change());
    }
    if !held {
        // The patch's own watch event brings the DomainMapping back, finalizer held.
        let mut finalizers = dm.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        set_finalizers(&ctx, &dm, finalizers).await?;
        return Ok(Action::await_change());
    }
    let mut status = dm.status.clone().unwrap_or_default();
    status.status.observed_generation = dm.metadata.generation;
    status.url = Some(format!("http://{domain}"));
    status.address = Some(Addressable {
        url: Some(format!("http://{domain}")),
        ..Addressable::default()
    });
    let mut tls_outcome = None;
    let refused = claim(
        &ctx,
        &stores.claims,
        &domain,
        &ns,
        net.templates.autocreate_cluster_domain_claims,
    )
    .await?;
    let st = &mut status.status;
    match &refused {
        Some(message) => set(
            st,
            DOMAIN_CLAIMED,
            ConditionStatus::False,
            Some(DOMAIN_ALREADY_CLAIMED.into()),
            Some(message.clone()),
        ),
        None => set(st, DOMAIN_CLAIMED, ConditionStatus::True, None, None),
    }
    if refused.is_none() {
        match resolve(&dm, &stores.routes) {
            Err(message) => set(
                st,
                REFERENCE_RESOLVED,
                ConditionStatus::False,
                Some("ResolveFailed".into()),
                Some(message),
            ),
            Ok((route, host)) => {
                set(st, REFERENCE_RESOLVED, ConditionStatus::True, None, None);
                let timeout = super::defaults_for(&settings, &ns)
                    .max_revision_timeout
                    .as_secs();
                let mut desc = describe(&dm, &route, &host, timeout);
                let had = dm
                    .status
                    .as_ref()
                    .is_some_and(|s| certificate::had_tls(s.url.as_deref(), &s.status));
                // One namespace's TLS owners count and write one at a time ([`tls_limit`]).
                let wants = dm.spec.tls.is_some() || net.templates.external_domain_tls;
                // (Waiting for no watch under the lock.)
                if dm.spec.tls.is_none() && net.templates.external_domain_tls {
                    super::route::wait_served(stores.certificates_served.clone(), "Certificate")
                        .await?;
                }
                let lock = match wants || had {
                    true => Some(tls_limit::lock(&ctx, &ns).await),
                    false => None,
                };
                // Deleted while this reconcile waited: its TLS is gone, and must stay gone.
                if lock.is_some() && tls_limit::forgotten(&ctx, &dm.uid().unwrap_or_default()) {
                    return Ok(Action::await_change());
                }
                let t = tls(&ctx, &dm, net, &stores).await?;
                desc.tls = t.ingress_tls(&ns);
                let with_tls =
                    !matches!(t, Tls::Certificates(TlsOutcome::NotEnabled { .. })) || had;
                let (s, reason, message) =
                    program(&ctx, &dm, &desc, with_tls, net, &stores).await?;
                drop(lock);
                set(&mut status.status, INGRESS_READY, s, reason, message);
                tls_outcome = Some(t);
            }
        }
    }
    let st = &mut status.status;
    if st.condition(INGRESS_READY).is_none() {
        set(
            st,
            INGRESS_READY,
            ConditionStatus::Unknown,
            Some("IngressNotConfigured".into()),
            Some("Ingress has not yet been reconciled.".into()),
        );
    }
    if st.condition(REFERENCE_RESOLVED).is_none() {
        set(st, REFERENCE_RESOLVED, ConditionStatus::Unknown, None, None);
    }
    match &tls_outcome {
        Some(t) => {
            if t.https() {
                status.url = Some(format!("https://{domain}"));
                status.address = Some(Addressable {
                    url: Some(format!("https://{domain}")),
                    ..Addressable::default()
                });
            }
            status
                .status
                .set(t.condition(net.templates.http_protocol), &now());
        }
        None if status.status.condition(CERTIFICATE_PROVISIONED).is_none() => set(
            &mut status.status,
            CERTIFICATE_PROVISIONED,
            ConditionStatus::Unknown,
            Some("CertificateNotReady".into()),
            Some("The certificate has not yet been reconciled.".into()),
        ),
        None => {}
    }
    let st = &mut status.status;
    st.set_ready_from(
        condition::READY,
        &[
            DOMAIN_CLAIMED,
            REFERENCE_RESOLVED,
            INGRESS_READY,
            CERTIFICATE_PROVISIONED,
        ],
        &now(),
    );
    let ingress_ready = status
        .status
        .condition(INGRESS_READY)
        .is_some_and(|c| c.status == ConditionStatus::True);
    if dm.status.as_ref() != Some(&status) {
        let mut next = (*dm).clone();
        next.status = Some(status);
        ctx.api::<DomainMapping>(&ns)
            .replace_status(&domain, &PostParams::default(), &next)
            .await?;
    }
    // Under --adopt-knative: thaw serves the mapping now; Knative's KIngress for it goes.
    if ctx.adopt() && ingress_ready {
        super::adopt::route::retire_ingress(&ctx, &*dm, false).await?;
    }
    let requeue = match &tls_outcome {
        Some(t) => super::route::tls_requeue(t.https(), t.is_limited(), net, ctx.resync()),
        None => ctx.resync(),
    };
    Ok(Action::requeue(requeue))
}

/// A DomainMapping being deleted that holds [`FINALIZER`]: its claim released when thaw made
/// it for this namespace (autocreate), then the finalizer taken off.
async fn finalize(ctx: &Ctx, dm: &DomainMapping, autocreate: bool) -> Result<(), Error> {
    let ns = dm.namespace().unwrap_or_default();
    let domain = dm.name_any();
    if autocreate {
        let claims: Api<ClusterDomainClaim> = Api::all(ctx.client.clone());
        if let Some(claim) = claims.get_opt(&domain).await?
            && claim.spec.namespace == ns
        {
            match claims.delete(&domain, &Default::default()).await {
                Ok(_) => tracing::info!(%domain, namespace = %ns, "released the domain's claim"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let rest = dm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(ctx, dm, rest).await
}

/// Writes `finalizers` as the DomainMapping's, as Knative's generated reconcilers do: a merge
/// patch carrying the resourceVersion read, so another writer's change in between is a
/// conflict (retried) rather than lost.
async fn set_finalizers(
    ctx: &Ctx,
    dm: &DomainMapping,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": dm.resource_version(),
        }
    });
    ctx.api::<DomainMapping>(&dm.namespace().unwrap_or_default())
        .patch(
            &dm.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// The shared watches the DomainMapping controller reads: DomainMappings, the
/// ClusterDomainClaims, Routes, VirtualServices, HTTPRoutes and Certificates.
#[allow(clippy::type_complexity)]
pub fn watches(
    ctx: &Ctx,
) -> (
    Informer<DomainMapping>,
    Informer<ClusterDomainClaim>,
    Informer<Route>,
    Informer<VirtualService>,
    Informer<HTTPRoute>,
    Informer<Certificate>,
) {
    (
        ctx.informer(None),
        ctx.cluster_informer(),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
        ctx.informer(None),
    )
}

/// The DomainMapping controller: owns its VirtualService or HTTPRoute; follows the claims
/// and the Routes through stores whose changes re-queue the DomainMappings they concern.
pub async fn controller(ctx: Arc<Ctx>) {
    let (dm_watch, claim_watch, route_watch, vs_watch, hr_watch, cert_watch) = watches(&ctx);
    let dms = dm_watch.store();
    // Deletions go to the TLS cleanup (bounded: one dropped when it is full is logged).
    let (deleted_tx, deleted_rx) = tokio::sync::mpsc::channel::<TlsOwner>(1024);
    let dm_stream = dm_watch
        .events()
        .inspect(move |ev| {
            if let Ok(watcher::Event::Delete(d)) = ev
                && deleted_tx.try_send(tls_owner(d)).is_err()
            {
                tracing::warn!(domain = %d.name_any(),
                    "deletion queue full; its TLS Secret copies and listeners are left");
            }
        })
        .applied_objects();
    let claims = claim_watch.store();
    let claim_stream = claim_watch.events().touched_objects();
    let routes = route_watch.store();
    let route_stream = route_watch.events().touched_objects();
    let (virtual_services, vs_stream, vs_served, vs_now) = super::route::served_watch(&vs_watch);
    let (http_routes, hr_stream, hr_served, hr_now) = super::route::served_watch(&hr_watch);
    let (certificates, cert_stream, certificates_served, cert_now) =
        super::route::served_watch(&cert_watch);
    let ready = {
        let (claim_watch, route_watch) = (claim_watch.clone(), route_watch.clone());
        super::StoresReady::spawn("ClusterDomainClaims and Routes", async move {
            claim_watch.listed().await?;
            route_watch.listed().await
        })
    };
    let (dms2, dms3) = (dms.clone(), dms.clone());
    let controller = Controller::for_stream(dm_stream, dms)
        .owns_stream(vs_stream)
        .owns_stream(hr_stream)
        .owns_stream(cert_stream)
        .reconcile_all_on(futures::stream::select(
            futures::stream::select(vs_now, hr_now),
            futures::stream::select(cert_now, ready.opened_later()),
        ))
        .watches_stream(claim_stream, move |c: ClusterDomainClaim| {
            dms2.state()
                .into_iter()
                .filter(|d| d.name_any() == c.name_any())
                .map(|d| ObjectRef::from_obj(&*d))
                .collect::<Vec<_>>()
        })
        .watches_stream(route_stream, move |r: Route| {
            dms3.state()
                .into_iter()
                .filter(|d| d.namespace() == r.namespace() && d.spec.ref_.name == r.name_any())
                .map(|d| ObjectRef::from_obj(&*d))
                .collect::<Vec<_>>()
        });
    let stores = Stores {
        ready,
        claims,
        routes,
        virtual_services,
        http_routes,
        vs_served,
        hr_served,
        certificates,
        certificates_served,
    };
    let run = super::run(ctx.clone(), KIND, controller, move |dm, ctx| {
        reconcile(dm, ctx, stores.clone())
    });
    tokio::join!(run, forget_deleted(ctx.clone(), deleted_rx));
}

/// Deletes what a deleted DomainMapping's TLS left outside its namespace (its Secret copies in
/// the Istio gateways' namespaces, its listeners on the Gateway API's external Gateways; its
/// Certificate, TLS Gateway and ReferenceGrant go by owner reference), found by its UID. A
/// failure is logged.
async fn forget_deleted(ctx: Arc<Ctx>, mut deleted: tokio::sync::mpsc::Receiver<TlsOwner>) {
    while let Some(owner) = deleted.recv().await {
        super::route::forget_tls(&ctx, &owner).await;
    }
}
