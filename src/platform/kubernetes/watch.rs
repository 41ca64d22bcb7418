//! The platform's four watches (EndpointSlices, Pods, Deployments, ReplicaSets' metadata), one
//! each for every revision, selected by label. Each runs until shutdown; kube-runtime's watcher resumes from
//! the last resourceVersion after an error (with backoff) and re-lists only after a 410.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::owners::{Stored, controller_uid};
use super::pods::pod_failure;
use super::{DeploymentRef, Inner};
use crate::knative::names::labels;
use crate::revision::RevisionKey;
use crate::telemetry::platform::{RevisionLabels, WatchLabels};

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
                let verdict = inner.verdict_of(&key);
                let foreign = inner.entry(&key).update(|st| {
                    st.slices.clear();
                    listed
                        .into_iter()
                        .map(|s| st.put_slice(s, &verdict))
                        .sum::<usize>()
                });
                count_foreign(inner, &key, foreign);
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
            let verdict = inner.verdict_of(&key);
            let foreign = inner.entry(&key).update(|st| st.put_slice(s, &verdict));
            count_foreign(inner, &key, foreign);
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

/// Counts `foreign` endpoints found in a slice of `key` (and says so once per slice event).
fn count_foreign(inner: &Inner, key: &RevisionKey, foreign: usize) {
    if foreign == 0 {
        return;
    }
    tracing::warn!(revision = %key, foreign, "endpoints whose pod is not the revision's Deployment's: left out");
    inner
        .metrics
        .foreign_endpoints
        .get_or_create(&RevisionLabels {
            namespace: key.namespace.to_string(),
            revision: key.name.to_string(),
        })
        .inc_by(foreign as u64);
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

/// The pods of every revision -> each revision's failing pods, and each pod's ReplicaSet.
pub(super) async fn pods(inner: Arc<Inner>) {
    let s = stream::<Pod>(&inner, labels::REVISION);
    let restart_limit = inner.opts.restart_limit;
    let mut listing: Option<Vec<Pod>> = None;
    // `listed`: part of a list, after which every revision is re-reduced at once.
    let apply = move |inner: &Inner, pod: &Pod, listed: bool| {
        let Some(key) = revision_of(pod) else { return };
        let name = pod.name_any();
        let rs = controller_uid(pod.metadata.owner_references.as_deref(), "ReplicaSet");
        if owners_full(
            inner,
            inner.owners.put_pod(&key.namespace, &name, rs),
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

/// The Deployments of every revision -> which Deployment scales which revision.
pub(super) async fn deployments(inner: Arc<Inner>) {
    let s = stream::<Deployment>(&inner, labels::REVISION);
    let mut listing: Option<Vec<(RevisionKey, DeploymentRef)>> = None;
    let of = |d: &Deployment| DeploymentRef {
        name: d.name_any(),
        uid: d.uid(),
        replicas: d
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .and_then(|r| u32::try_from(r).ok()),
    };
    let on_event = move |inner: &Inner, ev: Event<Deployment>| {
        match ev {
            Event::Init => {
                listing = Some(Vec::new());
                return;
            }
            Event::InitApply(d) => {
                if let (Some(l), Some(key)) = (listing.as_mut(), revision_of(&d)) {
                    l.push((key, of(&d)));
                }
                return;
            }
            Event::InitDone => {
                inner.deployments.clear();
                for (k, d) in listing.take().unwrap_or_default() {
                    inner.deployments.insert(k, d);
                }
                inner.refilter_all();
            }
            Event::Apply(d) => {
                if let Some(key) = revision_of(&d) {
                    let new = of(&d);
                    let uid_changed = inner
                        .deployments
                        .insert(key.clone(), new.clone())
                        .is_none_or(|old| old.uid != new.uid);
                    if uid_changed {
                        inner.refilter(&key);
                    }
                }
            }
            Event::Delete(d) => {
                if let Some(key) = revision_of(&d) {
                    inner
                        .deployments
                        .remove_if(&key, |_, known| known.name == d.name_any());
                    inner.refilter(&key);
                }
            }
        }
        inner.deployments_changed.send_modify(|n| *n += 1);
    };
    drive(inner.clone(), "deployments", s, on_event)
        .instrument(tracing::info_span!("watch", resource = "deployments"))
        .await
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
