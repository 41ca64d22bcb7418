//! Revision → Deployment, private and public Service, and (HPA class) a
//! HorizontalPodAutoscaler; the Revision's `ResourcesAvailable`, `ContainerHealthy` and
//! `Ready` from the Deployment and the revision's pods (Knative's revision reconciler, with
//! the KPA's ServerlessService pair of Services folded in).
//!
//! Each reconcile:
//! 1. resolves the revision against the settings snapshot ([`resolve`]); an invalid revision
//!    gets `ResourcesAvailable=False` / `Ready=False` `InvalidSpec` with every field named, a
//!    Warning Event, no child written, and is not retried until it changes;
//! 2. the Deployment ([`deployment`]): **created** (POST) with the revision's initial scale
//!    when missing, after a dry run of its pod when `kubernetes.podspec-dryrun` asks for one
//!    ([`wants_dry_run`]; a refusal is `InvalidSpec` like the validation's); otherwise applied server-side **without `spec.replicas`**, so the field
//!    stays with whoever last set it (the autoscaler's `/scale`), never reset by the
//!    controller;
//! 3. the private and public Services ([`services`]) and, for the HPA class, the HPA
//!    ([`hpa`]), applied server-side;
//! 4. the status ([`status`]), written with `replace_status` only when it changed.
//!
//! Every child carries a controller owner reference to the revision. One that exists and is
//! controlled by someone else is not touched: the revision is `NotOwned` (a Warning Event when
//! it becomes so) and the reconcile is retried with backoff. Under `--adopt-knative`
//! ([`crate::controller::adopt`]) Knative's Services, whose chain leads to the revision, are
//! re-owned in place instead; Knative's Deployment keeps its template until released; the
//! public Service's Endpoints, ServerlessService and PodAutoscaler are retired.
//!
//! The controller owns Deployments, Services and HPAs (each selected by the label
//! `serving.knative.dev/revision`), and watches the revisions' Pods by the same label, so a
//! pod that starts crashing re-queues its revision at once.

pub mod deployment;
pub mod hpa;
pub mod meta;
pub mod queue;
pub mod resolve;
pub mod services;
pub mod status;

#[cfg(test)]
pub(crate) mod fixtures;

use std::sync::Arc;

use crate::controller::Applied;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::informers::Informer;
use super::{Ctx, Error, EventKind, FIELD_MANAGER, Settings, adopt, now};
use crate::config::FeaturesConfig;
use crate::config::features::{DRYRUN_ANNOTATION, Flag};
use crate::knative::names::labels;
use crate::knative::{Revision, validate};
use resolve::Resolved;
use status::{Observed, reason};

/// The kind's name in metrics, spans and the backoff bookkeeping.
pub const KIND: &str = "Revision";

/// Pods read to explain a revision with no available replica (the first with a problem
/// decides).
const PODS_READ: u32 = 10;

/// The revision resolved, or every problem in one message naming each field: Knative's
/// webhook rules first ([`crate::knative::validate::revision`], with the namespace's
/// config-defaults), then the resolver's own (the sidecar's limits).
pub fn check(rev: &Revision, settings: &Settings) -> Result<Resolved, String> {
    let errors = validate::revision(
        rev,
        &settings.defaults,
        &settings.autoscaler,
        &settings.features,
    );
    if !errors.is_empty() {
        return Err(validate::render(&errors));
    }
    let defaults = settings
        .defaults
        .for_namespace(&rev.namespace().unwrap_or_default());
    let mut r = resolve::resolve(rev, defaults, &settings.autoscaler, &settings.deployment)
        .map_err(|p| {
            p.0.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        })?;
    r.proxy_tag = settings.proxy_tags.tag(&r.namespace, &r.name, &r.uid);
    Ok(r)
}

/// Applies `desired` unless an object of its name exists that the revision does not control.
async fn apply<K>(ctx: &Ctx, rev: &Revision, desired: &K) -> Result<Applied<K>, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    crate::controller::apply_owned(ctx, rev, desired, None, |_, _| false).await
}

/// Whether the revision's pod is dry-run before its Deployment is created
/// (`kubernetes.podspec-dryrun`: `enabled`, or `allowed` and the revision annotated
/// `features.knative.dev/podspec-dryrun: enabled`).
pub fn wants_dry_run(rev: &Revision, features: &FeaturesConfig) -> bool {
    match features.podspec_dryrun {
        Flag::Enabled => true,
        Flag::Allowed => rev
            .annotations()
            .get(DRYRUN_ANNOTATION)
            .is_some_and(|v| v.eq_ignore_ascii_case("enabled")),
        Flag::Disabled => false,
    }
}

/// Knative's pod dry run: the revision's pod, as its Deployment would make it, created with
/// `dryRun=All` in its namespace, so what the namespace refuses (Pod Security admission,
/// quotas, limit ranges, other webhooks) refuses the revision. `Some(message)`: refused.
/// An API server that cannot dry-run pods, or thaw lacking the right to ask, is logged and
/// the revision goes on (as Knative's webhook does); other failures are retried.
async fn dry_run(
    ctx: &Ctx,
    rev: &Revision,
    r: &Resolved,
    settings: &Settings,
) -> Result<Option<String>, Error> {
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(crate::knative::names::child_name(&r.name, "-dryrun")),
            namespace: Some(r.namespace.clone()),
            labels: Some(meta::child_labels(rev)),
            ..Default::default()
        },
        spec: Some(deployment::pod_spec(
            rev,
            r,
            &settings.deployment,
            &settings.features,
        )),
        status: None,
    };
    let pp = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match ctx.api::<Pod>(&r.namespace).create(&pp, &pod).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(ae)) => {
            let unsupported = ae.message.contains("does not support dry run");
            let not_allowed = ae.message.contains("cannot create resource");
            if unsupported || not_allowed || ae.code == 409 {
                tracing::warn!(revision = %r.name, code = ae.code, message = %ae.message,
                    "pod dry run not possible; going on without it");
                Ok(None)
            } else if (400..500).contains(&ae.code) && ae.code != 429 {
                Ok(Some(format!("dry run failed with {}", ae.message)))
            } else {
                Err(kube::Error::Api(ae).into())
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// What became of the Deployment.
enum DeploymentOutcome {
    /// Created now (its status comes later).
    Created,
    /// Applied over the existing one (boxed: a Deployment is large).
    Applied(Box<Applied<Deployment>>),
    /// Not created: the pod dry run was refused (the message).
    Refused(String),
}

/// The previous form's proxy tag the revision's Deployment carries
/// ([`crate::knative::proxy_tag`], this release only): the one the live Deployment holds, never
/// recomputed (a stats-token rotation changes no template); for a Deployment created at `now`,
/// one computed within the upgrade window.
pub fn legacy_proxy_tag(
    live: Option<&Deployment>,
    r: &Resolved,
    settings: &Settings,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<String> {
    match live {
        Some(live) => queue::live_legacy_tag(live),
        None => settings
            .proxy_tags
            .legacy_for_new(&r.namespace, &r.name, now.0),
    }
}

/// The Deployment: created with the initial scale (after the pod dry run when asked for),
/// else applied without replicas.
async fn reconcile_deployment(
    ctx: &Ctx,
    rev: &Revision,
    r: &Resolved,
    settings: &Settings,
) -> Result<DeploymentOutcome, Error> {
    let api = ctx.api::<Deployment>(&r.namespace);
    let name = deployment::deployment_name(&r.name);
    let live = api.get_opt(&name).await?;
    let r = &Resolved {
        legacy_proxy_tag: legacy_proxy_tag(live.as_ref(), r, settings, &now()),
        ..r.clone()
    };
    match live {
        None => {
            if wants_dry_run(rev, &settings.features)
                && let Some(refused) = dry_run(ctx, rev, r, settings).await?
            {
                return Ok(DeploymentOutcome::Refused(refused));
            }
            let initial = deployment::initial_replicas(r);
            let mut d = deployment::deployment(
                rev,
                r,
                &settings.deployment,
                &settings.features,
                Some(initial),
            );
            // Created as the later applies would write it (they leave `replicas` out): the
            // first reconcile after this one finds nothing to apply.
            let applied =
                deployment::deployment(rev, r, &settings.deployment, &settings.features, None);
            let hash = crate::controller::apply::applied_hash(&applied)
                .map_err(|e| Error::Other(e.to_string()))?;
            d.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(crate::controller::apply::APPLIED_ANNOTATION.into(), hash);
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            api.create(&pp, &d).await?;
            tracing::info!(deployment = %name, replicas = initial, "deployment created");
            Ok(DeploymentOutcome::Created)
        }
        Some(existing) => {
            let mut d =
                deployment::deployment(rev, r, &settings.deployment, &settings.features, None);
            // An adopted Deployment keeps the pod template it was found with until released;
            // released, thaw's replaces it whole before the apply.
            let mut existing = existing;
            if crate::controller::is_owned_by(&existing.metadata, rev) {
                let held = adopt::revision::template_held(ctx.adopt(), &existing, rev);
                adopt::revision::log_hold(&existing, rev, held);
                if held {
                    d = adopt::revision::held(d);
                } else if adopt::revision::is_held(&existing) {
                    existing = adopt::revision::release(ctx, &existing, &d).await?;
                }
            }
            crate::controller::apply_owned(ctx, rev, &d, Some(existing), |_, _| false)
                .await
                .map(|a| DeploymentOutcome::Applied(Box::new(a)))
        }
    }
}

/// The revision's pods (a few), to explain why none is available.
async fn pods(ctx: &Ctx, r: &Resolved) -> Result<Vec<Pod>, Error> {
    let lp = ListParams::default()
        .labels(&format!("{}={}", labels::REVISION_UID, r.uid))
        .limit(PODS_READ);
    Ok(ctx.api::<Pod>(&r.namespace).list(&lp).await?.items)
}

/// Writes `next` as the revision's status when it differs from what was read (a PUT with the
/// `resourceVersion` read: a concurrent write is a 409, retried).
async fn write_status(
    ctx: &Ctx,
    rev: &Revision,
    next: crate::knative::RevisionStatus,
) -> Result<(), Error> {
    if rev.status.as_ref() == Some(&next) {
        return Ok(());
    }
    let before = rev.status.clone().unwrap_or_default();
    let mut obj = rev.clone();
    obj.status = Some(next.clone());
    ctx.api::<Revision>(&rev.namespace().unwrap_or_default())
        .replace_status(&rev.name_any(), &PostParams::default(), &obj)
        .await?;
    let ready = |s: &crate::knative::RevisionStatus| {
        s.status
            .condition(crate::knative::condition::READY)
            .map(|c| c.status)
    };
    if ready(&next) != ready(&before)
        && ready(&next) == Some(crate::knative::duck::ConditionStatus::True)
    {
        ctx.event(
            rev,
            EventKind::Normal,
            "RevisionReady",
            "Revision becomes ready upon all resources being ready".into(),
        )
        .await;
    }
    Ok(())
}

/// Whether the revision's status says `NotOwned` already (the Event is sent on the change).
fn was_not_owned(rev: &Revision) -> bool {
    rev.status
        .as_ref()
        .and_then(|s| {
            s.status
                .condition(crate::knative::condition::RESOURCES_AVAILABLE)
        })
        .is_some_and(|c| c.reason.as_deref() == Some(reason::NOT_OWNED))
}

/// Marks the revision invalid (`InvalidSpec` with `message`), with a Warning Event; not
/// retried until it changes.
async fn refuse(ctx: &Ctx, rev: &Revision, message: String) -> Result<Action, Error> {
    let seen = Observed::Invalid(&message);
    write_status(ctx, rev, status::revision_status(rev, seen, &now())).await?;
    ctx.event(
        rev,
        EventKind::Warning,
        reason::INVALID_SPEC,
        message.clone(),
    )
    .await;
    Err(Error::Invalid(message))
}

/// Reconciles one Revision (see the module docs).
pub async fn reconcile(rev: Arc<Revision>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let settings = ctx.settings();
    let t = now();
    let r = match check(&rev, &settings) {
        Ok(r) => r,
        Err(message) => return refuse(&ctx, &rev, message).await,
    };

    let mut not_owned: Option<(String, String)> = None;
    let dep = match reconcile_deployment(&ctx, &rev, &r, &settings).await? {
        DeploymentOutcome::Created => None,
        DeploymentOutcome::Applied(applied) => match *applied {
            Applied::Ours(d) => Some(d),
            Applied::NotOwned { kind: k, name: n } => {
                not_owned = Some((k, n));
                None
            }
        },
        DeploymentOutcome::Refused(message) => return refuse(&ctx, &rev, message).await,
    };
    let mut children = vec![
        services::private_service(&rev, &r),
        services::public_service(&rev, &r),
    ]
    .into_iter();
    while not_owned.is_none()
        && let Some(svc) = children.next()
    {
        if let Applied::NotOwned { kind: k, name: n } = apply(&ctx, &rev, &svc).await? {
            not_owned = Some((k, n));
        }
    }
    if not_owned.is_none()
        && hpa::is_hpa_class(&r)
        && let Applied::NotOwned { kind: k, name: n } =
            apply(&ctx, &rev, &hpa::hpa(&rev, &r)).await?
    {
        not_owned = Some((k, n));
    }

    if let Some((kind, name)) = &not_owned {
        let seen = Observed::NotOwned { kind, name };
        let next = status::revision_status(&rev, seen, &t);
        if !was_not_owned(&rev) {
            ctx.event(
                &*rev,
                EventKind::Warning,
                reason::NOT_OWNED,
                format!("There is an existing {kind} {name:?} that we do not own."),
            )
            .await;
        }
        write_status(&ctx, &rev, next).await?;
        return Err(Error::Other(format!(
            "revision {:?} does not own {kind} {name:?}",
            r.name
        )));
    }

    // Under --adopt-knative, Knative's Endpoints of the public Service (now the revision's)
    // go once thaw's slices serve it.
    let endpoints_left = ctx.adopt()
        && !adopt::revision::retire_public_endpoints(&ctx, &rev, &services::public_name(&r.name))
            .await?;

    let next = match &dep {
        None => status::revision_status(&rev, Observed::Created, &t),
        Some(d) => {
            let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let available = d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            let pods = if wanted > 0 && available == 0 {
                pods(&ctx, &r).await?
            } else {
                Vec::new()
            };
            let seen = Observed::Deployment {
                deployment: d,
                pods: &pods,
            };
            status::revision_status(&rev, seen, &t)
        }
    };
    let ready = next
        .status
        .condition(crate::knative::condition::READY)
        .is_some_and(|c| c.status == crate::knative::duck::ConditionStatus::True);
    write_status(&ctx, &rev, next).await?;
    if endpoints_left {
        return Ok(Action::requeue(ADOPT_RECHECK));
    }
    if ctx.adopt() && ready {
        adopt::revision::retire_autoscaling(&ctx, &rev).await?;
    }
    Ok(Action::requeue(ctx.resync()))
}

/// How soon a revision whose public Service still has Knative's Endpoints (thaw's slices do
/// not serve it yet) is reconciled again: two reads per revision per period while the
/// autoscaler has not written its slices (normally within a second of the Service's
/// adoption; longer only while the autoscaler is away).
pub const ADOPT_RECHECK: tokio::time::Duration = tokio::time::Duration::from_secs(5);

/// The shared watches the Revision controller reads: Revisions, and their Deployments,
/// Services, HPAs and Pods (by the revision label).
#[allow(clippy::type_complexity)]
pub fn watches(
    ctx: &Ctx,
) -> (
    Informer<Revision>,
    Informer<Deployment>,
    Informer<Service>,
    Informer<HorizontalPodAutoscaler>,
    Informer<Pod>,
) {
    let by_revision = Some(labels::REVISION);
    (
        ctx.informer(None),
        ctx.informer(by_revision),
        ctx.informer(by_revision),
        ctx.informer(by_revision),
        ctx.informer(by_revision),
    )
}

/// The Revision controller: owns the revisions' Deployments, Services and HPAs, and follows
/// their Pods (a pod's change re-queues its revision).
pub async fn controller(ctx: Arc<Ctx>) {
    use crate::controller::child_watch;
    let (revisions, deployments, services, hpas, pods) = watches(&ctx);
    let (store, revision_stream) = crate::controller::main_watch(&revisions);
    let controller = Controller::for_stream(revision_stream, store)
        .owns_stream(child_watch(&deployments))
        .owns_stream(child_watch(&services))
        .owns_stream(child_watch(&hpas))
        .watches_stream(child_watch(&pods), |pod: Pod| {
            let ns = pod.namespace()?;
            let rev = pod.labels().get(labels::REVISION)?;
            Some(ObjectRef::<Revision>::new(rev).within(&ns))
        });
    super::run(ctx.clone(), KIND, controller, reconcile).await;
}
