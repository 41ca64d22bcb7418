//! A service mesh enforcing mutual TLS (Istio's `STRICT` peer authentication), played on
//! loopback: a "strict" pod's addresses in its EndpointSlice are its mesh proxy's, which
//! closes every plain-text connection unanswered (as Envoy does when it expects TLS); its
//! sidecar's real ports are reachable only through the revision's private Service, whose
//! cluster IP [`KubeProxy`] plays (as kube-proxy and the caller's mesh proxy would: each
//! connection to a port of the cluster IP goes to the next ready pod's sidecar port, strict or
//! not).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::{NS, free_port, obj};

/// Each revision's ready pods with a sidecar: the sidecar's (data, admin) ports.
static BEHIND_MESH: Mutex<BTreeMap<String, Vec<(u16, u16)>>> = Mutex::new(BTreeMap::new());

/// Puts a pod's sidecar behind its revision's private Service.
pub(super) fn join(revision: &str, data: u16, admin: u16) {
    BEHIND_MESH
        .lock()
        .unwrap()
        .entry(revision.into())
        .or_default()
        .push((data, admin));
}

/// Takes a pod's sidecar out (its pod is gone).
pub(super) fn leave(revision: &str, data: u16) {
    if let Some(pods) = BEHIND_MESH.lock().unwrap().get_mut(revision) {
        pods.retain(|(d, _)| *d != data);
    }
}

/// A mesh proxy refusing plain text on a port of its own; returns the port and its task.
pub(super) async fn strict_port() -> (u16, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                // Reads the plain-text request, and closes: no TLS handshake came.
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf).await;
            });
        }
    });
    (port, task)
}

/// kube-proxy for one revision's private Service: the Service (with this cluster IP and a
/// port `http` and `http-autometric`, as the controller writes it) and the forwarding.
pub struct KubeProxy {
    pub cluster_ip: Ipv4Addr,
    pub http: u16,
    pub stats: u16,
    /// Connections forwarded, per port name.
    pub forwarded: std::sync::Arc<[AtomicUsize; 2]>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl KubeProxy {
    pub async fn start(client: &kube::Client, revision: &str, cluster_ip: Ipv4Addr) -> Self {
        let (http, stats) = (free_port(), free_port());
        // The revision's private Service (`Cluster::revision` made it, owned by the Revision)
        // gets its cluster IP and ports.
        let svcs: Api<Service> = Api::namespaced(client.clone(), NS);
        let name = format!("{revision}-private");
        let made = svcs.get(&name).await.unwrap();
        svcs.replace(
            &name,
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": name, "resourceVersion": made.metadata.resource_version,
                    "ownerReferences": made.metadata.owner_references, "labels": {
                    "serving.knative.dev/revision": revision,
                    "networking.internal.knative.dev/serviceType": "Private"}},
                "spec": {"clusterIP": cluster_ip.to_string(),
                    "selector": {"serving.knative.dev/revision": revision},
                    "ports": [
                        {"name": "http", "port": http, "targetPort": 8012, "protocol": "TCP"},
                        {"name": "http-autometric", "port": stats, "targetPort": 9091,
                            "protocol": "TCP"}]},
            })),
        )
        .await
        .unwrap();
        let forwarded = std::sync::Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let mut tasks = Vec::new();
        for (i, port) in [http, stats].into_iter().enumerate() {
            let l = TcpListener::bind(SocketAddr::from((cluster_ip, port)))
                .await
                .unwrap();
            let (rev, forwarded) = (revision.to_string(), forwarded.clone());
            tasks.push(tokio::spawn(async move {
                let next = AtomicUsize::new(0);
                while let Ok((mut c, _)) = l.accept().await {
                    let pods = BEHIND_MESH.lock().unwrap().get(&rev).cloned();
                    let Some(pods) = pods.filter(|p| !p.is_empty()) else {
                        continue; // no endpoint: the connection is dropped
                    };
                    let (data, admin) = pods[next.fetch_add(1, Ordering::Relaxed) % pods.len()];
                    let to = if i == 0 { data } else { admin };
                    forwarded[i].fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(async move {
                        if let Ok(mut up) = TcpStream::connect(("127.0.0.1", to)).await {
                            let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
                        }
                    });
                }
            }));
        }
        Self {
            cluster_ip,
            http,
            stats,
            forwarded,
            tasks,
        }
    }

    /// Connections forwarded to the sidecars' data ports and to their admin (stats) ports.
    pub fn forwarded(&self) -> (usize, usize) {
        (
            self.forwarded[0].load(Ordering::Relaxed),
            self.forwarded[1].load(Ordering::Relaxed),
        )
    }
}
