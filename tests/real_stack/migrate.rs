//! The migration cases: a running Knative Serving (v1.15's own controller, webhook,
//! autoscaler, activator and queue-proxy, `plane_support::knative`) on the real control plane,
//! the starting point of a move onto thaw.
//!
//! - Knative installed as its release says serves a Service at its default settings: the
//!   webhook defaults it, the controller makes it Ready (its KIngress programmed by the
//!   net-istio stand-in), and requests through the ingress gateway pod are answered 200;
//! - a second Service scaled to zero by Knative's autoscaler (config-autoscaler's
//!   `stable-window` and `scale-to-zero-grace-period` shortened to their 6 s lower bound, the
//!   keys Knative documents for it) is woken by a request through the gateway, held by
//!   Knative's activator until the autoscaler has brought a pod up;
//! - with Knative's controller and webhook stopped (their Deployments at 0) the Services still
//!   answer; Knative's writes are refused while its webhook configurations stay, admitted
//!   undefaulted once they are removed, and defaulted again once they are restored and the
//!   webhook and controller started;
//! - the cut-over of docs/migrating-from-knative.md, steps 1 to 9, as commands (the real
//!   `thaw migrate config --from-cluster`, `kubectl`) with a Service `warm` called throughout
//!   and `cold` at zero: no request to `warm` fails; `cold` wakes through thaw's activator;
//!   every kept object reads back identical after the CRD swap; at the end thaw's Revisions and
//!   Routes control the Services and VirtualServices, no PodAutoscaler, ServerlessService or
//!   KIngress is left and nothing holds a Knative finalizer (last: Knative is gone after it);
//! - what Knative's components need of the plane beyond the kubelet stand-in's defaults: a pod
//!   of a namespace that resolves Service names reaches a Service by name at its port (80)
//!   while its pod listens on another (8080), through the node's proxy of its cluster IP.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::plane_support::Plane;
use crate::plane_support::checks::{self, condition};
use crate::plane_support::harness::{Case, apply};
use crate::plane_support::knative::{self, Component, Knative};
use crate::plane_support::serving_checks as sc;
use crate::plane_support::stack::{scale_of, until};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        // Its ground (Knative serving, scaling to zero and waking on the plane) is walked by
        // the move below too; run with `--ignored` (2.5 minutes kept out of the suite's budget).
        crate::ignored_case!(knative_serves_on_the_real_plane),
        crate::case!(the_kubelet_stand_in_resolves_service_names_and_proxies_cluster_ips),
        // Last: it leaves Knative moved onto thaw (see `installed`); this target's cases run
        // in this order, one at a time (`Setup::IngressOnly`).
        crate::exclusive_case!(knative_moves_onto_thaw_losing_no_request),
    ]
}

/// Knative, installed by the first case that needs it; its net-istio stand-in runs as long
/// as the target.
static KNATIVE: OnceCell<Knative> = OnceCell::const_new();

/// Set once [`knative_moves_onto_thaw_losing_no_request`] has begun: Knative's components are
/// deleted from then on, so no other case may use it.
static MOVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Knative installed on `plane` (once per target); panics once the move onto thaw has begun.
pub async fn installed(plane: &Plane) -> &'static Knative {
    assert!(
        !MOVED.load(std::sync::atomic::Ordering::SeqCst),
        "Knative was moved onto thaw by knative_moves_onto_thaw_losing_no_request before this case ran"
    );
    KNATIVE
        .get_or_init(|| async {
            let began = Instant::now();
            let k = knative::install(plane)
                .await
                .unwrap_or_else(|e| panic!("installing Knative: {e}\n{}", plane.dump()));
            println!(
                "Knative Serving installed from its release YAML in {:.1?}",
                began.elapsed()
            );
            k
        })
        .await
}

/// A Service Ready (its first pod's readiness included).
const READY: Duration = Duration::from_secs(180);
/// Idle to the revision's Deployment at 0 and its pods gone: the 6 s window and grace period,
/// the queue-proxy's 30 s drain, margin for a loaded host.
const TO_ZERO: Duration = Duration::from_secs(180);
/// How many requests the warm Service is sent in a row.
const CALLS: usize = 50;

/// Knative's helloworld-go as a Service `name` answering `Hello from {name}!`. The image is
/// named by digest, as Knative's controller would otherwise resolve a tag at the registry
/// (which the plane cannot reach); the kubelet stand-in runs helloworld-go for any digest.
fn helloworld(name: &str) -> String {
    format!(
        r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: {name}
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go@sha256:{digest}
          env:
            - name: TARGET
              value: "{name}"
"#,
        digest = "5ea96ba4b872685ff4ddb5cd8d1a97ec18c18fae79ee8df0d29f446c5efe5f50"
    )
}

fn kn(plane: &Plane, ns: &str, group: &str, version: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: plural.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(plane.admin.clone(), ns, &ar)
}

async fn get(
    plane: &Plane,
    ns: &str,
    (group, version, plural): (&str, &str, &str),
    name: &str,
) -> Option<Value> {
    let o = kn(plane, ns, group, version, plural)
        .get_opt(name)
        .await
        .ok()??;
    serde_json::to_value(o).ok()
}

const SERVICES: (&str, &str, &str) = ("serving.knative.dev", "v1", "services");
const SKS: (&str, &str, &str) = (
    "networking.internal.knative.dev",
    "v1alpha1",
    "serverlessservices",
);
const KINGRESS: (&str, &str, &str) = ("networking.internal.knative.dev", "v1alpha1", "ingresses");

/// Waits until Service `name` has observed its generation and is Ready; the Service.
async fn service_ready(plane: &Plane, ns: &str, name: &str) -> Value {
    until(&format!("ksvc/{name} Ready"), READY, || async {
        let s = get(plane, ns, SERVICES, name).await?;
        let ready = condition(&s, "Ready").is_some_and(|c| c["status"] == "True");
        (ready && s["status"]["observedGeneration"] == s["metadata"]["generation"]).then_some(s)
    })
    .await
}

/// The pods of revision `rev` (terminating ones included).
async fn revision_pods(plane: &Plane, ns: &str, rev: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(plane.admin.clone(), ns)
        .list(&ListParams::default().labels(&format!("serving.knative.dev/revision={rev}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The route's host (`{name}.{ns}.example.com`) from the Service's URL.
fn host_of(svc: &Value) -> String {
    svc["status"]["url"]
        .as_str()
        .and_then(|u| u.strip_prefix("http://"))
        .unwrap_or_default()
        .to_string()
}

async fn knative_serves_on_the_real_plane(plane: std::sync::Arc<Plane>, ns: String) {
    let k = installed(&plane).await;
    for c in knative::Component::ALL {
        let pods = Api::<Pod>::namespaced(plane.admin.clone(), knative::NAMESPACE)
            .list(&ListParams::default().labels(&format!("app={}", c.deployment())))
            .await
            .unwrap()
            .items;
        let images: Vec<String> = pods
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
            .filter_map(|c| c.image.clone())
            .collect();
        println!(
            "knative-serving/{}: {} pod(s), {images:?}",
            c.deployment(),
            pods.len()
        );
    }

    // 1. A Service at Knative's defaults, through Knative's webhook and controller.
    apply(&plane, &ns, "hello", &helloworld("hello"))
        .await
        .unwrap();
    let began = Instant::now();
    let svc = service_ready(&plane, &ns, "hello").await;
    let rev = svc["status"]["latestReadyRevisionName"]
        .as_str()
        .unwrap()
        .to_string();
    println!(
        "ksvc/hello Ready in {:.1?}: {} revision {rev}",
        began.elapsed(),
        svc["status"]["url"]
    );
    // What Knative's webhook set on the way in (none of it is in the applied YAML).
    let tmpl = &svc["spec"]["template"]["spec"];
    let defaults = [
        (
            "the creator annotation",
            svc["metadata"]["annotations"]["serving.knative.dev/creator"].clone(),
            Value::from("kubernetes-admin"),
        ),
        (
            "the container's name",
            tmpl["containers"][0]["name"].clone(),
            Value::from("user-container"),
        ),
        (
            "containerConcurrency",
            tmpl["containerConcurrency"].clone(),
            Value::from(0),
        ),
        (
            "timeoutSeconds",
            tmpl["timeoutSeconds"].clone(),
            Value::from(300),
        ),
        (
            "the traffic",
            svc["spec"]["traffic"].clone(),
            serde_json::json!([{"latestRevision": true, "percent": 100}]),
        ),
    ];
    for (what, got, want) in defaults {
        println!("defaulted by Knative's webhook: {what} = {got}");
        assert_eq!(got, want, "{what} as Knative's webhook defaults it");
    }
    // Knative's own queue-proxy beside the user container, at initial-scale 1.
    let pods = revision_pods(&plane, &ns, &rev).await;
    let containers: Vec<(String, String)> = pods
        .iter()
        .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect();
    println!(
        "{rev}'s pod(s): {} with containers {containers:?}",
        pods.len()
    );
    assert!(
        containers
            .iter()
            .any(|(n, i)| n == "queue-proxy" && i.starts_with("thaw.test/knative/queue")),
        "Knative's queue-proxy runs beside the user container: {containers:?}"
    );
    // The KIngress and the VirtualServices the net-istio stand-in wrote for it.
    let ing = get(&plane, &ns, KINGRESS, "hello")
        .await
        .expect("the KIngress");
    println!(
        "kingress/hello: class {}, finalizers {}, Ready {}, public {} private {}",
        ing["metadata"]["annotations"]["networking.knative.dev/ingress.class"],
        ing["metadata"]["finalizers"],
        condition(&ing, "Ready").map_or(Value::Null, |c| c["status"].clone()),
        ing["status"]["publicLoadBalancer"],
        ing["status"]["privateLoadBalancer"],
    );
    for vs in ["hello-ingress", "hello-mesh"] {
        let v = get(
            &plane,
            &ns,
            ("networking.istio.io", "v1", "virtualservices"),
            vs,
        )
        .await
        .unwrap_or_else(|| panic!("VirtualService {vs}"));
        println!(
            "virtualservice/{vs}: gateways {} hosts {}",
            v["spec"]["gateways"], v["spec"]["hosts"]
        );
        for r in v["spec"]["http"].as_array().into_iter().flatten() {
            println!(
                "  match {} -> {}",
                r["match"],
                r["route"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| format!(
                        "{}:{} {}% {}",
                        d["destination"]["host"].as_str().unwrap_or_default(),
                        d["destination"]["port"]["number"],
                        d["weight"],
                        d["headers"]["request"]["set"]
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let public = format!("{rev}.{ns}.svc.cluster.local");
        assert!(
            v["spec"]["http"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|r| r["route"][0]["destination"]["host"] == public.as_str()),
            "every route of {vs} leads to {rev}'s public Service"
        );
    }

    let gateway = checks::service_endpoint(&plane, "istio-system", "istio-ingressgateway")
        .await
        .expect("the ingress gateway's endpoint");
    let host = host_of(&svc);
    let mut took = Vec::new();
    for i in 0..CALLS {
        let t = Instant::now();
        let r = sc::request(gateway, &host, "/", &http::HeaderMap::new())
            .await
            .unwrap();
        took.push(t.elapsed());
        assert_eq!(
            (r.status, r.body.trim()),
            (200, "Hello from hello!"),
            "call {i} of {CALLS} to {host} through the gateway {gateway}"
        );
    }
    took.sort();
    println!(
        "{CALLS} calls to {host} through the gateway {gateway}: all 200, median {:.1?}, max {:.1?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );

    // 2. Scale to zero by Knative's autoscaler, then a cold start through its activator.
    let autoscaler_keys = [
        ("stable-window", "6s"),
        ("scale-to-zero-grace-period", "6s"),
    ];
    set_autoscaler(&plane, &autoscaler_keys).await;
    apply(&plane, &ns, "sleepy", &helloworld("sleepy"))
        .await
        .unwrap();
    let svc = service_ready(&plane, &ns, "sleepy").await;
    let rev = svc["status"]["latestReadyRevisionName"]
        .as_str()
        .unwrap()
        .to_string();
    let host = host_of(&svc);
    let r = sc::request(gateway, &host, "/", &http::HeaderMap::new())
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{host} while warm: {}", r.body);
    let idle = Instant::now();
    until(
        &format!("{rev} scaled to zero and its pods gone"),
        TO_ZERO,
        || async {
            let zero = scale_of(&plane, &ns, "sleepy").await == Some(0);
            (zero && revision_pods(&plane, &ns, &rev).await.is_empty()).then_some(())
        },
    )
    .await;
    let sks = get(&plane, &ns, SKS, &rev)
        .await
        .expect("the revision's SKS");
    println!(
        "{rev}: at zero with its pods gone {:.1?} after the last request (config-autoscaler {autoscaler_keys:?}); SKS mode {}",
        idle.elapsed(),
        sks["spec"]["mode"]
    );
    assert_eq!(
        sks["spec"]["mode"], "Proxy",
        "at zero the activator is in the path"
    );
    // The revision's public endpoints (what the gateway routes to) are the activator's.
    let activator: Vec<String> = Api::<Pod>::namespaced(plane.admin.clone(), knative::NAMESPACE)
        .list(&ListParams::default().labels("app=activator"))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let public = checks::service_endpoint(&plane, &ns, &rev).await.unwrap();
    println!("{rev}'s public endpoint at zero: {public} (the activator: {activator:?})");
    assert!(
        activator.contains(&public.ip().to_string()),
        "at zero {rev}'s public Service leads to the activator {activator:?}, not {public}"
    );
    let t = Instant::now();
    let r = sc::request(gateway, &host, "/", &http::HeaderMap::new())
        .await
        .unwrap();
    let cold = t.elapsed();
    assert_eq!(
        (r.status, r.body.trim()),
        (200, "Hello from sleepy!"),
        "the request that wakes {rev}"
    );
    let scale = scale_of(&plane, &ns, "sleepy").await;
    println!(
        "{host} woken through the gateway and Knative's activator: 200 in {cold:.1?}; {rev}'s Deployment at {scale:?}"
    );
    assert!(
        scale.is_some_and(|s| s >= 1),
        "the autoscaler scaled {rev} up"
    );
    set_autoscaler(&plane, &autoscaler_keys.map(|(k, _)| (k, ""))).await;

    // 3. Knative's control plane stopped, its data plane serving: what a cut-over relies on.
    for c in [Component::Controller, Component::Webhook] {
        let t = Instant::now();
        k.stop(&plane, c).await.unwrap();
        println!(
            "knative-serving/{} stopped (scaled to 0, its pods gone) in {:.1?}",
            c.deployment(),
            t.elapsed()
        );
    }
    for i in 0..10 {
        let r = sc::request(gateway, &host, "/", &http::HeaderMap::new())
            .await
            .unwrap();
        assert_eq!(
            (r.status, r.body.trim()),
            (200, "Hello from sleepy!"),
            "call {i} to {host} with Knative's controller and webhook stopped"
        );
    }
    println!("with Knative's controller and webhook stopped: 10 calls to {host}, all 200");
    let refused = apply(&plane, &ns, "refused", &helloworld("refused")).await;
    println!("a Service applied while the webhook is stopped: {refused:?}");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("failed calling webhook")),
        "with its configurations in place and no webhook pod, Knative's writes are refused"
    );
    k.remove_webhooks(&plane).await.unwrap();
    apply(&plane, &ns, "undefaulted", &helloworld("undefaulted"))
        .await
        .unwrap();
    let undefaulted = get(&plane, &ns, SERVICES, "undefaulted").await.unwrap();
    println!(
        "a Service applied with Knative's webhook configurations removed: admitted, creator {}, container name {}",
        undefaulted["metadata"]["annotations"]["serving.knative.dev/creator"],
        undefaulted["spec"]["template"]["spec"]["containers"][0]["name"]
    );
    assert!(
        undefaulted["metadata"]["annotations"]["serving.knative.dev/creator"].is_null(),
        "admitted without Knative's defaulting"
    );
    plane
        .kubectl(&["-n", &ns, "delete", "ksvc/undefaulted", "--wait"])
        .await
        .unwrap();
    let t = Instant::now();
    k.restore_webhooks(&plane).await.unwrap();
    for c in [Component::Webhook, Component::Controller] {
        k.start(&plane, c).await.unwrap();
    }
    k.until_admitted(&plane).await.unwrap();
    println!(
        "webhook configurations restored, webhook and controller started, Knative's writes admitted again in {:.1?}",
        t.elapsed()
    );

    let objects = k.objects(&plane).await.unwrap();
    println!("Knative's objects now ({}):", objects.len());
    for o in objects.iter().filter(|o| o.namespace == ns) {
        println!("  {o}");
    }
}

/// Sets config-autoscaler's `keys` (an empty value removes the key: Knative's default again).
async fn set_autoscaler(plane: &Plane, keys: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(k, v)| {
            let v = if v.is_empty() {
                Value::Null
            } else {
                Value::from(*v)
            };
            (k.to_string(), v)
        })
        .collect();
    let patch = serde_json::json!({ "data": data }).to_string();
    plane
        .kubectl(&[
            "-n",
            knative::NAMESPACE,
            "patch",
            "configmap/config-autoscaler",
            "--type=merge",
            &format!("--patch={patch}"),
        ])
        .await
        .unwrap();
}

/// A Service `web` (port 80 to its pod's 8080) and a pod that dials it by its names with the
/// host's `curl`; the node reaches its cluster IP too.
async fn the_kubelet_stand_in_resolves_service_names_and_proxies_cluster_ips(
    plane: std::sync::Arc<Plane>,
    ns: String,
) {
    plane.kubelet.resolve_services(&ns);
    let yaml = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: app
          image: ghcr.io/knative/helloworld-go
          env: [{name: PORT, value: "8080"}, {name: TARGET, value: web}]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /, port: http}
            periodSeconds: 1
"#;
    apply(&plane, &ns, "web", yaml).await.unwrap();
    plane
        .kubectl(&[
            "-n",
            &ns,
            "wait",
            "deployment/web",
            "--for=condition=Available",
            "--timeout=60s",
        ])
        .await
        .unwrap();
    // Names follow the Service within a second: the client retries for a few, as a client of
    // cluster DNS would for a Service just made.
    let client = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  restartPolicy: Never
  containers:
    - name: client
      image: thaw.test/shell
      command:
        - sh
        - -c
        - |
          for i in $(seq 20); do getent hosts web.{ns}.svc.cluster.local && break; sleep 0.5; done
          for name in web.{ns}.svc.cluster.local web.{ns}.svc web.{ns}; do
            curl -sS --max-time 10 --retry 5 --retry-all-errors --retry-delay 1 "http://$name/" || exit 1
          done
"#
    );
    apply(&plane, &ns, "client", &client).await.unwrap();
    plane
        .kubectl(&[
            "-n",
            &ns,
            "wait",
            "pod/client",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=90s",
        ])
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plane.kubelet.dump_logs()));
    let log = plane
        .kubelet
        .logs()
        .into_iter()
        .find(|(name, _)| *name == format!("{ns}/client/client"))
        .map(|(_, path)| std::fs::read_to_string(path).unwrap())
        .expect("the client's log");
    println!("the client pod's output:\n{log}");
    let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(plane.admin.clone(), &ns)
        .get("web")
        .await
        .unwrap();
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).unwrap();
    let fqdn = format!("web.{ns}.svc.cluster.local");
    assert!(
        log.lines().any(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some(cluster_ip.as_str()) && words.any(|w| w == fqdn)
        }),
        "{fqdn} leads to the cluster IP {cluster_ip}"
    );
    assert_eq!(
        log.matches("Hello from web!").count(),
        3,
        "each name answered through the cluster IP"
    );
    let (status, body) = checks::get(format!("{cluster_ip}:80").parse().unwrap(), "web", "/")
        .await
        .unwrap();
    println!("from the node, http://{cluster_ip}:80/: {status} {body:?}");
    assert_eq!((status, body.trim()), (200, "Hello from web!"));
}

/// What the warm Service's caller counted.
#[derive(Debug, Default, Clone)]
struct Calls {
    sent: u64,
    failed: u64,
    /// The longest time without a 200 (from one 200 to the next, or to the end).
    longest_gap: Duration,
    /// The first few failures, as the caller saw them.
    failures: Vec<String>,
}

/// Calls `host` through `gateway` one request after another (a 50 ms pause between) until
/// `stop` is set; what it counted.
async fn call_throughout(
    gateway: std::net::SocketAddr,
    host: String,
    want: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Calls {
    let mut c = Calls::default();
    let mut last_ok = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let sent_at = Instant::now();
        c.sent += 1;
        let r = sc::request(gateway, &host, "/", &http::HeaderMap::new()).await;
        let now = Instant::now();
        match r {
            Ok(r) if r.status == 200 && r.body.trim() == want => {
                c.longest_gap = c.longest_gap.max(now - last_ok);
                last_ok = now;
            }
            other => {
                c.failed += 1;
                if c.failures.len() < 10 {
                    let what = match other {
                        Ok(r) => format!("{} {:?}", r.status, r.body),
                        Err(e) => e,
                    };
                    c.failures
                        .push(format!("call {} at {sent_at:?}: {what}", c.sent));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.longest_gap = c.longest_gap.max(Instant::now() - last_ok);
    c
}

/// The kinds a cut-over keeps (their objects must read back unchanged).
const KEPT: &str = "services.serving.knative.dev,configurations.serving.knative.dev,\
revisions.serving.knative.dev,routes.serving.knative.dev";

/// Every kept object of `ns`, `Kind/name` to the object.
async fn kept_objects(plane: &Plane, ns: &str) -> std::collections::BTreeMap<String, Value> {
    let out = plane
        .kubectl(&["-n", ns, "get", KEPT, "-o", "json"])
        .await
        .unwrap();
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                ),
                o.clone(),
            )
        })
        .collect()
}

/// `items` of `kubectl get what -o json` in `ns` (all namespaces when `ns` is empty); an
/// unknown resource reads as none.
async fn list(plane: &Plane, ns: &str, what: &str) -> Vec<Value> {
    let mut args = vec!["get", what, "-o", "json", "--ignore-not-found"];
    if ns.is_empty() {
        args.push("-A");
    } else {
        args.extend(["-n", ns]);
    }
    let Ok(out) = plane.kubectl(&args).await else {
        return vec![];
    };
    if out.trim().is_empty() {
        return vec![];
    }
    let v: Value = serde_json::from_str(&out).unwrap_or_default();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// The (core) Services of `ns`, as JSON.
async fn core_services(plane: &Plane, ns: &str) -> Vec<Value> {
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(plane.admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| {
            let mut v = serde_json::to_value(s).ok()?;
            v["kind"] = "Service".into();
            Some(v)
        })
        .collect()
}

/// `(kind, name, uid)` of `o`'s controller reference.
fn controller_of(o: &Value) -> Option<(String, String, String)> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
                r["uid"].as_str().unwrap_or_default().to_string(),
            )
        })
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or_default()
}

/// The IPs of the pods of `ns` labelled `selector`.
async fn pod_ips(plane: &Plane, ns: &str, selector: &str) -> Vec<String> {
    Api::<Pod>::namespaced(plane.admin.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect()
}

/// The Endpoints outside knative-serving that name one of Knative's pods
/// (docs/migrating-from-knative.md's step 7: a `targetRef` in knative-serving, or an address
/// of one of `activator`'s IPs), `namespace/name`.
async fn endpoints_naming_knative(plane: &Plane, activator: &[String]) -> Vec<String> {
    list(plane, "", "endpoints")
        .await
        .iter()
        .filter(|e| e["metadata"]["namespace"] != knative::NAMESPACE)
        .filter(|e| {
            e["subsets"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| {
                    ["addresses", "notReadyAddresses"]
                        .into_iter()
                        .flat_map(move |k| s[k].as_array().into_iter().flatten())
                })
                .any(|a| {
                    a["targetRef"]["namespace"] == knative::NAMESPACE
                        || a["ip"]
                            .as_str()
                            .is_some_and(|ip| activator.iter().any(|i| i == ip))
                })
        })
        .map(|e| {
            format!(
                "{}/{}",
                e["metadata"]["namespace"].as_str().unwrap_or_default(),
                name(e)
            )
        })
        .collect()
}

/// How long thaw's controller gets to adopt and clean up after Knative (every revision and
/// route Ready under it, Knative's internal objects gone).
const ADOPTED: Duration = Duration::from_secs(300);
/// How long a released revision gets to roll to thaw's sidecar.
const ROLLED: Duration = Duration::from_secs(240);

/// The cut-over of docs/migrating-from-knative.md, steps 1 to 8, on a running Knative Serving
/// (its controller, webhook, autoscaler, activator and queue-proxy; net-istio's stand-in):
/// a Service `warm` called throughout (0 failed requests), a Service `cold` at zero before
/// the move and woken through thaw's activator after it, one revision released to thaw's
/// sidecar. Knative's settings are its defaults but config-autoscaler's `stable-window` and
/// `scale-to-zero-grace-period` (6 s, their lower bound, so `cold` reaches zero in seconds);
/// `thaw migrate config` carries them, and the rest, over to thaw.
async fn knative_moves_onto_thaw_losing_no_request(plane: std::sync::Arc<Plane>, ns: String) {
    let k = installed(&plane).await;
    MOVED.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in [Component::Webhook, Component::Controller] {
        k.start(&plane, c).await.unwrap();
    }
    k.until_admitted(&plane).await.unwrap();
    let autoscaler_keys = [
        ("stable-window", "6s"),
        ("scale-to-zero-grace-period", "6s"),
    ];
    set_autoscaler(&plane, &autoscaler_keys).await;
    let mut took: Vec<(&str, Duration)> = Vec::new();

    // Knative serving two Services: `warm` with a pod, `cold` at zero.
    for s in ["warm", "cold"] {
        apply(&plane, &ns, s, &helloworld(s)).await.unwrap();
    }
    let warm = service_ready(&plane, &ns, "warm").await;
    let cold = service_ready(&plane, &ns, "cold").await;
    let warm_rev = warm["status"]["latestReadyRevisionName"]
        .as_str()
        .unwrap()
        .to_string();
    let cold_rev = cold["status"]["latestReadyRevisionName"]
        .as_str()
        .unwrap()
        .to_string();
    let gateway = checks::service_endpoint(&plane, "istio-system", "istio-ingressgateway")
        .await
        .expect("the ingress gateway's endpoint");
    let (warm_host, cold_host) = (host_of(&warm), host_of(&cold));
    let t = Instant::now();
    until(
        &format!("{cold_rev} scaled to zero by Knative and its pods gone"),
        TO_ZERO,
        || async {
            let zero = scale_of(&plane, &ns, "cold").await == Some(0);
            (zero && revision_pods(&plane, &ns, &cold_rev).await.is_empty()).then_some(())
        },
    )
    .await;
    println!(
        "Knative serves {warm_host} ({warm_rev}) and {cold_host} ({cold_rev}, at zero {:.1?} after Ready; config-autoscaler {autoscaler_keys:?})",
        t.elapsed()
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = tokio::spawn(call_throughout(
        gateway,
        warm_host.clone(),
        "Hello from warm!".into(),
        stop.clone(),
    ));
    let move_began = Instant::now();

    // 1. Take stock: every storedVersions lists only the version thaw's CRD serves.
    let t = Instant::now();
    let crds_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crds");
    for f in std::fs::read_dir(&crds_dir).unwrap() {
        let f = f.unwrap().path();
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let served: Vec<&str> = crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str())
            .collect();
        let live = plane
            .kubectl(&["get", "crd", name(&crd), "-o", "json"])
            .await
            .unwrap();
        let live: Value = serde_json::from_str(&live).unwrap();
        let stored: Vec<&str> = live["status"]["storedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        println!(
            "step 1: crd/{}: storedVersions {stored:?}, thaw serves {served:?}",
            name(&crd)
        );
        assert!(
            stored.iter().all(|v| served.contains(v)),
            "crd/{}: a stored version thaw does not serve",
            name(&crd)
        );
    }
    took.push(("1. take stock", t.elapsed()));

    // 2. The configuration carried over by the real binary, from the live cluster.
    let t = Instant::now();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
        .args(["migrate", "config", "--from-cluster"])
        .env("KUBECONFIG", &plane.admin_kubeconfig)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "step 2: thaw migrate config --from-cluster: {}; stderr:\n{stderr}",
        out.status
    );
    assert!(out.status.success(), "thaw migrate config: {stderr}");
    let config_file = plane.dir.path().join("thaw-config.yaml");
    std::fs::write(&config_file, &out.stdout).unwrap();
    let config = String::from_utf8_lossy(&out.stdout);
    assert!(
        config.contains("stable-window: 6s") || config.contains("stable-window: \"6s\""),
        "the shortened window carried over:\n{config}"
    );
    took.push(("2. migrate config", t.elapsed()));

    // 3. Knative's reconcilers stopped: its controller, net-istio's (the stand-in).
    let t = Instant::now();
    k.delete(&plane, Component::Controller).await.unwrap();
    k.net_istio.stop();
    took.push(("3. controllers deleted", t.elapsed()));

    // 4. Its webhook configurations removed, its webhook deleted.
    let t = Instant::now();
    k.remove_webhooks(&plane).await.unwrap();
    k.delete(&plane, Component::Webhook).await.unwrap();
    took.push(("4. webhooks removed", t.elapsed()));

    // 5. thaw's CRDs over Knative's; every kept object reads back identical.
    let before = kept_objects(&plane, &ns).await;
    let t = Instant::now();
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crds_dir.display().to_string(),
        ])
        .await
        .unwrap();
    took.push(("5. CRDs applied", t.elapsed()));
    let after = kept_objects(&plane, &ns).await;
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the same objects after the CRD swap"
    );
    for (what, b) in &before {
        let a = &after[what];
        // Nothing writes them between the two reads (Knative's controller and webhook are
        // gone, thaw's not installed yet): metadata (managedFields, finalizers,
        // resourceVersion and generation included), spec and status compare whole.
        for part in ["metadata", "spec", "status"] {
            assert_eq!(
                a[part], b[part],
                "{what}'s {part} reads back identical after the CRD swap"
            );
        }
    }
    println!(
        "step 5: {} kept objects read back identical (metadata, spec, status): {:?}",
        before.len(),
        before.keys().collect::<Vec<_>>()
    );

    // 6. Knative's autoscaler deleted, thaw installed adopting, its configuration applied.
    let t = Instant::now();
    k.delete(&plane, Component::Autoscaler).await.unwrap();
    took.push(("6a. Knative's autoscaler deleted", t.elapsed()));
    let t = Instant::now();
    crate::plane_support::install::apply(&plane, crate::plane_support::install::OVERLAY_ADOPTING)
        .await
        .unwrap();
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &config_file.display().to_string(),
        ])
        .await
        .unwrap();
    crate::plane_support::install::wait_available(&plane, "thaw-system")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", plane.dump()));
    took.push(("6b. thaw installed, Available", t.elapsed()));
    let t = Instant::now();
    until(
        "thaw's controller adopted every revision and route and removed Knative's internal objects",
        ADOPTED,
        || async {
            let revisions = list(&plane, &ns, "revisions.serving.knative.dev").await;
            let routes = list(&plane, &ns, "routes.serving.knative.dev").await;
            let ready = |o: &Value| condition(o, "Ready").is_some_and(|c| c["status"] == "True");
            let services = core_services(&plane, &ns).await;
            let owned_services = revisions.iter().all(|r| {
                let uid = r["metadata"]["uid"].as_str().unwrap_or_default();
                [name(r).to_string(), format!("{}-private", name(r))]
                    .iter()
                    .all(|s| {
                        services.iter().any(|svc| {
                            name(svc) == s
                                && controller_of(svc)
                                    .is_some_and(|(k, _, u)| k == "Revision" && u == uid)
                        })
                    })
            });
            let vss = list(&plane, &ns, "virtualservices.networking.istio.io").await;
            let owned_vs = !vss.is_empty()
                && vss
                    .iter()
                    .all(|v| controller_of(v).is_some_and(|(k, _, _)| k == "Route"));
            let mut left = 0;
            for kind in [
                "podautoscalers.autoscaling.internal.knative.dev",
                "serverlessservices.networking.internal.knative.dev",
                "ingresses.networking.internal.knative.dev",
            ] {
                left += list(&plane, &ns, kind).await.len();
            }
            (revisions.iter().all(ready)
                && routes.iter().all(ready)
                && owned_services
                && owned_vs
                && left == 0)
                .then_some(())
        },
    )
    .await;
    took.push(("6c. adopted, Knative's internal objects gone", t.elapsed()));
    let adopted: Vec<String> = plane
        .kubelet
        .logs()
        .into_iter()
        .filter(|(n, _)| n.starts_with("thaw-system/"))
        .flat_map(|(_, p)| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("adopted a Knative object"))
                .map(|l| {
                    let v: Value = serde_json::from_str(l).unwrap_or_default();
                    let f = &v["fields"];
                    format!(
                        "{} {} {}: {}",
                        v["timestamp"], f["kind"], f["name"], f["chain"]
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    println!("step 6: {} adoption line(s):", adopted.len());
    for l in &adopted {
        println!("  {l}");
    }

    // 7. Knative's activator deleted once no Endpoints name it.
    let t = Instant::now();
    let activator = pod_ips(&plane, knative::NAMESPACE, "app=activator").await;
    println!(
        "step 7: Endpoints naming Knative's activator {activator:?} once thaw adopted: {:?}",
        endpoints_naming_knative(&plane, &activator).await
    );
    until(
        "no Endpoints outside knative-serving name Knative's activator",
        ADOPTED,
        || async {
            endpoints_naming_knative(&plane, &activator)
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    took.push(("7a. no Endpoints name Knative's activator", t.elapsed()));
    let t = Instant::now();
    k.delete(&plane, Component::Activator).await.unwrap();
    took.push((
        "7b. Knative's activator deleted, its pods gone",
        t.elapsed(),
    ));

    // `cold`, still at zero, woken through the gateway and thaw's activator.
    let thaw_activator = pod_ips(&plane, "thaw-system", "app.kubernetes.io/name=activator").await;
    let public = checks::service_endpoint(&plane, &ns, &cold_rev)
        .await
        .unwrap();
    println!(
        "{cold_rev} at {:?}; its public endpoint {public} (thaw's activator: {thaw_activator:?})",
        scale_of(&plane, &ns, "cold").await
    );
    assert!(
        thaw_activator.contains(&public.ip().to_string()),
        "at zero {cold_rev}'s public Service leads to thaw's activator"
    );
    let t = Instant::now();
    let r = sc::request(gateway, &cold_host, "/", &http::HeaderMap::new())
        .await
        .unwrap();
    println!(
        "{cold_host} woken through the gateway and thaw's activator: {} in {:.1?}",
        r.status,
        t.elapsed()
    );
    assert_eq!(
        (r.status, r.body.trim()),
        (200, "Hello from cold!"),
        "the request that wakes {cold_rev}"
    );
    took.push(("cold woken", t.elapsed()));

    // 8. `warm`'s revision released to thaw's sidecar while it is called.
    let t = Instant::now();
    plane
        .kubectl(&[
            "-n",
            &ns,
            "annotate",
            &format!("revision/{warm_rev}"),
            "controller.thaw.dev/release-template=true",
        ])
        .await
        .unwrap();
    let deployment = format!("{warm_rev}-deployment");
    until(
        &format!("{deployment} rolled to thaw's sidecar"),
        ROLLED,
        || async {
            let d = list(&plane, &ns, "deployments").await;
            let d = d.iter().find(|d| name(d) == deployment)?;
            let held = !d["metadata"]["labels"]["controller.thaw.dev/template-held"].is_null();
            let done = d["status"]["observedGeneration"] == d["metadata"]["generation"]
                && d["status"]["updatedReplicas"] == d["spec"]["replicas"]
                && d["status"]["replicas"] == d["spec"]["replicas"]
                && d["status"]["availableReplicas"] == d["spec"]["replicas"];
            let pods = revision_pods(&plane, &ns, &warm_rev).await;
            let knative_queue = pods.iter().any(|p| {
                p.spec.iter().flat_map(|s| s.containers.iter()).any(|c| {
                    c.ports
                        .iter()
                        .flatten()
                        .any(|p| p.name.as_deref() == Some("http-queueadm"))
                })
            });
            (!held && done && !pods.is_empty() && !knative_queue).then_some(())
        },
    )
    .await;
    took.push(("8. warm released and rolled", t.elapsed()));
    // What is left: everything owned by thaw, nothing of Knative's internals, no hanging
    // finalizer or deletion.
    let revisions = list(&plane, &ns, "revisions.serving.knative.dev").await;
    let routes = list(&plane, &ns, "routes.serving.knative.dev").await;
    for svc in core_services(&plane, &ns).await {
        let Some(rev) = svc["metadata"]["labels"]["serving.knative.dev/revision"].as_str() else {
            continue;
        };
        let uid = revisions
            .iter()
            .find(|r| name(r) == rev)
            .map(|r| r["metadata"]["uid"].clone());
        let ctl = controller_of(&svc);
        println!("service/{}: controller {ctl:?}", name(&svc));
        assert!(
            ctl.as_ref()
                .is_some_and(|(k, _, u)| k == "Revision" && uid == Some(Value::from(u.as_str()))),
            "service/{}'s controller is its Revision",
            name(&svc)
        );
    }
    for vs in list(&plane, &ns, "virtualservices.networking.istio.io").await {
        let ctl = controller_of(&vs);
        println!("virtualservice/{}: controller {ctl:?}", name(&vs));
        assert!(
            ctl.as_ref().is_some_and(|(k, n, u)| k == "Route"
                && routes
                    .iter()
                    .any(|r| name(r) == n && r["metadata"]["uid"] == u.as_str())),
            "virtualservice/{}'s controller is a Route",
            name(&vs)
        );
    }
    let objects = k.objects(&plane).await.unwrap();
    println!("Knative's kinds in {ns} at the end:");
    for o in objects.iter().filter(|o| o.namespace == ns) {
        println!("  {o}");
    }
    for kind in ["PodAutoscaler", "ServerlessService", "Ingress"] {
        assert!(
            !objects.iter().any(|o| o.namespace == ns && o.kind == kind),
            "no {kind} left in {ns}"
        );
    }
    let mut everything = Vec::new();
    for what in [
        KEPT,
        "endpoints,deployments,virtualservices.networking.istio.io",
        "podautoscalers.autoscaling.internal.knative.dev,metrics.autoscaling.internal.knative.dev",
        "serverlessservices.networking.internal.knative.dev,ingresses.networking.internal.knative.dev",
        "certificates.networking.internal.knative.dev,images.caching.internal.knative.dev",
    ] {
        everything.extend(list(&plane, &ns, what).await);
    }
    everything.extend(core_services(&plane, &ns).await);
    for o in &everything {
        let what = format!("{}/{}", o["kind"].as_str().unwrap_or_default(), name(o));
        let finalizers: Vec<&str> = o["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            !finalizers.iter().any(|f| f.contains("knative.dev")),
            "{what} keeps Knative's finalizer(s) {finalizers:?}"
        );
        assert!(
            o["metadata"]["deletionTimestamp"].is_null(),
            "{what} is stuck deleting (finalizers {finalizers:?})"
        );
    }
    println!(
        "{} objects in {ns}: none with a Knative finalizer or a deletionTimestamp",
        everything.len()
    );
    // 9. What Knative leaves behind removed, as the page says, while `warm` is called.
    let t = Instant::now();
    plane
        .kubectl(&[
            "-n",
            "istio-system",
            "delete",
            "secret",
            "-l",
            "networking.internal.knative.dev/originSecretName,!controller.thaw.dev/owner-uid",
        ])
        .await
        .unwrap();
    plane
        .kubectl(&[
            "-n",
            knative::NAMESPACE,
            "delete",
            "deployment,service,configmap,secret,hpa,pdb",
            "-l",
            "app.kubernetes.io/name=knative-serving",
        ])
        .await
        .unwrap();
    let internal = [
        "podautoscalers.autoscaling.internal.knative.dev",
        "metrics.autoscaling.internal.knative.dev",
        "serverlessservices.networking.internal.knative.dev",
        "ingresses.networking.internal.knative.dev",
        "certificates.networking.internal.knative.dev",
        "images.caching.internal.knative.dev",
    ];
    let mut args = vec!["delete", "crd", "--timeout=120s"];
    args.extend(internal);
    plane
        .kubectl(&args)
        .await
        .unwrap_or_else(|e| panic!("step 9: deleting Knative's internal CRDs: {e}"));
    // What Knative's components made at run time, unlabelled: the autoscaler's bucket
    // Services and Endpoints, their Leases.
    let buckets: Vec<String> = plane
        .kubectl(&[
            "-n",
            knative::NAMESPACE,
            "get",
            "service,endpoints",
            "-o",
            "name",
        ])
        .await
        .unwrap()
        .lines()
        .filter(|l| l.contains("/autoscaler-bucket-"))
        .map(str::to_string)
        .collect();
    if !buckets.is_empty() {
        // A Service's Endpoints go with it (the endpoints controller): --ignore-not-found.
        let mut args = vec!["-n", knative::NAMESPACE, "delete", "--ignore-not-found"];
        args.extend(buckets.iter().map(String::as_str));
        plane.kubectl(&args).await.unwrap();
    }
    plane
        .kubectl(&["-n", knative::NAMESPACE, "delete", "lease", "--all"])
        .await
        .unwrap();
    took.push((
        "9. Knative's leftovers and internal CRDs deleted",
        t.elapsed(),
    ));
    let left = plane
        .kubectl(&[
            "-n",
            knative::NAMESPACE,
            "get",
            "deployment,service,endpoints,configmap,secret,lease",
            "-o",
            "name",
        ])
        .await
        .unwrap();
    println!("step 9: what knative-serving still holds:\n{left}");
    // kube-controller-manager's CA bundle, in every namespace, is all that is left.
    assert_eq!(
        left.lines().collect::<Vec<_>>(),
        ["configmap/kube-root-ca.crt"],
        "knative-serving after step 9"
    );
    // `cold` still wakes once Knative's leftovers are gone (at zero again by then, or not).
    let r = sc::request(gateway, &cold_host, "/", &http::HeaderMap::new())
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.body.trim()),
        (200, "Hello from cold!"),
        "{cold_host} after step 9"
    );
    // The caller keeps going a little past the last step.
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let calls = caller.await.unwrap();
    let moved = move_began.elapsed();
    println!("the move, step by step:");
    for (step, d) in &took {
        println!("  {step}: {d:.1?}");
    }
    println!(
        "{warm_host} over the whole move ({moved:.1?}): sent {}, failed {}, longest gap without a 200 {:.1?}; failures: {:?}",
        calls.sent, calls.failed, calls.longest_gap, calls.failures
    );

    // What users wrote is what they wrote.
    let end = kept_objects(&plane, &ns).await;
    for (what, b) in &before {
        assert_eq!(
            end.get(what).map(|o| &o["spec"]),
            Some(&b["spec"]),
            "{what}'s spec after the move"
        );
    }
    println!("{} kept objects' specs unchanged by the move", before.len());

    assert_eq!(
        calls.failed, 0,
        "no request to {warm_host} failed over the move: {:?}",
        calls.failures
    );
}
