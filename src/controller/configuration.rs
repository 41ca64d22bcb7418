//! Configuration → Revision (Knative's `configuration.go` and `resources/revision.go`).
//!
//! Each template change (a new `metadata.generation`) stamps out one Revision, named
//! `child_name(<configuration>, "-%05d" % generation)` or the template's own
//! `metadata.name`. **Defaults are resolved here, once**, into the Revision's spec from
//! `config-defaults` (with the namespace's section, if any): a later edit of config-defaults
//! changes new revisions only, as in Knative. The status follows the revisions:
//! `latestCreatedRevisionName` is the current generation's, `latestReadyRevisionName` the newest
//! Ready one from the last ready generation up to the current one; `Ready` mirrors the latest
//! created revision (False `RevisionFailed` when it failed).

use crate::controller::route::labeler::ROUTES_ANNOTATION;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;

use super::informers::Informer;

use super::{Ctx, Error, EventKind, Settings, is_owned_by, now, owner_ref};
use crate::config::{ConfigSet, DefaultsConfig};
use crate::knative::duck::{Condition, ConditionStatus};
use crate::knative::names::{child_name, labels};
use crate::knative::validate::{self, FieldError};
use crate::knative::{
    Configuration, ConfigurationStatus, Revision, RevisionSpec, RevisionTemplateSpec, condition,
};

/// The kind, in metrics and spans.
pub const KIND: &str = "Configuration";

/// Knative's routing-state label values (`serving.knative.dev/routingState`).
pub mod routing_state {
    /// Created, not yet routed or unrouted.
    pub const PENDING: &str = "pending";
    /// A Route sends it traffic.
    pub const ACTIVE: &str = "active";
    /// No Route sends it traffic any more.
    pub const RESERVE: &str = "reserve";
    /// When the routing state last changed (RFC 3339).
    pub const MODIFIED_ANNOTATION: &str = "serving.knative.dev/routingStateModified";
}

/// The revision name of `cfg`'s current generation.
pub fn revision_name(cfg: &Configuration) -> String {
    match cfg.spec.template.metadata.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => child_name(
            &cfg.name_any(),
            &format!("-{:05}", cfg.metadata.generation.unwrap_or(0)),
        ),
    }
}

/// The revision spec with every default resolved (Knative's `RevisionSpec.SetDefaults` with
/// `config-defaults`): containerConcurrency, timeoutSeconds (0 means the default), the
/// response-start and idle timeouts when configured and shorter than the timeout, container
/// names ([`crate::knative::names::default_container_names`]), the serving container's
/// readiness probe ([`default_readiness_probe`]), `enableServiceLinks: false` unless the
/// user set it, and `readOnly: true` on every container's mount of a volume that is neither an
/// emptyDir nor a persistentVolumeClaim (which validation requires of such a mount).
pub fn defaulted_spec(template: &RevisionSpec, d: &DefaultsConfig) -> RevisionSpec {
    let mut spec = template.clone();
    if spec.container_concurrency.is_none() {
        spec.container_concurrency = Some(i64::from(d.container_concurrency));
    }
    if spec.timeout_seconds.unwrap_or(0) == 0 {
        spec.timeout_seconds = Some(d.revision_timeout.as_secs() as i64);
    }
    // Knative applies the response-start and idle defaults only when set and shorter than
    // the revision's timeout (a longer one would make the revision invalid).
    let timeout = spec.timeout_seconds.unwrap_or(0);
    let shorter = |t: i64| (t > 0 && t < timeout).then_some(t);
    if spec.response_start_timeout_seconds.is_none() {
        spec.response_start_timeout_seconds = d
            .revision_response_start_timeout
            .and_then(|t| shorter(t.as_secs() as i64));
    }
    if spec.idle_timeout_seconds.is_none() {
        spec.idle_timeout_seconds = shorter(d.revision_idle_timeout.as_secs() as i64);
    }
    crate::knative::names::default_container_names(&mut spec.pod_spec);
    let serving =
        crate::controller::revision::resolve::serving_container(&spec.pod_spec.containers);
    if let Some(c) = spec.pod_spec.containers.get_mut(serving) {
        default_readiness_probe(c);
    }
    if spec.pod_spec.enable_service_links.is_none() {
        spec.pod_spec.enable_service_links = Some(false);
    }
    // Knative's `applyDefault`, containers only (not init containers), whatever was set.
    let writable: Vec<String> = spec
        .pod_spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.empty_dir.is_some() || v.persistent_volume_claim.is_some())
        .map(|v| v.name.clone())
        .collect();
    for c in &mut spec.pod_spec.containers {
        for m in c.volume_mounts.iter_mut().flatten() {
            if !writable.contains(&m.name) {
                m.read_only = Some(true);
            }
        }
    }
    spec
}

/// Knative's readiness-probe defaulting of the serving container: a TCP probe of the serving
/// port when no handler is given, `successThreshold: 1`, and with a `periodSeconds`
/// Kubernetes' `failureThreshold: 3` and `timeoutSeconds: 1`.
pub fn default_readiness_probe(c: &mut k8s_openapi::api::core::v1::Container) {
    let p = c.readiness_probe.get_or_insert_with(Default::default);
    if p.tcp_socket.is_none() && p.http_get.is_none() && p.exec.is_none() && p.grpc.is_none() {
        p.tcp_socket = Some(k8s_openapi::api::core::v1::TCPSocketAction {
            port: k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0),
            host: None,
        });
    }
    if p.success_threshold.unwrap_or(0) == 0 {
        p.success_threshold = Some(1);
    }
    if p.period_seconds.unwrap_or(0) != 0 {
        if p.failure_threshold.unwrap_or(0) == 0 {
            p.failure_threshold = Some(3);
        }
        if p.timeout_seconds.unwrap_or(0) == 0 {
            p.timeout_seconds = Some(1);
        }
    }
}

/// What the data plane's resolver finds wrong with the defaulted template (the
/// `activator.thaw.dev/*` annotations and anything the validation lets through), each naming
/// its field under `spec.template`.
pub fn template_problems(
    namespace: &str,
    name: &str,
    template: &RevisionTemplateSpec,
    settings: &Settings,
    defaults: &DefaultsConfig,
) -> Vec<FieldError> {
    let spec = &template.spec;
    let configs = ConfigSet {
        autoscaler: Arc::new(settings.autoscaler.clone()),
        defaults: Arc::new(defaults.clone()),
        activator: Default::default(),
        gc: Arc::new(settings.gc.clone()),
    };
    let u = |v: Option<i64>| v.map(|x| x.max(0) as u64);
    let input = crate::config::revision::RevisionInput {
        namespace: namespace.into(),
        name: name.into(),
        service: None,
        container_concurrency: spec
            .container_concurrency
            .map(|c| c.clamp(0, u32::MAX as i64) as u32),
        timeout_seconds: u(spec.timeout_seconds),
        response_start_timeout_seconds: u(spec.response_start_timeout_seconds),
        idle_timeout_seconds: u(spec.idle_timeout_seconds),
        port_name: None,
        annotations: template.metadata.annotations.clone().unwrap_or_default(),
        hosts: Vec::new(),
        unreachable: false,
        uid: None,
    };
    match crate::config::revision::resolve_revision(&input, &configs) {
        Ok(_) => Vec::new(),
        Err(p) => {
            p.0.iter()
                .map(|p| FieldError {
                    path: match p.key.strip_prefix("spec.") {
                        Some(f) => format!("spec.template.spec.{f}"),
                        None => format!("spec.template.metadata.annotations.{}", p.key),
                    },
                    message: if p.value.is_empty() {
                        p.reason.clone()
                    } else {
                        format!("invalid value: {}: {}", p.value, p.reason)
                    },
                    details: None,
                })
                .collect()
        }
    }
}

/// Every problem of `cfg` as written: Knative's validation, then the resolver's.
pub fn problems(cfg: &Configuration, settings: &Settings) -> Vec<FieldError> {
    let e = validate::configuration(
        cfg,
        &settings.defaults,
        &settings.autoscaler,
        &settings.features,
    );
    if !e.is_empty() {
        return e;
    }
    let ns = cfg.namespace().unwrap_or_default();
    template_problems(
        &ns,
        &cfg.name_any(),
        &cfg.spec.template,
        settings,
        settings.defaults.for_namespace(&ns),
    )
}

/// Knative's `serving.knative.dev/creator`: who created the object (set by the webhook).
pub const CREATOR_ANNOTATION: &str = "serving.knative.dev/creator";
/// The Revision of `cfg`'s current generation, as the controller creates it.
pub fn make_revision(
    cfg: &Configuration,
    defaults: &DefaultsConfig,
    now_rfc3339: &str,
) -> Revision {
    let name = revision_name(cfg);
    let t = &cfg.spec.template;
    let mut lbl: BTreeMap<String, String> = t.metadata.labels.clone().unwrap_or_default();
    lbl.insert(labels::CONFIGURATION.into(), labels::value(&cfg.name_any()));
    lbl.insert(
        labels::CONFIGURATION_GENERATION.into(),
        cfg.metadata.generation.unwrap_or(0).to_string(),
    );
    if let Some(uid) = &cfg.metadata.uid {
        lbl.insert(labels::CONFIGURATION_UID.into(), uid.clone());
    }
    if let Some(svc) = cfg.labels().get(labels::SERVICE) {
        lbl.insert(labels::SERVICE.into(), svc.clone());
    }
    if let Some(uid) = cfg.labels().get(labels::SERVICE_UID) {
        lbl.insert(labels::SERVICE_UID.into(), uid.clone());
    }
    // Knative's `updateRevisionAnnotations`: the configuration's creator and routes go to the
    // revision, and a revision of a configuration a route already uses starts `active`.
    let mut ann = t.metadata.annotations.clone().unwrap_or_default();
    let cfg_ann = cfg.annotations();
    for key in [CREATOR_ANNOTATION, ROUTES_ANNOTATION] {
        if let Some(v) = cfg_ann.get(key) {
            ann.insert(key.into(), v.clone());
        }
    }
    let state = if cfg_ann.contains_key(ROUTES_ANNOTATION) {
        routing_state::ACTIVE
    } else {
        routing_state::PENDING
    };
    lbl.insert(labels::ROUTING_STATE.into(), state.into());
    ann.insert(
        routing_state::MODIFIED_ANNOTATION.into(),
        now_rfc3339.to_string(),
    );
    Revision {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: cfg.namespace(),
            labels: Some(lbl),
            annotations: Some(ann),
            owner_references: Some(vec![owner_ref(cfg)]),
            ..Default::default()
        },
        spec: defaulted_spec(&t.spec, defaults),
        status: None,
    }
}

/// The generation label of a revision, if it has one.
fn generation_of(r: &Revision) -> Option<i64> {
    r.labels()
        .get(labels::CONFIGURATION_GENERATION)
        .and_then(|g| g.parse().ok())
}

/// The status of `cfg` given its revisions (`revisions`: those labelled with its name) and the
/// one of the current generation (`latest`). Pure.
pub fn compute_status(
    cfg: &Configuration,
    latest: Option<&Revision>,
    revisions: &[Arc<Revision>],
    failure: Option<&str>,
) -> ConfigurationStatus {
    let mut st = cfg.status.clone().unwrap_or_default();
    let t = now();
    st.status.observed_generation = cfg.metadata.generation;
    if let Some(f) = failure {
        st.status.set(
            Condition {
                reason: Some(validate::reason::REVISION_FAILED.into()),
                message: Some(f.to_string()),
                ..Condition::new(condition::READY, ConditionStatus::False)
            },
            &t,
        );
        return st;
    }
    let Some(latest) = latest else {
        st.status.set(
            Condition::new(condition::READY, ConditionStatus::Unknown),
            &t,
        );
        return st;
    };
    let latest_name = latest.name_any();
    st.fields.latest_created_revision_name = Some(latest_name.clone());
    // The newest Ready revision at or below the current generation, no older than the last
    // one known ready.
    let current = generation_of(latest).unwrap_or(i64::MAX);
    let floor = st
        .fields
        .latest_ready_revision_name
        .as_deref()
        .and_then(|n| revisions.iter().find(|r| r.name_any() == n))
        .and_then(|r| generation_of(r))
        .unwrap_or(i64::MIN);
    let newest_ready = revisions
        .iter()
        .filter(|r| is_ready(r))
        .filter_map(|r| generation_of(r).map(|g| (g, r)))
        .filter(|(g, _)| *g <= current && *g >= floor)
        .max_by_key(|(g, _)| *g)
        .map(|(_, r)| r.name_any());
    if let Some(n) = newest_ready {
        st.fields.latest_ready_revision_name = Some(n);
    }
    let rc = latest
        .status
        .as_ref()
        .and_then(|s| s.status.condition(condition::READY));
    let ready = match rc.map(|c| c.status) {
        Some(ConditionStatus::True) => Condition::new(condition::READY, ConditionStatus::True),
        Some(ConditionStatus::False) => Condition {
            reason: Some("RevisionFailed".into()),
            message: Some(format!(
                "Revision {latest_name:?} failed with message: {}.",
                rc.and_then(|c| c.message.as_deref()).unwrap_or("")
            )),
            ..Condition::new(condition::READY, ConditionStatus::False)
        },
        _ => Condition::new(condition::READY, ConditionStatus::Unknown),
    };
    st.status.set(ready, &t);
    st
}

/// Whether a revision's `Ready` condition is True.
pub fn is_ready(r: &Revision) -> bool {
    r.status
        .as_ref()
        .is_some_and(|s| s.status.is_true(condition::READY))
}

/// Reconciles one Configuration: creates the current generation's Revision when missing, then
/// writes the status.
pub async fn reconcile(
    cfg: Arc<Configuration>,
    ctx: Arc<Ctx>,
    revisions: Store<Revision>,
    listed: Arc<super::StoresReady>,
) -> Result<Action, Error> {
    // The first reconciles may come before the Revision store has listed: they wait at one
    // gate (the store's own wait wakes only one of several waiters).
    listed.wait().await?;
    let ns = cfg.namespace().unwrap_or_default();
    let name = cfg.name_any();
    let settings = ctx.settings();
    let defaults = super::defaults_for(&settings, &ns);
    let errors = problems(&cfg, &settings);
    let invalid = (!errors.is_empty()).then(|| validate::revision_creation_failed(&errors));
    let cfg_label = labels::value(&name);
    let mine: Vec<Arc<Revision>> = revisions.state_filter(|r| {
        r.namespace().as_deref() == Some(ns.as_str())
            && r.labels().get(labels::CONFIGURATION) == Some(&cfg_label)
    });
    let rev_name = revision_name(&cfg);
    let mut latest: Option<Revision> = None;
    let mut failure: Option<String> = None;
    if invalid.is_none() {
        let api = ctx.api::<Revision>(&ns);
        let found = match mine.iter().find(|r| r.name_any() == rev_name) {
            Some(r) => Some((**r).clone()),
            // The store may lag behind a create of ours: ask the server.
            None => api.get_opt(&rev_name).await?,
        };
        match found {
            Some(r) if !is_owned_by(&r.metadata, &*cfg) => {
                failure = Some(format!(
                    "revision {rev_name:?} already exists and is not owned by this \
                     configuration"
                ));
            }
            Some(r) => latest = Some(r),
            None => {
                let rfc = now().0.to_string();
                let rev = make_revision(&cfg, &defaults, &rfc);
                match api.create(&PostParams::default(), &rev).await {
                    Ok(created) => {
                        ctx.event(
                            &*cfg,
                            EventKind::Normal,
                            "Created",
                            format!("Created Revision {rev_name:?}"),
                        )
                        .await;
                        latest = Some(created);
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        return Err(Error::Other(format!(
                            "revision {rev_name:?} appeared while being created; retrying"
                        )));
                    }
                    Err(e) => {
                        ctx.event(
                            &*cfg,
                            EventKind::Warning,
                            "CreationFailed",
                            format!("Failed to create Revision {rev_name:?}: {e}"),
                        )
                        .await;
                        return Err(e.into());
                    }
                }
            }
        }
    }
    let mut all = mine.clone();
    if let Some(l) = &latest
        && !all.iter().any(|r| r.name_any() == l.name_any())
    {
        all.push(Arc::new(l.clone()));
    }
    let message = invalid.clone().or_else(|| failure.clone());
    let status = compute_status(&cfg, latest.as_ref(), &all, message.as_deref());
    let before = cfg.status.clone().unwrap_or_default();
    // The configuration as it stands after this reconcile (GC reads its latest revisions).
    let mut next = (*cfg).clone();
    next.status = Some(status.clone());
    if status != before {
        announce(&ctx, &cfg, &before, &status).await;
        ctx.api::<Configuration>(&ns)
            .replace_status(&name, &PostParams::default(), &next)
            .await?;
    }
    if message.is_none() {
        super::gc::collect(&ctx, &next, &all, &settings.gc).await?;
    }
    if let Some(m) = invalid {
        ctx.event(&*cfg, EventKind::Warning, "InvalidSpec", m.clone())
            .await;
        return Err(Error::Invalid(m));
    }
    if let Some(f) = failure {
        return Err(Error::Other(f));
    }
    Ok(Action::requeue(ctx.resync()))
}

/// Knative's Events for status changes: LatestReadyUpdate, ConfigurationReady,
/// LatestCreatedFailed.
async fn announce(
    ctx: &Ctx,
    cfg: &Configuration,
    before: &ConfigurationStatus,
    after: &ConfigurationStatus,
) {
    if after.fields.latest_ready_revision_name != before.fields.latest_ready_revision_name
        && let Some(n) = &after.fields.latest_ready_revision_name
    {
        ctx.event(
            cfg,
            EventKind::Normal,
            "LatestReadyUpdate",
            format!("LatestReadyRevisionName updated to {n:?}"),
        )
        .await;
    }
    let was = before.status.condition(condition::READY).map(|c| c.status);
    let is = after.status.condition(condition::READY);
    match is.map(|c| c.status) {
        Some(ConditionStatus::True) if was != Some(ConditionStatus::True) => {
            ctx.event(
                cfg,
                EventKind::Normal,
                "ConfigurationReady",
                "Configuration becomes ready".into(),
            )
            .await;
        }
        Some(ConditionStatus::False) if was != Some(ConditionStatus::False) => {
            ctx.event(
                cfg,
                EventKind::Warning,
                "LatestCreatedFailed",
                is.and_then(|c| c.message.clone()).unwrap_or_default(),
            )
            .await;
        }
        _ => {}
    }
}

/// The shared watches the Configuration controller reads: Configurations, Revisions.
pub fn watches(ctx: &Ctx) -> (Informer<Configuration>, Informer<Revision>) {
    (ctx.informer(None), ctx.informer(None))
}

/// The Configuration controller: owns Revisions, whose shared store a reconcile reads (it
/// already holds the revision change that triggered it).
pub async fn controller(ctx: Arc<Ctx>) {
    let (configurations, revisions) = watches(&ctx);
    let (store, configuration_stream) = super::main_watch(&configurations);
    let listed = {
        let revisions = revisions.clone();
        Arc::new(super::StoresReady::spawn("Revisions", async move {
            revisions.listed().await
        }))
    };
    let controller = Controller::for_stream(configuration_stream, store)
        .owns_stream(super::child_watch(&revisions))
        .reconcile_all_on(listed.opened_later());
    let store = revisions.store();
    super::run(ctx.clone(), KIND, controller, move |cfg, ctx| {
        reconcile(cfg, ctx, store.clone(), listed.clone())
    })
    .await;
}
