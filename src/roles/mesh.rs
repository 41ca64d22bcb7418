//! Knative's `mesh-compatibility-mode` (config-network) for the activator and the autoscaler:
//! how they reach a revision's pods.
//!
//! In a namespace where a service mesh enforces mutual TLS (Istio's `STRICT`), a pod's proxy
//! refuses the plain-text connections a caller outside the mesh makes to the pod's own
//! address; a caller inside the mesh fares no better, since its proxy passes a connection to
//! a bare pod address through untouched. Calls to the revision's **private Service** (its
//! cluster IP) are the mesh's own traffic: its proxy picks a pod and speaks mutual TLS to it.
//!
//! - `enabled`: every revision through its private Service: the activator forwards to the
//!   Service's `http` (or, for an h2c revision, `http2`) port, the autoscaler pulls pod stats
//!   from its [`crate::stats::POD_STATS_PORT_NAME`] port.
//! - `disabled`: the pods directly.
//! - `auto` (the default): the pods directly unless they refuse as a mesh does. The activator
//!   probes a revision's first ready pod (`K-Network-Probe: queue`, which the queue sidecar
//!   answers `queue`) before it sends the revision anything: an answer (any but 502 or 503)
//!   means the pods are reachable; a refusal as a mesh answers plain text (502 or 503, or a
//!   connection closed before any answer) sends the same probe to the private Service, and the
//!   sidecar's answer there moves the revision to the Service. The autoscaler decides from its pulls: a sample whose every
//!   pull was refused that way is tried through the Service next. A revision's decision sticks
//!   for the life of the process (Knative's too); anything else (a timeout, a refused
//!   connection) decides nothing and is tried again.
//!
//! Behind a cluster IP the activator cannot balance per pod: the revision has one endpoint,
//! the Service, whose capacity is `max(1, cc × ready pods / activators)` (Knative's), where
//! the activators are those the revision's public slices list (its subset), and
//! containerConcurrency 0 stays unlimited. The pod-stats pull through the Service makes a new
//! connection per pull (so that each may reach another pod) and retries up to
//! [`SERVICE_PULL_TRIES`] times per sampled pod to find pods not yet sampled, as Knative's
//! scraper does.
//!
//! The mode is read once, when the role starts (as Knative's activator does): changing it takes
//! a restart of the activators and the autoscalers.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_stream};
use tokio::sync::watch;
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::network::MeshMode;
use crate::knative::names::labels;
use crate::platform::EndpointSnapshot;
use crate::revision::RevisionKey;

/// How long the activator's probe of a pod or a Service may take (Knative's `PROBE_TIMEOUT`).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Pulls through the Service per sampled pod, to find one not yet sampled (Knative's
/// `scraperMaxRetries`).
pub const SERVICE_PULL_TRIES: usize = 10;
/// The `User-Agent` of the activator's probes (Knative's).
pub const PROBE_USER_AGENT: &str = "Knative-Activator-Probe";

/// How a revision's pods are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// At their own addresses.
    Pods,
    /// Through the private Service's cluster IP.
    Service,
    /// Not yet known (`auto`, before a probe or a pull told).
    Unknown,
}

/// A private Service's cluster IP and its ports by name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceAddr {
    ip: IpAddr,
    ports: BTreeMap<String, u16>,
}

/// The mode, the private Services' addresses, and each revision's reach under `auto`.
pub struct Mesh {
    mode: MeshMode,
    services: DashMap<RevisionKey, ServiceAddr>,
    decided: DashMap<RevisionKey, Reach>,
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("mode", &self.mode)
            .field("services", &self.services.len())
            .finish()
    }
}

impl Mesh {
    pub fn new(mode: MeshMode) -> Arc<Self> {
        Arc::new(Self {
            mode,
            services: DashMap::new(),
            decided: DashMap::new(),
            changed: watch::channel(0).0,
        })
    }

    pub fn mode(&self) -> MeshMode {
        self.mode
    }

    /// How `revision`'s pods are reached now.
    pub fn reach(&self, revision: &RevisionKey) -> Reach {
        match self.mode {
            MeshMode::Enabled => Reach::Service,
            MeshMode::Disabled => Reach::Pods,
            MeshMode::Auto => self.decided.get(revision).map_or(Reach::Unknown, |r| *r),
        }
    }

    /// Records what a probe or a pull showed of `revision` (`auto` only; the first decision
    /// sticks).
    pub fn decide(&self, revision: &RevisionKey, reach: Reach) {
        if self.mode != MeshMode::Auto || reach == Reach::Unknown {
            return;
        }
        let mut first = false;
        self.decided.entry(revision.clone()).or_insert_with(|| {
            first = true;
            reach
        });
        if first {
            tracing::info!(revision = %revision, ?reach, "mesh-compatibility-mode auto decided");
        }
    }

    /// The private Service's address on the port named `port` (`None`: no such Service or
    /// port, or no cluster IP).
    pub fn service_addr(&self, revision: &RevisionKey, port: &str) -> Option<SocketAddr> {
        let s = self.services.get(revision)?;
        Some(SocketAddr::new(s.ip, *s.ports.get(port)?))
    }

    /// Changes when a private Service's address does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn set(&self, key: RevisionKey, addr: Option<ServiceAddr>) {
        let changed = match addr {
            Some(a) => self.services.insert(key, a.clone()).as_ref() != Some(&a),
            None => {
                self.decided.remove(&key);
                self.services.remove(&key).is_some()
            }
        };
        if changed {
            self.changed.send_modify(|g| *g += 1);
        }
    }
}

fn service_addr(svc: &Service) -> Option<(RevisionKey, Option<ServiceAddr>)> {
    let key = RevisionKey::new(svc.namespace()?, svc.labels().get(labels::REVISION)?);
    let spec = svc.spec.as_ref();
    let ip = spec
        .and_then(|s| s.cluster_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    let addr = ip.map(|ip| ServiceAddr {
        ip,
        ports: spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.port).ok()?)))
            .collect(),
    });
    Some((key, addr))
}

/// The role's mesh mode, read once from `live` config-network, and (unless `disabled`) the
/// private Services followed into it; the receiver says when they have been listed once.
pub fn start(
    client: &kube::Client,
    namespace: Option<&str>,
    live: &crate::config::live::LiveConfig,
    stop: &CancellationToken,
) -> (Arc<Mesh>, watch::Receiver<bool>) {
    let mesh = Mesh::new(live.network.load().mesh_compatibility_mode);
    tracing::info!(mode = mesh.mode().as_str(), "mesh-compatibility-mode");
    let synced = match mesh.mode() {
        MeshMode::Disabled => watch::channel(true).1,
        _ => watch_private_services(client.clone(), namespace, mesh.clone(), stop.clone()),
    };
    (mesh, synced)
}

/// Follows the private Services (label `networking.internal.knative.dev/serviceType=Private`)
/// in `namespace` (all when `None`) into `mesh`. Returns whether they have been listed once.
/// Not needed (and not to be started) under `disabled`.
pub fn watch_private_services(
    client: kube::Client,
    namespace: Option<&str>,
    mesh: Arc<Mesh>,
    stop: CancellationToken,
) -> watch::Receiver<bool> {
    let (synced_tx, synced) = watch::channel(false);
    let api: Api<Service> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let cfg = watcher::Config::default().labels(&format!(
        "{}={},{}",
        labels::SERVICE_TYPE,
        labels::SERVICE_TYPE_PRIVATE,
        labels::REVISION
    ));
    tokio::spawn(
        async move {
            let mut s = std::pin::pin!(watch_stream(api, cfg).default_backoff());
            let mut listing: Option<Vec<RevisionKey>> = None;
            loop {
                let ev = tokio::select! {
                    _ = stop.cancelled() => return,
                    ev = s.next() => ev,
                };
                match ev {
                    None => return,
                    Some(Err(e)) => tracing::warn!(error = %e, "watch error; resuming"),
                    Some(Ok(Event::Init)) => listing = Some(Vec::new()),
                    Some(Ok(Event::InitApply(svc) | Event::Apply(svc))) => {
                        if let Some((key, addr)) = service_addr(&svc) {
                            if let Some(l) = listing.as_mut() {
                                l.push(key.clone());
                            }
                            mesh.set(key, addr);
                        }
                    }
                    Some(Ok(Event::InitDone)) => {
                        // Those not listed again are gone.
                        let kept: std::collections::HashSet<RevisionKey> =
                            listing.take().unwrap_or_default().into_iter().collect();
                        let gone: Vec<RevisionKey> = mesh
                            .services
                            .iter()
                            .filter(|e| !kept.contains(e.key()))
                            .map(|e| e.key().clone())
                            .collect();
                        for key in gone {
                            mesh.set(key, None);
                        }
                        synced_tx.send_replace(true);
                    }
                    Some(Ok(Event::Delete(svc))) => {
                        if let Some((key, _)) = service_addr(&svc) {
                            mesh.set(key, None);
                        }
                    }
                }
            }
        }
        .instrument(tracing::info_span!("watch", resource = "private services")),
    );
    synced
}

/// A revision's snapshot when its pods are reached through the Service at `service`: that
/// one endpoint while any pod is ready (none otherwise: requests are held), limited to
/// `max(1, cc × ready / activators)` (`None` at containerConcurrency 0: unlimited). The pods'
/// terminating endpoints are not the activator's to drain here: the Service is.
pub fn through_service(
    snap: &EndpointSnapshot,
    service: Option<SocketAddr>,
    cc: u32,
    activators: usize,
) -> EndpointSnapshot {
    let ready = match service {
        Some(addr) if !snap.ready.is_empty() => vec![addr],
        _ => Vec::new(),
    };
    EndpointSnapshot {
        limit: (cc > 0).then(|| service_capacity(cc, snap.ready.len(), activators)),
        ready,
        terminating: Vec::new(),
        starting: Vec::new(),
        status: snap.status.clone(),
        reach_pending: false,
        queue_proxy: snap.queue_proxy,
    }
}

/// Knative's capacity of a cluster-IP destination: `max(1, cc × ready / activators)`.
pub fn service_capacity(cc: u32, ready: usize, activators: usize) -> u32 {
    let total = u64::from(cc).saturating_mul(ready as u64) / (activators.max(1) as u64);
    u32::try_from(total).unwrap_or(u32::MAX).max(1)
}

/// What one probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// The queue sidecar answered (200 `queue`).
    Answered,
    /// Another HTTP answer (not 502 or 503): the address speaks plain HTTP to the activator.
    Reachable,
    /// Refused as a mesh refuses plain text: 502 or 503, or the connection closed (or reset)
    /// before any answer.
    MeshRefused,
    /// No answer: a timeout, a refused connection.
    Other,
}

/// The activator's probe client.
pub type ProbeClient = Client<HttpConnector, Empty<Bytes>>;

/// A client for [`probe`]: no kept-alive connections (each probe is one connection).
pub fn probe_client() -> ProbeClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(PROBE_TIMEOUT));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector)
}

/// `GET /` with `K-Network-Probe: queue` at `addr`, as Knative's activator probes a pod.
pub async fn probe(client: &ProbeClient, addr: SocketAddr) -> ProbeResult {
    let req = match Request::get(format!("http://{addr}/"))
        .header(crate::knative::headers::NETWORK_PROBE, "queue")
        .header(http::header::USER_AGENT, PROBE_USER_AGENT)
        .body(Empty::new())
    {
        Ok(r) => r,
        Err(_) => return ProbeResult::Other,
    };
    let answer = async {
        let resp = match client.request(req).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return ProbeResult::Other,
            Err(_) => return ProbeResult::MeshRefused,
        };
        match resp.status() {
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => {
                return ProbeResult::MeshRefused;
            }
            StatusCode::OK => {}
            _ => return ProbeResult::Reachable,
        }
        match Limited::new(resp.into_body(), 64).collect().await {
            Ok(b) => {
                if b.to_bytes() == "queue" {
                    ProbeResult::Answered
                } else {
                    ProbeResult::Reachable
                }
            }
            Err(_) => ProbeResult::Reachable,
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, answer)
        .await
        .unwrap_or(ProbeResult::Other)
}

/// The `auto` decision from probing a pod, then (when the pod refused as a mesh does) the
/// Service: `Pods` when the pod answers anything but 502 or 503 (it speaks plain HTTP to the
/// activator), `Service` when the Service's sidecar answers, or `Unknown` (try again later).
pub async fn detect(client: &ProbeClient, pod: SocketAddr, service: Option<SocketAddr>) -> Reach {
    match probe(client, pod).await {
        ProbeResult::Answered | ProbeResult::Reachable => Reach::Pods,
        ProbeResult::Other => Reach::Unknown,
        ProbeResult::MeshRefused => match service {
            Some(s) if probe(client, s).await == ProbeResult::Answered => Reach::Service,
            _ => Reach::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_knatives_with_a_floor_of_one() {
        assert_eq!(service_capacity(10, 3, 2), 15);
        assert_eq!(service_capacity(1, 1, 3), 1);
        assert_eq!(service_capacity(1, 0, 1), 1);
        assert_eq!(service_capacity(4, 5, 0), 20);
        assert_eq!(service_capacity(u32::MAX, usize::MAX, 1), u32::MAX);
    }

    #[test]
    fn the_service_stands_for_the_ready_pods() {
        let pods: Vec<SocketAddr> = vec![
            "10.0.0.1:8012".parse().unwrap(),
            "10.0.0.2:8012".parse().unwrap(),
        ];
        let svc: SocketAddr = "10.96.0.9:80".parse().unwrap();
        let snap = EndpointSnapshot {
            ready: pods.clone(),
            terminating: vec!["10.0.0.3:8012".parse().unwrap()],
            ..EndpointSnapshot::default()
        };
        let s = through_service(&snap, Some(svc), 10, 4);
        assert_eq!(s.ready, vec![svc]);
        assert!(s.terminating.is_empty());
        assert_eq!(s.limit, Some(5));
        // cc 0: unlimited.
        assert_eq!(through_service(&snap, Some(svc), 0, 4).limit, None);
        // No ready pod, or no Service address: nothing to send to (held).
        let empty = EndpointSnapshot::default();
        assert!(through_service(&empty, Some(svc), 10, 1).ready.is_empty());
        assert!(through_service(&snap, None, 10, 1).ready.is_empty());
    }

    #[test]
    fn auto_decides_once_and_the_fixed_modes_never() {
        let key = RevisionKey::new("ns", "r");
        let auto = Mesh::new(MeshMode::Auto);
        assert_eq!(auto.reach(&key), Reach::Unknown);
        auto.decide(&key, Reach::Unknown);
        assert_eq!(auto.reach(&key), Reach::Unknown);
        auto.decide(&key, Reach::Service);
        auto.decide(&key, Reach::Pods);
        assert_eq!(auto.reach(&key), Reach::Service);
        // A deleted private Service forgets the decision.
        auto.set(key.clone(), None);
        assert_eq!(auto.reach(&key), Reach::Unknown);
        let on = Mesh::new(MeshMode::Enabled);
        on.decide(&key, Reach::Pods);
        assert_eq!(on.reach(&key), Reach::Service);
        assert_eq!(Mesh::new(MeshMode::Disabled).reach(&key), Reach::Pods);
    }

    #[tokio::test]
    async fn probes_tell_a_sidecar_from_a_mesh_refusal() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A sidecar: 200 "queue".
        let sidecar = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sidecar_addr = sidecar.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = sidecar.accept().await {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).await;
                let _ = c
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nqueue")
                    .await;
            }
        });
        // A mesh proxy refusing plain text: closes the connection unanswered.
        let strict = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let strict_addr = strict.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = strict.accept().await {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).await;
            }
        });
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // Another plain-HTTP server: 404.
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_addr = other.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = other.accept().await {
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).await;
                let _ = c
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let c = probe_client();
        assert_eq!(probe(&c, sidecar_addr).await, ProbeResult::Answered);
        assert_eq!(probe(&c, other_addr).await, ProbeResult::Reachable);
        assert_eq!(
            detect(&c, other_addr, Some(sidecar_addr)).await,
            Reach::Pods
        );
        assert_eq!(probe(&c, strict_addr).await, ProbeResult::MeshRefused);
        assert_eq!(probe(&c, closed).await, ProbeResult::Other);
        assert_eq!(detect(&c, sidecar_addr, None).await, Reach::Pods);
        assert_eq!(
            detect(&c, strict_addr, Some(sidecar_addr)).await,
            Reach::Service
        );
        assert_eq!(
            detect(&c, strict_addr, Some(strict_addr)).await,
            Reach::Unknown
        );
        assert_eq!(detect(&c, closed, Some(sidecar_addr)).await, Reach::Unknown);
    }
}
