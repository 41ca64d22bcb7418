//! Adoption in place (`thaw controller --adopt-knative`) against the in-process API server:
//! the test writes Knative Serving's objects as Knative v1.15's reconcilers leave them (a
//! Revision's PodAutoscaler, ServerlessService, public and private Services, the public
//! Service's hand-written Endpoints and its Deployment with queue-proxy; a Route's KIngress
//! with its finalizer, net-istio's two VirtualServices, a networking Certificate, and the
//! labeler's finalizer on the Route), then runs thaw's reconcilers. Shown: the objects that
//! serve (Services, VirtualServices, the Deployment) keep their UIDs, end owned by the Revision
//! or Route, and the Deployment keeps Knative's template until released; Knative's internal
//! objects go once thaw serves; a chain that does not lead to the parent by UID stays
//! `NotOwned`, as does everything without the switch. The API server double runs no garbage
//! collector: what the tests show of ownership is the ownerReferences themselves.

mod controller_support;
mod kube_support;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use thaw::config::DeploymentConfig;
use thaw::config::network::IngressClass;
use thaw::controller::adopt::{RELEASE_TEMPLATE_ANNOTATION, TEMPLATE_HELD_LABEL};
use thaw::controller::route::http_route::HTTPRoute;
use thaw::controller::route::virtual_service::VirtualService;
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::duck::{Condition, ConditionStatus};
use thaw::knative::names::labels;
use thaw::knative::{Revision, Route, RouteSpec, TrafficTarget, condition};
use tokio::task::JoinHandle;

use controller_support::wait_for;
use kube_support::TestApi;

const NS: &str = "default";
/// thaw's sidecar image in these tests.
const IMAGE: &str = "registry.example/thaw:test";
/// Knative's queue-proxy image, as its Deployment carries it.
const KNATIVE_QUEUE: &str = "gcr.io/knative-releases/knative.dev/serving/cmd/queue@sha256:0";
const REV: &str = "hello-00001";

/// One of Knative's internal kinds, for the test's own writes.
fn kind(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1alpha1".into(),
        api_version: format!("{group}/v1alpha1"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn pa_kind() -> ApiResource {
    kind(
        "autoscaling.internal.knative.dev",
        "PodAutoscaler",
        "podautoscalers",
    )
}
fn sks_kind() -> ApiResource {
    kind(
        "networking.internal.knative.dev",
        "ServerlessService",
        "serverlessservices",
    )
}
fn king_kind() -> ApiResource {
    kind("networking.internal.knative.dev", "Ingress", "ingresses")
}
fn kcert_kind() -> ApiResource {
    kind(
        "networking.internal.knative.dev",
        "Certificate",
        "certificates",
    )
}

/// A controller owner reference (`kmeta.NewControllerRef`).
fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}])
}

struct Running {
    _api: TestApi,
    client: kube::Client,
    tasks: Vec<JoinHandle<()>>,
    _gateway: Option<kube_support::gateway::TestGateway>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Running {
    async fn new() -> Self {
        let api = TestApi::start().await;
        let client = api.client();
        Self {
            _api: api,
            client,
            tasks: Vec::new(),
            _gateway: None,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    fn dynamic(&self, ar: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, ar)
    }

    fn ctx(&self, adopt: bool) -> Arc<Ctx> {
        let settings = Settings {
            deployment: DeploymentConfig {
                queue_sidecar_image: IMAGE.into(),
                ..DeploymentConfig::default()
            },
            ..Settings::default()
        };
        Ctx::with_options(
            self.client.clone(),
            settings,
            CtxOptions {
                namespace: Some(NS.into()),
                adopt,
                ..CtxOptions::default()
            },
        )
    }

    /// The Route controller with the Gateway API ingress class (the test plays the gateway's
    /// implementation: the HTTPRoutes' status).
    fn run_routes_gateway_api(&mut self) {
        let mut settings = Settings::default();
        settings.network.templates.ingress_class = IngressClass::GatewayApi;
        let ctx = Ctx::with_options(
            self.client.clone(),
            settings,
            CtxOptions {
                namespace: Some(NS.into()),
                adopt: true,
                ..CtxOptions::default()
            },
        );
        self.tasks
            .push(tokio::spawn(thaw::controller::route::controller(ctx)));
    }

    fn run_revisions(&mut self, adopt: bool) {
        let ctx = self.ctx(adopt);
        self.tasks
            .push(tokio::spawn(thaw::controller::revision::controller(ctx)));
    }

    async fn run_routes(&mut self, adopt: bool) {
        let ctx = self.ctx(adopt);
        self.tasks
            .push(tokio::spawn(thaw::controller::route::controller(ctx)));
        self._gateway = Some(kube_support::gateway::default_gateways(&self.client).await);
    }

    async fn create<K>(&self, v: Value) -> K
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let obj: K = serde_json::from_value(v).unwrap();
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap()
    }

    async fn create_dynamic(&self, ar: &ApiResource, v: Value) -> DynamicObject {
        let mut obj: DynamicObject = serde_json::from_value(v).unwrap();
        obj.types = Some(kube::api::TypeMeta {
            api_version: ar.api_version.clone(),
            kind: ar.kind.clone(),
        });
        self.dynamic(ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap()
    }
}

/// Knative's helloworld revision as the Configuration reconciler stamps it.
fn revision(name: &str) -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
        "metadata": {
            "name": name, "namespace": NS,
            "labels": {labels::CONFIGURATION: "hello", labels::SERVICE: "hello",
                labels::CONFIGURATION_GENERATION: "1"},
        },
        "spec": {
            "containerConcurrency": 0, "timeoutSeconds": 300,
            "containers": [{"image": "ghcr.io/knative/helloworld-go:latest",
                "ports": [{"name": "http1", "containerPort": 8080}]}],
        },
    })
}

/// How a fixture's chain is broken (or not).
#[derive(Clone, Copy, PartialEq)]
enum Chain {
    /// As Knative leaves it.
    Genuine,
    /// The PodAutoscaler is another revision's (its controller another UID).
    OtherRevision,
    /// The Services name a ServerlessService of their name with another UID.
    UidMismatch,
    /// No ServerlessService.
    MissingLink,
}

/// What the fixture made that serves.
struct KnativeRevision {
    public_uid: String,
    private_uid: String,
    deployment_uid: String,
}

/// Knative's objects of revision `rev`, as Knative's revision, KPA and SKS reconcilers
/// leave them, with the chain broken as `chain` says.
async fn knative_revision(run: &Running, rev: &Revision, chain: Chain) -> KnativeRevision {
    let name = rev.name_any();
    let rev_uid = rev.uid().unwrap();
    let rev_labels = json!({
        labels::REVISION: name, labels::REVISION_UID: rev_uid,
        labels::CONFIGURATION: "hello", labels::SERVICE: "hello",
    });
    let pa_owner = match chain {
        Chain::OtherRevision => "9d0c3f0e-0000-4000-8000-000000000000".to_string(),
        _ => rev_uid.clone(),
    };
    let pa = run
        .create_dynamic(
            &pa_kind(),
            json!({"metadata": {"name": name, "namespace": NS, "labels": rev_labels,
                "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", &name, &pa_owner)},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": format!("{name}-deployment")}, "protocolType": "http1"}}),
        )
        .await;
    let pa_uid = pa.uid().unwrap();
    let sks_uid = if chain == Chain::MissingLink {
        "5b1d7a40-0000-4000-8000-000000000000".to_string()
    } else {
        let sks = run
            .create_dynamic(
                &sks_kind(),
                json!({"metadata": {"name": name, "namespace": NS, "labels": rev_labels,
                    "ownerReferences": controller_ref(
                        "autoscaling.internal.knative.dev/v1alpha1", "PodAutoscaler", &name, &pa_uid)},
                    "spec": {"mode": "Proxy", "numActivators": 2, "protocolType": "http1",
                        "objectRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                            "name": format!("{name}-deployment")}}}),
            )
            .await;
        sks.uid().unwrap()
    };
    let named_sks = match chain {
        Chain::UidMismatch => "0e4a9b11-0000-4000-8000-000000000000".to_string(),
        _ => sks_uid,
    };
    let sks_owner = controller_ref(
        "networking.internal.knative.dev/v1alpha1",
        "ServerlessService",
        &name,
        &named_sks,
    );
    let mut public_labels = rev_labels.clone();
    public_labels[labels::SERVICE_TYPE] = "Public".into();
    public_labels["networking.internal.knative.dev/serverlessservice"] = name.clone().into();
    let public: Service = run
        .create(
            json!({"metadata": {"name": name, "namespace": NS, "labels": public_labels,
            "ownerReferences": sks_owner},
            "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP",
                "targetPort": 8012}]}}),
        )
        .await;
    let mut private_labels = rev_labels.clone();
    private_labels[labels::SERVICE_TYPE] = "Private".into();
    let private: Service = run
        .create(
            json!({"metadata": {"name": format!("{name}-private"), "namespace": NS,
            "labels": private_labels, "ownerReferences": sks_owner},
            "spec": {"selector": {labels::REVISION_UID: rev_uid}, "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8012},
                {"name": "http-autometric", "port": 9090, "protocol": "TCP", "targetPort": 9090},
                {"name": "http-usermetric", "port": 9091, "protocol": "TCP", "targetPort": 9091},
                {"name": "http-queueadm", "port": 8022, "protocol": "TCP", "targetPort": 8022},
                {"name": "http-istio", "port": 8012, "protocol": "TCP", "targetPort": 8012}]}}),
        )
        .await;
    // The SKS reconciler's Endpoints of the public Service (Proxy mode: Knative's
    // activator, stopped by now).
    let _: Endpoints = run
        .create(
            json!({"metadata": {"name": name, "namespace": NS, "labels": public_labels,
            "ownerReferences": sks_owner},
            "subsets": [{"addresses": [{"ip": "10.9.0.7"}],
                "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}]}]}),
        )
        .await;
    let dep: Deployment = run
        .create(json!({"metadata": {"name": format!("{name}-deployment"), "namespace": NS,
            "labels": rev_labels,
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Revision", &name, &rev_uid)},
            "spec": {"replicas": 1, "selector": {"matchLabels": {labels::REVISION_UID: rev_uid}},
                "progressDeadlineSeconds": 600,
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                "template": {"metadata": {"labels": rev_labels},
                    "spec": {"containers": [
                        {"name": "user-container", "image": "ghcr.io/knative/helloworld-go@sha256:1",
                         "ports": [{"name": "user-port", "containerPort": 8080}]},
                        {"name": "queue-proxy", "image": KNATIVE_QUEUE,
                         "env": [{"name": "SERVING_ENABLE_PROBE_REQUEST_LOG", "value": "false"}],
                         "ports": [{"name": "http-queueadm", "containerPort": 8022}]}]}}}}))
        .await;
    KnativeRevision {
        public_uid: public.uid().unwrap(),
        private_uid: private.uid().unwrap(),
        deployment_uid: dep.uid().unwrap(),
    }
}

fn controller_uid(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

fn containers(d: &Deployment) -> Vec<(String, String)> {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect()
}

async fn revision_condition(
    run: &Running,
    type_: &str,
    want: ConditionStatus,
    reason: Option<&str>,
) {
    let api = run.api::<Revision>();
    wait_for(
        &format!("{REV} {type_}={want:?} {reason:?}"),
        || async { api.get(REV).await.unwrap() },
        |r| {
            r.status
                .as_ref()
                .and_then(|s| s.status.condition(type_))
                .is_some_and(|c| c.status == want && c.reason.as_deref() == reason)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_mode_takes_a_knative_revision_over_in_place_and_rolls_it_when_released() {
    let mut run = Running::new().await;
    let rev: Revision = run.create(revision(REV)).await;
    let knative = knative_revision(&run, &rev, Chain::Genuine).await;
    run.run_revisions(true);
    let rev_uid = rev.uid().unwrap();
    let services = run.api::<Service>();

    // Both Services re-owned in place: same objects, the Revision their controller, the
    // ServerlessService's reference gone (so its deletion collects nothing), thaw's ports.
    let public = wait_for(
        "the public Service owned by the revision",
        || async { services.get(REV).await.unwrap() },
        |s| controller_uid(&s.metadata).as_deref() == Some(rev_uid.as_str()),
    )
    .await;
    let private = wait_for(
        "the private Service owned by the revision",
        || async { services.get(&format!("{REV}-private")).await.unwrap() },
        |s| controller_uid(&s.metadata).as_deref() == Some(rev_uid.as_str()),
    )
    .await;
    assert_eq!(public.uid().unwrap(), knative.public_uid);
    assert_eq!(private.uid().unwrap(), knative.private_uid);
    for s in [&public, &private] {
        assert_eq!(s.owner_references().len(), 1, "{:?}", s.owner_references());
    }
    let port_names: Vec<_> = private
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port))
        .collect();
    assert_eq!(
        port_names,
        [
            ("http".to_string(), 80),
            ("http-autometric".to_string(), 9091)
        ]
    );

    // The Deployment: held, its template Knative's.
    let deployments = run.api::<Deployment>();
    let dep_name = format!("{REV}-deployment");
    let dep = wait_for(
        "the Deployment marked held",
        || async { deployments.get(&dep_name).await.unwrap() },
        |d| d.labels().get(TEMPLATE_HELD_LABEL).map(String::as_str) == Some("true"),
    )
    .await;
    assert_eq!(dep.uid().unwrap(), knative.deployment_uid);
    assert_eq!(
        containers(&dep)[1],
        ("queue-proxy".into(), KNATIVE_QUEUE.into())
    );

    // Knative's Endpoints stay while thaw's slices do not serve the public Service.
    let endpoints = run.api::<Endpoints>();
    assert!(endpoints.get_opt(REV).await.unwrap().is_some());
    // Playing thaw's autoscaler: the public Service's slice, the activator in the path.
    let _: EndpointSlice = run
        .create(
            json!({"metadata": {"name": format!("{REV}-a1"), "namespace": NS,
            "labels": {labels::ENDPOINTSLICE_SERVICE_NAME: REV,
                labels::ENDPOINTSLICE_MANAGED_BY: labels::MANAGED_BY_AUTOSCALER}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}]}),
        )
        .await;
    wait_for(
        "Knative's Endpoints gone",
        || async { endpoints.get_opt(REV).await.unwrap() },
        Option::is_none,
    )
    .await;

    // Ready under thaw: the PodAutoscaler and ServerlessService go; the Services stay.
    controller_support::mark_deployment_ready(&deployments, REV).await;
    revision_condition(&run, condition::READY, ConditionStatus::True, None).await;
    for ar in [sks_kind(), pa_kind()] {
        let api = run.dynamic(&ar);
        wait_for(
            &format!("{} gone", ar.kind),
            || async { api.get_opt(REV).await.unwrap() },
            Option::is_none,
        )
        .await;
    }
    assert_eq!(
        services.get(REV).await.unwrap().uid().unwrap(),
        knative.public_uid
    );
    assert_eq!(
        services
            .get(&format!("{REV}-private"))
            .await
            .unwrap()
            .uid()
            .unwrap(),
        knative.private_uid
    );
    // Still held, Knative's template as found.
    let dep = deployments.get(&dep_name).await.unwrap();
    assert_eq!(containers(&dep)[1].1, KNATIVE_QUEUE);

    // Released: thaw's template, rolled with no pod unavailable; the same Deployment.
    run.api::<Revision>()
        .patch(
            REV,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {RELEASE_TEMPLATE_ANNOTATION: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let dep = wait_for(
        "thaw's template, the hold label gone",
        || async { deployments.get(&dep_name).await.unwrap() },
        |d| {
            containers(d)
                .iter()
                .any(|(n, i)| n == "queue-proxy" && i == IMAGE)
                && !d.labels().contains_key(TEMPLATE_HELD_LABEL)
        },
    )
    .await;
    assert_eq!(dep.uid().unwrap(), knative.deployment_uid);
    // thaw's sidecar replaced Knative's whole: nothing of Knative's queue-proxy is left in it.
    let spec = dep.spec.clone().unwrap().template.spec.unwrap();
    let queue = spec
        .containers
        .iter()
        .find(|c| c.name == "queue-proxy")
        .unwrap();
    assert!(
        !queue
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "SERVING_ENABLE_PROBE_REQUEST_LOG"),
        "{:?}",
        queue.env
    );
    assert!(
        !queue
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == 8022)
    );
    let rolling = dep.spec.unwrap().strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        rolling.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
    );
}

/// Waits for the revision to be NotOwned and shows its Services untouched (still the
/// ServerlessService's, named as Knative left them).
async fn stays_not_owned(run: &Running) {
    revision_condition(
        run,
        condition::RESOURCES_AVAILABLE,
        ConditionStatus::False,
        Some("NotOwned"),
    )
    .await;
    for name in [REV.to_string(), format!("{REV}-private")] {
        let s = run.api::<Service>().get(&name).await.unwrap();
        let o = &s.owner_references()[0];
        assert_eq!(o.kind, "ServerlessService", "{name}");
    }
    assert!(run.api::<Endpoints>().get_opt(REV).await.unwrap().is_some());
    assert!(
        run.dynamic(&pa_kind())
            .get_opt(REV)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_does_not_lead_to_the_revision_by_uid_stays_not_owned() {
    for chain in [Chain::OtherRevision, Chain::UidMismatch, Chain::MissingLink] {
        let mut run = Running::new().await;
        let rev: Revision = run.create(revision(REV)).await;
        knative_revision(&run, &rev, chain).await;
        run.run_revisions(true);
        stays_not_owned(&run).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_switch_nothing_is_adopted() {
    let mut run = Running::new().await;
    let rev: Revision = run.create(revision(REV)).await;
    knative_revision(&run, &rev, Chain::Genuine).await;
    run.run_revisions(false);
    stays_not_owned(&run).await;
}

/// Knative's objects of route `hello` (its labeler's finalizer on it): the KIngress `hello`
/// with net-istio's finalizer, net-istio's two VirtualServices (and a third of a name thaw does
/// not write), a networking Certificate.
/// `king_owner`: the KIngress's controller UID (the route's, or another).
async fn knative_route(run: &Running, king_owner: Option<&str>) -> (Route, Vec<String>) {
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
    r.metadata.finalizers = Some(vec!["routes.serving.knative.dev".into()]);
    let route = run
        .api::<Route>()
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    let route_uid = route.uid().unwrap();
    let owner = king_owner.map_or(route_uid.clone(), str::to_string);
    let route_labels = json!({labels::ROUTE: "hello", "serving.knative.dev/routeNamespace": NS});
    let king = run
        .create_dynamic(
            &king_kind(),
            json!({"metadata": {"name": "hello", "namespace": NS, "labels": route_labels,
                "finalizers": ["ingresses.networking.internal.knative.dev"],
                "annotations": {"networking.knative.dev/ingress.class": "istio.ingress.networking.knative.dev"},
                "ownerReferences": controller_ref("serving.knative.dev/v1", "Route", "hello", &owner)},
                "spec": {"httpOption": "Enabled", "rules": []}}),
        )
        .await;
    let mut vs_uids = Vec::new();
    // The third a name thaw does not write (not adopted).
    for vs in ["hello-ingress", "hello-mesh", "hello-stale"] {
        let mut vs_labels = route_labels.clone();
        vs_labels["networking.internal.knative.dev/ingress"] = "hello".into();
        let created: VirtualService = run
            .create(json!({"metadata": {"name": vs, "namespace": NS, "labels": vs_labels,
                "ownerReferences": controller_ref(
                    "networking.internal.knative.dev/v1alpha1", "Ingress", "hello", &king.uid().unwrap())},
                "spec": {"hosts": ["hello.default.example.com"],
                    "gateways": ["knative-serving/knative-ingress-gateway"]}}))
            .await;
        vs_uids.push(created.uid().unwrap());
    }
    run.create_dynamic(
        &kcert_kind(),
        json!({"metadata": {"name": format!("route-{route_uid}"), "namespace": NS,
            "labels": {labels::ROUTE: "hello", "networking.knative.dev/certificate-type": "cluster-local-domain"},
            "ownerReferences": controller_ref("serving.knative.dev/v1", "Route", "hello", &route_uid)},
            "spec": {"dnsNames": ["hello.default.svc.cluster.local"], "domain": "svc.cluster.local",
                "secretName": format!("route-{route_uid}")}}),
    )
    .await;
    (route, vs_uids)
}

/// The revision the route sends to, Ready (playing the Revision reconciler).
async fn ready_revision(run: &Running) {
    let api = run.api::<Revision>();
    let rev: Revision = run.create(revision(REV)).await;
    let mut r = api.get_status(&rev.name_any()).await.unwrap();
    let mut st = r.status.clone().unwrap_or_default();
    st.status.set(
        Condition::new(condition::READY, ConditionStatus::True),
        &thaw::controller::now(),
    );
    r.status = Some(st);
    api.replace_status(REV, &PostParams::default(), &r)
        .await
        .unwrap();
}

fn route_condition(r: &Route, t: &str) -> Option<(ConditionStatus, Option<String>)> {
    let c = r.status.as_ref()?.status.condition(t)?;
    Some((c.status, c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_mode_takes_a_knative_route_over_and_retires_its_kingress() {
    let mut run = Running::new().await;
    ready_revision(&run).await;
    let (route, vs_uids) = knative_route(&run, None).await;
    run.run_routes(true).await;
    let routes = run.api::<Route>();
    let r = wait_for(
        "the route IngressReady",
        || async { routes.get("hello").await.unwrap() },
        |r| route_condition(r, "IngressReady").map(|c| c.0) == Some(ConditionStatus::True),
    )
    .await;
    assert_eq!(
        route_condition(&r, "Ready").unwrap().0,
        ConditionStatus::True
    );
    // The same VirtualServices, now the Route's, written as thaw writes them.
    let vss = run.api::<VirtualService>();
    for (name, uid) in ["hello-ingress", "hello-mesh"].iter().zip(&vs_uids) {
        let vs = vss.get(name).await.unwrap();
        assert_eq!(vs.uid().as_ref(), Some(uid), "{name}");
        assert_eq!(controller_uid(&vs.metadata), route.uid(), "{name}");
        assert_eq!(vs.owner_references().len(), 1);
    }
    // The one the KIngress still controlled (not adopted) deleted, not orphaned.
    wait_for(
        "the VirtualService thaw did not adopt gone",
        || async { vss.get_opt("hello-stale").await.unwrap() },
        Option::is_none,
    )
    .await;
    let ingress = vss.get("hello-ingress").await.unwrap();
    assert!(
        ingress
            .spec
            .hosts
            .contains(&"hello.default.svc.cluster.local".to_string())
    );
    // Knative's KIngress (its finalizer removed first) and Certificate gone; the labeler's
    // finalizer off the Route.
    let king = run.dynamic(&king_kind());
    wait_for(
        "the KIngress gone",
        || async { king.get_opt("hello").await.unwrap() },
        Option::is_none,
    )
    .await;
    let certs = run.dynamic(&kcert_kind());
    wait_for(
        "the networking Certificate gone",
        || async { certs.list(&Default::default()).await.unwrap().items.len() },
        |n| *n == 0,
    )
    .await;
    let r = wait_for(
        "the labeler's finalizer removed",
        || async { routes.get("hello").await.unwrap() },
        |r| r.finalizers().is_empty(),
    )
    .await;
    assert_eq!(r.uid(), route.uid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kingress_of_another_route_is_not_adopted_from() {
    for (adopt, owner) in [
        (true, Some("1f3e5d7c-0000-4000-8000-000000000000")),
        (false, None),
    ] {
        let mut run = Running::new().await;
        ready_revision(&run).await;
        knative_route(&run, owner).await;
        run.run_routes(adopt).await;
        let routes = run.api::<Route>();
        wait_for(
            "IngressReady NotOwned",
            || async { routes.get("hello").await.unwrap() },
            |r| {
                route_condition(r, "IngressReady")
                    == Some((ConditionStatus::False, Some("NotOwned".into())))
            },
        )
        .await;
        let vs = run
            .api::<VirtualService>()
            .get("hello-ingress")
            .await
            .unwrap();
        assert_eq!(vs.owner_references()[0].kind, "Ingress");
        assert!(
            run.api::<VirtualService>()
                .get_opt("hello-stale")
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            run.dynamic(&king_kind())
                .get_opt("hello")
                .await
                .unwrap()
                .is_some()
        );
        let r = routes.get("hello").await.unwrap();
        assert_eq!(r.finalizers(), ["routes.serving.knative.dev"]);
    }
}

/// The HTTPRoutes net-gateway-api writes for route `hello` (named by their longest host, on
/// config-gateway's Gateways), controlled by the KIngress `hello`, adopted in place; the
/// KIngress retired once the gateway reports them accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_mode_takes_net_gateway_apis_http_routes_over() {
    let mut run = Running::new().await;
    ready_revision(&run).await;
    let (route, _) = knative_route(&run, None).await;
    let king = run.dynamic(&king_kind()).get("hello").await.unwrap();
    let hosts = [
        "hello.default.example.com",
        "hello.default.svc.cluster.local",
    ];
    let mut uids = Vec::new();
    for (host, gateway) in hosts
        .iter()
        .zip(["knative-gateway", "knative-local-gateway"])
    {
        let hr: HTTPRoute = run
            .create(json!({"metadata": {"name": host, "namespace": NS,
                "labels": {labels::ROUTE: "hello", "networking.knative.dev/visibility": ""},
                "ownerReferences": controller_ref(
                    "networking.internal.knative.dev/v1alpha1", "Ingress", "hello", &king.uid().unwrap())},
                "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                    "name": gateway, "namespace": "istio-system"}],
                    "hostnames": [host], "rules": []}}))
            .await;
        uids.push(hr.uid().unwrap());
    }
    run.run_routes_gateway_api();
    let api = run.api::<HTTPRoute>();
    for (host, uid) in hosts.iter().zip(&uids) {
        let hr = wait_for(
            &format!("the HTTPRoute {host} owned by the route, with thaw's rules"),
            || async { api.get(host).await.unwrap() },
            |hr| controller_uid(&hr.metadata) == route.uid() && !hr.spec.rules.is_empty(),
        )
        .await;
        assert_eq!(hr.uid().as_ref(), Some(uid), "{host}");
    }
    // Playing the gateway's implementation: both accepted.
    for host in hosts {
        loop {
            let mut hr = api.get(host).await.unwrap();
            hr.status = Some(hr.status_for_every_parent(
                "example.com/gateway-controller",
                &[
                    ("Accepted", "True", "Accepted"),
                    ("ResolvedRefs", "True", "ResolvedRefs"),
                ],
            ));
            match api.replace_status(host, &PostParams::default(), &hr).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => panic!("{host}: {e}"),
            }
        }
    }
    let king = run.dynamic(&king_kind());
    wait_for(
        "the KIngress gone",
        || async { king.get_opt("hello").await.unwrap() },
        Option::is_none,
    )
    .await;
    for (host, uid) in hosts.iter().zip(&uids) {
        assert_eq!(api.get(host).await.unwrap().uid().as_ref(), Some(uid));
    }
}
