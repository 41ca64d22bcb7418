//! The whole in-process proxy path on loopback: client -> activator -> upstream, one request at
//! a time over a kept-alive connection, next to the same client talking to the upstream directly
//! (the baseline; the difference is the activator's added latency). HTTP/1.1 and h2c.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::time::Instant;

use thaw::activator::testing::StaticEndpoints;
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::config::ActivatorConfig;
use thaw::revision::{CatalogSnapshot, Protocol, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::stats::stat_channel;
use thaw::telemetry::Telemetry;

type C = Client<HttpConnector, Empty<Bytes>>;

async fn upstream() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn activator(up: std::net::SocketAddr) -> std::net::SocketAddr {
    let mut h1 = RevisionSpec::test("default", "h1");
    h1.container_concurrency = 10;
    let mut h2 = RevisionSpec::test("default", "h2");
    h2.protocol = Protocol::H2c;
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new([h1, h2], [])));
    let endpoints = StaticEndpoints::new();
    endpoints.set_ready(&RevisionKey::new("default", "h1"), vec![up]);
    endpoints.set_ready(&RevisionKey::new("default", "h2"), vec![up]);
    let (sink, mut rx) = stat_channel(1024);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let act = Activator::new(ActivatorDeps {
        catalog,
        endpoints,
        stats: Arc::new(sink),
        scale_states: None,
        config: Arc::new(ArcSwap::from_pointee(ActivatorConfig::default())),
        telemetry: Arc::new(Telemetry::new()),
        source_name: "bench".into(),
        next_hop: NextHop::Sidecar,
    });
    let data = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = data.local_addr().unwrap();
    tokio::spawn(act.serve(data, admin, std::future::pending()));
    addr
}

fn request(addr: std::net::SocketAddr, rev: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/"))
        .header("knative-serving-namespace", "default")
        .header("knative-serving-revision", rev)
        .body(Empty::new())
        .unwrap()
}

fn run(rt: &Runtime, client: &C, addr: std::net::SocketAddr, rev: &str, iters: u64) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let resp = client.request(request(addr, rev)).await.unwrap();
            assert!(resp.status().is_success());
            resp.into_body().collect().await.unwrap();
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (up, act) = rt.block_on(async {
        let up = upstream().await;
        (up, activator(up).await)
    });
    let h1: C = Client::builder(TokioExecutor::new()).build_http();
    let h2: C = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut g = c.benchmark_group("proxy_path");
    g.bench_function("direct_http1", |b| {
        b.iter_custom(|n| run(&rt, &h1, up, "h1", n))
    });
    g.bench_function("activator_http1", |b| {
        b.iter_custom(|n| run(&rt, &h1, act, "h1", n))
    });
    g.bench_function("direct_h2c", |b| {
        b.iter_custom(|n| run(&rt, &h2, up, "h2", n))
    });
    g.bench_function("activator_h2c", |b| {
        b.iter_custom(|n| run(&rt, &h2, act, "h2", n))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
