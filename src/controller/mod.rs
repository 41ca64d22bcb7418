//! `thaw controller`'s reconcilers: Knative's Service, Configuration, Revision and Route, each a
//! kube-runtime [`Controller`] (its work queue: one key reconciled by one worker at a time,
//! duplicates merged, retries with backoff, children re-queue their owner), sharing one
//! [`Ctx`]: the API client, the ConfigMaps in force as one immutable [`Settings`] snapshot per
//! reconcile, the Event recorder and the metrics.
//!
//! Every reconciler follows the same rules (docs/architecture.md, "The controller"):
//! - children are written with server-side apply under [`FIELD_MANAGER`], owned by their parent
//!   (a child owned by someone else is left alone and reported `NotOwned`);
//! - a parent's status is written only when it changed, with a PUT carrying the
//!   `resourceVersion` read (a conflict re-queues), keeping the fields other writers own;
//! - an object that cannot be reconciled as written ([`Error::Invalid`]) is reported on its
//!   conditions and not retried until it changes; other failures are retried with per-key
//!   exponential backoff ([`error_policy`]) and recorded as `InternalError` Events.
//!
//! Room: the reconcilers and their object builders. May use: `knative`, `config`,
//! `telemetry`, `leader`; no data-plane module.

pub mod adopt;
pub mod apply;
pub mod configuration;
pub mod domain_mapping;
pub mod gc;
pub mod informers;
pub mod revision;
pub mod route;
pub mod service;

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Duration;
use tracing::Instrument;

use crate::config::{AutoscalerConfig, DefaultsConfig, GcConfig};
use crate::telemetry::controller::ControllerMetrics;

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "controller.thaw.dev";

/// The controller's name in Events (`reportingController`) and its Lease.
pub const CONTROLLER_NAME: &str = "thaw-controller";

/// Knative's resync period (`DefaultResyncPeriod`, 10 h).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(10 * 3600);

/// Knative's default workers per controller are 2; thaw's `--workers` default is 4.
pub const DEFAULT_WORKERS: u16 = 4;

/// The ConfigMaps in force, one immutable snapshot per reconcile (Knative's
/// `configStore.ToContext`): a ConfigMap edit never changes a reconcile half-way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// `config-defaults`, with its namespace sections.
    pub defaults: DefaultsConfig,
    /// `config-autoscaler` (initial scale, min/max scale bounds).
    pub autoscaler: AutoscalerConfig,
    /// `config-gc`.
    pub gc: GcConfig,
    /// `config-domain`, `config-network` and `config-istio` (the Route reconciler's).
    pub network: crate::config::NetworkConfig,
    /// `config-deployment` (the revision Deployments: sidecar image and resources, progress
    /// deadline).
    pub deployment: crate::config::DeploymentConfig,
    /// `config-features` (the pod-spec fields a Service may set; the secure pod defaults).
    pub features: crate::config::FeaturesConfig,
    /// The keys of each revision's proxy tag in its sidecar's environment
    /// ([`crate::knative::proxy_tag`]): the tag key (no tag until its Secret is read), and the
    /// stats token for the previous form during the upgrade window.
    pub proxy_tags: crate::knative::proxy_tag::Keys,
}

/// The revision defaults of `namespace`: config-defaults' cluster values with that
/// namespace's section over them.
pub fn defaults_for(settings: &Settings, namespace: &str) -> DefaultsConfig {
    settings.defaults.for_namespace(namespace).clone()
}

/// What an Event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

/// Shared by every reconciler of one controller process.
pub struct Ctx {
    pub client: kube::Client,
    /// Where the ConfigMaps (and the Lease) live.
    pub system_namespace: String,
    /// `None`: every namespace (the default); `Some(ns)`: only `ns` (tests, single-tenant use).
    namespace: Option<String>,
    settings: ArcSwap<Settings>,
    settings_version: watch::Sender<u64>,
    resync: Duration,
    workers: u16,
    recorder: Recorder,
    metrics: ControllerMetrics,
    /// Consecutive failures per object, for the per-key backoff.
    failures: DashMap<(&'static str, String, String), u32>,
    reconciles: AtomicU64,
    /// The shared watches, running from the process's start in every replica.
    informers: informers::Informers,
    /// The changes waiting for their reconcile (the event-to-reconcile histogram).
    triggers: Arc<informers::Triggers>,
    /// `--adopt-knative`: take over, along the ownership chain, what Knative Serving's
    /// internal objects owned ([`adopt`]).
    adopt: bool,
}

/// How a [`Ctx`] is built; every field has the default the role uses.
#[derive(Debug, Clone)]
pub struct CtxOptions {
    pub system_namespace: String,
    pub namespace: Option<String>,
    pub resync: Duration,
    pub workers: u16,
    /// This replica's name in Events (`reportingInstance`): the pod name.
    pub instance: Option<String>,
    pub metrics: Option<ControllerMetrics>,
    /// Adopt Knative Serving's objects in place ([`adopt`]); off by default.
    pub adopt: bool,
}

impl Default for CtxOptions {
    fn default() -> Self {
        Self {
            system_namespace: crate::config::live::SYSTEM_NAMESPACE.into(),
            namespace: None,
            resync: DEFAULT_RESYNC,
            workers: DEFAULT_WORKERS,
            instance: None,
            metrics: None,
            adopt: false,
        }
    }
}

impl Ctx {
    /// A context with fixed settings and the role's defaults (every namespace, 4 workers,
    /// 10 h resync).
    pub fn new(client: kube::Client, settings: Settings) -> Arc<Ctx> {
        Self::with_options(client, settings, CtxOptions::default())
    }

    pub fn with_options(client: kube::Client, settings: Settings, o: CtxOptions) -> Arc<Ctx> {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: o.instance,
        };
        let metrics = o.metrics.unwrap_or_else(ControllerMetrics::unregistered);
        let triggers = Arc::new(informers::Triggers::default());
        Arc::new(Ctx {
            informers: informers::Informers::new(
                client.clone(),
                o.namespace.clone(),
                triggers.clone(),
                metrics.clone(),
            ),
            triggers,
            recorder: Recorder::new(client.clone(), reporter),
            client,
            system_namespace: o.system_namespace,
            namespace: o.namespace,
            settings: ArcSwap::from_pointee(settings),
            settings_version: watch::Sender::new(0),
            resync: o.resync,
            workers: o.workers.max(1),
            metrics,
            failures: DashMap::new(),
            reconciles: AtomicU64::new(0),
            adopt: o.adopt,
        })
    }

    /// The snapshot in force now.
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// Puts a new snapshot in force and re-queues every object of every kind (Knative's global
    /// resync on a ConfigMap change); an equal snapshot changes nothing.
    pub fn set_settings(&self, s: Settings) {
        if *self.settings.load_full() == s {
            return;
        }
        self.settings.store(Arc::new(s));
        self.settings_version.send_modify(|v| *v += 1);
    }

    /// How often each object is reconciled without a change (`--resync`).
    pub fn resync(&self) -> Duration {
        self.resync
    }

    /// Whether Knative Serving's objects are adopted in place (`--adopt-knative`, [`adopt`]).
    pub fn adopt(&self) -> bool {
        self.adopt
    }

    /// The controller's metric families.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// Reconciles run at once per kind (`--workers`).
    pub fn workers(&self) -> u16 {
        self.workers
    }

    /// Reconciles finished so far, of every kind (a progress figure for tests and benches).
    pub fn reconciles(&self) -> u64 {
        self.reconciles.load(Ordering::Relaxed)
    }

    /// The shared watch of namespaced `K` selected by `labels` ([`informers`]), started if it
    /// was not.
    pub fn informer<K>(&self, labels: Option<&'static str>) -> informers::Informer<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.informers.namespaced(labels)
    }

    /// The shared watch of cluster-scoped `K`, started if it was not.
    pub fn cluster_informer<K>(&self) -> informers::Informer<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.informers.cluster()
    }

    /// The shared watches started so far.
    pub fn informers(&self) -> &informers::Informers {
        &self.informers
    }

    /// Marks this replica leading (its reconcilers run) or not: changes are stamped for the
    /// event-to-reconcile histogram only while it leads.
    pub fn set_leading(&self, leading: bool) {
        self.triggers.set_leading(leading);
    }

    /// The API of `K` the controllers watch: every namespace, or the one given.
    pub fn watched<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// `K` in `namespace`.
    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Records a Kubernetes Event on `obj` (`events.k8s.io/v1`; repeats within a few minutes
    /// are folded into a series by kube's recorder). Never fails the reconcile: a failed
    /// publish is logged and counted.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        kind: EventKind,
        reason: &str,
        note: String,
    ) {
        self.publish(obj.object_ref(&()), None, kind, reason, note)
            .await;
    }

    /// [`Ctx::event`] on `obj` about `related` (the Event's `related`): the recorder folds
    /// repeats by object, reason and related object, not by note, so Events of one reason
    /// about different objects (each revision collected) need it to stay apart; without it
    /// the second is counted into the first, whose note names the first object.
    pub async fn event_related<K, R>(
        &self,
        obj: &K,
        related: &R,
        kind: EventKind,
        reason: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
        R: Resource<DynamicType = ()>,
    {
        let related = Some(related.object_ref(&()));
        self.publish(obj.object_ref(&()), related, kind, reason, note)
            .await;
    }

    async fn publish(
        &self,
        regarding: ObjectReference,
        related: Option<ObjectReference>,
        kind: EventKind,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&ev, &regarding).await {
            self.metrics.events_failed.inc();
            tracing::warn!(error = %e, reason, "could not publish an event");
        }
    }

    fn failure_key<K: Resource>(kind: &'static str, obj: &K) -> (&'static str, String, String) {
        (
            kind,
            obj.meta().namespace.clone().unwrap_or_default(),
            obj.meta().name.clone().unwrap_or_default(),
        )
    }
}

/// Why a reconcile did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The object cannot be reconciled as written (a bad spec, already reported on its
    /// conditions): not retried until it changes (Knative's permanent error).
    #[error("{0}")]
    Invalid(String),
    /// Anything else (a child owned by someone else, a missing dependency): retried with
    /// backoff.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// A 409 from the API server: someone wrote the object since it was read.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 409)
    }

    fn result_label(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            e if e.is_conflict() => "conflict",
            _ => "error",
        }
    }
}

/// The first retry after a failure (client-go's `DefaultTypedControllerRateLimiter`: 5 ms
/// doubling per consecutive failure of the same key, up to 1000 s).
pub const BACKOFF_BASE: Duration = Duration::from_millis(5);
/// The longest wait between retries of one key.
pub const BACKOFF_CAP: Duration = Duration::from_secs(1000);

/// The wait before retry number `failures` (1-based) of one key.
pub fn backoff(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    BACKOFF_BASE.saturating_mul(1u32 << exp).min(BACKOFF_CAP)
}

/// kube-runtime's error policy for every reconciler: a permanent error waits for a change of
/// the object; anything else is retried after [`backoff`] of the key's consecutive failures.
pub fn error_policy<K: Resource>(
    obj: Arc<K>,
    err: &Error,
    ctx: Arc<Ctx>,
    kind: &'static str,
) -> Action {
    if matches!(err, Error::Invalid(_)) {
        return Action::await_change();
    }
    let mut n = ctx
        .failures
        .entry(Ctx::failure_key(kind, &*obj))
        .or_insert(0);
    *n = n.saturating_add(1);
    Action::requeue(backoff(*n))
}

/// The trigger stream of the kind a controller reconciles, for `Controller::for_stream`: the
/// objects its shared watch applies (every object once when the controller starts, from the
/// warm store), and the store.
pub fn main_watch<K>(
    informer: &informers::Informer<K>,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    (informer.store(), informer.events().applied_objects())
}

/// The trigger stream of a child or another kind, for `owns_stream` and `watches_stream`: the
/// objects its shared watch touches.
pub fn child_watch<K>(
    informer: &informers::Informer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    informer.events().touched_objects()
}

/// The pause of a controller's merged trigger stream after an error: none.
#[derive(Debug, Clone, Copy)]
struct NoPause;

impl Iterator for NoPause {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NoPause {
    fn reset(&mut self) {}
}

/// Makes each of `controller`'s watches back off alone, as client-go's informers do: every
/// shared watch ([`informers`]) backs off on its own, its subscribers see no error, and the
/// merged stream does not pause at all. kube-runtime's default pauses the merged stream, every watch of the
/// controller at once, on any one watch's error, doubling the pause at each error until an
/// event comes: after an API server restart each watch's errors in turn (the broken
/// connection, 429 while the server starts, 410 on resuming) added up, and the Revision
/// controller heard nothing for about 100 s on a real kube-apiserver.
pub fn independent_triggers<K>(controller: Controller<K>) -> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    controller.trigger_backoff(NoPause)
}

/// Starts every shared watch the reconcilers read ([`informers`]): each replica does at
/// start, so a standby's stores are warm when it gains the Lease and nothing is listed again.
/// Returns the number of watches.
pub fn warm(ctx: &Ctx) -> usize {
    let _ = service::watches(ctx);
    let _ = configuration::watches(ctx);
    let _ = revision::watches(ctx);
    let _ = route::watches(ctx);
    let _ = domain_mapping::watches(ctx);
    ctx.informers.len()
}

/// The finalizers thaw's reconcilers hold (Knative's names): an object being deleted that
/// holds one is reconciled, to finalize it.
pub const FINALIZERS: &[&str] = &[domain_mapping::FINALIZER];

/// Runs one kind's `controller` (built by the reconciler module from watches that back off on
/// their own, [`independent_triggers`]) until the future is dropped: `reconcile` with metrics,
/// a span, the `InternalError` Event on failure and the backoff bookkeeping, `--workers` at
/// once, every object re-queued when the settings change.
pub async fn run<K, F, Fut>(
    ctx: Arc<Ctx>,
    kind: &'static str,
    controller: Controller<K>,
    reconcile: F,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let settings_changed = tokio_stream_of(ctx.settings_version.subscribe());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.workers);
    independent_triggers(controller)
        .with_config(config)
        .reconcile_all_on(settings_changed)
        .run(
            move |obj: Arc<K>, ctx: Arc<Ctx>| {
                // An object being deleted (another finalizer holds it: `foregroundDeletion`
                // while the garbage collector deletes its children) is not reconciled, as
                // Knative's generated reconcilers call neither ReconcileKind nor, holding no
                // finalizer of their own, FinalizeKind: reconciling it would re-create the
                // children the collector is deleting, for as long as it lasts. One that holds
                // a finalizer of thaw's ([`FINALIZERS`]) goes to its reconcile, which
                // finalizes it.
                let deleting = obj.meta().deletion_timestamp.is_some()
                    && !obj
                        .finalizers()
                        .iter()
                        .any(|f| FINALIZERS.contains(&f.as_str()));
                let reconcile = reconcile.clone();
                let span = tracing::info_span!(
                    "reconcile",
                    kind,
                    namespace = obj.namespace().unwrap_or_default(),
                    name = obj.name_any()
                );
                if let Some(waited) = ctx.triggers.take(
                    &K::kind(&()),
                    obj.meta().namespace.as_deref().unwrap_or_default(),
                    obj.meta().name.as_deref().unwrap_or_default(),
                ) {
                    ctx.metrics
                        .event_to_reconcile
                        .get_or_create(&crate::telemetry::controller::KindLabels { kind })
                        .observe(waited.as_secs_f64());
                }
                async move {
                    if deleting {
                        return Ok(Action::await_change());
                    }
                    let started = tokio::time::Instant::now();
                    let result = reconcile(obj.clone(), ctx.clone()).await;
                    let seconds = started.elapsed().as_secs_f64();
                    ctx.reconciles.fetch_add(1, Ordering::Relaxed);
                    match &result {
                        Ok(_) => {
                            ctx.failures.remove(&Ctx::failure_key(kind, &*obj));
                            ctx.metrics.reconciled(kind, "ok", seconds);
                        }
                        Err(e) => {
                            ctx.metrics.reconciled(kind, e.result_label(), seconds);
                            if e.is_conflict() {
                                tracing::debug!(error = %e, "conflict; retrying");
                            } else {
                                tracing::warn!(error = %e, "reconcile failed");
                                if !matches!(e, Error::Invalid(_)) {
                                    ctx.event(
                                        &*obj,
                                        EventKind::Warning,
                                        "InternalError",
                                        e.to_string(),
                                    )
                                    .await;
                                }
                            }
                        }
                    }
                    result
                }
                .instrument(span)
            },
            move |obj, err, ctx| error_policy(obj, err, ctx, kind),
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller stream");
            }
        })
        .await;
}

/// A stream that yields once per change of `rx` (the settings version).
fn tokio_stream_of(mut rx: watch::Receiver<u64>) -> impl futures::Stream<Item = ()> + Send {
    rx.mark_unchanged();
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// The owner reference a child of `parent` carries (`controller: true`,
/// `blockOwnerDeletion: true`), so Kubernetes' garbage collector deletes it with its parent.
pub fn owner_ref<P: Resource<DynamicType = ()>>(parent: &P) -> OwnerReference {
    // Every object the controller reconciles was read from the API server: it has a uid.
    let mut r = parent
        .controller_owner_ref(&())
        .expect("a stored object has a name and uid");
    r.block_owner_deletion = Some(true);
    r
}

/// Whether `child` is controlled by `parent` (its controller owner reference has the parent's
/// uid). A child that exists and is not is someone else's: Knative reports `NotOwned`.
pub fn is_owned_by<P: Resource>(child: &ObjectMeta, parent: &P) -> bool {
    let uid = parent.meta().uid.as_deref();
    child
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// A child after [`apply_owned`].
#[derive(Debug)]
pub enum Applied<K> {
    /// Ours: what the server holds after the apply (or, when nothing changed, what was found).
    Ours(K),
    /// An object of that name the parent does not control: left alone (Knative's `NotOwned`).
    NotOwned {
        /// Its kind (`Deployment`, `Service`, ...).
        kind: String,
        name: String,
    },
}

impl<K> Applied<K> {
    /// Knative's `NotOwned` message for a child someone else controls.
    pub fn not_owned_message(kind: &str, name: &str) -> String {
        format!("There is an existing {kind} {name:?} that we do not own.")
    }
}

/// Writes `desired`, a child of `parent`, by server-side apply ([`FIELD_MANAGER`], forced: the
/// controller is the only writer of these fields), unless an object of its name exists that
/// `parent` does not control (and that [`adopt::try_adopt`] does not adopt). `cached`: the child as a store holds it (`None`: the server is
/// asked, as a store may lag or not follow someone else's object). Nothing is written when
/// `unchanged(existing, desired)` holds, nor when the object found already holds the whole
/// body, its [`apply::APPLIED_ANNOTATION`] included ([`apply::contains`]): a steady child is
/// not written again.
pub async fn apply_owned<P, K>(
    ctx: &Ctx,
    parent: &P,
    desired: &K,
    cached: Option<K>,
    unchanged: impl Fn(&K, &K) -> bool,
) -> Result<Applied<K>, Error>
where
    P: Resource,
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + DeserializeOwned
        + Debug,
{
    let ns = desired
        .meta()
        .namespace
        .clone()
        .or_else(|| parent.meta().namespace.clone())
        .unwrap_or_default();
    let name = desired.meta().name.clone().unwrap_or_default();
    let api = ctx.api::<K>(&ns);
    let existing = match cached {
        Some(c) => Some(c),
        None => api.get_opt(&name).await?,
    };
    let body = apply::applied_body(
        serde_json::to_value(desired).map_err(|e| Error::Other(e.to_string()))?,
        &K::api_version(&()),
        &K::kind(&()),
    );
    if let Some(mut existing) = existing {
        if !is_owned_by(existing.meta(), parent) {
            // Knative's, along the chain, under --adopt-knative: re-owned in place, then
            // applied as any child of ours.
            match adopt::try_adopt(ctx, parent, &existing, desired).await? {
                Some(adopted) => existing = adopted,
                None => {
                    return Ok(Applied::NotOwned {
                        kind: K::kind(&()).into_owned(),
                        name,
                    });
                }
            }
        }
        if unchanged(&existing, desired) {
            return Ok(Applied::Ours(existing));
        }
        let mut have = serde_json::to_value(&existing).map_err(|e| Error::Other(e.to_string()))?;
        // A typed object need not serialize its type; it is this one.
        have["apiVersion"] = body["apiVersion"].clone();
        have["kind"] = body["kind"].clone();
        if apply::contains(&have, &body) {
            return Ok(Applied::Ours(existing));
        }
        // Knative logs a child's diff before it updates it, at info.
        tracing::info!(
            kind = %K::kind(&()),
            name = %name,
            differs = apply::first_difference(&have, &body).unwrap_or_default(),
            "applying a changed child"
        );
    }
    let applied = api
        .patch(
            &name,
            &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
            &kube::api::Patch::Apply(&body),
        )
        .await?;
    Ok(Applied::Ours(applied))
}

/// The longest a reconcile waits for the stores it reads to have their first list
/// ([`StoresReady::wait`]): past it, the reconcile fails (retried with backoff) and gives its
/// worker back, so a watch that cannot list never holds every worker of a kind.
pub const STORES_WAIT: Duration = Duration::from_secs(10);

/// Whether the stores a reconcile reads have listed, for any number of waiters: a gate that
/// one task opens once the stores' watches ([`informers`]) have their first lists.
#[derive(Clone, Debug)]
pub struct StoresReady {
    rx: watch::Receiver<Option<Result<(), String>>>,
    /// What the gate waits for, named in the error of a reconcile that waited too long.
    what: &'static str,
}

impl StoresReady {
    /// Spawns the one task that awaits `ready` (the informers' `listed`, in turn), then opens
    /// the gate (or closes it for good with the error). `what`: the watches awaited, as an
    /// error names them.
    pub fn spawn(
        what: &'static str,
        ready: impl Future<Output = Result<(), String>> + Send + 'static,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let r = ready.await;
            tx.send_replace(Some(r));
            // Keep the value readable after this task ends: the receiver holds it.
        });
        Self { rx, what }
    }

    /// A gate already open (tests of a reconcile without a controller).
    pub fn open() -> Self {
        let (_tx, rx) = watch::channel(Some(Ok(())));
        Self { rx, what: "" }
    }

    /// Returns once the stores have listed (at once after that), or fails after
    /// [`STORES_WAIT`] naming the watches that have not: a reconcile gives its worker back
    /// and is retried ([`StoresReady::opened_later`] queues it again when the gate opens).
    pub async fn wait(&self) -> Result<(), Error> {
        match tokio::time::timeout(STORES_WAIT, self.wait_unbounded()).await {
            Ok(r) => r,
            Err(_) => Err(Error::Other(format!(
                "the watches of {} have not listed yet (the API server does not answer them); retrying",
                self.what
            ))),
        }
    }

    /// [`StoresReady::wait`] with no bound in time (a background task, not a reconcile).
    pub async fn wait_unbounded(&self) -> Result<(), Error> {
        let mut rx = self.rx.clone();
        let seen = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::Other("the stores' readiness task ended".into()))?;
        match &*seen {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Error::Other(e.clone())),
            None => unreachable!("waited for Some"),
        }
    }

    /// Yields once when the gate opens, unless it is open already: for `reconcile_all_on`,
    /// so the reconciles that gave up waiting run at once rather than after their backoff.
    pub fn opened_later(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut rx = self.rx.clone();
        let open = matches!(&*rx.borrow(), Some(Ok(())));
        futures::stream::once(async move {
            if open {
                return None;
            }
            rx.wait_for(|v| matches!(v, Some(Ok(()))))
                .await
                .ok()
                .map(|_| ())
        })
        .filter_map(futures::future::ready)
    }
}

/// The time a status change is stamped with.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Object references of `K` named `names` in `namespace` (a `watches` mapper's result).
pub fn refs_in<K>(namespace: &str, names: impl IntoIterator<Item = String>) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
    K::DynamicType: Eq + Hash + Clone,
{
    names
        .into_iter()
        .map(|n| ObjectRef::new(&n).within(namespace))
        .collect()
}

#[cfg(test)]
mod tests;
