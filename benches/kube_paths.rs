//! Latencies of the Kubernetes data plane's two fast paths, against the in-process API server
//! (real HTTP, real watches), in one process:
//! - an EndpointSlice event received by the platform's watcher -> the first held request
//!   written to the new endpoint (the activator in between);
//! - a poke on the activator's stats sink -> the autoscaler leader's `PATCH .../scale` on the
//!   wire (push over HTTP, stats port, scaler decision, platform scaler task).
//!
//! `cargo bench --bench kube_paths` prints median and p99 of each (docs/benchmarks.md).

#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::autoscaler::scaler::{ScaleStates, Scaler, ScalerOptions};
use thaw::config::{ActivatorConfig, AutoscalingSpec};
use thaw::platform::kubernetes::{KubeOptions, KubePlatform, KubeRevision};
use thaw::platform::{EndpointSource, Platform};
use thaw::remote::{push, server, token::Token};
use thaw::revision::{CatalogSnapshot, Protocol, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::stats::{Stat, StatSink};
use thaw::telemetry::Telemetry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

const NS: &str = "default";

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{name}: n={} median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        v.len(),
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3
    );
}

/// An upstream that reports when each request head arrives.
async fn upstream(tx: mpsc::UnboundedSender<Instant>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let _ = tx.send(Instant::now());
                    async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn slice_to_held_request(api: &kube_support::TestApi) {
    let client = api.client();
    let platform = KubePlatform::start(
        client.clone(),
        KubeOptions {
            namespace: Some(NS.into()),
            ..KubeOptions::default()
        },
        Default::default(),
    );
    platform.wait_synced().await;
    let key = RevisionKey::new(NS, "held-00001");
    platform.upsert(KubeRevision {
        key: key.clone(),
        protocol: Protocol::Http1,
        progress_deadline: None,
    });
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(
        [RevisionSpec::test(NS, "held-00001")],
        [],
    )));
    let (sink, _rx) = thaw::stats::stat_channel(1 << 16);
    let telemetry = Arc::new(Telemetry::new());
    let act = Activator::new(ActivatorDeps {
        catalog,
        endpoints: Arc::new(platform.clone()),
        stats: Arc::new(sink),
        scale_states: None,
        config: Arc::new(ArcSwap::from_pointee(ActivatorConfig::default())),
        telemetry,
        source_name: "bench".into(),
        next_hop: NextHop::Sidecar,
    });
    let data = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data_addr = data.local_addr().unwrap();
    tokio::spawn(act.clone().serve(data, admin, std::future::pending()));
    let (up_tx, mut up_rx) = mpsc::unbounded_channel();
    let up = upstream(up_tx).await;
    // The watcher's receipt: this subscriber sits beside the activator's on the same channel.
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let mut rx = platform.endpoints(&key);
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            if !rx.borrow_and_update().ready.is_empty() {
                let _ = ev_tx.send(Instant::now());
            }
        }
    });
    // The revision's Deployment and one pod of it: endpoints count only by ownership.
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), NS);
    let labels = serde_json::json!({"serving.knative.dev/revision": "held-00001"});
    deps.create(
        &PostParams::default(),
        &obj(serde_json::json!({
            "metadata": {"name": "held-00001-deployment", "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "user-container", "image": "app"}]}}},
        })),
    )
    .await
    .unwrap();
    kube_support::owned_pod(&client, NS, "held-00001-deployment", "held-pod", labels).await;
    let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
    let http: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut lat = Vec::new();
    for i in 0..200 {
        let req = hyper::Request::get(format!("http://{data_addr}/"))
            .header("Knative-Serving-Namespace", NS)
            .header("Knative-Serving-Revision", "held-00001")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let h = http.clone();
        let pending = tokio::spawn(async move { h.request(req).await.map(|r| r.status()) });
        while act.held_requests() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let name = format!("held-{i}");
        slices
            .create(
                &PostParams::default(),
                &obj(serde_json::json!({
                    "metadata": {"name": name, "labels": {
                        "serving.knative.dev/revision": "held-00001",
                        "networking.internal.knative.dev/serviceType": "Private"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": up.port(), "protocol": "TCP"}],
                    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true},
                        "targetRef": kube_support::pod_target(NS, "held-pod")}],
                })),
            )
            .await
            .unwrap();
        let t_up = up_rx.recv().await.unwrap();
        let t_ev = ev_rx.recv().await.unwrap();
        assert_eq!(pending.await.unwrap().unwrap(), 200);
        lat.push(t_up.saturating_duration_since(t_ev));
        slices
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        while !platform.endpoints(&key).borrow().ready.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    summary("slice event -> held request written upstream", lat);
    platform.shutdown();
}

async fn poke_to_patch(api: &kube_support::TestApi) {
    let relay = kube_support::relay::Relay::start(api.addr()).await;
    let client = kube_support::client_at(relay.addr());
    let direct = api.client();
    let n = 100;
    let deps: Api<Deployment> = Api::namespaced(direct.clone(), NS);
    let mut specs = Vec::new();
    for i in 0..n {
        let name = format!("poke-{i:03}");
        deps.create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "metadata": {"name": format!("{name}-deployment"),
                    "labels": {"serving.knative.dev/revision": name}},
                "spec": {"replicas": 0,
                    "selector": {"matchLabels": {"serving.knative.dev/revision": name}},
                    "template": {"metadata": {"labels": {"serving.knative.dev/revision": name}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]}}},
            })),
        )
        .await
        .unwrap();
        let mut spec = RevisionSpec::test(NS, &name);
        spec.autoscaling = Arc::new(AutoscalingSpec {
            initial_scale: 0,
            ..AutoscalingSpec::default()
        });
        specs.push(spec);
    }
    let platform = KubePlatform::start(
        client.clone(),
        KubeOptions {
            namespace: Some(NS.into()),
            ..KubeOptions::default()
        },
        Default::default(),
    );
    platform.wait_synced().await;
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(specs, [])));
    let telemetry = Arc::new(Telemetry::new());
    let states = ScaleStates::new();
    let (stats_tx, stats_rx) = mpsc::channel(1 << 16);
    let scaler = Scaler::new(
        catalog.clone(),
        Arc::new(platform.clone()) as Arc<dyn Platform>,
        states.clone(),
        &telemetry,
        ScalerOptions::default(),
    );
    tokio::spawn(scaler.run(stats_rx, std::future::pending()));
    let token = Token::new(b"bench-token-0123456789").unwrap();
    let (_leading_tx, leading) = watch::channel(true);
    let port = Arc::new(server::StatsPort {
        token: token.clone().into(),
        leading,
        stats: stats_tx,
        states,
        metrics: telemetry.remote.clone(),
        dropped: Default::default(),
    });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stats_addr = l.local_addr().unwrap();
    tokio::spawn(server::serve(port, l, Default::default()));
    let (_leader_tx, leader) = watch::channel(Some(stats_addr.to_string()));
    let sink = push::start(
        push::PushSettings {
            leader,
            token: token.into(),
            source: "bench".into(),
            metrics: telemetry.remote.clone(),
            dropped: Default::default(),
            revisions: Arc::new(move || n),
        },
        Default::default(),
    );
    // Warm the push connection and the scaler.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lat = Vec::new();
    for i in 0..n {
        let name = format!("poke-{i:03}");
        let seen = relay.requests_at().len();
        let t0 = Instant::now();
        sink.poke(Stat {
            revision: RevisionKey::new(NS, &name),
            source: "bench".into(),
            at: thaw::clock::now_second(),
            average_concurrency: 1.0,
            requests: 1,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
        });
        let t1 = loop {
            let found = relay.requests_at()[seen..]
                .iter()
                .find(|(_, l)| {
                    l.starts_with("PATCH") && l.contains(&format!("{name}-deployment/scale"))
                })
                .map(|(t, _)| *t);
            if let Some(t) = found {
                break t;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        lat.push(t1 - t0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    summary("poke on the activator -> PATCH /scale on the wire", lat);
    platform.shutdown();
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = kube_support::TestApi::start().await;
        slice_to_held_request(&api).await;
        poke_to_patch(&api).await;
    });
}
