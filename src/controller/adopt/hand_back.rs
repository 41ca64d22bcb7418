//! `thaw migrate hand-back`: the way back to Knative Serving, the mirror of adoption.
//!
//! thaw stopped and Knative Serving reinstalled, Knative's reconcilers find thaw's children
//! under the names they write and refuse every one they do not control (Knative v1.15): the
//! ServerlessService refuses the public `{rev}` and private `{rev}-private` Services and the
//! public Endpoints (`serverlessservice.go`), the PodAutoscaler an HPA (`hpa.go`), net-istio
//! a VirtualService (its accessor's `NotOwnResource`). thaw's are controlled by the Revision
//! or the Route. Once Knative's controller has created its ServerlessServices,
//! PodAutoscalers and KIngresses, this command re-owns each such child along the chain
//! Knative's own would have, checked by UID ([`rule`], [`super::chain::walk_along`]):
//!
//! - a Service (`{rev}`, `{rev}-private`) or Endpoints (`{rev}`) controlled by Revision R:
//!   its controller becomes the ServerlessService `{rev}` whose controller is the
//!   PodAutoscaler `{rev}` whose controller is R;
//! - a HorizontalPodAutoscaler `{rev}` controlled by R: the PodAutoscaler `{rev}` controlled
//!   by R;
//! - a VirtualService or HTTPRoute controlled by Route (or DomainMapping) R: the KIngress
//!   named for R and controlled by R (net-gateway-api does not check the HTTPRoute's owner;
//!   re-owned all the same, so deleting the KIngress collects it as Knative expects);
//! - a cert-manager Certificate controlled by R: Knative's networking Certificate of its name
//!   controlled by R (Knative's certificate reconciler checks the `desired` object's owner, so
//!   it would not refuse; re-owned for the same reason).
//!
//! Each is one JSON patch guarded by `test` ops on the UID and the ownerReferences read
//! ([`super::reown_patch`]), which also takes off what is thaw's alone ([`strip_ops`]):
//! labels and annotations under `controller.thaw.dev/` (Knative's updates keep labels it does
//! not set: `kmeta.UnionMaps` on a Deployment) and finalizers of thaw's domain. What Knative
//! takes as it is (a revision's Deployment and a route's placeholder Services are controlled
//! by the Revision and Route in both) only loses those marks. Nothing is deleted or created
//! but thaw's autoscaler's EndpointSlices of a public Service, deleted once Knative's
//! Endpoints for it (controlled by its ServerlessService) hold a ready address: the
//! EndpointSlice mirroring controller serves those to the gateways from then on.
//!
//! One line per object ([`Line`]). An object whose Knative parent does not exist yet is
//! `waiting` (run again); one whose parent's chain does not lead to its own parent by UID is
//! `refused` and left alone (a forged chain). Running it again does nothing more than is left.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ServiceReference, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::chain::{self, Refusal};
use super::{CERTIFICATE, INGRESS, KnativeKind, POD_AUTOSCALER, SERVERLESS_SERVICE};
use crate::controller::route::certificate::Certificate;
use crate::controller::route::http_route::HTTPRoute;
use crate::controller::route::virtual_service::VirtualService;
use crate::knative::names::{PRIVATE_SERVICE_SUFFIX, child_name, labels};

/// The prefix of every label and annotation thaw's controller writes on a child.
pub const THAW_MARK_PREFIX: &str = "controller.thaw.dev/";

/// thaw's domain: a finalizer under it is thaw's (Knative holds none).
pub const THAW_DOMAIN: &str = "thaw.dev";

/// The field manager of the hand-back's patches.
pub const FIELD_MANAGER: &str = "thaw-hand-back";

/// The group of the parents thaw's children name (Revision, Route, DomainMapping).
const SERVING_GROUP: &str = "serving.knative.dev";

/// How a child of thaw's goes back to Knative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Re-owned: its controller becomes `parent` (named by [`knative_parent_name`]), whose chain through
    /// `above` must lead to the child's present controller by UID.
    Reown {
        parent: KnativeKind,
        above: &'static [KnativeKind],
    },
    /// Knative controls it through the same parent: only thaw's marks go.
    Keep,
}

/// How a child of kind `child_kind` controlled by a `parent_kind` goes back; `None`: Knative
/// writes no such child (left as it is, named in the output).
pub fn rule(child_kind: &str, parent_kind: &str) -> Option<Handling> {
    match (child_kind, parent_kind) {
        ("Service" | "Endpoints", "Revision") => Some(Handling::Reown {
            parent: SERVERLESS_SERVICE,
            above: &[POD_AUTOSCALER],
        }),
        ("HorizontalPodAutoscaler", "Revision") => Some(Handling::Reown {
            parent: POD_AUTOSCALER,
            above: &[],
        }),
        ("VirtualService" | "HTTPRoute", "Route" | "DomainMapping") => Some(Handling::Reown {
            parent: INGRESS,
            above: &[],
        }),
        ("Certificate", "Route" | "DomainMapping") => Some(Handling::Reown {
            parent: CERTIFICATE,
            above: &[],
        }),
        ("Deployment", "Revision") | ("Service", "Route") => Some(Handling::Keep),
        _ => None,
    }
}

/// The name of the Knative object that controls, in Knative, the child `child_name` of kind
/// `child_kind` whose thaw parent is `parent_name`: Knative names them so (`names.PA`,
/// `names.Ingress`, the SKS after its PA, the cert-manager Certificate after Knative's). `Err`
/// says why a child of that name is not one Knative would write.
pub fn knative_parent_name(
    child_kind: &str,
    child_name: &str,
    parent_kind: &str,
    parent_name: &str,
) -> Result<String, String> {
    let private = format!("{parent_name}{PRIVATE_SERVICE_SUFFIX}");
    match (child_kind, parent_kind) {
        ("Service", "Revision") if child_name == parent_name || child_name == private => {
            Ok(parent_name.to_string())
        }
        ("Endpoints" | "HorizontalPodAutoscaler", "Revision") if child_name == parent_name => {
            Ok(parent_name.to_string())
        }
        ("VirtualService" | "HTTPRoute", _) => Ok(child_name_of(parent_name)),
        ("Certificate", _) => Ok(child_name.to_string()),
        _ => Err(format!(
            "Knative writes no {child_kind} named {child_name:?} for {parent_kind} {parent_name:?}"
        )),
    }
}

/// Knative's `kmeta.ChildName(name, "")`: the KIngress of a Route or DomainMapping.
fn child_name_of(name: &str) -> String {
    child_name(name, "")
}

/// The controller reference Knative's reconcilers set (`kmeta.NewControllerRef`).
pub fn controller_ref(kind: KnativeKind, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: format!("{}/{}", kind.group, kind.version),
        kind: kind.kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A JSON pointer's escaping of one key (RFC 6901).
fn pointer_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch ops that take thaw's marks off `meta` as read: each label and annotation
/// under [`THAW_MARK_PREFIX`] (a `test` of its value, then `remove`), and the finalizers of
/// [`THAW_DOMAIN`] (the list tested, then replaced without them). Empty: nothing of thaw's.
pub fn strip_ops(meta: &ObjectMeta) -> Vec<Value> {
    let mut ops = Vec::new();
    for (field, map) in [("labels", &meta.labels), ("annotations", &meta.annotations)] {
        for (k, v) in map.iter().flatten() {
            if k.starts_with(THAW_MARK_PREFIX) {
                let path = format!("/metadata/{field}/{}", pointer_key(k));
                ops.push(json!({"op": "test", "path": path, "value": v}));
                ops.push(json!({"op": "remove", "path": path}));
            }
        }
    }
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let kept: Vec<&String> = finalizers.iter().filter(|f| !is_thaws(f)).collect();
    if kept.len() != finalizers.len() {
        ops.push(json!({"op": "test", "path": "/metadata/finalizers", "value": finalizers}));
        ops.push(json!({"op": "replace", "path": "/metadata/finalizers", "value": kept}));
    }
    ops
}

/// Whether finalizer `f` is thaw's (`*.thaw.dev` or `*.thaw.dev/...`).
fn is_thaws(f: &str) -> bool {
    let domain = f.split('/').next().unwrap_or_default();
    domain == THAW_DOMAIN || domain.ends_with(&format!(".{THAW_DOMAIN}"))
}

/// What was done to one object (or, in a dry run, would be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Re-owned along the chain (rendered).
    Reowned(String),
    /// thaw's marks taken off; Knative takes it as it is.
    Cleaned(String),
    /// Deleted: only thaw used it (why).
    Deleted(String),
    /// Its Knative parent (or what it waits on) is not there yet: run again.
    Waiting(String),
    /// Its Knative parent's chain does not lead to its parent: left alone.
    Refused(String),
    /// Not something Knative writes: left as it is.
    Left(String),
    /// The API server refused the write (a `test` op failed: it changed since it was read).
    Failed(String),
}

/// One line of output: an object and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub outcome: Outcome,
    /// A dry run: nothing was written.
    pub dry_run: bool,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (verb, detail) = match &self.outcome {
            Outcome::Reowned(d) => ("re-owned", d),
            Outcome::Cleaned(d) => ("cleaned", d),
            Outcome::Deleted(d) => ("deleted", d),
            Outcome::Waiting(d) => ("waiting", d),
            Outcome::Refused(d) => ("refused", d),
            Outcome::Left(d) => ("left", d),
            Outcome::Failed(d) => ("failed", d),
        };
        let acted = matches!(
            self.outcome,
            Outcome::Reowned(_) | Outcome::Cleaned(_) | Outcome::Deleted(_)
        );
        let verb = if self.dry_run && acted {
            format!("would be {verb}")
        } else {
            verb.to_string()
        };
        write!(
            f,
            "{verb} {} {}/{}: {detail}",
            self.kind, self.namespace, self.name
        )
    }
}

/// Everything one run did, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

/// Whether a run handed everything back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing of thaw's is left that Knative would refuse (exit 0).
    HandedBack,
    /// Something waits for a Knative parent (exit 3: run again).
    Waiting,
    /// Something was refused or a write failed (exit 1).
    Incomplete,
}

impl Report {
    pub fn verdict(&self) -> Verdict {
        let has = |p: fn(&Outcome) -> bool| self.lines.iter().any(|l| p(&l.outcome));
        if has(|o| matches!(o, Outcome::Refused(_) | Outcome::Failed(_))) {
            Verdict::Incomplete
        } else if has(|o| matches!(o, Outcome::Waiting(_))) {
            Verdict::Waiting
        } else {
            Verdict::HandedBack
        }
    }

    fn push(&mut self, kind: &str, meta: &ObjectMeta, outcome: Outcome, dry_run: bool) {
        self.lines.push(Line {
            kind: kind.into(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            outcome,
            dry_run,
        });
    }
}

/// Errors that end a run.
#[derive(Debug, thiserror::Error)]
pub enum HandBackError {
    /// thaw still runs (its controller or autoscaler has replicas, or its webhook is
    /// registered): handing back beside it would be undone.
    #[error("{0}")]
    ThawRunning(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// What a run is told.
#[derive(Debug, Clone)]
pub struct Options {
    /// List what would be done; write nothing.
    pub dry_run: bool,
    /// Only this namespace; `None`: every namespace.
    pub namespace: Option<String>,
    /// thaw's namespace (its roles' Deployments and webhook Service).
    pub thaw_namespace: String,
}

/// thaw's role Deployments that must have no replicas: the controller would re-own what is
/// handed back, the autoscaler re-write the slices deleted.
pub const THAW_ROLES: &[&str] = &["controller", "autoscaler"];

/// `Err` naming what still runs of thaw: a role Deployment of [`THAW_ROLES`] with replicas
/// (wanted or still running), or a webhook configuration of thaw's (labelled
/// `app.kubernetes.io/part-of=thaw` or calling a Service in `thaw_ns`).
pub async fn check_thaw_stopped(client: &Client, thaw_ns: &str) -> Result<(), HandBackError> {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), thaw_ns);
    for role in THAW_ROLES {
        if let Some(d) = deps.get_opt(role).await? {
            let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let running = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            if wanted > 0 || running > 0 {
                return Err(HandBackError::ThawRunning(format!(
                    "thaw's {role} runs (Deployment {thaw_ns}/{role}: {wanted} wanted, \
                     {running} running); stop it first: kubectl -n {thaw_ns} scale deployment \
                     {role} --replicas=0"
                )));
            }
        }
    }
    let thaws = |meta: &ObjectMeta, services: Vec<Option<String>>| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/part-of"))
            .is_some_and(|v| v == "thaw")
            || services.iter().flatten().any(|ns| ns == thaw_ns)
    };
    let mut found = Vec::new();
    let lp = ListParams::default();
    let namespaces = |hooks: Vec<Option<&ServiceReference>>| -> Vec<Option<String>> {
        hooks
            .into_iter()
            .map(|s| s.map(|s| s.namespace.clone()))
            .collect()
    };
    for c in Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .list(&lp)
        .await?
    {
        let hooks = c.webhooks.iter().flatten();
        if thaws(
            &c.metadata,
            namespaces(hooks.map(|w| w.client_config.service.as_ref()).collect()),
        ) {
            found.push(format!("ValidatingWebhookConfiguration {}", c.name_any()));
        }
    }
    for c in Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&lp)
        .await?
    {
        let hooks = c.webhooks.iter().flatten();
        if thaws(
            &c.metadata,
            namespaces(hooks.map(|w| w.client_config.service.as_ref()).collect()),
        ) {
            found.push(format!("MutatingWebhookConfiguration {}", c.name_any()));
        }
    }
    if !found.is_empty() {
        return Err(HandBackError::ThawRunning(format!(
            "thaw's webhook is registered ({}); remove it first: kubectl delete {}",
            found.join(", "),
            found
                .iter()
                .map(|f| f.replacen(' ', "/", 1).to_lowercase())
                .collect::<Vec<_>>()
                .join(" ")
        )));
    }
    Ok(())
}

/// The kinds a run visits: thaw's children that Knative would meet under its names.
fn visited() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<Endpoints>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<HorizontalPodAutoscaler>(&()),
        ApiResource::erase::<VirtualService>(&()),
        ApiResource::erase::<HTTPRoute>(&()),
        ApiResource::erase::<Certificate>(&()),
    ]
}

fn api(client: &Client, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

/// Lists `ar` (in `ns`, or everywhere); a kind the API server does not serve has none.
async fn list(
    client: &Client,
    ar: &ApiResource,
    ns: Option<&str>,
    lp: &ListParams,
) -> Result<Vec<DynamicObject>, kube::Error> {
    match api(client, ar, ns).list(lp).await {
        Ok(l) => Ok(l.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// `namespace/name` of `kind`, its metadata; `None` when it, or its kind, is not served.
async fn get_meta(
    client: &Client,
    kind: KnativeKind,
    ns: &str,
    name: &str,
) -> Result<Option<ObjectMeta>, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &kind.api_resource());
    match api.get_opt(name).await {
        Ok(o) => Ok(o.map(|o| o.metadata)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The controller reference of `meta` when it names a serving.knative.dev parent.
fn serving_parent(meta: &ObjectMeta) -> Option<&OwnerReference> {
    chain::controller(meta).filter(|r| {
        r.api_version.rsplit_once('/').map(|(g, _)| g) == Some(SERVING_GROUP)
            && matches!(r.kind.as_str(), "Revision" | "Route" | "DomainMapping")
    })
}

/// Sends `ops` as one JSON patch to `obj` (unless `dry_run`). A refused `test` op (the
/// object changed since it was read: 409 or 422) is `Err` with the API server's message.
async fn send(
    client: &Client,
    ar: &ApiResource,
    meta: &ObjectMeta,
    ops: Vec<Value>,
    dry_run: bool,
) -> Result<Result<(), String>, kube::Error> {
    if dry_run {
        return Ok(Ok(()));
    }
    let ns = meta.namespace.clone().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, ar);
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = match serde_json::from_value(Value::Array(ops)) {
        Ok(p) => p,
        Err(e) => return Ok(Err(format!("not a JSON patch: {e}"))),
    };
    match api
        .patch(
            meta.name.as_deref().unwrap_or_default(),
            &pp,
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if matches!(s.code, 409 | 422) => Ok(Err(s.message)),
        Err(e) => Err(e),
    }
}

/// Hands one child back: what became of it; `None` when Knative takes it as it is and
/// nothing of thaw's is on it (not listed: nothing to do).
async fn hand_back_one(
    client: &Client,
    ar: &ApiResource,
    meta: &ObjectMeta,
    parent: &OwnerReference,
    dry_run: bool,
) -> Result<Option<Outcome>, kube::Error> {
    let kind = ar.kind.as_str();
    let name = meta.name.clone().unwrap_or_default();
    let ns = meta.namespace.clone().unwrap_or_default();
    let Some(handling) = rule(kind, &parent.kind) else {
        return Ok(Some(Outcome::Left(format!(
            "Knative writes no {kind} for a {}; remove it with thaw's leftovers",
            parent.kind
        ))));
    };
    let strip = strip_ops(meta);
    let (knative, above) = match handling {
        Handling::Keep if strip.is_empty() => return Ok(None),
        Handling::Keep => {
            let ops = [
                vec![json!({"op": "test", "path": "/metadata/uid", "value": meta.uid})],
                strip,
            ]
            .concat();
            return Ok(Some(match send(client, ar, meta, ops, dry_run).await? {
                Ok(()) => Outcome::Cleaned(format!(
                    "thaw's labels, annotations and finalizers off; Knative takes it as it is \
                     (controlled by {} {})",
                    parent.kind, parent.name
                )),
                Err(m) => Outcome::Failed(format!("changed while read, run again: {m}")),
            }));
        }
        Handling::Reown { parent, above } => (parent, above),
    };
    let knative_name = match knative_parent_name(kind, &name, &parent.kind, &parent.name) {
        Ok(n) => n,
        Err(why) => return Ok(Some(Outcome::Refused(why))),
    };
    let Some(found) = get_meta(client, knative, &ns, &knative_name).await? else {
        return Ok(Some(Outcome::Waiting(format!(
            "{} {knative_name} does not exist yet (Knative's controller creates it)",
            knative.kind
        ))));
    };
    let walked = chain::walk_along(
        above,
        knative.kind,
        &knative_name,
        &found,
        &parent.kind,
        &parent.name,
        &parent.uid,
        |k, n| {
            let ns = ns.clone();
            async move { get_meta(client, k, &ns, &n).await }
        },
    )
    .await?;
    let hops = match walked {
        Ok(h) => h,
        Err(Refusal::Missing { kind, name }) => {
            return Ok(Some(Outcome::Waiting(format!(
                "{kind} {name} does not exist yet"
            ))));
        }
        Err(why) => {
            return Ok(Some(Outcome::Refused(format!(
                "{why}: the chain of {} {knative_name} does not lead to {} {} (UID {})",
                knative.kind, parent.kind, parent.name, parent.uid
            ))));
        }
    };
    let owner = controller_ref(
        knative,
        &knative_name,
        found.uid.as_deref().unwrap_or_default(),
    );
    let mut ops = super::reown_patch(meta, &[owner], None)
        .as_array()
        .cloned()
        .unwrap_or_default();
    ops.extend(strip);
    let rendered = format!("{kind} {name} ← {}", chain::render(&hops));
    Ok(Some(match send(client, ar, meta, ops, dry_run).await? {
        Ok(()) => Outcome::Reowned(rendered),
        Err(m) => Outcome::Failed(format!("changed while read, run again: {m}")),
    }))
}

/// Whether `eps` holds a ready address (Knative's activators or the revision's pods).
fn has_address(eps: &Endpoints) -> bool {
    eps.subsets
        .iter()
        .flatten()
        .any(|s| s.addresses.as_ref().is_some_and(|a| !a.is_empty()))
}

/// Deletes thaw's autoscaler's EndpointSlices of each public Service once Knative's
/// Endpoints for it, controlled by the ServerlessService of its name (by UID), hold a ready
/// address.
async fn retire_slices(
    client: &Client,
    opts: &Options,
    report: &mut Report,
) -> Result<(), kube::Error> {
    let ar = ApiResource::erase::<EndpointSlice>(&());
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        labels::ENDPOINTSLICE_MANAGED_BY,
        labels::MANAGED_BY_AUTOSCALER
    ));
    let slices = list(client, &ar, opts.namespace.as_deref(), &lp).await?;
    let mut by_service: BTreeMap<(String, String), Vec<ObjectMeta>> = BTreeMap::new();
    for s in slices {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        let svc = s
            .labels()
            .get(labels::ENDPOINTSLICE_SERVICE_NAME)
            .cloned()
            .unwrap_or_default();
        by_service.entry((ns, svc)).or_default().push(s.metadata);
    }
    for ((ns, svc), metas) in by_service {
        let eps = Api::<Endpoints>::namespaced(client.clone(), &ns)
            .get_opt(&svc)
            .await?;
        let waiting = match &eps {
            None => Some(format!(
                "Knative's Endpoints of Service {svc} do not exist yet"
            )),
            Some(e) => {
                let sks = chain::controller(&e.metadata)
                    .filter(|r| r.kind == SERVERLESS_SERVICE.kind && r.name == svc);
                let genuine = match sks {
                    Some(r) => get_meta(client, SERVERLESS_SERVICE, &ns, &r.name)
                        .await?
                        .is_some_and(|m| m.uid.as_deref() == Some(r.uid.as_str())),
                    None => false,
                };
                if !genuine {
                    Some(format!(
                        "Endpoints {svc} are not controlled by its ServerlessService yet"
                    ))
                } else if !has_address(e) {
                    Some(format!(
                        "Knative's Endpoints of Service {svc} hold no ready address yet"
                    ))
                } else {
                    None
                }
            }
        };
        for meta in metas {
            let outcome = match &waiting {
                Some(why) => Outcome::Waiting(why.clone()),
                None if opts.dry_run => Outcome::Deleted(format!(
                    "thaw's autoscaler's; Knative's Endpoints serve Service {svc}"
                )),
                None => {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: meta.uid.clone(),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    let name = meta.name.clone().unwrap_or_default();
                    match Api::<EndpointSlice>::namespaced(client.clone(), &ns)
                        .delete(&name, &dp)
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            report.push(
                                "EndpointSlice",
                                &meta,
                                Outcome::Failed(format!("changed while read: {}", s.message)),
                                false,
                            );
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                    Outcome::Deleted(format!(
                        "thaw's autoscaler's; Knative's Endpoints serve Service {svc}"
                    ))
                }
            };
            report.push("EndpointSlice", &meta, outcome, opts.dry_run);
        }
    }
    Ok(())
}

/// One run: thaw must be stopped ([`check_thaw_stopped`]); then every child of thaw's that
/// Knative would meet is handed back (`hand_back_one`, kinds in `visited`'s order, so the
/// Services go before the slices they free), then thaw's autoscaler's EndpointSlices.
pub async fn run(client: &Client, opts: &Options) -> Result<Report, HandBackError> {
    check_thaw_stopped(client, &opts.thaw_namespace).await?;
    let mut report = Report::default();
    for ar in visited() {
        let objects = list(
            client,
            &ar,
            opts.namespace.as_deref(),
            &ListParams::default(),
        )
        .await?;
        for o in objects {
            let Some(parent) = serving_parent(&o.metadata) else {
                continue;
            };
            if let Some(outcome) =
                hand_back_one(client, &ar, &o.metadata, parent, opts.dry_run).await?
            {
                report.push(&ar.kind, &o.metadata, outcome, opts.dry_run);
            }
        }
    }
    retire_slices(client, opts, &mut report).await?;
    Ok(report)
}

pub mod cli;
#[cfg(test)]
mod tests;
