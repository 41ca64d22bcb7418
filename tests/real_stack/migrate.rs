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
        crate::exclusive_case!(knative_serves_on_the_real_plane),
        crate::case!(the_kubelet_stand_in_resolves_service_names_and_proxies_cluster_ips),
    ]
}

/// Knative, installed by the first case that needs it; its net-istio stand-in runs as long
/// as the target.
static KNATIVE: OnceCell<Knative> = OnceCell::const_new();

/// Knative installed on `plane` (once per target).
pub async fn installed(plane: &Plane) -> &'static Knative {
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
