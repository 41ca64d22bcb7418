//! The platform's five watches (EndpointSlices, Pods, Deployments, private Services' and
//! ReplicaSets' metadata), one each for every revision, selected by label (what they find is
//! then judged by name and UID: [`super::children`], [`super::owners`]). Each runs until
//! shutdown; kube-runtime's watcher resumes from the last resourceVersion after an error (with
//! backoff) and re-lists only after a 410.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::Inner;
use super::children::{Child, ChildKind};
use super::owners::{PodInfo, Stored, controller_uid};
use super::pods::pod_failure;
use crate::knative::names::labels;
use crate::revision::RevisionKey;
use crate::telemetry::platform::WatchLabels;

fn api<K>(inner: &Inner) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match &inner.opts.namespace {
        Some(ns) => Api::namespaced(inner.client.clone(), ns),
        None => Api::all(inner.client.clone()),
    }
}

/// The revision an object belongs to, by its label.
fn revision_of<K: ResourceExt>(obj: &K) -> Option<RevisionKey> {
    let name = obj.labels().get(labels::REVISION)?;
    Some(RevisionKey::new(obj.namespace()?, name))
}

/// Drives one watch stream until shutdown, counting events and errors and marking the first
/// complete list.
async fn drive<K>(
    inner: Arc<Inner>,
    resource: &'static str,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    mut on_event: impl FnMut(&Inner, Event<K>),
) {
    let labels = WatchLabels {
        resource: resource.to_string(),
    };
    let events = inner.metrics.watch_events.get_or_create_owned(&labels);
    let errors = inner.metrics.watch_errors.get_or_create_owned(&labels);
    let mut synced = false;
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        match next {
            None => return,
            Some(Ok(ev)) => {
                events.inc();
                let done = matches!(ev, Event::InitDone);
                on_event(&inner, ev);
                if done && !synced {
                    synced = true;
                    inner.synced.send_modify(|n| *n += 1);
                    tracing::debug!(resource, "first list done");
                }
            }
            Some(Err(e)) => {
                errors.inc();
                tracing::warn!(resource, error = %e, "watch error; resuming after backoff");
            }
        }
    }
}

fn stream<K>(
    inner: &Inner,
    selector: &str,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + use<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static,
    <K as Resource>::DynamicType: Default,
{
    watch_stream(api::<K>(inner), watcher::Config::default().labels(selector)).default_backoff()
}

/// The private EndpointSlices of every revision -> each revision's endpoint snapshot.
pub(super) async fn endpoint_slices(inner: Arc<Inner>) {
    let s = stream::<EndpointSlice>(&inner, &labels::private_endpoint_slices());
    // (namespace, slice name) -> the revision it was filed under, so a relabelled slice
    // leaves its old revision.
    let mut owner: HashMap<(String, String), RevisionKey> = HashMap::new();
    let mut listing: Option<BTreeMap<RevisionKey, Vec<EndpointSlice>>> = None;
    let on_event = move |inner: &Inner, ev: Event<EndpointSlice>| match ev {
        Event::Init => listing = Some(BTreeMap::new()),
        Event::InitApply(s) => {
            if let (Some(l), Some(key)) = (listing.as_mut(), revision_of(&s)) {
                l.entry(key).or_default().push(s);
            }
        }
        Event::InitDone => {
            let mut l = listing.take().unwrap_or_default();
            owner.clear();
            // Every revision known or listed gets exactly the listed slices.
            let mut keys: Vec<RevisionKey> =
                inner.revisions.iter().map(|e| e.key().clone()).collect();
            keys.extend(l.keys().cloned());
            keys.sort();
            keys.dedup();
            for key in keys {
                let listed = l.remove(&key).unwrap_or_default();
                for s in &listed {
                    owner.insert((key.namespace.to_string(), s.name_any()), key.clone());
                }
                let judge = inner.judge_of(&key);
                let news = inner
                    .entry(&key)
                    .update(|st| st.replace_slices(listed, &judge));
                inner.count_news(&key, news);
            }
        }
        Event::Apply(s) => {
            let Some(key) = revision_of(&s) else { return };
            let id = (key.namespace.to_string(), s.name_any());
            if let Some(old) = owner.insert(id.clone(), key.clone())
                && old != key
            {
                inner.entry(&old).update(|st| st.slices.remove(&id.1));
            }
            let judge = inner.judge_of(&key);
            let news = inner.entry(&key).update(|st| st.put_slice(s, &judge));
            inner.count_news(&key, news);
        }
        Event::Delete(s) => {
            let id = (s.namespace().unwrap_or_default(), s.name_any());
            if let Some(key) = owner.remove(&id).or_else(|| revision_of(&s)) {
                inner.entry(&key).update(|st| st.slices.remove(&id.1));
            }
        }
    };
    drive(inner.clone(), "endpointslices", s, on_event)
        .instrument(tracing::info_span!("watch", resource = "endpointslices"))
        .await
}

/// Counts an owner the index refused (full).
fn owners_full(inner: &Inner, stored: Stored, resource: &str) -> bool {
    if stored == Stored::Full {
        inner
            .metrics
            .owners_refused
            .get_or_create(&WatchLabels {
                resource: resource.to_string(),
            })
            .inc();
    }
    stored == Stored::Changed
}

/// The pods of every revision -> each revision's failing pods, and each pod's ReplicaSet, IPs,
/// phase and deletion (a change of those judges the revision's endpoints again).
pub(super) async fn pods(inner: Arc<Inner>) {
    let s = stream::<Pod>(&inner, labels::REVISION);
    let restart_limit = inner.opts.restart_limit;
    let mut listing: Option<Vec<Pod>> = None;
    // `listed`: part of a list, after which every revision is re-reduced at once.
    let apply = move |inner: &Inner, pod: &Pod, listed: bool| {
        let Some(key) = revision_of(pod) else { return };
        let name = pod.name_any();
        if owners_full(
            inner,
            inner
                .owners
                .put_pod(&key.namespace, &name, PodInfo::of(pod)),
            "pods",
        ) && !listed
        {
            inner.refilter(&key);
        }
        // A pod being deleted is on its way out: its state says nothing about the revision.
        let failure = if pod.metadata.deletion_timestamp.is_some() {
            None
        } else {
            pod_failure(pod, restart_limit)
        };
        inner.entry(&key).update(|st| match failure {
            Some(f) => {
                if st.failing_pods.get(&name) != Some(&f) {
                    tracing::warn!(revision = %key, pod = %name, reason = %f.reason, detail = %f.detail, "pod failing");
                }
                st.failing_pods.insert(name, f);
            }
            None => {
                if st.failing_pods.remove(&name).is_some() {
                    tracing::info!(revision = %key, pod = %name, "pod no longer failing");
                }
            }
        });
    };
    let on_event = move |inner: &Inner, ev: Event<Pod>| match ev {
        Event::Init => listing = Some(Vec::new()),
        Event::InitApply(p) => {
            if let Some(l) = listing.as_mut() {
                l.push(p);
            }
        }
        Event::InitDone => {
            for e in inner.revisions.iter() {
                e.value().update(|st| st.failing_pods.clear());
            }
            inner.owners.clear_pods();
            for p in listing.take().unwrap_or_default() {
                apply(inner, &p, true);
            }
            inner.refilter_all();
        }
        Event::Apply(p) => apply(inner, &p, false),
        Event::Delete(p) => {
            if let Some(key) = revision_of(&p) {
                inner.owners.remove_pod(&key.namespace, &p.name_any());
                inner
                    .entry(&key)
                    .update(|st| st.failing_pods.remove(&p.name_any()));
                inner.refilter(&key);
            }
        }
    };
    drive(inner.clone(), "pods", s, on_event)
        .instrument(tracing::info_span!("watch", resource = "pods"))
        .await
}

/// What the platform keeps of a Deployment or Service carrying a revision label: `None` without
/// the label or a namespace.
fn child_of<K: ResourceExt>(obj: &K, replicas: Option<u32>) -> Option<(String, String, Child)> {
    let revision = obj.labels().get(labels::REVISION)?.clone();
    let child = Child {
        revision,
        uid: obj.uid(),
        controller: controller_uid(Some(obj.owner_references()), "Revision"),
        replicas,
    };
    Some((obj.namespace()?, obj.name_any(), child))
}

/// Keeps every object of `kind` the stream lists by name; a change judges it again (counting it
/// once if it is not its revision's) and, when its label, UID or controller changed, the
/// endpoints of the revisions it was and is labelled with.
async fn children<K>(
    inner: Arc<Inner>,
    kind: ChildKind,
    resource: &'static str,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    replicas: fn(&K) -> Option<u32>,
) where
    K: ResourceExt,
{
    let mut listing: Option<Vec<((String, String), Child)>> = None;
    // Scalers wait for Deployments only.
    let bump = move |inner: &Inner| {
        if kind == ChildKind::Deployment {
            inner.deployments_changed.send_modify(|n| *n += 1);
        }
    };
    let relabelled = |inner: &Inner, ns: &str, old: Option<&Child>, new: Option<&Child>| {
        let same = |a: &Child, b: &Child| {
            a.revision == b.revision && a.uid == b.uid && a.controller == b.controller
        };
        if let (Some(a), Some(b)) = (old, new)
            && same(a, b)
        {
            return; // replicas only
        }
        for c in old.into_iter().chain(new) {
            inner.refilter(&RevisionKey::new(ns, &c.revision));
        }
    };
    let on_event = move |inner: &Inner, ev: Event<K>| match ev {
        Event::Init => listing = Some(Vec::new()),
        Event::InitApply(o) => {
            if let (Some(l), Some((ns, name, c))) = (listing.as_mut(), child_of(&o, replicas(&o))) {
                l.push(((ns, name), c));
            }
        }
        Event::InitDone => {
            inner
                .children
                .replace_all(kind, listing.take().unwrap_or_default());
            inner.ignored.retain(kind, |ns, name| {
                inner.children.get(kind, ns, name).is_some()
            });
            for (ns, name) in inner.children.keys(kind) {
                inner.judge_child(kind, &ns, &name);
            }
            inner.refilter_all();
            bump(inner);
        }
        Event::Apply(o) => {
            let Some((ns, name, c)) = child_of(&o, replicas(&o)) else {
                return;
            };
            let old = inner.children.put(kind, &ns, &name, c.clone());
            inner.judge_child(kind, &ns, &name);
            relabelled(inner, &ns, old.as_ref(), Some(&c));
            bump(inner);
        }
        Event::Delete(o) => {
            let (Some(ns), name) = (o.namespace(), o.name_any()) else {
                return;
            };
            let old = inner.children.remove(kind, &ns, &name);
            inner.judge_child(kind, &ns, &name);
            relabelled(inner, &ns, old.as_ref(), None);
            bump(inner);
        }
    };
    drive(inner.clone(), resource, stream, on_event)
        .instrument(tracing::info_span!("watch", resource))
        .await
}

/// The Deployments carrying a revision label, by name: which one scales which revision
/// ([`super::Inner::deployment`]).
pub(super) async fn deployments(inner: Arc<Inner>) {
    let s = stream::<Deployment>(&inner, labels::REVISION);
    let replicas = |d: &Deployment| {
        d.spec
            .as_ref()
            .and_then(|s| s.replicas)
            .and_then(|r| u32::try_from(r).ok())
    };
    children(inner, ChildKind::Deployment, "deployments", s, replicas).await
}

/// The private Services carrying a revision label, metadata only (names, labels, owners): whose
/// EndpointSlices are the revision's.
pub(super) async fn private_services(inner: Arc<Inner>) {
    // `Api<PartialObjectMeta<_>>` asks for metadata only (lists and watch events alike).
    let api = api::<PartialObjectMeta<Service>>(&inner);
    let selector = format!(
        "{}={},{}",
        labels::SERVICE_TYPE,
        labels::SERVICE_TYPE_PRIVATE,
        labels::REVISION
    );
    let s = watch_stream(api, watcher::Config::default().labels(&selector)).default_backoff();
    children(inner, ChildKind::Service, "services", s, |_| None).await
}

/// The ReplicaSets of every revision, metadata only (`PartialObjectMetadata`: names, labels,
/// owners; no pod template) -> each one's controlling Deployment in the ownership index.
pub(super) async fn replica_sets(inner: Arc<Inner>) {
    // `Api<PartialObjectMeta<_>>` asks for metadata only (lists and watch events alike).
    let api = api::<PartialObjectMeta<ReplicaSet>>(&inner);
    let s =
        watch_stream(api, watcher::Config::default().labels(labels::REVISION)).default_backoff();
    let mut listing: Option<Vec<PartialObjectMeta<ReplicaSet>>> = None;
    let apply = |inner: &Inner, rs: &PartialObjectMeta<ReplicaSet>, listed: bool| {
        let (Some(uid), Some(key)) = (rs.uid(), revision_of(rs)) else {
            return;
        };
        let deployment = controller_uid(rs.metadata.owner_references.as_deref(), "Deployment");
        let stored = inner.owners.put_replica_set(&uid, deployment);
        if owners_full(inner, stored, "replicasets") && !listed {
            inner.refilter(&key);
        }
    };
    let on_event = move |inner: &Inner, ev: Event<PartialObjectMeta<ReplicaSet>>| match ev {
        Event::Init => listing = Some(Vec::new()),
        Event::InitApply(rs) => {
            if let Some(l) = listing.as_mut() {
                l.push(rs);
            }
        }
        Event::InitDone => {
            inner.owners.clear_replica_sets();
            for rs in listing.take().unwrap_or_default() {
                apply(inner, &rs, true);
            }
            inner.refilter_all();
        }
        Event::Apply(rs) => apply(inner, &rs, false),
        Event::Delete(rs) => {
            if let Some(uid) = rs.uid() {
                inner.owners.remove_replica_set(&uid);
            }
            if let Some(key) = revision_of(&rs) {
                inner.refilter(&key);
            }
        }
    };
    drive(inner.clone(), "replicasets", s, on_event)
        .instrument(tracing::info_span!("watch", resource = "replicasets"))
        .await
}
