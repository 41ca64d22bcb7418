//! A cold start on the cluster path does not wait for the kubelet: with the whole stack
//! running (the in-process API server, `thaw controller`, `thaw autoscaler`, two
//! `thaw activator` processes, and the test playing the Deployment controller, the kubelet
//! with real `thaw queue` + `thaw sample-app` pods, the endpoints controller and the ingress),
//! a request at zero is answered by the new pod while the kubelet still holds it not ready:
//! the activator probed the pod itself (`pod-probe-budget`, `K-Network-Probe: queue`) and sent
//! to it when its sidecar answered. Knative's defaults but the scale-to-zero windows.
//!
//! The run prints the figures docs/benchmarks.md records: request at zero -> 200, minus the
//! pod's start and minus the sidecar's first answer. Two knobs measure the other cases (and
//! then the test asserts only the 200): `COLD_START_READY_DELAY_MS=1000` lets the kubelet mark
//! a pod ready that long after its sidecar first answers instead of holding it, and
//! `COLD_START_POD_PROBE_BUDGET=0` turns the activator's probing off (the activator then waits
//! for the EndpointSlice, as before it probed).

mod kube_e2e_support;
mod kube_support;
mod stack_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use stack_support::cluster::ReadyGate;
use stack_support::ingress::{Ingress, keepalive_client};
use stack_support::roles::RoleKind;
use stack_support::{NS, Stack, StackOptions, helloworld, short_windows};
use thaw::knative::{Service, condition};
use tokio::time::Instant;

const NAME: &str = "cold";
const REVISION: &str = "cold-00001";
const BODY: &str = "Hello from Go Sample v1!\n";
const READY: Duration = Duration::from_secs(30);
/// To zero: the stable window without traffic, the grace period, then the pod's stop.
const TO_ZERO: Duration = Duration::from_secs(40);

async fn pods(stack: &Stack) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(stack.client.clone(), NS);
    let lp = ListParams::default().labels(&format!("serving.knative.dev/revision={REVISION}"));
    api.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The sum of one counter over every activator's /metrics.
async fn activators_counter(stack: &Stack, name: &str) -> f64 {
    let mut sum = 0.0;
    for a in stack.roles_of(RoleKind::Activator) {
        let text = kube_e2e_support::get_text(a.admin(), "/metrics").await;
        sum += text
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_at_zero_is_answered_when_the_sidecar_answers_not_when_the_kubelet_says_ready() {
    let delay = std::env::var("COLD_START_READY_DELAY_MS")
        .ok()
        .map(|v| Duration::from_millis(v.parse().expect("COLD_START_READY_DELAY_MS: ms")));
    let mut activator = BTreeMap::new();
    if let Ok(b) = std::env::var("COLD_START_POD_PROBE_BUDGET") {
        activator.insert("pod-probe-budget".to_string(), b);
    }
    let stack = Stack::start(StackOptions {
        autoscaler: short_windows(),
        activator,
        controllers: 1,
        autoscalers: 1,
        activators: 2,
        graceful_pod_deletion: false,
    })
    .await;
    let services: Api<Service> = Api::namespaced(stack.client.clone(), NS);
    services
        .create(&PostParams::default(), &helloworld(NAME, "", None))
        .await
        .expect("create the Service");
    let url = stack
        .until(READY, "the Service Ready with a URL", || async {
            let s = services.get_status(NAME).await.ok()?;
            let st = s.status.as_ref()?;
            st.status.is_true(condition::READY).then_some(())?;
            st.route.url.clone()
        })
        .await;
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let ingress = Arc::new(Ingress::start(stack.client.clone()));
    let client = keepalive_client();
    stack
        .until(READY, "the ingress routing the host", || async {
            (!ingress.endpoints(&host).is_empty()).then_some(())
        })
        .await;
    let warm = ingress.get(&client, &host, "/").await.expect("a reply");
    assert_eq!((warm.status, warm.body.as_str()), (200, BODY));

    // Idle: to zero, the pod gone, every activator seeing the revision cold.
    stack
        .until(TO_ZERO, "the revision's pods gone", || async {
            pods(&stack).await.is_empty().then_some(())
        })
        .await;
    stack.until_activators_cold(NS, REVISION, TO_ZERO).await;

    // The kubelet now holds new pods not ready (or marks them ready `delay` after their
    // sidecar first answers); a request wakes the revision.
    let gate = delay.map_or(ReadyGate::Held, ReadyGate::After);
    stack.cluster.kubelet.set_gate(gate);
    let early_before = activators_counter(&stack, "thaw_activator_early_ready_pods_total").await;
    let sent = Instant::now();
    let reply = ingress.get(&client, &host, "/").await.expect("a reply");
    let answered = Instant::now();
    assert_eq!((reply.status, reply.body.as_str()), (200, BODY));
    assert!(
        stack.is_activator(&reply.endpoint),
        "held by an activator, answered via {}",
        reply.endpoint
    );
    let pod = pods(&stack)
        .await
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .expect("the woken pod");
    let times = stack
        .cluster
        .kubelet
        .times(NS, &pod.name_any())
        .expect("the kubelet ran the pod");
    let started = times.started.expect("the pod started");
    println!(
        "request at zero -> 200: {}; pod start -> 200: {}",
        ms(answered - sent),
        ms(answered.saturating_duration_since(started)),
    );
    let listed = stack.records().listed(NS, &pod.name_any());
    if let Some(l) = listed {
        println!(
            "pod start -> its endpoint (not ready) in an EndpointSlice: {}",
            ms(l.saturating_duration_since(started))
        );
    }
    if let Some(first) = times.first_answer {
        println!(
            "pod start -> sidecar's first answer: {}; sidecar's first answer -> 200: {}",
            ms(first.saturating_duration_since(started)),
            ms(answered.saturating_duration_since(first)),
        );
        // What the activator adds: from when it could know of the pod and find it answering.
        if let Some(l) = listed {
            println!(
                "both (answering and listed) -> 200: {}",
                ms(answered.saturating_duration_since(first.max(l)))
            );
        }
    }
    if let Some(r) = times.ready {
        println!(
            "the kubelet marked the pod ready {} after its start",
            ms(r.saturating_duration_since(started))
        );
    }
    let early = activators_counter(&stack, "thaw_activator_early_ready_pods_total").await;
    println!(
        "pods sent to before the kubelet marked them ready: {}",
        early - early_before
    );
    if gate == ReadyGate::Held {
        // Held not ready: only the activator's own probe can have sent the request there.
        assert!(times.ready.is_none(), "the kubelet held the pod not ready");
        assert!(
            early > early_before,
            "an activator counted the early-ready pod"
        );
        // Released, the kubelet marks it ready and the autoscaler takes the activators out of
        // the path: the pod serves as any ready pod does.
        stack.cluster.kubelet.set_gate(ReadyGate::Probes);
        stack
            .until(READY, "the pod marked ready by the kubelet", || async {
                let p = pods(&stack).await;
                p.iter()
                    .any(|p| {
                        p.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|cs| {
                                cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .then_some(())
            })
            .await;
        let again = ingress.get(&client, &host, "/").await.expect("a reply");
        assert_eq!((again.status, again.body.as_str()), (200, BODY));
    }
}
