//! `thaw controller` as real processes against the in-process API server (through the relay,
//! with a kubeconfig): two replicas, one Lease; only the leader reconciles; when it is killed
//! the other takes over within the lease duration plus two retry periods and reconciles what
//! came in meanwhile; a `config-defaults` edit reaches new revisions; the admin port's
//! `/metrics` passes promtool. Waits poll with deadlines; nothing asserts a duration.

mod kube_e2e_support;
mod kube_support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube_e2e_support::*;
use thaw::knative::{Configuration, Revision, Service};
use tokio::time::Instant;

const NS: &str = "default";
const LEASE: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(500);

fn controller(c: &Cluster, name: &str, admin: u16) -> Proc {
    c.spawn(
        name,
        &[
            "controller".into(),
            "--system-namespace".into(),
            SYSTEM.into(),
            "--namespace".into(),
            NS.into(),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin}"),
            "--name".into(),
            name.into(),
            "--workers".into(),
            "2".into(),
            "--lease-duration".into(),
            "3s".into(),
            "--renew-deadline".into(),
            "2s".into(),
            "--retry-period".into(),
            "500ms".into(),
        ],
    )
}

fn service(name: &str) -> Service {
    obj(serde_json::json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {"containers": [{
            "image": "ghcr.io/knative/helloworld-go:latest",
            "ports": [{"containerPort": 8080}]
        }]}}}
    }))
}

async fn holder(c: &Cluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), SYSTEM);
    leases
        .get_opt("thaw-controller")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

async fn revision(c: &Cluster, name: &str) -> Option<Revision> {
    let revs: Api<Revision> = Api::namespaced(c.client.clone(), NS);
    revs.get_opt(name).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_reconciles_and_a_killed_leader_is_replaced() {
    let c = Cluster::start(serde_json::json!({})).await;
    c.config_map(
        "config-defaults",
        serde_json::json!({"container-concurrency": "3"}),
    )
    .await;
    let (pa, pb) = (free_port(), free_port());
    let mut a = controller(&c, "ctl-a", pa);
    let mut b = controller(&c, "ctl-b", pb);
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), NS);
    svcs.create(&PostParams::default(), &service("first"))
        .await
        .unwrap();
    let rev = until(Duration::from_secs(30), "first-00001", || {
        revision(&c, "first-00001")
    })
    .await;
    // config-defaults reached the new revision's spec.
    assert_eq!(rev.spec.container_concurrency, Some(3));
    let leader = until(Duration::from_secs(10), "a leader", || holder(&c)).await;
    let (leader_port, other_port) = if leader == "ctl-a" {
        (pa, pb)
    } else {
        (pb, pa)
    };
    let leader_json = get_text(
        format!("127.0.0.1:{leader_port}").parse().unwrap(),
        "/leader",
    )
    .await;
    assert!(leader_json.contains("\"leading\":true"), "{leader_json}");
    let other_json = get_text(
        format!("127.0.0.1:{other_port}").parse().unwrap(),
        "/leader",
    )
    .await;
    assert!(other_json.contains("\"leading\":false"), "{other_json}");

    // The leader's metrics: its reconciles are counted, and promtool accepts the exposition.
    let metrics = get_text(
        format!("127.0.0.1:{leader_port}").parse().unwrap(),
        "/metrics",
    )
    .await;
    assert!(
        metric(
            &metrics,
            "thaw_controller_reconcile_total",
            &["kind=\"Service\"", "result=\"ok\""]
        ) >= 1.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "thaw_controller_leader ", &[]), 1.0);
    let (code, out) = promtool(&metrics);
    assert_eq!(code, 0, "promtool: {out}");

    // An edit of config-defaults changes new revisions only.
    c.config_map(
        "config-defaults",
        serde_json::json!({"container-concurrency": "5"}),
    )
    .await;
    // The reload is asynchronous: wait until a new Service's revision shows it.
    let mut n = 0;
    loop {
        n += 1;
        let name = format!("probe{n}");
        svcs.create(&PostParams::default(), &service(&name))
            .await
            .unwrap();
        let rev_name = format!("{name}-00001");
        let r = until(Duration::from_secs(30), "probe revision", || {
            revision(&c, &rev_name)
        })
        .await;
        if r.spec.container_concurrency == Some(5) {
            break;
        }
        assert!(n < 50, "config-defaults edit never reached new revisions");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = revision(&c, "first-00001").await.unwrap();
    assert_eq!(
        first.spec.container_concurrency,
        Some(3),
        "old revisions keep their spec"
    );

    // The standby holds every watch already (warm), and reconciles nothing.
    let standby_addr = format!("127.0.0.1:{other_port}").parse().unwrap();
    let standby = get_text(standby_addr, "/metrics").await;
    let lists = |text: &str| metric(text, "thaw_controller_watch_lists_total", &[]);
    let listed = lists(&standby);
    assert!(
        metric(
            &standby,
            "thaw_controller_watch_lists_total",
            &["kind=\"Revision\""]
        ) >= 1.0
            && metric(
                &standby,
                "thaw_controller_watch_lists_total",
                &["kind=\"Deployment\""]
            ) >= 1.0,
        "the standby's watches have not listed:\n{standby}"
    );
    assert_eq!(
        metric(&standby, "thaw_controller_reconcile_total", &[]),
        0.0
    );
    assert_eq!(
        metric(&standby, "thaw_controller_leader_changes_total", &[]),
        0.0
    );
    let services_before = svcs.list(&Default::default()).await.unwrap().items.len() as f64;

    // Kill the leader without a chance to release its Lease.
    let killed = Instant::now();
    if leader == "ctl-a" {
        a.kill();
    } else {
        b.kill();
    }
    svcs.create(&PostParams::default(), &service("second"))
        .await
        .unwrap();
    let new_leader = until(Duration::from_secs(30), "a new leader", || async {
        holder(&c).await.filter(|h| *h != leader)
    })
    .await;
    let took = killed.elapsed();
    assert!(
        took <= LEASE + 2 * RETRY + Duration::from_secs(2),
        "takeover took {took:?} (lease {LEASE:?}, retry {RETRY:?})"
    );
    until(
        Duration::from_secs(30),
        "second-00001 by the new leader",
        || revision(&c, "second-00001"),
    )
    .await;
    let cfgs: Api<Configuration> = Api::namespaced(c.client.clone(), NS);
    assert!(cfgs.get_opt("second").await.unwrap().is_some());
    let survivor = if new_leader == "ctl-a" { &a } else { &b };
    assert!(survivor.logs().contains("leading"), "{}", survivor.logs());
    // The new leader started from its warm stores: no watch listed again, every Service
    // reconciled (the ones from before the change and the one created during it), one term.
    let promoted = until(
        Duration::from_secs(30),
        "every Service reconciled by the new leader",
        || async {
            let text = get_text(standby_addr, "/metrics").await;
            (metric(
                &text,
                "thaw_controller_reconcile_total",
                &["kind=\"Service\""],
            ) > services_before)
                .then_some(text)
        },
    )
    .await;
    assert_eq!(
        lists(&promoted),
        listed,
        "a watch listed again on the leadership change:\n{promoted}"
    );
    assert_eq!(
        metric(&promoted, "thaw_controller_leader_changes_total", &[]),
        1.0
    );
}

/// One image setting: with no `queue-sidecar-image` in config-deployment, a revision's queue
/// sidecar runs the controller's own image, read from its Pod (here a Pod object written as
/// the kubelet would have it, named as the replica); a `queue-sidecar-image` set wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_sidecar_runs_the_controllers_own_image() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let c = Cluster::start(serde_json::json!({})).await;
    let image = "registry.example/team/thaw:v1.2.3";
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), SYSTEM);
    pods.create(
        &PostParams::default(),
        &obj(serde_json::json!({
            "metadata": {"name": "ctl-img"},
            "spec": {"containers": [
                {"name": "controller", "image": image, "args": ["controller"]}
            ]}
        })),
    )
    .await
    .unwrap();
    let _ctl = controller(&c, "ctl-img", free_port());
    let svcs: Api<Service> = Api::namespaced(c.client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), NS);
    let sidecar_of = |svc: &'static str| {
        let deps = deps.clone();
        async move {
            let name = thaw::knative::names::child_name(&format!("{svc}-00001"), "-deployment");
            let d = deps.get_opt(&name).await.ok().flatten()?;
            d.spec?
                .template
                .spec?
                .containers
                .into_iter()
                .find(|c| c.name == "queue-proxy")?
                .image
        }
    };
    svcs.create(&PostParams::default(), &service("own"))
        .await
        .unwrap();
    let got = until(Duration::from_secs(30), "own's Deployment", || {
        sidecar_of("own")
    })
    .await;
    assert_eq!(got, image);

    c.config_map(
        "config-deployment",
        serde_json::json!({"queue-sidecar-image": "registry.example/sidecar:v9"}),
    )
    .await;
    // The reload is asynchronous: a new Service's revision shows it once it is in force.
    let mut n = 0;
    loop {
        n += 1;
        let name: &'static str = Box::leak(format!("set{n}").into_boxed_str());
        svcs.create(&PostParams::default(), &service(name))
            .await
            .unwrap();
        let got = until(Duration::from_secs(30), "the Deployment", || {
            sidecar_of(name)
        })
        .await;
        if got == "registry.example/sidecar:v9" {
            break;
        }
        assert_eq!(got, image);
        assert!(n < 50, "config-deployment's image never applied");
    }
}
