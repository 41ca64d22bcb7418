//! The Revision watch (`platform::kubernetes::revisions`) against the in-process API server
//! over real HTTP: Revisions created, changed and deleted reach the catalog and the platform; a
//! `config-defaults` edit resolves every revision again; an invalid Revision is kept out (and
//! an invalid change keeps the last valid spec), with the field and reason. Waits await the
//! catalog's or the platform's channels with a deadline; nothing asserts a duration.

mod kube_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, ContainerPort, PodSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ObjectMeta, PostParams};
use thaw::config::ConfigSet;
use thaw::config::live::{LiveConfig, SYSTEM_NAMESPACE, watch_configmaps};
use thaw::config::revision::resolve_revision;
use thaw::knative::Revision;
use thaw::platform::kubernetes::revisions::{Follower, revision_input};
use thaw::platform::kubernetes::{KubeOptions, KubePlatform, follow_revisions};
use thaw::platform::{EndpointSnapshot, EndpointSource, EndpointStatus};
use thaw::revision::{CatalogSnapshot, Protocol, RevisionCatalog, RevisionKey};
use thaw::telemetry::config::ConfigMetrics;
use thaw::telemetry::platform::{PlatformMetrics, RevisionLabels};
use tokio::sync::watch;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(30);

/// A Revision of service `hello` with one container port named `port`.
fn revision(name: &str, cc: Option<i64>, port: &str, annotations: &[(&str, &str)]) -> Revision {
    let mut r = Revision::new(
        name,
        thaw::knative::RevisionSpec {
            pod_spec: PodSpec {
                containers: vec![Container {
                    name: "user-container".into(),
                    image: Some("example.com/hello".into()),
                    ports: Some(vec![ContainerPort {
                        container_port: 8080,
                        name: Some(port.into()),
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            },
            container_concurrency: cc,
            ..thaw::knative::RevisionSpec::default()
        },
    );
    r.metadata.namespace = Some(NS.into());
    r.metadata.labels = Some(BTreeMap::from([(
        "serving.knative.dev/service".to_string(),
        "hello".to_string(),
    )]));
    r.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    r
}

fn slice(name: &str, revision: &str, ip: &str) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {
            "serving.knative.dev/revision": revision,
            "networking.internal.knative.dev/serviceType": "Private",
            "kubernetes.io/service-name": format!("{revision}-private"),
        }},
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": 8012, "protocol": "TCP"},
            {"name": "http2", "port": 8013, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"}
        ],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true},
            "targetRef": kube_support::pod_target(NS, "p1")}],
    }))
    .unwrap()
}

/// Everything the watch feeds, started against `api`.
struct Followed {
    catalog: Arc<RevisionCatalog>,
    platform: KubePlatform,
    metrics: PlatformMetrics,
    stop: CancellationToken,
}

impl Followed {
    async fn start(api: &kube_support::TestApi) -> Self {
        let platform = KubePlatform::start(
            api.client(),
            KubeOptions::default(),
            PlatformMetrics::default(),
        );
        timeout(DEADLINE, platform.wait_synced())
            .await
            .expect("platform synced");
        let stop = CancellationToken::new();
        let live = LiveConfig::default();
        let events = watch_configmaps(
            api.client(),
            SYSTEM_NAMESPACE,
            live.clone(),
            ConfigMetrics::default(),
            stop.clone(),
        );
        let catalog = Arc::new(RevisionCatalog::default());
        let metrics = PlatformMetrics::default();
        let follower = Follower::new(catalog.clone(), platform.clone(), live, metrics.clone());
        let followed = follow_revisions(api.client(), None, follower, events, stop.clone());
        timeout(DEADLINE, followed.wait_synced())
            .await
            .expect("revisions synced");
        assert!(followed.is_synced());
        Self {
            catalog,
            platform,
            metrics,
            stop,
        }
    }

    /// Awaits the catalog's changes (no polling) until `pred` holds.
    async fn wait(&self, what: &str, pred: impl Fn(&CatalogSnapshot) -> bool) {
        let mut rx = self.catalog.subscribe();
        let found = timeout(DEADLINE, async {
            loop {
                if pred(&self.catalog.load()) {
                    return;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        assert!(found.is_ok(), "{what}: catalog {:?}", self.catalog.load());
    }

    fn rejected(&self, name: &str) -> u64 {
        self.metrics
            .revisions_rejected
            .get_or_create(&RevisionLabels {
                namespace: NS.into(),
                revision: name.into(),
            })
            .get()
    }

    /// Polls the rejection counter of `name` until it passes `above` (deadline).
    async fn wait_rejected(&self, name: &str, above: u64) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while self.rejected(name) <= above {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never rejected"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.stop.cancel();
        self.platform.shutdown();
    }
}

async fn wait_snapshot(
    rx: &mut watch::Receiver<Arc<EndpointSnapshot>>,
    what: &str,
    pred: impl Fn(&EndpointSnapshot) -> bool,
) -> Arc<EndpointSnapshot> {
    let found = match timeout(DEADLINE, rx.wait_for(|s| pred(s))).await {
        Ok(Ok(s)) => Some(s.clone()),
        _ => None,
    };
    found.unwrap_or_else(|| panic!("{what}: last snapshot {:?}", rx.borrow()))
}

#[tokio::test]
async fn revisions_created_changed_and_deleted_follow_into_the_catalog_and_the_platform() {
    let api = kube_support::TestApi::start().await;
    let revs: Api<Revision> = Api::namespaced(api.client(), NS);
    // One Revision exists before the watch starts: the first list brings it.
    revs.create(
        &PostParams::default(),
        &revision("early-00001", None, "http1", &[]),
    )
    .await
    .unwrap();
    let f = Followed::start(&api).await;
    let early = RevisionKey::new(NS, "early-00001");
    assert!(
        f.catalog.load().get(&early).is_some(),
        "synced means listed"
    );

    // Added: the effective spec, the hosts, and the platform told the protocol.
    revs.create(
        &PostParams::default(),
        &revision(
            "hello-00001",
            Some(5),
            "h2c",
            &[("serving.knative.dev/progress-deadline", "45s")],
        ),
    )
    .await
    .unwrap();
    let key = RevisionKey::new(NS, "hello-00001");
    f.wait("added", |c| c.get(&key).is_some()).await;
    let snap = f.catalog.load();
    let spec = snap.get(&key).unwrap();
    assert_eq!(spec.container_concurrency, 5);
    assert_eq!(spec.protocol, Protocol::H2c);
    assert_eq!(spec.service.as_deref(), Some("hello"));
    // Its UID too: the activator's K-Proxy-Request tag covers it.
    let created = revs.get("hello-00001").await.unwrap().metadata.uid;
    assert_eq!(spec.uid.as_deref(), created.as_deref());
    assert!(created.is_some());
    for host in [
        "hello-00001.default",
        "hello-00001.default.svc",
        "hello-00001.default.svc.cluster.local:80",
    ] {
        assert_eq!(snap.route_host(host).map(|s| &s.key), Some(&key), "{host}");
    }
    // The platform reads the h2c port of the revision's slices: it knows the protocol. (The
    // endpoint's pod is the revision's own Deployment's, at its IP: that Deployment and the
    // private Service are controlled by the Revision's UID, which the watch told the platform.)
    let uid = revs.get("hello-00001").await.unwrap().metadata.uid.unwrap();
    kube_support::revision_children(&api.client(), NS, "hello-00001", &uid).await;
    let labels = serde_json::json!({"serving.knative.dev/revision": "hello-00001"});
    let dep = "hello-00001-deployment";
    kube_support::running_pod(&api.client(), NS, dep, "p1", "10.0.0.1", labels).await;
    let slices: Api<EndpointSlice> = Api::namespaced(api.client(), NS);
    slices
        .create(
            &PostParams::default(),
            &slice("hello-00001-private-x", "hello-00001", "10.0.0.1"),
        )
        .await
        .unwrap();
    let mut rx = f.platform.endpoints(&key);
    wait_snapshot(&mut rx, "h2c port", |s| {
        s.ready == ["10.0.0.1:8013".parse().unwrap()]
    })
    .await;

    // Changed: the new spec replaces the old one; the other revision is untouched.
    let before_early = f.catalog.load().get(&early).unwrap().clone();
    let mut r = revs.get("hello-00001").await.unwrap();
    r.spec.container_concurrency = Some(7);
    revs.replace("hello-00001", &PostParams::default(), &r)
        .await
        .unwrap();
    f.wait("changed", |c| {
        c.get(&key).is_some_and(|s| s.container_concurrency == 7)
    })
    .await;
    assert!(Arc::ptr_eq(
        f.catalog.load().get(&early).unwrap(),
        &before_early
    ));

    // Deleted: out of the catalog with its hosts, and the platform's subscribers told at once
    // (held requests answered 503).
    revs.delete("hello-00001", &Default::default())
        .await
        .unwrap();
    f.wait("deleted", |c| c.get(&key).is_none()).await;
    assert!(f.catalog.load().route_host("hello-00001.default").is_none());
    let snap = wait_snapshot(&mut rx, "removed", |s| s.status != EndpointStatus::Ok).await;
    assert_eq!(
        snap.status,
        EndpointStatus::Failing {
            reason: "revision unavailable (Removed)".into()
        }
    );
    assert_eq!(f.catalog.load().len(), 1);
}

#[tokio::test]
async fn a_defaults_change_resolves_every_revision_again_and_invalid_ones_stay_out() {
    let api = kube_support::TestApi::start().await;
    let revs: Api<Revision> = Api::namespaced(api.client(), NS);
    let f = Followed::start(&api).await;
    let (a, pinned) = (
        RevisionKey::new(NS, "a-00001"),
        RevisionKey::new(NS, "pinned-00001"),
    );
    revs.create(
        &PostParams::default(),
        &revision("a-00001", None, "http1", &[]),
    )
    .await
    .unwrap();
    revs.create(
        &PostParams::default(),
        &revision("pinned-00001", Some(3), "http1", &[]),
    )
    .await
    .unwrap();
    f.wait("both added", |c| {
        c.get(&a).is_some() && c.get(&pinned).is_some()
    })
    .await;
    assert_eq!(f.catalog.load().get(&a).unwrap().container_concurrency, 0);

    // config-defaults changes the default: the revision that sets none follows, the one that
    // sets its own keeps it.
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), SYSTEM_NAMESPACE);
    cms.create(
        &PostParams::default(),
        &ConfigMap {
            metadata: ObjectMeta {
                name: Some("config-defaults".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "container-concurrency".to_string(),
                "9".to_string(),
            )])),
            ..ConfigMap::default()
        },
    )
    .await
    .unwrap();
    f.wait("re-resolved", |c| {
        c.get(&a).is_some_and(|s| s.container_concurrency == 9)
    })
    .await;
    assert_eq!(
        f.catalog.load().get(&pinned).unwrap().container_concurrency,
        3
    );

    // An invalid Revision is skipped and counted; the reason names the field.
    let bad = revision(
        "bad-00001",
        None,
        "http1",
        &[("autoscaling.knative.dev/min-scale", "lots")],
    );
    let problems =
        resolve_revision(&revision_input(&bad).unwrap(), &ConfigSet::default()).unwrap_err();
    assert_eq!(problems.0[0].key, "autoscaling.knative.dev/min-scale");
    assert_eq!(problems.0[0].value, "lots");
    revs.create(&PostParams::default(), &bad).await.unwrap();
    f.wait_rejected("bad-00001", 0).await;
    assert!(
        f.catalog
            .load()
            .get(&RevisionKey::new(NS, "bad-00001"))
            .is_none()
    );

    // An invalid change of a valid revision keeps its last valid spec.
    let before = f.catalog.load().get(&a).unwrap().clone();
    let mut r = revs.get("a-00001").await.unwrap();
    r.metadata
        .annotations
        .get_or_insert_default()
        .insert("activator.thaw.dev/queue-depth".into(), "-1".into());
    r.spec.container_concurrency = Some(4);
    revs.replace("a-00001", &PostParams::default(), &r)
        .await
        .unwrap();
    f.wait_rejected("a-00001", 0).await;
    assert!(Arc::ptr_eq(f.catalog.load().get(&a).unwrap(), &before));

    // Fixed again: applied.
    r = revs.get("a-00001").await.unwrap();
    r.metadata.annotations = Some(BTreeMap::new());
    revs.replace("a-00001", &PostParams::default(), &r)
        .await
        .unwrap();
    f.wait("fixed", |c| {
        c.get(&a).is_some_and(|s| s.container_concurrency == 4)
    })
    .await;
}

/// A negative number in the Revision's own fields is reported by field, before resolving.
#[test]
fn negative_fields_are_named() {
    let mut r = revision("neg-00001", Some(-1), "http1", &[]);
    r.spec.timeout_seconds = Some(-5);
    let problems = revision_input(&r).unwrap_err();
    let keys: Vec<&str> = problems.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["spec.containerConcurrency", "spec.timeoutSeconds"]);
    let input = revision_input(&revision("ok-00001", None, "h2c", &[])).unwrap();
    assert_eq!(input.port_name.as_deref(), Some("h2c"));
    assert_eq!(input.service.as_deref(), Some("hello"));
    assert_eq!(
        input.hosts,
        [
            "ok-00001.default",
            "ok-00001.default.svc",
            "ok-00001.default.svc.cluster.local"
        ]
    );
}

/// The routing state the Route reconciler's labeler writes: `reserve` makes the revision
/// unreachable for the autoscaler (min-scale no longer holds it), anything else reachable.
#[test]
fn a_reserve_routing_state_makes_the_revision_unreachable() {
    let mut r = revision(
        "rs-00001",
        None,
        "http1",
        &[("autoscaling.knative.dev/min-scale", "2")],
    );
    for (state, reachable) in [
        (None, true),
        (Some("pending"), true),
        (Some("active"), true),
        (Some("reserve"), false),
    ] {
        let labels = r.metadata.labels.get_or_insert_default();
        match state {
            Some(s) => labels.insert("serving.knative.dev/routingState".into(), s.into()),
            None => labels.remove("serving.knative.dev/routingState"),
        };
        let input = revision_input(&r).unwrap();
        assert_eq!(input.unreachable, !reachable, "{state:?}");
        let spec = resolve_revision(&input, &ConfigSet::default()).unwrap();
        assert_eq!(spec.autoscaling.reachable, reachable, "{state:?}");
        assert_eq!(spec.autoscaling.min_scale, 2);
    }
}
