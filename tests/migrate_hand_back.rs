//! The way back (`thaw migrate hand-back`) against the in-process API server: thaw's own
//! reconcilers leave a Revision's Deployment and Services and a Route's VirtualServices and
//! placeholder Service as they leave them on a cluster (the test plays thaw's autoscaler's
//! EndpointSlice of the public Service, and writes an HTTPRoute and an HPA as thaw's Gateway
//! API class and an HPA-class revision would), and are stopped; then the test plays Knative's
//! reconcilers as v1.15 creates its objects (the PodAutoscaler controlled by the Revision, the
//! ServerlessService by the PodAutoscaler, the KIngress by the Route, later the
//! ServerlessService's public Endpoints). Shown: the hand-back refuses to run beside thaw;
//! waits while Knative's parents are missing; lists without writing in a dry run; re-owns
//! every child along the chain, by UID, with the same objects (UIDs unchanged, nothing that
//! serves deleted); deletes thaw's slices only once Knative's Endpoints serve the Service;
//! leaves a forged chain alone; and does nothing more when run again. The API server double
//! runs no garbage collector: ownership is shown by the ownerReferences themselves.

mod controller_support;
mod kube_support;

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use thaw::config::DeploymentConfig;
use thaw::controller::adopt::hand_back::{self, HandBackError, Options, Outcome, Verdict};
use thaw::controller::apply::APPLIED_ANNOTATION;
use thaw::controller::route::http_route::HTTPRoute;
use thaw::controller::route::virtual_service::VirtualService;
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::duck::ConditionStatus;
use thaw::knative::names::labels;
use thaw::knative::{Revision, Route, RouteSpec, TrafficTarget, condition};

use controller_support::wait_for;
use kube_support::TestApi;

const NS: &str = "default";
/// Where the forged chain lives (its own namespace, so the main flow's verdict is its own).
const FORGED_NS: &str = "forged";
const REV: &str = "hello-00001";
const THAW_NS: &str = "thaw-system";

fn knative_kind(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1alpha1".into(),
        api_version: format!("{group}/v1alpha1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}
fn pa_kind() -> ApiResource {
    knative_kind(
        "autoscaling.internal.knative.dev",
        "PodAutoscaler",
        "podautoscalers",
    )
}
fn sks_kind() -> ApiResource {
    knative_kind(
        "networking.internal.knative.dev",
        "ServerlessService",
        "serverlessservices",
    )
}
fn king_kind() -> ApiResource {
    knative_kind("networking.internal.knative.dev", "Ingress", "ingresses")
}

/// A controller owner reference as `kmeta.NewControllerRef` writes it.
fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}])
}

fn controller_of(meta: &ObjectMeta) -> Option<(String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.clone(), o.uid.clone()))
}

async fn create<K>(client: &kube::Client, ns: &str, v: Value) -> K
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).unwrap();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap()
}

async fn create_dynamic(client: &kube::Client, ns: &str, ar: &ApiResource, v: Value) -> String {
    let mut obj: DynamicObject = serde_json::from_value(v).unwrap();
    obj.types = Some(kube::api::TypeMeta {
        api_version: ar.api_version.clone(),
        kind: ar.kind.clone(),
    });
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, ar)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap()
        .uid()
        .unwrap()
}

fn revision(name: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {"name": name, "namespace": ns,
            "labels": {labels::CONFIGURATION: "hello", labels::SERVICE: "hello",
                labels::CONFIGURATION_GENERATION: "1"}},
        "spec": {"containerConcurrency": 0, "timeoutSeconds": 300,
            "containers": [{"image": "ghcr.io/knative/helloworld-go:latest",
                "ports": [{"name": "http1", "containerPort": 8080}]}]},
    })
}

fn options(ns: Option<&str>, dry_run: bool) -> Options {
    Options {
        dry_run,
        namespace: ns.map(str::to_string),
        thaw_namespace: THAW_NS.into(),
    }
}

async fn hand_back(client: &kube::Client, ns: Option<&str>, dry_run: bool) -> hand_back::Report {
    let report = hand_back::run(client, &options(ns, dry_run)).await.unwrap();
    for l in &report.lines {
        println!("{l}");
    }
    println!("-> {:?}", report.verdict());
    report
}

/// The outcome of `kind name` in `report`.
fn outcome<'a>(report: &'a hand_back::Report, kind: &str, name: &str) -> &'a Outcome {
    &report
        .lines
        .iter()
        .find(|l| l.kind == kind && l.name == name)
        .unwrap_or_else(|| panic!("no line for {kind} {name}: {:#?}", report.lines))
        .outcome
}

/// What thaw leaves: its revision and route reconcilers run on `REV` and route `hello` until
/// the route's VirtualServices exist, then stop. Returns the Revision and the Route.
async fn thaw_leaves(client: &kube::Client) -> (Revision, Route) {
    let settings = Settings {
        deployment: DeploymentConfig {
            queue_sidecar_image: "registry.example/thaw:test".into(),
            ..DeploymentConfig::default()
        },
        ..Settings::default()
    };
    let ctx: Arc<Ctx> = Ctx::with_options(
        client.clone(),
        settings,
        CtxOptions {
            namespace: Some(NS.into()),
            ..CtxOptions::default()
        },
    );
    let revisions = tokio::spawn(thaw::controller::revision::controller(ctx.clone()));
    let rev: Revision = create(client, NS, revision(REV, NS)).await;
    // Playing thaw's autoscaler: the public Service's slice, the pods in the path.
    let _: EndpointSlice = create(
        client,
        NS,
        json!({"metadata": {"name": format!("{REV}-pods"), "namespace": NS,
            "labels": {labels::ENDPOINTSLICE_SERVICE_NAME: REV,
                labels::ENDPOINTSLICE_MANAGED_BY: labels::MANAGED_BY_AUTOSCALER}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.9"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}]}),
    )
    .await;
    controller_support::mark_deployment_ready(&Api::namespaced(client.clone(), NS), REV).await;
    let revs: Api<Revision> = Api::namespaced(client.clone(), NS);
    wait_for(
        "the revision Ready under thaw",
        || async { revs.get(REV).await.unwrap() },
        |r| {
            r.status
                .as_ref()
                .and_then(|s| s.status.condition(condition::READY))
                .is_some_and(|c| c.status == ConditionStatus::True)
        },
    )
    .await;
    let routes = tokio::spawn(thaw::controller::route::controller(ctx));
    let mut r = Route::new(
        "hello",
        RouteSpec {
            traffic: vec![TrafficTarget {
                revision_name: Some(REV.into()),
                percent: Some(100),
                ..TrafficTarget::default()
            }],
        },
    );
    r.metadata.namespace = Some(NS.into());
    let route = Api::<Route>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    let vss: Api<VirtualService> = Api::namespaced(client.clone(), NS);
    for name in ["hello-ingress", "hello-mesh"] {
        wait_for(
            &format!("thaw's VirtualService {name}"),
            || async { vss.get_opt(name).await.unwrap() },
            Option::is_some,
        )
        .await;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    wait_for(
        "thaw's placeholder Service",
        || async { services.get_opt("hello").await.unwrap() },
        Option::is_some,
    )
    .await;
    // thaw stopped.
    revisions.abort();
    routes.abort();
    let _ = revisions.await;
    let _ = routes.await;
    (rev, route)
}

/// The UIDs of what serves: the two Services, the Deployment, both VirtualServices and the
/// placeholder Service.
async fn serving_uids(client: &kube::Client) -> Vec<(String, String)> {
    let svc: Api<Service> = Api::namespaced(client.clone(), NS);
    let dep: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let vs: Api<VirtualService> = Api::namespaced(client.clone(), NS);
    let mut out = Vec::new();
    for n in [REV.to_string(), format!("{REV}-private"), "hello".into()] {
        out.push((n.clone(), svc.get(&n).await.unwrap().uid().unwrap()));
    }
    let d = format!("{REV}-deployment");
    out.push((d.clone(), dep.get(&d).await.unwrap().uid().unwrap()));
    for n in ["hello-ingress", "hello-mesh"] {
        out.push((n.into(), vs.get(n).await.unwrap().uid().unwrap()));
    }
    out
}

/// thaw's objects of a revision in [`FORGED_NS`] (its Service controlled by the Revision) and
/// a PodAutoscaler and ServerlessService of its name whose chain leads to another revision.
async fn forged(client: &kube::Client) -> String {
    let rev: Revision = create(client, FORGED_NS, revision(REV, FORGED_NS)).await;
    let rev_uid = rev.uid().unwrap();
    let svc: Service = create(
        client,
        FORGED_NS,
        json!({"metadata": {"name": REV, "namespace": FORGED_NS,
            "labels": {labels::REVISION: REV, labels::SERVICE_TYPE: "Public"},
            "annotations": {APPLIED_ANNOTATION: "h"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV, &rev_uid)},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8012}]}}),
    )
    .await;
    let pa = create_dynamic(
        client,
        FORGED_NS,
        &pa_kind(),
        json!({"metadata": {"name": REV, "namespace": FORGED_NS,
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV,
                "9d0c3f0e-0000-4000-8000-000000000000")},
            "spec": {"protocolType": "http1"}}),
    )
    .await;
    create_dynamic(
        client,
        FORGED_NS,
        &sks_kind(),
        json!({"metadata": {"name": REV, "namespace": FORGED_NS,
            "ownerReferences": controller_ref(
                "autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler", REV, &pa)},
            "spec": {"mode": "Serve", "protocolType": "http1"}}),
    )
    .await;
    svc.uid().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thaws_children_go_back_to_knative_along_the_chain() {
    let api = TestApi::start().await;
    let client = api.client();
    let (rev, route) = thaw_leaves(&client).await;
    let rev_uid = rev.uid().unwrap();
    let route_uid = route.uid().unwrap();
    // What thaw's Gateway API class and an HPA-class revision would leave beside them: an
    // HTTPRoute (named for the host) controlled by the Route, an HPA controlled by the Revision.
    let host = "hello.default.example.com";
    let http_route: HTTPRoute = create(
        &client,
        NS,
        json!({"metadata": {"name": host, "namespace": NS,
            "labels": {labels::ROUTE: "hello"}, "annotations": {APPLIED_ANNOTATION: "h"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Route", "hello", &route_uid)},
            "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                "name": "knative-gateway", "namespace": "istio-system"}],
                "hostnames": [host], "rules": []}}),
    )
    .await;
    let hpa: HorizontalPodAutoscaler = create(
        &client,
        NS,
        json!({"metadata": {"name": REV, "namespace": NS,
            "labels": {labels::REVISION: REV}, "annotations": {APPLIED_ANNOTATION: "h"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV, &rev_uid)},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                "name": format!("{REV}-deployment")}, "maxReplicas": 3}}),
    )
    .await;
    let before = serving_uids(&client).await;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let vss: Api<VirtualService> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    // As thaw leaves them: the Revision's and the Route's, with thaw's applied-hash.
    let public = services.get(REV).await.unwrap();
    assert_eq!(
        controller_of(&public.metadata),
        Some(("Revision".into(), rev_uid.clone()))
    );
    assert!(public.annotations().contains_key(APPLIED_ANNOTATION));

    // Refused beside thaw: its controller with replicas, then its webhook registered.
    let thaw_controller: Deployment = create(
        &client,
        THAW_NS,
        json!({"metadata": {"name": "controller", "namespace": THAW_NS},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "c"}},
                "template": {"metadata": {"labels": {"app": "c"}},
                    "spec": {"containers": [{"name": "c", "image": "thaw"}]}}}}),
    )
    .await;
    let err = hand_back::run(&client, &options(Some(NS), false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HandBackError::ThawRunning(m) if m.contains("thaw's controller runs")),
        "{err}"
    );
    let deps_thaw: Api<Deployment> = Api::namespaced(client.clone(), THAW_NS);
    deps_thaw
        .delete(&thaw_controller.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "thaw-webhook", "labels": {"app.kubernetes.io/part-of": "thaw"}},
        "webhooks": [{"name": "validation.webhook.serving.knative.dev",
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "thaw-webhook", "namespace": THAW_NS}}}]
    }))
    .unwrap();
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwcs.create(&PostParams::default(), &vwc).await.unwrap();
    let err = hand_back::run(&client, &options(Some(NS), false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HandBackError::ThawRunning(m) if m.contains("thaw-webhook")),
        "{err}"
    );
    vwcs.delete("thaw-webhook", &DeleteParams::default())
        .await
        .unwrap();

    // Knative's controller has not created its objects yet: everything waits, nothing moves.
    let report = hand_back(&client, Some(NS), false).await;
    assert_eq!(report.verdict(), Verdict::Waiting);
    for (kind, name) in [
        ("Service", REV),
        ("VirtualService", "hello-ingress"),
        ("EndpointSlice", &format!("{REV}-pods")),
    ] {
        assert!(
            matches!(outcome(&report, kind, name), Outcome::Waiting(_)),
            "{kind} {name}"
        );
    }
    assert_eq!(
        controller_of(&services.get(REV).await.unwrap().metadata),
        Some(("Revision".into(), rev_uid.clone()))
    );

    // Playing Knative's revision, KPA and route reconcilers: PA ← Revision, SKS ← PA,
    // KIngress ← Route.
    let pa_uid = create_dynamic(
        &client,
        NS,
        &pa_kind(),
        json!({"metadata": {"name": REV, "namespace": NS,
            "labels": {labels::REVISION: REV, labels::REVISION_UID: rev_uid},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV, &rev_uid)},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                "name": format!("{REV}-deployment")}, "protocolType": "http1"}}),
    )
    .await;
    let sks_uid = create_dynamic(
        &client,
        NS,
        &sks_kind(),
        json!({"metadata": {"name": REV, "namespace": NS,
            "labels": {labels::REVISION: REV, labels::REVISION_UID: rev_uid},
            "ownerReferences": controller_ref(
                "autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler", REV, &pa_uid)},
            "spec": {"mode": "Serve", "numActivators": 2, "protocolType": "http1",
                "objectRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": format!("{REV}-deployment")}}}),
    )
    .await;
    let king_uid = create_dynamic(
        &client,
        NS,
        &king_kind(),
        json!({"metadata": {"name": "hello", "namespace": NS,
            "labels": {labels::ROUTE: "hello", "serving.knative.dev/routeNamespace": NS},
            "finalizers": ["ingresses.networking.internal.knative.dev"],
            "annotations": {"networking.knative.dev/ingress.class": "istio.ingress.networking.knative.dev"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Route", "hello", &route_uid)},
            "spec": {"httpOption": "Enabled", "rules": []}}),
    )
    .await;

    // A dry run lists and writes nothing.
    let public_rv = services.get(REV).await.unwrap().resource_version();
    let report = hand_back(&client, Some(NS), true).await;
    assert!(report.lines.iter().all(|l| l.dry_run));
    assert!(
        report.lines[0].to_string().starts_with("would be "),
        "{}",
        report.lines[0]
    );
    assert_eq!(
        services.get(REV).await.unwrap().resource_version(),
        public_rv
    );

    // Re-owned along the chain; the slice waits for Knative's Endpoints.
    let report = hand_back(&client, Some(NS), false).await;
    assert_eq!(report.verdict(), Verdict::Waiting);
    assert_eq!(
        outcome(&report, "Service", REV),
        &Outcome::Reowned(format!(
            "Service {REV} ← ServerlessService {REV} ← PodAutoscaler {REV} ← Revision {REV}"
        ))
    );
    assert!(matches!(
        outcome(&report, "EndpointSlice", &format!("{REV}-pods")),
        Outcome::Waiting(_)
    ));
    for name in [REV.to_string(), format!("{REV}-private")] {
        let s = services.get(&name).await.unwrap();
        assert_eq!(
            controller_of(&s.metadata),
            Some(("ServerlessService".into(), sks_uid.clone())),
            "{name}"
        );
        assert_eq!(s.owner_references().len(), 1, "{name}");
        assert!(!s.annotations().contains_key(APPLIED_ANNOTATION), "{name}");
    }
    for name in ["hello-ingress", "hello-mesh"] {
        let vs = vss.get(name).await.unwrap();
        assert_eq!(
            controller_of(&vs.metadata),
            Some(("Ingress".into(), king_uid.clone())),
            "{name}"
        );
        assert!(!vs.annotations().contains_key(APPLIED_ANNOTATION), "{name}");
    }
    let hr = Api::<HTTPRoute>::namespaced(client.clone(), NS)
        .get(host)
        .await
        .unwrap();
    assert_eq!(hr.uid(), http_route.uid());
    assert_eq!(
        controller_of(&hr.metadata),
        Some(("Ingress".into(), king_uid.clone()))
    );
    let h = Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), NS)
        .get(REV)
        .await
        .unwrap();
    assert_eq!(h.uid(), hpa.uid());
    assert_eq!(
        controller_of(&h.metadata),
        Some(("PodAutoscaler".into(), pa_uid.clone()))
    );
    assert!(!h.annotations().contains_key(APPLIED_ANNOTATION));
    // Knative takes the Deployment and the placeholder Service as they are, without thaw's marks.
    let dep = deployments.get(&format!("{REV}-deployment")).await.unwrap();
    assert_eq!(
        controller_of(&dep.metadata),
        Some(("Revision".into(), rev_uid.clone()))
    );
    assert!(
        !dep.annotations()
            .keys()
            .chain(dep.labels().keys())
            .any(|k| k.starts_with(hand_back::THAW_MARK_PREFIX)),
        "{:?}",
        dep.metadata
    );
    let placeholder = services.get("hello").await.unwrap();
    assert_eq!(
        controller_of(&placeholder.metadata),
        Some(("Route".into(), route_uid.clone()))
    );
    assert!(!placeholder.annotations().contains_key(APPLIED_ANNOTATION));
    assert!(
        slices
            .get_opt(&format!("{REV}-pods"))
            .await
            .unwrap()
            .is_some()
    );

    // Playing Knative's SKS reconciler: the public Endpoints (Serve mode: the pods).
    let _: Endpoints = create(
        &client,
        NS,
        json!({"metadata": {"name": REV, "namespace": NS,
            "labels": {labels::REVISION: REV, labels::SERVICE_TYPE: "Public"},
            "ownerReferences": controller_ref(
                "networking.internal.knative.dev/v1alpha1", "ServerlessService", REV, &sks_uid)},
            "subsets": [{"addresses": [{"ip": "10.1.0.9"}],
                "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}]}]}),
    )
    .await;
    let report = hand_back(&client, Some(NS), false).await;
    assert_eq!(report.verdict(), Verdict::HandedBack);
    assert!(matches!(
        outcome(&report, "EndpointSlice", &format!("{REV}-pods")),
        Outcome::Deleted(_)
    ));
    assert!(
        slices
            .get_opt(&format!("{REV}-pods"))
            .await
            .unwrap()
            .is_none()
    );
    // Nothing that serves was deleted or re-created.
    assert_eq!(serving_uids(&client).await, before);

    // Idempotent: nothing left to do, nothing written.
    let rv = services.get(REV).await.unwrap().resource_version();
    let report = hand_back(&client, Some(NS), false).await;
    assert!(report.lines.is_empty(), "{:#?}", report.lines);
    assert_eq!(report.verdict(), Verdict::HandedBack);
    assert_eq!(services.get(REV).await.unwrap().resource_version(), rv);

    // A forged chain (the PodAutoscaler is another revision's) is refused and left alone.
    let forged_uid = forged(&client).await;
    let report = hand_back(&client, None, false).await;
    assert_eq!(report.verdict(), Verdict::Incomplete);
    let line = report
        .lines
        .iter()
        .find(|l| l.namespace == FORGED_NS && l.kind == "Service")
        .unwrap();
    assert!(
        matches!(&line.outcome, Outcome::Refused(m) if m.contains("not by this Revision")),
        "{line}"
    );
    let svc = Api::<Service>::namespaced(client.clone(), FORGED_NS)
        .get(REV)
        .await
        .unwrap();
    assert_eq!(svc.uid().unwrap(), forged_uid);
    assert_eq!(controller_of(&svc.metadata).unwrap().0, "Revision");
    assert!(svc.annotations().contains_key(APPLIED_ANNOTATION));
    api.stop().await;
}

/// Runs the `thaw` binary with `KUBECONFIG` at `kubeconfig`: (exit code, stdout, stderr).
async fn thaw_cli(args: &[&str], kubeconfig: &std::path::Path) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let k = kubeconfig.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
            .args(&args)
            .env("KUBECONFIG", &k)
            .output()
            .expect("run thaw");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    })
    .await
    .unwrap()
}

/// The command line: exit 3 while a child waits for its Knative parent, 1 beside a running
/// thaw, 0 once handed back; one line per object on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_says_by_its_exit_code_whether_everything_was_handed_back() {
    let api = TestApi::start().await;
    let client = api.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    kube_support::write_kubeconfig(&kubeconfig, api.addr(), NS);
    let rev: Revision = create(&client, NS, revision(REV, NS)).await;
    let rev_uid = rev.uid().unwrap();
    // thaw's private Service of the revision, as its controller writes it.
    let svc: Service = create(
        &client,
        NS,
        json!({"metadata": {"name": format!("{REV}-private"), "namespace": NS,
            "labels": {labels::REVISION: REV, labels::SERVICE_TYPE: "Private"},
            "annotations": {APPLIED_ANNOTATION: "h"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV, &rev_uid)},
            "spec": {"selector": {labels::REVISION_UID: rev_uid},
                "ports": [{"name": "http", "port": 80, "targetPort": 8012}]}}),
    )
    .await;

    let (code, out, err) = thaw_cli(&["migrate", "hand-back"], &kubeconfig).await;
    assert_eq!(code, 3, "{out}{err}");
    assert_eq!(
        out,
        format!(
            "waiting Service {NS}/{REV}-private: ServerlessService {REV} does not exist yet \
             (Knative's controller creates it)\n"
        )
    );
    assert!(err.contains("run it again"), "{err}");

    let _: Deployment = create(
        &client,
        THAW_NS,
        json!({"metadata": {"name": "autoscaler", "namespace": THAW_NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "a"}},
                "template": {"metadata": {"labels": {"app": "a"}},
                    "spec": {"containers": [{"name": "a", "image": "thaw"}]}}}}),
    )
    .await;
    let (code, out, err) = thaw_cli(&["migrate", "hand-back"], &kubeconfig).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("thaw's autoscaler runs"), "{err}");
    Api::<Deployment>::namespaced(client.clone(), THAW_NS)
        .delete("autoscaler", &DeleteParams::default())
        .await
        .unwrap();

    let pa = create_dynamic(
        &client,
        NS,
        &pa_kind(),
        json!({"metadata": {"name": REV, "namespace": NS,
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", REV, &rev_uid)},
            "spec": {"protocolType": "http1"}}),
    )
    .await;
    let sks = create_dynamic(
        &client,
        NS,
        &sks_kind(),
        json!({"metadata": {"name": REV, "namespace": NS,
            "ownerReferences": controller_ref(
                "autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler", REV, &pa)},
            "spec": {"mode": "Serve", "protocolType": "http1"}}),
    )
    .await;
    let (code, out, err) = thaw_cli(&["migrate", "hand-back", "--dry-run"], &kubeconfig).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("would be re-owned Service"), "{out}");
    let (code, out, err) = thaw_cli(&["migrate", "hand-back"], &kubeconfig).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("re-owned Service"), "{out}");
    let found = Api::<Service>::namespaced(client.clone(), NS)
        .get(&format!("{REV}-private"))
        .await
        .unwrap();
    assert_eq!(found.uid(), svc.uid());
    assert_eq!(
        controller_of(&found.metadata),
        Some(("ServerlessService".into(), sks))
    );
    let (code, out, _) = thaw_cli(&["migrate", "hand-back"], &kubeconfig).await;
    assert_eq!((code, out.as_str()), (0, ""));
    api.stop().await;
}
