//! The whole stack: Knative's helloworld-go Service applied to the in-process API server, with
//! `thaw controller`, two `thaw autoscaler` and two `thaw activator` processes, and the test
//! playing the Deployment controller, the kubelet (real `thaw sample-app` and `thaw queue`
//! processes per pod), the endpoints controller and the ingress (tests/stack_support). Real
//! clock; every wait polls a condition with a deadline; nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;
mod stack_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use stack_support::ingress::{Ingress, keepalive_client};
use stack_support::traffic::SteadyLoop;
use stack_support::{NS, Stack, StackOptions};
use thaw::knative::{Service, condition};
use tokio::time::Instant;

/// knative/docs, code-samples/serving/hello-world/helloworld-go/service.yaml.
const HELLOWORLD_GO: &str = r#"
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: helloworld-go
  namespace: default
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          env:
            - name: TARGET
              value: "Go Sample v1"
"#;

/// config-autoscaler: Knative's defaults but these, shortened so the test sees a scale to
/// zero soon (the stable window at its lower bound).
const STABLE_WINDOW: &str = "6s";
const SCALE_TO_ZERO_GRACE_PERIOD: &str = "2s";
const SCALE_TO_ZERO_POD_RETENTION_PERIOD: &str = "0s";

/// Deadlines of the scenario's waits.
const READY: Duration = Duration::from_secs(30);
/// To zero: the stable window without traffic, the grace period, then the pod's stop.
const TO_ZERO: Duration = Duration::from_secs(40);
/// How long the steady loop runs while warm, and the pause between a flavour's requests.
const STEADY_FOR: Duration = Duration::from_secs(3);
const STEADY_PACE: Duration = Duration::from_millis(20);

const REVISION: &str = "helloworld-go-00001";
const DEPLOYMENT: &str = "helloworld-go-00001-deployment";
const BODY: &str = "Hello from Go Sample v1!\n";

fn options() -> StackOptions {
    StackOptions {
        autoscaler: BTreeMap::from([
            ("stable-window".into(), STABLE_WINDOW.into()),
            (
                "scale-to-zero-grace-period".into(),
                SCALE_TO_ZERO_GRACE_PERIOD.into(),
            ),
            (
                "scale-to-zero-pod-retention-period".into(),
                SCALE_TO_ZERO_POD_RETENTION_PERIOD.into(),
            ),
        ]),
        controllers: 1,
        autoscalers: 2,
        activators: 2,
        activator: BTreeMap::new(),
        graceful_pod_deletion: false,
    }
}

/// Waits for helloworld-go to be Ready with a URL; its host.
async fn ready_host(stack: &Stack, services: &Api<Service>) -> String {
    let url = stack
        .until(READY, "the Service Ready with a URL", || async {
            let s = services.get_status("helloworld-go").await.ok()?;
            let st = s.status.as_ref()?;
            st.status.is_true(condition::READY).then_some(())?;
            st.route.url.clone()
        })
        .await;
    url.strip_prefix("http://")
        .unwrap_or(&url)
        .trim_end_matches('/')
        .to_string()
}

/// The revision's pods (any phase).
async fn pods(stack: &Stack) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(stack.client.clone(), NS);
    let lp = ListParams::default().labels(&format!("serving.knative.dev/revision={REVISION}"));
    api.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn replicas(stack: &Stack) -> Option<i32> {
    let api: Api<Deployment> = Api::namespaced(stack.client.clone(), NS);
    api.get_opt(DEPLOYMENT).await.ok()??.spec?.replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helloworld_go_serves_goes_to_zero_and_wakes() {
    let began = Instant::now();
    let stack = Stack::start(options()).await;
    println!("stack up in {:.1}s", began.elapsed().as_secs_f64());

    // Apply the Service as Knative's docs give it.
    let svc: Service = serde_saphyr::from_str(HELLOWORLD_GO).expect("the docs' YAML");
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the Service");

    // Ready, with its URL, and its first pod up (initial scale 1).
    let host = ready_host(&stack, &services).await;
    assert_eq!(host, "helloworld-go.default.example.com");
    stack
        .until(READY, "one ready pod of the revision", || async {
            let p = pods(&stack).await;
            (p.len() == 1 && ready(&p[0])).then_some(())
        })
        .await;
    assert_eq!(stack.records().scale_of(DEPLOYMENT).first(), Some(&1));

    // Through the ingress: 200 with the app's hello.
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    stack
        .until(
            READY,
            "the ingress routing the host to endpoints",
            || async { (!ingress.endpoints(&host).is_empty()).then_some(()) },
        )
        .await;
    let client = keepalive_client();
    let reply = ingress.get(&client, &host, "/").await.expect("a reply");
    assert_eq!((reply.status, reply.body.as_str()), (200, BODY));

    // Steady traffic while warm: nothing fails.
    let steady = SteadyLoop::start(ingress.clone(), &host, "/", STEADY_PACE);
    tokio::time::sleep(STEADY_FOR).await;
    let report = steady.stop().await;
    println!("{report}");
    assert!(
        report.keepalive.requests > 0 && report.fresh.requests > 0,
        "{report}"
    );
    assert_eq!(report.failures(), 0, "{report}");

    // Idle: to zero, the pods gone, the public slices back on the activators.
    stack
        .until(TO_ZERO, "the Deployment scaled to 0", || async {
            (replicas(&stack).await == Some(0)).then_some(())
        })
        .await;
    stack
        .until(TO_ZERO, "the revision's pods gone", || async {
            pods(&stack).await.is_empty().then_some(())
        })
        .await;
    // ... and no activator has an endpoint left for it (a request now is a cold one).
    stack.until_activators_cold(NS, REVISION, TO_ZERO).await;
    let public = stack.records().public_of(REVISION);
    let last = public.last().expect("the public slices were written");
    assert!(
        !last.endpoints.is_empty() && last.endpoints.iter().all(|a| stack.is_activator(a)),
        "public slices at zero: {:?}",
        last.endpoints
    );

    // A request wakes it: held by an activator, answered 200.
    let reply = ingress.get(&client, &host, "/").await.expect("a reply");
    assert_eq!((reply.status, reply.body.as_str()), (200, BODY));
    assert!(
        stack.is_activator(&reply.endpoint),
        "answered via {}",
        reply.endpoint
    );
    let scale = stack.records().scale_of(DEPLOYMENT);
    let zero = scale.iter().rposition(|r| *r == 0);
    assert!(
        zero.is_some_and(|i| scale[i + 1..].iter().any(|r| *r > 0)),
        "/scale changes: {scale:?}"
    );
    // The controller leader created the tag key, and the revision's sidecar holds its tag over
    // the revision's UID.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(stack.client.clone(), stack_support::SYSTEM);
    let key = secrets
        .get("thaw-proxy-tag-key")
        .await
        .expect("the tag key");
    let key = key.data.unwrap().remove("key").unwrap().0;
    let revisions: Api<thaw::knative::Revision> = Api::namespaced(stack.client.clone(), NS);
    let uid = revisions.get(REVISION).await.unwrap().metadata.uid.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(stack.client.clone(), NS);
    let template = deployments
        .get(DEPLOYMENT)
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;
    let sidecar = template.spec.unwrap().containers;
    let sidecar = sidecar.iter().find(|c| c.name == "queue-proxy").unwrap();
    let tag = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "THAW_PROXY_TAG");
    assert_eq!(
        tag.and_then(|e| e.value.clone()),
        Some(thaw::knative::proxy_tag::tag(&key, NS, REVISION, &uid))
    );
    // The woken pod's sidecar counted that request as proxied: the activator's
    // K-Proxy-Request carried the tag the controller wrote into the pod (the same tag key, the
    // same revision UID), so nothing was counted as direct.
    for pod in pods(&stack).await {
        let ip = pod.status.and_then(|s| s.pod_ip).expect("a pod IP");
        let admin = std::net::SocketAddr::new(ip.parse().unwrap(), 9091);
        let metrics = kube_e2e_support::get_text(admin, "/metrics").await;
        let value = |name: &str| -> f64 {
            let line = metrics.lines().find(|l| l.starts_with(name));
            line.and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{name} not in:\n{metrics}"))
        };
        assert_eq!(value("thaw_queue_untagged_proxy_requests_total"), 0.0);
        assert!(
            metrics.contains("response_code_class=\"2xx\"} 1"),
            "{metrics}"
        );
    }

    println!("{}", stack.records().describe());
    println!("wall time {:.1}s", began.elapsed().as_secs_f64());
}

/// A Service with `initial-scale: 0` (allowed by `allow-zero-initial-scale`), at Knative's
/// other defaults: no pod starts, yet once the autoscaler has initialized its scale target the
/// revision is Ready (Knative's `PropagateAutoscalerStatus`), the route sends it traffic, and
/// the first request wakes it through an activator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_scale_zero_service_is_ready_routed_and_woken() {
    let stack = Stack::start(StackOptions {
        autoscaler: BTreeMap::from([("allow-zero-initial-scale".into(), "true".into())]),
        ..options()
    })
    .await;
    let yaml = HELLOWORLD_GO.replace(
        "  template:\n    spec:\n",
        "  template:\n    metadata:\n      annotations:\n        \
         autoscaling.knative.dev/initial-scale: \"0\"\n    spec:\n",
    );
    let svc: Service = serde_saphyr::from_str(&yaml).expect("the YAML");
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the Service");
    let host = ready_host(&stack, &services).await;
    assert!(pods(&stack).await.is_empty(), "no pod before a request");
    assert_eq!(replicas(&stack).await, Some(0));
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    stack
        .until(READY, "the ingress routing the host", || async {
            (!ingress.endpoints(&host).is_empty()).then_some(())
        })
        .await;
    let client = keepalive_client();
    let reply = ingress.get(&client, &host, "/").await.expect("a reply");
    assert_eq!((reply.status, reply.body.as_str()), (200, BODY));
    assert!(
        stack.is_activator(&reply.endpoint),
        "via {}",
        reply.endpoint
    );
    let scale = stack.records().scale_of(DEPLOYMENT);
    assert!(scale.iter().any(|r| *r > 0), "/scale changes: {scale:?}");
}

/// An HPA-class Service (Knative's HPA scales it, not the KPA): once its pod is ready the
/// activators leave its path (Knative's SKS in Serve mode), requests reach the pod directly,
/// and the revision is Active, as Knative's HPA reconciler marks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_class_service_is_served_by_its_pods_directly() {
    let stack = Stack::start(options()).await;
    let yaml = HELLOWORLD_GO.replace(
        "  template:\n    spec:\n",
        "  template:\n    metadata:\n      annotations:\n        \
         autoscaling.knative.dev/class: hpa.autoscaling.knative.dev\n        \
         autoscaling.knative.dev/metric: cpu\n    spec:\n",
    );
    let svc: Service = serde_saphyr::from_str(&yaml).expect("the YAML");
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the Service");
    let host = ready_host(&stack, &services).await;
    // The public slices move to the pod.
    stack
        .until(READY, "the public slices on the pod", || async {
            let last = stack.records().public_of(REVISION).last().cloned()?;
            (!last.endpoints.is_empty() && last.endpoints.iter().all(|a| !stack.is_activator(a)))
                .then_some(())
        })
        .await;
    let revs: Api<thaw::knative::Revision> = Api::namespaced(stack.client.clone(), NS);
    stack
        .until(READY, "the revision Active", || async {
            let r = revs.get_status(REVISION).await.ok()?;
            r.status?.status.is_true(condition::ACTIVE).then_some(())
        })
        .await;
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    stack
        .until(READY, "the ingress routing the host to the pod", || async {
            let eps = ingress.endpoints(&host);
            (!eps.is_empty() && eps.iter().all(|a| !stack.is_activator(a))).then_some(())
        })
        .await;
    let client = keepalive_client();
    let reply = ingress.get(&client, &host, "/").await.expect("a reply");
    assert_eq!((reply.status, reply.body.as_str()), (200, BODY));
    assert!(
        !stack.is_activator(&reply.endpoint),
        "via {}",
        reply.endpoint
    );
}
