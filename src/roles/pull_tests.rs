//! The puller against real loopback pods: hyper servers answering pod stats, listeners that
//! accept and never answer, listeners whose connects never complete (a full accept queue), and
//! closed ports. Real clock; the assertions are counts and orderings, not timings.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Response;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::*;
use crate::revision::{CatalogSnapshot, RevisionSpec};
use crate::telemetry::remote::ResultLabels;

#[test]
fn sample_sizes_are_knatives() {
    assert_eq!(sample_size(0), 0);
    assert_eq!(sample_size(3), 3);
    assert_eq!(sample_size(10), 7);
    assert_eq!(sample_size(100), 14);
    assert!(sample_size(100_000) <= 16);
}

#[test]
fn a_failed_sample_says_why() {
    let at = Instant::now();
    let one = SampleFailure::new([PullFailure::Timeout; 3], at);
    assert_eq!(one.to_string(), "3 of 3 pulls timed out");
    let mixed = SampleFailure::new(
        [
            PullFailure::Connect,
            PullFailure::Status(503),
            PullFailure::Connect,
        ],
        at,
    );
    assert_eq!(
        mixed.to_string(),
        "3 of 3 pulls failed (2 could not connect, 1 answered 503)"
    );
    let health = StatsHealth {
        last_success: None,
        since: at,
        last_failure: Some(one),
    };
    assert!(
        health
            .reason()
            .starts_with("pod stats: 3 of 3 pulls timed out (failing for "),
        "{}",
        health.reason()
    );
}

/// What the loopback pods saw, in order, with the stats the puller recorded.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// A hanging pod accepted a connection.
    Open,
    /// The puller closed a hanging pod's connection.
    Close,
    /// A stat was recorded for this revision.
    Stat(RevisionKey),
}

type Log = Arc<Mutex<Vec<Event>>>;

/// A pod answering `stats` at [`POD_STATS_PATH`]; counts the requests it answered.
async fn healthy(stats: PodStats) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let body = Bytes::from(serde_json::to_vec(&stats).unwrap());
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (body, count) = (body.clone(), count.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (body, count) = (body.clone(), count.clone());
                    async move {
                        let mut resp = Response::new(Full::new(body));
                        if req.uri().path() == POD_STATS_PATH {
                            count.fetch_add(1, Ordering::Relaxed);
                        } else {
                            *resp.status_mut() = StatusCode::NOT_FOUND;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    (addr, served)
}

/// A pod that answers every request with `status`.
async fn answering(status: StatusCode) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<hyper::body::Incoming>| async move {
                    let mut resp = Response::new(Full::new(Bytes::new()));
                    *resp.status_mut() = status;
                    Ok::<_, Infallible>(resp)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    addr
}

/// A pod that accepts and never answers; logs each connection's open and close.
async fn hanging(log: Log) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            log.lock().unwrap().push(Event::Open);
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
                log.lock().unwrap().push(Event::Close);
            });
        }
    });
    addr
}

/// An address whose connects never complete: a listener with a backlog of 0 that never
/// accepts, its accept queue filled first (Linux then drops further SYNs). Keep the returned
/// sockets alive.
async fn unconnectable() -> (SocketAddr, (TcpListener, Vec<TcpStream>)) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut filled = Vec::new();
    for _ in 0..64 {
        match tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => filled.push(s),
            Ok(Err(e)) => panic!("connect to the full listener: {e}"),
            Err(_) => return (addr, (listener, filled)),
        }
    }
    panic!("the accept queue never filled");
}

/// A closed port.
async fn refusing() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

fn pod(avg: f64, requests: u64) -> PodStats {
    PodStats {
        pod: "p".into(),
        average_concurrency: avg,
        requests,
        proxied_concurrency: 0.0,
        proxied_requests: 0,
    }
}

type Pods = HashMap<RevisionKey, Vec<(String, SocketAddr)>>;

fn targets(pods: Pods) -> impl StatsTargets {
    move |key: &RevisionKey| pods.get(key).cloned().unwrap_or_default()
}

fn pods(addrs: &[SocketAddr]) -> Vec<(String, SocketAddr)> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("pod-{i}"), *a))
        .collect()
}

/// Starts the puller over `revisions`; returns the recorded stats.
fn start(
    options: PullOptions,
    revisions: Vec<RevisionSpec>,
    pods: Pods,
    flow: Arc<PodStatsFlow>,
    metrics: RemoteMetrics,
    log: Log,
    stop: CancellationToken,
) -> (Arc<RevisionCatalog>, Arc<Mutex<Vec<Stat>>>) {
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(revisions, [])));
    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(run_with(
        options,
        targets(pods),
        catalog.clone(),
        tx,
        flow,
        metrics,
        stop,
    ));
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let r = recorded.clone();
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let StatMessage::Record(stat) = m else {
                continue;
            };
            log.lock().unwrap().push(Event::Stat(stat.revision.clone()));
            r.lock().unwrap().push(stat);
        }
    });
    (catalog, recorded)
}

/// Polls `done` until it holds (or fails after a minute: a liveness bound, not a timing).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let limit = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < limit, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn key(name: &str) -> RevisionKey {
    RevisionKey::new("ns", name)
}

fn stats_of(recorded: &Mutex<Vec<Stat>>, name: &str) -> Vec<Stat> {
    let k = key(name);
    recorded
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.revision == k)
        .cloned()
        .collect()
}

/// A revision whose pods all hang does not hold the others up: with a deadline longer than
/// the tick, the healthy revision is sampled many times while one hanging sample is open; the
/// hanging revision's three pulls run at once and it is skipped while they are in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_revision_holds_no_other_up() {
    let log: Log = Arc::default();
    let (a1, _) = healthy(pod(1.5, 10)).await;
    let (a2, _) = healthy(pod(0.5, 2)).await;
    let mut hang = Vec::new();
    for _ in 0..3 {
        hang.push(hanging(log.clone()).await);
    }
    let pods: Pods = [(key("a"), pods(&[a1, a2])), (key("b"), pods(&hang))].into();
    let options = PullOptions {
        tick: Duration::from_millis(100),
        deadline: Duration::from_millis(1500),
        ..PullOptions::default()
    };
    let (flow, metrics, stop) = (
        Arc::new(PodStatsFlow::default()),
        RemoteMetrics::default(),
        CancellationToken::new(),
    );
    let _end = stop.clone().drop_guard();
    let revisions = vec![RevisionSpec::test("ns", "a"), RevisionSpec::test("ns", "b")];
    let (_catalog, recorded) = start(
        options,
        revisions,
        pods,
        flow.clone(),
        metrics.clone(),
        log.clone(),
        stop.clone(),
    );
    // Two of b's samples have ended (six connections opened and closed).
    until("two of b's samples end", || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|e| **e == Event::Close)
            .count()
            >= 6
    })
    .await;
    stop.cancel();

    let events = log.lock().unwrap().clone();
    let (mut open, mut most_open) = (0usize, 0usize);
    let mut a_while_b_open = 0usize;
    let mut a_during_first_b_sample = 0usize;
    let mut first_sample_ended = false;
    for e in &events {
        match e {
            Event::Open => open += 1,
            Event::Close => {
                open -= 1;
                if open == 0 {
                    first_sample_ended = true;
                }
            }
            Event::Stat(k) if *k == key("a") => {
                if open > 0 {
                    a_while_b_open += 1;
                    if !first_sample_ended {
                        a_during_first_b_sample += 1;
                    }
                }
            }
            Event::Stat(k) => panic!("a stat for {k}, whose pods never answer"),
        }
        most_open = most_open.max(open);
    }
    assert_eq!(
        most_open, 3,
        "b's three pulls at once, one sample at a time: {events:?}"
    );
    assert!(
        a_during_first_b_sample >= 3,
        "a kept being sampled while b's first sample hung: {a_during_first_b_sample} stats; {events:?}"
    );
    assert!(a_while_b_open >= 6, "{events:?}");
    for s in stats_of(&recorded, "a") {
        assert_eq!(s.average_concurrency, 2.0, "both pods, unscaled");
        assert_eq!(s.requests, 12);
        assert_eq!(&*s.source, SOURCE);
    }
    assert!(flow.flows(&key("a")));
    assert!(flow.health(&key("a")).is_none());
    assert!(!flow.flows(&key("b")));
    let why = flow
        .health(&key("b"))
        .expect("b's stats do not flow")
        .reason();
    assert!(
        why.starts_with("pod stats: 3 of 3 pulls timed out"),
        "{why}"
    );
    let timeouts = metrics
        .pulls
        .get_or_create(&ResultLabels { result: "timeout" })
        .get();
    assert!(timeouts >= 6, "{timeouts}");
}

/// One hanging pod among three: the revision's stat comes from the two that answered, scaled
/// to the three, when its deadline ends the hanging pull; its stats keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_pod_leaves_the_revisions_stat_to_the_others() {
    let log: Log = Arc::default();
    let (p1, _) = healthy(pod(1.0, 4)).await;
    let (p2, _) = healthy(pod(1.0, 4)).await;
    let slow = hanging(log.clone()).await;
    let pods: Pods = [(key("c"), pods(&[p1, slow, p2]))].into();
    let mut registry = prometheus_client::registry::Registry::with_prefix("thaw");
    let (flow, metrics, stop) = (
        Arc::new(PodStatsFlow::default()),
        RemoteMetrics::register(&mut registry),
        CancellationToken::new(),
    );
    let _end = stop.clone().drop_guard();
    let (_catalog, recorded) = start(
        PullOptions::default(),
        vec![RevisionSpec::test("ns", "c")],
        pods,
        flow.clone(),
        metrics.clone(),
        log.clone(),
        stop.clone(),
    );
    until("two stats for c", || stats_of(&recorded, "c").len() >= 2).await;
    stop.cancel();

    for s in stats_of(&recorded, "c") {
        assert_eq!(s.average_concurrency, 3.0, "two pods' 2.0 scaled by 3/2");
        assert_eq!(s.requests, 12);
    }
    let events = log.lock().unwrap().clone();
    let first_stat = events.iter().position(|e| matches!(e, Event::Stat(_)));
    let first_open = events.iter().position(|e| *e == Event::Open);
    assert!(
        first_open < first_stat,
        "the slow pod was pulled in the sample: {events:?}"
    );
    assert!(flow.flows(&key("c")));
    assert!(flow.health(&key("c")).is_none());
    let count = |result| metrics.pulls.get_or_create(&ResultLabels { result }).get();
    assert!(count("ok") >= 4 && count("timeout") >= 2, "{metrics:?}");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let value = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(name)).expect(name);
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(
        value("thaw_autoscaler_pod_stats_sample_seconds_count ") >= 2.0,
        "each sample observed: {text}"
    );
    assert_eq!(value("thaw_autoscaler_pod_stats_stale_revisions "), 0.0);
    assert!(value("thaw_autoscaler_pod_stats_pulls_total{result=\"timeout\"} ") >= 2.0);
}

/// Each broken revision says why, the stale gauge counts them, the healthy one flows, a
/// `target-burst-capacity: -1` revision is never pulled, and a revision that leaves the
/// catalog is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_revisions_say_why_and_leave_with_the_catalog() {
    let log: Log = Arc::default();
    let (a, _) = healthy(pod(1.0, 1)).await;
    let (never, never_served) = healthy(pod(1.0, 1)).await;
    let mut hang = Vec::new();
    for _ in 0..3 {
        hang.push(hanging(log.clone()).await);
    }
    let (c1, _keep1) = unconnectable().await;
    let (c2, _keep2) = unconnectable().await;
    let refused = refusing().await;
    let unavailable = answering(StatusCode::SERVICE_UNAVAILABLE).await;
    let pods: Pods = [
        (key("a"), pods(&[a])),
        (key("b"), pods(&hang)),
        (key("c"), pods(&[c1, c2])),
        (key("d"), pods(&[refused])),
        (key("e"), pods(&[unavailable])),
        (key("f"), pods(&[never])),
    ]
    .into();
    let mut f = RevisionSpec::test("ns", "f");
    let mut spec = (*f.autoscaling).clone();
    spec.target_burst_capacity = -1.0;
    f.autoscaling = Arc::new(spec);
    let revisions = ["a", "b", "c", "d", "e"]
        .into_iter()
        .map(|n| RevisionSpec::test("ns", n))
        .chain([f])
        .collect();
    let (flow, metrics, stop) = (
        Arc::new(PodStatsFlow::default()),
        RemoteMetrics::default(),
        CancellationToken::new(),
    );
    let _end = stop.clone().drop_guard();
    let (catalog, _recorded) = start(
        PullOptions::default(),
        revisions,
        pods,
        flow.clone(),
        metrics.clone(),
        log,
        stop.clone(),
    );
    until("four stale revisions, counted", || {
        flow.stale().len() == 4 && metrics.stale_revisions.get() == 4
    })
    .await;
    let why: HashMap<String, String> = flow
        .stale()
        .into_iter()
        .map(|(k, h)| (k.name.to_string(), h.reason()))
        .collect();
    let starts = |name: &str, with: &str| {
        assert!(why[name].starts_with(with), "{name}: {}", why[name]);
    };
    starts("b", "pod stats: 3 of 3 pulls timed out");
    starts("c", "pod stats: 2 of 2 pulls could not connect");
    starts("d", "pod stats: 1 of 1 pulls could not connect");
    starts("e", "pod stats: 1 of 1 pulls answered 503");
    assert!(flow.flows(&key("a")) && flow.health(&key("a")).is_none());
    for name in ["b", "c", "d", "e"] {
        assert!(!flow.flows(&key(name)), "{name}");
        let h = flow.health(&key(name)).unwrap();
        assert!(
            h.last_success.is_none() && h.last_failure.is_some(),
            "{h:?}"
        );
    }
    assert!(!flow.flows(&key("f")) && flow.health(&key("f")).is_none());
    assert_eq!(never_served.load(Ordering::Relaxed), 0, "f is not pulled");

    assert!(catalog.remove(&key("b")));
    until("b forgotten", || {
        flow.health(&key("b")).is_none() && metrics.stale_revisions.get() == 3
    })
    .await;
    let left: Vec<String> = flow
        .stale()
        .into_iter()
        .map(|(k, _)| k.name.to_string())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(!left.contains(&"b".to_string()));
}

/// A pod answering `GET /metrics` as Knative's queue-proxy would when asked for protobuf (the
/// request's `Accept` checked): `body` with `content_type`; anything else 404.
async fn queue_proxy_like(content_type: &'static str, body: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(body);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        let asked = req.uri().path() == queue_proxy_stat::PATH
                            && req
                                .headers()
                                .get(http::header::ACCEPT)
                                .map(|v| v.as_bytes())
                                == Some(queue_proxy_stat::PROTOBUF.as_bytes());
                        let mut resp = Response::new(Full::new(body));
                        if asked {
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static(content_type),
                            );
                        } else {
                            *resp.status_mut() = StatusCode::NOT_FOUND;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_queue_proxy_pod_is_pulled_as_knatives_scraper_does() {
    use prost::Message;
    let client: PullClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let stat = KnativeStat {
        pod_name: "hello-00001-deployment-x".into(),
        average_concurrent_requests: 2.5,
        average_proxied_concurrent_requests: 0.5,
        request_count: 9.0,
        proxied_request_count: 1.0,
        process_uptime: 30.0,
        timestamp: 0,
    };
    let pod = queue_proxy_like(queue_proxy_stat::PROTOBUF, stat.encode_to_vec()).await;
    let got = pull(&client, pod, PodStatsWire::QueueProxy).await.unwrap();
    assert_eq!(
        got,
        PodStats {
            pod: "hello-00001-deployment-x".into(),
            average_concurrency: 2.5,
            requests: 9,
            proxied_concurrency: 0.5,
            proxied_requests: 1,
        }
    );
    // Pulled as thaw's sidecar, the same pod has no `/stats`.
    assert_eq!(
        pull(&client, pod, PodStatsWire::Thaw).await,
        Err(PullFailure::Status(404))
    );
    // Another media type (queue-proxy's Prometheus text), or an answer past the limit: refused.
    let text = queue_proxy_like("text/plain; version=0.0.4", stat.encode_to_vec()).await;
    assert_eq!(
        pull(&client, text, PodStatsWire::QueueProxy).await,
        Err(PullFailure::Rejected)
    );
    let long = KnativeStat {
        pod_name: "p".repeat(queue_proxy_stat::BODY_LIMIT),
        ..stat
    };
    let long = queue_proxy_like(queue_proxy_stat::PROTOBUF, long.encode_to_vec()).await;
    assert_eq!(
        pull(&client, long, PodStatsWire::QueueProxy).await,
        Err(PullFailure::Rejected)
    );
}
