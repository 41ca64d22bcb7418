//! The Route reconciler in-process against the in-process API server over real HTTP: the
//! test writes Revisions and Configurations (and their status, playing the other
//! reconcilers), the Route controller writes VirtualServices (or, with the Gateway API ingress
//! class, HTTPRoutes, whose status the test writes playing the gateway's implementation),
//! placeholder Services, the Route's status and the revisions' routing state. Waits poll with
//! a deadline.

mod controller_support;
mod kube_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service as KubeService;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::{Resource, ResourceExt};
use thaw::config::network::IngressClass;
use thaw::controller::route::http_route::HTTPRoute;
use thaw::controller::route::labeler::ROUTES_ANNOTATION;
use thaw::controller::route::virtual_service::{VirtualService, VirtualServiceSpec};
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::duck::{Condition, ConditionStatus};
use thaw::knative::names::labels;
use thaw::knative::{
    ClusterDomainClaim, ClusterDomainClaimSpec, Configuration, ConfigurationSpec, DomainMapping,
    DomainMappingSpec, KReference, Revision, RevisionSpec, Route, RouteSpec, TrafficTarget,
    condition,
};
use tokio::task::JoinHandle;

use crate::kube_support::TestApi;
use crate::kube_support::relay::Relay;
use controller_support::{DEADLINE, mark_deployment_ready, wait_for};

const NS: &str = "default";

struct Running {
    _api: TestApi,
    client: kube::Client,
    task: JoinHandle<()>,
    /// config-istio's default gateways, one pod answering probes: routes reach IngressReady.
    _gateway: kube_support::gateway::TestGateway,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }
}

/// The API server and the Route controller alone (no other reconciler runs).
async fn start() -> Running {
    start_with(Settings::default()).await.0
}

/// [`start`] with `settings`; the controller's context is returned to change them.
async fn start_with(settings: Settings) -> (Running, Arc<Ctx>) {
    start_serving(settings, &[]).await
}

/// [`start_with`], the gateway pod also serving the Gateways `more` (`namespace/name`).
async fn start_serving(settings: Settings, more: &[&str]) -> (Running, Arc<Ctx>) {
    let api = TestApi::start().await;
    let client = api.client();
    let ctx: Arc<Ctx> = Ctx::with_options(
        client.clone(),
        settings,
        CtxOptions {
            namespace: Some(NS.into()),
            ..CtxOptions::default()
        },
    );
    let task = tokio::spawn(thaw::controller::route::controller(ctx.clone()));
    let gateway = kube_support::gateway::default_gateways_and(&client, more).await;
    let run = Running {
        _api: api,
        client,
        task,
        _gateway: gateway,
    };
    (run, ctx)
}

/// The Route controller alone, talking to the API server through a relay the test can hold
/// (its own requests go direct); not started until [`Running::start_controller`].
async fn start_via_relay() -> (Running, Relay) {
    let api = TestApi::start().await;
    let relay = Relay::start(api.addr()).await;
    let client = api.client();
    let gateway = kube_support::gateway::default_gateways(&client).await;
    let run = Running {
        _api: api,
        client,
        task: tokio::spawn(async {}),
        _gateway: gateway,
    };
    (run, relay)
}

impl Running {
    fn start_controller(&mut self, via: &Relay) {
        self.start_controller_with(via, Settings::default());
    }

    fn start_controller_with(&mut self, via: &Relay, settings: Settings) {
        let ctx: Arc<Ctx> = Ctx::with_options(
            kube_support::client_at(via.addr()),
            settings,
            CtxOptions {
                namespace: Some(NS.into()),
                ..CtxOptions::default()
            },
        );
        self.task = tokio::spawn(thaw::controller::route::controller(ctx));
    }
}

/// A Revision `name` of configuration `cfg`, created `pending` as the Configuration
/// reconciler creates them; `ready`: its status says Ready.
async fn revision(run: &Running, name: &str, ready: bool) -> Revision {
    let cfg = name.rsplit_once('-').map_or(name, |(c, _)| c);
    let rev = Revision {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (labels::CONFIGURATION.to_string(), cfg.to_string()),
                (labels::ROUTING_STATE.to_string(), "pending".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: RevisionSpec::default(),
        status: None,
    };
    let api = run.api::<Revision>();
    let created = api.create(&PostParams::default(), &rev).await.unwrap();
    if ready {
        mark_ready(&api, name).await;
    }
    created
}

/// Plays the Revision reconciler: marks `name` Ready (read, then replace; a conflict with
/// the labeler's metadata patch is retried).
async fn mark_ready(api: &Api<Revision>, name: &str) {
    loop {
        let mut r = api.get_status(name).await.unwrap();
        let mut st = r.status.clone().unwrap_or_default();
        st.status.set(
            Condition::new(condition::READY, ConditionStatus::True),
            &thaw::controller::now(),
        );
        r.status = Some(st);
        match api.replace_status(name, &PostParams::default(), &r).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Plays the Configuration reconciler: sets latest created / latest ready (a conflict with
/// the labeler's metadata patch is retried).
async fn set_configuration(run: &Running, name: &str, created: &str, ready: Option<&str>) {
    let api = run.api::<Configuration>();
    loop {
        let mut c = match api.get_opt(name).await.unwrap() {
            Some(c) => c,
            None => api
                .create(
                    &PostParams::default(),
                    &Configuration::new(name, ConfigurationSpec::default()),
                )
                .await
                .unwrap(),
        };
        let mut st = c.status.clone().unwrap_or_default();
        st.fields.latest_created_revision_name = Some(created.into());
        st.fields.latest_ready_revision_name = ready.map(Into::into);
        c.status = Some(st);
        match api.replace_status(name, &PostParams::default(), &c).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

fn to_revision(rev: &str, percent: i64) -> TrafficTarget {
    TrafficTarget {
        revision_name: Some(rev.into()),
        percent: Some(percent),
        ..TrafficTarget::default()
    }
}

async fn create_route(run: &Running, name: &str, traffic: Vec<TrafficTarget>) -> Route {
    let mut r = Route::new(name, RouteSpec { traffic });
    r.metadata.namespace = Some(NS.into());
    run.api::<Route>()
        .create(&PostParams::default(), &r)
        .await
        .unwrap()
}

async fn set_traffic(run: &Running, name: &str, traffic: Vec<TrafficTarget>) {
    run.api::<Route>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "traffic": traffic } })),
        )
        .await
        .unwrap();
}

fn cond(r: &Route, t: &str) -> Option<(ConditionStatus, Option<String>)> {
    let c = r.status.as_ref()?.status.condition(t)?;
    Some((c.status, c.reason.clone()))
}

fn is_ready(r: &Option<Route>) -> bool {
    r.as_ref().is_some_and(|r| {
        cond(r, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
            && r.status.as_ref().and_then(|s| s.status.observed_generation) == r.metadata.generation
    })
}

async fn route_until(
    run: &Running,
    name: &str,
    what: &str,
    ok: impl Fn(&Option<Route>) -> bool,
) -> Route {
    let api = run.api::<Route>();
    wait_for(what, || async { api.get_opt(name).await.unwrap() }, ok)
        .await
        .unwrap()
}

/// How many VirtualServices the API server holds.
async fn virtual_service_count(run: &Running) -> usize {
    let api = run.api::<VirtualService>();
    api.list(&Default::default()).await.unwrap().items.len()
}

async fn vs_until(
    run: &Running,
    name: &str,
    ok: impl Fn(&VirtualServiceSpec) -> bool,
) -> VirtualService {
    let api = run.api::<VirtualService>();
    wait_for(
        "the VirtualService",
        || async { api.get_opt(name).await.unwrap() },
        |v: &Option<VirtualService>| v.as_ref().is_some_and(|v| ok(&v.spec)),
    )
    .await
    .unwrap()
}

/// (destination host, port, weight, Knative-Serving-Revision) of each destination of the
/// HTTP route named `name`.
fn destinations(vs: &VirtualServiceSpec, route: &str) -> Vec<(String, u32, i32, String)> {
    let http = vs
        .http
        .iter()
        .find(|h| h.name.as_deref() == Some(route))
        .unwrap_or_else(|| panic!("no http route {route}: {vs:#?}"));
    http.route
        .iter()
        .map(|d| {
            let set = &d.headers.as_ref().unwrap().request.as_ref().unwrap().set;
            assert_eq!(set["Knative-Serving-Namespace"], NS);
            (
                d.destination.host.clone(),
                d.destination.port.as_ref().unwrap().number,
                d.weight.unwrap(),
                set["Knative-Serving-Revision"].clone(),
            )
        })
        .collect()
}

fn weights(vs: &VirtualServiceSpec, route: &str) -> Vec<(String, i32)> {
    destinations(vs, route)
        .into_iter()
        .map(|(_, _, w, r)| (r, w))
        .collect()
}

fn state(r: &Revision) -> (Option<&str>, Option<&str>) {
    (
        r.labels().get(labels::ROUTING_STATE).map(String::as_str),
        r.annotations().get(ROUTES_ANNOTATION).map(String::as_str),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_to_a_ready_revision_is_programmed_and_ready() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    let created = create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let r = route_until(&run, "hello", "the route Ready", is_ready).await;
    let st = r.status.clone().unwrap();
    assert_eq!(
        st.fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    assert_eq!(
        st.fields.address.and_then(|a| a.url).as_deref(),
        Some("http://hello.default.svc.cluster.local")
    );
    assert_eq!(st.fields.traffic.len(), 1);
    assert_eq!(
        st.fields.traffic[0].revision_name.as_deref(),
        Some("hello-00001")
    );
    assert_eq!(st.fields.traffic[0].percent, Some(100));
    for (t, reason) in [
        ("AllTrafficAssigned", None),
        ("IngressReady", None),
        ("CertificateProvisioned", Some("TLSNotEnabled".to_string())),
    ] {
        assert_eq!(cond(&r, t), Some((ConditionStatus::True, reason)), "{t}");
    }

    let vs = vs_until(&run, "hello-ingress", |_| true).await;
    assert_eq!(
        vs.spec.hosts,
        [
            "hello.default.example.com",
            "hello.default",
            "hello.default.svc",
            "hello.default.svc.cluster.local"
        ]
    );
    assert_eq!(
        vs.spec.gateways,
        [
            "knative-serving/knative-ingress-gateway",
            "knative-serving/knative-local-gateway"
        ]
    );
    assert_eq!(
        destinations(&vs.spec, "hello"),
        [(
            "hello-00001.default.svc.cluster.local".to_string(),
            80,
            100,
            "hello-00001".to_string()
        )]
    );
    let owner = &vs.owner_references()[0];
    assert_eq!(owner.uid, created.uid().unwrap());
    assert_eq!(owner.controller, Some(true));

    let svc = run.api::<KubeService>().get("hello").await.unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
    assert_eq!(
        spec.external_name.as_deref(),
        Some("knative-local-gateway.istio-system.svc.cluster.local")
    );
    let port = &spec.ports.unwrap()[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("http2"), 80));
    assert_eq!(svc.metadata.labels.unwrap()[labels::ROUTE], "hello");

    // The labeler: pending → active, with the route listed and the time stamped.
    let rev = wait_for(
        "hello-00001 active",
        || async { run.api::<Revision>().get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
    assert!(
        rev.annotations()
            .get("serving.knative.dev/routingStateModified")
            .is_some_and(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok())
    );
}

/// Route `hello`: 50/50 between two Ready revisions, the second also tagged `candidate`;
/// returned once Ready.
async fn split_and_tag(run: &Running) -> Route {
    revision(run, "hello-00001", true).await;
    revision(run, "hello-00002", true).await;
    let mut tagged = to_revision("hello-00002", 0);
    tagged.tag = Some("candidate".into());
    create_route(
        run,
        "hello",
        vec![
            to_revision("hello-00001", 50),
            to_revision("hello-00002", 50),
            tagged,
        ],
    )
    .await;
    route_until(run, "hello", "the route Ready", is_ready).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifty_fifty_split_and_a_tag() {
    let run = start().await;
    let r = split_and_tag(&run).await;
    let traffic = &r.status.as_ref().unwrap().fields.traffic;
    assert_eq!(traffic.len(), 3);
    assert_eq!(traffic[2].tag.as_deref(), Some("candidate"));
    assert_eq!(
        traffic[2].url.as_deref(),
        Some("http://candidate-hello.default.example.com")
    );
    let vs = vs_until(&run, "hello-ingress", |_| true).await;
    assert_eq!(
        weights(&vs.spec, "hello"),
        [("hello-00001".into(), 50), ("hello-00002".into(), 50)]
    );
    assert_eq!(
        weights(&vs.spec, "candidate-hello"),
        [("hello-00002".into(), 100)]
    );
    assert!(
        vs.spec
            .hosts
            .contains(&"candidate-hello.default.example.com".to_string())
    );
    run.api::<KubeService>()
        .get("candidate-hello")
        .await
        .unwrap();

    // Dropping the tag removes its placeholder Service and its HTTP route.
    set_traffic(
        &run,
        "hello",
        vec![
            to_revision("hello-00001", 50),
            to_revision("hello-00002", 50),
        ],
    )
    .await;
    // One route and its probe copy.
    vs_until(&run, "hello-ingress", |s| s.http.len() == 2).await;
    let svcs = run.api::<KubeService>();
    wait_for(
        "the tag's placeholder gone",
        || async { svcs.get_opt("candidate-hello").await.unwrap() },
        |s| s.is_none(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_revision_is_revision_missing_until_it_exists_and_is_ready() {
    let run = start().await;
    create_route(&run, "hello", vec![to_revision("hello-00007", 100)]).await;
    let r = route_until(&run, "hello", "AllTrafficAssigned False", |r| {
        r.as_ref().and_then(|r| cond(r, "AllTrafficAssigned"))
            == Some((ConditionStatus::False, Some("RevisionMissing".into())))
    })
    .await;
    let c = r
        .status
        .as_ref()
        .unwrap()
        .status
        .condition("AllTrafficAssigned")
        .unwrap();
    assert_eq!(
        c.message.as_deref(),
        Some("Revision \"hello-00007\" referenced in traffic not found.")
    );
    assert_eq!(cond(&r, "Ready").unwrap().0, ConditionStatus::False);
    assert!(
        run.api::<VirtualService>()
            .get_opt("hello-ingress")
            .await
            .unwrap()
            .is_none()
    );

    // It appears, not ready: Unknown. Then Ready: the route follows (the Revision watch).
    revision(&run, "hello-00007", false).await;
    route_until(&run, "hello", "AllTrafficAssigned Unknown", |r| {
        r.as_ref().and_then(|r| cond(r, "AllTrafficAssigned"))
            == Some((ConditionStatus::Unknown, Some("RevisionMissing".into())))
    })
    .await;
    mark_ready(&run.api::<Revision>(), "hello-00007").await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    vs_until(&run, "hello-ingress", |s| !s.http.is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_local_route_stays_off_the_external_gateway() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    let mut r = Route::new(
        "hello",
        RouteSpec {
            traffic: vec![to_revision("hello-00001", 100)],
        },
    );
    r.metadata.labels = Some(BTreeMap::from([(
        "networking.knative.dev/visibility".to_string(),
        "cluster-local".to_string(),
    )]));
    run.api::<Route>()
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    let r = route_until(&run, "hello", "the route Ready", is_ready).await;
    assert_eq!(
        r.status.unwrap().fields.url.as_deref(),
        Some("http://hello.default.svc.cluster.local")
    );
    let vs = vs_until(&run, "hello-ingress", |_| true).await;
    assert_eq!(vs.spec.gateways, ["knative-serving/knative-local-gateway"]);
    assert!(
        vs.spec.hosts.iter().all(|h| !h.contains("example.com")),
        "{:?}",
        vs.spec.hosts
    );
    assert!(
        vs.spec
            .http
            .iter()
            .flat_map(|h| &h.match_)
            .all(|m| m.gateways == ["knative-serving/knative-local-gateway"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_revision_moves_only_when_the_new_revision_is_ready() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    set_configuration(&run, "hello", "hello-00001", Some("hello-00001")).await;
    create_route(
        &run,
        "hello",
        vec![TrafficTarget {
            configuration_name: Some("hello".into()),
            latest_revision: Some(true),
            percent: Some(100),
            ..TrafficTarget::default()
        }],
    )
    .await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    vs_until(&run, "hello-ingress", |s| {
        weights(s, "hello") == [("hello-00001".into(), 100)]
    })
    .await;

    // A template edit: hello-00002 is created, not Ready. Traffic stays; the new revision is
    // already active (the labeler marks latest created), so min-scale applies to it.
    revision(&run, "hello-00002", false).await;
    set_configuration(&run, "hello", "hello-00002", Some("hello-00001")).await;
    let revs = run.api::<Revision>();
    wait_for(
        "hello-00002 active",
        || async { revs.get("hello-00002").await.unwrap() },
        |r| state(r).0 == Some("active"),
    )
    .await;
    let r = run.api::<Route>().get("hello").await.unwrap();
    assert_eq!(
        r.status.unwrap().fields.traffic[0].revision_name.as_deref(),
        Some("hello-00001")
    );
    let vs = run
        .api::<VirtualService>()
        .get("hello-ingress")
        .await
        .unwrap();
    assert_eq!(weights(&vs.spec, "hello"), [("hello-00001".into(), 100)]);

    // Ready: the configuration's latest ready moves, and the route with it.
    mark_ready(&revs, "hello-00002").await;
    set_configuration(&run, "hello", "hello-00002", Some("hello-00002")).await;
    vs_until(&run, "hello-ingress", |s| {
        weights(s, "hello") == [("hello-00002".into(), 100)]
    })
    .await;
    route_until(&run, "hello", "status traffic on hello-00002", |r| {
        r.as_ref().is_some_and(|r| {
            r.status.as_ref().unwrap().fields.traffic[0]
                .revision_name
                .as_deref()
                == Some("hello-00002")
        })
    })
    .await;
    // hello-00001 is no longer used by the route: reserve.
    wait_for(
        "hello-00001 reserve",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("reserve"), None),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_state_moves_active_to_reserve_when_the_route_lets_go() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    revision(&run, "hello-00002", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let revs = run.api::<Revision>();
    wait_for(
        "hello-00001 active",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
    assert_eq!(
        state(&revs.get("hello-00002").await.unwrap()).0,
        Some("pending")
    );
    // A second route shares hello-00001.
    create_route(&run, "other", vec![to_revision("hello-00001", 100)]).await;
    wait_for(
        "both routes listed",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello,other")),
    )
    .await;

    set_traffic(&run, "hello", vec![to_revision("hello-00002", 100)]).await;
    wait_for(
        "hello-00002 active",
        || async { revs.get("hello-00002").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
    // Still used by "other": active.
    wait_for(
        "hello-00001 kept by other",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("other")),
    )
    .await;
    set_traffic(&run, "other", vec![to_revision("hello-00002", 100)]).await;
    let r1 = wait_for(
        "hello-00001 reserve",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("reserve"), None),
    )
    .await;
    assert!(
        r1.annotations()
            .contains_key("serving.knative.dev/routingStateModified")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_service_of_someone_else_is_not_owned_and_left_alone() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    let theirs = VirtualService {
        metadata: ObjectMeta {
            name: Some("hello-ingress".into()),
            ..ObjectMeta::default()
        },
        spec: VirtualServiceSpec {
            hosts: vec!["theirs.example.org".into()],
            ..VirtualServiceSpec::default()
        },
    };
    run.api::<VirtualService>()
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let r = route_until(&run, "hello", "IngressReady NotOwned", |r| {
        r.as_ref().and_then(|r| cond(r, "IngressReady"))
            == Some((ConditionStatus::False, Some("NotOwned".into())))
    })
    .await;
    assert_eq!(cond(&r, "Ready").unwrap().0, ConditionStatus::False);
    let vs = run
        .api::<VirtualService>()
        .get("hello-ingress")
        .await
        .unwrap();
    assert_eq!(vs.spec.hosts, ["theirs.example.org"]);
}

/// A traffic change → the VirtualService carrying the new weights, 100 times; prints the
/// median and p90 (`cargo test --release --test controller_route -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it explicitly"]
async fn measure_traffic_change_to_virtual_service() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    revision(&run, "hello-00002", true).await;
    create_route(
        &run,
        "hello",
        vec![
            to_revision("hello-00001", 50),
            to_revision("hello-00002", 50),
        ],
    )
    .await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    // Changes are seen through a watch of the VirtualService (no polling load on the server).
    let vss = run.api::<VirtualService>();
    let mut events = std::pin::pin!(
        kube::runtime::watcher(vss, kube::runtime::watcher::Config::default())
            .default_backoff()
            .applied_objects()
    );
    let mut samples = Vec::with_capacity(100);
    for i in 0..100i64 {
        let a = 1 + (i * 7) % 98;
        let started = tokio::time::Instant::now();
        set_traffic(
            &run,
            "hello",
            vec![
                to_revision("hello-00001", a),
                to_revision("hello-00002", 100 - a),
            ],
        )
        .await;
        let want = vec![
            ("hello-00001".to_string(), a as i32),
            ("hello-00002".to_string(), (100 - a) as i32),
        ];
        loop {
            let vs = tokio::time::timeout(DEADLINE, events.next())
                .await
                .unwrap_or_else(|_| panic!("change {i} never arrived"))
                .expect("watch open")
                .expect("watch event");
            if weights(&vs.spec, "hello") == want {
                break;
            }
        }
        samples.push(started.elapsed());
    }
    samples.sort();
    println!(
        "traffic change -> VirtualService weights, 100 changes: median {:?}, p90 {:?}, max {:?}",
        samples[49], samples[89], samples[99]
    );
}

/// With every reconciler running: a Knative Service's Route is programmed and the Service
/// goes Ready (RoutesReady follows the Route), with the Route's URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_route_is_programmed_and_the_service_goes_ready() {
    let api = TestApi::start().await;
    let client = api.client();
    let ctx = Ctx::with_options(
        client.clone(),
        Settings::default(),
        CtxOptions {
            namespace: Some(NS.into()),
            ..CtxOptions::default()
        },
    );
    let task = tokio::spawn(thaw::roles::controller::run_controllers(ctx));
    let gateway = kube_support::gateway::default_gateways(&client).await;
    let run = Running {
        _api: api,
        client,
        task,
        _gateway: gateway,
    };
    let svc: thaw::knative::Service = serde_saphyr::from_str(
        "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: hello\n  namespace: default\nspec:\n  template:\n    spec:\n      containers:\n        - image: ghcr.io/knative/helloworld-go:latest\n",
    )
    .unwrap();
    let svcs = run.api::<thaw::knative::Service>();
    svcs.create(&PostParams::default(), &svc).await.unwrap();
    let revs = run.api::<Revision>();
    wait_for(
        "hello-00001",
        || async { revs.get_opt("hello-00001").await.unwrap() },
        Option::is_some,
    )
    .await;
    // Every reconciler runs here, the Revision's too: play kubelet through its Deployment.
    mark_deployment_ready(&run.api(), "hello-00001").await;
    let vs = vs_until(&run, "hello-ingress", |s| {
        s.http.first().is_some_and(|h| !h.route.is_empty())
    })
    .await;
    assert_eq!(weights(&vs.spec, "hello"), [("hello-00001".into(), 100)]);
    let s = wait_for(
        "the Service Ready",
        || async { svcs.get("hello").await.unwrap() },
        |s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.status.is_true("Ready"))
        },
    )
    .await;
    let st = s.status.unwrap();
    assert!(st.status.is_true("RoutesReady"));
    assert_eq!(
        serde_json::to_value(&st).unwrap()["url"],
        "http://hello.default.example.com"
    );
    wait_for(
        "hello-00001 active",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
}

/// A deleted Route is taken off the revisions it used: they go `reserve` (no finalizer needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_route_lets_go_of_its_revisions() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let revs = run.api::<Revision>();
    wait_for(
        "hello-00001 active",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
    run.api::<Route>()
        .delete("hello", &Default::default())
        .await
        .unwrap();
    wait_for(
        "hello-00001 reserve",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("reserve"), None),
    )
    .await;
}

/// The race behind the test above, made certain: the Route's deletion reaches the controller
/// before the labeler's patch of its revision does (the controller's Revision watch is held
/// back at the relay meanwhile: an injected delay), so when the deletion is handled the
/// controller's store does not show the revision listing the route. The revision still lets
/// go of it once its watch catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_deleted_before_its_labeler_patch_is_seen_still_lets_go() {
    let (mut run, relay) = start_via_relay().await;
    // In the controller's first list, Ready and routed by no one.
    revision(&run, "hello-00001", true).await;
    relay.record("/routes?");
    run.start_controller(&relay);
    // The Revision watch starts once the first list is in the store; from then on its events
    // wait at the relay.
    wait_for(
        "the controller's Revision watch",
        || async { relay.watches("/revisions?").len() },
        |n| *n > 0,
    )
    .await;
    relay.hold(&["/revisions?", "watch=true"]);

    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let revs = run.api::<Revision>();
    wait_for(
        "hello-00001 active (at the API server)",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("active"), Some("hello")),
    )
    .await;
    run.api::<Route>()
        .delete("hello", &Default::default())
        .await
        .unwrap();
    wait_for(
        "the deletion forwarded to the controller",
        || async { relay.forwarded("/routes?", "\"DELETED\"") },
        |seen| *seen,
    )
    .await;
    // The injected delay: the controller handles the deletion while its store still shows
    // hello-00001 as it was before the labeler's patch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.release();
    wait_for(
        "hello-00001 reserve",
        || async { revs.get("hello-00001").await.unwrap() },
        |r| state(r) == (Some("reserve"), None),
    )
    .await;
}

/// 1,000 Routes, each to its own Ready revision, from nothing to Ready (VirtualService,
/// placeholder Service, labeler, status); prints the wall time
/// (`cargo test --test controller_route measure -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it explicitly"]
async fn measure_a_thousand_routes_to_ready() {
    const N: usize = 1000;
    let run = start().await;
    futures::stream::iter(0..N)
        .map(|i| {
            let run = &run;
            async move { revision(run, &format!("r{i}-00001"), true).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let started = tokio::time::Instant::now();
    futures::stream::iter(0..N)
        .map(|i| {
            let run = &run;
            async move {
                create_route(
                    run,
                    &format!("r{i}"),
                    vec![to_revision(&format!("r{i}-00001"), 100)],
                )
                .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let created = started.elapsed();
    let routes = run.api::<Route>();
    loop {
        let ready = routes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|r| is_ready(&Some((*r).clone())))
            .count();
        if ready == N {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{ready} of {N} Ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{N} Routes: created in {:.1} s, all Ready after {:.1} s",
        created.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// An invalid Route (percents summing to 90) is reported with the field named; nothing is
/// programmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_route_is_reported_with_the_field_named() {
    let run = start().await;
    revision(&run, "hello-00001", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 90)]).await;
    let r = route_until(&run, "hello", "AllTrafficAssigned InvalidSpec", |r| {
        r.as_ref().and_then(|r| cond(r, "AllTrafficAssigned"))
            == Some((ConditionStatus::False, Some("InvalidSpec".into())))
    })
    .await;
    let c = r
        .status
        .as_ref()
        .unwrap()
        .status
        .condition("Ready")
        .unwrap();
    assert_eq!(c.status, ConditionStatus::False);
    let msg = c.message.clone().unwrap_or_default();
    assert!(msg.contains("spec.traffic"), "{msg}");
    assert!(msg.contains("sum to 90"), "{msg}");
    assert!(
        run.api::<VirtualService>()
            .get_opt("hello-ingress")
            .await
            .unwrap()
            .is_none()
    );
    // Fixed: programmed and Ready.
    set_traffic(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
}

/// The race behind `a_missing_revision_is_revision_missing_until_it_exists_and_is_ready`'s
/// flakes, made certain: reconciles that start before the Revision store's first list must all
/// go on once it arrives. kube-runtime's `Store::wait_until_ready` wakes only the last of
/// several waiters, so with two routes' reconciles (and the labeler's cleanup) waiting at once,
/// all but one stayed stuck, and a stuck reconcile holds its route's key for good. The first
/// list of Revisions is held back at the relay (an injected delay) while both reconciles start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reconcile_waiting_for_the_first_list_goes_on() {
    let (mut run, relay) = start_via_relay().await;
    relay.hold(&["/revisions?", "limit="]);
    run.start_controller(&relay);
    // The Route store lists at once (its watch starts after its first list); both routes'
    // reconciles are dispatched and wait for the Revision store.
    wait_for(
        "the controller's Route watch",
        || async { relay.watches("/routes?").len() },
        |n| *n > 0,
    )
    .await;
    create_route(&run, "alpha", vec![to_revision("alpha-00001", 100)]).await;
    create_route(&run, "beta", vec![to_revision("beta-00001", 100)]).await;
    // The injected delay: both reconciles reach the wait before the list comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        relay.watches("/revisions?").is_empty(),
        "the Revision list was held"
    );
    relay.release();
    for name in ["alpha", "beta"] {
        route_until(&run, name, "AllTrafficAssigned False", |r| {
            r.as_ref().and_then(|r| cond(r, "AllTrafficAssigned"))
                == Some((ConditionStatus::False, Some("RevisionMissing".into())))
        })
        .await;
    }
}

/// `{route}-mesh`: the same splits, tags and headers on Istio's `mesh` gateway for the
/// cluster-local hosts; both VirtualServices remove every internal header from the client's
/// request on each destination, and carry the probe routes with the same hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mesh_virtual_service_routes_the_cluster_local_hosts() {
    let run = start().await;
    split_and_tag(&run).await;
    let mesh = vs_until(&run, "hello-mesh", |_| true).await;
    let ingress = vs_until(&run, "hello-ingress", |_| true).await;
    assert_eq!(mesh.spec.gateways, ["mesh"]);
    assert_eq!(
        mesh.spec.hosts,
        [
            "candidate-hello.default.svc.cluster.local",
            "hello.default.svc.cluster.local"
        ]
    );
    assert_eq!(
        weights(&mesh.spec, "hello"),
        weights(&ingress.spec, "hello"),
        "the same split"
    );
    assert_eq!(
        weights(&mesh.spec, "hello"),
        [
            ("hello-00001".to_string(), 50),
            ("hello-00002".to_string(), 50)
        ]
    );
    assert_eq!(
        weights(&mesh.spec, "candidate-hello"),
        [("hello-00002".to_string(), 100)]
    );
    let default = mesh
        .spec
        .http
        .iter()
        .find(|h| h.name.as_deref() == Some("hello"))
        .unwrap();
    let authorities: Vec<&str> = default
        .match_
        .iter()
        .map(|m| {
            assert_eq!(m.gateways, ["mesh"]);
            m.authority.as_ref().unwrap().regex.as_deref().unwrap()
        })
        .collect();
    assert_eq!(
        authorities,
        [
            r"^hello\.default(?::\d{1,5})?$",
            r"^hello\.default\.svc(?::\d{1,5})?$",
            r"^hello\.default\.svc\.cluster\.local(?::\d{1,5})?$"
        ]
    );
    // Internal headers: removed from what clients send (the two the destination sets are
    // overwritten), on every destination of both VirtualServices.
    let internal = thaw::knative::headers::INTERNAL;
    for vs in [&mesh, &ingress] {
        let mut hashes = std::collections::BTreeSet::new();
        for h in &vs.spec.http {
            let probe = h.name.as_deref().is_some_and(|n| n.ends_with("-probe"));
            for d in &h.route {
                let ops = d.headers.as_ref().unwrap().request.as_ref().unwrap();
                for name in internal {
                    let set = ops.set.contains_key(*name);
                    let removed = ops.remove.iter().any(|r| r == name);
                    let prober_sends = probe
                        && (*name == thaw::knative::headers::NETWORK_PROBE
                            || *name == thaw::knative::headers::NETWORK_HASH);
                    assert!(
                        set || removed || (prober_sends && *name == "K-Network-Probe"),
                        "{name} reaches the backend as the client sent it: {d:#?}"
                    );
                    assert!(!(set && removed), "{name} both set and removed");
                }
                if probe {
                    hashes.insert(ops.set["K-Network-Hash"].clone());
                    assert!(
                        h.match_
                            .iter()
                            .all(|m| m.headers["k-network-hash"].exact.as_deref()
                                == Some("override"))
                    );
                } else {
                    assert!(!ops.set.contains_key("K-Network-Hash"));
                }
            }
        }
        assert_eq!(hashes.len(), 1, "one hash per route: {hashes:?}");
    }
    // Probe routes come first (a probe takes them), one per group.
    assert!(
        ingress.spec.http[..2]
            .iter()
            .all(|h| h.name.as_deref().unwrap().ends_with("-probe"))
    );
}

/// Without Istio's VirtualService CRD (the API server answers 404 for networking.istio.io:
/// discovery, lists and watches), routes are `IngressReady=False VirtualServiceNotServed`
/// naming the CRD and the ingress class, and the reconciles end: more routes than workers all
/// get the condition. Once the group is served (the relay forwards again), the VirtualService
/// watch lists and every route is programmed and Ready. (The in-process API server serves the
/// kinds fixed at its start, so a CRD appearing live is not shown here: the relay plays it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_virtual_service_crd_is_a_condition_until_it_is_served() {
    let (mut run, relay) = start_via_relay().await;
    relay.refuse("/apis/networking.istio.io", 404);
    run.start_controller(&relay);
    let names: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
    for n in &names {
        revision(&run, &format!("{n}-00001"), true).await;
        create_route(&run, n, vec![to_revision(&format!("{n}-00001"), 100)]).await;
    }
    for n in &names {
        let r = route_until(&run, n, "IngressReady=False VirtualServiceNotServed", |r| {
            r.as_ref().and_then(|r| cond(r, "IngressReady"))
                == Some((
                    ConditionStatus::False,
                    Some("VirtualServiceNotServed".into()),
                ))
        })
        .await;
        let c = r
            .status
            .as_ref()
            .unwrap()
            .status
            .condition("IngressReady")
            .unwrap();
        let msg = c.message.as_deref().unwrap();
        assert!(
            msg.contains("virtualservices.networking.istio.io")
                && msg.contains("istio.ingress.networking.knative.dev"),
            "{msg}"
        );
        assert_eq!(cond(&r, "Ready").unwrap().0, ConditionStatus::False);
        // Traffic is still resolved and reported.
        assert_eq!(
            cond(&r, "AllTrafficAssigned").unwrap().0,
            ConditionStatus::True
        );
    }
    assert!(relay.answered_here("/apis/networking.istio.io") > 0);
    assert_eq!(virtual_service_count(&run).await, 0, "nothing written");

    relay.forward("/apis/networking.istio.io");
    for n in &names {
        route_until(
            &run,
            n,
            "the route Ready once VirtualServices are served",
            is_ready,
        )
        .await;
        vs_until(&run, &format!("{n}-ingress"), |_| true).await;
        vs_until(&run, &format!("{n}-mesh"), |_| true).await;
    }
}

/// A `thaw` child process, killed on drop; its stderr lines kept.
struct Child {
    child: std::process::Child,
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Child {
    /// Starts `thaw {args}` in `dir` and returns it with the `data=` address of the first
    /// log line containing `listening`.
    async fn start(
        args: &[&str],
        env: &[(&str, &str)],
        dir: &std::path::Path,
        listening: &str,
    ) -> (Self, std::net::SocketAddr) {
        use std::io::BufRead;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_thaw"));
        cmd.args(args)
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start thaw");
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push(line);
            }
        });
        let me = Child { child, logs };
        let data = wait_for(
            listening,
            || async {
                me.logs
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| l.contains(listening))
                    .map(|l| {
                        let rest = &l[l.find(" data=").unwrap() + 6..];
                        rest.split_whitespace()
                            .next()
                            .unwrap()
                            .parse::<std::net::SocketAddr>()
                            .unwrap()
                    })
            },
            Option::is_some,
        )
        .await
        .unwrap();
        (me, data)
    }
}

/// The ingress prober against gateway pods played by local processes: pod A forwards to an
/// activator (`thaw local`), pod B to a queue sidecar (`thaw queue`); both echo the hash the
/// gateway's probe route sets, so a cluster-local route is Ready once both serve it. Then B
/// stops following the VirtualServices (it serves the old hash), a third pod C is published
/// that nothing listens on, and the route changes: `IngressReady=Unknown Uninitialized`, the
/// message naming B's old hash and C's failure, until B follows again and C leaves the
/// endpoints; then Ready at the new hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prober_waits_for_every_gateway_pod_to_serve_the_current_hash() {
    use kube_support::gateway::{Backend, TestGateway, publish, virtual_services_now};
    let run = start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_activator, activator) = Child::start(
        &[
            "local",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
        dir.path(),
        "thaw local listening",
    )
    .await;
    let (_queue, sidecar) = Child::start(
        &[
            "queue",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[
            ("SERVING_NAMESPACE", NS),
            ("SERVING_REVISION", "hello-00001"),
            ("SERVING_CONFIGURATION", "hello"),
            ("SERVING_POD", "hello-00001-pod"),
            ("USER_PORT", "1"),
            ("THAW_DRAIN_DELAY", "0s"),
        ],
        dir.path(),
        "thaw queue listening",
    )
    .await;
    let local = thaw::config::network::IstioConfig::default().local_gateways[0].clone();
    let refs = [local.reference()];
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let a = TestGateway::start(run.client.clone(), &refs, Backend::Forward(activator)).await;
    let b = TestGateway::start(run.client.clone(), &refs, Backend::Forward(sidecar)).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    publish(&run.client, &local.service, &[a.addr(), b.addr()]).await;

    revision(&run, "hello-00001", true).await;
    revision(&run, "hello-00002", true).await;
    let mut r = Route::new(
        "hello",
        RouteSpec {
            traffic: vec![to_revision("hello-00001", 100)],
        },
    );
    r.metadata.namespace = Some(NS.into());
    r.metadata.labels = Some(BTreeMap::from([(
        "networking.knative.dev/visibility".to_string(),
        "cluster-local".to_string(),
    )]));
    run.api::<Route>()
        .create(&PostParams::default(), &r)
        .await
        .unwrap();
    route_until(
        &run,
        "hello",
        "Ready through the activator and the sidecar",
        is_ready,
    )
    .await;
    let hash_of = |vs: &VirtualService| {
        vs.spec.http[0].route[0]
            .headers
            .as_ref()
            .unwrap()
            .request
            .as_ref()
            .unwrap()
            .set["K-Network-Hash"]
            .clone()
    };
    let first = hash_of(&vs_until(&run, "hello-ingress", |_| true).await);

    // B keeps the routes of now; C is down; the route moves to hello-00002.
    b.freeze(virtual_services_now(&run.client).await);
    publish(&run.client, &local.service, &[a.addr(), b.addr(), down]).await;
    set_traffic(&run, "hello", vec![to_revision("hello-00002", 100)]).await;
    let second = hash_of(
        &vs_until(&run, "hello-ingress", |s| {
            s.http[0].route[0]
                .headers
                .as_ref()
                .unwrap()
                .request
                .as_ref()
                .unwrap()
                .set["K-Network-Hash"]
                != first
        })
        .await,
    );
    let waiting = route_until(&run, "hello", "IngressReady Unknown naming B and C", |r| {
        r.as_ref()
            .and_then(|r| r.status.as_ref()?.status.condition("IngressReady").cloned())
            .is_some_and(|c| {
                let m = c.message.unwrap_or_default();
                c.status == ConditionStatus::Unknown
                    && c.reason.as_deref() == Some("Uninitialized")
                    && m.contains(&format!("pod {} ", b.addr()))
                    && m.contains(&format!("serves hash {}", &first[..12]))
                    && m.contains(&format!("pod {down} "))
                    && m.contains("cannot connect")
                    && !m.contains(&format!("pod {} ", a.addr()))
            })
    })
    .await;
    assert_eq!(cond(&waiting, "Ready").unwrap().0, ConditionStatus::Unknown);

    // B follows again; C leaves the endpoints (its pod is gone): Ready at the new hash.
    b.thaw();
    publish(&run.client, &local.service, &[a.addr(), b.addr()]).await;
    route_until(&run, "hello", "Ready at the new hash", is_ready).await;
    assert_ne!(first, second);
}

// ---------------------------------------------------------------------------------------------
// The Gateway API ingress class

fn gateway_api_settings() -> Settings {
    let mut s = Settings::default();
    s.network.templates.ingress_class = IngressClass::GatewayApi;
    s
}

async fn http_route_until(
    run: &Running,
    name: &str,
    ok: impl Fn(&Option<HTTPRoute>) -> bool,
) -> Option<HTTPRoute> {
    let api = run.api::<HTTPRoute>();
    wait_for(
        &format!("the HTTPRoute {name}"),
        || async { api.get_opt(name).await.unwrap() },
        ok,
    )
    .await
}

/// (Service, port, weight, Knative-Serving-Revision) of each backendRef of `hr`'s rule.
fn backends(hr: &HTTPRoute) -> Vec<(String, i32, i32, String)> {
    hr.spec.rules[0]
        .backend_refs
        .iter()
        .map(|b| {
            let set = &b.filters[0].request_header_modifier.as_ref().unwrap().set;
            let header = |n: &str| set.iter().find(|h| h.name == n).unwrap().value.clone();
            assert_eq!(header("Knative-Serving-Namespace"), NS);
            (
                b.name.clone(),
                b.port.unwrap(),
                b.weight.unwrap(),
                header("Knative-Serving-Revision"),
            )
        })
        .collect()
}

/// Plays the gateway's implementation: reports `conditions` (type, status, reason) for every
/// parent of the HTTPRoute `name`, for its current generation.
async fn report(run: &Running, name: &str, conditions: &[(&str, &str, &str)]) {
    let api = run.api::<HTTPRoute>();
    loop {
        let mut hr = api.get(name).await.unwrap();
        hr.status = Some(hr.status_for_every_parent("example.com/gateway-controller", conditions));
        match api.replace_status(name, &PostParams::default(), &hr).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

const ACCEPTED: &[(&str, &str, &str)] = &[
    ("Accepted", "True", "Accepted"),
    ("ResolvedRefs", "True", "ResolvedRefs"),
];

/// The message of the route's `IngressReady` condition.
fn ingress_message(r: &Route) -> String {
    let c = r
        .status
        .as_ref()
        .and_then(|s| s.status.condition("IngressReady"));
    c.and_then(|c| c.message.clone()).unwrap_or_default()
}

fn ingress_ready(r: &Option<Route>, status: ConditionStatus, reason: &str) -> bool {
    r.as_ref().and_then(|r| cond(r, "IngressReady")) == Some((status, Some(reason.into())))
}

/// With `ingress-class: gateway-api.ingress.networking.knative.dev` a split with a tag becomes
/// four HTTPRoutes (each group's external and cluster-local hosts) on config-gateway's
/// gateways, with weighted backendRefs setting the revision headers; no VirtualService is
/// written; the placeholder Service points at config-gateway's local gateway Service. The
/// route is `IngressReady=Unknown` until the gateways report `Accepted` and `ResolvedRefs` on
/// every HTTPRoute, then Ready; a gateway refusing one makes it False with the gateway's
/// reason; a tag removed takes its HTTPRoutes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_api_class_writes_http_routes_ready_from_their_conditions() {
    let (run, _ctx) = start_with(gateway_api_settings()).await;
    revision(&run, "hello-00001", true).await;
    revision(&run, "hello-00002", true).await;
    let mut traffic = vec![
        to_revision("hello-00001", 70),
        to_revision("hello-00002", 30),
    ];
    traffic.push(TrafficTarget {
        tag: Some("candidate".into()),
        ..to_revision("hello-00002", 0)
    });
    create_route(&run, "hello", traffic).await;
    let ext = http_route_until(&run, "hello.default.example.com", Option::is_some)
        .await
        .unwrap();
    assert_eq!(
        backends(&ext),
        [
            ("hello-00001".into(), 80, 70, "hello-00001".into()),
            ("hello-00002".into(), 80, 30, "hello-00002".into())
        ]
    );
    assert_eq!(ext.spec.parent_refs[0].name, "knative-gateway");
    let names = [
        "hello.default.example.com",
        "hello.default.svc.cluster.local",
        "candidate-hello.default.example.com",
        "candidate-hello.default.svc.cluster.local",
    ];
    for n in names {
        http_route_until(&run, n, Option::is_some).await;
    }
    let tag = run
        .api::<HTTPRoute>()
        .get("candidate-hello.default.svc.cluster.local")
        .await
        .unwrap();
    assert_eq!(tag.spec.parent_refs[0].name, "knative-local-gateway");
    assert_eq!(backends(&tag)[0].2, 100);
    let r = route_until(&run, "hello", "IngressReady=Unknown until reported", |r| {
        ingress_ready(r, ConditionStatus::Unknown, "Uninitialized")
    })
    .await;
    assert!(ingress_message(&r).contains("has not reported"));
    assert_eq!(
        virtual_service_count(&run).await,
        0,
        "the Gateway API class writes no VirtualService"
    );
    let placeholder = run.api::<KubeService>().get("hello").await.unwrap();
    assert_eq!(
        placeholder.spec.unwrap().external_name.as_deref(),
        Some("knative-local-gateway.istio-system.svc.cluster.local")
    );

    // Accepted alone is not Ready; Accepted and ResolvedRefs on all four are.
    for n in names {
        report(&run, n, &ACCEPTED[..1]).await;
    }
    let r = run.api::<Route>().get("hello").await.unwrap();
    assert_ne!(cond(&r, "Ready").map(|c| c.0), Some(ConditionStatus::True));
    for n in names {
        report(&run, n, ACCEPTED).await;
    }
    route_until(&run, "hello", "the route Ready", is_ready).await;

    // A gateway refusing one HTTPRoute.
    report(
        &run,
        names[2],
        &[
            ("Accepted", "False", "NotAllowedByListeners"),
            ("ResolvedRefs", "True", "ResolvedRefs"),
        ],
    )
    .await;
    let r = route_until(
        &run,
        "hello",
        "IngressReady=False as the gateway says",
        |r| ingress_ready(r, ConditionStatus::False, "NotAllowedByListeners"),
    )
    .await;
    assert_eq!(cond(&r, "Ready").unwrap().0, ConditionStatus::False);

    // The tag removed: its HTTPRoutes go.
    set_traffic(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    http_route_until(&run, names[2], Option::is_none).await;
    http_route_until(&run, names[3], Option::is_none).await;
    let ext = http_route_until(&run, names[0], |h| {
        h.as_ref().is_some_and(|h| backends(h).len() == 1)
    })
    .await
    .unwrap();
    assert_eq!(backends(&ext)[0].2, 100);
}

/// Changing `ingress-class` live moves a route's ingress to the other class's objects: the
/// VirtualServices are deleted once the HTTPRoutes are written, and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_the_ingress_class_replaces_the_routes_objects() {
    let (run, ctx) = start_with(Settings::default()).await;
    revision(&run, "hello-00001", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    route_until(&run, "hello", "Ready on Istio", is_ready).await;
    vs_until(&run, "hello-ingress", |_| true).await;

    ctx.set_settings(gateway_api_settings());
    http_route_until(&run, "hello.default.example.com", Option::is_some).await;
    wait_for(
        "the VirtualServices deleted",
        || virtual_service_count(&run),
        |n| *n == 0,
    )
    .await;

    ctx.set_settings(Settings::default());
    vs_until(&run, "hello-ingress", |_| true).await;
    http_route_until(&run, "hello.default.example.com", Option::is_none).await;
    http_route_until(&run, "hello.default.svc.cluster.local", Option::is_none).await;
    route_until(&run, "hello", "Ready on Istio again", is_ready).await;
}

/// Without the Gateway API's HTTPRoute CRD, routes of that class are `IngressReady=False
/// HTTPRouteNotServed` naming the CRD; once served, their HTTPRoutes are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_http_route_crd_is_a_condition_until_it_is_served() {
    let (mut run, relay) = start_via_relay().await;
    relay.refuse("/apis/gateway.networking.k8s.io", 404);
    run.start_controller_with(&relay, gateway_api_settings());
    revision(&run, "hello-00001", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let r = route_until(
        &run,
        "hello",
        "IngressReady=False HTTPRouteNotServed",
        |r| ingress_ready(r, ConditionStatus::False, "HTTPRouteNotServed"),
    )
    .await;
    let msg = ingress_message(&r);
    assert!(
        msg.contains("httproutes.gateway.networking.k8s.io")
            && msg.contains("gateway-api.ingress.networking.knative.dev"),
        "{msg}"
    );
    relay.forward("/apis/gateway.networking.k8s.io");
    http_route_until(&run, "hello.default.example.com", Option::is_some).await;
}

// ---------------------------------------------------------------------------------------------
// DomainMapping

/// A DomainMapping `domain` in [`NS`] to the Route `route`.
async fn create_domain_mapping(run: &Running, domain: &str, route: &str) {
    let dm = DomainMapping::new(
        domain,
        DomainMappingSpec {
            ref_: KReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Route".into(),
                name: route.into(),
                namespace: None,
            },
            tls: None,
        },
    );
    run.api::<DomainMapping>()
        .create(&PostParams::default(), &dm)
        .await
        .unwrap();
}

async fn create_claim(run: &Running, domain: &str, namespace: &str) {
    let claim = ClusterDomainClaim::new(
        domain,
        ClusterDomainClaimSpec {
            namespace: namespace.into(),
        },
    );
    Api::<ClusterDomainClaim>::all(run.client.clone())
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

async fn domain_mapping_until(
    run: &Running,
    domain: &str,
    what: &str,
    ok: impl Fn(&DomainMapping) -> bool,
) -> DomainMapping {
    let api = run.api::<DomainMapping>();
    wait_for(what, || async { api.get(domain).await.unwrap() }, ok).await
}

fn dm_cond(dm: &DomainMapping, t: &str) -> Option<(ConditionStatus, Option<String>)> {
    let c = dm.status.as_ref()?.status.condition(t)?;
    Some((c.status, c.reason.clone()))
}

/// The controller with the DomainMapping reconciler beside the Route one, a ready route
/// `hello` to map.
async fn start_with_domain_mapping(settings: Settings) -> Running {
    let (mut run, ctx) = start_with(settings).await;
    let routes = run.task.abort_handle();
    run.task = tokio::spawn(async move {
        let _both = DropAbort(routes);
        thaw::controller::domain_mapping::controller(ctx).await
    });
    revision(&run, "hello-00001", true).await;
    create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    run
}

/// Aborts the task when dropped (the Route controller's, with the DomainMapping one's).
struct DropAbort(tokio::task::AbortHandle);

impl Drop for DropAbort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A DomainMapping of an unclaimed domain (autocreate-cluster-domain-claims off, Knative's
/// default) or of a domain another namespace claims is `DomainClaimed=False
/// DomainAlreadyClaimed` and writes nothing; once the claim names its namespace, its
/// VirtualService `{domain}-ingress` sends the domain to the Route's placeholder Service with
/// the Host rewritten to the Route's, and it is Ready at `http://{domain}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_mapping_is_served_once_its_namespace_claims_the_domain() {
    let run = start_with_domain_mapping(Settings::default()).await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    create_claim(&run, "taken.example.org", "someone-else").await;
    for domain in ["hello.example.org", "taken.example.org"] {
        create_domain_mapping(&run, domain, "hello").await;
        let dm = domain_mapping_until(&run, domain, "DomainAlreadyClaimed", |d| {
            dm_cond(d, "DomainClaimed")
                == Some((ConditionStatus::False, Some("DomainAlreadyClaimed".into())))
        })
        .await;
        assert_eq!(
            dm_cond(&dm, "Ready").map(|c| c.0),
            Some(ConditionStatus::False)
        );
    }
    // Nothing is written for a domain the namespace does not hold.
    assert_eq!(virtual_service_count(&run).await, 2, "the Route's two only");

    create_claim(&run, "hello.example.org", NS).await;
    let dm = domain_mapping_until(&run, "hello.example.org", "Ready", |d| {
        dm_cond(d, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
    })
    .await;
    let st = dm.status.unwrap();
    assert_eq!(st.url.as_deref(), Some("http://hello.example.org"));
    let vs = vs_until(&run, "hello.example.org-ingress", |_| true).await;
    assert_eq!(vs.spec.hosts, ["hello.example.org"]);
    assert_eq!(
        vs.spec.gateways,
        ["knative-serving/knative-ingress-gateway"]
    );
    let http = &vs.spec.http[0];
    assert_eq!(
        http.rewrite.as_ref().unwrap().authority.as_deref(),
        Some("hello.default.svc.cluster.local")
    );
    let d = &http.route[0].destination;
    assert_eq!(
        (d.host.as_str(), d.port.as_ref().unwrap().number),
        ("hello.default.svc.cluster.local", 80)
    );
    // The other namespace's domain stays refused.
    let taken = run
        .api::<DomainMapping>()
        .get("taken.example.org")
        .await
        .unwrap();
    assert_eq!(
        dm_cond(&taken, "DomainClaimed").unwrap().0,
        ConditionStatus::False
    );
}

/// With autocreate-cluster-domain-claims the DomainMapping claims its domain for its
/// namespace; with the Gateway API class its ingress is the HTTPRoute `{domain}`, a URLRewrite
/// to the Route's host, Ready once the gateway accepts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_mapping_claims_its_domain_and_is_an_http_route_with_the_gateway_api() {
    let mut settings = gateway_api_settings();
    settings.network.templates.autocreate_cluster_domain_claims = true;
    let run = start_with_domain_mapping(settings).await;
    create_domain_mapping(&run, "hello.example.org", "hello").await;
    let claims = Api::<ClusterDomainClaim>::all(run.client.clone());
    let claim = wait_for(
        "the claim",
        || async { claims.get_opt("hello.example.org").await.unwrap() },
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(claim.spec.namespace, NS);
    let hr = http_route_until(&run, "hello.example.org", Option::is_some)
        .await
        .unwrap();
    assert_eq!(hr.spec.hostnames, ["hello.example.org"]);
    let rule = &hr.spec.rules[0];
    let rewrite = rule
        .filters
        .iter()
        .find_map(|f| f.url_rewrite.as_ref())
        .unwrap();
    assert_eq!(
        rewrite.hostname.as_deref(),
        Some("hello.default.svc.cluster.local")
    );
    assert_eq!(
        (
            rule.backend_refs[0].name.as_str(),
            rule.backend_refs[0].port
        ),
        ("hello", Some(80))
    );
    // The Route's own HTTPRoutes too; the gateway accepts them all.
    for n in [
        "hello.example.org",
        "hello.default.example.com",
        "hello.default.svc.cluster.local",
    ] {
        http_route_until(&run, n, Option::is_some).await;
        report(&run, n, ACCEPTED).await;
    }
    domain_mapping_until(&run, "hello.example.org", "Ready", |d| {
        dm_cond(d, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
    })
    .await;
}

/// Knative's finalizer: each DomainMapping holds `domainmappings.serving.knative.dev`; when
/// it is deleted with autocreate-cluster-domain-claims on, the claim it made for its namespace
/// is released (then it goes), while a claim another namespace holds stays; so the domain
/// can be mapped again, and a DomainMapping refused it before claims it now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_domain_mapping_releases_the_claim_it_made() {
    let mut settings = Settings::default();
    settings.network.templates.autocreate_cluster_domain_claims = true;
    let run = start_with_domain_mapping(settings).await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    create_claim(&run, "taken.example.org", "someone-else").await;
    for domain in ["hello.example.org", "taken.example.org"] {
        create_domain_mapping(&run, domain, "hello").await;
        let dm = domain_mapping_until(&run, domain, "the finalizer", |d| {
            d.finalizers()
                .iter()
                .any(|f| f == "domainmappings.serving.knative.dev")
                && dm_cond(d, "DomainClaimed").is_some()
        })
        .await;
        let claimed = dm_cond(&dm, "DomainClaimed").unwrap().0;
        assert_eq!(
            claimed == ConditionStatus::True,
            domain == "hello.example.org",
            "{dm:?}"
        );
    }
    let claims = Api::<ClusterDomainClaim>::all(run.client.clone());
    let dms = run.api::<DomainMapping>();
    for domain in ["hello.example.org", "taken.example.org"] {
        dms.delete(domain, &Default::default()).await.unwrap();
        wait_for(
            "the DomainMapping gone",
            || async { dms.get_opt(domain).await.unwrap() },
            Option::is_none,
        )
        .await;
    }
    assert!(
        claims.get_opt("hello.example.org").await.unwrap().is_none(),
        "the claim the DomainMapping made is released"
    );
    assert_eq!(
        claims
            .get("taken.example.org")
            .await
            .unwrap()
            .spec
            .namespace,
        "someone-else",
        "another namespace's claim stays"
    );
    // Mapped again: claimed again. (The in-process API server has no garbage collector:
    // the deleted DomainMapping's VirtualService goes as Kubernetes' would delete it.)
    run.api::<VirtualService>()
        .delete("hello.example.org-ingress", &Default::default())
        .await
        .unwrap();
    create_domain_mapping(&run, "hello.example.org", "hello").await;
    domain_mapping_until(&run, "hello.example.org", "Ready", |d| {
        dm_cond(d, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
    })
    .await;
    assert_eq!(
        claims
            .get("hello.example.org")
            .await
            .unwrap()
            .spec
            .namespace,
        NS
    );
}

// ---------------------------------------------------------------------------------------------
// TLS through cert-manager

use thaw::config::network::HttpProtocol;
use thaw::controller::route::certificate::{
    Certificate, CertificateCondition, CertificateStatus, route_certificate_name,
};
use thaw::controller::route::istio_tls;
use thaw::controller::route::virtual_service::Gateway as IstioGateway;

const GATEWAY_NS: &str = "istio-system";

fn tls_settings(http: HttpProtocol) -> Settings {
    let mut s = Settings::default();
    s.network.templates.external_domain_tls = true;
    s.network.templates.http_protocol = http;
    s.network.certmanager.issuer_ref.name = "letsencrypt".into();
    s
}

/// The Istio Gateway a route `name`'s TLS hosts get (for config-istio's default gateway).
fn tls_gateway(name: &str) -> String {
    istio_tls::tls_gateway_name(
        name,
        &thaw::config::network::IstioConfig::default().external_gateways[0],
    )
}

/// Plays cert-manager: writes the Certificate's Secret and marks it Ready.
async fn issue(run: &Running, name: &str) {
    let secrets = run.api::<k8s_openapi::api::core::v1::Secret>();
    let data = BTreeMap::from([
        (
            "tls.crt".to_string(),
            k8s_openapi::ByteString(b"cert of ".iter().chain(name.as_bytes()).copied().collect()),
        ),
        (
            "tls.key".to_string(),
            k8s_openapi::ByteString(b"key".to_vec()),
        ),
    ]);
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    if secrets.get_opt(name).await.unwrap().is_none() {
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let api = run.api::<Certificate>();
    loop {
        let mut c = api.get(name).await.unwrap();
        c.status = Some(CertificateStatus {
            conditions: vec![CertificateCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("Ready".into()),
                observed_generation: c.metadata.generation,
                ..CertificateCondition::default()
            }],
        });
        match api.replace_status(name, &PostParams::default(), &c).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// The message of the route's `CertificateProvisioned` condition.
fn tls_message(r: &Route) -> String {
    let c = r
        .status
        .as_ref()
        .and_then(|s| s.status.condition("CertificateProvisioned"));
    c.and_then(|c| c.message.clone()).unwrap_or_default()
}

fn tls_cond(r: &Option<Route>) -> Option<(ConditionStatus, Option<String>)> {
    r.as_ref().and_then(|r| cond(r, "CertificateProvisioned"))
}

/// The istio-ingressgateway Service gets the pod selector the TLS Gateways copy.
async fn select_gateway_pods(run: &Running) {
    let svcs: Api<KubeService> = Api::namespaced(run.client.clone(), GATEWAY_NS);
    svcs.patch(
        "istio-ingressgateway",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"selector": {"istio": "ingressgateway"}}})),
    )
    .await
    .unwrap();
}

/// With `external-domain-tls: Enabled`, a route with a tag gets one cert-manager Certificate
/// per external host, owned by it, with config-certmanager's issuer. While they are not ready
/// the route is served over http (`HTTPDowngrade`, http URLs); once cert-manager marks them
/// Ready the URLs are https, `CertificateProvisioned` True, and the Istio class writes a TLS
/// Gateway (the gateway Service's selector, an HTTPS server per host with the Secret's copy in
/// the gateway's namespace as credential) that the external matches are bound to.
/// `http-protocol: Redirected` makes its http server redirect; TLS turned off deletes the
/// Certificates, the Gateway and the copies; a deleted route's copies are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_certificates_then_https_with_an_istio_tls_gateway() {
    let gw = format!("{NS}/{}", tls_gateway("hello"));
    let (run, ctx) = start_serving(tls_settings(HttpProtocol::Enabled), &[&gw]).await;
    select_gateway_pods(&run).await;
    revision(&run, "hello-00001", true).await;
    let mut tagged = to_revision("hello-00001", 0);
    tagged.tag = Some("candidate".into());
    let created = create_route(&run, "hello", vec![to_revision("hello-00001", 100), tagged]).await;
    let uid = created.uid().unwrap();
    let (main, tag) = (
        route_certificate_name(&uid, None),
        route_certificate_name(&uid, Some("candidate")),
    );

    let certs = run.api::<Certificate>();
    let c = wait_for(
        "the Certificates",
        || async { certs.list(&Default::default()).await.unwrap().items },
        |l| l.len() == 2,
    )
    .await;
    let by_name = |n: &str| c.iter().find(|c| c.name_any() == n).unwrap().clone();
    let (mc, tc) = (by_name(&main), by_name(&tag));
    assert_eq!(mc.spec.dns_names, ["hello.default.example.com"]);
    assert_eq!(tc.spec.dns_names, ["candidate-hello.default.example.com"]);
    assert_eq!(mc.spec.secret_name, main);
    assert_eq!(mc.spec.issuer_ref.name, "letsencrypt");
    assert_eq!(mc.spec.issuer_ref.kind.as_deref(), Some("ClusterIssuer"));
    assert_eq!(mc.owner_references()[0].uid, uid);

    // Not ready: served over http meanwhile, the route Ready.
    let r = route_until(&run, "hello", "HTTPDowngrade", |r| {
        is_ready(r) && tls_cond(r).is_some_and(|c| c.1.as_deref() == Some("HTTPDowngrade"))
    })
    .await;
    let st = r.status.unwrap();
    assert_eq!(
        st.fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );

    // With Redirected, a Certificate not ready is CertificateNotReady (Unknown).
    ctx.set_settings(tls_settings(HttpProtocol::Redirected));
    let r = route_until(&run, "hello", "CertificateNotReady", |r| {
        tls_cond(r) == Some((ConditionStatus::Unknown, Some("CertificateNotReady".into())))
    })
    .await;
    let m = tls_message(&r);
    assert!(m.starts_with("Certificate route-"), "{m}");
    assert_eq!(
        r.status.unwrap().fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    ctx.set_settings(tls_settings(HttpProtocol::Enabled));

    issue(&run, &main).await;
    issue(&run, &tag).await;
    let r = route_until(&run, "hello", "https", |r| {
        is_ready(r) && tls_cond(r) == Some((ConditionStatus::True, None))
    })
    .await;
    let st = r.status.unwrap();
    assert_eq!(
        st.fields.url.as_deref(),
        Some("https://hello.default.example.com")
    );
    let tag_url = st.fields.traffic.iter().find_map(|t| t.url.clone());
    assert_eq!(
        tag_url.as_deref(),
        Some("https://candidate-hello.default.example.com")
    );
    assert_eq!(
        st.fields.address.and_then(|a| a.url).as_deref(),
        Some("http://hello.default.svc.cluster.local")
    );

    // The Istio objects: the TLS Gateway, the Secret copies, the VirtualService bound to it.
    let gateways = run.api::<IstioGateway>();
    let g = gateways.get(&tls_gateway("hello")).await.unwrap();
    assert_eq!(g.owner_references()[0].uid, uid);
    assert_eq!(g.spec.selector["istio"], "ingressgateway");
    let https: Vec<(Vec<String>, Option<String>)> = g
        .spec
        .servers
        .iter()
        .filter(|s| s.port.number == 443)
        .map(|s| {
            (
                s.hosts.clone(),
                s.tls.as_ref().unwrap().credential_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        https,
        [
            (
                vec!["hello.default.example.com".to_string()],
                Some(istio_tls::copy_name(&uid, NS, &main))
            ),
            (
                vec!["candidate-hello.default.example.com".to_string()],
                Some(istio_tls::copy_name(&uid, NS, &tag))
            ),
        ]
    );
    let http = g.spec.servers.iter().find(|s| s.port.number == 80).unwrap();
    assert_eq!(http.tls, None);
    let copies: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(run.client.clone(), GATEWAY_NS);
    let copy = copies
        .get(&istio_tls::copy_name(&uid, NS, &main))
        .await
        .unwrap();
    let origin = run
        .api::<k8s_openapi::api::core::v1::Secret>()
        .get(&main)
        .await
        .unwrap();
    assert_eq!(copy.data, origin.data);
    assert_eq!(copy.labels()[istio_tls::ORIGIN_SECRET_NAME], main);
    assert_eq!(copy.labels()[istio_tls::ORIGIN_SECRET_NAMESPACE], NS);
    let vs = vs_until(&run, "hello-ingress", |s| s.gateways.contains(&gw)).await;
    let ext_match = vs
        .spec
        .http
        .iter()
        .flat_map(|r| r.match_.iter())
        .find(|m| {
            m.authority
                .as_ref()
                .and_then(|a| a.regex.as_deref())
                .is_some_and(|re| re.starts_with("^hello\\.default\\.example"))
        })
        .unwrap();
    assert_eq!(ext_match.gateways, std::slice::from_ref(&gw));

    // Redirected: the http server of the TLS Gateway redirects; still Ready (the redirected
    // hosts are not probed over http).
    ctx.set_settings(tls_settings(HttpProtocol::Redirected));
    wait_for(
        "the http server redirecting",
        || async { gateways.get(&tls_gateway("hello")).await.unwrap() },
        |g| {
            g.spec.servers.iter().any(|s| {
                s.port.number == 80 && s.tls.as_ref().and_then(|t| t.https_redirect) == Some(true)
            })
        },
    )
    .await;
    route_until(&run, "hello", "Ready, redirected", is_ready).await;

    // TLS off: the Certificates, the TLS Gateway and the copies go; http again.
    ctx.set_settings(Settings::default());
    let r = route_until(&run, "hello", "TLSNotEnabled", |r| {
        tls_cond(r).is_some_and(|c| c.1.as_deref() == Some("TLSNotEnabled"))
    })
    .await;
    assert_eq!(
        r.status.unwrap().fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    wait_for(
        "the Certificates deleted",
        || async { certs.list(&Default::default()).await.unwrap().items.len() },
        |n| *n == 0,
    )
    .await;
    wait_for(
        "the TLS Gateway and the copies deleted",
        || async {
            (
                gateways
                    .get_opt(&tls_gateway("hello"))
                    .await
                    .unwrap()
                    .is_none(),
                copies.list(&Default::default()).await.unwrap().items.len(),
            )
        },
        |(gone, n)| *gone && *n == 0,
    )
    .await;

    // TLS on again, issued again: the copies are back; the route deleted takes them along.
    ctx.set_settings(tls_settings(HttpProtocol::Enabled));
    wait_for(
        "the Certificates again",
        || async { certs.list(&Default::default()).await.unwrap().items.len() },
        |n| *n == 2,
    )
    .await;
    issue(&run, &main).await;
    issue(&run, &tag).await;
    wait_for(
        "the copies again",
        || async { copies.list(&Default::default()).await.unwrap().items.len() },
        |n| *n == 2,
    )
    .await;
    run.api::<Route>()
        .delete("hello", &Default::default())
        .await
        .unwrap();
    wait_for(
        "the deleted route's copies deleted",
        || async { copies.list(&Default::default()).await.unwrap().items.len() },
        |n| *n == 0,
    )
    .await;
}

/// A Certificate that is not the route's is `CertificateNotOwned`, and left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_someone_else_is_not_owned() {
    let (run, ctx) = start_with(Settings::default()).await;
    revision(&run, "hello-00001", true).await;
    let created = create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    route_until(&run, "hello", "Ready without TLS", is_ready).await;
    let name = route_certificate_name(&created.uid().unwrap(), None);
    let certs = run.api::<Certificate>();
    let mut theirs = Certificate::new(&name, Default::default());
    theirs.spec.secret_name = "theirs".into();
    theirs.spec.issuer_ref.name = "theirs".into();
    certs.create(&PostParams::default(), &theirs).await.unwrap();
    ctx.set_settings(tls_settings(HttpProtocol::Enabled));
    let r = route_until(&run, "hello", "CertificateNotOwned", |r| {
        tls_cond(r).is_some_and(|c| c.1.as_deref() == Some("CertificateNotOwned"))
    })
    .await;
    assert_eq!(tls_cond(&Some(r)).unwrap().0, ConditionStatus::False);
    assert_eq!(certs.get(&name).await.unwrap().spec.secret_name, "theirs");
}

/// config-gateway's default external Gateway, with an http listener (as an operator installs
/// it).
async fn create_external_gateway(run: &Running) {
    use thaw::controller::route::http_route::{Gateway, GatewaySpec, Listener};
    let api: Api<Gateway> = Api::namespaced(run.client.clone(), GATEWAY_NS);
    let mut gw = Gateway::new(
        "knative-gateway",
        GatewaySpec {
            gateway_class_name: "istio".into(),
            listeners: vec![Listener {
                name: "http".into(),
                port: 80,
                protocol: "HTTP".into(),
                ..Listener::default()
            }],
        },
    );
    gw.metadata.namespace = Some(GATEWAY_NS.into());
    api.create(&PostParams::default(), &gw).await.unwrap();
}

/// With the Gateway API class, a Ready Certificate becomes (once the Gateway exists:
/// `IngressReady=False GatewayMissing` until then) a listener on config-gateway's
/// external Gateway (HTTPS, the Secret in the route's namespace, routes from that namespace
/// only; the operator's http listener kept), a ReferenceGrant in the route's namespace for
/// the Gateway's namespace, and the HTTPRoute attached to it; with `Redirected` the HTTPRoute
/// is on the TLS listener only and `{host}-redirect` redirects http to https. Deleting the
/// route takes its listener off the Gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_api_tls_is_a_listener_and_a_reference_grant() {
    use thaw::controller::route::gateway_tls;
    use thaw::controller::route::http_route::{Gateway, ReferenceGrant};
    let with_tls = |http| {
        let mut s = tls_settings(http);
        s.network.templates.ingress_class = IngressClass::GatewayApi;
        s
    };
    let (run, ctx) = start_with(with_tls(HttpProtocol::Enabled)).await;
    revision(&run, "hello-00001", true).await;
    let created = create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let cert = route_certificate_name(&created.uid().unwrap(), None);
    wait_for(
        "the Certificate",
        || async { run.api::<Certificate>().get_opt(&cert).await.unwrap() },
        Option::is_some,
    )
    .await;
    issue(&run, &cert).await;
    // The external Gateway does not exist yet: the route says so, and is retried.
    let r = route_until(&run, "hello", "GatewayMissing", |r| {
        ingress_ready(r, ConditionStatus::False, "GatewayMissing")
    })
    .await;
    assert!(
        ingress_message(&r).contains("istio-system/knative-gateway"),
        "{}",
        ingress_message(&r)
    );
    create_external_gateway(&run).await;
    let host = "hello.default.example.com";
    let listener = thaw::controller::route::tls_owner::listener_name(&created.uid().unwrap(), host);
    let gateways: Api<Gateway> = Api::namespaced(run.client.clone(), GATEWAY_NS);
    let listeners_until = |what: &'static str, n: usize| {
        let gateways = gateways.clone();
        async move {
            wait_for(
                what,
                || async { gateways.get("knative-gateway").await.unwrap() },
                |g| g.spec.listeners.len() == n,
            )
            .await
        }
    };
    let gw = listeners_until("the TLS listener", 2).await;
    assert_eq!(gw.spec.listeners[0].name, "http");
    let l = &gw.spec.listeners[1];
    assert_eq!(
        (
            l.name.as_str(),
            l.hostname.as_deref(),
            l.port,
            l.protocol.as_str()
        ),
        (listener.as_str(), Some(host), 443, "HTTPS")
    );
    let tls = l.tls.as_ref().unwrap();
    assert_eq!(tls.mode.as_deref(), Some("Terminate"));
    assert_eq!(
        (
            tls.certificate_refs[0].name.as_str(),
            tls.certificate_refs[0].namespace.as_deref()
        ),
        (cert.as_str(), Some(NS))
    );
    let ns_selector = &l
        .allowed_routes
        .as_ref()
        .unwrap()
        .namespaces
        .as_ref()
        .unwrap();
    assert_eq!(ns_selector.from.as_deref(), Some("Selector"));
    assert_eq!(
        ns_selector.selector.as_ref().unwrap().match_labels["kubernetes.io/metadata.name"],
        NS
    );
    let grant = run
        .api::<ReferenceGrant>()
        .get(&gateway_tls::reference_grant_name("hello"))
        .await
        .unwrap();
    assert_eq!(grant.owner_references()[0].uid, created.uid().unwrap());
    assert_eq!(
        (
            grant.spec.from[0].kind.as_str(),
            grant.spec.from[0].namespace.as_str()
        ),
        ("Gateway", GATEWAY_NS)
    );
    assert_eq!(
        (
            grant.spec.to[0].kind.as_str(),
            grant.spec.to[0].name.as_deref()
        ),
        ("Secret", Some(cert.as_str()))
    );
    // Enabled: the parentRef without a sectionName attaches to both listeners.
    let hr = http_route_until(&run, host, Option::is_some).await.unwrap();
    assert_eq!(hr.spec.parent_refs.len(), 1);
    assert_eq!(hr.spec.parent_refs[0].section_name, None);
    for n in [host, "hello.default.svc.cluster.local"] {
        report(&run, n, ACCEPTED).await;
    }
    let r = route_until(&run, "hello", "Ready over https", |r| {
        is_ready(r) && tls_cond(r) == Some((ConditionStatus::True, None))
    })
    .await;
    assert_eq!(
        r.status.unwrap().fields.url.as_deref(),
        Some("https://hello.default.example.com")
    );

    // Redirected: the HTTPRoute on the TLS listener, http redirected by another one.
    ctx.set_settings(with_tls(HttpProtocol::Redirected));
    let hr = http_route_until(&run, host, |h| {
        h.as_ref()
            .is_some_and(|h| h.spec.parent_refs[0].section_name.is_some())
    })
    .await
    .unwrap();
    assert_eq!(
        hr.spec.parent_refs[0].section_name.as_deref(),
        Some(listener.as_str())
    );
    let redirect = format!("{host}-redirect");
    let rd = http_route_until(&run, &redirect, Option::is_some)
        .await
        .unwrap();
    assert_eq!(rd.spec.parent_refs[0].port, Some(80));
    let f = &rd.spec.rules[0].filters[0];
    assert_eq!(f.type_, "RequestRedirect");
    let to = f.request_redirect.as_ref().unwrap();
    assert_eq!(
        (to.scheme.as_deref(), to.status_code),
        (Some("https"), Some(301))
    );
    assert!(rd.spec.rules[0].backend_refs.is_empty());
    for n in [host, redirect.as_str()] {
        report(&run, n, ACCEPTED).await;
    }
    route_until(&run, "hello", "Ready, redirected", is_ready).await;

    // The route deleted: its listener is taken off the Gateway, the operator's stays.
    run.api::<Route>()
        .delete("hello", &Default::default())
        .await
        .unwrap();
    let gw = listeners_until("the TLS listener removed", 1).await;
    assert_eq!(gw.spec.listeners[0].name, "http");
}

/// A DomainMapping with `external-domain-tls` gets its own Certificate `{domain}` (owned by
/// it, config-certmanager's issuer); once Ready its URL is https and the Istio class serves it
/// with a TLS Gateway and the Secret's copy. One with `spec.tls.secretName` is served with that
/// Secret at once (`TLSCertificateProvidedExternally`), and gets no Certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_mapping_with_tls() {
    let run = start_with_domain_mapping(tls_settings(HttpProtocol::Enabled)).await;
    select_gateway_pods(&run).await;
    route_until(&run, "hello", "the route Ready", is_ready).await;
    let domain = "hello.example.org";
    create_claim(&run, domain, NS).await;
    create_domain_mapping(&run, domain, "hello").await;
    let dm = domain_mapping_until(&run, domain, "HTTPDowngrade", |d| {
        dm_cond(d, "CertificateProvisioned")
            .is_some_and(|c| c.1.as_deref() == Some("HTTPDowngrade"))
    })
    .await;
    assert_eq!(
        dm.status.unwrap().url.as_deref(),
        Some("http://hello.example.org")
    );
    let cert = run.api::<Certificate>().get(domain).await.unwrap();
    assert_eq!(cert.spec.dns_names, [domain]);
    assert_eq!(cert.spec.issuer_ref.name, "letsencrypt");
    assert_eq!(cert.owner_references()[0].kind, "DomainMapping");

    issue(&run, domain).await;
    let dm = domain_mapping_until(&run, domain, "https", |d| {
        dm_cond(d, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
            && d.status.as_ref().and_then(|s| s.url.as_deref()) == Some("https://hello.example.org")
    })
    .await;
    assert_eq!(
        dm_cond(&dm, "CertificateProvisioned"),
        Some((ConditionStatus::True, None))
    );
    let g = run
        .api::<IstioGateway>()
        .get(&tls_gateway(domain))
        .await
        .unwrap();
    assert_eq!(g.spec.servers[0].hosts, [domain]);
    let dm_uid = dm.uid().unwrap();
    let dm_copy = istio_tls::copy_name(&dm_uid, NS, domain);
    assert_eq!(
        g.spec.servers[0]
            .tls
            .as_ref()
            .unwrap()
            .credential_name
            .as_deref(),
        Some(dm_copy.as_str())
    );
    let copies: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(run.client.clone(), GATEWAY_NS);
    let copy = copies.get(&dm_copy).await.unwrap();
    assert_eq!(copy.labels()["serving.knative.dev/domainmapping"], domain);
    vs_until(&run, "hello.example.org-ingress", |s| {
        s.gateways
            .contains(&format!("{NS}/{}", tls_gateway(domain)))
    })
    .await;

    // Bring your own certificate.
    let byo = "byo.example.org";
    create_claim(&run, byo, NS).await;
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some("byo-cert".into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([(
            "tls.crt".to_string(),
            k8s_openapi::ByteString(b"byo".to_vec()),
        )])),
        ..Default::default()
    };
    run.api::<k8s_openapi::api::core::v1::Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut dm = DomainMapping::new(
        byo,
        DomainMappingSpec {
            ref_: KReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Route".into(),
                name: "hello".into(),
                namespace: None,
            },
            tls: Some(thaw::knative::SecretTls {
                secret_name: "byo-cert".into(),
            }),
        },
    );
    dm.metadata.namespace = Some(NS.into());
    run.api::<DomainMapping>()
        .create(&PostParams::default(), &dm)
        .await
        .unwrap();
    let dm = domain_mapping_until(&run, byo, "Ready over https", |d| {
        dm_cond(d, "Ready").map(|c| c.0) == Some(ConditionStatus::True)
    })
    .await;
    assert_eq!(
        dm.status.as_ref().unwrap().url.as_deref(),
        Some("https://byo.example.org")
    );
    assert_eq!(
        dm_cond(&dm, "CertificateProvisioned"),
        Some((
            ConditionStatus::True,
            Some("TLSCertificateProvidedExternally".into())
        ))
    );
    assert!(
        run.api::<Certificate>()
            .get_opt(byo)
            .await
            .unwrap()
            .is_none()
    );
    let byo_copy = istio_tls::copy_name(&dm.uid().unwrap(), NS, "byo-cert");
    let copy = copies.get(&byo_copy).await.unwrap();
    assert_eq!(copy.data, secret.data);

    // A deleted DomainMapping's copy goes with it (the other's stays).
    run.api::<DomainMapping>()
        .delete(domain, &Default::default())
        .await
        .unwrap();
    wait_for(
        "the deleted DomainMapping's copy deleted",
        || async { copies.get_opt(&dm_copy).await.unwrap() },
        Option::is_none,
    )
    .await;
    assert!(copies.get_opt(&byo_copy).await.unwrap().is_some());
}

/// Without cert-manager's CRD, a route wanting TLS is `CertificateProvisioned=False
/// CertificateProvisionFailed` naming the CRD (its ingress is still written, over http); once
/// served, its Certificate is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_certificate_crd_is_a_condition_until_it_is_served() {
    let (mut run, relay) = start_via_relay().await;
    relay.refuse("/apis/cert-manager.io", 404);
    run.start_controller_with(&relay, tls_settings(HttpProtocol::Enabled));
    revision(&run, "hello-00001", true).await;
    let created = create_route(&run, "hello", vec![to_revision("hello-00001", 100)]).await;
    let r = route_until(&run, "hello", "CertificateProvisionFailed", |r| {
        tls_cond(r)
            == Some((
                ConditionStatus::False,
                Some("CertificateProvisionFailed".into()),
            ))
    })
    .await;
    let m = tls_message(&r);
    assert!(m.contains("certificates.cert-manager.io"), "{m}");
    assert_eq!(
        r.status.unwrap().fields.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    vs_until(&run, "hello-ingress", |_| true).await;
    relay.forward("/apis/cert-manager.io");
    let name = route_certificate_name(&created.uid().unwrap(), None);
    wait_for(
        "the Certificate",
        || async { run.api::<Certificate>().get_opt(&name).await.unwrap() },
        Option::is_some,
    )
    .await;
}
