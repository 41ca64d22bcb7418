//! The kubelet's pod source: a watch of the pods bound to this node (field selector
//! `spec.nodeName=<node>`, the only list/watch of pods the Node authorizer allows a node),
//! one task per pod UID ([`super::pod::run`]) fed every new version of its pod, and told
//! when the pod vanished from the API (deleted with grace 0 by someone else, or missing from
//! a relist).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{PodHandle, Shared, pod};

/// Follows the node's pods until shutdown. Watch errors are logged and retried with the
/// watcher's default back-off.
pub(super) async fn run(k: Arc<Shared>) {
    let api: Api<Pod> = Api::all(k.cfg.node_client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", k.cfg.node_name));
    let stream = watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let arrivals = AtomicU64::new(0);
    // The UIDs of a relist in progress.
    let mut relist: Option<BTreeSet<String>> = None;
    loop {
        let ev = tokio::select! {
            () = k.stop.cancelled() => return,
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { return };
        match ev {
            Err(e) => k.say(format_args!("watching pods: {e}")),
            Ok(watcher::Event::Init) => relist = Some(BTreeSet::new()),
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(r) = relist.as_mut() {
                    r.insert(p.uid().unwrap_or_default());
                }
                seen(&k, p, &arrivals);
            }
            Ok(watcher::Event::Apply(p)) => seen(&k, p, &arrivals),
            Ok(watcher::Event::Delete(p)) => gone(&k, &p.uid().unwrap_or_default()),
            Ok(watcher::Event::InitDone) => {
                let present = relist.take().unwrap_or_default();
                let missing: Vec<String> = k
                    .pods
                    .lock()
                    .unwrap()
                    .keys()
                    .filter(|uid| !present.contains(*uid))
                    .cloned()
                    .collect();
                for uid in missing {
                    gone(&k, &uid);
                }
            }
        }
    }
}

/// Hands `p` to its task, starting one for a UID not seen before.
fn seen(k: &Arc<Shared>, p: Pod, arrivals: &AtomicU64) {
    let Some(uid) = p.uid() else { return };
    let p = Arc::new(p);
    let mut pods = k.pods.lock().unwrap();
    if let Some(h) = pods.get(&uid) {
        h.tx.send_replace(p);
        return;
    }
    let (tx, rx) = watch::channel(p);
    let vanished = CancellationToken::new();
    let seq = arrivals.fetch_add(1, Ordering::Relaxed);
    let task = tokio::spawn(pod::run(k.clone(), rx, vanished.clone(), seq));
    pods.insert(uid, PodHandle { tx, vanished, task });
}

/// The pod is no longer in the API: its task (if still running) kills everything at once;
/// its entry goes.
fn gone(k: &Arc<Shared>, uid: &str) {
    if let Some(h) = k.pods.lock().unwrap().remove(uid) {
        h.vanished.cancel();
    }
}
