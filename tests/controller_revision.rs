//! The Revision reconciler against the in-process API server over real HTTP: Revisions in,
//! Deployments, private and public Services and HPAs out, and the Revision's conditions from
//! what the test writes as kubelet (Deployment status, Pods with container statuses) and as
//! the endpoints controller (the private Service's EndpointSlice). Every wait polls for a
//! condition with a deadline; nothing asserts a duration.

mod controller_support;
mod kube_support;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Container, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use thaw::config::DeploymentConfig;
use thaw::controller::{Ctx, Settings};
use thaw::knative::duck::ConditionStatus;
use thaw::knative::names::{child_name, labels};
use thaw::knative::{Revision, condition};
use thaw::platform::EndpointSource;
use thaw::platform::kubernetes::{KubeOptions, KubePlatform};
use thaw::revision::RevisionKey;
use thaw::telemetry::platform::PlatformMetrics;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(30);
const IMAGE: &str = "registry.example/thaw:test";

/// Polls `f` until it returns `Some`, for at most [`DEADLINE`].
async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An API server with the Revision controller running against it.
struct Harness {
    _api: kube_support::TestApi,
    client: kube::Client,
    ctx: Arc<Ctx>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl Harness {
    async fn start() -> Self {
        let mut h = Self::stopped().await;
        h.run();
        h
    }

    /// The controller started now (after [`Harness::stopped`]).
    fn run(&mut self) {
        let ctx = self.ctx.clone();
        self.task = Some(tokio::spawn(thaw::controller::revision::controller(ctx)));
    }

    /// The API server, without the controller yet.
    async fn stopped() -> Self {
        let api = kube_support::TestApi::start().await;
        let client = api.client();
        let settings = Settings {
            deployment: DeploymentConfig {
                queue_sidecar_image: IMAGE.into(),
                ..DeploymentConfig::default()
            },
            ..Settings::default()
        };
        let ctx = Ctx::new(client.clone(), settings);
        Self {
            _api: api,
            client,
            ctx,
            task: None,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create_revision(&self, rev: serde_json::Value) -> Revision {
        let rev: Revision = serde_json::from_value(rev).unwrap();
        self.api::<Revision>()
            .create(&PostParams::default(), &rev)
            .await
            .expect("revision created")
    }

    async fn deployment(&self, name: &str) -> Deployment {
        let api = self.api::<Deployment>();
        until(&format!("deployment {name}"), || async {
            api.get_opt(name).await.unwrap()
        })
        .await
    }

    /// Waits until the revision's condition `type_` has `status` and `reason`.
    async fn condition(
        &self,
        rev: &str,
        type_: &str,
        status: ConditionStatus,
        reason: Option<&str>,
    ) -> Revision {
        let api = self.api::<Revision>();
        until(&format!("{rev} {type_}={status:?} {reason:?}"), || async {
            let r = api.get(rev).await.ok()?;
            let c = r.status.as_ref()?.status.condition(type_)?;
            (c.status == status && c.reason.as_deref() == reason).then(|| r.clone())
        })
        .await
    }

    /// Plays the Deployment controller: the status of `name`.
    async fn deployment_status(&self, name: &str, status: serde_json::Value) {
        self.api::<Deployment>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": status })),
            )
            .await
            .expect("deployment status written");
    }

    /// Plays the scheduler and kubelet: a pod of `rev` (its template's labels) with
    /// `statuses` as its container statuses.
    async fn pod(&self, rev: &Revision, name: &str, statuses: serde_json::Value) -> Pod {
        let dep_name = child_name(&rev.name_any(), "-deployment");
        let dep = self.deployment(&dep_name).await;
        let template = dep.spec.unwrap().template;
        // Owned as the Deployment controller owns its pods: through its ReplicaSet.
        let owners = kube_support::pod_owner_refs(&self.client, NS, &dep_name).await;
        let pods = self.api::<Pod>();
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: template.metadata.unwrap().labels,
                owner_references: Some(serde_json::from_value(owners).unwrap()),
                ..Default::default()
            },
            spec: template.spec,
            status: None,
        };
        pods.create(&PostParams::default(), &pod).await.unwrap();
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "phase": "Running", "podIP": "10.1.2.3",
                "containerStatuses": statuses
            }})),
        )
        .await
        .unwrap()
    }
}

/// Knative's helloworld as the Configuration reconciler stamps it: labels and owner,
/// containerConcurrency, a readiness probe without a port, a container without a name.
fn helloworld(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Revision",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                labels::CONFIGURATION: "hello",
                labels::CONFIGURATION_GENERATION: "1",
                labels::SERVICE: "hello",
                labels::ROUTING_STATE: "pending",
            },
            "annotations": {"autoscaling.knative.dev/target": "10"},
            "ownerReferences": [{
                "apiVersion": "serving.knative.dev/v1", "kind": "Configuration", "name": "hello",
                "uid": "6f1c2a1e-0000-4000-8000-000000000000", "controller": true,
                "blockOwnerDeletion": true
            }],
        },
        "spec": {
            "containerConcurrency": 50,
            "timeoutSeconds": 300,
            "containers": [{
                "image": "ghcr.io/knative/helloworld-go:latest",
                "ports": [{"name": "http1", "containerPort": 8080}],
                "env": [{"name": "TARGET", "value": "World"}],
                "resources": {"limits": {"memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz"}, "periodSeconds": 2},
            }],
        },
    })
}

fn env(c: &Container, name: &str) -> Option<String> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}

fn ports(s: &Service) -> Vec<(String, i32, i32, Option<String>)> {
    s.spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let t = match p.target_port.clone() {
                Some(IntOrString::Int(t)) => t,
                other => panic!("numeric target port expected, got {other:?}"),
            };
            (p.name.clone().unwrap(), p.port, t, p.app_protocol.clone())
        })
        .collect()
}

#[tokio::test]
async fn helloworld_revision_gets_its_deployment_and_services_and_goes_ready() {
    let h = Harness::start().await;
    let rev = h.create_revision(helloworld("hello-00001")).await;
    let uid = rev.uid().unwrap();
    let dep = h.deployment("hello-00001-deployment").await;

    // The Deployment: owner, replicas (initial scale 1), deadline, selector.
    let owner = &dep.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Revision", "hello-00001", uid.as_str())
    );
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    let spec = dep.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.progress_deadline_seconds, Some(600));
    assert_eq!(
        spec.selector.match_labels.as_ref().unwrap()[labels::REVISION_UID],
        uid
    );
    let tlabels = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(tlabels[labels::REVISION], "hello-00001");
    assert_eq!(tlabels[labels::CONFIGURATION], "hello");
    assert!(!tlabels.contains_key(labels::ROUTING_STATE));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.enable_service_links, Some(false));
    assert_eq!(pod.termination_grace_period_seconds, Some(340));

    // The user container: everything written, plus Knative's env, port and preStop.
    let user = &pod.containers[0];
    assert_eq!(user.name, "user-container");
    assert_eq!(
        user.image.as_deref(),
        Some("ghcr.io/knative/helloworld-go:latest")
    );
    assert_eq!(env(user, "TARGET").as_deref(), Some("World"));
    assert_eq!(env(user, "PORT").as_deref(), Some("8080"));
    assert_eq!(env(user, "K_REVISION").as_deref(), Some("hello-00001"));
    assert_eq!(env(user, "K_CONFIGURATION").as_deref(), Some("hello"));
    assert_eq!(env(user, "K_SERVICE").as_deref(), Some("hello"));
    assert_eq!(
        user.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
        "128Mi"
    );
    let p = &user.ports.as_ref().unwrap()[0];
    assert_eq!(
        (p.name.as_deref(), p.container_port),
        (Some("user-port"), 8080)
    );
    assert!(user.readiness_probe.is_none(), "moved into the sidecar");
    let pre_stop = user.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
    let get = pre_stop.http_get.as_ref().unwrap();
    assert_eq!(
        (get.path.as_deref(), &get.port),
        (Some("/wait-for-drain"), &IntOrString::Int(9091))
    );

    // The sidecar: image from config-deployment, the revision's settings, ports, readiness.
    let q = &pod.containers[1];
    assert_eq!(q.name, "queue-proxy");
    assert_eq!(q.image.as_deref(), Some(IMAGE));
    for (k, v) in [
        ("SERVING_NAMESPACE", NS),
        ("SERVING_REVISION", "hello-00001"),
        ("CONTAINER_CONCURRENCY", "50"),
        ("REVISION_TIMEOUT_SECONDS", "300"),
        ("USER_PORT", "8080"),
        ("QUEUE_SERVING_PORT", "8012"),
        ("THAW_QUEUE_ADMIN_PORT", "9091"),
    ] {
        assert_eq!(env(q, k).as_deref(), Some(v), "{k}");
    }
    let probe: serde_json::Value =
        serde_json::from_str(&env(q, "SERVING_READINESS_PROBE").unwrap()).unwrap();
    assert_eq!(
        probe,
        serde_json::json!({"httpGet": {"path": "/healthz", "port": 8080}})
    );
    let qports: Vec<(Option<String>, i32)> = q
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.container_port))
        .collect();
    assert_eq!(
        qports,
        [
            (Some("http1".into()), 8012),
            (Some("http-autometric".into()), 9091)
        ]
    );
    let rp = q.readiness_probe.as_ref().unwrap();
    assert_eq!(
        rp.http_get.as_ref().unwrap().path.as_deref(),
        Some("/readyz")
    );
    assert_eq!(rp.period_seconds, Some(2), "the user's probe timing");
    assert_eq!(
        q.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
        "25m"
    );

    // The Services.
    let svcs = h.api::<Service>();
    let private = until("private service", || async {
        svcs.get_opt("hello-00001-private").await.unwrap()
    })
    .await;
    let public = until("public service", || async {
        svcs.get_opt("hello-00001").await.unwrap()
    })
    .await;
    assert_eq!(
        ports(&private),
        [
            ("http".into(), 80, 8012, None),
            ("http-autometric".into(), 9091, 9091, None)
        ]
    );
    assert_eq!(
        private.spec.as_ref().unwrap().selector.as_ref().unwrap()[labels::REVISION_UID],
        uid
    );
    assert_eq!(ports(&public), [("http".into(), 80, 8012, None)]);
    assert_eq!(public.spec.as_ref().unwrap().selector, None);
    for (s, t) in [(&private, "Private"), (&public, "Public")] {
        let l = s.labels();
        assert_eq!(l[labels::REVISION], "hello-00001");
        assert_eq!(l[labels::SERVICE_TYPE], t);
        assert_eq!(s.owner_references()[0].uid, uid);
    }

    // Deploying until the Deployment reports progress.
    h.condition(
        "hello-00001",
        condition::READY,
        ConditionStatus::Unknown,
        Some("Deploying"),
    )
    .await;

    // Kubelet and the Deployment controller: a ready replica.
    h.deployment_status(
        "hello-00001-deployment",
        controller_support::one_ready_replica(),
    )
    .await;
    let ready = h
        .condition("hello-00001", condition::READY, ConditionStatus::True, None)
        .await;
    let st = ready.status.clone().unwrap();
    assert_eq!(st.status.observed_generation, Some(1));
    assert!(st.status.is_true(condition::RESOURCES_AVAILABLE));
    assert!(st.status.is_true(condition::CONTAINER_HEALTHY));

    // The data plane finds the pod through what the endpoints controller writes from the
    // private Service (its labels and ports): the activator's endpoints and the autoscaler's
    // stats target.
    let pod = h
        .pod(
            &ready,
            "hello-00001-deployment-abc",
            serde_json::json!([
                {"name": "user-container", "image": "i", "imageID": "", "ready": true,
                 "restartCount": 0, "state": {"running": {}}},
                {"name": "queue-proxy", "image": "i", "imageID": "", "ready": true,
                 "restartCount": 0, "state": {"running": {}}}
            ]),
        )
        .await;
    let mut slice_labels: BTreeMap<String, String> = private.labels().clone();
    slice_labels.insert(
        labels::ENDPOINTSLICE_SERVICE_NAME.into(),
        private.name_any(),
    );
    let slice_ports: Vec<serde_json::Value> = private
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let IntOrString::Int(t) = p.target_port.clone().unwrap() else {
                unreachable!()
            };
            serde_json::json!({"name": p.name, "port": t, "protocol": "TCP",
                               "appProtocol": p.app_protocol})
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hello-00001-private-x7k2p", "labels": slice_labels},
        "addressType": "IPv4",
        "ports": slice_ports,
        "endpoints": [{"addresses": ["10.1.2.3"], "conditions": {"ready": true},
                       "targetRef": {"kind": "Pod", "name": pod.name_any(), "namespace": NS}}]
    }))
    .unwrap();
    h.api::<EndpointSlice>()
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    let platform = KubePlatform::start(
        h.client.clone(),
        KubeOptions {
            namespace: Some(NS.into()),
            ..KubeOptions::default()
        },
        PlatformMetrics::default(),
    );
    let key = RevisionKey::new(NS, "hello-00001");
    // (As the Revision watch would: the controller's Deployment and private Service count
    // only as controlled by this UID.)
    platform.observe_uid(&key, ready.metadata.uid.as_deref());
    let mut eps = platform.endpoints(&key);
    let snap = until("the activator's endpoints", || {
        let snap = eps.borrow_and_update().clone();
        async move { (!snap.ready.is_empty()).then_some(snap) }
    })
    .await;
    assert_eq!(snap.ready, ["10.1.2.3:8012".parse().unwrap()]);
    let targets = until("the autoscaler's stats target", || {
        let t = pairs(platform.stats_targets(&key));
        async move { (!t.is_empty()).then_some(t) }
    })
    .await;
    assert_eq!(
        targets,
        [(pod.name_any(), "10.1.2.3:9091".parse().unwrap())]
    );
    platform.shutdown();
}

#[tokio::test]
async fn h2c_revisions_get_the_http2_ports() {
    let h = Harness::start().await;
    let mut rev = helloworld("grpc-00001");
    rev["spec"]["containers"][0]["ports"][0]["name"] = "h2c".into();
    h.create_revision(rev).await;
    let dep = h.deployment("grpc-00001-deployment").await;
    let q = &dep.spec.unwrap().template.spec.unwrap().containers[1];
    assert_eq!(env(q, "THAW_USER_PROTOCOL").as_deref(), Some("h2c"));
    let svcs = h.api::<Service>();
    let private = until("private service", || async {
        svcs.get_opt("grpc-00001-private").await.unwrap()
    })
    .await;
    let public = until("public service", || async {
        svcs.get_opt("grpc-00001").await.unwrap()
    })
    .await;
    let h2c = Some("kubernetes.io/h2c".to_string());
    assert_eq!(
        ports(&private),
        [
            ("http".into(), 80, 8012, None),
            ("http2".into(), 81, 8012, h2c.clone()),
            ("http-autometric".into(), 9091, 9091, None)
        ]
    );
    assert_eq!(ports(&public), [("http2".into(), 81, 8012, h2c)]);
}

/// The sidecar's environment in `dep`.
fn queue_env(dep: &Deployment) -> Vec<k8s_openapi::api::core::v1::EnvVar> {
    let pod = dep.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let q = pod.containers.iter().find(|c| c.name == "queue-proxy");
    q.unwrap().env.clone().unwrap_or_default()
}

/// The value of the sidecar's variable `name` in `dep` (`Some("")` when set without a value,
/// `None` when absent).
fn queue_var(dep: &Deployment, name: &str) -> Option<String> {
    let env = queue_env(dep);
    let e = env.iter().find(|e| e.name == name)?;
    Some(e.value.clone().unwrap_or_default())
}

const TAG_KEY: &[u8] = b"the-proxy-tag-key-0123456789abcdef";
const STATS_TOKEN: &[u8] = b"the-stats-token-0123456789abcdef";

/// Tags written with [`TAG_KEY`], the stats token [`STATS_TOKEN`], the upgrade window open
/// (`open`) or over.
fn tag_keys(open: bool) -> thaw::knative::proxy_tag::Keys {
    use thaw::knative::proxy_tag::{Key, Keys};
    let now = thaw::controller::now().0;
    let window = Duration::from_secs(1800);
    Keys {
        key: Some(Key::new(TAG_KEY)),
        stats_token: Some(Key::new(STATS_TOKEN)),
        legacy_until: Some(if open { now + window } else { now - window }),
    }
}

/// Puts `tags` in force.
fn set_tags(h: &Harness, tags: thaw::knative::proxy_tag::Keys) {
    let mut settings = (*h.ctx.settings()).clone();
    settings.proxy_tags = tags;
    h.ctx.set_settings(settings);
}

/// Returns once `rev` has been reconciled from start to end after this call: its status is
/// marked (observedGeneration 0), and the controller writes it back only from a reconcile
/// that read the mark (an older one's write is refused, being at an older resourceVersion).
/// The Deployment is applied before the status in each reconcile.
async fn reconciled_after_now(h: &Harness, rev: &str) {
    let api = h.api::<Revision>();
    api.patch_status(
        rev,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"observedGeneration": 0}})),
    )
    .await
    .unwrap();
    until(&format!("{rev} reconciled"), || async {
        let r = api.get(rev).await.ok()?;
        (r.status?.status.observed_generation != Some(0)).then_some(())
    })
    .await;
}

/// The tag key known: each revision's sidecar gets its own proxy tag (HMAC of the tag key over
/// `namespace/revision/uid`) and never a key; a rotated tag key gives the revisions their new
/// tags (the only rotation that rolls them).
#[tokio::test]
async fn the_sidecar_gets_its_revisions_proxy_tag_not_the_key() {
    use thaw::knative::proxy_tag::{Key, tag};
    let h = Harness::start().await;
    set_tags(&h, tag_keys(false));
    let r1 = h.create_revision(helloworld("hello-00001")).await;
    let r2 = h.create_revision(helloworld("hello-00002")).await;
    for rev in [&r1, &r2] {
        let name = rev.name_any();
        let dep = h.deployment(&format!("{name}-deployment")).await;
        let want = tag(TAG_KEY, NS, &name, &rev.uid().unwrap());
        assert_eq!(queue_var(&dep, "THAW_PROXY_TAG"), Some(want), "{name}");
        // The window is over: no previous form (the variable is there, empty).
        assert_eq!(
            queue_var(&dep, "THAW_PROXY_TAG_LEGACY").as_deref(),
            Some("")
        );
        let text = serde_json::to_string(&queue_env(&dep)).unwrap();
        assert!(!text.contains("proxy-tag-key"), "the key in {text}");
        assert!(!text.contains("stats-token"), "the token in {text}");
    }
    // A rotation of the tag key: the Deployments roll to their new tags.
    let rotated = b"a-rotated-proxy-tag-key-fedcba9876";
    let mut keys = tag_keys(false);
    keys.key = Some(Key::new(rotated));
    set_tags(&h, keys);
    let want = tag(rotated, NS, "hello-00001", &r1.uid().unwrap());
    let deps = h.api::<Deployment>();
    until("the rotated tag", || async {
        let d = deps.get_opt("hello-00001-deployment").await.unwrap()?;
        (queue_var(&d, "THAW_PROXY_TAG") == Some(want.clone())).then_some(())
    })
    .await;
}

/// The finding: the tag omitted the revision's UID, so a revision deleted and created again
/// under the same name kept its tag (whoever learnt it could still mark requests to the new
/// one as proxied). Its Deployment now carries another tag.
#[tokio::test]
async fn a_revision_created_again_under_its_name_gets_another_tag() {
    use thaw::knative::proxy_tag::tag;
    let h = Harness::start().await;
    set_tags(&h, tag_keys(false));
    let first = h.create_revision(helloworld("hello-00001")).await;
    let before = queue_var(
        &h.deployment("hello-00001-deployment").await,
        "THAW_PROXY_TAG",
    );
    // Deleted (the Deployment with it, as the garbage collector would), then created again.
    h.api::<Revision>()
        .delete("hello-00001", &Default::default())
        .await
        .unwrap();
    h.api::<Deployment>()
        .delete("hello-00001-deployment", &Default::default())
        .await
        .unwrap();
    let deps = h.api::<Deployment>();
    until("the first deployment gone", || async {
        deps.get_opt("hello-00001-deployment")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let second = h.create_revision(helloworld("hello-00001")).await;
    assert_ne!(first.uid(), second.uid());
    let dep = until("the second deployment", || async {
        let d = deps.get_opt("hello-00001-deployment").await.unwrap()?;
        let owner = d.metadata.owner_references.as_ref()?.first()?.uid.clone();
        (Some(owner) == second.uid()).then_some(d)
    })
    .await;
    let after = queue_var(&dep, "THAW_PROXY_TAG");
    assert_eq!(
        after,
        Some(tag(TAG_KEY, NS, "hello-00001", &second.uid().unwrap()))
    );
    assert_ne!(after, before);
    assert_eq!(
        queue_var(&dep, "THAW_PROXY_TAG_LEGACY").as_deref(),
        Some("")
    );
}

/// The Deployment a previous release wrote for `rev`: its sidecar's only tag the previous
/// form, `legacy`, in `THAW_PROXY_TAG` (and no `THAW_PROXY_TAG_LEGACY`).
fn previous_release_deployment(h: &Harness, rev: &Revision, legacy: &str) -> Deployment {
    let settings = h.ctx.settings();
    let mut r = thaw::controller::revision::check(rev, &settings).unwrap();
    r.proxy_tag = Some(legacy.to_string());
    r.legacy_proxy_tag = None;
    let mut d = thaw::controller::revision::deployment::deployment(
        rev,
        &r,
        &settings.deployment,
        &settings.features,
        Some(1),
    );
    let pod = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    let q = pod.containers.iter_mut().find(|c| c.name == "queue-proxy");
    let env = q.unwrap().env.as_mut().unwrap();
    env.retain(|e| e.name != "THAW_PROXY_TAG_LEGACY");
    d
}

/// Each revision Deployment's pod template and generation.
async fn templates(h: &Harness, names: &[&str]) -> Vec<(String, Option<i64>)> {
    let mut out = Vec::new();
    for n in names {
        let d = h.deployment(&format!("{n}-deployment")).await;
        let template = serde_json::to_string(&d.spec.as_ref().unwrap().template).unwrap();
        out.push((template, d.metadata.generation));
    }
    out
}

/// The upgrade, then a stats-token rotation. A Deployment a previous release wrote (its tag
/// the previous form, under an older stats token) rolls once, to the new tag, carrying its
/// previous-form tag from the live object; a revision created in the upgrade window gets one
/// from the stats token; one created after it, none. Then the stats token rotates: every
/// revision is reconciled again and every Deployment's pod template stays byte for byte as it
/// was (no pod rolls), its generation too.
#[tokio::test]
async fn a_stats_token_rotation_leaves_every_deployment_template_byte_identical() {
    use thaw::knative::proxy_tag::{Key, legacy_tag, tag};
    let mut h = Harness::stopped().await;
    set_tags(&h, tag_keys(true));
    let upgraded = h.create_revision(helloworld("hello-00001")).await;
    let older_token = b"an-older-stats-token-0123456789ab";
    let old_form = legacy_tag(older_token, NS, "hello-00001");
    let before = previous_release_deployment(&h, &upgraded, &old_form);
    let created = h
        .api::<Deployment>()
        .create(&PostParams::default(), &before)
        .await
        .unwrap();
    let fresh = h.create_revision(helloworld("hello-00002")).await;
    h.run();
    let deps = h.api::<Deployment>();
    let new_tag = tag(TAG_KEY, NS, "hello-00001", &upgraded.uid().unwrap());
    let rolled = until("the upgrade's roll", || async {
        let d = deps.get_opt("hello-00001-deployment").await.unwrap()?;
        (queue_var(&d, "THAW_PROXY_TAG") == Some(new_tag.clone())).then_some(d)
    })
    .await;
    // Carried from the live object (the older token's), not computed from the token in force.
    assert_eq!(queue_var(&rolled, "THAW_PROXY_TAG_LEGACY"), Some(old_form));
    assert!(created.metadata.generation.is_some());
    assert_eq!(
        rolled.metadata.generation,
        created.metadata.generation.map(|g| g + 1),
        "rolled once"
    );
    let d2 = h.deployment("hello-00002-deployment").await;
    assert_eq!(
        queue_var(&d2, "THAW_PROXY_TAG"),
        Some(tag(TAG_KEY, NS, "hello-00002", &fresh.uid().unwrap()))
    );
    assert_eq!(
        queue_var(&d2, "THAW_PROXY_TAG_LEGACY"),
        Some(legacy_tag(STATS_TOKEN, NS, "hello-00002"))
    );
    // The window ends; a revision created now gets no previous form, and the others keep theirs.
    set_tags(&h, tag_keys(false));
    h.create_revision(helloworld("hello-00003")).await;
    let d3 = h.deployment("hello-00003-deployment").await;
    assert_eq!(queue_var(&d3, "THAW_PROXY_TAG_LEGACY").as_deref(), Some(""));
    let names = ["hello-00001", "hello-00002", "hello-00003"];
    for n in names {
        reconciled_after_now(&h, n).await;
    }
    let settled = templates(&h, &names).await;

    // The rotation.
    let mut rotated = tag_keys(false);
    rotated.stats_token = Some(Key::new(b"a-rotated-stats-token-fedcba98765"));
    set_tags(&h, rotated);
    for n in names {
        reconciled_after_now(&h, n).await;
    }
    assert_eq!(templates(&h, &names).await, settled);
}

/// Whether the field manager's entries of `dep` own `spec.replicas`, per operation.
fn replicas_owners(dep: &Deployment) -> Vec<(String, String)> {
    dep.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:spec")
                    .and_then(|s| s.get("f:replicas"))
                    .is_some()
            })
        })
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn replicas_are_the_autoscalers_after_creation() {
    let h = Harness::start().await;
    let mut rev = helloworld("scale-00001");
    rev["metadata"]["annotations"]["autoscaling.knative.dev/initial-scale"] = "2".into();
    h.create_revision(rev).await;
    let name = "scale-00001-deployment";
    let dep = h.deployment(name).await;
    assert_eq!(
        dep.spec.as_ref().unwrap().replicas,
        Some(2),
        "initial scale"
    );
    let deps = h.api::<Deployment>();
    let revs = h.api::<Revision>();

    // Each edit of the revision's annotations reaches the Deployment by a new apply: a
    // reconcile surely ran after it.
    let touch = |n: u32| {
        let revs = revs.clone();
        let deps = deps.clone();
        async move {
            revs.patch(
                "scale-00001",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"example.com/touch": n.to_string()}}
                })),
            )
            .await
            .unwrap();
            until(&format!("touch {n} applied"), || async {
                let d = deps.get(name).await.ok()?;
                (d.annotations().get("example.com/touch") == Some(&n.to_string())).then_some(d)
            })
            .await
        }
    };

    // A reconcile without any scale change leaves the initial scale.
    let d = touch(1).await;
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(2));

    // The autoscaler scales through /scale with its own field manager.
    deps.patch_scale(
        name,
        &PatchParams {
            field_manager: Some("autoscaler.thaw.dev".into()),
            ..PatchParams::default()
        },
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    let d = touch(2).await;
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(5), "not fought");
    let d = touch(3).await;
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(5));
    // And to zero.
    deps.patch_scale(
        name,
        &PatchParams {
            field_manager: Some("autoscaler.thaw.dev".into()),
            ..PatchParams::default()
        },
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    let d = touch(4).await;
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));

    // managedFields: the controller's server-side apply never claims spec.replicas.
    let owners = replicas_owners(&d);
    eprintln!("spec.replicas owned by: {owners:?}");

    assert!(
        !owners
            .iter()
            .any(|(m, op)| m == thaw::controller::FIELD_MANAGER && op == "Apply"),
        "{owners:?}"
    );
    let applies: Vec<_> = d
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(thaw::controller::FIELD_MANAGER))
        .map(|m| m.operation.clone().unwrap_or_default())
        .collect();
    assert!(applies.contains(&"Apply".to_string()), "{applies:?}");
}

#[tokio::test]
async fn image_pull_after_the_deadline_and_crash_loop_at_once_reach_the_revision() {
    let h = Harness::start().await;
    let rolling = serde_json::json!({
        "replicas": 1, "readyReplicas": 0, "availableReplicas": 0, "unavailableReplicas": 1,
        "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
        ]
    });

    let pull = h.create_revision(helloworld("pull-00001")).await;
    h.deployment("pull-00001-deployment").await;
    h.deployment_status("pull-00001-deployment", rolling.clone())
        .await;
    let message = "Back-off pulling image \"ghcr.io/knative/helloworld-go:nope\"";
    h.pod(
        &pull,
        "pull-00001-deployment-a",
        serde_json::json!([
            {"name": "user-container", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0,
             "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}}},
            {"name": "queue-proxy", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0, "state": {"running": {}}}
        ]),
    )
    .await;
    // An image pull counts against the progress deadline (Knative's rule): once the Deployment
    // gives up, the pod's reason and message explain it.
    h.deployment_status(
        "pull-00001-deployment",
        serde_json::json!({
            "replicas": 1, "readyReplicas": 0, "availableReplicas": 0, "unavailableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
            ]
        }),
    )
    .await;
    let r = h
        .condition(
            "pull-00001",
            condition::RESOURCES_AVAILABLE,
            ConditionStatus::False,
            Some("ImagePullBackOff"),
        )
        .await;
    let st = r.status.unwrap();
    let ready = st.status.condition(condition::READY).unwrap();
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason.as_deref(), Some("ImagePullBackOff"));
    assert_eq!(ready.message.as_deref(), Some(message));

    let crash = h.create_revision(helloworld("crash-00001")).await;
    h.deployment("crash-00001-deployment").await;
    h.deployment_status("crash-00001-deployment", rolling).await;
    h.pod(
        &crash,
        "crash-00001-deployment-a",
        serde_json::json!([
            {"name": "user-container", "image": "i", "imageID": "", "ready": false,
             "restartCount": 4,
             "state": {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": "back-off 1m20s restarting failed container"}},
             "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
            {"name": "queue-proxy", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0, "state": {"running": {}}}
        ]),
    )
    .await;
    let r = h
        .condition(
            "crash-00001",
            condition::CONTAINER_HEALTHY,
            ConditionStatus::False,
            Some("ExitCode137"),
        )
        .await;
    let st = r.status.unwrap();
    let ch = st.status.condition(condition::CONTAINER_HEALTHY).unwrap();
    assert_eq!(
        ch.message.as_deref(),
        Some("Container failed with: OOMKilled")
    );
    let ra = st.status.condition(condition::RESOURCES_AVAILABLE).unwrap();
    assert_eq!(
        (ra.reason.as_deref(), ra.message.as_deref()),
        (
            Some("CrashLoopBackOff"),
            Some("back-off 1m20s restarting failed container")
        )
    );
    let ready = st.status.condition(condition::READY).unwrap();
    assert_eq!(ready.reason.as_deref(), Some("ExitCode137"));
}

#[tokio::test]
async fn hpa_class_revisions_get_an_hpa() {
    let h = Harness::start().await;
    let mut rev = helloworld("cpu-00001");
    let a = &mut rev["metadata"]["annotations"];
    a["autoscaling.knative.dev/class"] = "hpa.autoscaling.knative.dev".into();
    a["autoscaling.knative.dev/metric"] = "cpu".into();
    a["autoscaling.knative.dev/target"] = "75".into();
    a["autoscaling.knative.dev/min-scale"] = "1".into();
    a["autoscaling.knative.dev/max-scale"] = "4".into();
    let rev = h.create_revision(rev).await;
    let hpas = h.api::<HorizontalPodAutoscaler>();
    let hpa = until("hpa", || async { hpas.get_opt("cpu-00001").await.unwrap() }).await;
    assert_eq!(hpa.owner_references()[0].uid, rev.uid().unwrap());
    let spec = hpa.spec.unwrap();
    assert_eq!(spec.scale_target_ref.kind, "Deployment");
    assert_eq!(spec.scale_target_ref.name, "cpu-00001-deployment");
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(1), 4));
    let m = &spec.metrics.unwrap()[0];
    let res = m.resource.as_ref().unwrap();
    assert_eq!(
        (
            res.name.as_str(),
            res.target.type_.as_str(),
            res.target.average_utilization
        ),
        ("cpu", "Utilization", Some(75))
    );
    // A KPA revision gets none.
    h.create_revision(helloworld("kpa-00001")).await;
    h.deployment("kpa-00001-deployment").await;
    until("kpa revision's services", || async {
        h.api::<Service>().get_opt("kpa-00001").await.unwrap()
    })
    .await;
    assert!(hpas.get_opt("kpa-00001").await.unwrap().is_none());
}

#[tokio::test]
async fn a_70_character_configuration_keeps_every_name_and_label_within_63() {
    let h = Harness::start().await;
    let config = format!("{}-long", "a".repeat(65));
    assert_eq!(config.len(), 70);
    let name = child_name(&config, "-00001");
    let mut rev = helloworld(&name);
    // As the Configuration reconciler writes it: the label hashed, the owner named whole.
    rev["metadata"]["labels"][labels::CONFIGURATION] = labels::value(&config).into();
    rev["metadata"]["ownerReferences"] = serde_json::json!([{
        "apiVersion": "serving.knative.dev/v1", "kind": "Configuration", "name": config,
        "uid": "6f1c2a1e-0000-4000-8000-000000000001", "controller": true,
        "blockOwnerDeletion": true
    }]);
    h.create_revision(rev).await;
    let dep = h.deployment(&child_name(&name, "-deployment")).await;
    let svcs = h.api::<Service>();
    let private = until("private service", || async {
        svcs.get_opt(&child_name(&name, "-private")).await.unwrap()
    })
    .await;
    let public = until("public service", || async {
        svcs.get_opt(&child_name(&name, "")).await.unwrap()
    })
    .await;
    let spec = dep.spec.clone().unwrap();
    let mut label_sets = vec![
        dep.labels().clone(),
        spec.template.metadata.unwrap().labels.unwrap(),
        spec.selector.match_labels.unwrap(),
        private.labels().clone(),
        public.labels().clone(),
        private.spec.as_ref().unwrap().selector.clone().unwrap(),
    ];
    for obj_name in [dep.name_any(), private.name_any(), public.name_any()] {
        assert!(obj_name.len() <= 63, "{obj_name}");
    }
    for set in label_sets.drain(..) {
        for (k, v) in set {
            assert!(v.len() <= 63, "label {k}={v} is {} characters", v.len());
        }
    }
    let user = &dep.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(env(user, "K_CONFIGURATION"), Some(config));
}

#[tokio::test]
async fn a_child_owned_by_someone_else_is_reported_and_left_alone() {
    let h = Harness::start().await;
    let theirs: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "taken-00001-deployment", "labels": {"app": "theirs"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {"metadata": {"labels": {"app": "theirs"}},
                         "spec": {"containers": [{"name": "c", "image": "theirs"}]}}
        }
    }))
    .unwrap();
    let deps = h.api::<Deployment>();
    let before = deps.create(&PostParams::default(), &theirs).await.unwrap();
    h.create_revision(helloworld("taken-00001")).await;
    let r = h
        .condition(
            "taken-00001",
            condition::READY,
            ConditionStatus::False,
            Some("NotOwned"),
        )
        .await;
    let ready = r
        .status
        .as_ref()
        .unwrap()
        .status
        .condition(condition::READY)
        .unwrap();
    assert_eq!(
        ready.message.as_deref(),
        Some("There is an existing Deployment \"taken-00001-deployment\" that we do not own.")
    );
    let events = h.api::<Event>();
    until("the NotOwned event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("NotOwned")
                    && e.regarding.as_ref().and_then(|o| o.name.as_deref()) == Some("taken-00001")
            })
            .then_some(())
    })
    .await;
    // Retried with backoff, and still nothing written: their Deployment as it was, no
    // Service of ours.
    until("a few more reconciles", || async {
        (h.ctx.reconciles() >= 3).then_some(())
    })
    .await;
    let after = deps.get("taken-00001-deployment").await.unwrap();
    assert_eq!(after.resource_version(), before.resource_version());
    assert!(after.owner_references().is_empty());
    assert!(
        h.api::<Service>()
            .get_opt("taken-00001-private")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn an_invalid_revision_is_reported_with_the_field_named() {
    let h = Harness::start().await;
    let mut rev = helloworld("bad-00001");
    rev["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] = "lots".into();
    rev["spec"]["containers"][0]["ports"][0]["containerPort"] = 8012.into();
    h.create_revision(rev).await;
    let r = h
        .condition(
            "bad-00001",
            condition::READY,
            ConditionStatus::False,
            Some("InvalidSpec"),
        )
        .await;
    let msg = r
        .status
        .unwrap()
        .status
        .condition(condition::RESOURCES_AVAILABLE)
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(msg.contains("autoscaling.knative.dev/min-scale"), "{msg}");
    assert!(
        msg.contains("spec.containers[0].ports.containerPort"),
        "{msg}"
    );
    assert!(
        h.api::<Deployment>()
            .get_opt("bad-00001-deployment")
            .await
            .unwrap()
            .is_none()
    );
}

/// The targets as `(pod, address)`, for pods running thaw's sidecar.
fn pairs(targets: Vec<thaw::stats::StatsTarget>) -> Vec<(String, std::net::SocketAddr)> {
    targets
        .into_iter()
        .map(|t| {
            assert_eq!(t.wire, thaw::stats::PodStatsWire::Thaw);
            (t.pod, t.addr)
        })
        .collect()
}
