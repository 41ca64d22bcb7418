//! A revision's side of adoption: its Deployment's held template, its public Service's
//! Endpoints, and the removal of its PodAutoscaler and ServerlessService.
//!
//! Order within one reconcile of a Revision (see [`crate::controller::revision`]): the
//! Deployment (held or released), the private and public Services (re-owned along their
//! chain, [`super::try_adopt`]), Knative's public Endpoints ([`retire_public_endpoints`]),
//! the status; then, once the status is Ready and the Endpoints are gone, the
//! ServerlessService and the PodAutoscaler ([`retire_autoscaling`]).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Preconditions};

use super::{
    POD_AUTOSCALER, RELEASE_TEMPLATE_ANNOTATION, SERVERLESS_SERVICE, TEMPLATE_HELD_LABEL, chain,
    get_meta, retire,
};
use crate::controller::apply::APPLIED_ANNOTATION;
use crate::controller::{Ctx, Error};
use crate::knative::Revision;
use crate::knative::names::labels;

/// Whether the operator released `rev`'s adopted template ([`RELEASE_TEMPLATE_ANNOTATION`]
/// `"true"`).
pub fn released(rev: &Revision) -> bool {
    rev.annotations()
        .get(RELEASE_TEMPLATE_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Whether thaw leaves `found`, `rev`'s Deployment, with the pod template it has: not
/// released, and either held already ([`TEMPLATE_HELD_LABEL`], whether or not adoption is
/// still on, so turning the switch off rolls nothing) or, under `adopt`, never applied by thaw
/// (no [`APPLIED_ANNOTATION`]: Knative's reconciler made it; every Deployment thaw creates
/// carries it).
pub fn template_held(adopt: bool, found: &Deployment, rev: &Revision) -> bool {
    if released(rev) {
        return false;
    }
    is_held(found) || (adopt && !found.annotations().contains_key(APPLIED_ANNOTATION))
}

/// `desired` as applied while its template is held: its metadata (labels with
/// [`TEMPLATE_HELD_LABEL`], annotations, owner) and no spec, so the apply leaves the
/// Deployment's spec, its pod template and its replicas, as found.
pub fn held(mut desired: Deployment) -> Deployment {
    desired
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(TEMPLATE_HELD_LABEL.into(), "true".into());
    desired.spec = None;
    desired
}

/// Logs the change of `found`'s hold that this reconcile makes (an adoption with its template
/// held, or a release), once: the label tells what was done before.
pub fn log_hold(found: &Deployment, rev: &Revision, now_held: bool) {
    let was_held = is_held(found);
    let name = found.name_any();
    let ns = found.namespace().unwrap_or_default();
    if now_held && !was_held {
        tracing::info!(kind = "Deployment", name = %name, namespace = %ns,
            chain = %format!("Deployment {name} ← Revision {}", rev.name_any()),
            "adopted a Knative object; its pod template is held until the Revision is annotated {RELEASE_TEMPLATE_ANNOTATION}: \"true\"");
    } else if !now_held && was_held {
        tracing::info!(kind = "Deployment", name = %name, namespace = %ns,
            "released an adopted Deployment's template: thaw's template rolls out (maxUnavailable 0)");
    }
}

/// Whether `found` carries [`TEMPLATE_HELD_LABEL`].
pub fn is_held(found: &Deployment) -> bool {
    found.labels().get(TEMPLATE_HELD_LABEL).map(String::as_str) == Some("true")
}

/// The JSON patch that puts thaw's pod template and strategy (from `desired`) in place of the
/// held one, guarded by `found`'s UID. Replaced whole, not applied over: a server-side apply
/// would merge thaw's containers into Knative's by name, keeping every field Knative's manager
/// owns (its queue-proxy's environment, ports and probe handler beside thaw's).
pub fn release_patch(found: &Deployment, desired: &Deployment) -> Option<serde_json::Value> {
    let spec = desired.spec.as_ref()?;
    Some(serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": found.metadata.uid},
        {"op": "replace", "path": "/spec/template", "value": spec.template},
        {"op": "replace", "path": "/spec/strategy", "value": spec.strategy},
    ]))
}

/// Releases `found`'s held template: thaw's template and strategy written in one step
/// ([`release_patch`]); the apply that follows removes the label. Returns the Deployment as
/// the server now holds it.
pub async fn release(
    ctx: &Ctx,
    found: &Deployment,
    desired: &Deployment,
) -> Result<Deployment, Error> {
    let Some(patch) = release_patch(found, desired) else {
        return Ok(found.clone());
    };
    let pp = kube::api::PatchParams {
        field_manager: Some(crate::controller::FIELD_MANAGER.into()),
        ..Default::default()
    };
    let patch = serde_json::from_value(patch).map_err(|e| Error::Other(e.to_string()))?;
    Ok(ctx
        .api::<Deployment>(&found.namespace().unwrap_or_default())
        .patch(&found.name_any(), &pp, &kube::api::Patch::<()>::Json(patch))
        .await?)
}

/// Whether a slice of thaw's autoscaler for the public Service `public` holds a ready
/// endpoint (the activators or the pods).
fn serves(slices: &[EndpointSlice]) -> bool {
    slices.iter().any(|s| {
        s.labels()
            .get(labels::ENDPOINTSLICE_MANAGED_BY)
            .map(String::as_str)
            == Some(labels::MANAGED_BY_AUTOSCALER)
            && s.endpoints.iter().any(|e| {
                !e.addresses.is_empty()
                    && e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
            })
    })
}

/// Knative's v1 Endpoints of `rev`'s public Service `public` (adopted, now the revision's):
/// the ServerlessService reconciler wrote them by hand, pointing at Knative's activators or
/// the pods, and the EndpointSlice mirroring controller copies them into slices the gateways
/// read beside thaw's. They are deleted once thaw's autoscaler's slices for the Service hold
/// a ready endpoint, so the gateways always have thaw's endpoints and, from then on, only
/// those (the mirroring controller removes its copies with them). Only Endpoints whose
/// controller chain leads to the Revision, or that have no controller, are deleted.
///
/// Returns true when no such Endpoints are left; false while thaw's slices do not serve yet
/// (the caller re-checks soon).
pub async fn retire_public_endpoints(
    ctx: &Ctx,
    rev: &Revision,
    public: &str,
) -> Result<bool, Error> {
    let ns = rev.namespace().unwrap_or_default();
    let api = ctx.api::<Endpoints>(&ns);
    let Some(found) = api.get_opt(public).await? else {
        return Ok(true);
    };
    if chain::controller(&found.metadata).is_some() {
        let rev_uid = rev.uid().unwrap_or_default();
        let walked = chain::walk(
            "Endpoints",
            public,
            &found.metadata,
            "Revision",
            &rev.name_any(),
            &rev_uid,
            |k, n| {
                let ns = ns.clone();
                async move { get_meta(ctx, k, &ns, &n).await }
            },
        )
        .await?;
        if let Err(why) = walked {
            tracing::info!(kind = "Endpoints", name = %public, namespace = %ns, reason = %why,
                "left alone: its ownership chain does not lead to this Revision");
            return Ok(true);
        }
    }
    let lp = ListParams::default().labels(&format!(
        "{}={public},{}={}",
        labels::ENDPOINTSLICE_SERVICE_NAME,
        labels::ENDPOINTSLICE_MANAGED_BY,
        labels::MANAGED_BY_AUTOSCALER
    ));
    let slices = ctx.api::<EndpointSlice>(&ns).list(&lp).await?.items;
    if !serves(&slices) {
        tracing::debug!(service = %public, "Knative's Endpoints kept until thaw's slices serve");
        return Ok(false);
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: found.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(public, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(true),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(kind = "Endpoints", name = %public, namespace = %ns,
        "deleted Knative's Endpoints of an adopted public Service: thaw's EndpointSlices serve it");
    Ok(true)
}

/// Deletes `rev`'s PodAutoscaler and ServerlessService (named for it), Orphan, once the
/// Revision is Ready under thaw: the ServerlessService first, and only when it is the
/// PodAutoscaler's (by UID), the PodAutoscaler only when it is the Revision's. Their
/// finalizers, if any, go first ([`retire`]).
pub async fn retire_autoscaling(ctx: &Ctx, rev: &Revision) -> Result<(), Error> {
    let ns = rev.namespace().unwrap_or_default();
    let name = rev.name_any();
    let Some(pa) = get_meta(ctx, POD_AUTOSCALER, &ns, &name).await? else {
        return Ok(());
    };
    let controlled_by = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                         uid: Option<&str>| {
        chain::controller(m).is_some_and(|r| Some(r.uid.as_str()) == uid)
    };
    if !controlled_by(&pa, rev.metadata.uid.as_deref()) {
        return Ok(());
    }
    if let Some(sks) = get_meta(ctx, SERVERLESS_SERVICE, &ns, &name).await?
        && controlled_by(&sks, pa.uid.as_deref())
    {
        retire(ctx, SERVERLESS_SERVICE, &sks).await?;
    }
    retire(ctx, POD_AUTOSCALER, &pa).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::revision::fixtures::RevisionFixture;

    fn deployment(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Deployment {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "hello-00001-deployment",
                "labels": labels.iter().copied().collect::<std::collections::BTreeMap<_, _>>(),
                "annotations": annotations.iter().copied().collect::<std::collections::BTreeMap<_, _>>(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn knatives_deployment_is_held_until_released() {
        let rev = RevisionFixture::new("hello-00001").build();
        let knatives = deployment(&[], &[]);
        let thaws = deployment(&[], &[(APPLIED_ANNOTATION, "h")]);
        let held_one = deployment(
            &[(TEMPLATE_HELD_LABEL, "true")],
            &[(APPLIED_ANNOTATION, "h")],
        );
        assert!(template_held(true, &knatives, &rev));
        // Without the switch, Knative's is not adopted (today's behaviour); one held stays so.
        assert!(!template_held(false, &knatives, &rev));
        assert!(template_held(false, &held_one, &rev));
        // thaw's own is never held.
        assert!(!template_held(true, &thaws, &rev));
        // Released: nothing is held.
        let mut released_rev = rev.clone();
        released_rev
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RELEASE_TEMPLATE_ANNOTATION.into(), "true".into());
        assert!(!template_held(true, &knatives, &released_rev));
        assert!(!template_held(true, &held_one, &released_rev));
    }

    #[test]
    fn a_held_apply_carries_no_spec() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d", "labels": {"a": "b"}},
            "spec": {"selector": {}, "template": {}}
        }))
        .unwrap();
        let h = held(d);
        assert!(h.spec.is_none());
        assert_eq!(h.labels()[TEMPLATE_HELD_LABEL], "true");
        assert_eq!(h.labels()["a"], "b");
    }

    #[test]
    fn a_release_replaces_the_template_and_strategy_whole() {
        let found: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d", "uid": "dep-uid"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "queue-proxy", "image": "knative"}]}}}
        }))
        .unwrap();
        let desired: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d"},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "queue-proxy", "image": "thaw"}]}},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}}}
        }))
        .unwrap();
        let p = release_patch(&found, &desired).unwrap();
        assert_eq!(
            p[0],
            serde_json::json!({"op": "test", "path": "/metadata/uid", "value": "dep-uid"})
        );
        assert_eq!(p[1]["op"], "replace");
        assert_eq!(p[1]["value"]["spec"]["containers"][0]["image"], "thaw");
        assert_eq!(p[2]["value"]["rollingUpdate"]["maxUnavailable"], 0);
        // A held body has no spec: nothing to release with.
        assert_eq!(release_patch(&found, &held(desired)), None);
    }

    #[test]
    fn only_thaws_slices_with_a_ready_endpoint_serve() {
        let slice = |managed_by: &str, ready: Option<bool>| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "s", "labels": {labels::ENDPOINTSLICE_MANAGED_BY: managed_by}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready}}]
            }))
            .unwrap()
        };
        assert!(serves(&[slice(labels::MANAGED_BY_AUTOSCALER, Some(true))]));
        assert!(serves(&[slice(labels::MANAGED_BY_AUTOSCALER, None)]));
        assert!(!serves(&[slice(
            labels::MANAGED_BY_AUTOSCALER,
            Some(false)
        )]));
        assert!(!serves(&[slice(
            "endpointslicemirroring-controller.k8s.io",
            Some(true)
        )]));
        assert!(!serves(&[]));
    }
}
