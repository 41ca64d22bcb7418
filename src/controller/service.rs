//! Service → Configuration + Route (Knative's `service.go`): both named after the Service and
//! owned by it; the Service's status mirrors theirs.
//!
//! - `ConfigurationsReady` follows the Configuration's `Ready` (Unknown `OutOfDate` while the
//!   Configuration has not observed its latest generation);
//! - `RoutesReady` follows the Route's `Ready` (Unknown `OutOfDate` likewise, and Unknown
//!   `TrafficNotMigrated` while the Route's traffic does not yet carry the split the Service
//!   asks for with the latest ready revision substituted);
//! - `Ready` = both. A child that exists but is not the Service's is left alone and reported
//!   False `NotOwned`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::informers::Informer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::{Applied, Ctx, Error, EventKind, apply_owned, now, owner_ref};
use crate::knative::duck::{Condition, ConditionStatus};
use crate::knative::names::labels;
use crate::knative::validate;
use crate::knative::{
    Configuration, ConfigurationSpec, Route, RouteSpec, Service, ServiceStatus, TrafficTarget,
    condition,
};

/// The kind, in metrics and spans.
pub const KIND: &str = "Service";

/// Knative's Service condition types.
pub mod conditions {
    pub const CONFIGURATIONS_READY: &str = "ConfigurationsReady";
    pub const ROUTES_READY: &str = "RoutesReady";
}

/// Labels and annotations a Service passes to its children: its own (without kubectl's
/// last-applied copy) plus `serving.knative.dev/service`.
fn child_meta(svc: &Service) -> ObjectMeta {
    let mut lbl: BTreeMap<String, String> = svc.labels().clone();
    lbl.insert(labels::SERVICE.into(), labels::value(&svc.name_any()));
    if let Some(uid) = &svc.metadata.uid {
        lbl.insert(labels::SERVICE_UID.into(), uid.clone());
    }
    let mut ann = svc.annotations().clone();
    ann.remove("kubectl.kubernetes.io/last-applied-configuration");
    ObjectMeta {
        name: Some(svc.name_any()),
        namespace: svc.namespace(),
        labels: Some(lbl),
        annotations: (!ann.is_empty()).then_some(ann),
        owner_references: Some(vec![owner_ref(svc)]),
        ..Default::default()
    }
}

/// The Configuration of `svc` (Knative's `MakeConfiguration`).
pub fn make_configuration(svc: &Service) -> Configuration {
    Configuration {
        metadata: child_meta(svc),
        spec: ConfigurationSpec {
            template: svc.spec.configuration.template.clone(),
        },
        status: None,
    }
}

/// The traffic a Service asks for, defaulted as Knative's webhook and `MakeRoute` do: none
/// written means 100 % to the latest ready revision; a `latestRevision: true` target without a
/// configuration follows the Service's own.
pub fn service_traffic(svc: &Service) -> Vec<TrafficTarget> {
    let name = svc.name_any();
    if svc.spec.route.traffic.is_empty() {
        return vec![TrafficTarget {
            configuration_name: Some(name),
            latest_revision: Some(true),
            percent: Some(100),
            ..Default::default()
        }];
    }
    svc.spec
        .route
        .traffic
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if t.revision_name.is_none() && t.configuration_name.is_none() {
                t.configuration_name = Some(name.clone());
                t.latest_revision.get_or_insert(true);
            }
            t
        })
        .collect()
}

/// The Route of `svc` (Knative's `MakeRoute`).
pub fn make_route(svc: &Service) -> Route {
    Route {
        metadata: child_meta(svc),
        spec: RouteSpec {
            traffic: service_traffic(svc),
        },
        status: None,
    }
}

/// The traffic the Route should report once it has caught up: the Service's targets with the
/// latest ready revision named (Knative's `TrafficNotMigrated` check compares these).
fn expected_traffic(
    svc: &Service,
    latest_ready: Option<&str>,
) -> Option<Vec<(String, Option<String>, i64)>> {
    let mut out = Vec::new();
    for t in service_traffic(svc) {
        let rev = match (&t.revision_name, t.latest_revision) {
            (Some(r), _) if t.latest_revision != Some(true) => r.clone(),
            _ => latest_ready?.to_string(),
        };
        out.push((rev, t.tag.clone(), t.percent.unwrap_or(0)));
    }
    out.sort();
    Some(out)
}

fn reported_traffic(route: &Route) -> Vec<(String, Option<String>, i64)> {
    let mut out: Vec<_> = route
        .status
        .as_ref()
        .map(|s| {
            s.fields
                .traffic
                .iter()
                .map(|t| {
                    (
                        t.revision_name.clone().unwrap_or_default(),
                        t.tag.clone(),
                        t.percent.unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// A child's condition mirrored onto the Service: Unknown `OutOfDate` until the child observed
/// its latest generation, else its `Ready`.
fn mirrored(
    type_: &str,
    kind: &str,
    generation: Option<i64>,
    observed: Option<i64>,
    ready: Option<&Condition>,
) -> Condition {
    if observed != generation {
        return Condition {
            reason: Some("OutOfDate".into()),
            message: Some(format!(
                "The {kind} is still working to reflect the latest desired specification."
            )),
            ..Condition::new(type_, ConditionStatus::Unknown)
        };
    }
    match ready {
        Some(c) => Condition {
            reason: c.reason.clone(),
            message: c.message.clone(),
            ..Condition::new(type_, c.status)
        },
        None => Condition::new(type_, ConditionStatus::Unknown),
    }
}

/// Why a Service cannot be reconciled as written: the condition it fails, Knative's reason
/// and the message ([`crate::knative::validate`]'s table).
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub condition: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// Every problem of `svc` as written (Knative's validation, then the resolver's), as the
/// condition it sets.
pub fn invalid(svc: &Service, settings: &super::Settings) -> Option<Invalid> {
    let mut e = validate::service(
        svc,
        &settings.defaults,
        &settings.autoscaler,
        &settings.features,
    );
    if e.is_empty() {
        let ns = svc.namespace().unwrap_or_default();
        e = super::configuration::template_problems(
            &ns,
            &svc.name_any(),
            &svc.spec.configuration.template,
            settings,
            settings.defaults.for_namespace(&ns),
        );
    }
    if e.is_empty() {
        return None;
    }
    let (condition, reason) = validate::reason::for_service(&e);
    let message = if reason == validate::reason::REVISION_FAILED {
        validate::revision_creation_failed(&e)
    } else {
        validate::render(&e)
    };
    Some(Invalid {
        condition,
        reason,
        message,
    })
}

/// The Service's status from its children (`None`: not created yet, or not ours). Pure.
pub fn compute_status(
    svc: &Service,
    cfg: Result<Option<&Configuration>, &str>,
    route: Result<Option<&Route>, &str>,
    invalid: Option<&Invalid>,
) -> ServiceStatus {
    let mut st = svc.status.clone().unwrap_or_default();
    let t = now();
    st.status.observed_generation = svc.metadata.generation;
    if let Some(inv) = invalid {
        let c = Condition {
            reason: Some(inv.reason.into()),
            message: Some(inv.message.clone()),
            ..Condition::new(inv.condition, ConditionStatus::False)
        };
        st.status.set(c, &t);
        st.status.set_ready_from(
            condition::READY,
            &[conditions::CONFIGURATIONS_READY, conditions::ROUTES_READY],
            &t,
        );
        return st;
    }
    let not_owned = |type_: &str, msg: &str| Condition {
        reason: Some("NotOwned".into()),
        message: Some(msg.to_string()),
        ..Condition::new(type_, ConditionStatus::False)
    };
    let mut latest_ready = None;
    match cfg {
        Err(msg) => st
            .status
            .set(not_owned(conditions::CONFIGURATIONS_READY, msg), &t),
        Ok(None) => st.status.set(
            Condition::new(conditions::CONFIGURATIONS_READY, ConditionStatus::Unknown),
            &t,
        ),
        Ok(Some(c)) => {
            let cs = c.status.clone().unwrap_or_default();
            st.configuration = cs.fields.clone();
            latest_ready = cs.fields.latest_ready_revision_name.clone();
            st.status.set(
                mirrored(
                    conditions::CONFIGURATIONS_READY,
                    "Configuration",
                    c.metadata.generation,
                    cs.status.observed_generation,
                    cs.status.condition(condition::READY),
                ),
                &t,
            );
        }
    }
    match route {
        Err(msg) => st.status.set(not_owned(conditions::ROUTES_READY, msg), &t),
        Ok(None) => st.status.set(
            Condition::new(conditions::ROUTES_READY, ConditionStatus::Unknown),
            &t,
        ),
        Ok(Some(r)) => {
            let rs = r.status.clone().unwrap_or_default();
            st.route = rs.fields.clone();
            let mut c = mirrored(
                conditions::ROUTES_READY,
                "Route",
                r.metadata.generation,
                rs.status.observed_generation,
                rs.status.condition(condition::READY),
            );
            if c.status == ConditionStatus::True
                && expected_traffic(svc, latest_ready.as_deref()).as_ref()
                    != Some(&reported_traffic(r))
            {
                c = Condition {
                    reason: Some("TrafficNotMigrated".into()),
                    message: Some("Traffic is not yet migrated to the latest revision.".into()),
                    ..Condition::new(conditions::ROUTES_READY, ConditionStatus::Unknown)
                };
            }
            st.status.set(c, &t);
        }
    }
    st.status.set_ready_from(
        condition::READY,
        &[conditions::CONFIGURATIONS_READY, conditions::ROUTES_READY],
        &t,
    );
    st
}

/// Applies `desired` unless an object of that name exists that is not the Service's; what the
/// server holds afterwards, or the NotOwned message.
async fn apply_child<K>(ctx: &Ctx, svc: &Service, desired: &K) -> Result<Result<K, String>, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Ok(
        match apply_owned(ctx, svc, desired, None, |_, _| false).await? {
            Applied::Ours(k) => Ok(k),
            Applied::NotOwned { kind, name } => Err(Applied::<K>::not_owned_message(&kind, &name)),
        },
    )
}

/// Reconciles one Service.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let settings = ctx.settings();
    let invalid = invalid(&svc, &settings);
    let mut children_ours = true;
    let status = if invalid.is_none() {
        let cfg = apply_child(&ctx, &svc, &make_configuration(&svc)).await?;
        let route = apply_child(&ctx, &svc, &make_route(&svc)).await?;
        children_ours = cfg.is_ok() && route.is_ok();
        compute_status(
            &svc,
            cfg.as_ref().map(Some).map_err(String::as_str),
            route.as_ref().map(Some).map_err(String::as_str),
            None,
        )
    } else {
        compute_status(&svc, Ok(None), Ok(None), invalid.as_ref())
    };
    let before = svc.status.clone().unwrap_or_default();
    if status != before {
        for (type_, what) in [
            (conditions::CONFIGURATIONS_READY, "Configuration"),
            (conditions::ROUTES_READY, "Route"),
        ] {
            let c = status.status.condition(type_);
            if c.is_some_and(|c| c.reason.as_deref() == Some("NotOwned"))
                && before
                    .status
                    .condition(type_)
                    .and_then(|c| c.reason.as_deref())
                    != Some("NotOwned")
            {
                ctx.event(
                    &*svc,
                    EventKind::Warning,
                    "NotOwned",
                    format!("{what} {name:?} exists and is not owned by this Service"),
                )
                .await;
            }
        }
        let mut next = (*svc).clone();
        next.status = Some(status.clone());
        ctx.api::<Service>(&ns)
            .replace_status(&name, &PostParams::default(), &next)
            .await?;
    }
    if let Some(inv) = invalid {
        ctx.event(
            &*svc,
            EventKind::Warning,
            "InvalidSpec",
            inv.message.clone(),
        )
        .await;
        return Err(Error::Invalid(inv.message));
    }
    if !children_ours {
        return Err(Error::Other(format!(
            "a child of Service {name:?} is not ours"
        )));
    }
    Ok(Action::requeue(ctx.resync()))
}

/// The shared watches the Service controller reads: Services, Configurations, Routes.
pub fn watches(ctx: &Ctx) -> (Informer<Service>, Informer<Configuration>, Informer<Route>) {
    (ctx.informer(None), ctx.informer(None), ctx.informer(None))
}

/// The Service controller: owns Configurations and Routes.
pub async fn controller(ctx: Arc<Ctx>) {
    let (services, configurations, routes) = watches(&ctx);
    let (store, service_stream) = super::main_watch(&services);
    let controller = Controller::for_stream(service_stream, store)
        .owns_stream(super::child_watch(&configurations))
        .owns_stream(super::child_watch(&routes));
    super::run(ctx.clone(), KIND, controller, reconcile).await;
}
