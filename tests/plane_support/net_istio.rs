//! net-istio's part of a Knative install, played by the tests: knative.dev/net-istio cannot be
//! fetched (the Go module proxy answers 403 for every version), so this stands in for it,
//! written from what net-istio v0.42 (Knative 1.15) installs and writes:
//!
//! - its release's config-istio (the plane's gateway Services, which are also net-istio's
//!   defaults: `istio-ingressgateway` and `knative-local-gateway` in istio-system) and its two
//!   Gateways in knative-serving ([`install`]);
//! - its KIngress reconciler ([`reconcile`]): for each KIngress of class
//!   `istio.ingress.networking.knative.dev`, knative.dev/networking's generated reconciler's
//!   finalizer ([`FINALIZER`]; net-istio finalizes KIngresses), the probe paths
//!   `ingress.InsertProbe` puts first (a copy of each path matching `K-Network-Hash: override`
//!   and setting the KIngress's hash), then the VirtualServices `{ingress}-ingress` (the
//!   external and local gateways, every host expanded to its cluster short names) and
//!   `{ingress}-mesh` (gateway `mesh`, the cluster-local hosts), each owned by the KIngress
//!   (controller) and labelled as net-istio labels them, one route per path: a match per
//!   distinct host prefix (authority prefix, the path's header matches, the rule's gateways),
//!   the splits' destinations `{service}.{namespace}.svc.cluster.local:{port}` with their
//!   weights and headers, the path's headers and host rewrite, and no retries; then the
//!   status: NetworkConfigured, and LoadBalancerReady once every pod of the gateways its rules
//!   use answers the probe with the hash (`GET /healthz`, `K-Network-Probe: probe`, as
//!   knative.dev/networking's prober sends it), with the public and private load balancers
//!   config-istio names.
//!
//! Where it differs: the hash is the SHA-256 of the spec as the API returns it (keys sorted)
//! and the KIngress's namespace and name, not of Go's encoding of the struct (the value only
//! has to change when the spec does); the VirtualServices are `networking.istio.io/v1` (the
//! plane's Istio CRD serves v1 only; net-istio writes v1beta1, the same schema); "no retries"
//! is written `retries: {attempts: 0}` where net-istio's proto encoding omits the zero
//! (`retries: {}`), because thaw's VirtualService type, which the plane's gateway reads,
//! requires the field. It runs in the test process with the plane's admin client.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::Plane;

/// The KIngress class net-istio reconciles.
pub const INGRESS_CLASS: &str = "istio.ingress.networking.knative.dev";
/// The annotation naming a KIngress's class.
pub const CLASS_ANNOTATION: &str = "networking.knative.dev/ingress.class";
/// The finalizer of knative.dev/networking's generated KIngress reconciler (its default name,
/// which net-istio keeps).
pub const FINALIZER: &str = "ingresses.networking.internal.knative.dev";
/// The label naming a VirtualService's KIngress.
pub const INGRESS_LABEL: &str = "networking.internal.knative.dev/ingress";
const ROUTE_LABEL: &str = "serving.knative.dev/route";
const ROUTE_NAMESPACE_LABEL: &str = "serving.knative.dev/routeNamespace";
const HASH_HEADER: &str = "K-Network-Hash";
const PROBE_HEADER: &str = "K-Network-Probe";
const CLUSTER_DOMAIN: &str = "cluster.local";
/// How often every KIngress is looked at again (probes not yet answered are retried).
const RESYNC: Duration = Duration::from_secs(1);

/// net-istio's release objects: config-istio and the two Gateways.
const RELEASE: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: config-istio
  namespace: knative-serving
  labels:
    app.kubernetes.io/component: net-istio
    app.kubernetes.io/name: knative-serving
    networking.knative.dev/ingress-provider: istio
data:
  gateway.knative-serving.knative-ingress-gateway: "istio-ingressgateway.istio-system.svc.cluster.local"
  local-gateway.knative-serving.knative-local-gateway: "knative-local-gateway.istio-system.svc.cluster.local"
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: knative-ingress-gateway
  namespace: knative-serving
  labels:
    app.kubernetes.io/component: net-istio
    app.kubernetes.io/name: knative-serving
    networking.knative.dev/ingress-provider: istio
spec:
  selector:
    istio: ingressgateway
  servers:
    - port:
        number: 80
        name: http
        protocol: HTTP
      hosts:
        - "*"
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: knative-local-gateway
  namespace: knative-serving
  labels:
    app.kubernetes.io/component: net-istio
    app.kubernetes.io/name: knative-serving
    networking.knative.dev/ingress-provider: istio
spec:
  selector:
    istio: ingressgateway
  servers:
    - port:
        number: 8081
        name: http
        protocol: HTTP
      hosts:
        - "*"
"#;

/// The reconciler's task; it stops when this is dropped.
pub struct NetIstio {
    task: tokio::task::JoinHandle<()>,
}

impl NetIstio {
    /// Stops the reconciler, as deleting net-istio's controller Deployment does: nothing
    /// reconciles KIngresses afterwards; what it wrote stays.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for NetIstio {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Applies net-istio's release objects (knative-serving must exist) and starts the
/// reconciler with the plane's admin client.
pub async fn install(plane: &Plane) -> Result<NetIstio, String> {
    let path = plane.dir.path().join("net-istio.yaml");
    std::fs::write(&path, RELEASE).map_err(|e| e.to_string())?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--field-manager=net-istio-release",
            "-f",
            &path.display().to_string(),
        ])
        .await?;
    Ok(NetIstio {
        task: tokio::spawn(run(plane.admin.clone())),
    })
}

fn ingress_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.internal.knative.dev", "v1alpha1", "Ingress"),
        "ingresses",
    )
}

fn virtual_service_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
        "virtualservices",
    )
}

/// Reconciles every KIngress whenever one changes, and every [`RESYNC`]; errors are logged
/// and retried at the next pass.
async fn run(client: kube::Client) {
    let ar = ingress_resource();
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let changes = watcher(all.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(changes);
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    loop {
        tokio::select! {
            _ = changes.next() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        let gateways = match Gateways::read(&client).await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("net-istio (stand-in): {e}");
                continue;
            }
        };
        let Ok(list) = all.list(&Default::default()).await else {
            continue;
        };
        for ing in list.items {
            if let Err(e) = reconcile(&client, &http, &gateways, &ing).await {
                eprintln!(
                    "net-istio (stand-in): {}/{}: {e}",
                    ing.namespace().unwrap_or_default(),
                    ing.name_any()
                );
            }
        }
    }
}

/// config-istio's gateways: `namespace/name` and its Service's host, by visibility.
struct Gateways {
    external: Vec<(String, String)>,
    local: Vec<(String, String)>,
}

impl Gateways {
    async fn read(client: &kube::Client) -> Result<Self, String> {
        let cm = Api::<ConfigMap>::namespaced(client.clone(), super::knative::NAMESPACE)
            .get("config-istio")
            .await
            .map_err(|e| format!("reading config-istio: {e}"))?;
        let (mut external, mut local) = (Vec::new(), Vec::new());
        for (k, v) in cm.data.unwrap_or_default() {
            let (to, rest) = if let Some(r) = k.strip_prefix("gateway.") {
                (&mut external, r)
            } else if let Some(r) = k.strip_prefix("local-gateway.") {
                (&mut local, r)
            } else {
                continue;
            };
            if let Some((ns, name)) = rest.split_once('.') {
                to.push((format!("{ns}/{name}"), v));
            }
        }
        Ok(Gateways { external, local })
    }

    /// The gateways of a rule's visibility.
    fn of(&self, visibility: &str) -> &[(String, String)] {
        if visibility == "ClusterLocal" {
            &self.local
        } else {
            &self.external
        }
    }
}

/// One pass over a KIngress, as net-istio's `ReconcileKind` / `FinalizeKind` do it.
async fn reconcile(
    client: &kube::Client,
    http: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    gateways: &Gateways,
    ing: &DynamicObject,
) -> Result<(), String> {
    if ing.annotations().get(CLASS_ANNOTATION).map(String::as_str) != Some(INGRESS_CLASS) {
        return Ok(());
    }
    let ns = ing.namespace().unwrap_or_default();
    let name = ing.name_any();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ingress_resource());
    let finalizers = ing.finalizers().to_vec();
    if ing.metadata.deletion_timestamp.is_some() {
        // FinalizeKind: the VirtualServices go with their owner (garbage collection).
        if finalizers.iter().any(|f| f == FINALIZER) {
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
            let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": ing.resource_version()}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("removing the finalizer: {e}"))?;
        }
        return Ok(());
    }
    if !finalizers.iter().any(|f| f == FINALIZER) {
        let mut with = finalizers.clone();
        with.push(FINALIZER.into());
        let patch =
            json!({"metadata": {"finalizers": with, "resourceVersion": ing.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("adding the finalizer: {e}"))?;
        // The patch's own event brings the KIngress back.
        return Ok(());
    }

    let spec = &ing.data["spec"];
    let hash = hash(spec, &ns, &name);
    let rules = with_probe(spec, &hash);
    let desired = virtual_services(ing, &rules, gateways);
    let vss: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &virtual_service_resource());
    for vs in &desired {
        let vs_name = vs["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let current = vss
            .get_opt(&vs_name)
            .await
            .map_err(|e| format!("reading VirtualService {vs_name}: {e}"))?;
        let same = current.as_ref().is_some_and(|c| {
            c.data["spec"] == vs["spec"]
                && c.metadata.labels.as_ref()
                    == serde_json::from_value(vs["metadata"]["labels"].clone())
                        .ok()
                        .as_ref()
        });
        if !same {
            vss.patch(
                &vs_name,
                &PatchParams::apply("net-istio").force(),
                &Patch::Apply(vs),
            )
            .await
            .map_err(|e| format!("writing VirtualService {vs_name}: {e}"))?;
        }
    }
    // VirtualServices of this KIngress it no longer wants (a mesh one without local hosts).
    let wanted: BTreeSet<&str> = desired
        .iter()
        .filter_map(|v| v["metadata"]["name"].as_str())
        .collect();
    let lp = kube::api::ListParams::default().labels(&format!("{INGRESS_LABEL}={name}"));
    if let Ok(list) = vss.list(&lp).await {
        for old in list.items {
            let owned = old
                .owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == ing.metadata.uid.as_ref());
            if owned && !wanted.contains(old.name_any().as_str()) {
                let _ = vss.delete(&old.name_any(), &DeleteParams::default()).await;
            }
        }
    }

    let ready = probed(client, http, gateways, &rules, &hash).await;
    let status = status(ing, gateways, ready);
    if strip_times(&ing.data["status"]) != strip_times(&status) {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .map_err(|e| format!("writing the status: {e}"))?;
    }
    Ok(())
}

/// `ingress.ComputeHash`: SHA-256 over the spec, the namespace and the name, in hex.
fn hash(spec: &Value, ns: &str, name: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(serde_json::to_vec(spec).unwrap_or_default());
    h.update(ns.as_bytes());
    h.update(name.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The spec's rules after `ingress.InsertProbe`: before each rule's paths, a copy of each
/// matching `K-Network-Hash: override` and setting `K-Network-Hash` to the hash.
fn with_probe(spec: &Value, hash: &str) -> Vec<Value> {
    let mut rules: Vec<Value> = spec["rules"].as_array().cloned().unwrap_or_default();
    for rule in &mut rules {
        let paths: Vec<Value> = rule["http"]["paths"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut probes: Vec<Value> = paths
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if !p["appendHeaders"].is_object() {
                    p["appendHeaders"] = json!({});
                }
                if !p["headers"].is_object() {
                    p["headers"] = json!({});
                }
                p["headers"][HASH_HEADER] = json!({"exact": "override"});
                p["appendHeaders"][HASH_HEADER] = json!(hash);
                p
            })
            .collect();
        probes.extend(paths);
        rule["http"]["paths"] = Value::Array(probes);
    }
    rules
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// `ingress.ExpandedHosts`: each host, and it without `.cluster.local` and without
/// `.svc.cluster.local`, where what is left ends in a valid top-level label.
fn expanded(hosts: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for h in hosts {
        for suffix in [
            "",
            &format!(".{CLUSTER_DOMAIN}"),
            &format!(".svc.{CLUSTER_DOMAIN}"),
        ] {
            let t = h.strip_suffix(suffix).unwrap_or(h);
            if (suffix.is_empty() || t.len() < h.len()) && valid_tld(t) {
                out.insert(t.to_string());
            }
        }
    }
    out
}

/// networking's `isValidTopLevelDomain`: the last label is at most 63 characters and not all
/// digits.
fn valid_tld(domain: &str) -> bool {
    let tld = domain.rsplit('.').next().unwrap_or_default();
    tld.len() <= 63 && tld.bytes().any(|c| c == b'-' || c > b'9')
}

/// `hostPrefix`: a cluster-local host without `.svc.cluster.local`.
fn host_prefix(h: &str) -> &str {
    h.strip_suffix(&format!(".svc.{CLUSTER_DOMAIN}"))
        .unwrap_or(h)
}

/// `getDistinctHostPrefixes`: the host prefixes, none of which starts with another.
fn distinct_prefixes(hosts: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = BTreeSet::new();
    for h in hosts {
        let p = host_prefix(h);
        if !out.iter().any(|e| p.starts_with(e.as_str())) {
            out.insert(p.to_string());
        }
    }
    out
}

/// `{ingress}-ingress` and, when it has cluster-local hosts, `{ingress}-mesh`.
fn virtual_services(ing: &DynamicObject, rules: &[Value], gateways: &Gateways) -> Vec<Value> {
    let all: BTreeSet<String> = rules.iter().flat_map(|r| strings(&r["hosts"])).collect();
    let refs = |vis: &str| -> BTreeSet<String> {
        gateways.of(vis).iter().map(|(r, _)| r.clone()).collect()
    };
    let by_visibility: BTreeMap<&str, BTreeSet<String>> = BTreeMap::from([
        ("ExternalIP", refs("ExternalIP")),
        ("ClusterLocal", refs("ClusterLocal")),
    ]);
    let ing_labels = ing.labels();
    let mut out = Vec::new();

    let mut labels = BTreeMap::from([(INGRESS_LABEL.to_string(), ing.name_any())]);
    for k in [ROUTE_LABEL, ROUTE_NAMESPACE_LABEL] {
        labels.insert(k.into(), ing_labels.get(k).cloned().unwrap_or_default());
    }
    out.push(virtual_service(
        ing,
        "ingress",
        labels,
        rules,
        &by_visibility,
        expanded(&all),
    ));

    let local: BTreeSet<String> = all
        .iter()
        .filter(|h| h.ends_with(&format!(".svc.{CLUSTER_DOMAIN}")))
        .cloned()
        .collect();
    let local = if gateways.local.is_empty() {
        local
    } else {
        expanded(&local)
    };
    if !local.is_empty() {
        let mut labels: BTreeMap<String, String> = ing_labels
            .iter()
            .filter(|(k, _)| *k != ROUTE_LABEL && *k != ROUTE_NAMESPACE_LABEL)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(INGRESS_LABEL.into(), ing.name_any());
        let mesh = BTreeSet::from(["mesh".to_string()]);
        let by_visibility = BTreeMap::from([("ExternalIP", mesh.clone()), ("ClusterLocal", mesh)]);
        out.push(virtual_service(
            ing,
            "mesh",
            labels,
            rules,
            &by_visibility,
            local,
        ));
    }
    out
}

/// `makeVirtualServiceSpec` with its object: a route per path of each rule with hosts among
/// `hosts`; the gateways of the rules that have one.
fn virtual_service(
    ing: &DynamicObject,
    suffix: &str,
    labels: BTreeMap<String, String>,
    rules: &[Value],
    gateways: &BTreeMap<&str, BTreeSet<String>>,
    hosts: BTreeSet<String>,
) -> Value {
    let mut http = Vec::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    for rule in rules {
        let visibility = rule["visibility"].as_str().unwrap_or("ExternalIP");
        let rule_hosts: BTreeSet<String> = strings(&rule["hosts"])
            .into_iter()
            .filter(|h| hosts.contains(h))
            .collect();
        if rule_hosts.is_empty() {
            continue;
        }
        let gws = gateways.get(visibility).cloned().unwrap_or_default();
        for path in rule["http"]["paths"].as_array().into_iter().flatten() {
            http.push(route(&rule_hosts, path, &gws));
        }
        used.extend(gws);
    }
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {
            "name": format!("{}-{suffix}", ing.name_any()),
            "namespace": ing.namespace(),
            "labels": labels,
            "annotations": ing.annotations(),
            "ownerReferences": [{
                "apiVersion": "networking.internal.knative.dev/v1alpha1",
                "kind": "Ingress",
                "name": ing.name_any(),
                "uid": ing.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "hosts": hosts,
            "gateways": used,
            "http": http,
        },
    })
}

/// `makeVirtualServiceRoute`: one path's route.
fn route(hosts: &BTreeSet<String>, path: &Value, gateways: &BTreeSet<String>) -> Value {
    let header_matches: BTreeMap<String, Value> = path["headers"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), json!({"exact": v["exact"]})))
        .collect();
    let matches: Vec<Value> = distinct_prefixes(hosts)
        .into_iter()
        .map(|h| {
            let mut m = json!({"gateways": gateways, "authority": {"prefix": h}});
            if let Some(p) = path["path"].as_str().filter(|p| !p.is_empty()) {
                m["uri"] = json!({"prefix": p});
            }
            if !header_matches.is_empty() {
                m["headers"] = json!(header_matches);
            }
            m
        })
        .collect();
    let set_headers = |v: &Value| {
        v.as_object()
            .filter(|m| !m.is_empty())
            .map(|m| json!({"request": {"set": m}}))
    };
    let destinations: Vec<Value> = path["splits"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let mut d = json!({
                "destination": {
                    "host": format!(
                        "{}.{}.svc.{CLUSTER_DOMAIN}",
                        s["serviceName"].as_str().unwrap_or_default(),
                        s["serviceNamespace"].as_str().unwrap_or_default()
                    ),
                    "port": {"number": s["servicePort"].as_u64().unwrap_or(80)},
                },
                "weight": s["percent"].as_i64().unwrap_or(0),
            });
            if let Some(h) = set_headers(&s["appendHeaders"]) {
                d["headers"] = h;
            }
            d
        })
        .collect();
    let mut r = json!({
        "match": matches,
        "route": destinations,
        "retries": {"attempts": 0},
    });
    if let Some(h) = set_headers(&path["appendHeaders"]) {
        r["headers"] = h;
    }
    if let Some(host) = path["rewriteHost"].as_str().filter(|h| !h.is_empty()) {
        r["rewrite"] = json!({"authority": host});
    }
    r
}

/// Whether every pod of every gateway the rules use answers a probe of each rule's hosts
/// with the hash: the new VirtualServices are what the gateways route by.
async fn probed(
    client: &kube::Client,
    http: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    gateways: &Gateways,
    rules: &[Value],
    hash: &str,
) -> bool {
    for rule in rules {
        let visibility = rule["visibility"].as_str().unwrap_or("ExternalIP");
        for (_, service) in gateways.of(visibility) {
            let Ok(pods) = thaw::controller::route::prober::service_pods(client, service, 80).await
            else {
                return false;
            };
            if pods.is_empty() {
                return false;
            }
            for pod in pods {
                for host in strings(&rule["hosts"]) {
                    let req = http::Request::get(format!("http://{pod}/healthz"))
                        .header(http::header::HOST, &host)
                        .header(PROBE_HEADER, "probe")
                        .header(HASH_HEADER, "override")
                        .header(http::header::USER_AGENT, "Knative-Ingress-Probe")
                        .body(Empty::new())
                        .unwrap();
                    let answered = tokio::time::timeout(Duration::from_secs(5), http.request(req))
                        .await
                        .ok()
                        .and_then(Result::ok);
                    let ok = answered.is_some_and(|resp| {
                        resp.status() == http::StatusCode::OK
                            && resp.headers().get(HASH_HEADER).is_some_and(|h| h == hash)
                    });
                    if !ok {
                        return false;
                    }
                }
            }
        }
    }
    true
}

/// The KIngress's status: observedGeneration, NetworkConfigured, and LoadBalancerReady (and
/// so Ready) True with the load balancers once probed, Unknown before.
fn status(ing: &DynamicObject, gateways: &Gateways, ready: bool) -> Value {
    let old: Vec<Value> = ing.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let now =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .map(|t| t.to_string())
            .unwrap_or_default();
    let cond = |t: &str, on: bool| {
        let status = if on { "True" } else { "Unknown" };
        let since = old
            .iter()
            .find(|c| c["type"] == t && c["status"] == status)
            .and_then(|c| c["lastTransitionTime"].as_str())
            .map(str::to_string)
            .unwrap_or_else(|| now.clone());
        let mut c = json!({"type": t, "status": status, "lastTransitionTime": since});
        if !on {
            c["reason"] = json!("Uninitialized");
            c["message"] = json!("Waiting for load balancer to be ready");
        }
        c
    };
    let lbs = |g: &[(String, String)]| -> Value {
        json!({"ingress": g.iter().map(|(_, s)| json!({"domainInternal": s})).collect::<Vec<_>>()})
    };
    let mut s = json!({
        "observedGeneration": ing.metadata.generation,
        "conditions": [
            cond("LoadBalancerReady", ready),
            cond("NetworkConfigured", true),
            cond("Ready", ready),
        ],
    });
    if ready {
        s["publicLoadBalancer"] = lbs(&gateways.external);
        s["privateLoadBalancer"] = lbs(&gateways.local);
    }
    s
}

/// A status without its conditions' transition times (what decides whether to write).
fn strip_times(s: &Value) -> Value {
    let mut s = s.clone();
    if let Some(cs) = s["conditions"].as_array_mut() {
        for c in cs {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastTransitionTime");
            }
        }
    }
    s
}
