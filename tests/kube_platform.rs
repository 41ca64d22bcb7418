//! The Kubernetes platform against the in-process API server over real HTTP: the test plays
//! kubelet and the endpoints controller (it writes Deployments' pods' statuses and the private
//! EndpointSlices). Every wait polls for a condition with a deadline or awaits the platform's
//! watch channel; nothing asserts a duration.

mod kube_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_support::revision_deployment as deployment;
use thaw::platform::kubernetes::{KubeOptions, KubePlatform, KubeRevision};
use thaw::platform::{EndpointSnapshot, EndpointSource, EndpointStatus, Platform};
use thaw::revision::{Protocol, RevisionKey};
use thaw::telemetry::platform::PlatformMetrics;
use tokio::sync::watch;
use tokio::time::timeout;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(30);

fn opts() -> KubeOptions {
    KubeOptions {
        missing_deployment_grace: Duration::from_millis(500),
        retry_initial: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        ..KubeOptions::default()
    }
}

async fn platform(client: kube::Client, opts: KubeOptions) -> KubePlatform {
    let p = KubePlatform::start(client, opts, PlatformMetrics::default());
    timeout(DEADLINE, p.wait_synced())
        .await
        .expect("watches synced");
    p
}

/// The pod the endpoint at `addr` targets in [`slice`].
fn pod_of(addr: &str) -> String {
    format!("pod-{}", addr.replace('.', "-"))
}

/// A private slice of `revision`, each endpoint's `targetRef` naming pod [`pod_of`] its
/// address (see [`own`]).
fn slice(name: &str, revision: &str, ready: &[&str], terminating: &[&str]) -> EndpointSlice {
    let mut endpoints = Vec::new();
    for a in ready {
        endpoints.push(
            serde_json::json!({"addresses": [a], "conditions": {"ready": true},
            "targetRef": kube_support::pod_target(NS, &pod_of(a))}),
        );
    }
    for a in terminating {
        endpoints.push(serde_json::json!({"addresses": [a],
            "conditions": {"ready": false, "serving": true, "terminating": true},
            "targetRef": kube_support::pod_target(NS, &pod_of(a))}));
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {
            "serving.knative.dev/revision": revision,
            "networking.internal.knative.dev/serviceType": "Private",
            "kubernetes.io/service-name": format!("{revision}-private"),
        }},
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": 8012, "protocol": "TCP"},
            {"name": "http2", "port": 8013, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
            {"name": thaw::stats::POD_STATS_PORT_NAME, "port": 9091, "protocol": "TCP"}
        ],
        "endpoints": endpoints,
    }))
    .unwrap()
}

/// Plays the Deployment controller for the pods at `addrs` ([`pod_of`]): each is owned, through
/// a ReplicaSet, by `revision`'s Deployment (found by label; `{revision}` created when it has
/// none), as endpoints by ownership require.
async fn own(client: &kube::Client, revision: &str, addrs: &[&str]) {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let label = format!("serving.knative.dev/revision={revision}");
    let found = deps
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .unwrap();
    let name = match found.items.first() {
        Some(d) => d.metadata.name.clone().unwrap(),
        None => {
            deps.create(&PostParams::default(), &deployment(revision, revision))
                .await
                .unwrap();
            revision.to_string()
        }
    };
    for a in addrs {
        let labels = serde_json::json!({"serving.knative.dev/revision": revision});
        kube_support::owned_pod(client, NS, &name, &pod_of(a), labels).await;
    }
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// Awaits the watch channel (no polling) until `pred` holds.
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

async fn replicas(api: &Api<Deployment>, name: &str) -> Option<i32> {
    api.get_scale(name).await.ok()?.spec?.replicas
}

async fn wait_replicas(api: &Api<Deployment>, name: &str, want: i32) {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        if replicas(api, name).await == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{name} never reached {want} replicas (now {:?})",
            replicas(api, name).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn scale_patches_the_deployment_found_by_label() {
    let api = kube_support::TestApi::start().await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), NS);
    deps.create(
        &PostParams::default(),
        &deployment("whatever-name", "hello-00001"),
    )
    .await
    .unwrap();
    deps.create(&PostParams::default(), &deployment("other", "other-00001"))
        .await
        .unwrap();
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "hello-00001");
    p.scale(&rev, 3).await.unwrap();
    wait_replicas(&deps, "whatever-name", 3).await;
    // The latest value wins; other revisions' Deployments are untouched.
    p.scale(&rev, 5).await.unwrap();
    p.scale(&rev, 2).await.unwrap();
    wait_replicas(&deps, "whatever-name", 2).await;
    assert_eq!(replicas(&deps, "other").await, Some(0));
    p.scale(&rev, 0).await.unwrap();
    wait_replicas(&deps, "whatever-name", 0).await;
    // At zero the revision's scaler task ends; the next scale starts another.
    p.scale(&rev, 1).await.unwrap();
    wait_replicas(&deps, "whatever-name", 1).await;
    p.shutdown();
}

#[tokio::test]
async fn slices_of_a_revision_are_merged_and_deduplicated_and_updates_arrive_on_the_watch() {
    let api = kube_support::TestApi::start().await;
    let slices: Api<EndpointSlice> = Api::namespaced(api.client(), NS);
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "hello-00001");
    let mut rx = p.endpoints(&rev);
    assert!(rx.borrow().ready.is_empty());
    let ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"];
    own(&api.client(), "hello-00001", &ips).await;

    slices
        .create(
            &PostParams::default(),
            &slice(
                "hello-00001-private-a",
                "hello-00001",
                &["10.0.0.1", "10.0.0.2"],
                &[],
            ),
        )
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice(
                "hello-00001-private-b",
                "hello-00001",
                &["10.0.0.2", "10.0.0.3"],
                &["10.0.0.4"],
            ),
        )
        .await
        .unwrap();
    // A slice of another revision and a public slice of this one are not this revision's.
    slices
        .create(
            &PostParams::default(),
            &slice("other-private", "other-00001", &["10.0.9.9"], &[]),
        )
        .await
        .unwrap();
    let mut public = slice("hello-00001-public", "hello-00001", &["10.0.8.8"], &[]);
    public.metadata.labels.as_mut().unwrap().insert(
        "networking.internal.knative.dev/serviceType".into(),
        "Public".into(),
    );
    slices
        .create(&PostParams::default(), &public)
        .await
        .unwrap();

    let want = addrs(&["10.0.0.1:8012", "10.0.0.2:8012", "10.0.0.3:8012"]);
    let snap = wait_snapshot(&mut rx, "merged slices", |s| s.ready == want).await;
    assert_eq!(snap.terminating, addrs(&["10.0.0.4:8012"]));
    assert_eq!(snap.status, EndpointStatus::Ok);

    // An update of one slice reaches the subscriber by itself.
    slices
        .replace("hello-00001-private-b", &PostParams::default(), &{
            let mut s = slices.get("hello-00001-private-b").await.unwrap();
            let fresh = slice("x", "hello-00001", &["10.0.0.5"], &[]);
            s.endpoints = fresh.endpoints;
            s
        })
        .await
        .unwrap();
    let want = addrs(&["10.0.0.1:8012", "10.0.0.2:8012", "10.0.0.5:8012"]);
    let snap = wait_snapshot(&mut rx, "updated slice", |s| s.ready == want).await;
    assert!(snap.terminating.is_empty());

    // An h2c revision uses the http2 port of the same slices.
    p.upsert(KubeRevision {
        key: rev.clone(),
        protocol: Protocol::H2c,
        progress_deadline: None,
    });
    let want = addrs(&["10.0.0.1:8013", "10.0.0.2:8013", "10.0.0.5:8013"]);
    wait_snapshot(&mut rx, "h2c port", |s| s.ready == want).await;

    // A deleted slice leaves the merge.
    slices
        .delete("hello-00001-private-a", &Default::default())
        .await
        .unwrap();
    let want = addrs(&["10.0.0.5:8013"]);
    wait_snapshot(&mut rx, "slice deleted", |s| s.ready == want).await;

    // The revision is removed (deleted from the cluster): its subscribers are told at once.
    p.remove(&rev);
    let snap = wait_snapshot(&mut rx, "removed", |s| s.status != EndpointStatus::Ok).await;
    assert_eq!(
        snap.status,
        EndpointStatus::Failing {
            reason: "revision unavailable (Removed)".into()
        }
    );
    p.shutdown();
}

#[tokio::test]
async fn a_crash_looping_pod_makes_the_revision_failing_with_a_generic_reason() {
    let api = kube_support::TestApi::start().await;
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "crashy-00001");
    let mut rx = p.endpoints(&rev);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "crashy-00001-deployment-abc", "labels": {
            "serving.knative.dev/revision": "crashy-00001"}},
        "spec": {"containers": [{"name": "user-container", "image": "img"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let status = |state: serde_json::Value| {
        Patch::Merge(serde_json::json!({"status": {"containerStatuses": [{
            "name": "user-container", "image": "img", "imageID": "", "ready": false,
            "restartCount": 4, "state": state,
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}
        }]}}))
    };
    pods.patch_status(
        "crashy-00001-deployment-abc",
        &PatchParams::default(),
        &status(serde_json::json!({"waiting": {
            "reason": "CrashLoopBackOff",
            "message": "back-off 40s restarting failed container user-container in pod x"}})),
    )
    .await
    .unwrap();
    let snap = wait_snapshot(&mut rx, "failing", |s| s.status != EndpointStatus::Ok).await;
    let EndpointStatus::Failing { reason } = &snap.status else {
        unreachable!()
    };
    assert_eq!(&**reason, "revision unavailable (CrashLoopBackOff)");
    assert!(!reason.contains("crashy") && !reason.contains("back-off"));

    // The pod recovers: Ok again.
    pods.patch_status(
        "crashy-00001-deployment-abc",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"containerStatuses": [{
            "name": "user-container", "image": "img", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {}}
        }]}})),
    )
    .await
    .unwrap();
    wait_snapshot(&mut rx, "recovered", |s| s.status == EndpointStatus::Ok).await;

    // A pod that gets deleted takes its failure with it.
    pods.patch_status(
        "crashy-00001-deployment-abc",
        &PatchParams::default(),
        &status(serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}})),
    )
    .await
    .unwrap();
    wait_snapshot(&mut rx, "failing again", |s| {
        matches!(&s.status, EndpointStatus::Failing { reason } if reason.contains("CrashLoopBackOff"))
    })
    .await;
    pods.delete("crashy-00001-deployment-abc", &Default::default())
        .await
        .unwrap();
    wait_snapshot(&mut rx, "pod gone", |s| s.status == EndpointStatus::Ok).await;
    p.shutdown();
}

#[tokio::test]
async fn a_missing_deployment_is_retried_and_reported_failing_after_the_grace() {
    let api = kube_support::TestApi::start().await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), NS);
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "late-00001");
    let mut rx = p.endpoints(&rev);
    p.scale(&rev, 1).await.unwrap();
    // Within the grace: still Ok.
    assert_eq!(rx.borrow().status, EndpointStatus::Ok);
    let snap = wait_snapshot(&mut rx, "missing past grace", |s| {
        s.status != EndpointStatus::Ok
    })
    .await;
    assert_eq!(
        snap.status,
        EndpointStatus::Failing {
            reason: "revision unavailable (DeploymentMissing)".into()
        }
    );
    // The Deployment appears: the pending scale is applied and the status clears.
    deps.create(&PostParams::default(), &deployment("late", "late-00001"))
        .await
        .unwrap();
    wait_replicas(&deps, "late", 1).await;
    wait_snapshot(&mut rx, "deployment found", |s| {
        s.status == EndpointStatus::Ok
    })
    .await;
    p.shutdown();
}

#[tokio::test]
async fn no_ready_pod_within_the_activation_timeout_is_failing_timed_out() {
    let api = kube_support::TestApi::start().await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(api.client(), NS);
    deps.create(&PostParams::default(), &deployment("slow", "slow-00001"))
        .await
        .unwrap();
    let p = platform(
        api.client(),
        KubeOptions {
            activation_buffer: Duration::ZERO,
            ..opts()
        },
    )
    .await;
    let rev = RevisionKey::new(NS, "slow-00001");
    p.upsert(KubeRevision {
        key: rev.clone(),
        protocol: Protocol::Http1,
        progress_deadline: Some(Duration::from_millis(300)),
    });
    let mut rx = p.endpoints(&rev);
    p.scale(&rev, 1).await.unwrap();
    wait_replicas(&deps, "slow", 1).await;
    let snap = wait_snapshot(&mut rx, "timed out", |s| s.status != EndpointStatus::Ok).await;
    assert_eq!(
        snap.status,
        EndpointStatus::Failing {
            reason: "revision unavailable (TimedOut)".into()
        }
    );
    // A ready endpoint ends it.
    own(&api.client(), "slow-00001", &["10.0.1.1"]).await;
    slices
        .create(
            &PostParams::default(),
            &slice("slow-00001-private", "slow-00001", &["10.0.1.1"], &[]),
        )
        .await
        .unwrap();
    wait_snapshot(&mut rx, "ready", |s| {
        s.status == EndpointStatus::Ok && s.ready == addrs(&["10.0.1.1:8012"])
    })
    .await;
    p.shutdown();
}

#[tokio::test]
async fn watches_resume_from_their_resource_version_after_the_connection_is_cut() {
    let api = kube_support::TestApi::start().await;
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    let slices: Api<EndpointSlice> = Api::namespaced(api.client(), NS);
    let p = platform(kube_support::client_at(relay.addr()), opts()).await;
    let rev = RevisionKey::new(NS, "cut-00001");
    let mut rx = p.endpoints(&rev);
    own(&api.client(), "cut-00001", &["10.0.2.1", "10.0.2.2"]).await;
    let created = slices
        .create(
            &PostParams::default(),
            &slice("cut-00001-private", "cut-00001", &["10.0.2.1"], &[]),
        )
        .await
        .unwrap();
    // The last resourceVersion the watch saw before the cut.
    let seen_rv = created.metadata.resource_version.clone();
    wait_snapshot(&mut rx, "first", |s| s.ready == addrs(&["10.0.2.1:8012"])).await;
    let lists_before = relay.lists("endpointslices").len();
    let watches_before = relay.watches("endpointslices").len();
    assert_eq!(lists_before, 1, "{:?}", relay.requests());

    relay.cut();
    // While the platform cannot reach the server, the slice changes.
    slices
        .replace("cut-00001-private", &PostParams::default(), &{
            let mut s = slices.get("cut-00001-private").await.unwrap();
            s.endpoints = slice("x", "cut-00001", &["10.0.2.2"], &[]).endpoints;
            s
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.borrow().ready,
        addrs(&["10.0.2.1:8012"]),
        "cut off: no news"
    );
    relay.restore();

    wait_snapshot(&mut rx, "after the cut", |s| {
        s.ready == addrs(&["10.0.2.2:8012"])
    })
    .await;
    let watches = relay.watches("endpointslices");
    assert!(watches.len() > watches_before, "{watches:?}");
    // Resumed with a WATCH from the last resourceVersion, not a new LIST.
    assert_eq!(
        relay.lists("endpointslices").len(),
        1,
        "{:?}",
        relay.requests()
    );
    let last = watches.last().unwrap();
    let rv = last
        .split(['?', '&', ' '])
        .find_map(|kv| kv.strip_prefix("resourceVersion="))
        .unwrap();
    // At least the version of the slice seen before the cut (a bookmark may have moved it on).
    let seen: u64 = seen_rv.unwrap().parse().unwrap();
    assert!(rv.parse::<u64>().unwrap() >= seen && seen > 0, "{last}");
    p.shutdown();
}

#[tokio::test]
async fn conflicts_and_server_errors_are_retried_without_holding_up_other_revisions() {
    let api = kube_support::TestApi::start().await;
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), NS);
    for (name, rev) in [("a", "a-00001"), ("b", "b-00001")] {
        deps.create(&PostParams::default(), &deployment(name, rev))
            .await
            .unwrap();
    }
    let metrics = PlatformMetrics::default();
    let p = KubePlatform::start(
        kube_support::client_at(relay.addr()),
        KubeOptions {
            // Long enough that revision a is still being retried when b is done.
            retry_initial: Duration::from_millis(300),
            retry_max: Duration::from_secs(1),
            ..opts()
        },
        metrics.clone(),
    );
    timeout(DEADLINE, p.wait_synced()).await.unwrap();
    // (429, 503 and 504 are first retried inside kube's client; these reach the platform.)
    relay.fail_next("/deployments/a/scale", &[409, 500, 502]);
    p.scale(&RevisionKey::new(NS, "a-00001"), 2).await.unwrap();
    p.scale(&RevisionKey::new(NS, "b-00001"), 4).await.unwrap();
    // b goes through while a is still in its retries.
    wait_replicas(&deps, "b", 4).await;
    assert!(
        relay.faults_left() > 0 || replicas(&deps, "a").await != Some(2),
        "a finished before b: the test shows nothing"
    );
    // a's latest value is applied after its three failures.
    p.scale(&RevisionKey::new(NS, "a-00001"), 3).await.unwrap();
    wait_replicas(&deps, "a", 3).await;
    assert_eq!(relay.faults_left(), 0);
    let patches: Vec<String> = relay
        .requests()
        .into_iter()
        .filter(|l| l.starts_with("PATCH ") && l.contains("/deployments/a/scale"))
        .collect();
    assert!(patches.len() >= 4, "{patches:?}");
    let retried = metrics
        .scale_patches
        .get_or_create(&thaw::telemetry::platform::ScaleLabels {
            namespace: NS.into(),
            revision: "a-00001".into(),
            outcome: thaw::telemetry::platform::ScaleOutcome::Retried,
        })
        .get();
    assert_eq!(retried, 3);
    p.shutdown();
}

#[tokio::test]
async fn a_slice_whose_pods_are_not_the_revisions_is_ignored_and_counted() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let metrics = PlatformMetrics::default();
    let p = KubePlatform::start(client.clone(), opts(), metrics.clone());
    timeout(DEADLINE, p.wait_synced()).await.unwrap();
    let rev = RevisionKey::new(NS, "fa-00001");
    p.upsert(KubeRevision {
        key: rev.clone(),
        protocol: Protocol::Http1,
        progress_deadline: None,
    });
    let mut rx = p.endpoints(&rev);
    // A namespace user's own Deployment whose pods (and ReplicaSet) copy the revision's label,
    // created first: the watches have seen its pod once they have seen the revision's.
    let mut mine = deployment("mine", "fa-00001");
    mine.metadata.labels = Some([("app".to_string(), "mine".to_string())].into());
    deps.create(&PostParams::default(), &mine).await.unwrap();
    let labels = serde_json::json!({"serving.knative.dev/revision": "fa-00001"});
    kube_support::owned_pod(&client, NS, "mine", &pod_of("10.0.3.9"), labels).await;
    own(&client, "fa-00001", &["10.0.3.1"]).await;
    slices
        .create(
            &PostParams::default(),
            &slice("fa-00001-private", "fa-00001", &["10.0.3.1"], &[]),
        )
        .await
        .unwrap();
    let own_only = addrs(&["10.0.3.1:8012"]);
    wait_snapshot(&mut rx, "the revision's pod", |s| s.ready == own_only).await;

    // The user's slice with the revision's labels: one endpoint of the user's pod, one naming
    // no pod at all.
    let mut foreign = slice("mine-private", "fa-00001", &["10.0.3.9"], &[]);
    foreign
        .endpoints
        .push(serde_json::from_value(serde_json::json!({"addresses": ["10.0.3.8"]})).unwrap());
    slices
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let counted = || {
        metrics
            .foreign_endpoints
            .get_or_create(&thaw::telemetry::platform::RevisionLabels {
                namespace: NS.into(),
                revision: "fa-00001".into(),
            })
            .get()
    };
    let end = tokio::time::Instant::now() + DEADLINE;
    while counted() < 2 {
        assert!(
            tokio::time::Instant::now() < end,
            "foreign endpoints never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counted(), 2);
    // Left out of the activator's endpoints and the autoscaler's stats targets alike.
    assert_eq!(rx.borrow().ready, own_only);
    assert_eq!(
        p.stats_targets(&rev),
        [(pod_of("10.0.3.1"), "10.0.3.1:9091".parse().unwrap())]
    );
    p.shutdown();
}

/// Not a check but a measurement (docs/benchmarks.md): from sending an EndpointSlice update
/// to the API server to the platform's subscriber holding the new snapshot, over real HTTP
/// and the server's watch. Run: `cargo test --release --test kube_platform -- --ignored
/// --nocapture measure_slice_update_to_subscriber`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn measure_slice_update_to_subscriber() {
    let api = kube_support::TestApi::start().await;
    let slices: Api<EndpointSlice> = Api::namespaced(api.client(), NS);
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "m-00001");
    let mut rx = p.endpoints(&rev);
    own(&api.client(), "m-00001", &["10.9.0.0"]).await;
    let mut s = slices
        .create(
            &PostParams::default(),
            &slice("m-00001-private", "m-00001", &["10.9.0.0"], &[]),
        )
        .await
        .unwrap();
    wait_snapshot(&mut rx, "first", |s| !s.ready.is_empty()).await;
    let mut took = Vec::new();
    for i in 1..=300u32 {
        let ip = format!("10.9.{}.{}", i / 250, i % 250);
        own(&api.client(), "m-00001", &[&ip]).await;
        s.endpoints = slice("x", "m-00001", &[&ip], &[]).endpoints;
        let want: SocketAddr = format!("{ip}:8012").parse().unwrap();
        let start = tokio::time::Instant::now();
        let pp = PostParams::default();
        let write = slices.replace("m-00001-private", &pp, &s);
        let seen = wait_snapshot(&mut rx, "update", |s| s.ready == [want]);
        let (written, _) = tokio::join!(write, seen);
        took.push(start.elapsed());
        s = written.unwrap();
    }
    took.sort();
    let q = |f: f64| took[((took.len() as f64 - 1.0) * f) as usize];
    println!(
        "slice update sent -> subscriber notified, {} updates: median {:?}, p90 {:?}, p99 {:?}",
        took.len(),
        q(0.5),
        q(0.9),
        q(0.99)
    );
    p.shutdown();
}

/// `/scale` is written only while the leadership term lasts: a count asked for after the term
/// ended is never written (not even once the next term begins: that term's scaler decides
/// again), and the next term's counts are. The Deployment's every value is followed through a
/// watch, so a write that should not have happened would show before the next one.
#[tokio::test]
async fn scale_writes_stop_when_the_term_ends() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api = kube_support::TestApi::start().await;
    let deps: Api<Deployment> = Api::namespaced(api.client(), NS);
    deps.create(&PostParams::default(), &deployment("d", "hello-00001"))
        .await
        .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<i32>::new()));
    let s = seen.clone();
    let w = deps.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(w, watcher::Config::default()));
        while let Some(Ok(ev)) = stream.next().await {
            if let watcher::Event::Apply(d) | watcher::Event::InitApply(d) = ev {
                let r = d.spec.and_then(|s| s.replicas).unwrap_or(-1);
                let mut v = s.lock().unwrap();
                if v.last() != Some(&r) {
                    v.push(r);
                }
            }
        }
    });
    let p = platform(api.client(), opts()).await;
    let rev = RevisionKey::new(NS, "hello-00001");
    let term = tokio_util::sync::CancellationToken::new();
    p.fence(term.clone());
    p.scale(&rev, 3).await.unwrap();
    wait_replicas(&deps, "d", 3).await;
    assert_eq!(p.writes(), 1);

    term.cancel();
    p.scale(&rev, 5).await.unwrap();
    let next = tokio_util::sync::CancellationToken::new();
    p.fence(next.clone());
    p.scale(&rev, 4).await.unwrap();
    wait_replicas(&deps, "d", 4).await;
    let end = tokio::time::Instant::now() + DEADLINE;
    while seen.lock().unwrap().last() != Some(&4) {
        assert!(tokio::time::Instant::now() < end, "the watch never saw 4");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [0, 3, 4],
        "5 was asked for between the terms and never written"
    );
    assert_eq!(p.writes(), 2);

    // Another leader (here: the test) sets 7 while this replica does not lead; when it leads
    // again and asks for 4, it writes 4: what it applied in an earlier term is not assumed.
    next.cancel();
    deps.patch_scale(
        "d",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 7}})),
    )
    .await
    .unwrap();
    // (Once the platform's own watch shows it: a new term trusts that view.)
    let end = tokio::time::Instant::now() + DEADLINE;
    while p.found(&rev).replicas != Some(7) {
        assert!(
            tokio::time::Instant::now() < end,
            "the platform never saw 7"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.fence(tokio_util::sync::CancellationToken::new());
    p.scale(&rev, 4).await.unwrap();
    wait_replicas(&deps, "d", 4).await;
    p.shutdown();
}
