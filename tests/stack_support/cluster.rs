//! The test playing Kubernetes: the Deployment controller (a Deployment's `spec.replicas`
//! becomes pods; its `status` as the Revision reconciler reads it), the kubelet (each pod's
//! containers run as real processes on the pod's own loopback address, readiness probed as
//! the pod template says, preStop hooks run before SIGTERM) and the endpoints controller
//! (EndpointSlices of every Service with a selector). Each follows the server through a
//! reflector and acts on what it holds every [`TICK`].
//!
//! Images the kubelet can run: Knative's helloworld-go ([`super::HELLOWORLD_IMAGE`], any tag)
//! is `thaw sample-app`, config-deployment's sidecar image ([`super::QUEUE_IMAGE`]) is `thaw`
//! with the container's arguments. Each gets the container's environment exactly as the
//! template writes it (field references resolved, `HOSTNAME` set, as the kubelet does) and
//! only what it takes to bind the pod's address: `--host` for the app; `--listen`,
//! `--admin-listen` and `THAW_USER_HOST` for the sidecar. Any other image fails to pull.
//!
//! Pod deletion: the in-process server deletes a pod at once (its processes then stop behind
//! it), unless the stack runs with graceful deletion ([`KUBELET_FINALIZER`]): then a deleted
//! pod stays terminating, its endpoints too, until its containers have stopped.
//!
//! Each Deployment has one ReplicaSet (no surge), which controls its pods
//! (`kube_support::pod_owner_refs`), as endpoints by ownership require. Not played: liveness
//! and startup probes, resources, volumes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Container, Pod, Probe, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{HELLOWORLD_IMAGE, Net, QUEUE_IMAGE};

/// How often the controllers and the kubelet act on what their reflectors hold.
pub const TICK: Duration = Duration::from_millis(50);
/// The kubelet restarts an exited container at once, then, if it exits again within the
/// back-off's reach, after this (doubling each time: CrashLoopBackOff). The kubelet's is 10 s;
/// short here, like the Lease timings, so a drill that crashes a container is quick.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The back-off's cap; a container that ran twice this long starts over at an immediate
/// restart (the kubelet forgets its back-off then).
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The finalizer the Deployment controller puts on pods when deletion is graceful: the
/// in-process API server deletes a pod at once, Kubernetes keeps it (`deletionTimestamp` set,
/// its endpoints terminating) until the kubelet has stopped its containers; the kubelet
/// removes this finalizer then.
pub const KUBELET_FINALIZER: &str = "stack.thaw.dev/kubelet";
/// The field manager of the endpoints controller's slices (Kubernetes' name).
pub const ENDPOINTSLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";

// ------------------------------------------------------------------------------------------
// Records

/// A `/scale` change the Deployment controller saw: `spec.replicas` of a Deployment.
#[derive(Debug, Clone)]
pub struct ScaleChange {
    pub at: Instant,
    pub namespace: String,
    pub deployment: String,
    pub replicas: i32,
}

/// A change of a revision's public EndpointSlices (the autoscaler's): the addresses they list
/// now (every port, sorted).
#[derive(Debug, Clone)]
pub struct PublicChange {
    pub at: Instant,
    pub namespace: String,
    /// The public Service, named as its revision.
    pub revision: String,
    pub endpoints: Vec<SocketAddr>,
}

/// What the stack saw, in order.
pub struct Records {
    pub t0: Instant,
    scale: Mutex<Vec<ScaleChange>>,
    public: Mutex<Vec<PublicChange>>,
    /// `namespace/pod` -> when the endpoints controller first wrote a slice listing it.
    listed: Mutex<BTreeMap<String, Instant>>,
}

impl Records {
    fn new() -> Self {
        Self {
            t0: Instant::now(),
            scale: Mutex::default(),
            public: Mutex::default(),
            listed: Mutex::default(),
        }
    }

    /// When the endpoints controller first wrote a slice listing pod `namespace/name`.
    pub fn listed(&self, namespace: &str, name: &str) -> Option<Instant> {
        self.listed
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .copied()
    }

    pub fn scale(&self) -> Vec<ScaleChange> {
        self.scale.lock().unwrap().clone()
    }

    /// The replicas `deployment` was set to, in order.
    pub fn scale_of(&self, deployment: &str) -> Vec<i32> {
        self.scale()
            .into_iter()
            .filter(|c| c.deployment == deployment)
            .map(|c| c.replicas)
            .collect()
    }

    pub fn public(&self) -> Vec<PublicChange> {
        self.public.lock().unwrap().clone()
    }

    /// The public endpoints of `revision`, in order of change.
    pub fn public_of(&self, revision: &str) -> Vec<PublicChange> {
        self.public()
            .into_iter()
            .filter(|c| c.revision == revision)
            .collect()
    }

    /// One line per record, times from the stack's start.
    pub fn describe(&self) -> String {
        let mut lines: Vec<(Instant, String)> = Vec::new();
        for c in self.scale() {
            lines.push((
                c.at,
                format!("scale  {}/{} -> {}", c.namespace, c.deployment, c.replicas),
            ));
        }
        for c in self.public() {
            lines.push((
                c.at,
                format!("public {}/{} -> {:?}", c.namespace, c.revision, c.endpoints),
            ));
        }
        lines.sort_by_key(|(at, _)| *at);
        let mut out = String::new();
        for (at, l) in lines {
            let _ = writeln!(out, "{:>8.3}s {l}", (at - self.t0).as_secs_f64());
        }
        out
    }
}

// ------------------------------------------------------------------------------------------
// The cluster

/// The controllers and the kubelet; their tasks end when it is dropped.
pub struct Cluster {
    pub records: Arc<Records>,
    pub kubelet: Kubelet,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A reflector of every `K` in the cluster; `on_apply` sees each object the watch delivers.
fn reflect<K>(
    client: &kube::Client,
    mut on_apply: impl FnMut(&K) + Send + 'static,
) -> (Store<K>, JoinHandle<()>)
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
    let api: Api<K> = Api::all(client.clone());
    let stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(obj) = ev {
                on_apply(&obj);
            }
        }
    });
    (reader, task)
}

impl Cluster {
    /// Starts the Deployment controller, the kubelet (pods' logs under `dir`) and the
    /// endpoints controller, and the public-slice recorder.
    pub fn start(client: kube::Client, net: Net, dir: PathBuf, graceful: bool) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let records = Arc::new(Records::new());
        let mut tasks = Vec::new();
        let mut last_scale: HashMap<(String, String), i32> = HashMap::new();
        let r = records.clone();
        let (deployments, t) = reflect::<Deployment>(&client, move |d| {
            let key = (d.namespace().unwrap_or_default(), d.name_any());
            let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if last_scale.insert(key.clone(), replicas) != Some(replicas) {
                r.scale.lock().unwrap().push(ScaleChange {
                    at: Instant::now(),
                    namespace: key.0,
                    deployment: key.1,
                    replicas,
                });
            }
        });
        tasks.push(t);
        let (pods, t) = reflect::<Pod>(&client, |_| {});
        tasks.push(t);
        let (services, t) = reflect::<Service>(&client, |_| {});
        tasks.push(t);
        tasks.push(tokio::spawn(deployment_controller(
            client.clone(),
            deployments,
            pods.clone(),
            graceful,
        )));
        tasks.push(tokio::spawn(endpoints_controller(
            client.clone(),
            services,
            pods.clone(),
            records.clone(),
        )));
        tasks.push(tokio::spawn(record_public_slices(
            client.clone(),
            records.clone(),
        )));
        let kubelet = Kubelet::new(client, net, dir);
        tasks.push(tokio::spawn(kubelet.clone_inner().run(pods)));
        Self {
            records,
            kubelet,
            tasks,
        }
    }
}

fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A short stable hash (FNV-1a), for names.
fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{:08x}", h as u32)
}

// ------------------------------------------------------------------------------------------
// The Deployment controller

/// Pods for every Deployment's `spec.replicas` (created from its template; on scale-down the
/// not-ready ones go first, then the newest), and its status. `graceful`: pods carry
/// [`KUBELET_FINALIZER`].
async fn deployment_controller(
    client: kube::Client,
    deployments: Store<Deployment>,
    pods: Store<Pod>,
    graceful: bool,
) {
    let finalizers: Vec<&str> = if graceful {
        vec![KUBELET_FINALIZER]
    } else {
        vec![]
    };
    // (namespace, deployment) -> the pods this controller made, oldest first.
    let mut owned: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut statuses: HashMap<(String, String), serde_json::Value> = HashMap::new();
    let mut n: u64 = 0;
    loop {
        tokio::time::sleep(TICK).await;
        let all_pods = pods.state();
        let mut seen = BTreeSet::new();
        for d in deployments.state() {
            let ns = d.namespace().unwrap_or_default();
            let name = d.name_any();
            let key = (ns.clone(), name.clone());
            seen.insert(key.clone());
            let Some(spec) = d.spec.as_ref() else {
                continue;
            };
            let want = spec.replicas.unwrap_or(1).max(0) as usize;
            let podapi: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let mine = owned.entry(key.clone()).or_default();
            let template = serde_json::to_value(&spec.template).unwrap();
            let hash = short_hash(&template.to_string());
            while mine.len() < want {
                n += 1;
                let pod_name = format!("{name}-{hash}-{n:05}");
                let mut labels = spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.labels.clone())
                    .unwrap_or_default();
                labels.insert("pod-template-hash".into(), hash.clone());
                let owners = crate::kube_support::pod_owner_refs(&client, &ns, &name).await;
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": pod_name, "namespace": ns, "labels": labels,
                        "annotations": spec.template.metadata.as_ref().and_then(|m| m.annotations.clone()),
                        "ownerReferences": owners,
                        "finalizers": finalizers,
                    },
                    "spec": template["spec"],
                }))
                .unwrap();
                match podapi.create(&PostParams::default(), &pod).await {
                    Ok(_) => mine.push(pod_name),
                    Err(e) => {
                        eprintln!("deployment controller: creating {pod_name}: {e}");
                        break;
                    }
                }
            }
            while mine.len() > want {
                // Not ready first, then the newest (Kubernetes' order, roughly).
                let i = mine
                    .iter()
                    .rposition(|p| {
                        !all_pods.iter().any(|q| {
                            q.name_any() == *p
                                && q.namespace().as_deref() == Some(&ns)
                                && pod_ready(q)
                        })
                    })
                    .unwrap_or(mine.len() - 1);
                let victim = mine[i].clone();
                match podapi.delete(&victim, &DeleteParams::default()).await {
                    Ok(_) => {
                        mine.remove(i);
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        mine.remove(i);
                    }
                    Err(e) => {
                        eprintln!("deployment controller: deleting {victim}: {e}");
                        break;
                    }
                }
            }
            // The status, as the Deployment controller reports it (no surge: one ReplicaSet).
            let here: Vec<&Arc<Pod>> = all_pods
                .iter()
                .filter(|p| p.namespace().as_deref() == Some(&ns) && mine.contains(&p.name_any()))
                .collect();
            let replicas = mine.len() as i32;
            let ready = here.iter().filter(|p| pod_ready(p)).count() as i32;
            let available = ready >= want as i32;
            let progressing = if ready >= want as i32 && replicas == want as i32 {
                (
                    "NewReplicaSetAvailable",
                    format!("ReplicaSet \"{name}-{hash}\" has successfully progressed."),
                )
            } else {
                (
                    "ReplicaSetUpdated",
                    format!("ReplicaSet \"{name}-{hash}\" is progressing."),
                )
            };
            let status = serde_json::json!({
                "observedGeneration": d.metadata.generation,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "unavailableReplicas": (replicas - ready).max(0),
                "conditions": [
                    {"type": "Available",
                     "status": if available { "True" } else { "False" },
                     "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                     "message": if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }},
                    {"type": "Progressing", "status": "True",
                     "reason": progressing.0, "message": progressing.1},
                ],
            });
            if statuses.get(&key) != Some(&status) {
                let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
                match api
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"status": status})),
                    )
                    .await
                {
                    Ok(_) => {
                        statuses.insert(key, status);
                    }
                    Err(e) => eprintln!("deployment controller: status of {name}: {e}"),
                }
            }
        }
        // A deleted Deployment's pods go with it (the garbage collector's part).
        let gone: Vec<(String, String)> = owned
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            let podapi: Api<Pod> = Api::namespaced(client.clone(), &key.0);
            for p in owned.remove(&key).unwrap_or_default() {
                let _ = podapi.delete(&p, &DeleteParams::default()).await;
            }
            let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), &key.0);
            let rs = crate::kube_support::replica_set_name(&key.1);
            let _ = rss.delete(&rs, &DeleteParams::default()).await;
            statuses.remove(&key);
        }
    }
}

// ------------------------------------------------------------------------------------------
// The endpoints controller

/// A Service port's target on one pod: a number, or the pod's container port of that name.
fn target_port(pod: &Pod, target: Option<&IntOrString>, port: i32) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(p)) => Some(*p),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port),
    }
}

/// The slices of every Service with a selector: its pods with an address, grouped by their
/// resolved ports; the Service's labels copied, `kubernetes.io/service-name` and
/// `endpointslice.kubernetes.io/managed-by` set; a slice with no endpoints and no ports when
/// no pod matches. Written by server-side apply when they change.
async fn endpoints_controller(
    client: kube::Client,
    services: Store<Service>,
    pods: Store<Pod>,
    records: Arc<Records>,
) {
    // (namespace, service) -> slice name -> the body last applied.
    let mut written: BTreeMap<(String, String), BTreeMap<String, serde_json::Value>> =
        BTreeMap::new();
    loop {
        tokio::time::sleep(TICK).await;
        let all_pods = pods.state();
        let mut seen = BTreeSet::new();
        for svc in services.state() {
            let Some(spec) = svc.spec.as_ref() else {
                continue;
            };
            let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
                continue;
            };
            let ns = svc.namespace().unwrap_or_default();
            let name = svc.name_any();
            let key = (ns.clone(), name.clone());
            seen.insert(key.clone());
            // ports -> endpoints
            let mut groups: BTreeMap<String, (serde_json::Value, Vec<serde_json::Value>)> =
                BTreeMap::new();
            for p in &all_pods {
                if p.namespace().as_deref() != Some(&ns) || !matches(selector, p.labels()) {
                    continue;
                }
                let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                    continue;
                };
                let ports: Vec<serde_json::Value> = spec
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|sp| {
                        let port = target_port(p, sp.target_port.as_ref(), sp.port)?;
                        Some(
                            serde_json::json!({"name": sp.name.clone().unwrap_or_default(),
                            "port": port, "protocol": sp.protocol.clone().unwrap_or("TCP".into()),
                            "appProtocol": sp.app_protocol}),
                        )
                    })
                    .collect();
                let ready = pod_ready(p);
                let terminating = p.metadata.deletion_timestamp.is_some();
                let ports = serde_json::Value::Array(ports);
                let g = groups
                    .entry(ports.to_string())
                    .or_insert((ports, Vec::new()));
                g.1.push(serde_json::json!({
                    "addresses": [ip],
                    "conditions": {"ready": ready && !terminating, "serving": ready,
                        "terminating": terminating},
                    "targetRef": {"kind": "Pod", "name": p.name_any(), "namespace": ns,
                        "uid": p.uid()},
                }));
            }
            if groups.is_empty() {
                groups.insert(String::new(), (serde_json::json!([]), Vec::new()));
            }
            let mut labels = svc.labels().clone();
            labels.remove("kubernetes.io/service-name");
            labels.insert("kubernetes.io/service-name".into(), name.clone());
            labels.insert(
                "endpointslice.kubernetes.io/managed-by".into(),
                ENDPOINTSLICE_CONTROLLER.into(),
            );
            let mut want: BTreeMap<String, serde_json::Value> = BTreeMap::new();
            for (ports_key, (ports, mut endpoints)) in groups {
                endpoints
                    .sort_by_key(|e| e["addresses"][0].as_str().unwrap_or_default().to_string());
                let slice_name = format!("{name}-{}", short_hash(&ports_key));
                want.insert(
                    slice_name.clone(),
                    serde_json::json!({
                        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"name": slice_name, "namespace": ns, "labels": labels,
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                "uid": svc.uid().unwrap_or_default(), "controller": true,
                                "blockOwnerDeletion": true}]},
                        "addressType": "IPv4",
                        "ports": ports,
                        "endpoints": endpoints,
                    }),
                );
            }
            let had = written.entry(key).or_default();
            let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
            for (slice_name, body) in &want {
                if had.get(slice_name) == Some(body) {
                    continue;
                }
                let pp = PatchParams::apply(ENDPOINTSLICE_CONTROLLER).force();
                match api.patch(slice_name, &pp, &Patch::Apply(body)).await {
                    Ok(_) => {
                        let now = Instant::now();
                        let mut listed = records.listed.lock().unwrap();
                        for e in body["endpoints"].as_array().into_iter().flatten() {
                            if let Some(pod) = e["targetRef"]["name"].as_str() {
                                listed.entry(format!("{ns}/{pod}")).or_insert(now);
                            }
                        }
                        drop(listed);
                        had.insert(slice_name.clone(), body.clone());
                    }
                    Err(e) => eprintln!("endpoints controller: {slice_name}: {e}"),
                }
            }
            let stale: Vec<String> = had
                .keys()
                .filter(|k| !want.contains_key(*k))
                .cloned()
                .collect();
            for s in stale {
                if api.delete(&s, &DeleteParams::default()).await.is_ok() {
                    had.remove(&s);
                }
            }
        }
        let gone: Vec<(String, String)> = written
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &key.0);
            for s in written.remove(&key).unwrap_or_default().into_keys() {
                let _ = api.delete(&s, &DeleteParams::default()).await;
            }
        }
    }
}

/// The ready addresses of a Service's slices on the port named `port`, sorted.
pub async fn service_endpoints(
    client: &kube::Client,
    ns: &str,
    service: &str,
    port: &str,
) -> Vec<SocketAddr> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let lp =
        kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut out = BTreeSet::new();
    for s in api.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        out.extend(slice_addresses(&s, Some(port)));
    }
    out.into_iter().collect()
}

/// A slice's ready endpoints on the port named `port` (every port when `None`).
pub fn slice_addresses(s: &EndpointSlice, port: Option<&str>) -> Vec<SocketAddr> {
    let ports: Vec<u16> = s
        .ports
        .iter()
        .flatten()
        .filter(|p| port.is_none() || p.name.as_deref() == port)
        .filter_map(|p| u16::try_from(p.port?).ok())
        .collect();
    let mut out = Vec::new();
    for e in &s.endpoints {
        let c = e.conditions.as_ref();
        if !c.and_then(|c| c.ready).unwrap_or(true) {
            continue;
        }
        for a in &e.addresses {
            if let Ok(ip) = a.parse::<IpAddr>() {
                out.extend(ports.iter().map(|p| SocketAddr::new(ip, *p)));
            }
        }
    }
    out
}

/// (namespace, slice) -> (its Service, its addresses).
type SliceMap = BTreeMap<(String, String), (String, Vec<SocketAddr>)>;

/// Every change of the autoscaler's public slices, per revision.
async fn record_public_slices(client: kube::Client, records: Arc<Records>) {
    let api: Api<EndpointSlice> = Api::all(client);
    let cfg = watcher::Config::default()
        .labels("endpointslice.kubernetes.io/managed-by=autoscaler.thaw.dev");
    let stream = watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut slices: SliceMap = BTreeMap::new();
    let mut last: BTreeMap<(String, String), Vec<SocketAddr>> = BTreeMap::new();
    let mut init: Option<SliceMap> = None;
    while let Some(ev) = stream.next().await {
        let Ok(ev) = ev else { continue };
        let entry = |s: &EndpointSlice| {
            let ns = s.namespace().unwrap_or_default();
            let svc = s
                .labels()
                .get("kubernetes.io/service-name")
                .cloned()
                .unwrap_or_default();
            let mut addrs = slice_addresses(s, None);
            addrs.sort();
            ((ns, s.name_any()), (svc, addrs))
        };
        match ev {
            watcher::Event::Apply(s) => {
                let (k, v) = entry(&s);
                slices.insert(k, v);
            }
            watcher::Event::Delete(s) => {
                slices.remove(&entry(&s).0);
            }
            watcher::Event::Init => init = Some(BTreeMap::new()),
            watcher::Event::InitApply(s) => {
                let (k, v) = entry(&s);
                init.get_or_insert_with(BTreeMap::new).insert(k, v);
            }
            watcher::Event::InitDone => slices = init.take().unwrap_or_default(),
        }
        // Per (namespace, service): the union of its slices.
        let mut now: BTreeMap<(String, String), BTreeSet<SocketAddr>> = BTreeMap::new();
        for ((ns, _), (svc, addrs)) in &slices {
            now.entry((ns.clone(), svc.clone()))
                .or_default()
                .extend(addrs.iter().copied());
        }
        let keys: BTreeSet<(String, String)> = now.keys().chain(last.keys()).cloned().collect();
        for k in keys {
            let addrs: Vec<SocketAddr> = now
                .get(&k)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            if last.get(&k) != Some(&addrs) {
                last.insert(k.clone(), addrs.clone());
                records.public.lock().unwrap().push(PublicChange {
                    at: Instant::now(),
                    namespace: k.0,
                    revision: k.1,
                    endpoints: addrs,
                });
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// The kubelet

/// A pod whose process the test runs itself (a role): the kubelet writes its Pod object and
/// status and probes its readiness, so Services select it like any pod.
#[derive(Debug, Clone)]
pub struct AdoptedPod {
    pub namespace: String,
    pub name: String,
    pub ip: Ipv4Addr,
    pub labels: BTreeMap<String, String>,
    /// Named container ports.
    pub ports: Vec<(String, u16)>,
    /// The readiness probe: `httpGet` on the named port, this path.
    pub readiness: (String, String),
}

/// When the kubelet lets a pod it runs (not an adopted one) turn Ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadyGate {
    /// As its containers' readiness probes say, each at its probe's period (a kubelet).
    #[default]
    Probes,
    /// This long after its containers' readiness probes first all passed (watched every
    /// [`ANSWER_POLL`], so [`PodTimes::first_answer`] is when the sidecar first answered).
    After(Duration),
    /// Never while the gate holds: the test keeps new pods not ready.
    Held,
}

/// How often a gated pod's readiness probes are tried until they first all pass.
pub const ANSWER_POLL: Duration = Duration::from_millis(2);

/// A pod's start and readiness as the kubelet saw them.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodTimes {
    /// Its first container was started.
    pub started: Option<Instant>,
    /// Its readiness probes first all passed (recorded under a [`ReadyGate`] other than
    /// `Probes` only).
    pub first_answer: Option<Instant>,
    /// Its Ready condition was first written True.
    pub ready: Option<Instant>,
}

/// One container process, shared by its pod's task and the kubelet (which kills every one
/// when dropped).
type Proc = Arc<Mutex<Option<Child>>>;

struct KubeletInner {
    client: kube::Client,
    net: Net,
    dir: PathBuf,
    next_ip: AtomicU32,
    /// (namespace, pod) -> its task's stop token, for pods the kubelet runs or adopted.
    pods: Mutex<BTreeMap<(String, String), PodHandle>>,
    /// Every process ever started (killed on drop).
    /// (`namespace/pod/container`, process).
    procs: Mutex<Vec<(String, Proc)>>,
    /// (namespace, pod, container) -> its log file.
    logs: Mutex<Vec<(String, PathBuf)>>,
    /// Every pod's task (aborted on drop).
    tasks: Mutex<Vec<JoinHandle<()>>>,
    gate: Mutex<ReadyGate>,
    /// `namespace/pod` -> its times.
    times: Mutex<BTreeMap<String, PodTimes>>,
}

struct PodHandle {
    stop: CancellationToken,
    adopted: bool,
}

/// The kubelet of the one node.
pub struct Kubelet {
    inner: Arc<KubeletInner>,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for t in self.inner.tasks.lock().unwrap().iter() {
            t.abort();
        }
        for (_, p) in self.inner.procs.lock().unwrap().iter() {
            if let Some(mut c) = p.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

struct KubeletRun(Arc<KubeletInner>);

impl Kubelet {
    fn new(client: kube::Client, net: Net, dir: PathBuf) -> Self {
        Self {
            inner: Arc::new(KubeletInner {
                client,
                net,
                dir,
                next_ip: AtomicU32::new(0),
                pods: Mutex::default(),
                procs: Mutex::default(),
                logs: Mutex::default(),
                tasks: Mutex::default(),
                gate: Mutex::default(),
                times: Mutex::default(),
            }),
        }
    }

    fn clone_inner(&self) -> KubeletRun {
        KubeletRun(self.inner.clone())
    }

    /// Writes `pod`'s object and keeps its Ready condition following its readiness probe.
    pub async fn adopt(&self, pod: AdoptedPod) {
        let k = &self.inner;
        let api: Api<Pod> = Api::namespaced(k.client.clone(), &pod.namespace);
        let obj: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": pod.labels},
            "spec": {"containers": [{"name": "main", "image": "thaw",
                "ports": pod.ports.iter().map(|(n, p)| serde_json::json!({"name": n, "containerPort": p})).collect::<Vec<_>>(),
                // deploy/activator/deployment.yaml's probe.
                "readinessProbe": {"httpGet": {"path": pod.readiness.1, "port": pod.readiness.0},
                    "periodSeconds": 2, "failureThreshold": 2}}]},
        }))
        .unwrap();
        // The handle first: the kubelet's loop must never take this pod for one it runs.
        let stop = CancellationToken::new();
        k.pods.lock().unwrap().insert(
            (pod.namespace.clone(), pod.name.clone()),
            PodHandle {
                stop: stop.clone(),
                adopted: true,
            },
        );
        let created = api.create(&PostParams::default(), &obj).await.unwrap();
        let task = tokio::spawn(run_pod(
            k.clone(),
            created,
            IpAddr::V4(pod.ip),
            Vec::new(),
            stop,
        ));
        k.tasks.lock().unwrap().push(task);
    }

    /// Sets when pods the kubelet runs may turn Ready (pods already Ready stay so).
    pub fn set_gate(&self, gate: ReadyGate) {
        *self.inner.gate.lock().unwrap() = gate;
    }

    /// The times of pod `namespace/name`, if the kubelet ran it.
    pub fn times(&self, namespace: &str, name: &str) -> Option<PodTimes> {
        self.inner
            .times
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .copied()
    }

    /// Every container's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (name, path) in self.inner.logs.lock().unwrap().iter() {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let _ = writeln!(out, "===== {name} =====\n{text}");
        }
        out
    }

    /// Sends `sig` to the running process of `container` in pod `namespace/pod` (a container
    /// that exits is restarted with back-off, as the kubelet does); whether one ran.
    pub fn signal(&self, pod: &str, container: &str, sig: nix::sys::signal::Signal) -> bool {
        let key = format!("{pod}/{container}");
        let procs = self.inner.procs.lock().unwrap();
        let mut sent = false;
        for (_, p) in procs.iter().filter(|(k, _)| *k == key) {
            if let Some(ch) = p.lock().unwrap().as_mut()
                && matches!(ch.try_wait(), Ok(None))
            {
                sent |=
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(ch.id() as i32), sig).is_ok();
            }
        }
        sent
    }

    /// The pods the kubelet runs now (not adopted ones), `namespace/name`.
    pub fn running(&self) -> Vec<String> {
        self.inner
            .pods
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, h)| !h.adopted && !h.stop.is_cancelled())
            .map(|((ns, n), _)| format!("{ns}/{n}"))
            .collect()
    }
}

impl KubeletRun {
    /// Starts the pods that appear (not being deleted), stops the ones that go.
    async fn run(self, pods: Store<Pod>) {
        let k = self.0;
        loop {
            tokio::time::sleep(TICK).await;
            let all = pods.state();
            let mut present = BTreeSet::new();
            for p in &all {
                let key = (p.namespace().unwrap_or_default(), p.name_any());
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                present.insert(key.clone());
                if k.pods.lock().unwrap().contains_key(&key) {
                    continue;
                }
                let n = k.next_ip.fetch_add(1, Ordering::SeqCst) + 1;
                let ip = IpAddr::V4(k.net.pod(n));
                let stop = CancellationToken::new();
                k.pods.lock().unwrap().insert(
                    key.clone(),
                    PodHandle {
                        stop: stop.clone(),
                        adopted: false,
                    },
                );
                let containers = p
                    .spec
                    .as_ref()
                    .map(|s| s.containers.clone())
                    .unwrap_or_default();
                let task = tokio::spawn(run_pod(k.clone(), (**p).clone(), ip, containers, stop));
                k.tasks.lock().unwrap().push(task);
            }
            let mut handles = k.pods.lock().unwrap();
            handles.retain(|key, h| {
                let keep = h.adopted || present.contains(key);
                if !keep {
                    h.stop.cancel();
                }
                keep
            });
        }
    }
}

/// What the kubelet knows of one container.
struct Running {
    spec: Container,
    proc: Option<Proc>,
    ready: bool,
    successes: i32,
    failures: i32,
    next_probe: Instant,
    restarts: i32,
    /// Exits in a row within the back-off's reach.
    streak: u32,
    started: Option<Instant>,
    restart_at: Option<Instant>,
    last_exit: Option<(i32, String)>,
    /// How it ended while the pod terminated.
    terminated: Option<(i32, String)>,
    waiting: Option<(String, String)>,
    started_at: Option<String>,
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(now)
        .unwrap()
        .to_string()
}

/// The value of a field reference, as the kubelet resolves it.
fn field_ref(pod: &Pod, ip: IpAddr, path: &str) -> Option<String> {
    Some(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace()?,
        "metadata.uid" => pod.uid()?,
        "status.podIP" => ip.to_string(),
        "status.hostIP" => "127.0.0.1".into(),
        "spec.nodeName" => "stack-node".into(),
        "spec.serviceAccountName" => "default".into(),
        _ => {
            let label = path.strip_prefix("metadata.labels['")?.strip_suffix("']")?;
            pod.labels().get(label)?.clone()
        }
    })
}

/// The command for `c`'s image in `pod` at `ip`, with the container's environment; `Err` is
/// the kubelet's waiting reason and message.
fn command(pod: &Pod, ip: IpAddr, c: &Container) -> Result<Command, (String, String)> {
    let image = c.image.clone().unwrap_or_default();
    let mut env: Vec<(String, String)> = vec![("HOSTNAME".into(), pod.name_any())];
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let Some(f) = from.field_ref.as_ref() else {
                    return Err((
                        "CreateContainerConfigError".into(),
                        format!("env {}: only fieldRef is played", e.name),
                    ));
                };
                field_ref(pod, ip, &f.field_path).ok_or_else(|| {
                    (
                        "CreateContainerConfigError".into(),
                        format!("env {}: unknown field {}", e.name, f.field_path),
                    )
                })?
            }
            (None, None) => String::new(),
        };
        env.push((e.name.clone(), value));
    }
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_thaw"));
    if image == HELLOWORLD_IMAGE
        || image.starts_with(&format!("{HELLOWORLD_IMAGE}:"))
        || image.starts_with(&format!("{HELLOWORLD_IMAGE}@"))
    {
        cmd.args(["sample-app", "--host", &ip.to_string()]);
    } else if image == QUEUE_IMAGE {
        let data = var("QUEUE_SERVING_PORT").unwrap_or_else(|| "8012".into());
        let admin = var("THAW_QUEUE_ADMIN_PORT").unwrap_or_else(|| "9091".into());
        cmd.args(c.args.iter().flatten());
        cmd.args([
            format!("--listen={ip}:{data}"),
            format!("--admin-listen={ip}:{admin}"),
        ]);
        env.push(("THAW_USER_HOST".into(), ip.to_string()));
    } else {
        return Err((
            "ErrImagePull".into(),
            format!("the stack cannot run image {image:?}"),
        ));
    }
    cmd.env_clear().envs(env).stdin(Stdio::null());
    Ok(cmd)
}

/// Whether `probe` on the pod at `ip` passes now.
async fn probe(probe: &Probe, ip: IpAddr, c: &Container) -> bool {
    let port_of = |p: &IntOrString| -> Option<u16> {
        match p {
            IntOrString::Int(n) => u16::try_from(*n).ok(),
            IntOrString::String(name) => c
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name.as_str()))
                .and_then(|cp| u16::try_from(cp.container_port).ok()),
        }
    };
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let attempt = async {
        if let Some(h) = &probe.http_get {
            let Some(port) = port_of(&h.port) else {
                return false;
            };
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_max_idle_per_host(0)
                    .build_http();
            let mut req = http::Request::get(format!("http://{}{path}", SocketAddr::new(ip, port)))
                .header("user-agent", "kube-probe/1.33");
            for hh in h.http_headers.iter().flatten() {
                req = req.header(hh.name.as_str(), hh.value.as_str());
            }
            let Ok(req) = req.body(http_body_util::Empty::new()) else {
                return false;
            };
            return client
                .request(req)
                .await
                .is_ok_and(|r| (200..400).contains(&r.status().as_u16()));
        }
        if let Some(t) = &probe.tcp_socket {
            let Some(port) = port_of(&t.port) else {
                return false;
            };
            return tokio::net::TcpStream::connect(SocketAddr::new(ip, port))
                .await
                .is_ok();
        }
        true
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or(false)
}

/// Runs one pod until `stop`: starts its containers (restarting exited ones with back-off),
/// probes their readiness, writes the pod's status when it changes; on `stop`, each
/// container's preStop hook then SIGTERM, SIGKILL after the grace period. An adopted pod
/// (`containers` empty) is only probed.
async fn run_pod(
    k: Arc<KubeletInner>,
    pod: Pod,
    ip: IpAddr,
    containers: Vec<Container>,
    stop: CancellationToken,
) {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(k.client.clone(), &ns);
    let adopted = containers.is_empty();
    let specs = if adopted {
        pod.spec
            .as_ref()
            .map(|s| s.containers.clone())
            .unwrap_or_default()
    } else {
        containers
    };
    let start = |c: &Container| -> Result<Proc, (String, String)> {
        let mut cmd = command(&pod, ip, c)?;
        let log = k.dir.join(format!("{ns}_{name}_{}.log", c.name));
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        {
            use std::io::Write;
            let _ = writeln!(file, "----- {cmd:?} -----");
        }
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        let child = cmd
            .spawn()
            .map_err(|e| ("RunContainerError".to_string(), e.to_string()))?;
        let p: Proc = Arc::new(Mutex::new(Some(child)));
        k.procs
            .lock()
            .unwrap()
            .push((format!("{ns}/{name}/{}", c.name), p.clone()));
        let mut logs = k.logs.lock().unwrap();
        let entry = (format!("{ns}/{name}/{}", c.name), log);
        if !logs.contains(&entry) {
            logs.push(entry);
        }
        Ok(p)
    };
    let now = Instant::now();
    let mut cs: Vec<Running> = specs
        .into_iter()
        .map(|spec| Running {
            spec,
            proc: None,
            ready: false,
            successes: 0,
            failures: 0,
            next_probe: now,
            restarts: 0,
            streak: 0,
            started: None,
            restart_at: (!adopted).then_some(now),
            last_exit: None,
            terminated: None,
            waiting: None,
            started_at: adopted.then(now_rfc3339),
        })
        .collect();
    let pod_started = now_rfc3339();
    let mut written: Option<serde_json::Value> = None;
    let grace = Duration::from_secs(
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0) as u64,
    );
    let mut terminating: Option<JoinHandle<()>> = None;
    let times_key = format!("{ns}/{name}");
    // Under a gate, a task watching for the readiness probes' first pass.
    let mut answer_watch: Option<JoinHandle<()>> = None;
    loop {
        // Start (or restart) what is due.
        for c in cs.iter_mut() {
            if c.restart_at.is_some_and(|at| at <= Instant::now()) {
                c.restart_at = None;
                match start(&c.spec) {
                    Ok(p) => {
                        c.proc = Some(p);
                        k.times
                            .lock()
                            .unwrap()
                            .entry(times_key.clone())
                            .or_default()
                            .started
                            .get_or_insert_with(Instant::now);
                        c.waiting = None;
                        c.started_at = Some(now_rfc3339());
                        c.started = Some(Instant::now());
                        c.next_probe = Instant::now()
                            + Duration::from_secs(
                                c.spec
                                    .readiness_probe
                                    .as_ref()
                                    .and_then(|p| p.initial_delay_seconds)
                                    .unwrap_or(0)
                                    .max(0) as u64,
                            );
                        c.successes = 0;
                        c.failures = 0;
                    }
                    Err(w) => {
                        c.waiting = Some(w);
                        c.streak += 1;
                        c.restart_at =
                            Some(Instant::now() + backoff(c.streak).max(RESTART_BACKOFF));
                    }
                }
            }
        }
        // Exits.
        for c in cs.iter_mut() {
            let Some(p) = c.proc.clone() else { continue };
            let exited = p.lock().unwrap().as_mut().map(Child::try_wait);
            let st = match exited {
                Some(Ok(Some(st))) => st,
                // Killed with the kubelet.
                None => {
                    c.proc = None;
                    continue;
                }
                Some(_) => continue,
            };
            p.lock().unwrap().take();
            c.proc = None;
            c.ready = false;
            let code = st.code().unwrap_or(128 + st.signal().unwrap_or(9));
            let reason = if code == 0 { "Completed" } else { "Error" };
            if terminating.is_some() {
                c.terminated = Some((code, reason.into()));
                continue;
            }
            c.last_exit = Some((code, reason.into()));
            c.restarts += 1;
            if c.started
                .is_some_and(|t| t.elapsed() >= RESTART_BACKOFF_MAX * 2)
            {
                c.streak = 0;
            }
            c.streak += 1;
            let delay = backoff(c.streak);
            c.waiting = (!delay.is_zero()).then(|| {
                (
                    "CrashLoopBackOff".into(),
                    format!(
                        "back-off {delay:?} restarting failed container {}",
                        c.spec.name
                    ),
                )
            });
            c.restart_at = Some(Instant::now() + delay);
        }
        // Readiness.
        let due: Vec<usize> = cs
            .iter()
            .enumerate()
            .filter(|(_, c)| (c.proc.is_some() || adopted) && c.next_probe <= Instant::now())
            .map(|(i, _)| i)
            .collect();
        let results = futures::future::join_all(due.iter().map(|&i| {
            let c = &cs[i];
            let spec = c.spec.clone();
            async move {
                match &spec.readiness_probe {
                    Some(p) => probe(p, ip, &spec).await,
                    None => true,
                }
            }
        }))
        .await;
        for (&i, ok) in due.iter().zip(results) {
            let c = &mut cs[i];
            let p = c.spec.readiness_probe.clone().unwrap_or_default();
            c.next_probe =
                Instant::now() + Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
            if ok {
                c.successes += 1;
                c.failures = 0;
                if c.successes >= p.success_threshold.unwrap_or(1) {
                    c.ready = true;
                }
            } else {
                c.failures += 1;
                c.successes = 0;
                if c.failures >= p.failure_threshold.unwrap_or(3) {
                    c.ready = false;
                }
            }
            if c.proc.is_none() && !adopted {
                c.ready = false;
            }
        }
        // Status.
        let gate = *k.gate.lock().unwrap();
        if gate != ReadyGate::Probes && !adopted && answer_watch.is_none() {
            let specs: Vec<Container> = cs.iter().map(|c| c.spec.clone()).collect();
            let (k, key) = (k.clone(), times_key.clone());
            answer_watch = Some(tokio::spawn(async move {
                loop {
                    let all = futures::future::join_all(specs.iter().map(|c| async move {
                        match &c.readiness_probe {
                            Some(p) => probe(p, ip, c).await,
                            None => true,
                        }
                    }))
                    .await;
                    if all.iter().all(|ok| *ok) {
                        let now = Instant::now();
                        let mut times = k.times.lock().unwrap();
                        times
                            .entry(key)
                            .or_default()
                            .first_answer
                            .get_or_insert(now);
                        return;
                    }
                    tokio::time::sleep(ANSWER_POLL).await;
                }
            }));
        }
        let first_answer = k
            .times
            .lock()
            .unwrap()
            .get(&times_key)
            .and_then(|t| t.first_answer);
        let gate_open = adopted
            || match gate {
                ReadyGate::Probes => true,
                ReadyGate::After(d) => first_answer.is_some_and(|t| t.elapsed() >= d),
                ReadyGate::Held => false,
            };
        let all_ready = cs.iter().all(|c| c.ready) && (gate_open || written_ready(&written));
        let cond = |t: &str, ok: bool| serde_json::json!({"type": t, "status": if ok { "True" } else { "False" }});
        let statuses: Vec<serde_json::Value> = cs
            .iter()
            .map(|c| {
                let state = match (&c.proc, &c.waiting) {
                    (Some(_), _) => serde_json::json!({"running": {"startedAt": c.started_at}}),
                    (None, _) if c.terminated.is_some() => {
                        let (code, reason) = c.terminated.clone().unwrap_or_default();
                        serde_json::json!({"terminated": {"exitCode": code, "reason": reason}})
                    }
                    (None, Some((reason, message))) => {
                        serde_json::json!({"waiting": {"reason": reason, "message": message}})
                    }
                    (None, None) if adopted => {
                        serde_json::json!({"running": {"startedAt": c.started_at}})
                    }
                    (None, None) => serde_json::json!({"waiting": {"reason": "ContainerCreating"}}),
                };
                let mut s = serde_json::json!({"name": c.spec.name, "image": c.spec.image,
                    "imageID": "", "ready": c.ready, "started": c.proc.is_some() || adopted,
                    "restartCount": c.restarts, "state": state});
                if let Some((code, reason)) = &c.last_exit {
                    s["lastState"] =
                        serde_json::json!({"terminated": {"exitCode": code, "reason": reason}});
                }
                s
            })
            .collect();
        let status = serde_json::json!({
            "phase": "Running",
            "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}], "hostIP": "127.0.0.1",
            "startTime": pod_started,
            "conditions": [cond("PodScheduled", true), cond("Initialized", true),
                cond("ContainersReady", all_ready), cond("Ready", all_ready)],
            "containerStatuses": statuses,
        });
        if written.as_ref() != Some(&status) {
            match api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"status": status})),
                )
                .await
            {
                Ok(_) => {
                    if all_ready {
                        let now = Instant::now();
                        let mut times = k.times.lock().unwrap();
                        times
                            .entry(times_key.clone())
                            .or_default()
                            .ready
                            .get_or_insert(now);
                    }
                    written = Some(status)
                }
                // Gone (deleted at once): nothing to report to.
                Err(kube::Error::Api(e)) if e.code == 404 => written = Some(status),
                Err(e) => eprintln!("kubelet: status of {ns}/{name}: {e}"),
            }
        }
        if let Some(t) = &terminating
            && t.is_finished()
        {
            break;
        }
        tokio::select! {
            () = stop.cancelled(), if terminating.is_none() => {
                if adopted {
                    return;
                }
                // Termination: the pod's status keeps following its containers meanwhile.
                let procs = cs
                    .iter()
                    .filter_map(|c| Some((c.spec.clone(), c.proc.clone()?)))
                    .collect();
                for c in cs.iter_mut() {
                    c.restart_at = None;
                }
                terminating = Some(tokio::spawn(terminate(procs, ip, grace)));
            }
            () = tokio::time::sleep(TICK) => {}
        }
    }
    if let Some(w) = answer_watch {
        w.abort();
    }
    // The pod goes once its containers have stopped (the finalizer stands in for the API
    // server's graceful deletion).
    let _ = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
}

/// Whether the pod status last written says Ready (a gate holds only pods not Ready yet).
fn written_ready(written: &Option<serde_json::Value>) -> bool {
    written.as_ref().is_some_and(|s| {
        s["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
}

/// Every container at once: its preStop hook (HTTP), then SIGTERM, SIGKILL at the end of the
/// grace period.
async fn terminate(procs: Vec<(Container, Proc)>, ip: IpAddr, grace: Duration) {
    let deadline = Instant::now() + grace;
    futures::future::join_all(procs.into_iter().map(|(spec, p)| async move {
        let hook = spec
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.clone())
            .and_then(|h| h.http_get);
        if let Some(h) = hook {
            let probe = Probe {
                http_get: Some(h),
                timeout_seconds: Some(grace.as_secs().max(1) as i32),
                ..Probe::default()
            };
            let _ = tokio::time::timeout_at(deadline, self::probe(&probe, ip, &spec)).await;
        }
        if let Some(ch) = p.lock().unwrap().as_ref() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(ch.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        loop {
            {
                let mut guard = p.lock().unwrap();
                // The exit status stays in the Child (std keeps it once reaped): the pod's
                // loop reports it.
                match guard.as_mut().map(Child::try_wait) {
                    None | Some(Ok(Some(_))) | Some(Err(_)) => return,
                    Some(Ok(None)) if Instant::now() >= deadline => {
                        if let Some(ch) = guard.as_mut() {
                            let _ = ch.kill();
                            let _ = ch.wait();
                        }
                        return;
                    }
                    Some(Ok(None)) => {}
                }
            }
            tokio::time::sleep(TICK).await;
        }
    }))
    .await;
}

/// The wait before the restart after the `streak`-th exit in a row: none after the first.
fn backoff(streak: u32) -> Duration {
    if streak <= 1 {
        return Duration::ZERO;
    }
    (RESTART_BACKOFF * 2u32.pow((streak - 2).min(8))).min(RESTART_BACKOFF_MAX)
}
