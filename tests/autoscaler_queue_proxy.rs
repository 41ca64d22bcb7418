//! thaw with pods that still run Knative's queue-proxy (a cluster moved from Knative Serving,
//! before the revision rolls to thaw's sidecar): the real queue-proxy of Knative Serving v0.42.2
//! (built by `tests/cluster/build.sh` into `$CARGO_TARGET_DIR/plane/knative/bin/queue`), run as
//! Knative's revision reconciler runs it (`pkg/reconciler/revision/resources/queue.go`: its
//! environment), in front of `thaw sample-app` as the user container.
//!
//! queue-proxy binds fixed ports on every address (its admin port 8022 and its metrics port
//! 9090; the data port is `QUEUE_SERVING_PORT`, 8012 as Knative sets it), so each test
//! re-executes itself, alone, in its own network namespace (`unshare`), where those ports are
//! its own: like a pod, and never in the way of another test on the host.
//!
//! - `the_pull_reads_queue_proxys_stat_under_load`: the autoscaler's pod-stats pull decodes
//!   queue-proxy's protobuf `Stat` under a load of [`LOAD`] requests in flight at once.
//! - `the_autoscaler_scales_a_queue_proxy_pod_up_under_load_and_to_zero_when_idle`: the
//!   scaler, fed by that pull only, scales up under load and to zero once idle.
//! - `the_activator_forwards_through_queue_proxy_and_its_probe_is_answered`: thaw's
//!   activator forwards through queue-proxy, which counts its requests as proxied once the
//!   platform says the pod runs queue-proxy (the activator then sends `K-Proxy-Request:
//!   activator`, not the revision's tag), and its early probe (`K-Network-Probe: queue`) makes
//!   a starting pod ready.

mod autoscaler_common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use thaw::activator::testing::StaticEndpoints;
use thaw::activator::{Activator, ActivatorDeps, NextHop};
use thaw::autoscaler::scaler::ActivatorPath;
use thaw::config::ActivatorConfig;
use thaw::knative::proxy_tag::Tagger;
use thaw::platform::memory::MemoryPlatform;
use thaw::platform::{EndpointSnapshot, EndpointSource};
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::roles::early_ready::{EarlyReady, EarlyReadyMetrics};
use thaw::roles::mesh::{ProbeResult, probe, probe_client};
use thaw::roles::pull::{self, PodStatsFlow, PullOptions};
use thaw::roles::queue_proxy_stat::{self, KnativeStat};
use thaw::stats::{PodStatsWire, Stat, StatMessage, StatsTarget, stat_channel};
use thaw::telemetry::Telemetry;
use thaw::telemetry::remote::RemoteMetrics;

/// Set in the re-executed test: it runs inside its own network namespace.
const INSIDE_ENV: &str = "THAW_QUEUE_PROXY_TEST_INSIDE";
/// queue-proxy's data port (`QUEUE_SERVING_PORT`, as Knative's reconciler sets it for HTTP/1).
const DATA: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8012);
/// queue-proxy's metrics port (fixed in its code).
const METRICS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);
/// The user container's port.
const USER_PORT: u16 = 8080;
/// The pod's name (queue-proxy's `SERVING_POD`, the Stat's `pod_name`).
const POD: &str = "hello-00001-deployment-5d8f7c9b4-qp7xk";
/// Requests in flight at once in the pull test.
const LOAD: usize = 8;
/// The user container's answer time: long against a request's overhead (well under a
/// millisecond on loopback), so `LOAD` looping clients keep about `LOAD` requests in flight.
const RESPONSE_DELAY: &str = "250ms";
/// A liveness bound on each wait (never a timing asserted).
const DEADLINE: Duration = Duration::from_secs(90);

/// Runs `body` in its own network namespace: outside, re-executes this test binary for this
/// one test under `unshare --net` and asserts it passed; inside, brings loopback up and runs it.
fn in_own_network<F: std::future::Future<Output = ()>>(test: &str, body: impl FnOnce() -> F) {
    if std::env::var_os(INSIDE_ENV).is_some() {
        let up = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("ip (iproute2)");
        assert!(up.success(), "ip link set lo up");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(body());
        return;
    }
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let mut cmd = Command::new("unshare");
    if !root {
        cmd.args(["--user", "--map-root-user"]);
    }
    cmd.args(["--net", "--pid", "--fork", "--kill-child", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE_ENV, "1");
    let status = cmd.status().expect("unshare (util-linux)");
    assert!(
        status.success(),
        "{test} in its own network namespace: {status}"
    );
}

/// Knative's queue-proxy binary.
fn queue_proxy_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("plane/knative/bin/queue");
    assert!(
        bin.exists(),
        "{} is missing: run tests/cluster/build.sh first",
        bin.display()
    );
    bin
}

/// One pod: `thaw sample-app` on [`USER_PORT`] and Knative's queue-proxy in front of it, killed
/// when dropped. Their output goes to files printed if the test fails.
struct Pod {
    _app: Child,
    _queue: Child,
    logs: tempfile::TempDir,
}

impl Pod {
    /// Starts the pod with `container_concurrency` and waits until queue-proxy answers its
    /// readiness probe (`K-Network-Probe: queue` -> 200 `queue`, the user container ready).
    async fn start(container_concurrency: u32) -> Self {
        let logs = tempfile::tempdir().unwrap();
        let out = |name: &str| {
            let f = std::fs::File::create(logs.path().join(name)).unwrap();
            (Stdio::from(f.try_clone().unwrap()), Stdio::from(f))
        };
        let (o, e) = out("app.log");
        let app = tokio::process::Command::new(env!("CARGO_BIN_EXE_thaw"))
            .args(["sample-app", "--port", &USER_PORT.to_string()])
            .args(["--response-delay", RESPONSE_DELAY])
            .stdout(o)
            .stderr(e)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (o, e) = out("queue.log");
        let probe_json = format!(
            r#"{{"tcpSocket":{{"port":{USER_PORT},"host":"127.0.0.1"}},"successThreshold":1}}"#
        );
        let cc = container_concurrency.to_string();
        let user_port = USER_PORT.to_string();
        // As Knative's revision reconciler writes the container's environment (queue.go),
        // Knative's defaults where a ConfigMap would say.
        let env: [(&str, &str); 34] = [
            ("SERVING_NAMESPACE", "default"),
            ("SERVING_SERVICE", "hello"),
            ("SERVING_CONFIGURATION", "hello"),
            ("SERVING_REVISION", "hello-00001"),
            ("QUEUE_SERVING_PORT", "8012"),
            ("QUEUE_SERVING_TLS_PORT", "8112"),
            ("CONTAINER_CONCURRENCY", &cc),
            ("REVISION_TIMEOUT_SECONDS", "300"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
            ("SERVING_POD", POD),
            ("SERVING_POD_IP", "127.0.0.1"),
            ("SERVING_LOGGING_CONFIG", ""),
            ("SERVING_LOGGING_LEVEL", "info"),
            ("SERVING_REQUEST_LOG_TEMPLATE", ""),
            ("SERVING_ENABLE_REQUEST_LOG", "false"),
            ("SERVING_REQUEST_METRICS_BACKEND", "prometheus"),
            ("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS", "5"),
            ("TRACING_CONFIG_BACKEND", "none"),
            ("TRACING_CONFIG_ZIPKIN_ENDPOINT", ""),
            ("TRACING_CONFIG_DEBUG", "false"),
            ("TRACING_CONFIG_SAMPLE_RATE", "0.1"),
            ("USER_PORT", &user_port),
            ("SYSTEM_NAMESPACE", "knative-serving"),
            ("METRICS_DOMAIN", "knative.dev/internal/serving"),
            ("SERVING_READINESS_PROBE", &probe_json),
            ("ENABLE_PROFILING", "false"),
            ("SERVING_ENABLE_PROBE_REQUEST_LOG", "false"),
            ("METRICS_COLLECTOR_ADDRESS", ""),
            ("HOST_IP", "127.0.0.1"),
            ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
            ("ENABLE_HTTP_FULL_DUPLEX", "false"),
            ("ROOT_CA", ""),
            ("ENABLE_MULTI_CONTAINER_PROBES", "false"),
        ];
        let queue = tokio::process::Command::new(queue_proxy_binary())
            .env_clear()
            .envs(env)
            .stdout(o)
            .stderr(e)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pod = Pod {
            _app: app,
            _queue: queue,
            logs,
        };
        let client = probe_client();
        let limit = Instant::now() + DEADLINE;
        while probe(&client, DATA).await != ProbeResult::Answered {
            pod.check(
                Instant::now() < limit,
                "queue-proxy never answered its probe",
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pod
    }

    /// Asserts `ok`, printing the pod's logs when it does not hold.
    fn check(&self, ok: bool, what: &str) {
        if !ok {
            for name in ["queue.log", "app.log"] {
                let log = std::fs::read_to_string(self.logs.path().join(name)).unwrap_or_default();
                eprintln!("--- {name}\n{log}");
            }
            panic!("{what}");
        }
    }
}

/// `clients` tasks, each sending `GET /` to `target` one after another (kept-alive
/// connections) with `headers`, until the load is dropped. Counts the answers by status.
struct Load {
    stop: Arc<AtomicBool>,
    statuses: Arc<Mutex<Vec<u16>>>,
}

impl Load {
    fn start(clients: usize, target: SocketAddr, headers: &[(&'static str, &'static str)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..clients {
            let (stop, statuses) = (stop.clone(), statuses.clone());
            let headers = headers.to_vec();
            let client: Client<HttpConnector, Empty<Bytes>> =
                Client::builder(TokioExecutor::new()).build_http();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let mut req = Request::get(format!("http://{target}/"));
                    for (k, v) in &headers {
                        req = req.header(*k, *v);
                    }
                    let status = match client.request(req.body(Empty::new()).unwrap()).await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let _ = resp.into_body().collect().await;
                            status
                        }
                        Err(_) => 0,
                    };
                    statuses.lock().unwrap().push(status);
                }
            });
        }
        Load { stop, statuses }
    }

    /// The answers so far: (200s, others).
    fn answered(&self) -> (usize, usize) {
        let s = self.statuses.lock().unwrap();
        let ok = s.iter().filter(|c| **c == 200).count();
        (ok, s.len() - ok)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn revision_key() -> RevisionKey {
    RevisionKey::new("default", "hello-00001")
}

/// The pod as the platform lists it for a pod that runs Knative's queue-proxy.
fn target() -> StatsTarget {
    StatsTarget {
        pod: POD.into(),
        addr: METRICS,
        wire: PodStatsWire::QueueProxy,
    }
}

/// The autoscaler's pod-stats pull (its defaults) over `targets`; returns every stat recorded.
fn start_pull(
    spec: RevisionSpec,
    targets: impl Fn(&RevisionKey) -> Vec<StatsTarget> + Send + Sync + 'static,
    stop: CancellationToken,
) -> (Arc<Mutex<Vec<Stat>>>, Arc<PodStatsFlow>) {
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(vec![spec], [])));
    let (tx, mut rx) = mpsc::channel(1024);
    let flow = Arc::new(PodStatsFlow::default());
    tokio::spawn(pull::run_with(
        PullOptions::default(),
        targets,
        catalog,
        tx,
        flow.clone(),
        RemoteMetrics::default(),
        stop,
    ));
    let stats = Arc::new(Mutex::new(Vec::new()));
    let s = stats.clone();
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if let StatMessage::Record(stat) = m {
                s.lock().unwrap().push(stat);
            }
        }
    });
    (stats, flow)
}

/// Whether `average` is what [`LOAD`] looping clients keep in flight: each has one request in
/// flight but for the moments between two (well under a millisecond on loopback; the bound
/// allows an eighth of each 250 ms on a busy host).
fn in_flight(average: f64) -> bool {
    let n = LOAD as f64;
    (n - 1.0..=n + 0.01).contains(&average)
}

/// Polls `done` until it holds; fails with `what` after [`DEADLINE`] (a liveness bound).
async fn until(pod: &Pod, what: &str, mut done: impl FnMut() -> bool) {
    let limit = Instant::now() + DEADLINE;
    while !done() {
        pod.check(Instant::now() < limit, &format!("never: {what}"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn the_pull_reads_queue_proxys_stat_under_load() {
    in_own_network("the_pull_reads_queue_proxys_stat_under_load", || async {
        let pod = Pod::start(0).await;
        // What queue-proxy answers Knative's scraper: its protobuf Stat, asked for by media type.
        let (status, content_type, body) = get(METRICS, queue_proxy_stat::PATH, true).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some(queue_proxy_stat::PROTOBUF));
        assert_eq!(KnativeStat::decode_body(&body).unwrap().pod_name, POD);

        let stop = CancellationToken::new();
        let (stats, flow) = start_pull(
            RevisionSpec::test("default", "hello-00001"),
            |_: &RevisionKey| vec![target()],
            stop.clone(),
        );
        let load = Load::start(LOAD, DATA, &[]);
        // Seconds wholly under load: queue-proxy's report covers the second before it, so
        // the first full second is two after the load began.
        let from = thaw::clock::now_second() + 2;
        let loaded = |stats: &[Stat]| -> Vec<Stat> {
            stats.iter().filter(|s| s.at >= from).cloned().collect()
        };
        until(&pod, "three seconds of pulled stats under load", || {
            loaded(&stats.lock().unwrap()).len() >= 3
        })
        .await;
        let under_load = loaded(&stats.lock().unwrap());
        for s in &under_load {
            eprintln!(
                "second {}: average concurrency {:.3}, requests {}, proxied {:.3}/{}",
                s.at, s.average_concurrency, s.requests, s.proxied_concurrency, s.proxied_requests
            );
        }
        for s in &under_load {
            pod.check(
                in_flight(s.average_concurrency),
                &format!("concurrency {} for {LOAD} in flight", s.average_concurrency),
            );
            // Each client sends at most 4 a second (250 ms each), one more at the period's
            // edges; a busy host slows them, never below 2 each.
            pod.check(
                (2 * LOAD as u64..=5 * LOAD as u64).contains(&s.requests),
                &format!("{} requests in a second", s.requests),
            );
            assert_eq!((s.proxied_concurrency, s.proxied_requests), (0.0, 0));
            assert_eq!(s.revision, revision_key());
        }
        assert!(flow.flows(&revision_key()));
        assert!(flow.health(&revision_key()).is_none());

        // Idle: the pod's stat falls to zero.
        drop(load);
        let idle_from = thaw::clock::now_second() + 2;
        until(&pod, "an idle second pulled", || {
            stats
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.at >= idle_from && s.average_concurrency == 0.0 && s.requests == 0)
        })
        .await;
        stop.cancel();
    });
}

#[test]
fn the_autoscaler_scales_a_queue_proxy_pod_up_under_load_and_to_zero_when_idle() {
    in_own_network(
        "the_autoscaler_scales_a_queue_proxy_pod_up_under_load_and_to_zero_when_idle",
        || async {
            let pod = Pod::start(0).await;
            let key = autoscaler_common::key("hello-00001");
            // Knative's defaults (target 100 at 70 % utilization, TBC 200, panic at 200 %
            // over a 6 s panic window), but for the stable window and the two scale-to-zero
            // periods, shortened as the stack tests' `short_windows` config-autoscaler does
            // (6 s, 2 s, 0 s) so an idle revision reaches zero within seconds.
            let spec = autoscaler_common::revision("hello-00001", |s| {
                s.stable_window = Duration::from_secs(6);
                s.scale_to_zero_grace_period = Duration::from_secs(2);
                s.scale_to_zero_pod_retention_period = Duration::ZERO;
            });
            let platform = MemoryPlatform::with_startup(Duration::ZERO);
            let h = autoscaler_common::harness(
                vec![spec.clone()],
                platform.clone(),
                ActivatorPath::Always {
                    since: Instant::now(),
                },
            );
            // The pull is the scaler's only source: the pod while the platform has one ready,
            // none once it was scaled to zero.
            let stop = CancellationToken::new();
            let (tx, rx) = mpsc::channel(1024);
            let flow = Arc::new(PodStatsFlow::default());
            let (p, k) = (platform.clone(), key.clone());
            tokio::spawn(pull::run_with(
                PullOptions::default(),
                move |_: &RevisionKey| {
                    if p.ready(&k) > 0 {
                        vec![target()]
                    } else {
                        vec![]
                    }
                },
                h.catalog.clone(),
                tx,
                flow,
                RemoteMetrics::default(),
                stop.clone(),
            ));
            let (stop_scaler, stopped) = oneshot::channel::<()>();
            let scaler = tokio::spawn(h.scaler.run(rx, async {
                let _ = stopped.await;
            }));
            until(&pod, "the initial scale of one pod", || {
                platform.ready(&key) == 1
            })
            .await;

            // 150 in flight: 150 / 70 per pod -> 3 pods (and panic mode, above 2 x 70).
            let load = Load::start(150, DATA, &[]);
            until(&pod, "three pods under a load of 150", || {
                platform.replicas(&key) == Some(3)
            })
            .await;
            let (ok, failed) = load.answered();
            eprintln!("under load: {ok} answered 200, {failed} otherwise");
            assert_eq!(failed, 0);

            // Idle: the window empties, then the grace period, then zero.
            drop(load);
            let idle = Instant::now();
            until(&pod, "zero pods once idle", || {
                platform.replicas(&key) == Some(0)
            })
            .await;
            eprintln!(
                "scaled to zero {:.1} s after the load stopped; scale calls: {:?}",
                idle.elapsed().as_secs_f64(),
                platform
                    .scale_calls()
                    .iter()
                    .map(|c| c.replicas)
                    .collect::<Vec<_>>()
            );
            stop.cancel();
            stop_scaler.send(()).unwrap();
            scaler.await.unwrap();
        },
    );
}

#[test]
fn the_activator_forwards_through_queue_proxy_and_its_probe_is_answered() {
    in_own_network(
        "the_activator_forwards_through_queue_proxy_and_its_probe_is_answered",
        || async {
            let pod = Pod::start(0).await;
            let key = revision_key();

            // The early probe: a starting endpoint (not ready in the platform's view) that
            // answers `K-Network-Probe: queue` is sent to at once.
            let starting = StaticEndpoints::new();
            starting.set(
                &key,
                EndpointSnapshot {
                    starting: vec![DATA],
                    ..Default::default()
                },
            );
            let early = EarlyReady::new(starting, || 10, EarlyReadyMetrics::default());
            let mut rx = early.endpoints(&key);
            let limit = Instant::now() + DEADLINE;
            while !rx.borrow_and_update().ready.contains(&DATA) {
                pod.check(
                    Instant::now() < limit,
                    "the early probe never made the pod ready",
                );
                let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
            }

            // Forwarding: thaw's activator as on Kubernetes (tagging `K-Proxy-Request` with the
            // revision's tag for thaw's sidecar), the pod as the revision's ready endpoint.
            let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(
                vec![RevisionSpec::test("default", "hello-00001")],
                [],
            )));
            let endpoints = StaticEndpoints::new();
            let (sink, _stats) = stat_channel(10_000);
            let activator = Activator::new(ActivatorDeps {
                catalog,
                endpoints: endpoints.clone(),
                stats: Arc::new(sink),
                scale_states: None,
                config: Arc::new(ArcSwap::from_pointee(ActivatorConfig::default())),
                telemetry: Arc::new(Telemetry::new()),
                source_name: "activator-test".into(),
                next_hop: NextHop::Sidecar,
            });
            activator.use_proxy_tags(Arc::new(Tagger::fixed(b"queue-proxy-test-tag-key-0123")));
            let data = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = data.local_addr().unwrap();
            let (shut, shutdown) = oneshot::channel::<()>();
            let served = tokio::spawn(activator.serve(data, admin, async {
                let _ = shutdown.await;
            }));
            let (stats, _) = start_pull(
                RevisionSpec::test("default", "hello-00001"),
                |_: &RevisionKey| vec![target()],
                CancellationToken::new(),
            );
            let routed = [
                ("knative-serving-namespace", "default"),
                ("knative-serving-revision", "hello-00001"),
            ];
            // Two seconds of stats wholly under a load of `LOAD` through the activator, with
            // the platform saying whether the pod runs queue-proxy.
            let through = async |queue_proxy: bool| -> Vec<Stat> {
                endpoints.set(
                    &key,
                    EndpointSnapshot {
                        ready: vec![DATA],
                        queue_proxy,
                        ..Default::default()
                    },
                );
                let load = Load::start(LOAD, at, &routed);
                let from = thaw::clock::now_second() + 2;
                until(
                    &pod,
                    "two seconds of pulled stats through the activator",
                    || {
                        stats
                            .lock()
                            .unwrap()
                            .iter()
                            .filter(|s| s.at >= from)
                            .count()
                            >= 2
                    },
                )
                .await;
                let (ok, failed) = load.answered();
                drop(load);
                eprintln!(
                    "through the activator (queue_proxy {queue_proxy}): {ok} answered 200, \
                     {failed} otherwise"
                );
                assert!(ok > 0);
                assert_eq!(failed, 0);
                let got: Vec<Stat> = stats
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|s| s.at >= from)
                    .cloned()
                    .collect();
                for s in &got {
                    eprintln!(
                        "second {}: average concurrency {:.3} (proxied {:.3}), requests {} \
                         (proxied {})",
                        s.at,
                        s.average_concurrency,
                        s.proxied_concurrency,
                        s.requests,
                        s.proxied_requests
                    );
                    pod.check(
                        in_flight(s.average_concurrency),
                        &format!(
                            "concurrency {} through the activator",
                            s.average_concurrency
                        ),
                    );
                }
                got
            };
            // The control: the revision's tag, which only thaw's sidecar reads, makes
            // queue-proxy count every forwarded request as direct (the activator reports them
            // too: counted twice).
            for s in through(false).await {
                assert_eq!((s.proxied_concurrency, s.proxied_requests), (0.0, 0));
            }
            // A pod the platform knows runs queue-proxy gets `K-Proxy-Request: activator`:
            // all proxied, subtracted by the collector.
            for s in through(true).await {
                assert_eq!(s.proxied_concurrency, s.average_concurrency);
                assert_eq!(s.proxied_requests, s.requests);
            }
            shut.send(()).unwrap();
            let _ = served.await;
        },
    );
}

/// `GET path` at `addr`, asking for protobuf when `protobuf`: (status, content type, body).
async fn get(addr: SocketAddr, path: &str, protobuf: bool) -> (StatusCode, Option<String>, Bytes) {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::get(format!("http://{addr}{path}"));
    if protobuf {
        req = req.header(http::header::ACCEPT, queue_proxy_stat::PROTOBUF);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (
        status,
        ct,
        resp.into_body().collect().await.unwrap().to_bytes(),
    )
}
