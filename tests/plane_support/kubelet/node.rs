//! The Node: registered with the node's identity (NodeRestriction lets a node create and
//! update only its own Node, with only the kubelet's labels, never its taints), its status
//! written every 10 s through `nodes/status`, and its Lease in `kube-node-lease` renewed
//! every 10 s: the nodelifecycle controller marks a node whose Lease stops NotReady, taints
//! it and evicts its pods, as in a cluster.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::env::api_message;
use super::resources::{ALLOCATABLE_CPU, ALLOCATABLE_MEMORY};
use super::{Shared, api_retry, not_found, now_micro, now_time};

/// How often the status and the Lease are written (the kubelet's
/// `nodeStatusUpdateFrequency` and its Lease renewal interval).
const EVERY: Duration = Duration::from_secs(10);
/// The Lease's duration (the kubelet's default).
const LEASE_SECONDS: i32 = 40;
/// The Lease's namespace (created by the API server).
const LEASE_NS: &str = "kube-node-lease";

/// What registration found: the Node's UID (the Lease's owner) and when it turned Ready.
pub(super) struct NodeRecord {
    pub(super) uid: String,
    pub(super) since: String,
}

/// Creates the Node (or takes the existing one), writes its status Ready and takes its
/// Lease; retries for a minute, then panics with the last error (the test cannot go on).
pub(super) async fn register(k: &Arc<Shared>) -> NodeRecord {
    let since = now_time();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    loop {
        let result = async {
            let uid = create(k, &since).await?;
            renew_lease(k, &uid).await?;
            Ok::<_, String>(uid)
        }
        .await;
        match result {
            Ok(uid) => return NodeRecord { uid, since },
            Err(e) if Instant::now() >= deadline => {
                panic!(
                    "kubelet {}: the Node could not be registered in 60 s: {e}",
                    k.cfg.node_name
                )
            }
            Err(e) => {
                k.say(format_args!("registering: {e}"));
                tokio::time::sleep(api_retry(attempt)).await;
                attempt += 1;
            }
        }
    }
}

/// The Node as the kubelet registers it: its labels, no taints, its status.
fn node_object(k: &Shared, since: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": k.cfg.node_name,
            "labels": {
                "kubernetes.io/hostname": k.cfg.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": status(k, since),
    })
}

/// The node's status now: Ready, no pressure, its addresses, capacity and system info.
fn status(k: &Shared, since: &str) -> Value {
    let now = now_time();
    let cond = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since})
    };
    let resources = json!({"cpu": ALLOCATABLE_CPU, "memory": ALLOCATABLE_MEMORY, "pods": "110"});
    let id = super::sha256_hex(k.cfg.node_name.as_bytes());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": k.cfg.node_ip.to_string()},
            {"type": "Hostname", "address": k.cfg.node_name},
        ],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": &id[..32],
            "systemUUID": &id[32..],
            "bootID": &id[..32],
            "kernelVersion": kernel.trim(),
            "osImage": "thaw test plane",
            "containerRuntimeVersion": "thaw-test-kubelet://1.0.0",
            "kubeletVersion": "v1.34.4",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    })
}

/// Creates the Node (409: it exists, from an earlier run of the same name), then writes its
/// status (so an existing one is Ready too) and reads it back; the Node's UID.
async fn create(k: &Shared, since: &str) -> Result<String, String> {
    let api: Api<Node> = Api::all(k.cfg.node_client.clone());
    let node: Node = serde_json::from_value(node_object(k, since)).map_err(|e| e.to_string())?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating Node: {}", api_message(&e))),
    }
    write_status(k, since).await?;
    let node = api
        .get(&k.cfg.node_name)
        .await
        .map_err(|e| format!("reading Node back: {}", api_message(&e)))?;
    let ready = node
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return Err("the Node is not Ready after its status was written".into());
    }
    node.metadata
        .uid
        .ok_or_else(|| "the Node has no UID".into())
}

/// Writes the Node's status (strategic merge: conditions and addresses by type).
async fn write_status(k: &Shared, since: &str) -> Result<(), String> {
    let api: Api<Node> = Api::all(k.cfg.node_client.clone());
    let patch = Patch::Strategic(json!({"status": status(k, since)}));
    let pp = PatchParams::default();
    let call = api.patch_status(&k.cfg.node_name, &pp, &patch);
    match tokio::time::timeout(Duration::from_secs(15), call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("writing Node status: {}", api_message(&e))),
        Err(_) => Err("writing Node status: timed out".into()),
    }
}

/// Writes the Node's status every 10 s (sooner again after a failure) until shutdown.
pub(super) async fn status_loop(k: Arc<Shared>, since: String) {
    let mut failures = 0;
    loop {
        let wait = if failures == 0 {
            EVERY
        } else {
            api_retry(failures).min(EVERY)
        };
        tokio::select! {
            () = k.stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match write_status(&k, &since).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                k.say(e);
            }
        }
    }
}

/// Renews the Lease every 10 s (sooner again after a failure) until shutdown.
pub(super) async fn lease_loop(k: Arc<Shared>, node_uid: String) {
    let mut failures = 0;
    loop {
        let wait = if failures == 0 {
            EVERY
        } else {
            api_retry(failures).min(EVERY)
        };
        tokio::select! {
            () = k.stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match renew_lease(&k, &node_uid).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                k.say(e);
            }
        }
    }
}

/// Renews the Lease (`renewTime` now), creating it when missing, owned by the Node (so it
/// goes with it) as the kubelet's is.
async fn renew_lease(k: &Shared, node_uid: &str) -> Result<(), String> {
    let api: Api<Lease> = Api::namespaced(k.cfg.node_client.clone(), LEASE_NS);
    let name = &k.cfg.node_name;
    let spec = json!({"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": now_micro()});
    let pp = PatchParams::default();
    let patch = Patch::Merge(json!({"spec": spec}));
    let call = api.patch(name, &pp, &patch);
    match tokio::time::timeout(Duration::from_secs(15), call).await {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) if not_found(&e) => {}
        Ok(Err(e)) => return Err(format!("renewing Lease: {}", api_message(&e))),
        Err(_) => return Err("renewing Lease: timed out".into()),
    }
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NS,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
        "spec": spec,
    }))
    .map_err(|e| e.to_string())?;
    match tokio::time::timeout(
        Duration::from_secs(15),
        api.create(&PostParams::default(), &lease),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        // Created meanwhile: renewed at the next tick.
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Ok(()),
        Ok(Err(e)) => Err(format!("creating Lease: {}", api_message(&e))),
        Err(_) => Err("creating Lease: timed out".into()),
    }
}
