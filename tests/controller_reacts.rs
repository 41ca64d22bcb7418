//! Every change that calls for a reconcile gets one, from the change itself: `thaw controller`'s
//! reconcilers in-process against the in-process API server, with the resync 10 h away (the
//! role's default) and no requeue pending, so nothing but the change's watch event can start
//! the reconcile. Sixty changes: 20 template changes of a Service, 20 DomainMappings created,
//! 20 times a revision scaled to zero. Each is shown reconciled by the object's
//! `observedGeneration` (a scale changes no generation: there the histogram's count shows it)
//! and by `thaw_controller_event_to_reconcile_seconds{kind}`'s count growing. The deadline
//! (30 s, [`controller_support::DEADLINE`]) only catches a missed trigger; the histogram's
//! buckets are printed (docs/benchmarks.md has the figure), never asserted.

mod controller_support;
mod kube_support;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use thaw::controller::{Ctx, CtxOptions, Settings};
use thaw::knative::{DomainMapping, DomainMappingSpec, KReference, Revision, Service};
use thaw::telemetry::controller::ControllerMetrics;

use crate::kube_support::TestApi;
use controller_support::{mark_deployment_ready, wait_for};

const NS: &str = "default";
const CHANGES: usize = 20;

struct Running {
    api: TestApi,
    registry: Registry,
    task: tokio::task::JoinHandle<()>,
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
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.api.client(), NS)
    }

    fn text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    /// `thaw_controller_reconcile_total{kind,result}`.
    fn reconciles(&self, kind: &str, result: &str) -> u64 {
        let needle =
            format!("thaw_controller_reconcile_total{{kind=\"{kind}\",result=\"{result}\"}} ");
        self.text()
            .lines()
            .find_map(|l| l.strip_prefix(&needle)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// `thaw_controller_event_to_reconcile_seconds_count{kind}`.
    fn triggered(&self, kind: &str) -> u64 {
        let needle =
            format!("thaw_controller_event_to_reconcile_seconds_count{{kind=\"{kind}\"}} ");
        self.text()
            .lines()
            .find_map(|l| l.strip_prefix(&needle)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The smallest bucket bound holding every observation of `kind` (the histogram's
    /// maximum, to its resolution).
    fn max_bucket(&self, kind: &str) -> String {
        let count = self.triggered(kind);
        let prefix = "thaw_controller_event_to_reconcile_seconds_bucket{";
        self.text()
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(&format!("kind=\"{kind}\"")))
            .find_map(|l| {
                let n: u64 = l.rsplit(' ').next()?.parse().ok()?;
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                (n == count).then(|| le.to_string())
            })
            .unwrap_or_default()
    }
}

async fn start() -> Running {
    let api = TestApi::start().await;
    let client = api.client();
    start_with(api, client).await
}

/// The controllers over `api`, talking to it through `relay`.
async fn start_via_api(api: TestApi, relay: &kube_support::relay::Relay) -> Running {
    start_with(api, kube_support::client_at(relay.addr())).await
}

/// The controllers over `api`, their requests made with `client`.
async fn start_with(api: TestApi, client: kube::Client) -> Running {
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(registry.sub_registry_with_prefix("thaw"));
    let ctx: Arc<Ctx> = Ctx::with_options(
        client,
        Settings::default(),
        CtxOptions {
            namespace: Some(NS.into()),
            metrics: Some(metrics),
            ..CtxOptions::default()
        },
    );
    assert_eq!(ctx.resync(), thaw::controller::DEFAULT_RESYNC);
    let task = tokio::spawn(thaw::roles::controller::run_controllers(ctx));
    let _gateway = kube_support::gateway::default_gateways(&api.client()).await;
    Running {
        api,
        registry,
        task,
        _gateway,
    }
}

fn domain_mapping(name: &str) -> DomainMapping {
    DomainMapping::new(
        name,
        DomainMappingSpec {
            ref_: KReference {
                api_version: "serving.knative.dev/v1".into(),
                kind: "Route".into(),
                name: "hello".into(),
                namespace: None,
            },
            tls: None,
        },
    )
}

fn service(name: &str, target: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {"containers": [{
            "image": "ghcr.io/knative/helloworld-go:latest",
            "env": [{"name": "TARGET", "value": target}]
        }]}}}
    }))
    .unwrap()
}

/// Waits until `kind`'s count has grown past `before`: a reconcile that a watch event called
/// for has started.
async fn triggered_past(run: &Running, kind: &str, before: u64, what: &str) -> u64 {
    wait_for(what, || async { run.triggered(kind) }, |n| *n > before).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_changes_each_start_their_reconcile() {
    let run = start().await;
    let services = run.api::<Service>();
    services
        .create(&PostParams::default(), &service("hello", "v0"))
        .await
        .unwrap();
    let deployments = run.api::<Deployment>();
    mark_deployment_ready(&deployments, "hello-00001").await;
    wait_for(
        "hello Ready",
        || async { services.get_status("hello").await.ok() },
        |s| {
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some_and(|s| s.status.is_true(thaw::knative::condition::READY))
        },
    )
    .await;

    // 1. Template changes: each a new generation of the Service, which its reconcile observes.
    for i in 1..=CHANGES {
        let before = run.triggered("Service");
        let patch = serde_json::json!({"spec": {"template": {"spec": {"containers": [{
            "image": "ghcr.io/knative/helloworld-go:latest",
            "env": [{"name": "TARGET", "value": format!("v{i}")}]
        }]}}}});
        let changed = services
            .patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let generation = changed.metadata.generation;
        wait_for(
            "the Service's new generation observed",
            || async { services.get_status("hello").await.ok() },
            |s| {
                s.as_ref()
                    .and_then(|s| s.status.as_ref())
                    .and_then(|s| s.status.observed_generation)
                    == generation
            },
        )
        .await;
        triggered_past(
            &run,
            "Service",
            before,
            "a Service reconcile from the change",
        )
        .await;
    }

    // 2. DomainMappings created: each reconciled once it exists (its first generation
    // observed), by its own watch event.
    let mappings = run.api::<DomainMapping>();
    for i in 1..=CHANGES {
        let before = run.triggered("DomainMapping");
        let name = format!("d{i}.example.org");
        mappings
            .create(&PostParams::default(), &domain_mapping(&name))
            .await
            .unwrap();
        wait_for(
            "the DomainMapping observed",
            || async { mappings.get_status(&name).await.ok() },
            |d| {
                d.as_ref()
                    .and_then(|d| d.status.as_ref())
                    .and_then(|s| s.status.observed_generation)
                    == Some(1)
            },
        )
        .await;
        triggered_past(&run, "DomainMapping", before, "a DomainMapping reconcile").await;
    }

    // 3. The first revision scaled to zero (as the autoscaler does, through `/scale`; the
    // test plays the Deployment controller) and back, 20 times: each scale to zero is a
    // change of the revision's Deployment, which re-queues the revision.
    let revisions = run.api::<Revision>();
    let deployment = "hello-00001-deployment";
    for _ in 0..CHANGES {
        for replicas in [0, 1] {
            let before = run.triggered("Revision");
            deployments
                .patch_scale(
                    deployment,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
                )
                .await
                .unwrap();
            let status = serde_json::json!({"status": {
                "replicas": replicas, "readyReplicas": replicas,
                "availableReplicas": replicas, "updatedReplicas": replicas,
            }});
            deployments
                .patch_status(deployment, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
            triggered_past(
                &run,
                "Revision",
                before,
                "a Revision reconcile from its scale",
            )
            .await;
        }
    }
    assert!(revisions.get("hello-00001").await.is_ok());

    for kind in [
        "Service",
        "DomainMapping",
        "Revision",
        "Configuration",
        "Route",
    ] {
        println!(
            "{kind}: {} reconciles started by a watch event, all within {} s",
            run.triggered(kind),
            run.max_bucket(kind)
        );
    }
}

/// A watch that cannot list holds no worker: with the API server failing every list of
/// ClusterDomainClaims (500), a DomainMapping's reconcile, which reads their store, gives up
/// after `STORES_WAIT` (10 s) with an error (counted `result="error"`) instead of waiting for
/// good with its worker; once the claims list, it is reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_list_holds_no_worker() {
    let api = TestApi::start().await;
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    relay.refuse("/clusterdomainclaims", 500);
    let run = start_via_api(api, &relay).await;
    let mappings = run.api::<DomainMapping>();
    mappings
        .create(&PostParams::default(), &domain_mapping("d.example.org"))
        .await
        .unwrap();
    wait_for(
        "the DomainMapping's reconcile giving up on the claims' store",
        || async { run.reconciles("DomainMapping", "error") },
        |n| *n >= 1,
    )
    .await;
    assert!(
        mappings
            .get_status("d.example.org")
            .await
            .unwrap()
            .status
            .is_none(),
        "reconciled without the claims"
    );
    relay.forward("/clusterdomainclaims");
    wait_for(
        "the DomainMapping reconciled once the claims list",
        || async { mappings.get_status("d.example.org").await.ok() },
        |d| {
            d.as_ref()
                .and_then(|d| d.status.as_ref())
                .and_then(|s| s.status.observed_generation)
                == Some(1)
        },
    )
    .await;
}
