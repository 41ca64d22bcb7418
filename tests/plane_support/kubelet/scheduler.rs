//! The scheduler's one job, with the scheduler's identity: every pending pod of the default
//! scheduler is bound to this node (`pods/{name}/binding`) when it fits: its `nodeSelector`
//! matches the node's labels, it tolerates the node's NoSchedule and NoExecute taints, and
//! the node is not cordoned (or the pod tolerates that). A pod that does not fit stays
//! Pending with PodScheduled=False, reason Unschedulable and the scheduler's message,
//! written once per change of message. Node affinity, pod affinity, topology spread,
//! resources and preemption are not weighed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, reflector as reflect, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::env::api_message;
use super::{Shared, api_retry, now_time};

/// Follows unbound pods and the node until shutdown, binding what fits. Acts on every
/// change it hears of, and every second (store reads only: writes happen on change).
pub(super) async fn run(k: Arc<Shared>) {
    let client = k.cfg.scheduler_client.clone();
    let changed = Arc::new(Notify::new());
    // As the scheduler's informer: pods not finished, here only the unbound ones.
    let pods_cfg = watcher::Config::default()
        .fields("spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed");
    let pods = follow::<Pod>(&k, Api::all(client.clone()), pods_cfg, changed.clone());
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={}", k.cfg.node_name));
    let nodes = follow::<Node>(&k, Api::all(client.clone()), node_cfg, changed.clone());
    // UID -> the Unschedulable message last written; UIDs bound (until the watch drops them).
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut bound: BTreeSet<String> = BTreeSet::new();
    // UID -> (failed writes in a row, next try): a failing pod is retried with back-off.
    let mut retry: BTreeMap<String, (u32, Instant)> = BTreeMap::new();
    loop {
        tokio::select! {
            () = k.stop.cancelled() => return,
            () = changed.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let Some(node) = nodes.state().into_iter().next() else {
            continue;
        };
        let pending = pods.state();
        for pod in &pending {
            let Some(uid) = pod.uid() else { continue };
            let waiting = retry.get(&uid).is_some_and(|(_, at)| Instant::now() < *at);
            if bound.contains(&uid) || waiting || !ours(pod) {
                continue;
            }
            let ok = match fits(pod, &node) {
                Ok(()) => {
                    let ok = bind(&k, pod).await;
                    if ok {
                        bound.insert(uid.clone());
                    }
                    ok
                }
                Err(why) => {
                    let message = format!(
                        "0/1 nodes are available: 1 {why}. preemption: 0/1 nodes are available: \
                         1 Preemption is not helpful for scheduling."
                    );
                    let same = written.get(&uid) == Some(&message);
                    let ok = same || unschedulable(&k, pod, &message).await;
                    if ok {
                        written.insert(uid.clone(), message);
                    }
                    ok
                }
            };
            if ok {
                retry.remove(&uid);
            } else {
                let n = retry.get(&uid).map_or(0, |r| r.0) + 1;
                retry.insert(uid, (n, Instant::now() + api_retry(n)));
            }
        }
        let present: BTreeSet<String> = pending.iter().filter_map(|p| p.uid()).collect();
        bound.retain(|u| present.contains(u));
        written.retain(|u, _| present.contains(u));
        retry.retain(|u, _| present.contains(u));
    }
}

/// A reflector of `api` (with `cfg`) whose task notifies `changed` on every event and ends at
/// shutdown; watch errors are logged and retried with the watcher's default back-off.
fn follow<K>(k: &Arc<Shared>, api: Api<K>, cfg: watcher::Config, changed: Arc<Notify>) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let stream = reflect(writer, watcher(api, cfg)).default_backoff();
    let k = k.clone();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            let ev = tokio::select! {
                () = k.stop.cancelled() => return,
                ev = stream.next() => ev,
            };
            match ev {
                None => return,
                Some(Err(e)) => k.say(format_args!("scheduler watch: {e}")),
                Some(Ok(_)) => changed.notify_one(),
            }
        }
    });
    reader
}

/// Whether the default scheduler owns `pod` and it waits for a node.
fn ours(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.node_name.as_deref().unwrap_or("").is_empty()
        && pod.metadata.deletion_timestamp.is_none()
        && matches!(
            spec.scheduler_name.as_deref(),
            None | Some("") | Some("default-scheduler")
        )
}

/// Whether `pod` may go to `node`; `Err` is the scheduler's reason, e.g. "node(s) didn't
/// match Pod's node affinity/selector".
fn fits(pod: &Pod, node: &Node) -> Result<(), String> {
    let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
    let labels = node.labels();
    if spec
        .node_selector
        .iter()
        .flatten()
        .any(|(k, v)| labels.get(k) != Some(v))
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    let tolerations: &[Toleration] = spec.tolerations.as_deref().unwrap_or_default();
    let node_spec = node.spec.as_ref();
    if node_spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        };
        if !tolerations.iter().any(|t| tolerates(t, &cordon)) {
            return Err("node(s) were unschedulable".into());
        }
    }
    for taint in node_spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        let matters = taint.effect == "NoSchedule" || taint.effect == "NoExecute";
        if matters && !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Err(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or("")
            ));
        }
    }
    Ok(())
}

/// Kubernetes' `ToleratesTaint`: the effect (empty: any), the key (empty with Exists: any)
/// and, with Equal (the default), the value must match.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// POSTs the pod's Binding to this node; `true` when bound (also when it was bound already:
/// 409). Other errors are logged; the next pass retries.
async fn bind(k: &Shared, pod: &Pod) -> bool {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(k.cfg.scheduler_client.clone(), &ns);
    let binding = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.uid()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": k.cfg.node_name},
    });
    let pp = PostParams::default();
    let call = api.create_subresource::<_, serde_json::Value>("binding", &name, &pp, &binding);
    match tokio::time::timeout(Duration::from_secs(15), call).await {
        Ok(Ok(_)) => true,
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => true,
        Ok(Err(e)) => {
            k.say(format_args!("binding {ns}/{name}: {}", api_message(&e)));
            false
        }
        Err(_) => {
            k.say(format_args!("binding {ns}/{name}: timed out"));
            false
        }
    }
}

/// Writes PodScheduled=False, Unschedulable, `message` (keeping its transition time if it
/// was False already); `true` when written.
async fn unschedulable(k: &Shared, pod: &Pod, message: &str) -> bool {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let since = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0.to_string()))
        .unwrap_or_else(now_time);
    let api: Api<Pod> = Api::namespaced(k.cfg.scheduler_client.clone(), &ns);
    let patch = Patch::Strategic(json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastProbeTime": null, "lastTransitionTime": since}]}}));
    let pp = PatchParams::default();
    let call = api.patch_status(&name, &pp, &patch);
    match tokio::time::timeout(Duration::from_secs(15), call).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            k.say(format_args!(
                "marking {ns}/{name} unschedulable: {}",
                api_message(&e)
            ));
            false
        }
        Err(_) => false,
    }
}
