//! The serving cases of the whole stack on the real control plane, at Knative's default
//! settings (thaw-system's ConfigMaps as deploy/config ships them; no case changes them):
//!
//! - a Service idle until scaled to zero (its Deployment at 0, the ReplicaSet's pods gone),
//!   then woken by a request through the ingress gateway pod, held by an activator and
//!   answered 200 with `Server-Timing: cold-start;dur=...`;
//! - a cold start answered before the kubelet marks the new pod ready (the activator's own
//!   probe of the pod's sidecar, docs/decisions.md "A cold start on a cluster does not wait
//!   for the kubelet"), read against the Pod's Ready condition in the API;
//! - a new revision taking the traffic, then an 80/20 split with tags: each tagged host
//!   answers from its own revision, the main host's two weighted destinations are those of
//!   the tags' routes, and `kubectl get ksvc,route,rev` fills Knative's printer columns;
//! - the Revision status shared by its two writers (the controller's conditions, the
//!   autoscaler's `actualReplicas`, `desiredReplicas` and `Active`), each version of it
//!   checked across 100 alternating writes counted in the API server's audit log.
//!
//! The only setting shortened is per revision: `autoscaling.knative.dev/window: 6s` (the
//! stable window's lower bound; thaw reads the annotation, `config::annotations`) on the
//! Services that must reach zero. The scale-to-zero grace period stays config-autoscaler's
//! 30 s (Knative has no per-revision annotation for it) and the sidecar's drain Knative's
//! 30 s, so reaching zero with the pods gone takes about a minute.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{Timestamp, ToSpan as _};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use thaw::controller::route::virtual_service::HttpRoute;
use tokio::time::Instant;

use crate::plane_support::Plane;
use crate::plane_support::checks::{self, Transitions};
use crate::plane_support::harness::{Case, apply, show};
use crate::plane_support::serving_checks::{self as sc, Reply};

/// This module's cases.
pub fn cases() -> Vec<Case> {
    vec![
        crate::case!(an_idle_service_goes_to_zero_and_a_request_wakes_it_through_the_activator),
        crate::case!(a_cold_start_is_answered_before_the_kubelet_marks_the_pod_ready),
        crate::case!(a_new_revision_takes_the_traffic_then_tagged_revisions_split_it),
        crate::case!(the_revision_status_keeps_both_writers_fields_across_100_writes),
    ]
}

/// A Service Ready (its first pod's readiness included).
const READY: Duration = Duration::from_secs(120);
/// Idle to `spec.replicas: 0`: the 6 s window, the 30 s grace period, margin for a loaded host.
const TO_ZERO: Duration = Duration::from_secs(180);
/// Scaled to zero to the pods gone: the sidecar's 30 s drain, then the kubelet's deletion.
const GONE: Duration = Duration::from_secs(120);
/// A route change reaching the ingress gateway pod, a pod marked ready by the kubelet.
const SETTLE: Duration = Duration::from_secs(60);

/// Knative's helloworld-go Service (`TARGET` says who answers), with `annotations` (YAML lines
/// at the template's metadata.annotations indentation) and `extra` (YAML lines of the
/// container, e.g. a readiness probe).
fn helloworld(name: &str, target: &str, annotations: &[&str], extra: &str) -> String {
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        let lines: String = annotations
            .iter()
            .map(|a| format!("        {a}\n"))
            .collect();
        format!("    metadata:\n      annotations:\n{lines}")
    };
    format!(
        r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: {name}
spec:
  template:
{annotations}    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "{target}"
{extra}"#
    )
}

/// The window annotation that lets a revision reach zero within a minute.
const SHORT_WINDOW: &str = r#"autoscaling.knative.dev/window: "6s""#;

/// Polls `check` every 250 ms until it returns `Ok`; after `within`, the error says what was
/// waited for and what `check` saw last.
async fn until<T, F, Fut>(within: Duration, what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("{what}: not within {within:?}; last seen: {e}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The Knative kind `plural` in `ns`, read as the API server stores it.
fn knative(plane: &Plane, ns: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "serving.knative.dev".into(),
        version: "v1".into(),
        api_version: "serving.knative.dev/v1".into(),
        kind: plural.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(plane.admin.clone(), ns, &ar)
}

/// `kind/name` in `ns` as JSON (metadata, spec, status).
async fn get_json(plane: &Plane, ns: &str, plural: &str, name: &str) -> Result<Value, String> {
    let o = knative(plane, ns, plural)
        .get(name)
        .await
        .map_err(|e| format!("get {plural}/{name}: {e}"))?;
    serde_json::to_value(&o).map_err(|e| e.to_string())
}

use crate::plane_support::checks::condition;

/// `status reason` of a condition, `-` when absent.
fn cond_status(obj: &Value, type_: &str) -> String {
    condition(obj, type_).map_or("-".into(), |c| {
        format!(
            "{} {}",
            c["status"].as_str().unwrap_or(""),
            c["reason"].as_str().unwrap_or("")
        )
        .trim()
        .to_string()
    })
}

fn is_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

/// Waits until the Service has observed its latest generation and is Ready; the Service.
async fn service_ready(plane: &Plane, ns: &str, name: &str) -> Result<Value, String> {
    until(READY, &format!("ksvc/{name} Ready"), move || async move {
        let s = get_json(plane, ns, "services", name).await?;
        let observed = s["status"]["observedGeneration"] == s["metadata"]["generation"];
        if observed && is_true(&s, "Ready") {
            Ok(s)
        } else {
            Err(format!(
                "generation {} observed {}, Ready {}",
                s["metadata"]["generation"],
                s["status"]["observedGeneration"],
                cond_status(&s, "Ready")
            ))
        }
    })
    .await
}

/// The ingress gateway pod's address (its Service's ready endpoint).
async fn gateway(plane: &Plane) -> std::net::SocketAddr {
    checks::service_endpoint(plane, "istio-system", "istio-ingressgateway")
        .await
        .expect("the ingress gateway's endpoint")
}

/// GETs `/` for `host` through the gateway until it answers 200 with `Hello from {who}!`.
async fn until_answers(
    gateway: std::net::SocketAddr,
    host: &str,
    who: &str,
) -> Result<Reply, String> {
    let want = format!("Hello from {who}!");
    let want = want.as_str();
    until(
        SETTLE,
        &format!("{host} answering {want:?}"),
        move || async move {
            let r = sc::request(gateway, host, "/", &http::HeaderMap::new()).await?;
            if r.status == 200 && r.body.trim() == want {
                Ok(r)
            } else {
                Err(format!("{} {:?}", r.status, r.body))
            }
        },
    )
    .await
}

/// The revision's pods, deleted ones (terminating) included.
async fn revision_pods(plane: &Plane, ns: &str, revision: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let lp = ListParams::default().labels(&format!("serving.knative.dev/revision={revision}"));
    api.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

fn pod_condition(p: &Pod, type_: &str) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// Waits until the revision is at zero as Kubernetes has it: its Deployment's `spec.replicas`
/// 0, then every ReplicaSet of the revision at 0 and every pod of it gone.
async fn until_at_zero(plane: &Plane, ns: &str, revision: &str) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::namespaced(plane.admin.clone(), ns);
    let deployments = &deployments;
    let name = format!("{revision}-deployment");
    let name = name.as_str();
    until(
        TO_ZERO,
        &format!("{name} scaled to 0"),
        move || async move {
            let d = deployments.get(name).await.map_err(|e| e.to_string())?;
            match d.spec.and_then(|s| s.replicas) {
                Some(0) => Ok(()),
                r => Err(format!("spec.replicas {r:?}")),
            }
        },
    )
    .await?;
    let sets: Api<ReplicaSet> = Api::namespaced(plane.admin.clone(), ns);
    let lp = ListParams::default().labels(&format!("serving.knative.dev/revision={revision}"));
    let (sets, lp) = (&sets, &lp);
    until(
        GONE,
        &format!("{revision}'s ReplicaSet and pods gone"),
        move || async move {
            let rs = sets.list(lp).await.map_err(|e| e.to_string())?.items;
            let replicas: Vec<i32> = rs
                .iter()
                .map(|r| r.status.as_ref().map_or(0, |s| s.replicas))
                .collect();
            let pods = revision_pods(plane, ns, revision).await;
            if !rs.is_empty() && replicas.iter().all(|r| *r == 0) && pods.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "ReplicaSets' status.replicas {replicas:?}, {} pods",
                    pods.len()
                ))
            }
        },
    )
    .await
}

/// Waits until the autoscaler's part of the Revision's status says it is at zero
/// (`actualReplicas` 0, `desiredReplicas` 0, `Active=False NoTraffic`) while the controller's
/// still says Ready; the Revision.
async fn until_status_at_zero(plane: &Plane, ns: &str, revision: &str) -> Result<Value, String> {
    until(
        SETTLE,
        &format!("{revision}'s status at zero"),
        move || async move {
            let r = get_json(plane, ns, "revisions", revision).await?;
            let st = &r["status"];
            if st["actualReplicas"] == 0
                && st["desiredReplicas"] == 0
                && cond_status(&r, "Active") == "False NoTraffic"
                && is_true(&r, "Ready")
            {
                Ok(r)
            } else {
                Err(format!(
                    "actual {} desired {} Active {} Ready {}",
                    st["actualReplicas"],
                    st["desiredReplicas"],
                    cond_status(&r, "Active"),
                    cond_status(&r, "Ready")
                ))
            }
        },
    )
    .await
}

// === the cases ===

/// Knative's helloworld-go at Knative's defaults (min-scale 0) but its own 6 s window: Ready,
/// answering through the ingress gateway pod (warm: no cold-start timing), then idle until
/// the autoscaler takes it to zero (its Deployment at 0, the ReplicaSet's pods gone, the
/// Revision `actualReplicas: 0`, `Active=False NoTraffic` and still Ready). A request then
/// wakes it: the gateway sends it to the revision's public endpoints (the activators), an
/// activator holds it until a pod is up and answers 200 with `Server-Timing:
/// cold-start;dur=...`.
async fn an_idle_service_goes_to_zero_and_a_request_wakes_it_through_the_activator(
    plane: Arc<Plane>,
    ns: String,
) {
    let (plane, ns) = (&*plane, ns.as_str());
    let transitions = Transitions::start(plane, ns);
    let yaml = helloworld("hello", "World", &[SHORT_WINDOW], "");
    apply(plane, ns, "hello", &yaml).await.unwrap();
    let fail = |e: String| -> ! { panic!("{e}\nconditions:\n{}", transitions.lines()) };
    let svc = service_ready(plane, ns, "hello")
        .await
        .unwrap_or_else(|e| fail(e));
    let host = format!("hello.{ns}.example.com");
    assert_eq!(svc["status"]["url"], format!("http://{host}"), "{svc:#}");
    let gateway = gateway(plane).await;
    let warm = until_answers(gateway, &host, "World")
        .await
        .unwrap_or_else(|e| fail(e));
    assert!(
        !warm.server_timing().contains("cold-start"),
        "a warm request timed as a cold start: {}",
        warm.server_timing()
    );

    let revision = "hello-00001";
    let idle_from = Instant::now();
    until_at_zero(plane, ns, revision)
        .await
        .unwrap_or_else(|e| fail(e));
    let at_zero = until_status_at_zero(plane, ns, revision)
        .await
        .unwrap_or_else(|e| fail(e));
    show("the Revision at zero", &format!("{at_zero:#}"));
    println!(
        "{revision}: at zero, pods gone, {:.0?} after the last request",
        idle_from.elapsed()
    );

    let reply = sc::request(gateway, &host, "/", &http::HeaderMap::new())
        .await
        .unwrap_or_else(|e| fail(e));
    assert_eq!(
        (reply.status, reply.body.trim()),
        (200, "Hello from World!"),
        "{reply:?}"
    );
    let timing = reply.server_timing();
    assert!(
        timing.starts_with("cold-start;dur="),
        "no cold-start timing: the request was not held by an activator: {:?}",
        reply.headers
    );
    println!("{revision}: woken through the activator: 200, Server-Timing: {timing}");
    // Woken for real: the autoscaler scaled the Deployment up from zero.
    let deployments: Api<Deployment> = Api::namespaced(plane.admin.clone(), ns);
    let replicas = deployments
        .get(&format!("{revision}-deployment"))
        .await
        .unwrap()
        .spec
        .and_then(|s| s.replicas);
    assert!(replicas.is_some_and(|r| r >= 1), "replicas {replicas:?}");
}

/// A cold start forwarded before the kubelet marks the pod ready, as thaw claims on a cluster
/// at the default `pod-probe-budget` (8) and `mesh-compatibility-mode` (`auto`): the Service's
/// readiness probe has `initialDelaySeconds: 20`, so the kubelet's first probe of the sidecar
/// (which takes the probe's timing) comes 20 s after the pod starts, while the sidecar answers
/// `K-Network-Probe: queue` as soon as the app answers its probe. Woken from zero through the
/// gateway, the request is answered 200 (cold-start timing) while the API still has the new
/// Pod `Ready` not True; the kubelet marks it Ready afterwards, and an activator counted a pod
/// sent to early.
async fn a_cold_start_is_answered_before_the_kubelet_marks_the_pod_ready(
    plane: Arc<Plane>,
    ns: String,
) {
    let (plane, ns) = (&*plane, ns.as_str());
    let transitions = Transitions::start(plane, ns);
    let probe = "          readinessProbe:\n            httpGet:\n              path: /\n            initialDelaySeconds: 20\n";
    let yaml = helloworld("early", "early", &[SHORT_WINDOW], probe);
    apply(plane, ns, "early", &yaml).await.unwrap();
    let fail = |e: String| -> ! { panic!("{e}\nconditions:\n{}", transitions.lines()) };
    service_ready(plane, ns, "early")
        .await
        .unwrap_or_else(|e| fail(e));
    let host = format!("early.{ns}.example.com");
    let gateway = gateway(plane).await;
    until_answers(gateway, &host, "early")
        .await
        .unwrap_or_else(|e| fail(e));
    let revision = "early-00001";
    until_at_zero(plane, ns, revision)
        .await
        .unwrap_or_else(|e| fail(e));
    until_status_at_zero(plane, ns, revision)
        .await
        .unwrap_or_else(|e| fail(e));

    let early_before = sc::activators_counter(plane, "thaw_activator_early_ready_pods_total")
        .await
        .unwrap();
    let reply = sc::request(gateway, &host, "/", &http::HeaderMap::new())
        .await
        .unwrap_or_else(|e| fail(e));
    let answered = Timestamp::now();
    // Read right after the answer: the pod as the API server has it now.
    let pods = revision_pods(plane, ns, revision).await;
    assert_eq!(
        (reply.status, reply.body.trim()),
        (200, "Hello from early!"),
        "{reply:?}"
    );
    let timing = reply.server_timing();
    assert!(timing.starts_with("cold-start;dur="), "{:?}", reply.headers);
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(live.len(), 1, "the woken pod: {pods:?}");
    let pod = live[0].metadata.name.clone().unwrap();
    let ready_then = pod_condition(live[0], "Ready");
    assert!(
        ready_then.as_ref().is_none_or(|c| c.status != "True"),
        "answered only once the kubelet had marked {pod} ready: {ready_then:?}"
    );
    let early_after = sc::activators_counter(plane, "thaw_activator_early_ready_pods_total")
        .await
        .unwrap();
    assert!(
        early_after > early_before,
        "no activator counted a pod sent to before the kubelet marked it ready \
         ({early_before} -> {early_after})"
    );

    // The kubelet marks it Ready later, at its first probe after the initial delay.
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let (api, pod) = (&api, pod.as_str());
    let (started, ready_at) = until(SETTLE, &format!("{pod} marked Ready"), move || async move {
        let p = api.get(pod).await.map_err(|e| e.to_string())?;
        let ready = pod_condition(&p, "Ready").filter(|c| c.status == "True");
        let started = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone())
            .map(|t| t.0)
            .max();
        match (started, ready.and_then(|c| c.last_transition_time)) {
            (Some(s), Some(r)) => Ok((s, r.0)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| fail(e));
    assert!(
        // The API's times are whole seconds.
        ready_at >= answered - 1.second(),
        "Ready since {ready_at}, before the answer at {answered}"
    );
    println!(
        "{pod}: containers started {started} (API); answered 200 at {answered} \
         (Server-Timing: {timing}) while the API had Ready={}; the kubelet marked it \
         Ready at {ready_at} (API); activators' early-ready pods {early_before} -> {early_after}",
        ready_then.map_or("absent".into(), |c| format!(
            "{} {}",
            c.status,
            c.reason.unwrap_or_default()
        )),
    );
    let again = until_answers(gateway, &host, "early")
        .await
        .unwrap_or_else(|e| fail(e));
    assert_eq!(again.status, 200);
}

/// A Service's new template becomes a new Revision that takes the traffic once Ready; then a
/// traffic block splits it 80/20 between the two revisions with tags: the Route's status lists
/// both targets with their tag URLs, `v1-split.{ns}.example.com` and `v2-split...` answer
/// from their revisions through the gateway (`Hello from v1!` / `v2`), and the main host's
/// route sends 80 % and 20 % to exactly the destinations of those two tag routes (the
/// revision's public Service and its `Knative-Serving-Revision`). `kubectl get ksvc,route,rev`
/// prints Knative's columns filled as Knative fills them.
///
/// What is not shown: the split's proportions on the wire. The test's gateway pod sends every
/// request to a route's first weighted destination, and a request straight to an activator
/// is routed by its Host alone (the activator believes routing headers only from the gateway
/// pods), which names two revisions here.
async fn a_new_revision_takes_the_traffic_then_tagged_revisions_split_it(
    plane: Arc<Plane>,
    ns: String,
) {
    let (plane, ns) = (&*plane, ns.as_str());
    let transitions = Transitions::start(plane, ns);
    let fail = |e: String| -> ! { panic!("{e}\nconditions:\n{}", transitions.lines()) };
    let host = format!("split.{ns}.example.com");
    let host = host.as_str();
    apply(plane, ns, "split", &helloworld("split", "v1", &[], ""))
        .await
        .unwrap();
    service_ready(plane, ns, "split")
        .await
        .unwrap_or_else(|e| fail(e));
    let gateway = gateway(plane).await;
    until_answers(gateway, host, "v1")
        .await
        .unwrap_or_else(|e| fail(e));

    // A new template: split-00002 becomes Ready and takes all the traffic.
    apply(plane, ns, "split", &helloworld("split", "v2", &[], ""))
        .await
        .unwrap();
    let svc = service_ready(plane, ns, "split")
        .await
        .unwrap_or_else(|e| fail(e));
    assert_eq!(svc["status"]["latestCreatedRevisionName"], "split-00002");
    assert_eq!(svc["status"]["latestReadyRevisionName"], "split-00002");
    until_answers(gateway, host, "v2")
        .await
        .unwrap_or_else(|e| fail(e));
    let traffic = &svc["status"]["traffic"];
    assert_eq!(
        traffic,
        &json!([{"revisionName": "split-00002", "latestRevision": true, "percent": 100}]),
        "{svc:#}"
    );
    println!("split: split-00002 Ready and answering {host} (split-00001 no longer)");

    // 80/20 with tags.
    let traffic = "  traffic:\n    - revisionName: split-00001\n      percent: 80\n      tag: v1\n    - latestRevision: true\n      percent: 20\n      tag: v2\n";
    let yaml = format!("{}{traffic}", helloworld("split", "v2", &[], ""));
    apply(plane, ns, "split", &yaml).await.unwrap();
    let svc = service_ready(plane, ns, "split")
        .await
        .unwrap_or_else(|e| fail(e));
    let route = get_json(plane, ns, "routes", "split").await.unwrap();
    show("the Route split 80/20", &format!("{route:#}"));
    let url = |tag: &str| format!("http://{tag}-split.{ns}.example.com");
    assert_eq!(
        route["status"]["traffic"],
        json!([
            {"tag": "v1", "revisionName": "split-00001", "latestRevision": false,
             "percent": 80, "url": url("v1")},
            {"tag": "v2", "revisionName": "split-00002", "latestRevision": true,
             "percent": 20, "url": url("v2")},
        ]),
        "{route:#}"
    );
    assert_eq!(svc["status"]["traffic"], route["status"]["traffic"]);
    for (tag, who) in [("v1", "v1"), ("v2", "v2")] {
        let tagged = format!("{tag}-split.{ns}.example.com");
        until_answers(gateway, &tagged, who)
            .await
            .unwrap_or_else(|e| fail(e));
        println!("split: {tagged} answers \"Hello from {who}!\"");
    }
    // The main host's route: the two weighted destinations, each the revision's public
    // Service with its revision header; each the same destination as its tag's route, whose
    // host answered from that revision above.
    let main = sc::external_route(plane, ns, host)
        .await
        .unwrap_or_else(|e| fail(e));
    let mut split = destinations(&main);
    split.sort_by(|a, b| a.3.cmp(&b.3));
    let public = |rev: &str| format!("{rev}.{ns}.svc.cluster.local");
    assert_eq!(
        split
            .iter()
            .map(|(w, h, _, r)| (*w, h.as_str(), r.as_str()))
            .collect::<Vec<_>>(),
        [
            (80, public("split-00001").as_str(), "split-00001"),
            (20, public("split-00002").as_str(), "split-00002")
        ],
        "{main:#?}"
    );
    for (tag, (_, dest_host, port, rev)) in ["v1", "v2"].into_iter().zip(&split) {
        let tagged = format!("{tag}-split.{ns}.example.com");
        let route = sc::external_route(plane, ns, &tagged)
            .await
            .unwrap_or_else(|e| fail(e));
        let one = destinations(&route);
        assert_eq!(
            one,
            [(100, dest_host.clone(), *port, rev.clone())],
            "{tagged}'s route is not the {rev} share's destination: {route:#?}"
        );
        let endpoints = thaw::controller::route::prober::service_pods(
            &plane.admin,
            dest_host,
            i32::try_from(*port).unwrap(),
        )
        .await
        .unwrap();
        assert!(!endpoints.is_empty(), "{dest_host} has no ready endpoint");
    }
    for (tag, (weight, dest_host, port, rev)) in ["v1", "v2"].into_iter().zip(&split) {
        println!(
            "split: {host} -> {weight}% to {dest_host}:{port} (Knative-Serving-Revision: {rev}), \
             the destination of {tag}-split's route"
        );
    }
    // On the wire: 200 requests to the main host, each split by weight at the gateway pod
    // (Envoy's weighted clusters draw per request). v2's count is binomial(200, 0.2): mean
    // 40, deviation 5.7; the bounds are 6 deviations off (a wrong split, 50/50 or all to one
    // side, lands far outside; a right one outside them about once in 10^9 runs).
    let mut answered = BTreeMap::<String, u32>::new();
    for _ in 0..200 {
        let through = sc::request(gateway, host, "/", &http::HeaderMap::new())
            .await
            .unwrap();
        assert_eq!(through.status, 200, "{through:?}");
        *answered.entry(through.body.trim().to_string()).or_default() += 1;
    }
    println!("split: 200 requests to {host}: {answered:?}");
    let v1 = answered.get("Hello from v1!").copied().unwrap_or(0);
    let v2 = answered.get("Hello from v2!").copied().unwrap_or(0);
    assert_eq!(v1 + v2, 200, "answers from neither revision: {answered:?}");
    assert!((6..=74).contains(&v2), "not 80/20: {answered:?}");

    // Knative's printer columns, filled as Knative fills them: every one but REASON, which
    // Knative leaves empty on a Ready object.
    let out = plane
        .kubectl(&["-n", ns, "get", "ksvc,route,rev"])
        .await
        .unwrap();
    println!("kubectl get ksvc,route,rev:\n{out}");
    let tables = sc::tables(&out);
    let table = |kind: &str| {
        tables
            .iter()
            .find(|t| {
                t.rows
                    .first()
                    .is_some_and(|r| r["NAME"].starts_with(&format!("{kind}/")))
            })
            .unwrap_or_else(|| panic!("no {kind} table in:\n{out}"))
    };
    let filled = |v: &str| !v.is_empty() && v != "<none>";
    let ksvc = table("service.serving.knative.dev");
    assert_eq!(
        ksvc.columns,
        [
            "NAME",
            "URL",
            "LATESTCREATED",
            "LATESTREADY",
            "READY",
            "REASON"
        ],
        "{out}"
    );
    let row = &ksvc.rows[0];
    assert_eq!(row["URL"], format!("http://{host}"));
    assert_eq!(row["LATESTCREATED"], "split-00002");
    assert_eq!(row["LATESTREADY"], "split-00002");
    assert_eq!(row["READY"], "True");
    assert!(!filled(&row["REASON"]), "{out}");
    let rt = table("route.serving.knative.dev");
    assert_eq!(rt.columns, ["NAME", "URL", "READY", "REASON"], "{out}");
    assert_eq!(rt.rows[0]["URL"], format!("http://{host}"));
    assert_eq!(rt.rows[0]["READY"], "True");
    assert!(!filled(&rt.rows[0]["REASON"]), "{out}");
    let rev = table("revision.serving.knative.dev");
    assert_eq!(
        rev.columns,
        [
            "NAME",
            "CONFIG NAME",
            "GENERATION",
            "READY",
            "REASON",
            "ACTUAL REPLICAS",
            "DESIRED REPLICAS"
        ],
        "{out}"
    );
    assert_eq!(rev.rows.len(), 2, "{out}");
    for (row, generation) in rev.rows.iter().zip(["1", "2"]) {
        assert_eq!(row["CONFIG NAME"], "split", "{out}");
        assert_eq!(row["GENERATION"], generation, "{out}");
        assert_eq!(row["READY"], "True", "{out}");
        assert!(!filled(&row["REASON"]), "{out}");
        for c in ["ACTUAL REPLICAS", "DESIRED REPLICAS"] {
            assert!(row[c].parse::<u32>().is_ok(), "{c} not filled:\n{out}");
        }
    }
}

/// A route's weighted destinations: (weight, Service host, port, the `Knative-Serving-Revision`
/// it sets).
fn destinations(route: &HttpRoute) -> Vec<(i32, String, u32, String)> {
    route
        .route
        .iter()
        .filter(|d| d.weight.unwrap_or(0) > 0)
        .map(|d| {
            let revision = d
                .headers
                .iter()
                .filter_map(|h| h.request.as_ref())
                .flat_map(|ops| &ops.set)
                .find(|(n, _)| n.eq_ignore_ascii_case("knative-serving-revision"))
                .map_or(String::new(), |(_, v)| v.clone());
            (
                d.weight.unwrap_or(0),
                d.destination.host.clone(),
                d.destination.port.as_ref().map_or(80, |p| p.number),
                revision,
            )
        })
        .collect()
}

/// Named values of a Revision's status.
type Fields = Vec<(String, Value)>;

/// What each writer of a Revision's status owns there: the autoscaler's fields and the
/// controller's, as (field, value) lists compared between versions.
fn writers_fields(r: &Value) -> (Fields, Fields) {
    let st = &r["status"];
    let cond = |t: &str| {
        condition(r, t).map_or(
            Value::Null,
            |c| json!({"status": c["status"], "reason": c["reason"], "message": c["message"]}),
        )
    };
    let autoscaler = vec![
        ("actualReplicas".into(), st["actualReplicas"].clone()),
        ("desiredReplicas".into(), st["desiredReplicas"].clone()),
        ("Active".into(), cond("Active")),
        (
            "ScaleTargetInitialized".into(),
            cond("ScaleTargetInitialized"),
        ),
    ];
    let controller = vec![
        (
            "observedGeneration".into(),
            st["observedGeneration"].clone(),
        ),
        ("Ready".into(), cond("Ready")),
        ("ResourcesAvailable".into(), cond("ResourcesAvailable")),
        ("ContainerHealthy".into(), cond("ContainerHealthy")),
    ];
    (autoscaler, controller)
}

/// Alternations of the revision's min-scale annotation (each a write of each writer).
const TOGGLES: usize = 50;

/// The Revision's status has two writers (docs/decisions.md, "Kubernetes roles" table): the
/// controller writes its conditions (`Ready`, `ResourcesAvailable`, `ContainerHealthy`) and
/// `observedGeneration`; the autoscaler `actualReplicas`, `desiredReplicas`, `Active` and
/// `ScaleTargetInitialized`; each by a read-modify-PUT of `/status` carrying the
/// resourceVersion read, keeping the other's fields. Here each writer is made to write in
/// turn, 50 times each: the namespace's ResourceQuota allows one pod, and the Revision's
/// `autoscaling.knative.dev/min-scale` alternates between 2 and 1. At 2 the autoscaler writes
/// `desiredReplicas: 2`; the annotation is also in the pod template (Knative copies a
/// revision's annotations there), so the Deployment rolls to a new ReplicaSet as it scales to
/// 2, quota admission refuses every new pod, the Deployment reports `ReplicaFailure` and the
/// controller writes `ResourcesAvailable=False FailedCreate`. At 1 the autoscaler writes
/// `desiredReplicas: 1`, the template is the first one again, the Deployment is back on the
/// first ReplicaSet (its pod never stopped) and the controller writes
/// `ResourcesAvailable=True`. Every version of the status the API server served (a watch)
/// must hold both writers' fields, and no version may change both writers' fields at once
/// (what a write built on a stale read, or one dropping the other's fields, would do); the
/// audit log counts the writes and their alternation.
async fn the_revision_status_keeps_both_writers_fields_across_100_writes(
    plane: Arc<Plane>,
    ns: String,
) {
    let (plane, ns) = (&*plane, ns.as_str());
    let transitions = Transitions::start(plane, ns);
    let fail = |e: String| -> ! { panic!("{e}\nconditions:\n{}", transitions.lines()) };
    let quota = "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: one-pod\nspec:\n  hard:\n    pods: \"1\"\n";
    apply(plane, ns, "quota", quota).await.unwrap();
    // Quota admission refuses every pod until the quota controller has counted the usage.
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(plane.admin.clone(), ns);
    let quotas = &quotas;
    until(SETTLE, "the ResourceQuota counted", move || async move {
        let q = quotas.get("one-pod").await.map_err(|e| e.to_string())?;
        q.status
            .and_then(|s| s.used)
            .filter(|u| u.contains_key("pods"))
            .map(|_| ())
            .ok_or_else(|| "no status.used yet".to_string())
    })
    .await
    .unwrap_or_else(|e| fail(e));
    let yaml = helloworld(
        "writers",
        "writers",
        &[r#"autoscaling.knative.dev/min-scale: "1""#],
        "",
    );
    apply(plane, ns, "writers", &yaml).await.unwrap();
    service_ready(plane, ns, "writers")
        .await
        .unwrap_or_else(|e| fail(e));
    let revision = "writers-00001";
    // Ready is the controller's word; the autoscaler's ScaleTargetInitialized may follow it by
    // a write of its own. The check below starts once both writers have written everything.
    until(SETTLE, "both writers' fields written", move || async move {
        let r = get_json(plane, ns, "revisions", revision).await?;
        let (a, c) = writers_fields(&r);
        let missing: Vec<String> = a
            .iter()
            .chain(&c)
            .filter(|(_, x)| x.is_null())
            .map(|(k, _)| k.clone())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing {missing:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| fail(e));

    // Every version of the Revision from now on.
    let versions: Arc<Mutex<Vec<Value>>> = Arc::default();
    let watch = {
        let api = knative(plane, ns, "revisions");
        let versions = versions.clone();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={revision}"));
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
            while let Some(e) = events.next().await {
                match e {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        versions
                            .lock()
                            .unwrap()
                            .push(serde_json::to_value(&o).unwrap());
                    }
                    // A re-list: the versions before it are not the ones just before the next.
                    Ok(watcher::Event::Init) => versions.lock().unwrap().push(Value::Null),
                    _ => {}
                }
            }
        })
    };
    let began = Timestamp::now();
    let revisions = knative(plane, ns, "revisions");
    for i in 0..TOGGLES {
        let want = if i % 2 == 0 { 2 } else { 1 };
        let patch = json!({"metadata": {"annotations": {
            "autoscaling.knative.dev/min-scale": want.to_string()}}});
        revisions
            .patch(revision, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let resources = if want == 2 {
            "False FailedCreate"
        } else {
            "True"
        };
        until(
            SETTLE,
            &format!("toggle {i}: both writers' answer to min-scale {want}"),
            move || async move {
                let r = get_json(plane, ns, "revisions", revision).await?;
                let st = &r["status"];
                let seen = format!(
                    "desired {} actual {} Active {} ResourcesAvailable {} Ready {}",
                    st["desiredReplicas"],
                    st["actualReplicas"],
                    cond_status(&r, "Active"),
                    cond_status(&r, "ResourcesAvailable"),
                    cond_status(&r, "Ready"),
                );
                let done = st["desiredReplicas"] == want
                    && st["actualReplicas"] == 1
                    && cond_status(&r, "Active") == "True"
                    && cond_status(&r, "ResourcesAvailable") == resources;
                if done { Ok(()) } else { Err(seen) }
            },
        )
        .await
        .unwrap_or_else(|e| fail(e));
    }
    let ended = Timestamp::now();
    // The watch has every version up to the last one read.
    let watched = &versions;
    until(
        SETTLE,
        "the watch at the last version",
        move || async move {
            let last = get_json(plane, ns, "revisions", revision).await?;
            let rv = &last["metadata"]["resourceVersion"];
            let seen = watched.lock().unwrap().last().cloned().unwrap_or_default();
            if &seen["metadata"]["resourceVersion"] == rv {
                Ok(())
            } else {
                Err(format!(
                    "watch at {}, server at {rv}",
                    seen["metadata"]["resourceVersion"]
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| fail(e));
    watch.abort();
    let versions = versions.lock().unwrap().clone();

    // Every version holds both writers' fields; none changes both at once.
    let mut previous: Option<&Value> = None;
    let mut status_versions = 0;
    for v in &versions {
        if v.is_null() {
            previous = None;
            continue;
        }
        let (a, c) = writers_fields(v);
        let missing: Vec<&String> = a
            .iter()
            .chain(&c)
            .filter(|(_, x)| x.is_null())
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty(),
            "resourceVersion {} lacks {missing:?}: a writer dropped the other's fields\n{:#}",
            v["metadata"]["resourceVersion"],
            v["status"]
        );
        if let Some(p) = previous {
            let (pa, pc) = writers_fields(p);
            let changed = |x: &[(String, Value)], y: &[(String, Value)]| {
                x.iter()
                    .zip(y)
                    .filter(|(a, b)| a.1 != b.1)
                    .map(|(a, _)| a.0.clone())
                    .collect::<Vec<_>>()
            };
            let (ca, cc) = (changed(&pa, &a), changed(&pc, &c));
            assert!(
                ca.is_empty() || cc.is_empty(),
                "resourceVersion {} changed the autoscaler's {ca:?} and the controller's {cc:?} \
                 at once: one writer wrote the other's fields\nbefore: {:#}\nafter: {:#}",
                v["metadata"]["resourceVersion"],
                p["status"],
                v["status"]
            );
            if !ca.is_empty() || !cc.is_empty() {
                status_versions += 1;
            }
        }
        previous = Some(v);
    }

    // The writes, as the API server's audit log has them.
    let writes: Vec<sc::StatusWrite> = sc::status_writes(plane, ns, "revisions", revision)
        .into_iter()
        .filter(|w| w.at >= began && w.at <= ended + 1.seconds())
        .collect();
    let ok: Vec<&sc::StatusWrite> = writes.iter().filter(|w| w.code == 200).collect();
    let by = |who: &str| ok.iter().filter(|w| w.writer == who).count();
    let alternations = ok.windows(2).filter(|w| w[0].writer != w[1].writer).count();
    let refused: BTreeMap<u16, usize> =
        writes
            .iter()
            .filter(|w| w.code != 200)
            .fold(BTreeMap::new(), |mut m, w| {
                *m.entry(w.code).or_default() += 1;
                m
            });
    let others: Vec<&&sc::StatusWrite> = ok
        .iter()
        .filter(|w| w.writer != "autoscaler" && w.writer != "controller")
        .collect();
    println!(
        "{revision}: {} status writes in {TOGGLES} toggles ({} by the autoscaler, {} by the \
         controller, the writer changing {alternations} times; refused: {refused:?}); {} \
         versions watched, {status_versions} of them changing the status, each with both \
         writers' fields",
        ok.len(),
        by("autoscaler"),
        by("controller"),
        versions.iter().filter(|v| !v.is_null()).count(),
    );
    assert!(others.is_empty(), "status written by others: {others:?}");
    assert!(
        ok.len() >= 2 * TOGGLES && by("autoscaler") >= TOGGLES && by("controller") >= TOGGLES,
        "fewer writes than toggles: {ok:?}"
    );
    assert!(
        alternations >= TOGGLES,
        "the writes did not alternate: {:?}",
        ok.iter().map(|w| w.writer.as_str()).collect::<Vec<_>>()
    );
    assert!(
        status_versions >= 2 * TOGGLES,
        "the watch saw {status_versions} status changes for {} writes",
        ok.len()
    );
    let denied = checks::denials(plane);
    assert!(
        denied.is_empty(),
        "RBAC denied thaw's roles:\n{}",
        denied.join("\n")
    );
}
