//! The Kubernetes platform against the in-process API server over real HTTP: the test plays
//! the controller (each revision's Deployment and private Service, controlled by its Revision's
//! UID, which it tells the platform as the Revision watch would), the kubelet (pods' phase and
//! `podIPs`) and the endpoints controller (the private EndpointSlices), and a namespace user
//! writing impostors. Every wait polls for a condition with a deadline or awaits the platform's
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
use thaw::telemetry::platform::{IgnoredLabels, PlatformMetrics, WatchLabels};
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

/// The UID this test gives Revision `revision`.
fn uid(revision: &str) -> String {
    format!("uid-{revision}")
}

/// Plays the controller for `revision`: its own Deployment `{revision}-deployment` and private
/// Service `{revision}-private`, controlled by its Revision's UID, which the platform is told
/// (as the Revision watch tells it).
async fn revision(p: &KubePlatform, client: &kube::Client, revision: &str) {
    kube_support::revision_children(client, NS, revision, &uid(revision)).await;
    p.observe_uid(&RevisionKey::new(NS, revision), Some(&uid(revision)));
}

/// The name of `revision`'s own Deployment.
fn deployment_of(revision: &str) -> String {
    format!("{revision}-deployment")
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

/// Plays the Deployment controller and the kubelet for the pods at `addrs` ([`pod_of`]): each
/// is owned, through a ReplicaSet, by Deployment `deployment`, and runs at its address, as
/// endpoints bound to pods require.
async fn pods_of(client: &kube::Client, deployment: &str, revision: &str, addrs: &[&str]) {
    for a in addrs {
        let labels = serde_json::json!({"serving.knative.dev/revision": revision});
        kube_support::running_pod(client, NS, deployment, &pod_of(a), a, labels).await;
    }
}

/// [`pods_of`] `revision`'s own Deployment (made by [`revision`]).
async fn own(client: &kube::Client, revision: &str, addrs: &[&str]) {
    pods_of(client, &deployment_of(revision), revision, addrs).await;
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
async fn scale_patches_the_revisions_own_deployment() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let p = platform(client.clone(), opts()).await;
    revision(&p, &client, "hello-00001").await;
    revision(&p, &client, "other-00001").await;
    let rev = RevisionKey::new(NS, "hello-00001");
    let mine = deployment_of("hello-00001");
    p.scale(&rev, 3).await.unwrap();
    wait_replicas(&deps, &mine, 3).await;
    // The latest value wins; other revisions' Deployments are untouched.
    p.scale(&rev, 5).await.unwrap();
    p.scale(&rev, 2).await.unwrap();
    wait_replicas(&deps, &mine, 2).await;
    assert_eq!(
        replicas(&deps, &deployment_of("other-00001")).await,
        Some(0)
    );
    p.scale(&rev, 0).await.unwrap();
    wait_replicas(&deps, &mine, 0).await;
    // At zero the revision's scaler task ends; the next scale starts another.
    p.scale(&rev, 1).await.unwrap();
    wait_replicas(&deps, &mine, 1).await;
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
    revision(&p, &api.client(), "hello-00001").await;
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
    revision(&p, &api.client(), "late-00001").await;
    wait_replicas(&deps, &deployment_of("late-00001"), 1).await;
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
    let p = platform(
        api.client(),
        KubeOptions {
            activation_buffer: Duration::ZERO,
            ..opts()
        },
    )
    .await;
    revision(&p, &api.client(), "slow-00001").await;
    let rev = RevisionKey::new(NS, "slow-00001");
    p.upsert(KubeRevision {
        key: rev.clone(),
        protocol: Protocol::Http1,
        progress_deadline: Some(Duration::from_millis(300)),
    });
    let mut rx = p.endpoints(&rev);
    p.scale(&rev, 1).await.unwrap();
    wait_replicas(&deps, &deployment_of("slow-00001"), 1).await;
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
    revision(&p, &api.client(), "cut-00001").await;
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
    let (a, b) = (deployment_of("a-00001"), deployment_of("b-00001"));
    for rev in ["a-00001", "b-00001"] {
        revision(&p, &api.client(), rev).await;
    }
    // The platform has seen both Deployments before the first scale (else a's first
    // attempts would be "missing", not the faults below).
    let end = tokio::time::Instant::now() + DEADLINE;
    for rev in ["a-00001", "b-00001"] {
        while p.found(&RevisionKey::new(NS, rev)).replicas != Some(0) {
            assert!(
                tokio::time::Instant::now() < end,
                "{rev}'s Deployment never seen"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // (429, 503 and 504 are first retried inside kube's client; these reach the platform.)
    relay.fail_next(&format!("/deployments/{a}/scale"), &[409, 500, 502]);
    p.scale(&RevisionKey::new(NS, "a-00001"), 2).await.unwrap();
    p.scale(&RevisionKey::new(NS, "b-00001"), 4).await.unwrap();
    // b goes through while a is still in its retries.
    wait_replicas(&deps, &b, 4).await;
    assert!(
        relay.faults_left() > 0 || replicas(&deps, &a).await != Some(2),
        "a finished before b: the test shows nothing"
    );
    // a's latest value is applied after its three failures.
    p.scale(&RevisionKey::new(NS, "a-00001"), 3).await.unwrap();
    wait_replicas(&deps, &a, 3).await;
    assert_eq!(relay.faults_left(), 0);
    let patches: Vec<String> = relay
        .requests()
        .into_iter()
        .filter(|l| l.starts_with("PATCH ") && l.contains(&format!("/deployments/{a}/scale")))
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

fn ignored(m: &PlatformMetrics, kind: &str, reason: &str) -> u64 {
    m.ignored
        .get_or_create(&IgnoredLabels {
            kind: kind.into(),
            reason: reason.into(),
        })
        .get()
}

/// Polls until `count()` reaches `want` (a deadline), then checks it did not pass it.
async fn wait_count(what: &str, count: impl Fn() -> u64, want: u64) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while count() < want {
        assert!(
            tokio::time::Instant::now() < end,
            "{what}: {} of {want}",
            count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count(), want, "{what}");
}

/// A private slice `name` carrying `revision`'s labels, with `service-name` `service`, one
/// ready endpoint at `address` whose `targetRef` names pod `pod`, and `port` as its `http`.
fn slice_of(
    name: &str,
    revision: &str,
    service: &str,
    address: &str,
    pod: &str,
    port: u16,
) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {
            "serving.knative.dev/revision": revision,
            "networking.internal.knative.dev/serviceType": "Private",
            "kubernetes.io/service-name": service,
        }},
        "addressType": "IPv4",
        "ports": [
            {"name": "http", "port": port, "protocol": "TCP"},
            {"name": thaw::stats::POD_STATS_PORT_NAME, "port": 9091, "protocol": "TCP"}
        ],
        "endpoints": [{"addresses": [address], "conditions": {"ready": true},
            "targetRef": kube_support::pod_target(NS, pod)}],
    }))
    .unwrap()
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
    pods_of(&client, "mine", "fa-00001", &["10.0.3.9"]).await;
    revision(&p, &client, "fa-00001").await;
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
    wait_count("foreign endpoints", counted, 2).await;
    assert_eq!(ignored(&metrics, "endpoint", "pod_not_owned"), 1);
    assert_eq!(ignored(&metrics, "endpoint", "no_pod"), 1);
    // Left out of the activator's endpoints and the autoscaler's stats targets alike.
    assert_eq!(rx.borrow().ready, own_only);
    assert_eq!(
        pairs(p.stats_targets(&rev)),
        [(pod_of("10.0.3.1"), "10.0.3.1:9091".parse().unwrap())]
    );
    p.shutdown();
}

/// The attack: a tenant's EndpointSlice whose `targetRef` names one of the revision's pods but
/// whose address is elsewhere in the cluster (which would aim the activator's requests, its
/// early-ready probes and the autoscaler's stats pulls there), and one of another Service's
/// (the revision's pod at a port that skips its sidecar). Both left out and counted, once;
/// the control: the revision's own slice is served.
#[tokio::test]
async fn an_endpoint_naming_a_revision_pod_at_another_address_is_ignored_and_counted() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let metrics = PlatformMetrics::default();
    let p = KubePlatform::start(client.clone(), opts(), metrics.clone());
    timeout(DEADLINE, p.wait_synced()).await.unwrap();
    let rev = RevisionKey::new(NS, "addr-00001");
    let mut rx = p.endpoints(&rev);
    revision(&p, &client, "addr-00001").await;
    own(&client, "addr-00001", &["10.0.4.1", "10.0.4.2"]).await;
    let pod = pod_of("10.0.4.1");
    let private = "addr-00001-private";
    slices
        .create(
            &PostParams::default(),
            &slice_of(
                "addr-00001-private-a",
                "addr-00001",
                private,
                "10.0.4.1",
                &pod,
                8012,
            ),
        )
        .await
        .unwrap();
    let own_only = addrs(&["10.0.4.1:8012"]);
    wait_snapshot(&mut rx, "the control", |s| s.ready == own_only).await;

    // The revision's pod named, the address the cluster's DNS Service's.
    let tenant = slice_of("tenant", "addr-00001", private, "10.96.0.10", &pod, 8012);
    slices
        .create(&PostParams::default(), &tenant)
        .await
        .unwrap();
    let elsewhere = || ignored(&metrics, "endpoint", "address_not_the_pods");
    wait_count("an address that is not the pod's", elsewhere, 1).await;
    // The revision's pod, at its own address, but in another Service's slice (its port the
    // user container's, past the sidecar).
    let other = slice_of(
        "tenant-svc",
        "addr-00001",
        "tenant-svc",
        "10.0.4.1",
        &pod,
        8080,
    );
    slices.create(&PostParams::default(), &other).await.unwrap();
    let not_private = || ignored(&metrics, "endpointslice", "not_the_private_service");
    wait_count("another Service's slice", not_private, 1).await;
    assert_eq!(rx.borrow().ready, own_only);
    assert!(rx.borrow().starting.is_empty() && rx.borrow().terminating.is_empty());
    assert_eq!(
        pairs(p.stats_targets(&rev)),
        [(pod, "10.0.4.1:9091".parse().unwrap())]
    );

    // Written again, each is still counted once; the revision's own slice changes meanwhile
    // (seen after them: the watch is one ordered stream).
    for s in [tenant, other] {
        let name = s.metadata.name.clone().unwrap();
        let mut again = slices.get(&name).await.unwrap();
        again
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("touched".into(), "1".into());
        slices
            .replace(&name, &PostParams::default(), &again)
            .await
            .unwrap();
    }
    let mut mine = slices.get("addr-00001-private-a").await.unwrap();
    mine.endpoints.extend(
        slice_of(
            "x",
            "addr-00001",
            private,
            "10.0.4.2",
            &pod_of("10.0.4.2"),
            8012,
        )
        .endpoints,
    );
    slices
        .replace("addr-00001-private-a", &PostParams::default(), &mine)
        .await
        .unwrap();
    let both = addrs(&["10.0.4.1:8012", "10.0.4.2:8012"]);
    wait_snapshot(&mut rx, "the revision's second pod", |s| s.ready == both).await;
    assert_eq!(elsewhere(), 1);
    assert_eq!(not_private(), 1);
    p.shutdown();
}

/// A labelled impostor Deployment and private Service beside the revision's own, and ones
/// named for the revision that a namespace user made before the controller: none is scaled,
/// none's pods or slices are the revision's, each counted by reason; the control: the
/// revision's own Deployment is scaled and its slices served. A Revision made again under
/// the same name (a new UID) does not inherit the old one's children.
#[tokio::test]
async fn labelled_impostors_are_ignored_counted_and_never_scaled() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let metrics = PlatformMetrics::default();
    let p = KubePlatform::start(client.clone(), opts(), metrics.clone());
    timeout(DEADLINE, p.wait_synced()).await.unwrap();
    let rev = RevisionKey::new(NS, "imp-00001");
    let mut rx = p.endpoints(&rev);
    revision(&p, &client, "imp-00001").await;
    own(&client, "imp-00001", &["10.0.5.1"]).await;
    // The impostors, made after the revision's own (a watch keyed by label would take them).
    deps.create(&PostParams::default(), &deployment("imp-mine", "imp-00001"))
        .await
        .unwrap();
    pods_of(&client, "imp-mine", "imp-00001", &["10.0.5.9"]).await;
    let impostor_service = |name: &str, revision: &str, owner: serde_json::Value| {
        serde_json::from_value::<k8s_openapi::api::core::v1::Service>(serde_json::json!({
            "metadata": {"name": name, "ownerReferences": owner, "labels": {
                "serving.knative.dev/revision": revision,
                "networking.internal.knative.dev/serviceType": "Private"}},
            "spec": {"selector": {"app": "mine"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        .unwrap()
    };
    svcs.create(
        &PostParams::default(),
        &impostor_service("imp-mine-private", "imp-00001", serde_json::json!([])),
    )
    .await
    .unwrap();
    let private = "imp-00001-private";
    for (name, address, pod) in [
        ("imp-00001-private-a", "10.0.5.1", pod_of("10.0.5.1")),
        ("imp-mine-slice", "10.0.5.9", pod_of("10.0.5.9")),
    ] {
        slices
            .create(
                &PostParams::default(),
                &slice_of(name, "imp-00001", private, address, &pod, 8012),
            )
            .await
            .unwrap();
    }
    let own_only = addrs(&["10.0.5.1:8012"]);
    wait_snapshot(&mut rx, "the revision's own pod", |s| s.ready == own_only).await;
    let count = |kind: &'static str, reason: &'static str| {
        let m = metrics.clone();
        move || ignored(&m, kind, reason)
    };
    wait_count(
        "impostor Deployment",
        count("deployment", "not_named_for_revision"),
        1,
    )
    .await;
    wait_count(
        "impostor Service",
        count("service", "not_named_for_revision"),
        1,
    )
    .await;
    wait_count("the impostor's pod", count("endpoint", "pod_not_owned"), 1).await;

    // Only the revision's own Deployment is scaled.
    p.scale(&rev, 2).await.unwrap();
    let own_deployment = deployment_of("imp-00001");
    wait_replicas(&deps, &own_deployment, 2).await;
    assert_eq!(replicas(&deps, "imp-mine").await, Some(0));
    // The impostor changed: not counted again (its event comes before the revision's
    // Deployment's next one, which the platform is then seen to hold).
    let mut touched = deps.get("imp-mine").await.unwrap();
    touched
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("touched".into(), "1".into());
    deps.replace("imp-mine", &PostParams::default(), &touched)
        .await
        .unwrap();
    p.scale(&rev, 3).await.unwrap();
    wait_replicas(&deps, &own_deployment, 3).await;
    let end = tokio::time::Instant::now() + DEADLINE;
    while p.found(&rev).replicas != Some(3) {
        assert!(
            tokio::time::Instant::now() < end,
            "the platform never saw 3"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count("deployment", "not_named_for_revision")(), 1);
    assert_eq!(replicas(&deps, "imp-mine").await, Some(0));

    // Named for a revision, made by a namespace user before the controller: not the
    // revision's (the controller reports them NotOwned); neither is scaled or read.
    let pre = RevisionKey::new(NS, "pre-00001");
    let mut pre_rx = p.endpoints(&pre);
    p.observe_uid(&pre, Some(&uid("pre-00001")));
    deps.create(
        &PostParams::default(),
        &deployment(&deployment_of("pre-00001"), "pre-00001"),
    )
    .await
    .unwrap();
    svcs.create(
        &PostParams::default(),
        &impostor_service(
            "pre-00001-private",
            "pre-00001",
            kube_support::revision_owner("pre-00001", "uid-of-another"),
        ),
    )
    .await
    .unwrap();
    pods_of(
        &client,
        &deployment_of("pre-00001"),
        "pre-00001",
        &["10.0.5.20"],
    )
    .await;
    slices
        .create(
            &PostParams::default(),
            &slice_of(
                "pre-00001-private-a",
                "pre-00001",
                "pre-00001-private",
                "10.0.5.20",
                &pod_of("10.0.5.20"),
                8080,
            ),
        )
        .await
        .unwrap();
    wait_count(
        "a Deployment named for the revision, not its",
        count("deployment", "not_controlled_by_revision"),
        1,
    )
    .await;
    wait_count(
        "a Service named for the revision, not its",
        count("service", "not_controlled_by_revision"),
        1,
    )
    .await;
    wait_count(
        "that Service's slice",
        count("endpointslice", "not_the_private_service"),
        1,
    )
    .await;
    p.scale(&pre, 1).await.unwrap();
    let snap = wait_snapshot(&mut pre_rx, "no Deployment of its own", |s| {
        s.status != EndpointStatus::Ok
    })
    .await;
    assert_eq!(
        snap.status,
        EndpointStatus::Failing {
            reason: "revision unavailable (DeploymentMissing)".into()
        }
    );
    assert!(snap.ready.is_empty() && snap.starting.is_empty());
    assert_eq!(replicas(&deps, &deployment_of("pre-00001")).await, Some(0));

    // imp-00001 made again under its name: a new UID, so the old Deployment and Service are
    // not its own any more (until the controller makes its new ones).
    p.observe_uid(&rev, Some("uid-imp-00001-again"));
    wait_snapshot(&mut rx, "the old children's pods left", |s| {
        s.ready.is_empty()
    })
    .await;
    assert!(p.found(&rev).replicas.is_none());
    assert_eq!(count("deployment", "not_controlled_by_revision")(), 2);
    assert_eq!(count("service", "not_controlled_by_revision")(), 2);
    p.shutdown();
}

/// The watches are separate streams: a slice can list a pod before the kubelet has reported
/// its IPs, or before it runs. Such an endpoint is left out (not counted as foreign) and
/// served as soon as the pod's `podIPs` and phase say so: pod events judge endpoints again.
#[tokio::test]
async fn a_slice_that_arrives_before_its_pods_ips_is_served_once_they_do() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let metrics = PlatformMetrics::default();
    let p = KubePlatform::start(client.clone(), opts(), metrics.clone());
    timeout(DEADLINE, p.wait_synced()).await.unwrap();
    let rev = RevisionKey::new(NS, "early-00001");
    let mut rx = p.endpoints(&rev);
    revision(&p, &client, "early-00001").await;
    let labels = serde_json::json!({"serving.knative.dev/revision": "early-00001"});
    let pod = pod_of("10.0.6.1");
    kube_support::owned_pod(&client, NS, &deployment_of("early-00001"), &pod, labels).await;
    // A marker revision whose pods show when the watches have got this far (each watch is one
    // ordered stream): m1 runs, m2 runs later.
    let mark = RevisionKey::new(NS, "mark-00001");
    let mut mark_rx = p.endpoints(&mark);
    revision(&p, &client, "mark-00001").await;
    own(&client, "mark-00001", &["10.0.6.11"]).await;
    let mark_labels = serde_json::json!({"serving.knative.dev/revision": "mark-00001"});
    let m2 = pod_of("10.0.6.12");
    kube_support::owned_pod(&client, NS, &deployment_of("mark-00001"), &m2, mark_labels).await;

    // The slice comes first: no IP reported yet.
    slices
        .create(
            &PostParams::default(),
            &slice("early-00001-private", "early-00001", &["10.0.6.1"], &[]),
        )
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice(
                "mark-00001-private",
                "mark-00001",
                &["10.0.6.11", "10.0.6.12"],
                &[],
            ),
        )
        .await
        .unwrap();
    let m1_only = addrs(&["10.0.6.11:8012"]);
    wait_snapshot(&mut mark_rx, "the marker's slice", |s| s.ready == m1_only).await;
    assert!(rx.borrow().ready.is_empty() && rx.borrow().starting.is_empty());
    // The kubelet reports the IP, the pod not running yet: still left out.
    kube_support::pod_status(&client, NS, &pod, "Pending", &["10.0.6.1"]).await;
    kube_support::pod_status(&client, NS, &m2, "Running", &["10.0.6.12"]).await;
    let both = addrs(&["10.0.6.11:8012", "10.0.6.12:8012"]);
    wait_snapshot(&mut mark_rx, "the marker's second pod", |s| s.ready == both).await;
    assert!(rx.borrow().ready.is_empty() && rx.borrow().starting.is_empty());
    // Running: served, with no new slice event.
    kube_support::pod_status(&client, NS, &pod, "Running", &["10.0.6.1"]).await;
    wait_snapshot(&mut rx, "served once its pod runs at its IP", |s| {
        s.ready == addrs(&["10.0.6.1:8012"])
    })
    .await;
    // Pending is not foreign: nothing was counted.
    assert_eq!(
        metrics
            .foreign_endpoints
            .get_or_create(&thaw::telemetry::platform::RevisionLabels {
                namespace: NS.into(),
                revision: "early-00001".into(),
            })
            .get(),
        0
    );
    let events = metrics
        .watch_events
        .get_or_create(&WatchLabels {
            resource: "pods".into(),
        })
        .get();
    assert!(events > 0);
    p.shutdown();
}

/// A pod being deleted (its `deletionTimestamp` set, a finalizer holding it) keeps its
/// endpoint as the revision's, terminating and never ready, even while the slice still says
/// ready: requests in flight drain, no new one is sent there. Gone, it leaves.
/// A cluster moved from Knative: one pod of the revision still runs Knative's queue-proxy (its
/// container declares Knative's ports), the other thaw's sidecar. The autoscaler pulls the
/// first at queue-proxy's own metrics port (9090, whatever the slices name) as Knative's
/// protobuf Stat, the second at the slices' port as thaw's; the endpoint snapshot says the
/// revision has queue-proxy pods.
#[tokio::test]
async fn a_pod_with_knatives_queue_proxy_is_pulled_at_its_metrics_port() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let p = platform(client.clone(), opts()).await;
    let rev = RevisionKey::new(NS, "moved-00001");
    revision(&p, &client, "moved-00001").await;
    let owners = kube_support::pod_owner_refs(&client, NS, &deployment_of("moved-00001")).await;
    let sidecar = |ports: serde_json::Value| {
        serde_json::json!({"containers": [
            {"name": "user-container", "image": "img"},
            {"name": "queue-proxy", "image": "sidecar", "ports": ports}
        ]})
    };
    let specs = [
        (
            "10.0.8.1",
            sidecar(serde_json::json!([
                {"name": "queue-port", "containerPort": 8012},
                {"name": "http-queueadm", "containerPort": 8022},
                {"name": "http-autometric", "containerPort": 9090},
                {"name": "http-usermetric", "containerPort": 9091}
            ])),
        ),
        (
            "10.0.8.2",
            sidecar(serde_json::json!([
                {"name": "http1", "containerPort": 8012},
                {"name": "http-autometric", "containerPort": 9091}
            ])),
        ),
    ];
    for (ip, spec) in specs {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": pod_of(ip), "ownerReferences": owners,
                "labels": {"serving.knative.dev/revision": "moved-00001"}},
            "spec": spec,
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        kube_support::pod_status(&client, NS, &pod_of(ip), "Running", &[ip]).await;
    }
    slices
        .create(
            &PostParams::default(),
            &slice(
                "moved-00001-private",
                "moved-00001",
                &["10.0.8.1", "10.0.8.2"],
                &[],
            ),
        )
        .await
        .unwrap();
    let want = [
        thaw::stats::StatsTarget {
            pod: pod_of("10.0.8.1"),
            addr: "10.0.8.1:9090".parse().unwrap(),
            wire: thaw::stats::PodStatsWire::QueueProxy,
        },
        thaw::stats::StatsTarget {
            pod: pod_of("10.0.8.2"),
            addr: "10.0.8.2:9091".parse().unwrap(),
            wire: thaw::stats::PodStatsWire::Thaw,
        },
    ];
    let limit = tokio::time::Instant::now() + DEADLINE;
    while p.stats_targets(&rev) != want {
        assert!(
            tokio::time::Instant::now() < limit,
            "stats targets: {:?}",
            p.stats_targets(&rev)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The activator is told too: it marks what it forwards `K-Proxy-Request: activator`.
    let mut rx = p.endpoints(&rev);
    wait_snapshot(&mut rx, "queue-proxy in the snapshot", |s| {
        s.queue_proxy && s.ready == addrs(&["10.0.8.1:8012", "10.0.8.2:8012"])
    })
    .await;
    p.shutdown();
}

#[tokio::test]
async fn a_pod_being_deleted_keeps_its_endpoint_as_terminating_never_ready() {
    let api = kube_support::TestApi::start().await;
    let client = api.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let p = platform(client.clone(), opts()).await;
    let rev = RevisionKey::new(NS, "drain-00001");
    let mut rx = p.endpoints(&rev);
    revision(&p, &client, "drain-00001").await;
    own(&client, "drain-00001", &["10.0.7.2"]).await;
    let name = pod_of("10.0.7.1");
    let owners = kube_support::pod_owner_refs(&client, NS, &deployment_of("drain-00001")).await;
    let held: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "ownerReferences": owners,
            "labels": {"serving.knative.dev/revision": "drain-00001"},
            "finalizers": ["test.thaw.dev/hold"]},
        "spec": {"containers": [{"name": "user-container", "image": "img"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &held).await.unwrap();
    kube_support::pod_status(&client, NS, &name, "Running", &["10.0.7.1"]).await;
    slices
        .create(
            &PostParams::default(),
            &slice(
                "drain-00001-private",
                "drain-00001",
                &["10.0.7.1", "10.0.7.2"],
                &[],
            ),
        )
        .await
        .unwrap();
    let both = addrs(&["10.0.7.1:8012", "10.0.7.2:8012"]);
    wait_snapshot(&mut rx, "both ready", |s| s.ready == both).await;

    pods.delete(&name, &Default::default()).await.unwrap();
    let snap = wait_snapshot(&mut rx, "terminating", |s| !s.terminating.is_empty()).await;
    assert_eq!(snap.terminating, addrs(&["10.0.7.1:8012"]));
    assert_eq!(snap.ready, addrs(&["10.0.7.2:8012"]));
    assert_eq!(snap.status, EndpointStatus::Ok);
    // The slice still lists it ready; the stats targets leave it out too.
    let listed = slices.get("drain-00001-private").await.unwrap();
    assert!(
        listed
            .endpoints
            .iter()
            .all(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
    );
    assert_eq!(
        pairs(p.stats_targets(&rev)),
        [(pod_of("10.0.7.2"), "10.0.7.2:9091".parse().unwrap())]
    );

    // The finalizer removed: the pod is gone, and so is its endpoint. (The server answers
    // the patch that ends the pod with a Status, not a Pod.)
    let _ = pods
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let snap = wait_snapshot(&mut rx, "gone", |s| s.terminating.is_empty()).await;
    assert_eq!(snap.ready, addrs(&["10.0.7.2:8012"]));
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
    revision(&p, &api.client(), "m-00001").await;
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
    kube_support::revision_children(&api.client(), NS, "hello-00001", &uid("hello-00001")).await;
    let d = deployment_of("hello-00001");
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
    p.observe_uid(&rev, Some(&uid("hello-00001")));
    let term = tokio_util::sync::CancellationToken::new();
    p.fence(term.clone());
    p.scale(&rev, 3).await.unwrap();
    wait_replicas(&deps, &d, 3).await;
    assert_eq!(p.writes(), 1);

    term.cancel();
    p.scale(&rev, 5).await.unwrap();
    let next = tokio_util::sync::CancellationToken::new();
    p.fence(next.clone());
    p.scale(&rev, 4).await.unwrap();
    wait_replicas(&deps, &d, 4).await;
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
        &d,
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
    wait_replicas(&deps, &d, 4).await;
    p.shutdown();
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
