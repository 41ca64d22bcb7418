//! Adoption in place (`thaw controller --adopt-knative`, env `THAW_ADOPT_KNATIVE`): on a
//! cluster where Knative Serving ran, thaw takes over what Knative's internal objects owned,
//! without deleting anything that serves traffic, and only along the ownership chain.
//!
//! - **Re-owning** ([`try_adopt`]): a child thaw would write (a revision's Services, a
//!   route's VirtualServices or HTTPRoutes) that exists and that the parent does not control
//!   is adopted when its controller chain leads by UID to the parent ([`chain`]); its
//!   ownerReferences are replaced in place (a JSON patch guarded by `test` ops on its UID and
//!   on the list read: Knative's controller reference out, the parent's in; for a Service its
//!   ports set to thaw's), then the usual server-side apply writes thaw's shape. Nothing is
//!   deleted or re-created, so the Service keeps its ClusterIP and its endpoints. Anything
//!   else stays `NotOwned`, as without the switch.
//! - **Held templates** ([`revision`]): a revision's Deployment that thaw never applied
//!   (Knative's, with its queue-proxy) keeps its pod template, labelled [`TEMPLATE_HELD_LABEL`],
//!   until the Revision is annotated [`RELEASE_TEMPLATE_ANNOTATION`]`: "true"`; then thaw's
//!   template and strategy replace Knative's whole (a JSON patch: an apply would merge its
//!   containers into Knative's by name), a rolling update with `maxUnavailable: 0`.
//! - **The public Service's Endpoints** ([`revision`]): Knative's hand-written v1 Endpoints
//!   of an adopted public Service are deleted once thaw's autoscaler's EndpointSlices for that
//!   Service hold a ready endpoint.
//! - **Cleanup** ([`revision`], [`route`]): once the Revision is Ready under thaw (its
//!   Endpoints gone), its ServerlessService and PodAutoscaler are deleted with
//!   `propagationPolicy: Orphan`; once a Route's (or DomainMapping's) ingress is ready, its
//!   KIngress and (Routes) networking Certificates likewise. Knative's finalizers
//!   (`{plural}.{group}`, knative.dev/pkg's generated reconcilers: `routes.serving.knative.dev`,
//!   `ingresses.networking.internal.knative.dev`, ...) are removed from those objects and from
//!   the Route first, one entry by a guarded JSON patch, so no delete hangs.
//!
//! Every adopted, released, deleted or unfinalized object is one INFO line (its kind, name,
//! namespace and, for an adoption, the chain).
//!
//! The way back, thaw stopped and Knative reinstalled, is [`hand_back`] (`thaw migrate
//! hand-back`): the same chain walked the other way, thaw's children re-owned to the
//! ServerlessServices, PodAutoscalers and KIngresses Knative's controller made.

pub mod chain;
pub mod hand_back;
pub mod revision;
pub mod route;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{Ctx, Error, FIELD_MANAGER};

/// The Revision annotation that releases an adopted Deployment's pod template: thaw then
/// writes its own (its sidecar in place of Knative's queue-proxy).
pub const RELEASE_TEMPLATE_ANNOTATION: &str = "controller.thaw.dev/release-template";

/// The label on an adopted Deployment whose pod template thaw leaves as it found it
/// (`kubectl get deploy -L controller.thaw.dev/template-held`).
pub const TEMPLATE_HELD_LABEL: &str = "controller.thaw.dev/template-held";

/// One of Knative's internal kinds, as its CRD serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnativeKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

impl KnativeKind {
    /// The finalizer Knative's generated reconciler of this kind sets (knative.dev/pkg's
    /// `defaultFinalizerName`, `{plural}.{group}`).
    pub fn finalizer(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// This kind as the dynamic API serves it.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: format!("{}/{}", self.group, self.version),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    /// This kind in `namespace`.
    pub fn api(&self, ctx: &Ctx, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(ctx.client.clone(), namespace, &self.api_resource())
    }
}

/// Knative's PodAutoscaler (one per revision, named for it, controlled by the Revision).
pub const POD_AUTOSCALER: KnativeKind = KnativeKind {
    group: "autoscaling.internal.knative.dev",
    version: "v1alpha1",
    kind: "PodAutoscaler",
    plural: "podautoscalers",
};

/// Knative's ServerlessService (named for the PodAutoscaler, controlled by it): the
/// controller of the revision's public and private Services and public Endpoints.
pub const SERVERLESS_SERVICE: KnativeKind = KnativeKind {
    group: "networking.internal.knative.dev",
    version: "v1alpha1",
    kind: "ServerlessService",
    plural: "serverlessservices",
};

/// Knative's KIngress (named for the Route or DomainMapping, controlled by it): the
/// controller of net-istio's VirtualServices and net-gateway-api's HTTPRoutes.
pub const INGRESS: KnativeKind = KnativeKind {
    group: "networking.internal.knative.dev",
    version: "v1alpha1",
    kind: "Ingress",
    plural: "ingresses",
};

/// Knative's networking Certificate (controlled by the Route; label
/// `serving.knative.dev/route`).
pub const CERTIFICATE: KnativeKind = KnativeKind {
    group: "networking.internal.knative.dev",
    version: "v1alpha1",
    kind: "Certificate",
    plural: "certificates",
};

/// `namespace/name` of `kind`, its metadata only; `None` when it, or its kind, is not there
/// (Knative's CRDs may be gone).
pub async fn get_meta(
    ctx: &Ctx,
    kind: KnativeKind,
    namespace: &str,
    name: &str,
) -> Result<Option<ObjectMeta>, Error> {
    match kind.api(ctx, namespace).get_opt(name).await {
        Ok(o) => Ok(o.map(|o| o.metadata)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The JSON patch that re-owns an object: guarded by its UID and its ownerReferences as read,
/// it replaces Knative's controller reference with `owners` (the parent's) and keeps the
/// other references; for a Service it also sets the ports to `ports` (a merged list
/// server-side apply would otherwise leave Knative's extra ports in).
pub fn reown_patch(found: &ObjectMeta, owners: &[OwnerReference], ports: Option<&Value>) -> Value {
    let refs = found.owner_references.clone().unwrap_or_default();
    let mut next: Vec<OwnerReference> = refs
        .iter()
        .filter(|r| r.controller != Some(true))
        .cloned()
        .collect();
    next.extend(owners.iter().cloned());
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/uid", "value": found.uid}),
        json!({"op": "test", "path": "/metadata/ownerReferences", "value": refs}),
        json!({"op": "replace", "path": "/metadata/ownerReferences", "value": next}),
    ];
    if let Some(p) = ports {
        ops.push(json!({"op": "replace", "path": "/spec/ports", "value": p}));
    }
    Value::Array(ops)
}

/// The JSON patch that removes finalizer `name` from `finalizers` (as read) and nothing else:
/// `None` when it is not there. The `test` op makes it fail (409/422, retried) if the list
/// changed since it was read.
pub fn finalizer_patch(finalizers: &[String], name: &str) -> Option<Value> {
    let i = finalizers.iter().position(|f| f == name)?;
    Some(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "remove", "path": format!("/metadata/finalizers/{i}")},
    ]))
}

/// Adopts `found`, the object of `desired`'s name that `parent` does not control, when
/// adoption is on and `found`'s chain leads to `parent` ([`chain::walk`]; the parent's kind is
/// the one `desired`'s controller reference names):
/// re-owns it in place ([`reown_patch`]) and returns it as the server now holds it. `None`:
/// not adopted (the switch is off, or the chain is not the parent's, logged with why).
pub async fn try_adopt<P, K>(
    ctx: &Ctx,
    parent: &P,
    found: &K,
    desired: &K,
) -> Result<Option<K>, Error>
where
    P: Resource,
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    let Some(parent_kind) = chain::controller(desired.meta()).map(|r| r.kind.clone()) else {
        return Ok(None);
    };
    if !ctx.adopt() || chain::path(&kind, &parent_kind).is_none() {
        return Ok(None);
    }
    let ns = found.meta().namespace.clone().unwrap_or_default();
    let name = found.name_any();
    let parent_uid = parent.meta().uid.clone().unwrap_or_default();
    let parent_name = parent.meta().name.clone().unwrap_or_default();
    let walked = chain::walk(
        &kind,
        &name,
        found.meta(),
        &parent_kind,
        &parent_name,
        &parent_uid,
        |k, n| {
            let ns = ns.clone();
            async move { get_meta(ctx, k, &ns, &n).await }
        },
    )
    .await?;
    let hops = match walked {
        Ok(h) => h,
        Err(why) => {
            tracing::info!(kind = %kind, name = %name, namespace = %ns, reason = %why,
                "not adopted: its ownership chain does not lead to this {parent_kind}");
            return Ok(None);
        }
    };
    let desired_json = serde_json::to_value(desired).map_err(|e| Error::Other(e.to_string()))?;
    let ports = (kind == "Service")
        .then(|| desired_json.pointer("/spec/ports").cloned())
        .flatten();
    let owners = desired.meta().owner_references.clone().unwrap_or_default();
    let patch = reown_patch(found.meta(), &owners, ports.as_ref());
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patched = ctx
        .api::<K>(&ns)
        .patch(
            &name,
            &pp,
            &Patch::<()>::Json(
                serde_json::from_value(patch).map_err(|e| Error::Other(e.to_string()))?,
            ),
        )
        .await?;
    tracing::info!(kind = %kind, name = %name, namespace = %ns, chain = %chain::render(&hops),
        "adopted a Knative object");
    Ok(Some(patched))
}

/// Removes Knative's finalizer of `kind` from `namespace/name` (whose finalizers were read as
/// `finalizers`), logged; nothing when it does not hold it.
pub async fn drop_finalizer(
    api: &Api<DynamicObject>,
    kind: &str,
    finalizer: &str,
    meta: &ObjectMeta,
) -> Result<(), Error> {
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let Some(patch) = finalizer_patch(&finalizers, finalizer) else {
        return Ok(());
    };
    let name = meta.name.clone().unwrap_or_default();
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(
        &name,
        &pp,
        &Patch::<()>::Json(serde_json::from_value(patch).map_err(|e| Error::Other(e.to_string()))?),
    )
    .await?;
    tracing::info!(kind, name = %name, namespace = meta.namespace.as_deref().unwrap_or_default(),
        finalizer, "removed Knative's finalizer");
    Ok(())
}

/// Deletes `meta`'s object (of `kind`, through `api`) with `propagationPolicy: Orphan` (what
/// it still owns is left, not collected) if it still has the UID read; logged. One already
/// gone is no failure.
pub async fn delete_orphaning(
    api: &Api<DynamicObject>,
    kind: &str,
    meta: &ObjectMeta,
) -> Result<(), Error> {
    let name = meta.name.clone().unwrap_or_default();
    let dp = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(kind, name = %name, namespace = meta.namespace.as_deref().unwrap_or_default(),
        "deleted a superseded Knative object (propagationPolicy Orphan)");
    Ok(())
}

/// Retires one of Knative's objects thaw superseded: its Knative finalizer removed, then
/// deleted orphaning its dependents ([`delete_orphaning`]).
pub async fn retire(ctx: &Ctx, kind: KnativeKind, meta: &ObjectMeta) -> Result<(), Error> {
    let api = kind.api(ctx, meta.namespace.as_deref().unwrap_or_default());
    drop_finalizer(&api, kind.kind, &kind.finalizer(), meta).await?;
    delete_orphaning(&api, kind.kind, meta).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_are_named_as_knatives_generated_reconcilers_name_them() {
        assert_eq!(
            INGRESS.finalizer(),
            "ingresses.networking.internal.knative.dev"
        );
        assert_eq!(
            CERTIFICATE.finalizer(),
            "certificates.networking.internal.knative.dev"
        );
    }

    #[test]
    fn only_the_named_finalizer_goes_guarded_by_the_list() {
        let f = vec!["a".to_string(), "routes.serving.knative.dev".into()];
        assert_eq!(
            finalizer_patch(&f, "routes.serving.knative.dev").unwrap(),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["a", "routes.serving.knative.dev"]},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        assert_eq!(finalizer_patch(&f, "other"), None);
        assert_eq!(finalizer_patch(&[], "a"), None);
    }

    #[test]
    fn reowning_swaps_the_controller_and_keeps_other_references() {
        let r = |kind: &str, uid: &str, controller: bool| OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: "n".into(),
            uid: uid.into(),
            controller: Some(controller),
            block_owner_deletion: None,
        };
        let found = ObjectMeta {
            uid: Some("svc".into()),
            owner_references: Some(vec![
                r("ServerlessService", "sks", true),
                r("X", "x", false),
            ]),
            ..ObjectMeta::default()
        };
        let patch = reown_patch(
            &found,
            &[r("Revision", "rev", true)],
            Some(&json!([{"port": 80}])),
        );
        let ops = patch.as_array().unwrap();
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/uid", "value": "svc"})
        );
        assert_eq!(ops[1]["op"], "test");
        assert_eq!(ops[1]["value"][0]["uid"], "sks");
        let next: Vec<OwnerReference> = serde_json::from_value(ops[2]["value"].clone()).unwrap();
        assert_eq!(
            next.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(),
            ["x", "rev"]
        );
        assert_eq!(
            ops[3],
            json!({"op": "replace", "path": "/spec/ports", "value": [{"port": 80}]})
        );
    }
}
