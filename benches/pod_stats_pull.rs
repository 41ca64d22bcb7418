//! The autoscaler's pod-stats puller over 1,000 revisions of 3 pods each, every pod a real
//! loopback hyper server answering `PodStats` JSON; in the second run 1 % of the revisions
//! (10) have all their pods blackholed (each accepts the connection and never answers). The
//! puller runs on its own thread (a current-thread runtime, as one autoscaler task), the pods on
//! two other worker threads; 10 s are measured after 2.5 s of warm-up.
//!
//! Reported per run: the interval between successive stats of each healthy revision (p50, p99,
//! max), the share of healthy revisions with a stat in every second of the window, the
//! blackholed revisions' stats (none expected) and health, the connections open at the pods
//! (the puller's sockets: in-flight pulls and kept-alive idle ones; at most and at the end), the
//! pulls by result and the puller thread's CPU.
//!
//! `cargo bench --bench pod_stats_pull` (about 30 s; docs/benchmarks.md).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use thaw::revision::{CatalogSnapshot, RevisionCatalog, RevisionKey, RevisionSpec};
use thaw::roles::pull::{self, PodStatsFlow, PullOptions};
use thaw::stats::{POD_STATS_PATH, PodStats, StatMessage};
use thaw::telemetry::remote::RemoteMetrics;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const REVISIONS: usize = 1000;
const PODS: usize = 3;
const BLACKHOLED: usize = 10;
const WARMUP: Duration = Duration::from_millis(2500);
const SECONDS: usize = 10;

/// Connections open at the pods: all, and those at blackholed pods.
#[derive(Default)]
struct Open {
    all: AtomicUsize,
    held: AtomicUsize,
}

async fn healthy(name: String, open: Arc<Open>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(
        serde_json::to_vec(&PodStats {
            pod: name,
            average_concurrency: 1.0,
            requests: 10,
            proxied_concurrency: 0.0,
            proxied_requests: 0,
        })
        .unwrap(),
    );
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (body, open) = (body.clone(), open.clone());
            open.all.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        assert_eq!(req.uri().path(), POD_STATS_PATH);
                        Ok::<_, Infallible>(Response::new(Full::new(body)))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
                open.all.fetch_sub(1, Ordering::Relaxed);
            });
        }
    });
    addr
}

async fn blackhole(open: Arc<Open>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let open = open.clone();
            open.all.fetch_add(1, Ordering::Relaxed);
            open.held.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
                open.held.fetch_sub(1, Ordering::Relaxed);
                open.all.fetch_sub(1, Ordering::Relaxed);
            });
        }
    });
    addr
}

fn thread_cpu() -> Duration {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD).unwrap();
    let t = |tv: nix::sys::time::TimeVal| {
        Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
    };
    t(u.user_time()) + t(u.system_time())
}

fn key(i: usize) -> RevisionKey {
    RevisionKey::new("bench", format!("rev-{i:04}"))
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// One puller run over `targets`; the first `blackholed` revisions point at blackholes.
fn measure(
    healthy_pods: &[Vec<(String, SocketAddr)>],
    holes: &[SocketAddr],
    blackholed: usize,
    open: Arc<Open>,
) {
    let targets: HashMap<RevisionKey, Vec<(String, SocketAddr)>> = (0..REVISIONS)
        .map(|i| {
            let pods = if i < blackholed {
                holes[i * PODS..(i + 1) * PODS]
                    .iter()
                    .enumerate()
                    .map(|(p, a)| (format!("hole-{i}-{p}"), *a))
                    .collect()
            } else {
                healthy_pods[i].clone()
            };
            (key(i), pods)
        })
        .collect();
    let catalog = Arc::new(RevisionCatalog::new(CatalogSnapshot::new(
        (0..REVISIONS).map(|i| RevisionSpec::test("bench", &format!("rev-{i:04}"))),
        [],
    )));
    let flow = Arc::new(PodStatsFlow::default());
    let mut registry = Registry::with_prefix("thaw");
    let metrics = RemoteMetrics::register(&mut registry);
    let stop = CancellationToken::new();
    let sampling = Arc::new(AtomicBool::new(true));
    let (most_open, most_held) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let watcher = {
        let (open, sampling) = (open.clone(), sampling.clone());
        let (most_open, most_held) = (most_open.clone(), most_held.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                most_open.fetch_max(open.all.load(Ordering::Relaxed), Ordering::Relaxed);
                most_held.fetch_max(open.held.load(Ordering::Relaxed), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let open_at_end = Arc::new(AtomicUsize::new(0));
    let (arrivals, cpu) = {
        let (flow, metrics, stop) = (flow.clone(), metrics.clone(), stop.clone());
        let (open, open_at_end) = (open.clone(), open_at_end.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (tx, mut rx) = mpsc::channel(64 * 1024);
                let targets = move |k: &RevisionKey| targets.get(k).cloned().unwrap_or_default();
                let puller = tokio::spawn(pull::run_with(
                    PullOptions::default(),
                    targets,
                    catalog,
                    tx,
                    flow,
                    metrics,
                    stop.clone(),
                ));
                let begin = Instant::now();
                let start = begin + WARMUP;
                let end = start + Duration::from_secs(SECONDS as u64);
                // Stats for the seconds of the window may arrive until a tick after it.
                let last = end + Duration::from_millis(1500);
                let mut arrivals: HashMap<RevisionKey, Vec<(Instant, u64)>> = HashMap::new();
                let (mut cpu_start, mut cpu, mut seconds) = (None, None, (0, 0));
                loop {
                    let now = Instant::now();
                    if cpu_start.is_none() && now >= start {
                        cpu_start = Some(thread_cpu());
                        seconds.0 = thaw::clock::now_second();
                    }
                    if cpu.is_none() && now >= end {
                        cpu = Some(thread_cpu() - cpu_start.unwrap());
                        seconds.1 = thaw::clock::now_second();
                        open_at_end.store(open.all.load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                    if now >= last {
                        break;
                    }
                    let wait = [start, end, last].into_iter().find(|t| *t > now).unwrap();
                    tokio::select! {
                        m = rx.recv() => {
                            if let Some(StatMessage::Record(s)) = m {
                                arrivals.entry(s.revision).or_default().push((Instant::now(), s.at));
                            }
                        }
                        _ = tokio::time::sleep_until(wait) => {}
                    }
                }
                stop.cancel();
                let _ = puller.await;
                ((start, seconds, arrivals), cpu.unwrap())
            })
        })
        .join()
        .unwrap()
    };
    sampling.store(false, Ordering::Relaxed);
    watcher.join().unwrap();
    let (start, (first_second, end_second), arrivals) = arrivals;
    let end = start + Duration::from_secs(SECONDS as u64);

    let mut intervals = Vec::new();
    let mut every_second = 0usize;
    let mut blackholed_stats = 0usize;
    for i in 0..REVISIONS {
        let all = arrivals.get(&key(i)).cloned().unwrap_or_default();
        let got: Vec<Instant> = all
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t >= start && *t < end)
            .collect();
        if i < blackholed {
            blackholed_stats += all.len();
            continue;
        }
        intervals.extend(got.windows(2).map(|w| w[1] - w[0]));
        // A stat for each second of the window (the second each stat is for).
        if (first_second..end_second).all(|s| all.iter().any(|(_, at)| *at == s)) {
            every_second += 1;
        }
    }
    intervals.sort();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    println!(
        "\n{blackholed} of {REVISIONS} revisions blackholed ({PODS} pods each), {SECONDS} s measured:"
    );
    println!(
        "  healthy revisions' interval between stats: p50 {}, p99 {}, max {} ({} intervals)",
        ms(quantile(&intervals, 0.5)),
        ms(quantile(&intervals, 0.99)),
        ms(*intervals.last().unwrap()),
        intervals.len()
    );
    println!(
        "  healthy revisions with a stat for each of the {} seconds: {every_second} of {} ({:.1} %)",
        end_second - first_second,
        REVISIONS - blackholed,
        100.0 * every_second as f64 / (REVISIONS - blackholed) as f64
    );
    println!("  stats of blackholed revisions: {blackholed_stats}");
    let stale = flow.stale();
    println!("  stale revisions: {}", stale.len());
    if let Some((k, h)) = stale.first() {
        println!("  e.g. {k}: {}", h.reason());
    }
    println!(
        "  connections open at the pods: at most {} (at most {} at blackholes), at the window's end {}",
        most_open.load(Ordering::Relaxed),
        most_held.load(Ordering::Relaxed),
        open_at_end.load(Ordering::Relaxed)
    );
    println!(
        "  puller thread CPU: {:.1} % of a core",
        100.0 * cpu.as_secs_f64() / SECONDS as f64
    );
    for line in text.lines().filter(|l| {
        l.starts_with("thaw_autoscaler_pod_stats_pulls_total")
            || l.starts_with("thaw_autoscaler_pod_stats_stale")
            || l.starts_with("thaw_autoscaler_pod_stats_sample_seconds_count")
            || l.starts_with("thaw_autoscaler_pod_stats_sample_seconds_sum")
    }) {
        println!("  {line}");
    }
}

fn main() {
    let pods_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let open = Arc::new(Open::default());
    let (healthy_pods, holes) = pods_rt.block_on(async {
        let mut revisions = Vec::with_capacity(REVISIONS);
        for r in 0..REVISIONS {
            let mut pods = Vec::with_capacity(PODS);
            for p in 0..PODS {
                let name = format!("rev-{r:04}-pod-{p}");
                pods.push((name.clone(), healthy(name, open.clone()).await));
            }
            revisions.push(pods);
        }
        let mut holes = Vec::new();
        for _ in 0..BLACKHOLED * PODS {
            holes.push(blackhole(open.clone()).await);
        }
        (revisions, holes)
    });
    for blackholed in [0, BLACKHOLED] {
        measure(&healthy_pods, &holes, blackholed, open.clone());
        // Let the previous run's pooled connections close.
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(pods_rt);
}
