//! A Route's (or DomainMapping's) side of adoption: once thaw serves its ingress
//! (`IngressReady=True`), Knative's KIngress named for it and, for a Route, the networking
//! Certificates it controls are retired (Knative's finalizer removed, then deleted with
//! `propagationPolicy: Orphan`); the Route's own finalizer of Knative's labeler
//! ([`ROUTE_FINALIZER`]) is removed so that deleting the Route does not hang. The
//! VirtualServices or HTTPRoutes the KIngress controlled were re-owned by the Route's
//! reconcile before ([`super::try_adopt`]): thaw writes net-istio's names (`{route}-ingress`,
//! `{route}-mesh`) and net-gateway-api's (the longest host); any the KIngress still controls
//! (a name thaw does not write) would route the same hosts beside thaw's once orphaned, so it is
//! deleted before the KIngress.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};

use super::{CERTIFICATE, INGRESS, chain, finalizer_patch, get_meta, retire};
use crate::controller::route::http_route::HTTPRoute;
use crate::controller::route::virtual_service::VirtualService;
use crate::controller::{Ctx, Error, FIELD_MANAGER};
use crate::knative::Route;
use crate::knative::names::{child_name, labels};

/// The finalizer Knative's Route labeler (the one Route reconciler with `FinalizeKind`) sets.
pub const ROUTE_FINALIZER: &str = "routes.serving.knative.dev";

/// Removes [`ROUTE_FINALIZER`] from `route` (one entry, guarded by the list read), logged.
pub async fn drop_route_finalizer(ctx: &Ctx, route: &Route) -> Result<(), Error> {
    let Some(patch) = finalizer_patch(route.finalizers(), ROUTE_FINALIZER) else {
        return Ok(());
    };
    let ns = route.namespace().unwrap_or_default();
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = serde_json::from_value(patch).map_err(|e| Error::Other(e.to_string()))?;
    ctx.api::<Route>(&ns)
        .patch(&route.name_any(), &pp, &Patch::<()>::Json(patch))
        .await?;
    tracing::info!(kind = "Route", name = %route.name_any(), namespace = %ns,
        finalizer = ROUTE_FINALIZER, "removed Knative's finalizer");
    Ok(())
}

/// Deletes the objects of kind `K` in `ns` that the KIngress of UID `king` still controls
/// (those thaw adopted are the parent's by now), logged. A kind the API server does not serve
/// has none.
async fn not_adopted<K>(ctx: &Ctx, ns: &str, king: Option<&str>) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api = ctx.api::<K>(ns);
    let found = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for o in found.iter().filter(|o| controlled_by(o.meta(), king)) {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: o.meta().uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&o.name_any(), &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
        tracing::info!(kind = %K::kind(&()), name = %o.name_any(), namespace = %ns,
            "deleted a Knative object thaw did not adopt: its KIngress is retired");
    }
    Ok(())
}

/// Whether `meta` is controlled by the object of UID `uid`.
fn controlled_by(meta: &ObjectMeta, uid: Option<&str>) -> bool {
    uid.is_some() && chain::controller(meta).is_some_and(|r| Some(r.uid.as_str()) == uid)
}

/// Retires what Knative's route reconciler made for `parent` (a Route or DomainMapping, whose
/// ingress thaw now serves): the KIngress named for it, when it controls it; for a Route
/// (`certificates`), the networking Certificates labelled with its name that it controls.
pub async fn retire_ingress<P: Resource>(
    ctx: &Ctx,
    parent: &P,
    certificates: bool,
) -> Result<(), Error> {
    let meta = parent.meta();
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let uid = meta.uid.as_deref();
    if let Some(king) = get_meta(ctx, INGRESS, &ns, &child_name(&name, "")).await?
        && controlled_by(&king, uid)
    {
        // What it still controls thaw did not adopt (a name thaw does not write): Knative's
        // stale routing for hosts thaw serves now, so deleted rather than orphaned.
        let king_uid = king.uid.as_deref();
        not_adopted::<VirtualService>(ctx, &ns, king_uid).await?;
        not_adopted::<HTTPRoute>(ctx, &ns, king_uid).await?;
        retire(ctx, INGRESS, &king).await?;
    }
    if !certificates {
        return Ok(());
    }
    let lp = ListParams::default().labels(&format!("{}={name}", labels::ROUTE));
    let certs = match CERTIFICATE.api(ctx, &ns).list(&lp).await {
        Ok(l) => l.items,
        // Knative's CRD is gone: nothing to retire.
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for c in certs {
        if controlled_by(&c.metadata, uid) {
            retire(ctx, CERTIFICATE, &c.metadata).await?;
        }
    }
    Ok(())
}
