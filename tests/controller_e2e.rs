//! `thaw controller`'s reconcilers, in-process, against the in-process API server over real
//! HTTP: the test plays kubelet (it marks Revisions' children ready by writing status) and the
//! controllers do the rest. Waits poll the server with a deadline; nothing asserts a duration.

mod controller_support;
mod kube_support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::duck::{Condition, ConditionStatus};
use thaw::knative::names::labels;
use thaw::knative::{Configuration, Revision, Route, Service, condition};
use tokio::task::JoinHandle;

use crate::kube_support::TestApi;
use controller_support::{mark_deployment_ready, wait_for};

const HELLO: &str = r#"
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: hello
spec:
  template:
    metadata:
      annotations:
        autoscaling.knative.dev/min-scale: "1"
        autoscaling.knative.dev/target: "10"
    spec:
      containerConcurrency: 10
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "World"
          resources:
            requests:
              cpu: 100m
"#;

struct Running {
    api: TestApi,
    ctx: Arc<Ctx>,
    task: JoinHandle<()>,
    /// config-istio's default gateways, one pod answering probes: routes reach IngressReady.
    _gateway: kube_support::gateway::TestGateway,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(ns: &str, settings: Settings) -> Running {
    start_in(Some(ns), settings).await
}

/// The controllers over `ns`, or every namespace.
async fn start_in(ns: Option<&str>, settings: Settings) -> Running {
    let api = TestApi::start().await;
    let ctx = Ctx::with_options(
        api.client(),
        settings,
        CtxOptions {
            namespace: ns.map(String::from),
            ..CtxOptions::default()
        },
    );
    let task = tokio::spawn(thaw::roles::controller::run_controllers(ctx.clone()));
    let _gateway = kube_support::gateway::default_gateways(&api.client()).await;
    Running {
        api,
        ctx,
        task,
        _gateway,
    }
}

fn service(yaml: &str, ns: &str) -> Service {
    let mut s: Service = serde_saphyr::from_str(yaml).expect("service yaml");
    s.metadata.namespace = Some(ns.into());
    s
}

async fn get<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("get")
}

fn cond<'a>(s: &'a thaw::knative::duck::Status, t: &str) -> Option<&'a Condition> {
    s.condition(t)
}

/// Plays kubelet and the Deployment controller: the revision's Deployment (the Revision
/// reconciler's) gets a ready replica, and the Revision reconciler marks the revision Ready.
async fn mark_ready(revs: &Api<Revision>, name: &str) {
    let deps: Api<Deployment> = Api::namespaced(revs.clone().into_client(), "default");
    mark_deployment_ready(&deps, name).await;
    wait_for(
        "the revision Ready",
        || async { revs.get_status(name).await.ok() },
        |r| {
            r.as_ref()
                .and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.status.is_true(condition::READY))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_service_stamps_configuration_route_and_a_defaulted_revision() {
    let ns = "default";
    let run = start(ns, Settings::default()).await;
    let client = run.api.client();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let routes: Api<Route> = Api::namespaced(client.clone(), ns);
    let revs: Api<Revision> = Api::namespaced(client.clone(), ns);
    let svc = svcs
        .create(&PostParams::default(), &service(HELLO, ns))
        .await
        .expect("create service");

    let cfg = wait_for("the Configuration", || get(&cfgs, "hello"), Option::is_some)
        .await
        .unwrap();
    let owner = cfg.owner_references().first().cloned().expect("owner");
    assert_eq!(owner.uid, svc.uid().unwrap());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        cfg.labels().get(labels::SERVICE).map(String::as_str),
        Some("hello")
    );
    assert_eq!(cfg.spec.template, svc.spec.configuration.template);

    let route = wait_for("the Route", || get(&routes, "hello"), Option::is_some)
        .await
        .unwrap();
    assert_eq!(route.spec.traffic.len(), 1);
    assert_eq!(
        route.spec.traffic[0].configuration_name.as_deref(),
        Some("hello")
    );
    assert_eq!(route.spec.traffic[0].latest_revision, Some(true));
    assert_eq!(route.spec.traffic[0].percent, Some(100));

    let rev = wait_for("hello-00001", || get(&revs, "hello-00001"), Option::is_some)
        .await
        .unwrap();
    let l = rev.labels();
    assert_eq!(
        l.get(labels::CONFIGURATION).map(String::as_str),
        Some("hello")
    );
    assert_eq!(
        l.get(labels::CONFIGURATION_GENERATION).map(String::as_str),
        Some("1")
    );
    assert_eq!(l.get(labels::SERVICE).map(String::as_str), Some("hello"));
    // Created `pending`; the Route's labeler soon marks it `active` (the latest created
    // revision of a `latestRevision: true` target, as Knative's labeler does).
    assert!(
        matches!(
            l.get(labels::ROUTING_STATE).map(String::as_str),
            Some("pending" | "active")
        ),
        "{l:?}"
    );
    assert_eq!(rev.owner_references()[0].uid, cfg.uid().unwrap());
    assert_eq!(
        rev.annotations()
            .get("autoscaling.knative.dev/min-scale")
            .map(String::as_str),
        Some("1")
    );
    // Defaults resolved into the spec, once.
    assert_eq!(rev.spec.container_concurrency, Some(10));
    assert_eq!(rev.spec.timeout_seconds, Some(300));
    assert_eq!(rev.spec.pod_spec.enable_service_links, Some(false));
    let c = &rev.spec.pod_spec.containers[0];
    assert_eq!(c.name, "user-container");
    // Every container field the user wrote is there.
    let want = &svc.spec.configuration.template.spec.pod_spec.containers[0];
    assert_eq!(c.image, want.image);
    assert_eq!(c.env, want.env);
    assert_eq!(c.ports, want.ports);
    assert_eq!(c.resources, want.resources);

    // The revision is not Ready yet: the Configuration is Unknown, latestCreated set.
    let cfg = wait_for(
        "latestCreatedRevisionName",
        || get(&cfgs, "hello"),
        |c| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.fields.latest_created_revision_name.clone())
                .as_deref()
                == Some("hello-00001")
        },
    )
    .await
    .unwrap();
    let st = cfg.status.unwrap();
    assert_eq!(st.status.observed_generation, Some(1));
    assert_eq!(
        cond(&st.status, "Ready").map(|c| c.status),
        Some(ConditionStatus::Unknown)
    );
    assert_eq!(st.fields.latest_ready_revision_name, None);

    mark_ready(&revs, "hello-00001").await;
    let cfg = wait_for(
        "the Configuration Ready",
        || get(&cfgs, "hello"),
        |c| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.status.is_true("Ready"))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        cfg.status
            .unwrap()
            .fields
            .latest_ready_revision_name
            .as_deref(),
        Some("hello-00001")
    );
    let svc = wait_for(
        "the Service's ConfigurationsReady",
        || get(&svcs, "hello"),
        |s| {
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some_and(|s| s.status.is_true("ConfigurationsReady"))
        },
    )
    .await
    .unwrap();
    let st = svc.status.unwrap();
    assert_eq!(
        st.configuration.latest_ready_revision_name.as_deref(),
        Some("hello-00001")
    );
    assert_eq!(
        st.configuration.latest_created_revision_name.as_deref(),
        Some("hello-00001")
    );
    assert_eq!(st.status.observed_generation, Some(1));

    // Events were recorded on the Configuration.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let reasons: Vec<String> = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("hello"))
        .filter_map(|e| e.reason)
        .collect();
    for want in ["Created", "LatestReadyUpdate", "ConfigurationReady"] {
        assert!(reasons.iter().any(|r| r == want), "{want} in {reasons:?}");
    }
    assert!(run.ctx.reconciles() > 0);

    // Everything below the Service, as the revision and route reconcilers made it.
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service as KubeService;
    use thaw::controller::route::virtual_service::VirtualService;
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let dep = get(&deps, "hello-00001-deployment")
        .await
        .expect("the Deployment");
    assert_eq!(
        dep.spec.as_ref().unwrap().replicas,
        Some(1),
        "min-scale 1 as initial scale"
    );
    let pod = dep.spec.unwrap().template.spec.unwrap();
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["user-container", "queue-proxy"]);
    let user = &pod.containers[0];
    let env = |c: &k8s_openapi::api::core::v1::Container, k: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(env(user, "PORT").as_deref(), Some("8080"));
    assert_eq!(env(user, "K_SERVICE").as_deref(), Some("hello"));
    assert_eq!(env(user, "K_CONFIGURATION").as_deref(), Some("hello"));
    assert_eq!(env(user, "K_REVISION").as_deref(), Some("hello-00001"));
    assert_eq!(env(user, "TARGET").as_deref(), Some("World"));
    let pre_stop = user.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    assert_eq!(
        pre_stop.http_get.as_ref().unwrap().path.as_deref(),
        Some("/wait-for-drain")
    );
    let queue = &pod.containers[1];
    assert_eq!(env(queue, "CONTAINER_CONCURRENCY").as_deref(), Some("10"));
    assert!(
        queue.readiness_probe.is_some(),
        "readiness through the sidecar"
    );
    assert_eq!(pod.enable_service_links, Some(false));
    let svcs_k: Api<KubeService> = Api::namespaced(client.clone(), ns);
    let private = get(&svcs_k, "hello-00001-private")
        .await
        .expect("private Service");
    assert!(private.spec.as_ref().unwrap().selector.is_some());
    let public = get(&svcs_k, "hello-00001").await.expect("public Service");
    assert!(
        public.spec.as_ref().unwrap().selector.is_none(),
        "its slices are the autoscaler's"
    );
    let placeholder = get(&svcs_k, "hello")
        .await
        .expect("the Route's placeholder Service");
    assert_eq!(
        placeholder.spec.as_ref().unwrap().type_.as_deref(),
        Some("ExternalName")
    );
    let vss: Api<VirtualService> = Api::namespaced(client.clone(), ns);
    let vs = wait_for(
        "the VirtualService routing to hello-00001",
        || get(&vss, "hello-ingress"),
        |v| {
            v.as_ref()
                .is_some_and(|v| v.spec.http.iter().any(|h| !h.route.is_empty()))
        },
    )
    .await
    .unwrap();
    assert!(
        vs.spec
            .hosts
            .iter()
            .any(|h| h == "hello.default.example.com"),
        "{:?}",
        vs.spec.hosts
    );
    assert!(
        vs.spec
            .hosts
            .iter()
            .any(|h| h == "hello.default.svc.cluster.local")
    );
    for h in &vs.spec.http {
        for d in &h.route {
            assert_eq!(d.destination.host, "hello-00001.default.svc.cluster.local");
            assert_eq!(d.weight, Some(100));
            let set = &d.headers.as_ref().unwrap().request.as_ref().unwrap().set;
            assert_eq!(
                set.get("Knative-Serving-Revision").map(String::as_str),
                Some("hello-00001")
            );
            assert_eq!(
                set.get("Knative-Serving-Namespace").map(String::as_str),
                Some("default")
            );
        }
    }
    let svc = wait_for(
        "the Service Ready",
        || get(&svcs, "hello"),
        |s| {
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some_and(|s| s.status.is_true("Ready"))
        },
    )
    .await
    .unwrap();
    let st = svc.status.unwrap();
    assert_eq!(
        st.route.url.as_deref(),
        Some("http://hello.default.example.com")
    );
    assert_eq!(
        st.route.traffic[0].revision_name.as_deref(),
        Some("hello-00001")
    );
    assert_eq!(st.route.traffic[0].percent, Some(100));
    for t in ["ConfigurationsReady", "RoutesReady", "Ready"] {
        assert!(st.status.is_true(t), "{t}: {:?}", st.status.conditions);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_edit_stamps_the_next_revision_and_latest_ready_waits_for_it() {
    let ns = "default";
    let run = start(ns, Settings::default()).await;
    let client = run.api.client();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let revs: Api<Revision> = Api::namespaced(client.clone(), ns);
    svcs.create(&PostParams::default(), &service(HELLO, ns))
        .await
        .unwrap();
    wait_for("hello-00001", || get(&revs, "hello-00001"), Option::is_some).await;
    mark_ready(&revs, "hello-00001").await;
    let latest_ready = |name: &'static str| {
        move |c: &Option<Configuration>| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.fields.latest_ready_revision_name.as_deref())
                == Some(name)
        }
    };
    wait_for(
        "latestReady 00001",
        || get(&cfgs, "hello"),
        latest_ready("hello-00001"),
    )
    .await;

    let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
        "image": "ghcr.io/knative/helloworld-go:latest",
        "ports": [{"containerPort": 8080}],
        "env": [{"name": "TARGET", "value": "Again"}]
    }]}}}});
    svcs.patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let rev2 = wait_for("hello-00002", || get(&revs, "hello-00002"), Option::is_some)
        .await
        .unwrap();
    assert_eq!(
        rev2.spec.pod_spec.containers[0].env.as_ref().unwrap()[0]
            .value
            .as_deref(),
        Some("Again")
    );
    let cfg = wait_for(
        "latestCreated 00002",
        || get(&cfgs, "hello"),
        |c| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .and_then(|s| s.fields.latest_created_revision_name.as_deref())
                == Some("hello-00002")
        },
    )
    .await
    .unwrap();
    // Not Ready yet: latestReady stays on the old revision.
    assert_eq!(
        cfg.status
            .unwrap()
            .fields
            .latest_ready_revision_name
            .as_deref(),
        Some("hello-00001")
    );
    mark_ready(&revs, "hello-00002").await;
    wait_for(
        "latestReady 00002",
        || get(&cfgs, "hello"),
        latest_ready("hello-00002"),
    )
    .await;
    // The first revision is still there (config-gc's defaults keep 20).
    assert!(get(&revs, "hello-00001").await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_service_is_reported_with_the_field_and_nothing_is_created() {
    let ns = "default";
    let run = start(ns, Settings::default()).await;
    let client = run.api.client();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let bad = HELLO.replace("containerConcurrency: 10", "containerConcurrency: 5000");
    svcs.create(&PostParams::default(), &service(&bad, ns))
        .await
        .unwrap();
    let svc = wait_for(
        "Ready=False",
        || get(&svcs, "hello"),
        |s| {
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.status.condition("Ready"))
                .is_some_and(|c| c.status == ConditionStatus::False)
        },
    )
    .await
    .unwrap();
    let ready = svc
        .status
        .unwrap()
        .status
        .condition("Ready")
        .cloned()
        .unwrap();
    let msg = ready.message.unwrap_or_default();
    assert!(
        msg.contains("spec.template.spec.containerConcurrency"),
        "the field is named: {msg}"
    );
    assert!(msg.contains("5000"), "{msg}");
    assert!(get(&cfgs, "hello").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_of_someone_else_is_not_owned_and_left_alone() {
    let ns = "default";
    let run = start(ns, Settings::default()).await;
    let client = run.api.client();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let theirs = Configuration {
        metadata: ObjectMeta {
            name: Some("hello".into()),
            namespace: Some(ns.into()),
            labels: Some([("owner".to_string(), "someone-else".to_string())].into()),
            ..Default::default()
        },
        spec: Default::default(),
        status: None,
    };
    cfgs.create(&PostParams::default(), &theirs).await.unwrap();
    svcs.create(&PostParams::default(), &service(HELLO, ns))
        .await
        .unwrap();
    let svc = wait_for(
        "ConfigurationsReady=False NotOwned",
        || get(&svcs, "hello"),
        |s| {
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.status.condition("ConfigurationsReady"))
                .is_some_and(|c| c.reason.as_deref() == Some("NotOwned"))
        },
    )
    .await
    .unwrap();
    let ready = svc
        .status
        .unwrap()
        .status
        .condition("Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready.status, ConditionStatus::False);
    let cfg = get(&cfgs, "hello").await.unwrap();
    assert_eq!(
        cfg.labels().get("owner").map(String::as_str),
        Some("someone-else")
    );
    assert!(cfg.owner_references().is_empty());
    assert!(
        cfg.meta()
            .managed_fields
            .iter()
            .flatten()
            .all(|m| m.manager.as_deref() != Some(thaw::controller::FIELD_MANAGER))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seventy_character_name_keeps_every_child_name_and_label_within_63() {
    let ns = "default";
    let run = start(ns, Settings::default()).await;
    let client = run.api.client();
    let name = format!("h{}", "e".repeat(69));
    assert_eq!(name.len(), 70);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let revs: Api<Revision> = Api::namespaced(client.clone(), ns);
    let cfg: Configuration = {
        let svc = service(HELLO, ns);
        Configuration {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: svc.spec.configuration.clone(),
            status: None,
        }
    };
    cfgs.create(&PostParams::default(), &cfg).await.unwrap();
    let cfg = wait_for(
        "latestCreated",
        || get(&cfgs, &name),
        |c| {
            c.as_ref()
                .and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.fields.latest_created_revision_name.is_some())
        },
    )
    .await
    .unwrap();
    let rev_name = cfg
        .status
        .unwrap()
        .fields
        .latest_created_revision_name
        .unwrap();
    assert!(rev_name.len() <= 63, "{rev_name}");
    assert_eq!(rev_name, thaw::knative::names::child_name(&name, "-00001"));
    let rev = get(&revs, &rev_name).await.unwrap();
    for (k, v) in rev.labels() {
        assert!(v.len() <= 63, "label {k}={v} is {} characters", v.len());
    }
    assert_eq!(
        rev.labels().get(labels::CONFIGURATION),
        Some(&labels::value(&name))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_gc_collects_old_revisions_but_never_a_routed_one() {
    let ns = "default";
    let settings = Settings {
        gc: thaw::config::GcConfig {
            retain_since_create_time: None,
            retain_since_last_active_time: None,
            min_non_active_revisions: 0,
            max_non_active_revisions: Some(1),
        },
        ..Settings::default()
    };
    let run = start(ns, settings).await;
    let client = run.api.client();
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let cfgs: Api<Configuration> = Api::namespaced(client.clone(), ns);
    let revs: Api<Revision> = Api::namespaced(client.clone(), ns);
    svcs.create(&PostParams::default(), &service(HELLO, ns))
        .await
        .unwrap();
    wait_for("hello-00001", || get(&revs, "hello-00001"), Option::is_some).await;
    // The first revision stays routed: a tag pins it, and the Route's labeler marks it.
    let pin = serde_json::json!({"spec": {"traffic": [
        {"latestRevision": true, "percent": 100},
        {"tag": "old", "revisionName": "hello-00001", "percent": 0},
    ]}});
    svcs.patch("hello", &PatchParams::default(), &Patch::Merge(&pin))
        .await
        .unwrap();
    mark_ready(&revs, "hello-00001").await;
    wait_for(
        "hello-00001 routed",
        || get(&revs, "hello-00001"),
        |r| {
            r.as_ref()
                .and_then(|r| r.labels().get(labels::ROUTING_STATE).cloned())
                .as_deref()
                == Some("active")
        },
    )
    .await;
    for g in 2..=4 {
        let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
            "image": "ghcr.io/knative/helloworld-go:latest",
            "ports": [{"containerPort": 8080}],
            "env": [{"name": "TARGET", "value": format!("v{g}")}]
        }]}}}});
        svcs.patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let name = format!("hello-{g:05}");
        wait_for(&name, || get(&revs, &name), Option::is_some).await;
        mark_ready(&revs, &name).await;
        wait_for(
            "latestReady",
            || get(&cfgs, "hello"),
            |c| {
                c.as_ref()
                    .and_then(|c| c.status.as_ref())
                    .and_then(|s| s.fields.latest_ready_revision_name.as_deref())
                    == Some(name.as_str())
            },
        )
        .await;
    }
    // Non-active: 00002 and 00003; max-non-active-revisions 1 keeps the more recent one.
    wait_for(
        "hello-00002 collected",
        || get(&revs, "hello-00002"),
        Option::is_none,
    )
    .await;
    assert!(
        get(&revs, "hello-00001").await.is_some(),
        "the routed revision stays"
    );
    assert!(get(&revs, "hello-00003").await.is_some());
    assert!(
        get(&revs, "hello-00004").await.is_some(),
        "the latest stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_section_of_config_defaults_wins_there_and_only_there() {
    use thaw::config::ConfigMap;
    let data: std::collections::BTreeMap<String, String> = [
        ("container-concurrency".to_string(), "4".to_string()),
        (
            "namespace-defaults".to_string(),
            "team-a:\n  container-concurrency: \"10\"\n  revision-timeout-seconds: \"60\"\n"
                .to_string(),
        ),
    ]
    .into();
    let defaults = thaw::config::DefaultsConfig::parse(&data)
        .expect("config-defaults with a namespace section")
        .config;
    let run = start_in(
        None,
        Settings {
            defaults,
            ..Settings::default()
        },
    )
    .await;
    let client = run.api.client();
    let no_cc = HELLO.replace("      containerConcurrency: 10\n", "");
    for ns in ["team-a", "team-b"] {
        let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
        svcs.create(&PostParams::default(), &service(&no_cc, ns))
            .await
            .unwrap();
    }
    let a: Api<Revision> = Api::namespaced(client.clone(), "team-a");
    let b: Api<Revision> = Api::namespaced(client.clone(), "team-b");
    let ra = wait_for(
        "team-a's revision",
        || get(&a, "hello-00001"),
        Option::is_some,
    )
    .await
    .unwrap();
    let rb = wait_for(
        "team-b's revision",
        || get(&b, "hello-00001"),
        Option::is_some,
    )
    .await
    .unwrap();
    assert_eq!(ra.spec.container_concurrency, Some(10), "team-a's section");
    assert_eq!(ra.spec.timeout_seconds, Some(60), "team-a's section");
    assert_eq!(
        rb.spec.container_concurrency,
        Some(4),
        "the cluster default"
    );
    assert_eq!(rb.spec.timeout_seconds, Some(300), "the cluster default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_reconcile_comes_back_after_the_resync_period() {
    use kube::runtime::controller::Action;
    let api = TestApi::start().await;
    let ctx = Ctx::with_options(
        api.client(),
        Settings::default(),
        CtxOptions {
            namespace: Some("default".into()),
            resync: Duration::from_secs(7),
            ..CtxOptions::default()
        },
    );
    let svcs: Api<Service> = Api::namespaced(api.client(), "default");
    let svc = svcs
        .create(&PostParams::default(), &service(HELLO, "default"))
        .await
        .unwrap();
    let action = thaw::controller::service::reconcile(Arc::new(svc), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(7)));
    // An invalid object is not retried until it changes (Knative's permanent error).
    let bad = HELLO
        .replace("containerConcurrency: 10", "containerConcurrency: 5000")
        .replace("name: hello", "name: bad");
    let bad = svcs
        .create(&PostParams::default(), &service(&bad, "default"))
        .await
        .unwrap();
    let err = thaw::controller::service::reconcile(Arc::new(bad.clone()), ctx.clone())
        .await
        .expect_err("invalid");
    assert_eq!(
        thaw::controller::error_policy(Arc::new(bad), &err, ctx, "Service"),
        Action::await_change()
    );
}
