//! Real sockets on 127.0.0.0/8: an activator on ephemeral ports, hyper upstreams, hyper clients.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use thaw::activator::testing::StaticEndpoints;
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::autoscaler::scaler::ScaleStates;
use thaw::config::ActivatorConfig;
use thaw::percore::Workers;
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::stats::{StatMessage, stat_channel};
use thaw::telemetry::Telemetry;

pub type TestBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A body fed from a channel, so a test decides when each chunk (or an error) is sent.
pub struct ChannelBody(pub mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

pub fn full(s: impl Into<Bytes>) -> TestBody {
    Full::new(s.into()).map_err(|n| match n {}).boxed()
}

/// A test upstream: counts requests in flight (and their peak) and answers by path:
/// `/` hello, `/slow?ms=N`, `/headers` (request headers as JSON, version in `x-version`),
/// `/stream` (chunks from the test's channel), `/die` (one chunk, then the connection breaks),
/// `/ws` (101, then echoes raw bytes).
pub struct Upstream {
    pub addr: SocketAddr,
    pub peak: Arc<AtomicU32>,
    pub served: Arc<AtomicU32>,
    streams: StreamSlot,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Chunk = Result<Bytes, std::io::Error>;
type StreamSlot = Arc<std::sync::Mutex<Option<mpsc::Receiver<Chunk>>>>;

struct InFlight(Arc<AtomicU32>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Upstream {
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    pub async fn start_on(bind: &str) -> Self {
        let listener = TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (now, peak, served): (Arc<AtomicU32>, Arc<AtomicU32>, Arc<AtomicU32>) =
            Default::default();
        let streams: StreamSlot = Arc::default();
        let stream_rx = streams.clone();
        let (n, p, s) = (Arc::clone(&now), Arc::clone(&peak), Arc::clone(&served));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (n, p, s, srx) = (n.clone(), p.clone(), s.clone(), stream_rx.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let (n, p, s, srx) = (n.clone(), p.clone(), s.clone(), srx.clone());
                        async move { Ok::<_, Infallible>(serve(req, addr, n, p, s, srx).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        drop(now);
        Self {
            addr,
            peak,
            served,
            streams,
            task,
        }
    }

    /// The next `/stream` response's chunks: each item sent is one chunk (an `Err` breaks the
    /// connection); dropping the sender ends the body.
    pub fn next_stream(&self) -> mpsc::Sender<Chunk> {
        let (tx, rx) = mpsc::channel(4);
        *self.streams.lock().unwrap() = Some(rx);
        tx
    }
}

async fn serve(
    mut req: Request<Incoming>,
    me: SocketAddr,
    now: Arc<AtomicU32>,
    peak: Arc<AtomicU32>,
    served: Arc<AtomicU32>,
    streams: StreamSlot,
) -> Response<TestBody> {
    let cur = now.fetch_add(1, SeqCst) + 1;
    peak.fetch_max(cur, SeqCst);
    served.fetch_add(1, SeqCst);
    let _in_flight = InFlight(now.clone());
    match req.uri().path() {
        "/slow" => {
            let ms: u64 = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(10);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Response::new(full(format!("slow from {me}")))
        }
        "/headers" => {
            let mut map: serde_json::Map<String, serde_json::Value> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").into()))
                .collect();
            // HTTP/2 carries the host as the URI's authority, not a field.
            if let Some(a) = req.uri().authority() {
                map.insert("x-authority".into(), a.as_str().into());
            }
            let mut r = Response::new(full(serde_json::Value::Object(map).to_string()));
            r.headers_mut()
                .insert("x-version", format!("{:?}", req.version()).parse().unwrap());
            r
        }
        "/echo" => {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            Response::new(full(body))
        }
        "/stream" => match streams.lock().unwrap().take() {
            Some(rx) => Response::new(ChannelBody(rx).boxed()),
            None => Response::new(full("no stream prepared")),
        },
        "/die" => {
            let (tx, rx) = mpsc::channel(2);
            tx.send(Ok(Bytes::from_static(b"partial"))).await.unwrap();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(std::io::Error::other("upstream died"))).await;
            });
            Response::new(ChannelBody(rx).boxed())
        }
        "/ws" => {
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = on_upgrade.await {
                    let mut io = TokioIo::new(up);
                    let (mut r, mut w) = tokio::io::split(&mut io);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
            let mut r = Response::new(Empty::new().map_err(|n| match n {}).boxed());
            *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut()
                .insert(http::header::UPGRADE, "websocket".parse().unwrap());
            r.headers_mut()
                .insert(http::header::CONNECTION, "upgrade".parse().unwrap());
            r
        }
        _ => Response::new(full(format!("hello from {me}"))),
    }
}

/// An activator serving on ephemeral ports, with an in-test endpoint source and stats channel.
pub struct Harness {
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub endpoints: Arc<StaticEndpoints>,
    pub stats: mpsc::Receiver<StatMessage>,
    pub catalog: Arc<RevisionCatalog>,
    pub activator: Arc<Activator>,
    shutdown: Option<oneshot::Sender<()>>,
    pub served: Option<JoinHandle<std::io::Result<()>>>,
}

impl Harness {
    pub async fn start(specs: Vec<RevisionSpec>, config: ActivatorConfig) -> Self {
        Self::start_with(specs, config, None).await
    }

    /// Like [`Harness::start`], serving connections on `n` data workers (one single-threaded
    /// runtime each), as `thaw local` does.
    pub async fn start_on_workers(
        specs: Vec<RevisionSpec>,
        config: ActivatorConfig,
        n: usize,
    ) -> Self {
        Self::build(specs, config, None, Some(n), NextHop::Sidecar).await
    }

    /// Like [`Harness::start`], forwarding to the containers themselves (as `thaw local` does)
    /// instead of to queue sidecars.
    pub async fn start_to_containers(specs: Vec<RevisionSpec>, config: ActivatorConfig) -> Self {
        Self::build(specs, config, None, None, NextHop::Container).await
    }

    /// Like [`Harness::start`], with the scaler's states visible to the activator.
    pub async fn start_with(
        specs: Vec<RevisionSpec>,
        config: ActivatorConfig,
        scale_states: Option<Arc<ScaleStates>>,
    ) -> Self {
        Self::build(specs, config, scale_states, None, NextHop::Sidecar).await
    }

    async fn build(
        specs: Vec<RevisionSpec>,
        config: ActivatorConfig,
        scale_states: Option<Arc<ScaleStates>>,
        workers: Option<usize>,
        next_hop: NextHop,
    ) -> Self {
        let _ = thaw::activator::raise_nofile_limit();
        let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(specs, [])));
        let endpoints = StaticEndpoints::new();
        let (sink, stats) = stat_channel(10_000);
        let config = Arc::new(ArcSwap::from_pointee(config));
        let activator = Activator::new(ActivatorDeps {
            catalog: catalog.clone(),
            endpoints: endpoints.clone(),
            stats: Arc::new(sink),
            scale_states,
            config: config.clone(),
            telemetry: Arc::new(Telemetry::new()),
            source_name: "activator-test".into(),
            next_hop,
        });
        let workers = workers.map(|n| Arc::new(Workers::start(n).unwrap()));
        if let Some(w) = &workers {
            activator.use_workers(w.clone());
        }
        let data = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (data_addr, admin_addr) = (data.local_addr().unwrap(), admin.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let serve = activator.clone().serve(data, admin, async {
            let _ = rx.await;
        });
        // Stops the workers once serve has returned (from a blocking thread: `stop` joins them).
        let served = tokio::spawn(async move {
            let result = serve.await;
            if let Some(w) = workers {
                let _ = tokio::task::spawn_blocking(move || w.stop()).await;
            }
            result
        });
        Self {
            data: data_addr,
            admin: admin_addr,
            endpoints,
            stats,
            catalog,
            activator,
            shutdown: Some(tx),
            served: Some(served),
        }
    }

    /// Begins drain (as SIGTERM would).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// A GET to `path` routed to `rev` by Knative's headers.
    pub fn get(&self, rev: &RevisionKey, path: &str) -> Request<TestBody> {
        Request::get(format!("http://{}{}", self.data, path))
            .header("knative-serving-namespace", &*rev.namespace)
            .header("knative-serving-revision", &*rev.name)
            .body(full(""))
            .unwrap()
    }

    /// The admin API's `/revisions` entry for `rev`.
    pub async fn revision(&self, rev: &RevisionKey) -> serde_json::Value {
        let (_, body) = admin_get(self.admin, "/revisions").await;
        let all: serde_json::Value = serde_json::from_str(&body).unwrap();
        all["revisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == *rev.name && r["namespace"] == *rev.namespace)
            .cloned()
            .unwrap_or(serde_json::Value::Null)
    }

    /// Polls `/revisions` until `rev` holds `n` requests (deadline 10 s).
    pub async fn wait_held(&self, rev: &RevisionKey, n: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let held = self.revision(rev).await["held"].as_u64().unwrap_or(0);
            if held == n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "held {held}, wanted {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls `/revisions` until the throttler's ready (non-terminating) endpoints of `rev` are
    /// exactly `ready` (deadline 10 s): the endpoint update was applied.
    pub async fn wait_endpoints(&self, rev: &RevisionKey, ready: &[SocketAddr]) {
        let mut want: Vec<String> = ready.iter().map(|a| a.to_string()).collect();
        want.sort();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = self.revision(rev).await;
            let mut got: Vec<String> = r["endpoints"]
                .as_array()
                .map(|eps| {
                    eps.iter()
                        .filter(|e| e["terminating"] == false)
                        .map(|e| e["address"].as_str().unwrap().to_string())
                        .collect()
                })
                .unwrap_or_default();
            got.sort();
            if got == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "endpoints {got:?}, wanted {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        admin_get(self.admin, "/metrics").await.1
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(task) = &self.served {
            task.abort();
        }
    }
}

/// A plain HTTP/1 GET on the admin port: (status, body).
pub async fn admin_get(admin: SocketAddr, path: &str) -> (StatusCode, String) {
    let resp = client()
        .request(
            Request::get(format!("http://{admin}{path}"))
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A pooled HTTP/1 client.
pub fn client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An h2c (prior knowledge) client.
pub fn h2_client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// Sends and reads the whole body: (status, headers, body).
pub async fn send(
    client: &Client<HttpConnector, TestBody>,
    req: Request<TestBody>,
) -> (StatusCode, http::HeaderMap, String) {
    let resp = client.request(req).await.expect("request");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// A revision spec for tests.
pub fn spec(name: &str, cc: u32) -> RevisionSpec {
    let mut s = RevisionSpec::test("default", name);
    s.container_concurrency = cc;
    s
}

/// An address nothing listens on (bound, then closed).
pub async fn dead_addr(ip: &str) -> SocketAddr {
    let l = TcpListener::bind(format!("{ip}:0")).await.unwrap();
    l.local_addr().unwrap()
}
