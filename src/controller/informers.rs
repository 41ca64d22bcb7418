//! One watch per kind and selector in the controller, shared by every reconciler that reads it
//! (client-go's shared informers, which Knative's controllers use), running in every replica
//! from the process's start, leader or not.
//!
//! An [`Informer`] is one `watcher` (backing off on its own), one reflector store every
//! reconciler reads, and a broadcast of its changes. A reconciler's trigger stream
//! ([`Informer::events`]) starts with a replay of the store (`Init`, an `InitApply` per object,
//! `InitDone`) once the store has listed, then follows the changes: so a reconciler started
//! when its replica gains the Lease enqueues every object once from a warm store (Knative's
//! promotion) and nothing is listed again. A re-list of the watch (after a `410 Gone`, or a
//! broken watch) is passed on as another replay; so is a subscriber that fell more than
//! [`EVENT_BUFFER`] changes behind (counted in `thaw_controller_watch_lagged_total`; a
//! deletion it missed waits for the resync).
//!
//! Every replica holding every watch costs the API server one watch per kind and selector per
//! replica (14 with Istio, Gateway API and cert-manager installed), and each replica the
//! memory of the stores; in exchange a leader change re-lists nothing.
//!
//! Each change is also noted for the latency histogram
//! (`thaw_controller_event_to_reconcile_seconds{kind}`, [`Triggers`]): while this replica
//! leads, a change of a Knative object, or of a child whose controlling owner is one, stamps
//! that object; the reconcile that starts next takes the stamp.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::telemetry::controller::ControllerMetrics;

/// Changes a subscriber may fall behind before it is replayed the store instead.
pub const EVENT_BUFFER: usize = 4096;

/// The API group of the kinds thaw's reconcilers own.
const SERVING_GROUP: &str = "serving.knative.dev";

/// Whether the API server serves a kind, as its informer found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The watch has not listed yet.
    Unknown,
    /// The last list or watch was answered 404: the CRD is not installed.
    Missing,
    /// Listed: the store holds them.
    Served,
}

/// Whether a watch error says the API server does not serve the kind (404).
pub fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// What an informer broadcasts.
enum Message<K> {
    /// An `Apply` or a `Delete`.
    Changed(Arc<watcher::Event<K>>),
    /// The watch listed again: subscribers replay the store.
    Relisted,
}

impl<K> Clone for Message<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Changed(e) => Self::Changed(e.clone()),
            Self::Relisted => Self::Relisted,
        }
    }
}

/// One shared watch: its store, its changes, whether its kind is served. Cheap to clone.
pub struct Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    tx: broadcast::Sender<Message<K>>,
    served: watch::Receiver<Served>,
    listed: watch::Receiver<bool>,
    kind: Arc<str>,
    metrics: ControllerMetrics,
}

impl<K> Clone for Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            tx: self.tx.clone(),
            served: self.served.clone(),
            listed: self.listed.clone(),
            kind: self.kind.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// The store every reader shares.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Whether the API server serves the kind (`Unknown` until the first answer).
    pub fn served(&self) -> watch::Receiver<Served> {
        self.served.clone()
    }

    /// Yields each time the kind becomes served or is listed again (not for the state at
    /// the call).
    pub fn now_served(&self) -> impl Stream<Item = ()> + Send + 'static {
        let mut rx = self.served.clone();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                if *rx.borrow_and_update() == Served::Served {
                    return Some(((), rx));
                }
            }
        })
    }

    /// Returns once the store has its first list (at once after that); any number of tasks
    /// may wait at once. An error only when the informer has stopped.
    pub async fn listed(&self) -> Result<(), String> {
        let mut rx = self.listed.clone();
        rx.wait_for(|l| *l)
            .await
            .map(|_| ())
            .map_err(|_| format!("the {} watch has stopped", self.kind))
    }

    /// The watch events for one subscriber: once the store has listed, a replay of it
    /// (`Init`, `InitApply` per object, `InitDone`), then each change as it comes, and a replay
    /// again after a re-list or when this subscriber fell [`EVENT_BUFFER`] changes behind.
    /// Never an error: the informer backs off on its own. Ends when the informer stops.
    pub fn events(
        &self,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static {
        struct State<K: Resource<DynamicType = ()> + Clone + 'static> {
            rx: broadcast::Receiver<Message<K>>,
            informer: Informer<K>,
            /// What is left of a replay: its objects, then `InitDone`.
            replay: Option<std::vec::IntoIter<Arc<K>>>,
            replayed: bool,
        }
        // Subscribed before the store is read: a change between the two comes twice, never
        // not at all.
        let state = State {
            rx: self.tx.subscribe(),
            informer: self.clone(),
            replay: None,
            replayed: false,
        };
        futures::stream::unfold(state, |mut s| async move {
            loop {
                if let Some(objects) = &mut s.replay {
                    let ev = match objects.next() {
                        Some(o) => watcher::Event::InitApply((*o).clone()),
                        None => {
                            s.replay = None;
                            watcher::Event::InitDone
                        }
                    };
                    return Some((Ok(ev), s));
                }
                if !s.replayed {
                    s.informer.listed().await.ok()?;
                    s.replayed = true;
                    s.replay = Some(s.informer.store.state().into_iter());
                    return Some((Ok(watcher::Event::Init), s));
                }
                match s.rx.recv().await {
                    Ok(Message::Changed(ev)) => return Some((Ok((*ev).clone()), s)),
                    Ok(Message::Relisted) => s.replayed = false,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(kind = %s.informer.kind, missed = n,
                            "a reconciler fell behind its watch; it is replayed the store");
                        s.informer.metrics.watch_lagged(&s.informer.kind);
                        s.replayed = false;
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}

/// Changes waiting for their reconcile, for `thaw_controller_event_to_reconcile_seconds`.
#[derive(Debug, Default)]
pub struct Triggers {
    leading: AtomicBool,
    /// (kind, namespace, name) of a Knative object -> its oldest change not yet reconciled.
    seen: DashMap<(String, String, String), Instant>,
}

impl Triggers {
    /// While `leading`, changes are stamped; otherwise the stamps are dropped (a standby
    /// reconciles nothing, and a new leader's first reconciles answer its promotion).
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
        if !leading {
            self.seen.clear();
        }
    }

    /// A change of `meta`, an object of `group`/`kind`, seen now: stamps it when it is one
    /// of the reconcilers' kinds (a deletion removes its stamp: nothing reconciles it), and
    /// its controlling owner when that is.
    fn changed(&self, group: &str, kind: &str, meta: &ObjectMeta, deleted: bool) {
        if !self.leading.load(Ordering::Relaxed) {
            return;
        }
        let ns = meta.namespace.clone().unwrap_or_default();
        let now = Instant::now();
        if group == SERVING_GROUP {
            let key = (
                kind.to_string(),
                ns.clone(),
                meta.name.clone().unwrap_or_default(),
            );
            if deleted {
                self.seen.remove(&key);
            } else {
                self.seen.entry(key).or_insert(now);
            }
        }
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        if let Some(o) = owner
            && o.api_version.split('/').next() == Some(SERVING_GROUP)
        {
            self.seen
                .entry((o.kind.clone(), ns, o.name.clone()))
                .or_insert(now);
        }
    }

    /// The reconcile of `kind` `namespace/name` starts: the time since its oldest change
    /// not yet reconciled, if a change called for it.
    pub fn take(&self, kind: &str, namespace: &str, name: &str) -> Option<std::time::Duration> {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        self.seen.remove(&key).map(|(_, at)| at.elapsed())
    }

    /// Stamps waiting (a bound check for tests: at most one per live object).
    pub fn pending(&self) -> usize {
        self.seen.len()
    }
}

type Key = (TypeId, Option<&'static str>, bool);

/// The controller process's informers, by kind, selector and scope; each started on first
/// use and stopped when this is dropped.
pub struct Informers {
    client: kube::Client,
    namespace: Option<String>,
    entries: Mutex<HashMap<Key, Box<dyn Any + Send + Sync>>>,
    triggers: Arc<Triggers>,
    metrics: ControllerMetrics,
    stop: CancellationToken,
}

impl Drop for Informers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Informers {
    /// Informers of `client`'s objects in every namespace, or only `namespace`'s.
    pub fn new(
        client: kube::Client,
        namespace: Option<String>,
        triggers: Arc<Triggers>,
        metrics: ControllerMetrics,
    ) -> Self {
        Self {
            client,
            namespace,
            entries: Mutex::new(HashMap::new()),
            triggers,
            metrics,
            stop: CancellationToken::new(),
        }
    }

    /// The informer of namespaced `K` selected by `labels` (every namespace, or the one the
    /// controller is limited to), started if it was not.
    pub fn namespaced<K>(&self, labels: Option<&'static str>) -> Informer<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.get((TypeId::of::<K>(), labels, false), || {
            let api = match &self.namespace {
                Some(ns) => Api::namespaced(self.client.clone(), ns),
                None => Api::all(self.client.clone()),
            };
            (api, labels)
        })
    }

    /// The informer of cluster-scoped `K`, started if it was not.
    pub fn cluster<K>(&self) -> Informer<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + Debug
            + DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        self.get((TypeId::of::<K>(), None, true), || {
            (Api::all(self.client.clone()), None)
        })
    }

    /// Informers started so far (each holds one watch).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none has started.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get<K>(&self, key: Key, api: impl FnOnce() -> (Api<K>, Option<&'static str>)) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = entries
            .get(&key)
            .and_then(|e| e.downcast_ref::<Informer<K>>())
        {
            return found.clone();
        }
        let (api, labels) = api();
        let informer = self.start(api, labels);
        entries.insert(key, Box::new(informer.clone()));
        informer
    }

    fn start<K>(&self, api: Api<K>, labels: Option<&'static str>) -> Informer<K>
    where
        K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    {
        let kind: Arc<str> = Arc::from(K::kind(&()).as_ref());
        let group = K::group(&()).into_owned();
        let (store, mut writer) = reflector::store::<K>();
        let (tx, _) = broadcast::channel(EVENT_BUFFER);
        let (served_tx, served) = watch::channel(Served::Unknown);
        let (listed_tx, listed) = watch::channel(false);
        let mut config = watcher::Config::default();
        if let Some(l) = labels {
            config = config.labels(l);
        }
        let informer = Informer {
            store,
            tx: tx.clone(),
            served,
            listed,
            kind: kind.clone(),
            metrics: self.metrics.clone(),
        };
        let (triggers, metrics, stop) = (
            self.triggers.clone(),
            self.metrics.clone(),
            self.stop.clone(),
        );
        let span = tracing::info_span!("informer", kind = %kind, labels = labels.unwrap_or(""));
        tokio::spawn(
            async move {
                // managedFields are the API server's bookkeeping of who set which field: no
                // reconciler reads them, an update that omits them keeps them, and they are
                // often the larger part of a small object, held once per object per store.
                let mut stream = std::pin::pin!(
                    watcher(api, config)
                        .default_backoff()
                        .modify(|o| o.meta_mut().managed_fields = None)
                );
                loop {
                    let next = tokio::select! {
                        () = stop.cancelled() => return,
                        next = stream.next() => next,
                    };
                    let ev = match next {
                        None => return,
                        Some(Ok(ev)) => ev,
                        Some(Err(e)) => {
                            if not_served(&e) {
                                if served_tx.send_replace(Served::Missing) != Served::Missing {
                                    tracing::warn!(
                                        "the API server does not serve {kind}s (404); what needs them waits until it does"
                                    );
                                }
                            } else {
                                tracing::debug!(error = %e, "watch failed; retrying");
                            }
                            continue;
                        }
                    };
                    writer.apply_watcher_event(&ev);
                    match &ev {
                        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                            let deleted = matches!(ev, watcher::Event::Delete(_));
                            triggers.changed(&group, &kind, o.meta(), deleted);
                            let _ = tx.send(Message::Changed(Arc::new(ev)));
                        }
                        watcher::Event::InitDone => {
                            metrics.watch_listed(&kind);
                            if served_tx.send_replace(Served::Served) == Served::Missing {
                                tracing::info!("{kind}s are served again");
                            }
                            if *listed_tx.borrow() {
                                let _ = tx.send(Message::Relisted);
                            } else {
                                listed_tx.send_replace(true);
                            }
                        }
                        watcher::Event::Init | watcher::Event::InitApply(_) => {}
                    }
                }
            }
            .instrument(span),
        );
        informer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(ns: &str, name: &str, owner: Option<(&str, &str, &str)>) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            owner_references: owner.map(|(api_version, kind, name)| {
                vec![OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: name.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn changes_stamp_knative_objects_and_their_owners_only_while_leading() {
        let t = Triggers::default();
        let rev = meta(
            "ns",
            "r1",
            Some(("serving.knative.dev/v1", "Configuration", "c")),
        );
        t.changed(SERVING_GROUP, "Revision", &rev, false);
        assert_eq!(t.pending(), 0, "a standby stamps nothing");
        t.set_leading(true);
        t.changed(SERVING_GROUP, "Revision", &rev, false);
        assert!(t.take("Revision", "ns", "r1").is_some());
        assert!(t.take("Configuration", "ns", "c").is_some());
        assert!(t.take("Revision", "ns", "r1").is_none(), "taken once");
        // A Deployment owned by a Revision stamps the Revision; a Pod owned by a ReplicaSet
        // stamps nothing (no reconciler would take it).
        let dep = meta(
            "ns",
            "r1-deployment",
            Some(("serving.knative.dev/v1", "Revision", "r1")),
        );
        t.changed("apps", "Deployment", &dep, false);
        let pod = meta("ns", "p", Some(("apps/v1", "ReplicaSet", "rs")));
        t.changed("", "Pod", &pod, false);
        assert_eq!(t.pending(), 1);
        assert!(t.take("Revision", "ns", "r1").is_some());
        // A deleted Knative object's stamp goes: nothing reconciles it.
        let svc = meta("ns", "s", None);
        t.changed(SERVING_GROUP, "Service", &svc, false);
        t.changed(SERVING_GROUP, "Service", &svc, true);
        assert_eq!(t.pending(), 0);
        t.changed(SERVING_GROUP, "Service", &svc, false);
        t.set_leading(false);
        assert_eq!(t.pending(), 0, "losing the Lease drops the stamps");
    }
}
